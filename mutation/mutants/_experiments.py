"""Breakages of the experiments/ scripts that tests/test_experiments.py must catch, in mutation_check.py's
format, and the command that runs them (mutation_check.py itself takes only the top-level scripts: it copies
the top-level files, tests/ and docs/, and names a script by its stem; the leading "_" keeps this file out of
its lists).

    python mutation/mutants/_experiments.py [--mutants TEXT] [--jobs N] [--list]

runs mutation_check.py's own loop over the mutants below, in copies of the repository that also hold
experiments/*.py and benchmarks/*.py (what the experiments import), not experiments/runs/ or benchmarks/runs/.
Each entry is (name, text found exactly once in the script, its replacement, pytest -k selector): the selector
leaves out the tests of experiments/rlhf_overoptimization.py and of benchmarks/preference_baselines.py, which
these scripts do not reach."""

import shutil
import sys
from pathlib import Path

TEST_FILE = "tests/test_experiments.py"
TEST_FILES = {"experiments/rlhf_frontier": "tests/test_rlhf_frontier.py",
              "experiments/rlhf_frontier_measure": "tests/test_rlhf_frontier.py",
              "experiments/rlhf_frontier_report": "tests/test_rlhf_frontier.py",
              "experiments/protocol": "tests/test_protocol.py",
              "benchmarks/walker_speed": "tests/test_walker_speed.py",
              "benchmarks/validation_choice": "tests/test_benchmark.py"}  # scripts with a test file of their own
SELECTOR = "not overopt and not preference"

