"""The protocol of this project's comparisons of methods, one for every method and both harnesses
(rlhf_frontier.py, ppo_vs_grpo.py), and the intervals they report.

1. Three disjoint sets: the training prompts (problems), a validation set the tuning reads, a test set the tables
   report. The test set is read once per method, after its setting is chosen, and no run read it before the
   grids were fixed.
2. The search (`next_runs`), the same for every method. A grid stated in the harness before the first run: a
   learning-rate axis of at least 4 values about 2x apart, and the method's other named axes (`Axis`); one run a
   setting at TUNING_SEED, scored on the validation set. Then, while the rule's choice sits at the edge of an
   axis (no run beyond it along that axis, the other axes at the choice's values), the nearest value beyond it
   is run: a value another run of the axis has, else one step of the axis's factor, if the axis allows it; at
   most EXTRA_RUNS such runs a method, a cap fixed before the first run. A choice still at an edge is reported as
   such (`edges`). Last, the two best settings get a second seed (SECOND_SEED): the page says whether the mean
   of the two seeds would choose otherwise (`second_seed`); the rule's choice stays the first seed's.
3. One rule (`choose`): the highest validation score; among the settings within TIE of it, the cheapest (CPU
   minutes). A setting without a score (a run that never reached the point the score is read at) is chosen only
   if none has one: then the highest fallback (its last point's) wins.
4. The chosen setting runs again with fresh test seeds, on the test set; more seeds where an interval straddles
   0 and the runs fit.

Intervals: a method's mean over seeds with a 95% t-interval; the difference of two methods with a 95% Welch one.
"""

import itertools
import math
from dataclasses import dataclass

import numpy as np

TUNING_SEED = 100
SECOND_SEED = 101  # the top two settings' second tuning seed
EXTRA_RUNS = 6  # the cap: runs a method's search may add beyond its first grid
TEST_SEEDS = (4, 5, 6)
MIN_RUNS = 8
TIE = 0.01  # in the score's units: 0.01 gold (frontier), one point of accuracy (sums)

# t(0.975, dof), two-sided 95%; between the table's degrees of freedom, interpolated
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 30: 2.042}


def grid(flags, **axes) -> dict[str, str]:
    """Every combination of the axes' values, in order: {"name value name value": flags(**values)}."""
    settings = {}
    for values in itertools.product(*axes.values()):
        named = dict(zip(axes, values))
        settings[" ".join(f"{k} {v}" for k, v in named.items())] = flags(**named)
    return settings


def choose(scores: dict, costs: dict, fallback: dict | None = None, tie: float = TIE) -> str:
    """The setting the rule picks: scores {setting: validation score or None}, costs {setting: CPU minutes or
    None}, fallback {setting: a score for runs without one}. Ties, and settings without a cost, rank in
    the order given (the grid's)."""
    scored = {s: v for s, v in scores.items() if v is not None}
    if not scored:
        if not fallback:
            raise ValueError("no setting has a score or a fallback")
        return max(fallback, key=lambda s: fallback[s])
    best = max(scored.values())
    within = [s for s, v in scored.items() if v >= best - tie - 1e-12]
    return min(within, key=lambda s: (costs.get(s) is None, costs.get(s) or 0.0))


def mean_interval(values) -> tuple[float, float, float]:
    """Mean over the seeds and the half-width of its 95% t-interval (0 for one seed), and the std."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float(values.mean()), 0.0, float(values.std())
    std = float(values.std(ddof=1))
    t = np.interp(len(values) - 1, list(T_975), list(T_975.values()))
    return float(values.mean()), float(t * std / len(values) ** 0.5), std


def difference_interval(a, b) -> tuple[float, float]:
    """mean(a) - mean(b) and the half-width of its 95% Welch interval (seeds of two methods)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if va + vb == 0:
        return float(a.mean() - b.mean()), 0.0
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    t = np.interp(dof, list(T_975), list(T_975.values()))
    return float(a.mean() - b.mean()), float(t * (va + vb) ** 0.5)


# ----------------------------------------------------------------------------------------------- the search


@dataclass(frozen=True)
class Axis:
    """One named axis of a method's grid: its first values (as the command line writes them, ascending), the
    factor a step beyond an edge multiplies or divides by, and the range a value must stay in."""
    values: tuple
    factor: float = 2.0
    low: float = 0.0
    high: float = math.inf


def setting_name(setting: dict) -> str:
    return " ".join(f"{axis} {value}" for axis, value in setting.items())


def parse_setting(name: str, axes: dict) -> dict:
    """setting_name's inverse, checked against the axes' names and order."""
    words = name.split(" ")
    setting = dict(zip(words[::2], words[1::2]))
    if list(setting) != list(axes) or len(words) != 2 * len(axes):
        raise ValueError(f"{name!r} is not a setting of the axes {list(axes)}")
    return setting


def first_grid(axes: dict) -> list[str]:
    """Every combination of the axes' first values, in order."""
    return [setting_name(dict(zip(axes, values))) for values in itertools.product(*(a.values for a in axes.values()))]


