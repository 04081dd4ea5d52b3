#!/usr/bin/env bash
# The reward-KL frontier's runs timed on a GPU, one after another, with the frontier's flags: DPO (beta 0.1, lr 1e-4),
# the reward model, PPO (kl_coef 0.01) and GRPO (beta 0.04) on it. The policy has SmolLM2-135M's architecture and
# tokenizer with random weights (seed 0): timing only, its gold and KL mean nothing. Optionally first the GPU tests
# and the tests of the DPO and reward-model files. Each run has a time limit; what it logged by then is read.
#   SRC=models/smollm2-135m PREFS=vader_2000.jsonl OUT=gpu_timing bash benchmarks/rlhf_frontier_gpu.sh
# SRC: a folder with SmolLM2-135M's config.json and tokenizer files (benchmarks/get_smollm2.py writes one); PREFS:
# the frontier's preference file; OUT: where the logs, the TensorBoard events, times.txt and summary.txt go.
# DEV=--no-cuda, EPISODES (1280) and TESTS=0 (no tests) make a short check on a CPU.
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
SRC=${SRC:-models/smollm2-135m}; PREFS=${PREFS:-vader_2000.jsonl}; OUT=${OUT:-gpu_timing}; DEV=${DEV:---cuda}
EPISODES=${EPISODES:-1280}; M=${M:-/tmp/smollm2_random}; RUNS=${RUNS:-/tmp/frontier_gpu_runs}
for f in "$SRC/config.json" "$PREFS"; do [ -f "$f" ] || { echo "error: $f: no such file (see the header)"; exit 2; }; done
mkdir -p "$OUT"; rm -f "$OUT/times.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available())" | tee -a "$OUT/device.txt"
phase() { echo "$1 start $(date +%s.%N)" >> "$OUT/times.txt"; }
ended() {
  echo "$1 end $(date +%s.%N) rc $2" >> "$OUT/times.txt"
  f=$(find "$RUNS/$1" -name 'events.out*' 2>/dev/null | head -1); [ -n "$f" ] && cp "$f" "$OUT/$1.events"
}
if [ "${TESTS:-1}" != 0 ]; then
  phase tests; timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_cuda.py tests/test_dpo_gpt2.py \
    tests/test_reward_model_gpt2.py --tb=short > "$OUT/tests.log" 2>&1; ended tests $?; tail -1 "$OUT/tests.log"
fi
python3 - "$SRC" "$M" <<'PY'
import shutil, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
src, dst = sys.argv[1:]
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32).save_pretrained(dst)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
    shutil.copy(f"{src}/{name}", f"{dst}/{name}")
PY
C="$DEV --num-threads 1 --model-name $M --seed 1"
RL="--total-episodes $EPISODES --batch-size 64 --num-minibatches 4 --update-epochs 1 --learning-rate 5e-5 \
--eval-every 0 --eval-episodes 0"
phase dpo; timeout 120 python3 dpo_gpt2.py --beta 0.1 --preferences "$PREFS" --eval-fraction 0.2 --split-seed 1 \
  --learning-rate 1e-4 --eval-episodes 0 $C --runs-dir "$RUNS/dpo" > "$OUT/runs.log" 2>&1; ended dpo $?
phase rm; timeout 120 python3 reward_model_gpt2.py --preferences "$PREFS" --eval-fraction 0.2 --save-model $C \
  --runs-dir "$RUNS/rm" >> "$OUT/runs.log" 2>&1; ended rm $?
RM=$(ls -d "$RUNS"/rm/*/model | head -1)
phase ppo; timeout 110 python3 ppo_rlhf_gpt2.py --reward-model "$RM" --kl-coef 0.01 --kl-target None $RL $C \
  --runs-dir "$RUNS/ppo" >> "$OUT/runs.log" 2>&1; ended ppo $?
phase grpo; timeout 70 python3 grpo_gpt2.py --reward-model "$RM" --beta 0.04 $RL $C --runs-dir "$RUNS/grpo" \
  >> "$OUT/runs.log" 2>&1; ended grpo $?
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
"""Each run's seconds from its start (wall clock): to its first logged step (loading and setup included), the
median step after it, the last step logged, and the whole process (rc 124: stopped at its time limit)."""
import os, shutil, statistics, sys, tempfile
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
out, times = sys.argv[1], {}
for line in open(os.path.join(out, "times.txt")):
    name, kind, t, *rest = line.split()
    times.setdefault(name, {})[kind] = (float(t), rest[1] if rest else None)
tags = {"dpo": "losses/dpo_loss", "rm": "losses/reward_loss", "ppo": "objective/kl", "grpo": "losses/policy_loss"}
print("run | first step s | median step s | steps | last step s | process s (rc)")
for name, tag in tags.items():
    if not os.path.exists(os.path.join(out, f"{name}.events")) or "end" not in times.get(name, {}):
        print(f"{name} | not run"); continue
    folder = tempfile.mkdtemp()  # EventAccumulator reads a folder of files named events.out.tfevents.*
    shutil.copy(os.path.join(out, f"{name}.events"), os.path.join(folder, "events.out.tfevents.0.copy"))
    events = EventAccumulator(folder, size_guidance={"scalars": 0}); events.Reload()
    start, (end, rc) = times[name]["start"][0], times[name]["end"]
    if tag not in events.Tags()["scalars"]:
        print(f"{name} | no step logged | | 0 | | {end - start:.1f} ({rc})"); continue
    walls = [e.wall_time - start for e in events.Scalars(tag)]
    step = statistics.median(b - a for a, b in zip(walls, walls[1:])) if len(walls) > 1 else float("nan")
    print(f"{name} | {walls[0]:.1f} | {step:.2f} | {len(walls)} | {walls[-1]:.1f} | {end - start:.1f} ({rc})")
PY
