"""grpo_gpt2.py, dpo_gpt2.py and reward_model_gpt2.py against TRL's GRPOTrainer, DPOTrainer and RewardTrainer:
seconds per optimizer step and peak memory.

Each side runs in fp32 and in bf16: ours with and without --bf16 (autocast, fp32 weights), TRL with bf16=False and
at its defaults (bf16=True; TRL's configs also default to gradient checkpointing, kept on in both of its runs).
TRL needs its own environment; every run is a fresh process with one CPU thread, one at a time, alternating
(`--rounds` times), and the report goes to OUT.md and OUT.json.

    python3 -m venv venv-trl
    venv-trl/bin/pip install torch==2.13.0 transformers==5.23.0 trl==1.16.0 tensorboard tyro
    python benchmarks/trl_grpo_dpo.py --trl-python venv-trl/bin/python --preferences vader_2000.jsonl \
        --out benchmarks/results/trl_grpo_dpo

The policy is SmolLM2-135M's architecture with random weights (built as benchmarks/rlhf_cost.py builds it; or
--model FOLDER): timing only. The same sizes on both sides:
- GRPO: 64 completions a step (8 prompts, the built-in ones, x G = 8), exactly 24 tokens each (ours:
  --min-response-length 23; TRL: min_new_tokens 24), the length reward, beta 0 (TRL's default: no reference
  model), one optimizer step per batch over 4 micro-batches of 16.
- DPO: 32 comparisons a step (the first lines of --preferences), 4 micro-batches of 8, texts cut to 128 tokens.
  Ours computes the reference's log-probs once before training (not in the step times); TRL's default computes
  them in every step (precompute_ref_log_probs=False). The report also gives ours with that pass timed and
  counted a step's share (its seconds per 32 comparisons added to each step).
- Reward model (--methods rm): the same comparisons and sizes as DPO, a scalar head on the policy's backbone
  (TRL: AutoModelForSequenceClassification, one label). Ours at its defaults fits the head on frozen features
  first (detail 45, a pass over the training comparisons before the first step, not in the step times); TRL
  trains head and backbone from its first step.
A step's seconds are the gaps between the ends of consecutive optimizer steps (TensorBoard event times here, a
`TrainerCallback.on_step_end` in TRL), the median over the steps after the first.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = 5  # optimizer steps a run; the first gap is a warm-up
GRPO = dict(batch=64, generations=8, micro=16, tokens=24)
DPO = dict(batch=32, micro=8, max_length=128)
VARIANTS = [("ours", "fp32"), ("ours", "bf16"), ("trl", "fp32"), ("trl", "bf16")]
SCRIPTS = {"grpo": "grpo_gpt2", "dpo": "dpo_gpt2", "rm": "reward_model_gpt2"}  # --methods: our file of each


def ours_flags(method: str, model: str, preferences: str, runs: str, precision: str) -> list[str]:
    """The command-line flags of our script for one timing run."""
    common = ["--model-name", model, "--runs-dir", runs, "--num-threads", "1", "--no-cuda", "--seed", "1"]
    bf16 = ["--bf16"] if precision == "bf16" else []
    if method == "grpo":
        return common + bf16 + [
            "--reward-model", "length", "--batch-size", str(GRPO["batch"]), "--num-generations",
            str(GRPO["generations"]), "--gradient-accumulation-steps", str(GRPO["batch"] // GRPO["micro"]),
            "--num-minibatches", "1", "--response-length", str(GRPO["tokens"]), "--min-response-length",
            str(GRPO["tokens"] - 1), "--beta", "0", "--total-episodes", str(GRPO["batch"] * STEPS), "--eval-episodes", "0"]
    return common + bf16 + [
        "--preferences", preferences, "--batch-size", str(DPO["batch"]), "--gradient-accumulation-steps",
        str(DPO["batch"] // DPO["micro"]), "--max-length", str(DPO["max_length"]),
        *(["--eval-episodes", "0"] if method == "dpo" else []), "--eval-every", "0", "--eval-fraction", "0.1"]


def comparisons_needed(eval_fraction: float = 0.1) -> int:
    """Lines of the preference file that fill STEPS steps of DPO after its held-out share (and one step to spare)."""
    return int(DPO["batch"] * (STEPS + 1) / (1 - eval_fraction)) + DPO["batch"]


def run_ours(method: str, model: str, preferences: str, precision: str) -> dict:
    import tyro
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sys.path.insert(0, str(ROOT))
    module = __import__(SCRIPTS[method])
    passes = []  # DPO: (comparisons, seconds) of each logps_in_chunks call, the reference's pass among them
    if method == "dpo":
        logps_in_chunks = module.logps_in_chunks

        def timed(model, tokenizer, comparisons, *rest, **kwargs):
            start = time.perf_counter()
            result = logps_in_chunks(model, tokenizer, comparisons, *rest, **kwargs)
            passes.append((len(comparisons), time.perf_counter() - start))
            return result

        module.logps_in_chunks = timed
    with tempfile.TemporaryDirectory() as runs:
        args = tyro.cli(module.Args, args=ours_flags(method, model, preferences, runs, precision))
        try:
            result = module.main(args)
        finally:
            if method == "dpo":
                module.logps_in_chunks = logps_in_chunks
        events = EventAccumulator(result["run_dir"], size_guidance={"scalars": 0})
        events.Reload()
        tag = {"grpo": "time/update", "dpo": "losses/dpo_loss", "rm": "losses/reward_loss"}[method]
        ends = [e.wall_time for e in events.Scalars(tag)]
    return {"ends": ends[: STEPS], "flags": ours_flags(method, "MODEL", "PREFS", "RUNS", precision),
            "passes": passes}


def reference_share(run: dict) -> float | None:
    """Our DPO's reference pass (the largest logps_in_chunks call: every training comparison, once, before the
    first step) in seconds per step's worth of comparisons: the work TRL's default does inside each step."""
    if not run.get("passes"):
        return None
    comparisons, seconds = max(run["passes"])
    return seconds * DPO["batch"] / comparisons


def run_trl(method: str, model: str, preferences: str, precision: str) -> dict:
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback

    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token

    class StepEnds(TrainerCallback):
        ends: list = []

        def on_step_end(self, args, state, control, **kwargs):  # after each optimizer step
            self.ends.append(time.time())

    common = dict(use_cpu=True, report_to="none", save_strategy="no", seed=1, max_steps=STEPS, logging_steps=1,
                  bf16=precision == "bf16")
    with tempfile.TemporaryDirectory() as output_dir:
        if method == "grpo":
            from ppo_rlhf_gpt2 import PROMPTS

            def length_reward(completions, **kwargs):  # ours: --reward-model length
                return [len(c) / GRPO["tokens"] for c in completions]

            config = trl.GRPOConfig(
                output_dir=output_dir, per_device_train_batch_size=GRPO["micro"],
                gradient_accumulation_steps=GRPO["batch"] // GRPO["micro"], num_generations=GRPO["generations"],
                max_completion_length=GRPO["tokens"], generation_kwargs={"min_new_tokens": GRPO["tokens"]},
                beta=0.0, **common)
            trainer = trl.GRPOTrainer(model=model, reward_funcs=length_reward, args=config,
                                      train_dataset=Dataset.from_dict({"prompt": list(PROMPTS)}),
                                      processing_class=tokenizer, callbacks=[StepEnds()])
        else:  # DPO and the reward model: the same comparisons, sizes and call, each its own trainer
            Config, Trainer = (trl.RewardConfig, trl.RewardTrainer) if method == "rm" else (trl.DPOConfig,
                                                                                           trl.DPOTrainer)
            rows = [json.loads(line) for line in Path(preferences).read_text().splitlines()]
            data = Dataset.from_list([{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in rows])
            config = Config(output_dir=output_dir, per_device_train_batch_size=DPO["micro"],
                            gradient_accumulation_steps=DPO["batch"] // DPO["micro"], max_length=DPO["max_length"],
                            **common)
            trainer = Trainer(model=model, args=config, train_dataset=data, processing_class=tokenizer,
                              callbacks=[StepEnds()])
        trainer.train()
    return {"ends": StepEnds.ends, "trl": trl.__version__,
            "gradient_checkpointing": bool(config.gradient_checkpointing)}


def one_run(side: str, method: str, precision: str, model: str, preferences: str, out_json: str) -> None:
    import torch
    import transformers

    start = time.time()
    result = (run_ours if side == "ours" else run_trl)(method, model, preferences, precision)
    ends = result.pop("ends")
    result.update(side=side, method=method, precision=precision, seconds=[b - a for a, b in zip(ends, ends[1:])],
                  wall=time.time() - start, peak_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                  torch=torch.__version__, transformers=transformers.__version__,
                  python=platform.python_version(), threads=torch.get_num_threads())
    Path(out_json).write_text(json.dumps(result))


def step_time(run: dict) -> float:
    """A run's seconds per step: the median of its gaps after the first (the warm-up)."""
    return statistics.median(run["seconds"][1:] or run["seconds"])


