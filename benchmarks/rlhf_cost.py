"""Seconds and memory of an RLHF iteration (PPO, GRPO) or optimizer step (DPO, reward model) on a given device.

Builds locally (no model hub) a randomly initialised policy of the chosen architecture (GPT-2-small, or the
architectures of SmolLM2-135M and SmolLM2-1.7B: timing only, the weights are random) and a byte-level BPE tokenizer
of its vocabulary size; then runs each chosen script on it in a subprocess with one CPU thread, and reports for
each the seconds of an iteration split into rollout (generation; reward, reference and value passes) and update,
read back from the run's TensorBoard events (the median over the iterations after the first, which warms up), the
subprocess's peak resident memory and, with --cuda, the most GPU memory in use while it ran (nvidia-smi, sampled
every 0.5 s). The scripts run with their defaults (PPO: 4 epochs x 4 minibatches; GRPO: one pass, one minibatch,
G = 8, k3 at beta 0.04) plus --ppo-flags / --grpo-flags. With --precisions fp32 bf16 each script runs in both
(bf16: --bf16, autocast with fp32 weights), alternating, --rounds times, and the report gives each script's
fp32 seconds per iteration over its bf16 ones.

dpo_gpt2.py and reward_model_gpt2.py (--scripts dpo rm) train at their defaults (32 comparisons a step) on the first
lines of --preferences, enough for --iterations + 2 steps; their seconds are the gaps between the wall times of
consecutive steps' logged losses (the medians after the first gap; setup, the reference's log-probs and the probe
not counted), shown as update seconds; --batch-size and --response-length are PPO's and GRPO's.

Tasks: `classifier` (a GPT2ForSequenceClassification reward model of GPT-2-small's size), `vader`, and
`arithmetic` (two-digit sums, --min-response-length 0). Score normalization is off in PPO (it samples extra
batches before training).

Usage: python benchmarks/rlhf_cost.py [--iterations 2] [--out benchmarks/results/rlhf_cost.md]
       python benchmarks/rlhf_cost.py --scripts ppo grpo --architecture smollm2-135m --task vader \
           --batch-size 16 --iterations 3 --precisions fp32 bf16 --rounds 2 --out benchmarks/results/rlhf_bf16.md
       python benchmarks/rlhf_cost.py --cuda --scripts ppo grpo --architecture smollm2-135m --task arithmetic \
           --batch-size 64 --response-length 8 --iterations 5 --out benchmarks/results/rlhf_cost_gpu.md
       python benchmarks/rlhf_cost.py --scripts dpo rm --architecture smollm2-135m --task vader \
           --preferences vader_2000.jsonl --iterations 4 --precisions fp32 bf16 --out benchmarks/results/rlhf_bf16.md
"""

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCRIPTS = {"ppo": "ppo_rlhf_gpt2.py", "grpo": "grpo_gpt2.py", "dpo": "dpo_gpt2.py", "rm": "reward_model_gpt2.py"}
LOSS = {"dpo": "losses/dpo_loss", "rm": "losses/reward_loss"}  # logged once a step by the preference scripts
COMPARISONS_PER_STEP = 32  # their default --batch-size
# The architectures of SmolLM2-135M and SmolLM2-1.7B (their config.json files), GPT-2-small's (GPT2Config()).
LLAMA = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, rope_theta=100000.0),
    "smollm2-1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                         num_key_value_heads=32, rope_theta=130000.0),
}


