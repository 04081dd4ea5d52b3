"""What the experiments that run scripts as subprocesses share: the command lines, the runs and their records.

A run is one script in a subprocess (one torch thread), so that its peak resident memory and CPU seconds are its
own (os.wait4); runs go side by side, `jobs` at a time, so that their wall-clock times compare. Each finished run
appends one record (method, seed, command, run folder, peak memory, wall-clock and CPU seconds, commit, date) to
<runs>/records.jsonl; a (method, seed) recorded there already is not run again, so a stopped harness resumes.
"""

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parents[1]


def flag_dict(command: str) -> dict:
    """A command line's script and flags, {flag: value} (the last of a repeated flag; True for a switch), without
    the ones that name a run (--seed, --runs-dir, --exp-name)."""
    words = shlex.split(command)
    script = next(w for w in words if w.endswith(".py"))
    words = words[words.index(script) + 1 :]
    out = {"script": script}
    for i, word in enumerate(words):
        if word.startswith("--"):
            out[word] = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
    for key in ("--seed", "--runs-dir", "--exp-name"):
        out.pop(key, None)
    return out


def merge_flags(common: list[str], flags: list[str]) -> list[str]:
    """The common flags with a setting's: a flag both give takes the setting's value in the common one's place."""
    merged = {}
    for words in (common, flags):
        for i, word in enumerate(words):
            if word.startswith("--"):
                merged[word] = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
    return [w for flag, value in merged.items() for w in ([flag] if value is None else [flag, value])]


def command_of(method: str, seed: int, runs: str, common: str, methods: dict) -> list[str]:
    """The exact command line of one run (a list for subprocess)."""
    script, *flags = shlex.split(methods[method])
    return ["python", script, *merge_flags(shlex.split(common), flags), "--seed", str(seed), "--runs-dir", runs,
            "--exp-name", exp_name(method)]


def exp_name(method: str) -> str:
    """A folder-safe name of a method or tuning run."""
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in method)


def recorded(records_file: Path) -> list[dict]:
    """The records of a runs folder. A run folder recorded on another machine (or moved) is read from beside
    the records file, where a committed copy of the runs keeps it."""
    if not records_file.exists():
        return []
    records = [json.loads(line) for line in records_file.read_text().splitlines() if line.strip()]
    for record in records:
        beside = records_file.parent / Path(record["run_dir"]).name
        if not Path(record["run_dir"]).is_absolute():  # relative to the repository root
            record["run_dir"] = str(ROOT / record["run_dir"])
        elif not Path(record["run_dir"]).exists() and beside.exists():
            record["run_dir"] = str(beside)
    return records


def run_all(methods: list[str], seeds: list[int], runs: Path, jobs: int, common: str, flags: dict) -> None:
    """Runs every (method, seed) not yet in <runs>/records.jsonl, `jobs` at a time, in the order seed by seed
    (so that each method's runs meet the others' side by side); one record per finished run."""
    run_items([(m, s) for s in seeds for m in methods], runs, jobs, common, flags)


def run_items(items: list[tuple[str, int]], runs: Path, jobs: int, common: str, flags: dict) -> None:
    """Runs each (method, seed) of items not yet in <runs>/records.jsonl, in order, `jobs` at a time; one record
    per finished run. A file <runs>/STOP starts no more runs: the running ones finish and are recorded, then the
    harness exits (status 0) saying how many runs are left."""
    records_file = runs / "records.jsonl"
    done = {(r["method"], r["seed"]) for r in recorded(records_file)}
    queue = [(m, s) for m, s in items if (m, s) not in done]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    running = {}
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    while queue or running:
        if (runs / "STOP").exists() and not running:
            print(f"stopped by {runs / 'STOP'}: {len(queue)} runs left (remove it to go on)", flush=True)
            raise SystemExit(0)
        while queue and len(running) < jobs and not (runs / "STOP").exists():
            method, seed = queue.pop(0)
            command = command_of(method, seed, os.path.relpath(runs, ROOT), common, flags)
            command[0] = sys.executable
            log = open(runs / f"{exp_name(method)}__{seed}.log", "w")
            before = set(runs.glob(f"{exp_name(method)}__{seed}__*"))  # an earlier try's folders are not this run's
            process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
            running[process.pid] = (method, seed, command, time.time(), log, process, before)
            print(f"started {method} seed {seed}: {shlex.join(command[1:])}", flush=True)
        time.sleep(0.2)
        for pid in list(running):  # each run reaped by its own pid, with its resource usage
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                record_run(records_file, runs, *running.pop(pid), os.waitstatus_to_exitcode(status), usage, commit)


def record_run(records_file: Path, runs: Path, method: str, seed: int, command: list[str], start: float, log,
               process, before: set, exit_code: int, usage, commit: str) -> None:
    """One finished run's record appended to records_file; none (a line saying so) if it failed or left no new
    run folder (before: the folders of earlier tries)."""
    log.close()
    process.returncode = exit_code  # reaped here: its Popen must not wait for it again
    wall = time.time() - start
    run_dirs = sorted(set(runs.glob(f"{exp_name(method)}__{seed}__*")) - before)
    if exit_code != 0 or not run_dirs:
        print(f"{method} seed {seed} failed (exit {exit_code}" + ", no new run folder" * (not run_dirs) +
              f"): see {runs}/{exp_name(method)}__{seed}.log", flush=True)
        return
    run_dir = run_dirs[-1]
    record = {"method": method, "seed": seed, "command": "python " + shlex.join(command[1:]),
              "run_dir": os.path.relpath(run_dir, ROOT) if run_dir.is_relative_to(ROOT) else str(run_dir),
              "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9, "wall_s": wall,
              # CPU seconds of the whole run (loading and evaluations included): unlike wall-clock seconds,
              # hardly changed by other processes on the machine
              "cpu_s": usage.ru_utime + usage.ru_stime,
              "commit": commit, "date": time.strftime("%Y-%m-%d")}
    with open(records_file, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"finished {method} seed {seed} in {wall / 60:.1f} min, peak {record['peak_rss_gb']:.2f} GB", flush=True)


def read_scalars(run_dir: str) -> dict:
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def last_mean(scalars: dict, tag: str, last: int) -> float:
    """The mean of a tag over the last `last` iterations, nan values (no right answer in a batch) left out."""
    values = np.array([value for _, value in scalars.get(tag, [])][-last:], dtype=float)
    return float(np.nanmean(values)) if len(values) and not np.isnan(values).all() else float("nan")
