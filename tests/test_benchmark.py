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


def test_validation_choice_reads_the_per_seed_column_of_a_real_benchmark_table():
    choice = load_benchmark("validation_choice")
    values = choice.per_seed(str(ROOT / "benchmarks" / "results"), "walker2d_val_defaults", "ppo_walker2d.py")
    lines = (ROOT / "benchmarks" / "results" / "walker2d_val_defaults.md").read_text().splitlines()
    row = next(line for line in lines if line.startswith("| ppo_walker2d.py"))
    mean = float(row.split("|")[2].split("±")[0])  # the table's own mean, from the unrounded returns
    assert len(values) == 10 and abs(sum(values) / 10 - mean) < 0.05


def test_validation_choice_adopts_only_a_candidate_whose_welch_interval_is_above_zero(tmp_path):
    choice = load_benchmark("validation_choice")
    header = next(line for line in (ROOT / "benchmarks" / "results" / "walker2d_val_defaults.md").read_text()
                  .splitlines() if "training return per seed" in line)

    def table(name, values):
        rows = (f"| other.py | 0 | 0 | 9, 9 | 1 | 1 |\n"
                f"| ppo_walker2d.py | x | x | {', '.join(map(str, values))} | 1 | 1 |")
        (tmp_path / f"{name}.md").write_text(f"# {name}\n\n{header}\n|---|---|---|---|---|---|\n{rows}\n")
    base = [1.0, 2.0, 3.0, 4.0, 5.0]  # each mean's variance 0.5: Welch's standard error 1, 8 dof, t = 2.306
    table("defaults", base)
    table("plus2", [v + 2.0 for v in base])  # 2 - 2.306 < 0: stays out
    table("plus2_5", [v + 2.5 for v in base])  # 2.5 - 2.306 > 0
    table("plus3", [v + 3.0 for v in base])
    def run(*names):
        return choice.main(choice.Args(defaults="defaults", candidates=list(names), results=str(tmp_path)))
    out = run("plus2")
    assert "| plus2 | 5.00 ± 1.41 | +2.00 ± 2.31 | no |" in out and "adopted: none; the defaults stay" in out
    assert run("plus2", "plus2_5").endswith("adopted: plus2_5")
    assert run("plus3", "plus2", "plus2_5").endswith("adopted: plus3")  # the highest mean of those above 0
    with pytest.raises(SystemExit, match="missing.md not found"):
        run("missing")
    with pytest.raises(SystemExit, match="--candidates is empty"):
        run()
