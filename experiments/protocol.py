"""The protocol of this project's comparisons of methods, one for every method and both harnesses
(rlhf_frontier.py, ppo_vs_grpo.py), and the intervals they report.

1. Three disjoint sets: the training prompts (problems), a validation set the tuning reads, a test set the tables
   report. The test set is read once per method, after its setting is chosen.
2. The same budget for every method: a grid of at least MIN_RUNS settings, stated in the harness before the
   first run, one run each at TUNING_SEED, scored on the validation set.
3. One rule, fixed before the first run (`choose`): the highest validation score; among the settings within TIE
   of it, the cheapest (CPU minutes) is chosen. A setting without a score (a run that never reached the point
   the score is read at) is chosen only if none has one: then the highest fallback (its last point's) wins.
4. The chosen setting runs again with TEST_SEEDS, fresh seeds, on the test set; more seeds where an interval
   straddles 0 and the runs fit.

Intervals: a method's mean over seeds with a 95% t-interval; the difference of two methods with a 95% Welch one.
"""

import itertools

import numpy as np

TUNING_SEED = 100
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