def build_tokenizer(vocab_size: int):
    """A byte-level BPE trained on the prompts, then filled up with two-byte merges to vocab_size tokens (the last
    one <|endoftext|>), so that every id a random policy samples decodes to text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from ppo_rlhf_gpt2 import PROMPTS

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.train_from_iterator(PROMPTS, trainers.BpeTrainer(
        vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model_json = json.loads(trained.to_str())["model"]
    vocab = dict(model_json["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model_json["merges"]]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    for a in alphabet:
        for b in alphabet:
            if len(vocab) == vocab_size - 1:
                break
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                merges.append((a, b))
    vocab["<|endoftext|>"] = vocab_size - 1
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|endoftext|>",
                                           eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    assert len(hf_tokenizer) == vocab_size, len(hf_tokenizer)
    return hf_tokenizer


def build_models(directory: Path, architecture: str = "gpt2", reward_model: bool = True) -> str:
    """Writes <directory>/policy (and <directory>/reward, GPT-2-small's size, if reward_model); returns a line
    that names the policy's architecture and size."""
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    vocab_size = 50257 if architecture == "gpt2" else 49152
    hf_tokenizer = build_tokenizer(vocab_size)
    torch.manual_seed(0)
    if architecture == "gpt2":
        policy = GPT2LMHeadModel(GPT2Config())
    else:
        eos = vocab_size - 1
        policy = LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, tie_word_embeddings=True, head_dim=64,
                                              max_position_embeddings=8192, rms_norm_eps=1e-5, bos_token_id=eos,
                                              eos_token_id=eos, **LLAMA[architecture]))
    size = sum(p.numel() for p in policy.parameters()) / 1e6
    policy.save_pretrained(directory / "policy")
    hf_tokenizer.save_pretrained(directory / "policy")
    del policy
    if reward_model:
        reward = GPT2ForSequenceClassification(GPT2Config(num_labels=2))
        reward.save_pretrained(directory / "reward")
        build_tokenizer(50257).save_pretrained(directory / "reward")
    return f"{architecture} architecture, randomly initialised, {size:.1f}M parameters, vocabulary {vocab_size}"


def read_scalars(run_dir: Path, wall_times: bool = False) -> dict:
    """Each scalar tag's values in step order (with wall_times: the seconds since the epoch each was logged at)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [e.wall_time if wall_times else e.value for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def step_seconds(wall_times: list[float]) -> list[float]:
    """The seconds of each step after the first: the gaps between consecutive steps' logging times."""
    return [b - a for a, b in zip(wall_times, wall_times[1:])]


def write_comparisons(source: str, destination: Path, iterations: int, eval_fraction: float = 0.1) -> None:
    """The first lines of `source`: enough that the part not held out fills iterations + 2 steps."""
    lines = Path(source).read_text().splitlines()
    needed = math.ceil(COMPARISONS_PER_STEP * (iterations + 2) / (1 - eval_fraction)) + COMPARISONS_PER_STEP
    if len(lines) < needed:
        raise SystemExit(f"error: --preferences {source} has {len(lines)} comparisons; --iterations {iterations} "
                         f"needs {needed}: pass a bigger file or fewer --iterations")
    destination.write_text("\n".join(lines[:needed]) + "\n")


def nvidia_smi(field: str) -> str:
    """One field of GPU 0 as nvidia-smi reports it (`name`, `memory.used` in MiB, ...)."""
    return subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", "0"],
                          capture_output=True, text=True).stdout.strip()


def command_of(script: str, models: Path, runs: Path, cli, precision: str = "fp32") -> list[str]:
    """The exact command line of one timing run."""
    task = {"classifier": ["--reward-model", str(models / "reward")], "vader": ["--reward-model", "vader"],
            "arithmetic": ["--reward-model", "arithmetic", "--arithmetic-digits", "2", "--min-response-length", "0"]}
    flags = {"ppo": ["--no-normalize-scores", *shlex.split(cli.ppo_flags)], "grpo": shlex.split(cli.grpo_flags)}
    if script in LOSS:  # trains on comparisons: no reward, no rollout
        return [sys.executable, str(ROOT / SCRIPTS[script]), "--model-name", str(models / "policy"),
                "--preferences", str(models / "comparisons.jsonl"), "--runs-dir", str(runs), "--num-threads", "1",
                "--cuda" if cli.cuda else "--no-cuda", "--eval-every", "0",
                *(["--eval-episodes", "0"] if script == "dpo" else []), *(["--bf16"] if precision == "bf16" else [])]
    return [sys.executable, str(ROOT / SCRIPTS[script]), "--model-name", str(models / "policy"), *task[cli.task],
            "--runs-dir", str(runs), "--num-threads", "1", "--cuda" if cli.cuda else "--no-cuda",
            "--batch-size", str(cli.batch_size), "--response-length", str(cli.response_length),
            "--total-episodes", str(cli.batch_size * cli.iterations), "--eval-episodes", "0", *flags[script],
            *(["--bf16"] if precision == "bf16" else [])]


