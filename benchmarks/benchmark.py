"""Run the project's scripts for several seeds, read their TensorBoard logs back, write a results table and curves.

Usage (from the repository root):
    python benchmarks/benchmark.py --scripts ppo_cartpole.py --total-timesteps 100000 --name cartpole_ppo
    python benchmarks/benchmark.py --scripts reinforce.py a2c.py ppo_cartpole.py --total-timesteps 500000 --name cartpole_pg
    python benchmarks/benchmark.py --scripts ppo_walker2d.py --total-timesteps 1000000 --name walker2d

Each run is `python SCRIPT --seed S --total-timesteps N --runs-dir benchmarks/runs/NAME/STEM/seedS --save-model
--eval-episodes E EXTRA...`, at most `--parallel` at a time (each script uses one torch thread by default).
A seed whose run ended with exit 0 under the same NAME (its wall_seconds.txt) is skipped, so the same command
resumes a stopped benchmark.
Writes benchmarks/results/NAME.md (table: mean +- std over seeds of the mean of the last 100 training episodes
and of the evaluation return, per-seed values, wall time and env steps/s), NAME.png (mean curve and min-max band
over seeds against env steps) and NAME_wallclock.png (against seconds); and, beside the runs, out of git,
benchmarks/runs/NAME/NAME.json (the per-seed numbers and curves: megabytes for a MuJoCo benchmark).
"""

