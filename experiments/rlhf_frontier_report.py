"""The reward-KL frontier's page, from the records rlhf_frontier.py's runs wrote.

    python experiments/rlhf_frontier_report.py [--runs RUNS] [--out docs/results/rlhf_frontier]

writes <out>.md and <out>.png: the search (protocol.search_report: each method's runs, choice, edges and second
seed) and its choices on the fresh test prompts, the tuning's, the frontier's table (each method and setting's
gold at KL 1, 2, 3 and 6: the mean over seeds and a 95% t-interval; best-of-n over prompts), the differences (DPO
minus each other method, 95% Welch), bf16 against fp32 where both ran, each run's command, the figure. What is above
a line `<!-- generated -->` in the page is kept.
"""

import glob
import itertools
import os
import re
import sys
from dataclasses import dataclass

import numpy as np
import tyro

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402  (the search's report, the t- and Welch intervals)
import rlhf_frontier as harness  # noqa: E402  (the grids and the records' readers)
from rlhf_frontier import FRESH_SEEDS, KL_TARGETS, STOP_KL  # noqa: E402
import shared  # noqa: E402  (the prompt sets)
from protocol import difference_interval, mean_interval  # noqa: E402
from rlhf_frontier_measure import BEST_OF_N, ROOT, at_kl, cpu_at_kl, gold_at_kl, read_json  # noqa: E402


@dataclass
class Report:
    runs: str = "experiments/runs/rlhf_frontier"
    """the records read"""
    out: str = "docs/results/rlhf_frontier"
    """prefix of the written .md and .png"""


def row_key(record: dict) -> tuple[str, str]:
    """A record's row: its method and setting, the fresh test prompts' runs rows of their own."""
    return record["method"], record["setting"] + " (fresh)" * (record.get("split") == "fresh")


def frontier_rows(records: list[dict]) -> list[dict]:
    """One row per method and setting: the gold at each KL target over its seeds, and its CPU minutes."""
    rows = {}
    for r in records:
        rows.setdefault(row_key(r), []).append(r)
    out = []
    for (method, setting), runs in rows.items():
        row = {"method": method, "setting": setting, "seeds": sorted(r["seed"] for r in runs),
               "cpu_minutes": float(np.mean([r["cpu_minutes"] for r in runs])), "command": runs[0].get("command")}
        cpu = [cpu_at_kl(r, 3.0) for r in runs]  # and its CPU minutes to KL 3, "estimated" if any run's is
        row["cpu_at_3"] = None if None in cpu else (float(np.mean(cpu)), any("cpu_minutes" not in r["points"][-1]
                                                                             for r in runs))
        for target in KL_TARGETS:
            if method == BEST_OF_N:  # one curve, an interval over prompts
                points = runs[0]["points"]
                value = gold_at_kl([{"kl": 0.0, "gold": points[0]["gold"]}] + points, target)
                se = min(points, key=lambda p: abs(p["kl"] - target))["gold_se"]
                row[target] = (value, 1.96 * se, 1) if value is not None else None
                continue
            values = [gold_at_kl(r["points"], target) for r in runs]
            reached = [v for v in values if v is not None]
            row[target] = (*(mean_interval(reached)[:2] if len(reached) == len(values) else (None, None)), len(reached))
        out.append(row)
    return out


def seed_list(runs: list[dict]) -> str:
    """The runs' seeds, as the tables list them."""
    return ", ".join(str(r["seed"]) for r in runs)


def gold_cells(runs: list[dict], kl: float) -> tuple[list[float], str, str] | None:
    """The runs' golds at kl, their mean with its 95% t-interval and the mean per-point SE, as table cells; None if
    a run does not reach kl."""
    golds = [gold_at_kl(r["points"], kl) for r in runs]
    if not runs or None in golds:
        return None
    mean, half, _ = mean_interval(golds)
    gold = f"{mean:.3f} ± {half:.3f}" if len(golds) > 1 else f"{mean:.3f} (one seed, no interval)"
    return golds, gold, f"{np.mean([float(at_kl(r['points'], kl, 'gold_se')) for r in runs]):.3f}"


def test_lines(chosen: dict, records: list[dict], tuning: dict, rm_minutes: float | None, split: str) -> list[str]:
    """Each method's chosen setting at its test seeds (records of `split`): gold at KL 3 over seeds, CPU minutes
    to it, the tuning's runs and CPU minutes (tuning {method: (runs text, minutes)}) and all in (the tuning, the
    reward model the RL methods need, one run to KL 3); then the differences between methods. Where a method's
    seeds do not all reach KL 3: every method's gold at the next KL below it, and the differences there."""
    lines = ["| method | chosen setting | test seeds | gold at KL 3 | per-point SE | CPU minutes to KL 3 | "
             "tuning: runs, CPU minutes | all in |", "|---" * 8 + "|"]
    tested, all_in, seeds_of = {}, {}, {}
    for m, (runs_text, tuning_minutes) in tuning.items():
        if m not in chosen:
            missing = "(search not finished)" if split == "fresh" else "(tuning runs missing)"
            lines.append(f"| {m} | {missing} | - | - | - | - | {runs_text}, {tuning_minutes:.1f} | - |")
            continue
        seeds = sorted((r for r in records if (r["method"], r["setting"]) == (m, chosen[m]) and r.get("split", "test")
                        == split and r["seed"] not in (protocol.TUNING_SEED, protocol.SECOND_SEED)),
                       key=lambda r: r["seed"])
        seeds_of[m] = seeds
        cells = gold_cells(seeds, 3.0)
        if cells is None:
            listed = f"{seed_list(seeds)}: not all reach KL 3" if seeds else "none yet"
            lines.append(f"| {m} | {chosen[m]} | {listed} | - | - | - | {runs_text}, {tuning_minutes:.1f} | - |")
            continue
        tested[m], gold, se = cells
        cpu = [cpu_at_kl(r, 3.0) for r in seeds]
        needs_rm = m != "dpo"
        if None not in cpu and (rm_minutes is not None or not needs_rm):
            all_in[m] = tuning_minutes + (rm_minutes if needs_rm else 0.0) + np.mean(cpu)
        lines.append(f"| {m} | {chosen[m]} | {seed_list(seeds)} | {gold} | {se} | " +
                     ("-" if None in cpu else f"{np.mean(cpu):.1f}") + f" | {runs_text}, {tuning_minutes:.1f} | " +
                     (f"{all_in[m]:.1f}" if m in all_in else "-") + " |")
    lines += difference_lines(tested, 3.0)
    short = {m: s for m, s in seeds_of.items() if s and m not in tested}
    if short:  # the comparison fixed for this case: every method at the table's next KL below 3
        kl = max(k for k in KL_TARGETS if k < 3.0)
        lines += ["", " ".join(f"{m}'s test seeds do not all reach KL 3 (their last points at KL " +
                               ", ".join(f"{r['points'][-1]['kl']:.2f}" for r in s) + ")." for m, s in short.items())
                  + f" Every method at KL {kl:g} instead (mean over seeds, 95% t-interval):", "",
                  f"| method | test seeds | gold at KL {kl:g} | per-point SE |", "|---" * 4 + "|"]
        at = {}
        for m, s in seeds_of.items():
            cells = gold_cells(s, kl)
            if cells is None:
                listed = f"{seed_list(s)}: not all reach KL {kl:g}" if s else "none yet"
                lines.append(f"| {m} | {listed} | - | - |")
                continue
            at[m], gold, se = cells
            lines.append(f"| {m} | {seed_list(s)} | {gold} | {se} |")
        lines += difference_lines(at, kl)
    if "dpo" in all_in and "ppo" in all_in:
        lines += ["", f"All in, DPO's CPU minutes are {all_in['dpo'] / all_in['ppo']:.1%} of PPO's (the goal: at most "
                  "a quarter, with DPO's gold at KL 3 at least PPO's)."]
    return lines


def difference_lines(golds: dict, kl: float) -> list[str]:
    """Each pair of methods with two or more seeds ({method: golds at kl over its seeds}): the first's gold minus
    the second's, with its 95% Welch interval over seeds."""
    golds = {m: g for m, g in golds.items() if len(g) > 1}  # an interval needs two seeds
    if len(golds) < 2:
        return []
    lines = ["", f"Differences at KL {kl:g} on the test prompts, 95% Welch intervals over seeds:", ""]
    for a, b in itertools.combinations(golds, 2):
        d, h = difference_interval(golds[a], golds[b])
        lines.append(f"- {a} minus {b}: {d:+.3f} ± {h:.3f}" + ("" if abs(d) > h else " (inconclusive)"))
    return lines


def tuned_lines(tuning_runs: str, records: list[dict], rm_minutes: float | None = None) -> list[str]:
    """The page's part on the tuning: each method's chosen setting on the test prompts (its test seeds), the
    differences between them, what a user pays to reach KL 3 (the tuning runs, the reward model the RL methods
    need, one run), and each grid's validation runs."""
    tables = {m: harness.tuning_table(tuning_runs, m) for m in harness.TUNING}  # each grid's recorded runs, read once
    methods = [m for m in harness.TUNING if tables[m]]
    if not methods:
        return []
    chosen = harness.tuned_settings(tuning_runs, [m for m in methods if len(tables[m]) == len(harness.TUNING[m])])
    initial = read_json(os.path.join(tuning_runs, "initial.json"))
    lines = ["## After equal tuning", "",
             f"Each method's grid of {protocol.MIN_RUNS} settings (`TUNING`, stated before the first run), each run "
             f"once (seed {protocol.TUNING_SEED}) on {len(shared.VALIDATION_PROMPTS)} validation prompts (the initial "
             f"policy's gold there {initial['gold']:.3f} ± {initial['gold_se']:.3f}) and stopped at its first point "
             f"at KL >= {STOP_KL:g}; chosen: the highest validation gold at KL {STOP_KL:g}, the cheapest "
             f"(CPU minutes to it) within {protocol.TIE} of it, a run that never reaches KL {STOP_KL:g} only if none "
             "does (experiments/protocol.py); then its test seeds on the held-out prompts. Gold at KL 3: mean over "
             "seeds, 95% t-interval; per point: the mean standard error over prompts of one run's point. All in: "
             "the tuning runs' CPU minutes, the reward model's (PPO, GRPO), and one run's to KL 3.", ""]
    tuning = {m: (f"{len(tables[m])}/{len(harness.TUNING[m])}", sum(r["cpu_minutes"] for r in tables[m]))
              for m in methods}
    lines += test_lines(chosen, records, tuning, rm_minutes, "test")
    for m in methods:
        lines += ["", f"{m}'s tuning runs (validation prompts):", "",
                  f"| setting | gold at KL {STOP_KL:g} | CPU minutes to it | CPU minutes of the run | last point: KL, "
                  "gold | chosen |", "|---" * 6 + "|"]
        for r in tables[m]:
            gold = "not reached" if r["gold"] is None else f"{r['gold']:.3f}"
            cpu = "-" if r["cpu_at"] is None else f"{r['cpu_at']:.1f}"
            lines.append(f"| {r['setting']} | {gold} | {cpu} | {r['cpu_minutes']:.1f} | {r['last']['kl']:.2f}, "
                         f"{r['last']['gold']:.3f} | {'yes' if chosen.get(m) == r['setting'] else ''} |")
    return lines + [""]


def searched_lines(tuning_runs: str, records: list[dict], rm_minutes: float | None = None) -> list[str]:
    """The page's part on the search (rlhf_frontier.SEARCH): the rule, each method's search
    (protocol.search_report: its runs, choice, edges, second seed), then each choice at FRESH_SEEDS on the fresh
    test prompts (test_lines)."""
    runs = {m: [read_json(p) for p in sorted(glob.glob(os.path.join(tuning_runs, m, "*.json")))]
            for m in harness.SEARCH}
    if not any(r["setting"] not in harness.TUNING.get(m, ()) for m in harness.SEARCH for r in runs[m]):
        return []  # the search has not begun beyond the earlier grids
    results = {m: harness.search_results(tuning_runs, m) for m in harness.SEARCH}
    lines = ["## The search, then the fresh test prompts", "",
             protocol.rule_text(f"validation gold at KL {STOP_KL:g}", f"CPU minutes to KL {STOP_KL:g}",
                                f"{protocol.TIE} gold") +
             f" Each run on the {len(shared.VALIDATION_PROMPTS)} validation prompts, stopped at its first point at "
             f"KL >= {STOP_KL:g}; a setting that never reaches it is chosen only if none does. Runs marked (earlier) "
             "ran before the search's grids were written (the grids of `TUNING`). The choices then run at seeds "
             f"{', '.join(map(str, FRESH_SEEDS))}, two seeds more where a difference's interval straddles 0, on "
             f"{len(shared.FRESH_TEST_PROMPTS)} test prompts written before the search and read by no run before "
             "(`--split fresh`).", ""]
    tuning, chosen = {}, {}
    for m, (first, second) in results.items():
        if not first:
            continue
        minutes = sum(r["cpu_minutes"] for r in runs[m])
        lines += protocol.search_report(m, harness.SEARCH[m], first, second, minutes,
                                        f"validation gold at KL {STOP_KL:g}", f"CPU minutes to KL {STOP_KL:g}",
                                        lambda v: "not reached" if v is None else f"{v:.3f}",
                                        set(harness.TUNING.get(m, ())))
        tuning[m] = (f"{len(runs[m])}", minutes)
        if not protocol.choice_runs_left(harness.SEARCH[m], first, second):
            chosen[m] = protocol.first_choice(first)
    return lines + ["The choices on the fresh test prompts (gold at KL 3: mean over seeds, 95% t-interval):", "",
                    *test_lines(chosen, records, tuning, rm_minutes, "fresh"), ""]


def report(args: Report) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = os.path.join(ROOT, args.runs)
    records = sorted((read_json(p) for p in glob.glob(os.path.join(runs, "*", "*.json"))
                      if os.path.basename(os.path.dirname(p)) in [*harness.METHODS, BEST_OF_N]),
                     key=lambda r: (r["method"], r["setting"], r.get("split") == "fresh", r["seed"]))
    initial = read_json(os.path.join(runs, "initial.json"))
    rm_record = read_json(os.path.join(runs, "reward_model.json")) if os.path.exists(
        os.path.join(runs, "reward_model.json")) else None
    rm_minutes = rm_record and rm_record["cpu_minutes"]
    lines = searched_lines(os.path.join(runs, "tuning"), records, rm_minutes) + tuned_lines(
        os.path.join(runs, "tuning"), records, rm_minutes) + [
        "## The frontier", "",
             f"Initial policy: gold {initial['gold']:.3f} ± {initial['gold_se']:.3f} (standard error over "
             f"{len(initial['gold_per_prompt'])} held-out prompts). Gold at each KL: the mean over seeds and its "
             "95% t-interval (best-of-n: over prompts); \"m/n\": only m of the n seeds reached that KL. CPU: "
             "minutes of training per run, one thread, the evaluation excluded; to KL 3: read along the run as the "
             "gold is, \"≈\" where a run's record has no time at each point (its minutes times the share of its "
             "iterations done).", "",
             "| method | setting | seeds | " + " | ".join(f"gold at KL {t:g}" for t in KL_TARGETS) +
             " | last point: KL, gold | CPU minutes | CPU minutes to KL 3 |", "|---" * (6 + len(KL_TARGETS)) + "|"]
    for row in frontier_rows(records):
        cells = []
        for target in KL_TARGETS:
            v, n = row[target], len(row["seeds"])
            cells.append("not reached" if v is None or v[2] == 0 else f"{v[2]}/{n} reached" if v[0] is None
                         else f"{v[0]:.3f}" + (f" ± {v[1]:.3f}" if v[2] > 1 else ""))
        last = [r["points"][-1] for r in records if row_key(r) == (row["method"], row["setting"])]
        seeds = ", ".join(map(str, row["seeds"])) if row["method"] != BEST_OF_N else "-"
        lines.append(f"| {row['method']} | {row['setting']} | {seeds} | " + " | ".join(cells) +
                     f" | {np.mean([p['kl'] for p in last]):.2f}, {np.mean([p['gold'] for p in last]):.3f} | "
                     f"{row['cpu_minutes']:.1f} | " + ("-" if row["cpu_at_3"] is None else "≈" *
                                                        row["cpu_at_3"][1] + f"{row['cpu_at_3'][0]:.1f}") + " |")
    if rm_record:  # its held-out passes timed apart where the record has them
        passes = rm_record.get("eval_cpu_minutes")
        lines += ["", f"The reward model (ppo, grpo, best_of_n): held-out accuracy "
                  f"{rm_record['held_out_accuracy']:.3f}, {rm_record['cpu_minutes']:.1f} CPU minutes to train"
                  + ("" if passes is None else f", its held-out passes left out ({passes:.1f} more)") +
                  f": `{rm_record['command'].replace(rm_record['preferences'], 'vader_2000.jsonl')}`."]
    lines += ["", "Each run's command (seed 1; `reward_model/model`: the folder the reward-model step saved; each run "
              "also gets the experiment's `--runs-dir`):", ""]
    for (method, setting), r in {row_key(r): r for r in records if "command" in r}.items():
        command = r["command"].replace(f" --seed {r['seed']}", " --seed 1")
        # the paths of the machine a run ran on, as the page names them
        command = re.sub(r"--reward-model \S*/reward_model_gpt2__\d+__\d+/model", "--reward-model reward_model/model",
                         command)
        if rm_record:
            command = command.replace(rm_record["preferences"], os.path.basename(rm_record["preferences"]))
        lines.append(f"- {method}, {setting}: `{command}`")
    rows = {(r["method"], r["setting"]): r for r in frontier_rows(records) if len(r["seeds"]) > 1}
    lines += ["", "Over seeds, where two settings on the same prompts each have two or more seeds and all of them "
              "reach the KL: DPO's gold minus theirs, the mean over seeds and its 95% Welch interval:", ""]
    bf16_lines = []  # each setting run with --bf16 against the same setting in fp32
    for (a, b), target in itertools.product(itertools.permutations(rows, 2), KL_TARGETS):
        ga, gb = ([gold_at_kl(r["points"], target) for r in records if row_key(r) == key] for key in (a, b))
        same_precision = a[1].endswith(" bf16") == b[1].endswith(" bf16")
        same_prompts = a[1].endswith(" (fresh)") == b[1].endswith(" (fresh)")
        if a[0] == "dpo" != b[0] and same_precision and same_prompts and None not in ga + gb:
            lines.append("- {} {} minus {} {}, at KL {:g}: {:+.3f} ± {:.3f}".format(
                *a, *b, target, *difference_interval(ga, gb)))
        if a == (b[0], b[1] + " bf16") and None not in ga + gb:
            bf16_lines.append("- {} {}, at KL {:g}: {:+.3f} ± {:.3f}".format(
                *b, target, *difference_interval(ga, gb)))
    if bf16_lines:
        lines += ["", "bf16 against fp32, where a setting has two or more seeds in each that reach the KL: the gold "
                  "of its --bf16 runs minus that of its fp32 runs, the mean over seeds and its 95% Welch interval:",
                  "", *bf16_lines]
    colors = {"dpo": "C0", "ppo": "C1", "grpo": "C2", "ppo_gold": "C3", BEST_OF_N: "C4"}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in records:
        kl = [0.0] * (r["method"] == BEST_OF_N) + [p["kl"] for p in r["points"]]
        gold = [initial["gold"]] * (r["method"] == BEST_OF_N) + [p["gold"] for p in r["points"]]
        ax.plot(kl, gold, "o-", color=colors[r["method"]], alpha=0.6, ms=3, lw=1,
                label=f"{r['method']}" if r is next(x for x in records if x["method"] == r["method"]) else None)
    ax.set(xlabel="KL(policy || initial policy), nats per response", ylabel="gold (vader) on held-out prompts")
    ax.legend()
    fig.savefig(os.path.join(ROOT, args.out + ".png"), dpi=100, bbox_inches="tight")
    text = "\n".join(lines) + f"\n\n![gold against KL]({os.path.basename(args.out)}.png)\n"
    md = os.path.join(ROOT, args.out + ".md")
    old = open(md).read() if os.path.exists(md) else ""
    head = old.split("<!-- generated -->", 1)[0] if "<!-- generated -->" in old else "# The reward-KL frontier\n\n"
    with open(md, "w") as f:
        f.write(head + "<!-- generated -->\n" + text)
    return text


if __name__ == "__main__":
    print(report(tyro.cli(Report)))