def time_run(command: list[str], runs: Path, cuda: bool, script: str = "ppo") -> dict:
    """Runs one command; its per-iteration rollout and update seconds, peak resident memory and GPU memory."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    start = time.time()
    process = subprocess.Popen(command, env=env)
    gpu_used_mib = [0]  # the GPU memory in use (all processes), as sampled

    def sample():
        while process.poll() is None:
            if cuda:
                gpu_used_mib.append(int(nvidia_smi("memory.used") or 0))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample)
    sampler.start()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    sampler.join()
    if process.returncode != 0:
        raise SystemExit(f"training failed (exit {process.returncode}): {shlex.join(command)}")
    (run_dir,) = list(runs.iterdir())
    if script in LOSS:
        steps = step_seconds(read_scalars(run_dir, wall_times=True)[LOSS[script]])
        timing = {"rollout": [0.0] * len(steps), "update": steps}
    else:
        scalars = read_scalars(run_dir)
        timing = {"rollout": scalars["time/rollout"], "update": scalars["time/update"]}
    return {**timing, "wall": time.time() - start, "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9,
            "gpu_mib": max(gpu_used_mib)}


def per_iteration(result: dict) -> tuple[float, float]:
    """Rollout and update seconds: the medians over the iterations after the first (which warms up)."""
    later = slice(1, None) if len(result["rollout"]) > 1 else slice(None)
    return statistics.median(result["rollout"][later]), statistics.median(result["update"][later])


def summary_row(script: str, result: dict, precision: str = "fp32") -> str:
    """script | precision | rollout | update | total (per_iteration) | memory."""
    rollout, update = per_iteration(result)
    gpu = f"{result['gpu_mib'] / 1024:.1f} GiB" if result["gpu_mib"] else "-"
    shown = "-" if script in LOSS else f"{rollout:.2f}"  # no rollout: the update is one optimizer step
    return (f"| {SCRIPTS[script]} | {precision} | {shown} | {update:.2f} | {rollout + update:.2f} | "
            f"{result['peak_rss_gb']:.2f} GB | {gpu} |")


def speedups(results: list[tuple[str, str, dict]]) -> list[str]:
    """Per script timed in both precisions: the median over its runs of fp32's total seconds per iteration over
    the median of bf16's (above 1: bf16 is faster)."""
    lines = []
    for script in dict.fromkeys(s for s, _, _ in results):
        totals = {p: [sum(per_iteration(r)) for s, q, r in results if s == script and q == p] for p in ("fp32", "bf16")}
        if totals["fp32"] and totals["bf16"]:
            ratio = statistics.median(totals["fp32"]) / statistics.median(totals["bf16"])
            lines.append(f"- {SCRIPTS[script]}: fp32 {statistics.median(totals['fp32']):.2f} s, bf16 "
                         f"{statistics.median(totals['bf16']):.2f} s per iteration (medians of "
                         f"{len(totals['fp32'])} and {len(totals['bf16'])} runs): bf16 {ratio:.2f}x as fast")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scripts", nargs="+", default=["ppo"], choices=list(SCRIPTS), help="the scripts to time")
    parser.add_argument("--architecture", default="gpt2", choices=["gpt2", *LLAMA], help="the policy's architecture")
    parser.add_argument("--task", default="classifier", choices=["classifier", "vader", "arithmetic"])
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--response-length", type=int, default=24)
    parser.add_argument("--ppo-flags", default="", help="more flags for ppo_rlhf_gpt2.py, in one string")
    parser.add_argument("--grpo-flags", default="", help="more flags for grpo_gpt2.py, in one string")
    parser.add_argument("--preferences", help="--scripts dpo / rm: a JSONL file of comparisons (its first lines)")
    parser.add_argument("--cuda", action="store_true", help="train on the GPU (default: the CPU)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rlhf_cost.md"))
    parser.add_argument("--append", action="store_true", help="append the report to --out instead of replacing it")
    parser.add_argument("--precisions", nargs="+", default=["fp32"], choices=["fp32", "bf16"],
                        help="run each script in each (bf16: its --bf16), alternating")
    parser.add_argument("--rounds", type=int, default=1, help="how many times each script runs in each precision")
    cli = parser.parse_args()
    if cli.batch_size % 8 != 0:
        raise SystemExit("error: --batch-size must be a multiple of 8 (GRPO's groups of 8, PPO's 4 minibatches)")
    if cli.task == "classifier" and cli.architecture != "gpt2":
        raise SystemExit("error: --task classifier needs the GPT-2 tokenizer: use --architecture gpt2, or --task "
                         "vader / arithmetic")
    if set(cli.scripts) & set(LOSS) and not (cli.preferences and Path(cli.preferences).is_file()):
        raise SystemExit(f"error: --scripts dpo / rm need --preferences FILE, a JSONL file of comparisons "
                         f"(got {cli.preferences})")

    rows, commands, details, results = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if set(cli.scripts) & set(LOSS):
            write_comparisons(cli.preferences, tmp / "comparisons.jsonl", cli.iterations)
        model_line = build_models(tmp, cli.architecture, reward_model=cli.task == "classifier")
        for round_ in range(cli.rounds):
            for script in cli.scripts:
                for precision in cli.precisions:
                    runs = tmp / f"runs_{script}_{precision}_{round_}"
                    command = command_of(script, tmp, runs, cli, precision)
                    if round_ == 0:
                        shown = shlex.join(["python", *command[1:]]).replace(str(tmp), "MODELS")
                        commands.append(shown.replace(str(ROOT) + "/", ""))
                    result = time_run(command, runs, cli.cuda, script)
                    results.append((script, precision, result))
                    rows.append(summary_row(script, result, precision))
                    print(rows[-1], flush=True)
                    rollouts = ", ".join(f"{x:.2f}" for x in result["rollout"])
                    rollout = "" if script in LOSS else f"rollout {rollouts}; "
                    details.append(f"- {SCRIPTS[script]}, {precision}, per {'step' if script in LOSS else 'iteration'}"
                                   f": {rollout}update {', '.join(f'{x:.2f}' for x in result['update'])}; the whole "
                                   f"process {result['wall']:.0f} s")
    device = f"{nvidia_smi('name')} (--cuda)" if cli.cuda else "the CPU (--no-cuda)"
    sizes = []
    if set(cli.scripts) - set(LOSS):
        sizes.append(f"{cli.task}, batch {cli.batch_size} x {cli.response_length} tokens")
    if set(cli.scripts) & set(LOSS):
        sizes.append(f"{COMPARISONS_PER_STEP} comparisons a step")
    report = "\n".join([
        f"## {cli.architecture}, {'; '.join(sizes)}",
        "",
        f"Command: `python benchmarks/rlhf_cost.py {' '.join(sys.argv[1:])}`",
        "",
        f"Device: {device}; {platform.machine()}, {os.cpu_count()} cores visible, torch {__import__('torch').__version__} "
        f"on 1 CPU thread; measured {time.strftime('%Y-%m-%d %H:%M')}. Policy: {model_line}; weights fp32, "
        f"computed in {' and '.join(cli.precisions)} ({cli.rounds} round{'s' if cli.rounds > 1 else ''}).",
        "Runs (MODELS: the folder of the built models):",
        *[f"- `{c}`" for c in commands],
        "",
        "Seconds per iteration or step (medians over the iterations after the first; DPO and the reward model: over "
        "the gaps between logged steps after the first), the process's peak resident memory, "
        "and the most GPU memory in use while it ran (nvidia-smi, all processes, CUDA context included).",
        "",
        "| script | precision | rollout s | update s | total s | peak RSS | most GPU memory |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        *speedups(results),
        "",
        *details,
        "",
    ])
    print(report)
    Path(cli.out).parent.mkdir(parents=True, exist_ok=True)
    previous = Path(cli.out).read_text() + "\n" if cli.append and Path(cli.out).exists() else ""
    Path(cli.out).write_text(previous + report)


if __name__ == "__main__":
    main()
