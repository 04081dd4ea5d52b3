"""Evaluate the saved agents of a `ppo_walker2d.py` benchmark two ways: with the mean action and with sampled actions.

Usage (from the repository root, after `benchmarks/benchmark.py --scripts ppo_walker2d.py ... --name walker2d`):
    python benchmarks/eval_modes.py --name walker2d
    python benchmarks/eval_modes.py --name hopper --seeds 1 2 3   (a run with --extra-args="--env-id Hopper-v5")

`ppo_walker2d.py --eval-episodes` scores the mean action, which drops the exploration noise that every
training episode carries, so it is expected to score above the training return. Sampling the actions
the way the rollout does gives the like-for-like check that the saved weights and normalization
statistics reproduce the agent that was trained. Both modes play the same episode seeds, with the
statistics frozen. Writes benchmarks/results/NAME_eval_modes.md.
"""

import glob
import json
import os
import shlex
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import ppo_walker2d  # noqa: E402


@dataclass
class Args:
    name: str = "walker2d"
    """the benchmark name: reads benchmarks/runs/NAME/ppo_walker2d/seed*/ and benchmarks/results/NAME.json"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    """the seeds whose saved agents to evaluate"""
    episodes: int = 20
    """evaluation episodes per agent and mode"""


def play(agent, obs_rms, obs_clip, env_id, episodes, seed, sample):
    torch.manual_seed(seed)  # the same action noise on every call
    return float(np.mean(ppo_walker2d.evaluate(agent, obs_rms, obs_clip, env_id, episodes, seed, "cpu", sample=sample)))


def main(args: Args) -> None:
    torch.set_num_threads(1)
    results_json = os.path.join(ROOT, "benchmarks", "results", f"{args.name}.json")
    if not os.path.exists(results_json):
        raise SystemExit(f"error: {results_json} not found; run benchmarks/benchmark.py --name {args.name} first")
    results = json.load(open(results_json))["results"]
    if "ppo_walker2d.py" not in results:
        raise SystemExit(f"error: --name {args.name} is not a benchmark of ppo_walker2d.py (it ran {', '.join(results)})")
    runs = results["ppo_walker2d.py"]
    train = {r["seed"]: r["train_return"] for r in runs}
    rows = []
    for seed in args.seeds:
        paths = glob.glob(os.path.join(ROOT, "benchmarks", "runs", args.name, "ppo_walker2d", f"seed{seed}", "*", "agent.pt"))
        if not paths or seed not in train:
            raise SystemExit(f"error: no saved agent or training return for seed {seed} of --name {args.name}")
        agent, obs_rms, checkpoint = ppo_walker2d.load_agent(paths[0], "cpu")
        env_seed = 200_000 + seed * 1000  # episodes unseen in training and in the benchmark's own evaluation
        mean_return = play(agent, obs_rms, checkpoint["obs_clip"], checkpoint["env_id"], args.episodes, env_seed, False)
        sampled_return = play(agent, obs_rms, checkpoint["obs_clip"], checkpoint["env_id"], args.episodes, env_seed, True)
        std = float(agent.actor_logstd.detach().exp().mean())
        rows.append((seed, train[seed], sampled_return, mean_return, std))
        print(f"seed {seed}: training {train[seed]:.1f}, sampled {sampled_return:.1f}, mean action {mean_return:.1f}", flush=True)

    def rel(x, t):
        return f"{100 * (x / t - 1):+.1f}%"

    lines = [
        f"# {args.name}: evaluation modes of the saved agents",
        "",
        "Command: `python benchmarks/eval_modes.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]) + "`",
        "",
        f"{args.episodes} episodes per agent and mode, the same episode seeds for both modes, normalization "
        "statistics frozen. Training return: mean of the last 100 training episodes (from the benchmark). "
        "Policy std: the saved agent's exp(log-std), averaged over the action dimensions.",
        "",
        "| seed | training return | sampled actions | vs training | mean action | vs training | policy std |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed, t, s, m, std in rows:
        lines.append(f"| {seed} | {t:.1f} | {s:.1f} | {rel(s, t)} | {m:.1f} | {rel(m, t)} | {std:.3f} |")
    t, s, m = (np.mean([r[i] for r in rows]) for i in (1, 2, 3))
    lines.append(f"| mean | {t:.1f} | {s:.1f} | {rel(s, t)} | {m:.1f} | {rel(m, t)} | {np.mean([r[4] for r in rows]):.3f} |")
    lines.append("")
    with open(os.path.join(ROOT, "benchmarks", "results", f"{args.name}_eval_modes.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main(tyro.cli(Args))
