"""The validation rule for a change of defaults, read from benchmark tables (benchmarks/results/<name>.md).

A candidate replaces the defaults only if its mean over the validation seeds minus the defaults' mean has
a 95% Welch interval (experiments/protocol.py's difference_interval) above 0; the highest such mean if
several do.

    python benchmarks/validation_choice.py --defaults walker2d_val_defaults \
        --candidates walker2d_val_mb4 walker2d_val_epochs15 walker2d_val_lambda097
"""
import os
import sys
from dataclasses import dataclass, field

import numpy as np
import tyro

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments"))
import protocol  # noqa: E402

COLUMN = "training return per seed"


@dataclass
class Args:
    defaults: str
    """the benchmark name of the defaults' runs"""
    candidates: list[str] = field(default_factory=list)
    """the benchmark names of the candidates' runs, one changed flag each"""
    script: str = "ppo_walker2d.py"
    """the script's row in each table"""
    results: str = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    """the folder of the benchmark tables"""


def per_seed(results: str, name: str, script: str) -> list[float]:
    """The script's per-seed training returns in the table <results>/<name>.md (an error if absent)."""
    path = os.path.join(results, f"{name}.md")
    if not os.path.exists(path):
        raise SystemExit(f"error: {path} not found: run `benchmarks/benchmark.py ... --name {name}` first")
    header = None
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if COLUMN in cells:
            header = cells
        elif header and cells[0] == script:
            return [float(v) for v in cells[header.index(COLUMN)].split(",")]
    raise SystemExit(f"error: {path} has no '{COLUMN}' row for {script}")


def choose(defaults: list[float], candidates: dict) -> tuple[str | None, dict]:
    """(the candidate adopted or None, {candidate: (difference, half-width, above 0)}) by the rule above."""
    diffs = {name: protocol.difference_interval(values, defaults) for name, values in candidates.items()}
    diffs = {name: (d, h, d - h > 0) for name, (d, h) in diffs.items()}
    above = [name for name, (_, _, passed) in diffs.items() if passed]
    return (max(above, key=lambda n: np.mean(candidates[n])) if above else None), diffs


def main(args: Args) -> str:
    if not args.candidates:
        raise SystemExit("error: --candidates is empty: name at least one candidate's benchmark, e.g. "
                         "--candidates walker2d_val_mb4")
    defaults = per_seed(args.results, args.defaults, args.script)
    candidates = {n: per_seed(args.results, n, args.script) for n in args.candidates}
    chosen, diffs = choose(defaults, candidates)
    lines = ["| runs | mean ± std over seeds | minus the defaults, 95% Welch | above 0 |",
             "|---|---|---|---|",
             f"| {args.defaults} | {np.mean(defaults):.2f} ± {np.std(defaults):.2f} | | |"]
    for name, values in candidates.items():
        d, h, passed = diffs[name]
        lines.append(f"| {name} | {np.mean(values):.2f} ± {np.std(values):.2f} | {d:+.2f} ± {h:.2f} | "
                     f"{'yes' if passed else 'no'} |")
    lines.append(f"\nadopted: {chosen}" if chosen else "\nadopted: none; the defaults stay")
    return "\n".join(lines)


if __name__ == "__main__":
    print(main(tyro.cli(Args)))
