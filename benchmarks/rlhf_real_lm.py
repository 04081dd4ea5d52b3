"""Train a real pretrained LM with ppo_rlhf_gpt2.py and write what it learned: curves, held-out scores, samples.

Runs `ppo_rlhf_gpt2.main` in this process with the arguments after `--` (exactly the script's flags; its
evaluation samples `--eval-episodes` responses to held-out prompts before and after training), then writes
OUT.md (command, time per iteration, peak memory, the initial and final policy's held-out scores as
mean ± standard error, the gain in normalized units, samples before and after) and OUT.png
(objective/scores, objective/kl and objective/rlhf_reward against episodes).

    python tools/get_smollm2.py --out models/smollm2-135m
    python benchmarks/rlhf_real_lm.py docs/results/rlhf_smollm2 -- --model-name models/smollm2-135m \
        --reward-model vader --batch-size 16 --num-minibatches 2 --total-episodes 1280
"""

import os
import resource
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import ppo_rlhf_gpt2 as rlhf  # noqa: E402


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        raise SystemExit("usage: python benchmarks/rlhf_real_lm.py OUT_PREFIX -- <ppo_rlhf_gpt2.py flags>")
    out, flags = ROOT / sys.argv[1], sys.argv[3:]
    args = tyro.cli(rlhf.Args, args=flags)
    if args.eval_episodes < 2:
        raise SystemExit("error: --eval-episodes must be at least 2 to report a standard error")
    start = time.time()
    result = rlhf.main(args)
    wall = time.time() - start
    events = EventAccumulator(result["run_dir"], size_guidance={"scalars": 0})
    events.Reload()
    scalars = {tag: np.array([e.value for e in events.Scalars(tag)]) for tag in events.Tags()["scalars"]}
    episodes = np.arange(1, len(scalars["objective/scores"]) + 1) * args.batch_size

    verifier = "eval/accuracy" in scalars  # --reward-model arithmetic: held-out accuracy is the measure
    tags = ("objective/raw_scores", "objective/kl", "charts/episodic_length") if verifier else (
        "objective/scores", "objective/kl", "objective/rlhf_reward")
    fig, axes = plt.subplots(1, 4 if verifier else 3, figsize=(17 if verifier else 13, 3.6))
    if verifier:
        eval_steps = np.array([e.step for e in events.Scalars("eval/accuracy")]) * args.batch_size
        for tag, label in (("eval/accuracy", "sampled"), ("eval/greedy_accuracy", "greedy")):
            if tag in scalars:
                axes[3].plot(eval_steps, scalars[tag], marker="o", label=label)
        axes[3].set_title("held-out accuracy")
        axes[3].set_xlabel("episodes (responses)")
        axes[3].set_ylim(0, 1)
        axes[3].legend(fontsize=8)
    for ax, tag in zip(axes, tags):
        ax.plot(episodes, scalars[tag], alpha=0.35, color="C0")
        window = min(10, len(episodes))
        smooth = np.convolve(scalars[tag], np.ones(window) / window, mode="valid")
        ax.plot(episodes[window - 1 :], smooth, color="C0", label=f"mean of {window} iterations")
        ax.set_title(tag)
        ax.set_xlabel("episodes (responses)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{out}.png", dpi=110)

    initial, final = result["eval"]["initial"], result["eval"]["final"]
    seconds = scalars["time/rollout"] + scalars["time/update"]
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    first, last = (slice(0, max(1, len(episodes) // 10)), slice(-max(1, len(episodes) // 10), None))

    def accuracy_rows():
        rows = ["| policy | decoding | accuracy, mean ± standard error | responses with the stop token |",
                "|---|---|---|---|"]
        for when, evaluation in result["eval"].items():
            if isinstance(evaluation, dict) and "accuracy" in evaluation:
                name, greedy = when.removesuffix("_greedy"), when.endswith("_greedy")
                rows.append(f"| {name.replace('_', ' ')} | {'greedy' if greedy else 'sampled'} | "
                            f"{evaluation['accuracy']:.1%} ± {evaluation['accuracy_stderr']:.1%} | "
                            f"{evaluation['stop_share']:.1%} |")
        return rows

    def samples(evaluation):
        rows = [f"- ({score:+.3f}) [{q}]{r}".replace("|", "\\|").replace("\n", " ⏎ ")
                for (q, r), score in zip(evaluation["samples"][:8], evaluation["raw_scores"][:8])]
        return rows

    lines = [
        f"# PPO-RLHF on a real pretrained LM: {args.model_name}, reward `{args.reward_model}`",
        "",
        f"Command: `python benchmarks/rlhf_real_lm.py {sys.argv[1]} -- {' '.join(flags)}`",
        f"({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, torch on {args.num_threads} thread(s), no GPU).",
        "",
        f"{len(episodes)} iterations of {args.batch_size} responses ({episodes[-1]} episodes) in {wall / 60:.1f} "
        f"minutes (evaluations included); seconds per iteration: median {np.median(seconds):.1f} "
        f"(rollout {np.median(scalars['time/rollout']):.1f}, update {np.median(scalars['time/update']):.1f}); "
        f"peak resident memory {peak_gb:.2f} GB.",
        "",
        f"![curves]({Path(out).name}.png)",
        "",
        f"Held-out prompts ({'held-out problems' if verifier else '`EVAL_PROMPTS`'}, never trained on), {args.eval_episodes} responses each, sampled as in "
        "training; the score is the raw reward (no normalization, no EOS trick):",
        "",
        "| policy | raw score, mean ± standard error | responses with the stop token |",
        "|---|---|---|",
        f"| initial | {initial['raw_score_mean']:.4f} ± {initial['raw_score_stderr']:.4f} | {initial['stop_share']:.1%} |",
        f"| final | {final['raw_score_mean']:.4f} ± {final['raw_score_stderr']:.4f} | {final['stop_share']:.1%} |",
        "",
        *([f"Held-out accuracy ({len(set(q for q, _ in initial['samples']))} distinct problems, "
           f"{args.eval_episodes} responses per evaluation):", "", *accuracy_rows(), ""] if verifier else []),
        f"Gain in normalized units (the std of the initial policy's training scores is 1): "
        f"**{result['eval']['normalized_score_change']:+.3f}**. Training curves, mean of the first and the last "
        f"{first.stop} iterations: objective/scores {scalars['objective/scores'][first].mean():+.3f} -> "
        f"{scalars['objective/scores'][last].mean():+.3f}, objective/kl {scalars['objective/kl'][first].mean():.3f} "
        f"-> {scalars['objective/kl'][last].mean():.3f} nats, objective/raw_scores "
        f"{scalars['objective/raw_scores'][first].mean():.3f} -> {scalars['objective/raw_scores'][last].mean():.3f}.",
        "",
        "## Samples of the initial policy (raw score, [prompt]response)",
        "",
        *samples(initial),
        "",
        "## Samples of the final policy, same prompts",
        "",
        *samples(final),
        "",
        *(["## Greedy samples of the final policy, same prompts", "", *samples(result["eval"]["final_greedy"]), ""]
          if "final_greedy" in result["eval"] else []),
    ]
    Path(f"{out}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
