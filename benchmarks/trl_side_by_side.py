"""ppo_rlhf_gpt2.py against TRL's PPOTrainer: seconds per PPO iteration and peak memory, same models and sizes.

TRL 1.12.0 is the last release with a PPO trainer (`trl.experimental.ppo`; TRL 1.13.0 removed it). It needs
its own environment; this script runs each side in a fresh process, one CPU thread each, one after the other
(`--repeats` times, alternating), and writes OUT.md and OUT.json.

    python3 -m venv venv-trl
    venv-trl/bin/pip install torch==2.13.0 transformers==5.23.0 trl==1.12.0 tensorboard tyro
    python tools/get_smollm2.py --out models/smollm2-135m
    python benchmarks/trl_side_by_side.py --trl-python venv-trl/bin/python --out docs/results/rlhf_vs_trl

The four models are the same on both sides: the policy and the reference are SmolLM2-135M (`--model`); the value
model and the reward model are that model's backbone with a one-output head (`AutoModelForSequenceClassification`,
num_labels=1; the reward model's head is random, saved once to MODEL-rm). Same batch (16 responses to the
built-in prompts), response length (24 tokens, always generated in full: TRL without a stop token, this script
with `--stop-token eos`, which only masks), 4 epochs over one minibatch of two micro-batches of 8, rollout passes
in chunks of 16, fixed KL coefficient. Each run does ITERATIONS iterations; the first is a warm-up and the time
of each later one is the interval between the ends of consecutive iterations (TensorBoard event times here, a
`TrainerCallback.on_step_end` in TRL). Peak memory is the process's peak resident set size (`ru_maxrss`).
With --bf16 this script runs with its `--bf16`. TRL runs at its defaults either way; what they do is recorded,
not assumed: the dtype of the policy's output layer in TRL's passes (bfloat16 only under autocast) and whether
the policy ran with gradient checkpointing (PPOConfig's defaults say bf16=True and gradient checkpointing).
A reading written in OUT.md below a line `<!-- reading -->` is kept when the page is rewritten.
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH, MICRO, EPOCHS, RESPONSE, CHUNK, ITERATIONS = 16, 8, 4, 24, 16, 4
LEARNING_RATE, TEMPERATURE, KL_COEF = 1.41e-5, 0.7, 0.05
READING_MARK = "<!-- reading -->"


def reward_model_folder(model: str) -> str:
    """MODEL-rm: the model's backbone with a one-output classification head (random, seed 0), made once."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = model.rstrip("/") + "-rm"
    if not os.path.isdir(folder):
        torch.manual_seed(0)
        rm = AutoModelForSequenceClassification.from_pretrained(model, num_labels=1, dtype=torch.float32)
        rm.config.pad_token_id = rm.config.eos_token_id
        rm.save_pretrained(folder)
        AutoTokenizer.from_pretrained(model).save_pretrained(folder)
    return folder


def run_ours(model: str, bf16: bool = False) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sys.path.insert(0, str(ROOT))
    import ppo_rlhf_gpt2 as rlhf

    with tempfile.TemporaryDirectory() as runs:
        args = rlhf.Args(
            model_name=model, reward_model=reward_model_folder(model), reward_label=0, cuda=False, num_threads=1,
            runs_dir=runs, batch_size=BATCH, num_minibatches=1, gradient_accumulation_steps=BATCH // MICRO,
            update_epochs=EPOCHS, response_length=RESPONSE, min_response_length=0, stop_token="eos",
            local_rollout_forward_batch_size=CHUNK, total_episodes=BATCH * ITERATIONS, eval_episodes=0,
            norm_batches=1, missing_eos_penalty=None, kl_target=None, kl_coef=KL_COEF,
            learning_rate=LEARNING_RATE, temperature=TEMPERATURE, bf16=bf16)
        result = rlhf.main(args)
        events = EventAccumulator(result["run_dir"], size_guidance={"scalars": 0})
        events.Reload()
        ends = [e.wall_time for e in events.Scalars("time/update")]
        rollout = [e.value for e in events.Scalars("time/rollout")][1:]
        update = [e.value for e in events.Scalars("time/update")][1:]
    return {"ends": ends, "rollout": rollout, "update": update, "bf16": bf16}