MUTANTS_BY_SCRIPT = {
    # the protocol's statistics and its search, written before their tests by hand
    # what an evaluation reads: the frontier's KL, written before its test by hand (both survived every test)
    "experiments/rlhf_frontier_measure": [
        ("the frontier's KL of log pi_ref - log pi",
         "kl += (logps[0] - logps[1]).tolist()", "kl += (logps[1] - logps[0]).tolist()", "kl or measure"),
        ("the frontier's KL at temperature 1, not the sampling temperature",
         "mask, args.temperature, tokenizer.pad_token_id)[0]", "mask, 1.0, tokenizer.pad_token_id)[0]",
         "kl or measure"),
        # the unit of a statistic (survived every test of tests/test_rlhf_frontier.py)
        ("a point's standard error over samples, not prompts",
         "float(means.std(ddof=1) / math.sqrt(len(means)))", "float(values.std(ddof=1) / math.sqrt(values.size))",
         "over_prompts"),
    ],
    "experiments/rlhf_frontier_report": [
        # the page's search section, written before its test by hand
        ("the fresh prompts' table counts the choice's runs on the earlier test prompts",
         'and r.get("split", "test")\n                 == split and r["seed"]', 'and r["seed"]', "search"),
        ("the search's all-in cost without its tuning runs",
         "all_in[m] = tuning_minutes + (rm_minutes", "all_in[m] = 0.0 + (rm_minutes", "search or tuned"),
    ],
    "experiments/rlhf_frontier": [
        # the search's choice and cost as `run --searched` reads them (each a breakage of the newest code)
        ("the frontier's search: a tie broken by the run's CPU minutes, not those to KL 3",
         'first[r["setting"]] = (gold_at_kl(r["points"], STOP_KL), cpu_at_kl(r, STOP_KL))',
         'first[r["setting"]] = (gold_at_kl(r["points"], STOP_KL), r["cpu_minutes"])', "search"),
        ("`prompts`: a tuning record without its split counted as read on the test prompts",
         'record.get("split", "validation" if tuning else "test")', 'record.get("split", "test")', "prompts_lists"),
        ("`prompts`: the prompts compared as written, a trailing space hides an overlap",
         'both = {p.strip() for p in fresh} & {p.strip() for p in prompts}', 'both = set(fresh) & set(prompts)',
         "prompts_lists"),
    ],
    # the runner of the subprocess harnesses, written before its test by hand
    "experiments/runner": [
        ("runner: a run that exits with an error is recorded", "if exit_code != 0 or not run_dirs:",
         "if not run_dirs:", "runner"),
        ("runner: recorded runs run again", "queue = [(m, s) for m, s in items if (m, s) not in done]",
         "queue = list(items)", "runner"),
        ("runner: the common flags' values win over the setting's", "for words in (common, flags):",
         "for words in (flags, common):", "runner or search"),
    ],
    # issue 41: values checked where they can be wrong, written before their tests
    "experiments/clip_objective": [
        ("issue41: every epoch's zero-gradient fraction against the first epoch's (shuffled) advantages",
         "adv = np.concatenate([a for _, a in calls[start : start + num_minibatches]])",
         "adv = np.concatenate([a for _, a in calls[:num_minibatches]])",
         SELECTOR),
    ],
    "experiments/epsilon_ablation": [
        ("issue41: the spread of approx_kl over seeds written as a variance beside its '±' (a std is meant)",
         "{np.mean(kl):.4f} ± {np.std(kl):.4f}",
         "{np.mean(kl):.4f} ± {np.var(kl):.4f}",
         SELECTOR),
        ("issue41: the mean curves run to the longest run's last step, holding the shorter runs' last value",
         "end = min(max(r[x_key]) for r in runs)",
         "end = max(max(r[x_key]) for r in runs)",
         SELECTOR),
    ],
    "experiments/rlhf_kl_vs_collapse": [
        ("issue41: the reference NLL reported in nats in the bits-per-character column",
         '"ref_bits_per_char": (-ref_logprobs[mask].mean() / np.log(2)).item(),',
         '"ref_bits_per_char": (-ref_logprobs[mask].mean()).item(),',
         SELECTOR),
        ("issue41: the table's 'last 5 iterations' is the fifth-last iteration alone",
         "last = {tag: [run[tag][-5:].mean() for run in runs] for tag in",
         "last = {tag: [run[tag][-5].mean() for run in runs] for tag in",
         SELECTOR),
        # issue 48: written before their tests (docs/testing.md has the table)
        ("issue48: the table's entropy column filled from the scores",
         "f\"{mean_std(last['losses/entropy'])} | {mean_std([x['reward'] for x in f])} | \"",
         "f\"{mean_std(last['objective/scores'])} | {mean_std([x['reward'] for x in f])} | \"",
         SELECTOR),
        ("issue48: the entropy panel plots the scores",
         '("losses/entropy", "policy entropy (nats per token)")',
         '("objective/scores", "policy entropy (nats per token)")',
         SELECTOR),
    ],
    # issue 41, the experiments of issues 39 and 40
    "experiments/ppo_vs_grpo": [
        ("issue41: the training seconds of an evaluation counted one iteration late",
         "elapsed = np.cumsum([0.0] + [seconds[step] for step in sorted(seconds)])",
         "elapsed = np.cumsum([0.0, 0.0] + [seconds[step] for step in sorted(seconds)])",
         "ppo_vs_grpo"),
        ("a run stuck at all wrong for one iteration at its end counted as stuck",
         "return start if start is not None and scores[-1][0] > start else None",
         "return start if start is not None else None", "ppo_vs_grpo"),
        ("a streak of all-wrong batches not broken by a batch with a right answer",
         "start = (step if start is None else start) if value <= -1 + 1e-6 else None",
         "start = (step if start is None else start) if value <= -1 + 1e-6 else start", "ppo_vs_grpo"),
        ("a + b and b + a counted as two problems",
         'return {frozenset(map(int, re.findall(r"\\d+", p))) for p in prompts}',
         'return {tuple(map(int, re.findall(r"\\d+", p))) for p in prompts}', "ppo_vs_grpo or sums_page or problems"),
        ("the equal-CPU budget rounded up to whole batches, not down",
         "int(ppo / per_completion // batch_size * batch_size)",
         "int(-(-ppo / per_completion // batch_size) * batch_size)", "ppo_vs_grpo"),
        ("`run --searched --methods` runs every method's choice, not the ones asked",
         "[m for m in args.methods if m in SEARCH])", "None)", "ppo_vs_grpo"),
    ],
    # the page of the sums (ppo_vs_grpo_report.py, tested in tests/test_experiments.py)
    "experiments/ppo_vs_grpo_report": [
        # the page's several runs folders and its problems (each a breakage of the newest code)
        ("an earlier sitting's tuned runs compared with today's tuned PPO",
         'return earlier + ("tuned_ppo"', 'return ("tuned_ppo"', "ppo_vs_grpo or sums_page"),
        ("every equal-cost run beside the first PPO of the page",
         "for method, seeds in [(m, v) for m, v in equal.items() if ppo_key(m) == base]:",
         "for method, seeds in [(m, v) for m, v in equal.items()]:", "ppo_vs_grpo or sums_page"),
        ("the test split's problems counted from the held-out split",
         'validation=split == "validation", test=split == "test")', 'validation=split == "validation", test=False)',
         "ppo_vs_grpo or sums_page"),
        ("a collapse read against the first evaluation after training, not the initial policy's",
         'below = [r for r in seeds if r["accuracy"][-1] < r["accuracy"][0]]',
         'below = [r for r in seeds if r["accuracy"][-1] < r["accuracy"][1]]', "ppo_vs_grpo"),
    ],
    # the intervals both harnesses report, moved to the protocol's module
    "experiments/protocol": [
        ("protocol: the t quantile of n degrees of freedom, not n - 1",
         "t = np.interp(len(values) - 1, list(T_975), list(T_975.values()))",
         "t = np.interp(len(values), list(T_975), list(T_975.values()))", "test"),
        ("protocol: Welch's degrees of freedom without the - 1",
         "dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))",
         "dof = (va + vb) ** 2 / (va**2 / len(a) + vb**2 / len(b))", "test"),
        ("protocol: a tie goes to the dearer setting",
         "return min(within, key=lambda s: (costs.get(s) is None, costs.get(s) or 0.0))",
         "return max(within, key=lambda s: (costs.get(s) is None, costs.get(s) or 0.0))", "test"),
        ("protocol: an axis counted inside when a run lies beyond it on any other line",
         "line = [float(s[axis]) for s in runs if all(s[a] == c[a] for a in axes if a != axis)]",
         "line = [float(s[axis]) for s in runs]", "test"),
        ("protocol: the extensions not counted against the cap",
         "left = cap - len([name for name in first if name not in grid])", "left = cap", "test"),
        ("protocol: a value beyond the edge computed by the factor even where a run has a nearer one",
         "value = known[min(further, key=lambda v: abs(v - x))] if further else step_beyond(spec, c[axis], direction)",
         "value = step_beyond(spec, c[axis], direction)", "test"),
        ("protocol: the axis's range not checked",
         "    if not axis.low <= x <= axis.high:\n        return None\n", "", "test"),
        ("protocol: the page marks the grid's first setting as the choice",
         "f\"{'chosen' * (name == chosen)} |\")", "f\"{'chosen' * (name == grid[0])} |\")", "test"),
        ("protocol: the page counts the grid's settings as beyond it",
         "beyond_grid = [name for name in first if name not in grid]", "beyond_grid = list(first)", "test"),
        ("protocol: `run --searched` takes the highest score, not the rule's choice (ties to the cheaper)",
         "        chosen[method] = first_choice(first)\n    return chosen",
         "        chosen[method] = max(first, key=lambda s: first[s][0] or 0.0)\n    return chosen", "test"),
        ("protocol: `run --searched` runs a method whose search has runs left",
         "        if left:\n            raise SystemExit(f\"error: --searched:",
         "        if False:\n            raise SystemExit(f\"error: --searched:", "test"),
        ("protocol: the second seed's verdict from the second seed alone",
         "rows = {name: (first[name][0], second[name], (first[name][0] + second[name]) / 2) for name in pair}",
         "rows = {name: (first[name][0], second[name], second[name]) for name in pair}", "test"),
        ("issue41: the Welch interval from the seeds' standard deviations where variances are meant",
         "va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)",
         "va, vb = a.std(ddof=1) / len(a), b.std(ddof=1) / len(b)",
         "test"),
    ],
    # the loop's bounds against the physics (benchmarks/walker_speed.py)
    "benchmarks/walker_speed": [
        ("walker_speed: the bounds read each run's seconds, not over its own MuJoCo time",
         "return {name: per_mujoco / (seconds / loop[ENV_PARTS[0]]) for name, seconds in [",
         "return {name: per_mujoco / seconds for name, seconds in [", "bounds"),
        ("walker_speed: the loop less its update leaves the rest of the update in",
         'update = sum(loop[name] for name in UPDATE) + loop["rest of the update"]',
         "update = sum(loop[name] for name in UPDATE)", "bounds"),
    ],
    # the validation rule for a change of Walker's defaults (benchmarks/validation_choice.py)
    "benchmarks/validation_choice": [
        ("validation_choice: a candidate adopted when its mean is above the defaults', the interval not read",
         "diffs = {name: (d, h, d - h > 0) for name, (d, h) in diffs.items()}",
         "diffs = {name: (d, h, d > 0) for name, (d, h) in diffs.items()}", "validation"),
        ("validation_choice: the lowest of the candidates above 0 adopted",
         "return (max(above, key=lambda n: np.mean(candidates[n]))",
         "return (min(above, key=lambda n: np.mean(candidates[n]))", "validation"),
        ("validation_choice: the per-seed returns read from the first row, whatever its script",
         "elif header and cells[0] == script:", "elif header and cells[0].endswith('.py'):", "validation"),
    ],
    "experiments/rlhf_overoptimization_report": [  # its report subcommand, where these breakages are
        ("issue41: the bootstrap draws a fixed half of the prompts (not a resample with replacement)",
         "values = [statistic(rng.integers(0, num_prompts, num_prompts)) for _ in range(resamples)]",
         "values = [statistic(rng.permutation(num_prompts)[: max(1, num_prompts // 2)]) for _ in range(resamples)]",
         "overopt"),
        # issue 48: written before their tests (docs/testing.md has the table)
        ("issue48: PPO's points at d = KL, not sqrt(KL)",
         '"d": math.sqrt(max(it["kl"], 0.0))',
         '"d": max(it["kl"], 0.0)',
         "overopt"),
        ("issue48: best-of-n's points plotted at the KL, not d",
         'd = [p["d"] for p in c["points"]]\n        ax_proxy.plot',
         'd = [p["kl"] for p in c["points"]]\n        ax_proxy.plot',
         "overopt"),
        ("issue48: every fitted line drawn in the RL form",
         "ax_gold.plot(grid, gold_form(grid, *fit, form)",
         'ax_gold.plot(grid, gold_form(grid, *fit, "rl")',
         "overopt"),
        ("issue48: PPO's gold curve fitted with the best-of-n form",
         'fit_gold(d, g, "rl"), d, g, r["command"]))',
         'fit_gold(d, g, "bon"), d, g, r["command"]))',
         "overopt"),
    ],
}
MUTANTS = [entry for entries in MUTANTS_BY_SCRIPT.values() for entry in entries]


