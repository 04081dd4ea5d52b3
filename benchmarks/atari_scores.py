"""The game scores of one `ppo_atari.py` run, read back from its TensorBoard files: a table of the mean score of
the games that ended in each span of agent steps, with a 95% t-interval over those games.

    python benchmarks/atari_scores.py docs/results/ppo_atari_runs/pong_cpu_seed1 --bin 100000 --plot pong.png
    python benchmarks/atari_scores.py RUN --against OTHER_RUN --labels ours CleanRL --scalars losses/entropy

--against puts a second run (CleanRL's file logs the same tags) beside the first, in the table and the figure;
--scalars adds, per span, the mean of training scalars each run logs once an iteration; --reach 20 the step
where the mean of 100 games in a row first reaches 20 (the score papers report is such a mean).

    python benchmarks/atari_scores.py --seeds ours=RUN1,RUN2 CleanRL=RUN3,RUN4,RUN5 --bin 250000

--seeds compares files over seeds, the unit that varies between runs: per span, each run's mean game score, and
each file's mean of those over its runs with a 95% t-interval over runs; for two files, the first's mean minus
the second's with a Welch 95% interval. Up to the shortest run's last step.

A run resumed from a checkpoint (`--resume`) writes a second events file into its folder and logs again the
steps between its checkpoint and the point where it was stopped. Each file's points are kept only below the
first step of the next file (files in the order they were written), so that each game is counted once, as in
the run that went through without a stop.
"""

import argparse
import math
import re
import statistics
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 15: 2.13,
       20: 2.09, 30: 2.04, 60: 2.00}


def t95(df: int) -> float:
    """Student's t quantile for a two-sided 95% interval (the nearest table entry at or below df; 1.96 beyond)."""
    return T95[max(k for k in T95 if k <= df)] if df <= 60 else 1.96