def run_trl(model: str) -> dict:
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    sys.path.insert(0, str(ROOT))
    from ppo_rlhf_gpt2 import PROMPTS

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})  # as TRL's PPO example: a pad distinct from EOS
    dataset = Dataset.from_dict({"input_ids": [tokenizer.encode(p) for p in PROMPTS]})
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    ref_policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    value_model = AutoModelForSequenceClassification.from_pretrained(model, num_labels=1, dtype=torch.float32)
    reward_model = AutoModelForSequenceClassification.from_pretrained(reward_model_folder(model), num_labels=1,
                                                                      dtype=torch.float32)

    dtypes = set()  # of the policy's logits in TRL's passes: bfloat16 only where autocast is on
    policy.lm_head.register_forward_hook(lambda module, inputs, output: dtypes.add(str(output.dtype)))

    class IterationEnds(TrainerCallback):
        ends: list = []

        def on_step_end(self, args, state, control, **kwargs):  # once per PPO iteration, after its update
            self.ends.append(time.time())

    with tempfile.TemporaryDirectory() as output_dir:
        config = PPOConfig(
            output_dir=output_dir, use_cpu=True, report_to="none", save_strategy="no", seed=1,
            per_device_train_batch_size=MICRO, gradient_accumulation_steps=BATCH // MICRO, num_mini_batches=1,
            num_ppo_epochs=EPOCHS, response_length=RESPONSE, stop_token=None, local_rollout_forward_batch_size=CHUNK,
            total_episodes=BATCH * ITERATIONS, num_sample_generations=0, missing_eos_penalty=None, kl_coef=KL_COEF,
            learning_rate=LEARNING_RATE, temperature=TEMPERATURE)
        trainer = PPOTrainer(args=config, processing_class=tokenizer, model=policy, ref_model=ref_policy,
                             reward_model=reward_model, value_model=value_model, train_dataset=dataset,
                             callbacks=[IterationEnds()])
        trainer.train()
    return {"ends": IterationEnds.ends, "trl": trl.__version__, "config_bf16": bool(config.bf16),
            "logits_dtypes": sorted(dtypes), "gradient_checkpointing": bool(policy.is_gradient_checkpointing)}


def one_run(side: str, model: str, out_json: str, bf16: bool = False) -> None:
    import torch
    import transformers

    start = time.time()
    result = run_ours(model, bf16) if side == "ours" else run_trl(model)
    ends = result.pop("ends")
    result.update(side=side, seconds=[b - a for a, b in zip(ends, ends[1:])], iterations=len(ends),
                  wall=time.time() - start, peak_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                  torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version(),
                  threads=torch.get_num_threads())
    Path(out_json).write_text(json.dumps(result))


def median(values: list) -> float:
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def precision(run: dict) -> str:
    """What a run computed in: ours from its flag, TRL's from the dtypes its policy's logits came out in."""
    if run["side"] == "ours":
        return "bf16 (--bf16)" if run.get("bf16") else "fp32"
    if "logits_dtypes" not in run:
        return "its defaults, not recorded"
    computed = "bf16 autocast" if "torch.bfloat16" in run["logits_dtypes"] else "fp32"
    checkpointing = ", gradient checkpointing" if run["gradient_checkpointing"] else ""
    return f"{computed}{checkpointing} (config bf16={run['config_bf16']})"