def report(runs: list, command: str, model_line: str) -> str:
    """The page: per method, each variant's seconds per step (the median of its runs' medians), each run's, the
    peak memory; then ours in bf16 against TRL at its defaults, and each side's bf16 against its fp32."""
    trl_version = next((r["trl"] for r in runs if "trl" in r), "?")
    names = {"grpo": ("grpo_gpt2.py", f"TRL {trl_version} GRPOTrainer"),
             "dpo": ("dpo_gpt2.py", f"TRL {trl_version} DPOTrainer"),
             "rm": ("reward_model_gpt2.py", f"TRL {trl_version} RewardTrainer")}
    first = runs[0]
    lines = [f"# Our language-model files against TRL {trl_version}'s trainers: seconds per optimizer step", "",
             f"Command: `{command}`", "",
             f"{time.strftime('%Y-%m-%d')}; {os.cpu_count()} CPU cores, no GPU, one thread a run, one run at a time, "
             f"alternating; torch {first['torch']}, transformers {first['transformers']}. Policy: {model_line}. "
             f"{STEPS} optimizer steps a run, the first gap a warm-up. GRPO: {GRPO['batch']} completions of "
             f"{GRPO['tokens']} tokens a step, beta 0. DPO and the reward model: {DPO['batch']} comparisons a step, "
             f"texts of at most {DPO['max_length']} tokens.", ""]
    medians = {}
    for method in SCRIPTS:
        mine = [r for r in runs if r["method"] == method]
        if not mine:
            continue
        lines += [f"## {'Reward model' if method == 'rm' else method.upper()}", "",
                  "| implementation | precision | seconds a step | each run | peak memory GB |",
                  "|---|---|---|---|---|"]
        for side, precision in VARIANTS:
            these = [r for r in mine if r["side"] == side and r["precision"] == precision]
            if not these:
                continue
            medians[method, side, precision] = statistics.median(step_time(r) for r in these)
            label = precision if side == "ours" else ("fp32" if precision == "fp32" else "bf16 (TRL's default)")
            if side == "trl":
                label += ", gradient checkpointing" if these[0].get("gradient_checkpointing") else ""
            lines.append(f"| {names[method][side == 'trl']} | {label} | {medians[method, side, precision]:.2f} | "
                         f"{', '.join(f'{step_time(r):.2f}' for r in these)} | "
                         f"{statistics.median(r['peak_gb'] for r in these):.2f} |")
        lines.append("")
        for fast, slow, text in ((("ours", "bf16"), ("trl", "bf16"), "ours in bf16 against TRL at its defaults"),
                                 (("ours", "fp32"), ("trl", "fp32"), "ours against TRL, both fp32"),
                                 (("ours", "bf16"), ("ours", "fp32"), "ours, bf16 against fp32"),
                                 (("trl", "bf16"), ("trl", "fp32"), "TRL, bf16 against fp32")):
            if (method, *fast) in medians and (method, *slow) in medians:
                lines.append(f"- {text}: {medians[(method, *slow)] / medians[(method, *fast)]:.2f}x as fast")
        for precision in ("fp32", "bf16"):  # ours with its reference pass spread over the steps, as TRL's
            shares = [reference_share(r) for r in mine if r["side"] == "ours" and r["precision"] == precision]
            shares = [x for x in shares if x is not None]
            if shares and (method, "trl", precision) in medians:
                share = statistics.median(shares)
                mine_all_in = medians[method, "ours", precision] + share
                lines.append(f"- ours in {precision} with its reference pass counted a step's share ({share:.2f} s): "
                             f"{mine_all_in:.2f} s a step, {medians[method, 'trl', precision] / mine_all_in:.2f}x "
                             f"as fast as TRL in {precision}")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trl-python", help="the python of an environment with trl==1.16.0 (see the docstring)")
    parser.add_argument("--preferences", help="a JSONL preference file ({prompt, chosen, rejected} a line) for DPO")
    parser.add_argument("--methods", nargs="+", choices=tuple(SCRIPTS), default=["grpo", "dpo"])
    parser.add_argument("--model", help="a causal LM folder (default: SmolLM2-135M's architecture, random weights)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per variant, alternating")
    parser.add_argument("--out", default="benchmarks/results/trl_grpo_dpo", help="OUT.md and OUT.json")
    parser.add_argument("--run", nargs=3, metavar=("SIDE", "METHOD", "PRECISION"), help=argparse.SUPPRESS)
    parser.add_argument("--out-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        return one_run(*args.run, args.model, args.preferences, args.out_json)
    if not args.trl_python or not os.path.exists(args.trl_python):
        raise SystemExit("error: --trl-python must be the python of an environment with trl==1.16.0 (see --help)")
    if {"dpo", "rm"} & set(args.methods) and (not args.preferences or not os.path.isfile(args.preferences)):
        raise SystemExit("error: --preferences: DPO and the reward model need a JSONL preference file (or pass "
                         "--methods grpo)")
    if args.rounds < 1:
        raise SystemExit("error: --rounds must be at least 1")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        model, model_line = args.model, f"the folder {args.model}"
        if model is None:
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from rlhf_cost import build_models

            model_line = build_models(Path(tmp), "smollm2-135m", reward_model=False)
            model = str(Path(tmp) / "policy")
        preferences = os.path.join(tmp, "comparisons.jsonl")
        if {"dpo", "rm"} & set(args.methods):
            lines = Path(args.preferences).read_text().splitlines()
            if len(lines) < comparisons_needed():
                raise SystemExit(f"error: --preferences {args.preferences} has {len(lines)} comparisons, fewer "
                                 f"than the {comparisons_needed()} that {STEPS} steps need")
            Path(preferences).write_text("\n".join(lines[: comparisons_needed()]) + "\n")
        for repeat in range(args.rounds):
            for method in args.methods:
                for side, precision in VARIANTS:
                    out_json = os.path.join(tmp, f"{method}_{side}_{precision}_{repeat}.json")
                    python = sys.executable if side == "ours" else args.trl_python
                    subprocess.run([python, __file__, "--run", side, method, precision, "--model", model,
                                    "--preferences", preferences, "--out-json", out_json], check=True, env=env)
                    runs.append(json.loads(Path(out_json).read_text()))
                    print(f"{method} {side} {precision} round {repeat + 1}: {step_time(runs[-1]):.2f} s a step, "
                          f"{runs[-1]['peak_gb']:.2f} GB", flush=True)
    out = ROOT / args.out
    out.with_suffix(".json").write_text(json.dumps(runs, indent=1))
    page = report(runs, "python benchmarks/trl_grpo_dpo.py " + " ".join(sys.argv[1:]), model_line)
    out.with_suffix(".md").write_text(page)
    print(page)


if __name__ == "__main__":
    main()