def scores(run_dir: Path, tag: str = "charts/episodic_return") -> list[tuple[int, float]]:
    """(step, score) of every game in the run, each once, in the order of steps."""
    # in the order written: events.out.tfevents.<seconds>.<host>.<pid>.<count>, each number compared as a number
    files = sorted(run_dir.glob("events.out.tfevents.*"),
                   key=lambda p: [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", p.name)])
    if not files:
        raise SystemExit(f"error: {run_dir} has no TensorBoard events file: give a ppo_atari.py run folder")
    runs = []  # per file: its games, and the steps at which its iterations ended (charts/SPS)
    for path in files:
        events = EventAccumulator(str(path), size_guidance={"scalars": 0})
        events.Reload()
        tags = events.Tags()["scalars"]
        runs.append(([(e.step, e.value) for e in events.Scalars(tag)] if tag in tags else [],
                     [e.step for e in events.Scalars("charts/SPS")] if "charts/SPS" in tags else []))
    batch = next((ends[1] - ends[0] for _, ends in runs if len(ends) > 1), None)
    kept = []
    for i, (games, _) in enumerate(runs):
        # a later file resumed at a checkpoint one batch before its first iteration's end: what this file
        # logged after that step, the later one logs again
        resumed_at = [ends[0] - batch for _, ends in runs[i + 1 :] if ends and batch]
        kept += [(s, v) for s, v in games if not resumed_at or s <= min(resumed_at)]
    return sorted(kept, key=lambda p: p[0])


def half95(values: list[float]) -> float:
    """The half-width of the 95% t-interval of the mean of values (0 for one value)."""
    return t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0


def bins(points: list[tuple[int, float]], bin_size: int) -> list[tuple[int, int, int, float, float]]:
    """Per span of bin_size steps with games in it: (start, end, games, mean, half-width of its 95% t-interval;
    0 for one game)."""
    last, rows = max(s for s, _ in points), []
    for start in range(0, last + 1, bin_size):
        values = [v for s, v in points if start <= s < start + bin_size]
        if values:
            rows.append((start, min(start + bin_size, last), len(values), statistics.mean(values), half95(values)))
    return rows


def reach(points: list[tuple[int, float]], level: float, window: int = 100) -> str:
    """Where the mean of `window` games in a row first reaches `level`, and the highest such mean."""
    values = [v for _, v in points]
    means = [statistics.mean(values[end - window:end]) for end in range(window, len(values) + 1)]
    if not means:
        return f"fewer than {window} games: no mean of {window} games in a row yet"
    first = next((end for end, mean in enumerate(means, start=window) if mean >= level), None)
    where = (f"first at or above {level:g} at step {points[first - 1][0]} (game {first})" if first
             else f"never at or above {level:g}")
    return f"the mean of {window} games in a row: {where}; highest {max(means):.2f}"


def table(points: list[tuple[int, float]], bin_size: int) -> list[str]:
    """A markdown table: per span of bin_size steps, the games that ended there and their mean ± 95% t."""
    lines = ["| steps | games ended there | mean game score ± 95% t over those games |", "|---|---|---|"]
    for start, end, games, mean, half in bins(points, bin_size):
        lines.append(f"| {start / 1000:g}k-{end / 1000:g}k | {games} | {mean:.1f} ± {half:.1f} |")
    return lines


def side_by_side(runs: dict[str, list[tuple[int, float]]], bin_size: int, fmt: str = "{mean:.1f} ± {half:.1f}",
                 what: str = "mean game score ± 95% t (games)") -> list[str]:
    """A markdown table of several runs' points per span of bin_size steps, up to the shortest run's last step;
    each cell the mean ± its 95% t over the points in the span, with their count."""
    last = min(max(s for s, _ in points) for points in runs.values())
    rows = {name: {start: row for start, *row in bins([p for p in points if p[0] <= last], bin_size)}
            for name, points in runs.items()}
    lines = ["| steps | " + " | ".join(f"{name}: {what}" for name in runs) + " |", "|---" * (len(runs) + 1) + "|"]
    for start in range(0, last + 1, bin_size):
        cells = []
        for name in runs:
            row = rows[name].get(start)
            cells.append(fmt.format(mean=row[2], half=row[3]) + f" ({row[1]})" if row else "-")
        lines.append(f"| {start / 1000:g}k-{min(start + bin_size, last) / 1000:g}k | " + " | ".join(cells) + " |")
    return lines


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    """mean(a) - mean(b) and the half-width of its Welch 95% t-interval (Welch-Satterthwaite df, rounded down to
    the table's entries, so the interval is if anything too wide)."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if va + vb > 0 else 60
    return statistics.mean(a) - statistics.mean(b), t95(max(1, int(df))) * math.sqrt(va + vb)


def run_means(groups: dict[str, dict[str, list[tuple[int, float]]]], bin_size: int) -> tuple[int, dict]:
    """The shortest run's last step, and per file, per run, {span start: the run's mean game score there}, counting
    games up to that step."""
    last = min(max(s for s, _ in points) for runs in groups.values() for points in runs.values())
    return last, {name: [{start: row[2] for start, *row in bins([p for p in points if p[0] <= last], bin_size)}
                         for points in runs.values()] for name, runs in groups.items()}


def over_seeds(groups: dict[str, dict[str, list[tuple[int, float]]]], bin_size: int) -> list[str]:
    """A markdown table per span of bin_size steps: each file's mean over its runs of each run's mean game score
    there ± 95% t over runs (runs), and for two files the difference ± Welch 95%."""
    last, means = run_means(groups, bin_size)
    names = list(groups)
    head = [f"{name}: mean ± 95% t over runs (runs)" for name in names]
    if len(names) == 2:
        head.append(f"{names[0]} - {names[1]} ± Welch 95%")
    lines = ["| steps | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for start in range(0, last + 1, bin_size):
        per_file = {name: [m[start] for m in means[name] if start in m] for name in names}
        cells = [f"{statistics.mean(v):.1f} ± {f'{half95(v):.1f}' if len(v) > 1 else '-'} ({len(v)})" if v else "-"
                 for v in per_file.values()]
        if len(names) == 2:
            a, b = per_file.values()
            cells.append("{:+.1f} ± {:.1f}".format(*welch(a, b)) if len(a) > 1 and len(b) > 1 else "-")
        lines.append(f"| {start / 1000:g}k-{min(start + bin_size, last) / 1000:g}k | " + " | ".join(cells) + " |")
    return lines


def plot_seeds(groups: dict[str, dict[str, list[tuple[int, float]]]], bin_size: int, title: str, path: str) -> None:
    """Each run's mean score per span as a thin line, each file's mean over its runs as a thick one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, means = run_means(groups, bin_size)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, runs) in enumerate(means.items()):
        curves = [{start + bin_size / 2: mean for start, mean in run.items()} for run in runs]
        for j, curve in enumerate(curves):
            ax.plot(list(curve), list(curve.values()), color=f"C{i}", lw=0.8, alpha=0.5,
                    label=f"{name}: one run" if j == 0 else None)
        xs = sorted(set.intersection(*(set(c) for c in curves)))
        ax.plot(xs, [statistics.mean(c[x] for c in curves) for x in xs], color=f"C{i}", lw=2.5,
                label=f"{name}: mean of {len(curves)} runs")
    ax.set_xlabel("agent steps (4 frames each)")
    ax.set_ylabel(f"mean game score per {bin_size:,} steps")
    ax.set_title(title)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot(runs: dict[str, list[tuple[int, float]]], bin_size: int, title: str, path: str) -> None:
    """The learning-curve figure: every game's score as a dot, the table's means with their intervals (one
    colour a run; black where there is one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, points) in enumerate(runs.items()):
        color = "black" if len(runs) == 1 else f"C{i}"
        label = "" if len(runs) == 1 else f"{name}: "
        ax.scatter([s for s, _ in points], [v for _, v in points], s=4, alpha=0.3, color=f"C{i}",
                   label=f"{label}one game")
        rows = [row for row in bins(points, bin_size) if row[2] > 1]
        ax.errorbar([start + bin_size / 2 for start, *_ in rows], [row[3] for row in rows],
                    yerr=[row[4] for row in rows], color=color, capsize=3,
                    label=f"{label}mean per {bin_size:,} steps, 95% t")
    ax.set_xlabel("agent steps (4 frames each)")
    ax.set_ylabel("game score (all lives, unclipped)")
    ax.set_title(title)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", help="a ppo_atari.py run folder (its TensorBoard files)")
    parser.add_argument("--bin", type=int, default=100_000, help="agent steps a row")
    parser.add_argument("--plot", help="also write the learning-curve figure to this .png")
    parser.add_argument("--title", default="", help="the figure's title")
    parser.add_argument("--against", help="a second run folder, put beside the first")
    parser.add_argument("--labels", nargs=2, help="the two runs' names (default: their folders' names)")
    parser.add_argument("--reach", type=float, help="also print where the mean of 100 games first reaches this")
    parser.add_argument("--scalars", nargs="+", default=[], help="training scalars (tags) to average per span")
    parser.add_argument("--seeds", nargs="+", metavar="NAME=RUN,RUN", help="instead: files over seeds, each NAME "
                        "its runs' folders, comma-separated")
    args = parser.parse_args(argv)
    if args.bin < 1:
        parser.error("--bin must be at least 1")
    if args.seeds:
        if args.run_dir or args.against or args.reach is not None or args.scalars:
            parser.error("--seeds takes the runs itself: no RUN_DIR, --against, --reach or --scalars with it")
        if any("=" not in group for group in args.seeds):
            parser.error("--seeds: give each file as NAME=RUN,RUN (e.g. ours=runs/a,runs/b)")
        groups = {}
        for group in args.seeds:
            name, folders = group.split("=", 1)
            groups[name] = {folder: scores(Path(folder)) for folder in folders.split(",") if folder}
        empty = [folder for runs in groups.values() for folder, points in runs.items() if not points]
        if empty:
            raise SystemExit(f"error: {empty[0]} logged no game score yet")
        lines = over_seeds(groups, args.bin)
        for name, runs in groups.items():
            lines += [f"{name}: " + "; ".join(f"{Path(folder).name} {len(points)} games to step {points[-1][0]}"
                                             for folder, points in runs.items())]
        if args.plot:
            plot_seeds(groups, args.bin, args.title, args.plot)
        print("\n".join(lines))
        return lines
    if not args.run_dir:
        parser.error("give a run folder (RUN_DIR), or --seeds")
    paths = [Path(args.run_dir)] + ([Path(args.against)] if args.against else [])
    labels = args.labels or [path.name for path in paths]
    if len(set(labels)) < len(paths):
        labels = ["first", "second"]
    folders = dict(zip(labels, paths))
    runs = {name: scores(folder) for name, folder in folders.items()}
    for name, points in runs.items():
        if not points:
            raise SystemExit(f"error: {folders[name]} logged no game score yet")
    lines = table(runs[labels[0]], args.bin) if len(runs) == 1 else side_by_side(runs, args.bin)
    for name, points in runs.items():
        first, last = [v for _, v in points[:100]], [v for _, v in points[-100:]]
        prefix = f"{name}: " if args.against else ""
        lines += ["", f"{prefix}{len(points)} games to step {points[-1][0]}; the first {len(first)}: "
                  f"{statistics.mean(first):.1f}, the last {len(last)}: {statistics.mean(last):.1f}"]
        if args.reach is not None:
            lines.append(prefix + reach(points, args.reach))
    for tag in args.scalars:
        values = {name: scores(folder, tag) for name, folder in folders.items()}
        if not all(values.values()):
            raise SystemExit(f"error: --scalars {tag}: not logged by every run")
        lines += ["", *side_by_side(values, args.bin, "{mean:.3g} ± {half:.2g}", f"{tag}, mean ± 95% t (iterations)")]
    if args.plot:  # two runs: both up to the shorter one's last step
        last = min(points[-1][0] for points in runs.values())
        plot({name: [p for p in points if p[0] <= last] for name, points in runs.items()}, args.bin, args.title,
             args.plot)
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