def in_grid_order(axes: dict, results: dict) -> dict:
    """results {setting: ...} with the first grid's settings first, in its order, then the others as given: the
    order in which `choose` breaks a tie between settings of equal cost."""
    grid = first_grid(axes)
    return {**{name: results[name] for name in grid if name in results},
            **{name: value for name, value in results.items() if name not in grid}}


def step_beyond(axis: Axis, value: str, direction: int) -> str | None:
    """One factor beyond value (direction +1 up, -1 down), written as the grid writes numbers; None outside the
    axis's range."""
    x = float(value) * axis.factor**direction
    if not axis.low <= x <= axis.high:
        return None
    if x >= 1 and abs(x - round(x)) < 1e-9:
        return str(int(round(x)))
    if x >= 0.01:
        return f"{x:.3g}"
    mantissa, exponent = f"{x:.2e}".split("e")  # 1.6e-4, not 0.00016
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def beyond(axes: dict, ran: list[str], chosen: str) -> dict:
    """{(axis, direction): the setting to run} for each side of each axis where the chosen setting is at the
    edge: no run setting, the other axes at the chosen's values, lies beyond it. The setting moves that axis to
    the nearest value beyond that any setting run has on it, else one factor beyond; None where the axis allows
    no value beyond."""
    runs, c = [parse_setting(n, axes) for n in ran], parse_setting(chosen, axes)
    out = {}
    for axis, spec in axes.items():
        line = [float(s[axis]) for s in runs if all(s[a] == c[a] for a in axes if a != axis)]
        known = {float(v): v for v in [*spec.values, *(s[axis] for s in runs)]}
        x = float(c[axis])
        for direction in (-1, 1):
            if any((v - x) * direction > 0 for v in line):
                continue
            further = [v for v in known if (v - x) * direction > 0]
            value = known[min(further, key=lambda v: abs(v - x))] if further else step_beyond(spec, c[axis], direction)
            out[(axis, direction)] = None if value is None else setting_name({**c, axis: value})
    return out


def first_choice(first: dict) -> str:
    """The rule's choice over the first tuning seed's runs, {setting: (score, CPU minutes)}: the one setting a
    harness's report marks and its test runs take."""
    return choose({k: v[0] for k, v in first.items()}, {k: v[1] for k, v in first.items()})


def next_runs(axes: dict, first: dict, second: dict, cap: int = EXTRA_RUNS) -> list[tuple[str, int]]:
    """The runs a method's search needs next, as (setting, seed): first {setting: (score, CPU minutes)} of the
    runs at TUNING_SEED, second {setting: score} at SECOND_SEED. The first grid; then, while the choice sits at
    an edge and fewer than `cap` settings beyond the grid have run, the settings `beyond` it (as many as the cap
    leaves, in the axes' order); then the top two settings at SECOND_SEED. [] when the search is done."""
    grid = first_grid(axes)
    missing = [(name, TUNING_SEED) for name in grid if name not in first]
    if missing:
        return missing
    left = cap - len([name for name in first if name not in grid])
    chosen = first_choice(first)
    wanted = [name for name in beyond(axes, list(first), chosen).values() if name is not None]
    wanted = [name for name in dict.fromkeys(wanted) if name not in first]
    if left > 0 and wanted:
        return [(name, TUNING_SEED) for name in wanted[:left]]
    return [(name, SECOND_SEED) for name in top_two(first) if name not in second]


def choice_runs_left(axes: dict, first: dict, second: dict) -> list[tuple[str, int]]:
    """The runs next_runs asks at the first seed: the runs that can still move the choice (a second seed's cannot)."""
    return [run for run in next_runs(axes, first, second) if run[1] == TUNING_SEED]


def runs_left_text(left: list) -> str:
    return f"{len(left)} run{'s' * (len(left) > 1)} left"


def searched_choices(axes: dict, results, methods, command: str) -> dict[str, str]:
    """{method: the rule's choice over its search's first seed} for methods, once each one's runs at that seed are
    done (the one choice a harness's page marks and its test runs take; the second seed's runs, left or not, do
    not move it): axes {method: axes}, results(method) gives (first, second) as next_runs reads them; a clear error
    naming `command` while a method has runs left at the first seed."""
    chosen = {}
    for method in methods:
        first, second = results(method)
        left = choice_runs_left(axes[method], first, second)
        if left:
            raise SystemExit(f"error: --searched: {method}'s search has {runs_left_text(left)}; run `{command}` first")
        chosen[method] = first_choice(first)
    return chosen


def top_two(first: dict) -> list[str]:
    """The rule's choice and the choice among the rest: first {setting: (score, CPU minutes)}."""
    scores, costs = {k: v[0] for k, v in first.items()}, {k: v[1] for k, v in first.items()}
    chosen = first_choice(first)
    rest = {k: v for k, v in scores.items() if k != chosen}
    return [chosen, choose(rest, costs)] if rest and any(v is not None for v in rest.values()) else [chosen]