def report(runs: list, out: Path, command: str) -> None:
    rows = []
    trl_version = next((r["trl"] for r in runs if "trl" in r), "?")
    for side, name in (("ours", "ppo_rlhf_gpt2.py"), ("trl", f"TRL {trl_version} PPOTrainer")):
        mine = [r for r in runs if r["side"] == side]
        name += ", " + ", ".join(sorted({precision(r) for r in mine}))
        seconds = [s for r in mine for s in r["seconds"]]
        per_run = ", ".join(f"{median(r['seconds']):.1f}" for r in mine)
        peaks = ", ".join(f"{r['peak_gb']:.2f}" for r in mine)
        rows.append(f"| {name} | {median(seconds):.1f} | {min(seconds):.1f}-{max(seconds):.1f} | {per_run} | "
                    f"{median([r['peak_gb'] for r in mine]):.2f} ({peaks}) |")
    ours = [r for r in runs if r["side"] == "ours"]
    first = runs[0]
    lines = [
        "# ppo_rlhf_gpt2.py against TRL's PPOTrainer: seconds per iteration and peak memory",
        "",
        f"Command: `{command}`",
        f"({time.strftime('%Y-%m-%d')}; one CPU thread per run, runs one at a time, alternating; "
        f"{os.cpu_count()} CPU cores, no GPU; torch {first['torch']}, transformers {first['transformers']}, "
        f"Python {first['python']}.)",
        "",
        f"Same models (SmolLM2-135M policy and reference, value and reward models with its backbone), batch "
        f"{BATCH}, response length {RESPONSE}, {EPOCHS} epochs over 1 minibatch of {BATCH // MICRO} micro-batches "
        f"of {MICRO}, rollout chunks of {CHUNK}. {ITERATIONS} iterations per run, the first a warm-up; "
        f"{len(runs) // 2} runs per side.",
        "",
        "| implementation | seconds per iteration, median | range | median of each run | peak resident memory, GB "
        "(median; each run) |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "This script's split of its iteration time (medians over the timed iterations): rollout "
        f"{median([s for r in ours for s in r['rollout']]):.1f} s, update "
        f"{median([s for r in ours for s in r['update']]):.1f} s.",
    ]
    page = out.with_suffix(".md")
    reading = page.read_text().partition(READING_MARK)[2] if page.exists() else ""
    page.write_text("\n".join(lines) + "\n" + (READING_MARK + reading if reading else ""))
    out.with_suffix(".json").write_text(json.dumps(runs, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2-135m")
    parser.add_argument("--trl-python", help="the python of the environment with TRL 1.12.0")
    parser.add_argument("--repeats", type=int, default=2, help="runs per side")
    parser.add_argument("--core", type=int, help="pin every run to this CPU core (taskset)")
    parser.add_argument("--out", default="docs/results/rlhf_vs_trl", help="OUT.md and OUT.json")
    parser.add_argument("--report-only", action="store_true", help="rewrite OUT.md from OUT.json, run nothing")
    parser.add_argument("--bf16", action="store_true", help="run ppo_rlhf_gpt2.py with --bf16 (TRL: its defaults)")
    parser.add_argument("--run", choices=("ours", "trl"), help=argparse.SUPPRESS)  # one run, in this process
    parser.add_argument("--out-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        return one_run(args.run, args.model, args.out_json, args.bf16)
    if args.report_only:
        runs = json.loads((ROOT / args.out).with_suffix(".json").read_text())
        command = (ROOT / args.out).with_suffix(".md").read_text().split("`")[1]  # the command that ran them
        return report(runs, ROOT / args.out, command)
    if not args.trl_python or not os.path.exists(args.trl_python):
        raise SystemExit("error: --trl-python must be the python of an environment with trl==1.12.0 (see --help)")
    if not os.path.isdir(args.model):
        raise SystemExit(f"error: --model {args.model}: no such directory (python tools/get_smollm2.py)")
    reward_model_folder(args.model)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    pin = ["taskset", "-c", str(args.core)] if args.core is not None else []
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for side, python in (("ours", sys.executable), ("trl", args.trl_python)):
                out_json = os.path.join(tmp, f"{side}_{repeat}.json")
                subprocess.run(pin + [python, __file__, "--run", side, "--model", args.model, "--out-json",
                                      out_json, *(["--bf16"] if args.bf16 else [])], check=True, env=env)
                runs.append(json.loads(Path(out_json).read_text()))
                print(f"{side} run {repeat + 1}: {runs[-1]['seconds']} s per iteration, {runs[-1]['peak_gb']:.2f} GB")
    report(runs, ROOT / args.out, "python benchmarks/trl_side_by_side.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
