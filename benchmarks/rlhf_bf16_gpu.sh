#!/usr/bin/env bash
# The GPU checks of --bf16, in one go on a GPU machine: tests/test_cuda.py, then fp32 against bf16 per iteration
# of ppo_rlhf_gpt2.py and grpo_gpt2.py (SmolLM2-135M's architecture, random weights, vader, batch 512 x 24 tokens)
# and per optimizer step of dpo_gpt2.py and reward_model_gpt2.py (the same policy, the first comparisons of PREFS),
# alternating, with benchmarks/rlhf_cost.py. Each phase has a time limit; the reports and logs go to OUT.
#   PREFS=vader_2000.jsonl OUT=gpu_bf16 bash benchmarks/rlhf_bf16_gpu.sh
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PREFS=${PREFS:-vader_2000.jsonl}; OUT=${OUT:-gpu_bf16}
[ -f "$PREFS" ] || { echo "error: PREFS=$PREFS: no such file (a JSONL file of comparisons)"; exit 2; }
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available(), 'bf16', torch.cuda.is_available() and torch.cuda.is_bf16_supported())" \
  | tee -a "$OUT/device.txt"
timeout "${TEST_LIMIT:-150}" python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_cuda.py --tb=short \
  > "$OUT/tests.log" 2>&1; echo "tests/test_cuda.py exit $?: $(tail -1 "$OUT/tests.log")"
timeout "${RL_LIMIT:-170}" python3 benchmarks/rlhf_cost.py --cuda --scripts ppo grpo --architecture smollm2-135m \
  --task vader --batch-size 512 --iterations 3 --precisions fp32 bf16 --out "$OUT/rlhf_bf16_gpu_rl.md" \
  > "$OUT/rl.log" 2>&1; echo "ppo grpo exit $?"; grep -E "^- .*as fast|^\| [a-z_0-9]+\.py" "$OUT/rl.log"
timeout "${PREF_LIMIT:-150}" python3 benchmarks/rlhf_cost.py --cuda --scripts dpo rm --architecture smollm2-135m \
  --task vader --preferences "$PREFS" --iterations 8 --precisions fp32 bf16 --out "$OUT/rlhf_bf16_gpu_pref.md" \
  > "$OUT/pref.log" 2>&1; echo "dpo rm exit $?"; grep -E "^- .*as fast|^\| [a-z_0-9]+\.py" "$OUT/pref.log"
