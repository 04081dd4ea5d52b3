"""Tests of benchmarks/benchmark.py's resume: a seed whose run ended with exit 0 is not run again, a seed whose run
did not end (its marker missing) or failed runs again, and the table reads every seed back. Real runs of
ppo_cartpole.py, a few hundred steps each, in a copy of the repository's root under a temp dir."""

import shutil
from pathlib import Path

import pytest

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def runs_of(root, seed):
    """The run folders (one per process that ran) under a seed's folder."""
    return sorted(p.name for p in (root / "benchmarks" / "runs" / "tiny" / "ppo_cartpole" / f"seed{seed}").iterdir()
                  if p.is_dir())


def test_a_stopped_benchmark_resumes_running_only_the_seeds_that_did_not_finish(tmp_path, monkeypatch, capsys):
    bench = load_benchmark("benchmark")
    shutil.copy(ROOT / "ppo_cartpole.py", tmp_path / "ppo_cartpole.py")
    monkeypatch.setattr(bench, "ROOT", str(tmp_path))
    args = bench.Args(scripts=["ppo_cartpole.py"], seeds=[1, 2], total_timesteps=512, name="tiny", parallel=1,
                      eval_episodes=1, smooth=2, extra_args="--num-envs 2 --num-steps 64")
    bench.main(args)
    first = {seed: runs_of(tmp_path, seed) for seed in (1, 2)}
    assert all(len(first[seed]) == 1 for seed in (1, 2))
    seed2 = tmp_path / "benchmarks" / "runs" / "tiny" / "ppo_cartpole" / "seed2"
    (seed2 / "wall_seconds.txt").unlink()  # as a run stopped before its end leaves it
    capsys.readouterr()

    bench.main(args)
    out = capsys.readouterr().out
    assert "seed 1: finished earlier, skipped" in out and "seed 2: exit 0" in out
    assert runs_of(tmp_path, 1) == first[1]  # not run again
    assert len(runs_of(tmp_path, 2)) == 2 and (seed2 / "wall_seconds.txt").exists()
    table = (tmp_path / "benchmarks" / "results" / "tiny.md").read_text()
    assert "[1, 2]" in table

    # a run that fails leaves no marker, so the next call runs it again rather than reading it as finished
    failing = bench.Args(**{**vars(args), "seeds": [3], "extra_args": "--no-such-flag"})
    with pytest.raises(SystemExit, match="failed"):
        bench.main(failing)
    assert not (tmp_path / "benchmarks" / "runs" / "tiny" / "ppo_cartpole" / "seed3" / "wall_seconds.txt").exists()
