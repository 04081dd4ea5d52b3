"""How much does a benchmark's verdict depend on which seeds it ran? Reads benchmarks/results/NAME.json.

Usage (from the repository root, after `benchmarks/benchmark.py ... --name walker2d_20seeds`):
    python benchmarks/seed_luck.py --name walker2d_20seeds --bar 3500

For each script in the benchmark, over its N runs (one per seed): the share of all ways to pick `k` of
them whose mean training return reaches `bar`, the range of those k-run means, and a bootstrap 95%
interval for the mean of all N (resampled with a fixed seed, so the output is the same on every call).
A bar judged on k seeds that only some k-subsets pass is a statement about the seeds as much as the code.
"""

import itertools
import json
import math
import os
from dataclasses import dataclass

import numpy as np
import tyro

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


@dataclass
class Args:
    name: str = "walker2d_20seeds"
    """the benchmark name: reads benchmarks/results/NAME.json"""
    bar: float = 3500.0
    """the mean training return a k-seed table must reach"""
    k: int = 5
    """how many seeds the bar is judged on"""
    resamples: int = 20_000
    """bootstrap resamples for the interval of the mean"""
    max_subsets: int = 1_000_000
    """enumerate every k-subset up to this many; beyond it, draw this many at random"""


def main(args: Args) -> None:
    with open(os.path.join(RESULTS, f"{args.name}.json")) as f:
        results = json.load(f)["results"]
    for script, runs in results.items():
        returns = np.array([run["train_return"] for run in runs])
        if not 0 < args.k <= len(returns):
            raise SystemExit(f"error: --k {args.k} must be between 1 and the {len(returns)} runs of {script}")
        rng = np.random.default_rng(0)
        if math.comb(len(returns), args.k) <= args.max_subsets:
            means = np.array([np.mean(c) for c in itertools.combinations(returns, args.k)])
            subsets = f"of the {len(means)} ways to pick {args.k} runs"
        else:  # too many to list (e.g. 15 of 30): a random sample of them, without repeats inside a subset
            picks = np.argsort(rng.random((args.max_subsets, len(returns))), axis=1)[:, : args.k]
            means = returns[picks].mean(axis=1)
            subsets = f"of {len(means)} random picks of {args.k} runs"
        boot = returns[rng.integers(0, len(returns), (args.resamples, len(returns)))].mean(axis=1)
        low, high = np.percentile(boot, [2.5, 97.5])
        print(f"{script}: {len(returns)} runs, mean {returns.mean():.2f}, median {np.median(returns):.2f}; "
              f"{np.mean(means >= args.bar):.1%} {subsets} reach {args.bar:g} "
              f"({args.k}-run means {means.min():.0f} to {means.max():.0f}); "
              f"bootstrap 95% interval of the mean {low:.0f} to {high:.0f}")


if __name__ == "__main__":
    main(tyro.cli(Args))