def main() -> int:
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "mutation"))
    import mutation_check

    copy_top_level = mutation_check.copy_repository

    def copy_repository(dest: Path) -> None:
        copy_top_level(dest)
        for folder in ("experiments", "benchmarks"):  # their code only: no runs or results
            (dest / folder).mkdir()
            for path in (root / folder).glob("*.py"):
                shutil.copy2(path, dest / folder / path.name)
        (dest / "benchmarks" / "results").mkdir()  # the benchmark tables (text) that validation_choice reads
        for path in (root / "benchmarks" / "results").glob("*.md"):
            shutil.copy2(path, dest / "benchmarks" / "results" / path.name)

    def load_mutants(scripts):
        chosen = scripts or list(MUTANTS_BY_SCRIPT)
        unknown = sorted(set(chosen) - set(MUTANTS_BY_SCRIPT))
        if unknown:
            sys.exit(f"error: no mutants of {unknown}; there are {sorted(MUTANTS_BY_SCRIPT)}")
        return [mutation_check.Mutant(script, TEST_FILES.get(script, TEST_FILE), *entry) for script in chosen
                for entry in MUTANTS_BY_SCRIPT[script]]

    mutation_check.copy_repository, mutation_check.load_mutants = copy_repository, load_mutants
    return mutation_check.main()


if __name__ == "__main__":
    sys.exit(main())