import glob
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Args:
    scripts: list[str] = field(default_factory=lambda: ["ppo_cartpole.py"])
    """the scripts to run (paths relative to the repository root)"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    """the seeds to run each script with"""
    total_timesteps: int = 100_000
    """env steps of each run"""
    name: str = "cartpole_ppo"
    """output name: benchmarks/results/NAME.{md,png} and runs (and NAME.json) in benchmarks/runs/NAME/"""
    parallel: int = 2
    """runs at a time (at most the number of quiet cores)"""
    eval_episodes: int = 10
    """evaluation episodes of the saved agent after each run"""
    extra_args: str = ""
    """more flags passed to every script, e.g. "--num-envs 16" """
    last_episodes: int = 100
    """the training score of a run is the mean return of its last this-many episodes"""
    smooth: int = 20
    """curves show the trailing mean over this many episodes"""
    report_only: bool = False
    """do not run anything: rebuild the table and plots from the runs already in benchmarks/runs/NAME/"""


def run_dir_of(args, script, seed):
    return os.path.join(ROOT, "benchmarks", "runs", args.name, os.path.splitext(os.path.basename(script))[0], f"seed{seed}")


def launch(args, script, seed):
    runs_dir = run_dir_of(args, script, seed)
    if os.path.exists(os.path.join(runs_dir, "wall_seconds.txt")):  # written only once a run has ended with exit 0
        print(f"{script} seed {seed}: finished earlier, skipped", flush=True)
        return
    cmd = [sys.executable, os.path.join(ROOT, script), "--seed", str(seed), "--total-timesteps", str(args.total_timesteps),
           "--runs-dir", runs_dir, "--save-model", "--eval-episodes", str(args.eval_episodes), *shlex.split(args.extra_args)]
    os.makedirs(runs_dir, exist_ok=True)
    start = time.time()
    with open(os.path.join(runs_dir, "stdout.txt"), "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    wall = time.time() - start
    print(f"{script} seed {seed}: exit {proc.returncode} in {wall:.1f} s", flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed; see {runs_dir}/stdout.txt")
    with open(os.path.join(runs_dir, "wall_seconds.txt"), "w") as f:
        f.write(f"{wall:.2f}\n")


def load_events(runs_dir):
    """The newest TensorBoard event file under <runs_dir>/<run_name>/, loaded with every scalar kept:
    `load_events(d).Scalars(tag)`. Also used by experiments/ to read tags beyond the returns."""
    event_files = sorted(glob.glob(os.path.join(runs_dir, "*", "events.out.tfevents.*")), key=os.path.getmtime)
    if not event_files:
        raise SystemExit(f"error: no TensorBoard events under {runs_dir}; run without --report-only first")
    acc = EventAccumulator(event_files[-1], size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def read_run(args, script, seed):
    runs_dir = run_dir_of(args, script, seed)
    acc = load_events(runs_dir)
    episodes = acc.Scalars("charts/episodic_return")
    steps = np.array([e.step for e in episodes], dtype=float)
    returns = np.array([e.value for e in episodes], dtype=float)
    wall_times = np.array([e.wall_time for e in episodes], dtype=float)
    first = min(e.wall_time for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)[:1])
    evals = [e.value for e in acc.Scalars("eval/episodic_return")] if "eval/episodic_return" in acc.Tags()["scalars"] else []
    wall_file = os.path.join(runs_dir, "wall_seconds.txt")
    wall = float(open(wall_file).read()) if os.path.exists(wall_file) else float("nan")
    last_step = acc.Scalars("charts/SPS")[-1].step
    train_seconds = acc.Scalars("charts/SPS")[-1].wall_time - first
    return {
        "seed": seed,
        "steps": steps.tolist(),
        "returns": returns.tolist(),
        "seconds": (wall_times - first).tolist(),
        "train_return": float(np.mean(returns[-args.last_episodes :])),
        "eval_return": float(np.mean(evals)) if evals else float("nan"),
        "env_steps": int(last_step),
        "train_seconds": float(train_seconds),
        "steps_per_second": float(last_step / train_seconds),
        "process_wall_seconds": wall,
    }


def trailing_mean(x, window):
    c = np.cumsum(np.insert(x, 0, 0.0))
    n = np.minimum(np.arange(1, len(x) + 1), window)
    return (c[1:] - c[np.arange(1, len(x) + 1) - n]) / n


def plot(args, results, key, xlabel, path):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for script, runs in results.items():
        end = min(max(r[key]) for r in runs)
        grid = np.linspace(0, end, 300)
        curves = np.array([np.interp(grid, r[key], trailing_mean(np.array(r["returns"]), args.smooth)) for r in runs])
        label = f"{os.path.splitext(os.path.basename(script))[0]} ({len(runs)} seeds)"
        (line,) = ax.plot(grid, curves.mean(0), label=label)
        ax.fill_between(grid, curves.min(0), curves.max(0), color=line.get_color(), alpha=0.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"episodic return (trailing mean of {args.smooth} episodes)")
    ax.set_title(f"{args.name}: mean and min-max over seeds")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fmt(values):
    values = np.asarray(values, dtype=float)
    return f"{np.mean(values):.2f} ± {np.std(values):.2f}"


def main(args: Args) -> None:
    for script in args.scripts:
        if not os.path.isfile(os.path.join(ROOT, script)):
            raise SystemExit(f"error: --scripts {script} does not exist (paths are relative to {ROOT})")
    if args.parallel < 1:
        raise SystemExit("error: --parallel must be at least 1")
    if not args.report_only:
        jobs = [(script, seed) for script in args.scripts for seed in args.seeds]
        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(lambda job: launch(args, *job), jobs))

    results = {script: [read_run(args, script, seed) for seed in args.seeds] for script in args.scripts}
    out = os.path.join(ROOT, "benchmarks", "results")
    os.makedirs(out, exist_ok=True)
    command = "python benchmarks/benchmark.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    lines = [
        f"# {args.name}",
        "",
        f"Command: `{command}`",
        "",
        f"{args.total_timesteps} env steps per run, seeds {args.seeds}, at most {args.parallel} runs at a time. "
        f"Training return: mean of the last {args.last_episodes} training episodes of a run. Evaluation return: "
        f"mean over {args.eval_episodes} episodes of the saved agent after training. Mean ± std over seeds; "
        "steps/s from the first to the last logged event, wall time of the whole process (median over seeds).",
        "",
        "| script | training return | evaluation return | training return per seed | wall s (median) | steps/s (median) |",
        "|---|---|---|---|---|---|",
    ]
    for script, runs in results.items():
        per_seed = ", ".join(f"{r['train_return']:.1f}" for r in runs)
        lines.append(
            f"| {script} | {fmt([r['train_return'] for r in runs])} | {fmt([r['eval_return'] for r in runs])} | "
            f"{per_seed} | {np.median([r['process_wall_seconds'] for r in runs]):.1f} | "
            f"{np.median([r['steps_per_second'] for r in runs]):.0f} |"
        )
    lines += ["", f"![learning curves]({args.name}.png)", "", f"![learning curves, wall clock]({args.name}_wallclock.png)", ""]
    with open(os.path.join(out, f"{args.name}.md"), "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(ROOT, "benchmarks", "runs", args.name, f"{args.name}.json"), "w") as f:
        json.dump({"command": command, "results": results}, f)
    plot(args, results, "steps", "environment steps", os.path.join(out, f"{args.name}.png"))
    plot(args, results, "seconds", "wall-clock seconds", os.path.join(out, f"{args.name}_wallclock.png"))
    print("\n".join(lines))


if __name__ == "__main__":
    main(tyro.cli(Args))