def edges(axes: dict, first: dict, cap: int = EXTRA_RUNS) -> dict:
    """Where the rule's choice sits on each axis: {axis: "inside"} or the edges, each "lowest"/"highest" with why
    the search did not go beyond: "none allowed" (the axis's range), "cap reached", or "not run yet"."""
    chosen = first_choice(first)
    grid = first_grid(axes)
    why = "cap reached" if len([name for name in first if name not in grid]) >= cap else "not run yet"
    out = {}
    for (axis, direction), name in beyond(axes, list(first), chosen).items():
        side = "lowest" if direction < 0 else "highest"
        out.setdefault(axis, []).append(f"{side} ({'none allowed' if name is None else why})")
    return {axis: ", ".join(out.get(axis, [])) or "inside" for axis in axes}


def second_seed(first: dict, second: dict) -> dict:
    """The top two settings' scores at both tuning seeds: {setting: (first, second, mean)}, and whether the mean
    of the two seeds would choose another setting than the rule's (first seed) choice ("flips"); by_mean None until
    both have run at the second seed."""
    top = top_two(first)
    rows = {name: (first[name][0], second[name], (first[name][0] + second[name]) / 2) for name in top if name in second}
    by_mean = choose({k: v[2] for k, v in rows.items()}, {k: first[k][1] for k in rows}) if len(rows) == 2 else None
    return {"rows": rows, "chosen": top[0], "by_mean": by_mean, "flips": by_mean is not None and by_mean != top[0]}


def search(methods: dict, results, run, cap: int = EXTRA_RUNS) -> None:
    """Every method's search to its end, in rounds: the runs next_runs asks of every method, handed to run as
    [(method, setting, seed)]; results(method) gives (first, second) as next_runs reads them. A round that asks
    the same runs as the one before (runs that failed) stops with an error."""
    asked = None
    while True:
        todo = [(method, name, seed) for method, axes in methods.items()
                for name, seed in next_runs(axes, *results(method), cap)]
        if not todo:
            return
        if todo == asked:
            raise SystemExit(f"error: these runs did not record a result: {todo}")
        run(todo)
        asked = todo


def rule_text(score: str, cost: str, tie: str) -> str:
    """The search and the rule in one paragraph, as both pages state them before their results."""
    return (f"Each method's first grid, stated before its first run, one run a setting at seed {TUNING_SEED}; then, "
            "while the rule's choice sits at an edge of an axis, the nearest value beyond that edge (a value another "
            f"run has, else one step of the axis), at most {EXTRA_RUNS} runs beyond the grid a method. The rule: the "
            f"highest {score}; among the settings within {tie} of it, the cheapest ({cost}). The top two settings run "
            f"again at seed {SECOND_SEED}; the choice stays the first seed's, and the page says whether the mean of "
            "both seeds would choose otherwise.")


def search_report(label: str, axes: dict, first: dict, second: dict, cpu_minutes: float, score: str, cost: str,
                  fmt, reused=(), cap: int = EXTRA_RUNS) -> list[str]:
    """A method's search on a page: one paragraph (its runs at each seed, in the grid and beyond it, their CPU
    minutes, the choice, where it sits on each axis, the second seed's verdict, the runs left) and a table of its
    settings, the grid's first. first and second as next_runs reads them; fmt formats a score (None: no score);
    reused: the settings whose run is an earlier run with the same flags; cpu_minutes: all the method's runs. A
    setting not run at the second seed: "-"."""
    grid = first_grid(axes)
    chosen, check, left = first_choice(first), second_seed(first, second), next_runs(axes, first, second, cap)
    where = "; ".join(f"{axis} {edge}" for axis, edge in edges(axes, first, cap).items())
    beyond_grid = [name for name in first if name not in grid]
    flip = "" if check["by_mean"] is None else f" The mean of seeds {TUNING_SEED} and {SECOND_SEED} would choose " + (
        f"`{check['by_mean']}` instead: the choice flips." if check["flips"] else "the same setting.")
    lines = [f"**{label}**: {len(first)} settings at seed {TUNING_SEED} ({len(first) - len(beyond_grid)} of the "
             f"first grid's {len(grid)}, {len(beyond_grid)} beyond it), {len(second)} at seed {SECOND_SEED}; "
             f"{cpu_minutes:.1f} CPU minutes in all. Chosen: `{chosen}`; on its axes: {where}."
             + (f" Not finished: {runs_left_text(left)}." if left else "") + flip, "",
             f"| setting | {score}, seed {TUNING_SEED} | seed {SECOND_SEED} | {cost} | |", "|---|---|---|---|---|"]
    for name in [*[n for n in grid if n in first], *beyond_grid]:
        cost_cell = "n/a" if first[name][1] is None else f"{first[name][1]:.1f}"
        lines.append(f"| {name}{' (earlier)' * (name in reused)}{' (beyond the grid)' * (name not in grid)} | "
                     f"{fmt(first[name][0])} | {fmt(second[name]) if name in second else '-'} | {cost_cell} | "
                     f"{'chosen' * (name == chosen)} |")
    return lines + [""]
