"""rlhf_overoptimization.py's `report` subcommand: the page <out>.md and its figure <out>.png from the records of
its `best-of-n` and `ppo` subcommands (what they show: that file's docstring). Also command_of and
repeated_word_share, which the records use too.
"""

import dataclasses
import json
import math
import os
import re
import shlex
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from shared import best_of_n, best_of_n_kl  # the expected best-of-n and its KL bound

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATED_MARK, READING_MARK = "<!-- generated -->", "<!-- reading -->"  # hand-written text above and below
TITLE = "# Reward over-optimization: a learned proxy against the gold scorer"
SCRIPT = "python experiments/rlhf_overoptimization.py"
OUT = "docs/results/rlhf_overoptimization"


@dataclass
class Report:
    out: str = OUT  # prefix of the read .best_of_n.json and .ppo.json and of the written .md and .png
    ppo_json: list[str] = field(default_factory=list)
    """the PPO results to read (default: <out>.ppo.json), e.g. several files from runs made elsewhere"""
    num_disagreements: int = 4  # samples shown per run where proxy and gold disagree most


def command_of(subcommand: str, args) -> str:
    """The command line that gives these Args (the fields that differ from their defaults)."""
    parts = [SCRIPT, subcommand]
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if value == (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, list):
            parts += [flag] + [shlex.quote(f"{v:g}" if isinstance(v, float) else str(v)) for v in value]
        elif str(value).startswith("-"):  # --ppo-flags="--model-name ...": a value that looks like a flag
            parts.append(f"{flag}={shlex.quote(str(value))}")
        else:
            parts += [flag, shlex.quote(str(value))]
    return " ".join(parts)


def repeated_word_share(text: str) -> float:
    """The share of a text's words that repeat an earlier word of it (lower case, punctuation stripped)."""
    words = re.findall(r"[a-z0-9']+", text.lower())
    return 1 - len(set(words)) / len(words) if words else 0.0


def bootstrap_interval(statistic, num_prompts: int, resamples: int = 4000, seed: int = 0) -> tuple:
    """95% percentile interval of statistic(prompt indices) over `resamples` resamplings of the prompts with
    replacement (the unit that varies: a prompt's N responses stay together)."""
    rng = np.random.default_rng(seed)
    values = [statistic(rng.integers(0, num_prompts, num_prompts)) for _ in range(resamples)]
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def beta_term(d: np.ndarray, form: str) -> np.ndarray:
    """What beta multiplies, negated, in Gao et al.'s forms: RL d log d (0 at d = 0), best-of-n d^2."""
    return np.where(d > 0, d * np.log(np.where(d > 0, d, 1.0)), 0.0) if form == "rl" else d**2


def fit_gold(d, gold, form: str) -> tuple[float, float] | None:
    """alpha, beta of Gao et al.'s form by least squares: RL d (alpha - beta log d), best-of-n d (alpha - beta d).
    None when fewer than two points have d > 0."""
    d, gold = np.asarray(d, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if np.sum(d > 0) < 2:
        return None
    (alpha, beta), *_ = np.linalg.lstsq(np.stack([d, -beta_term(d, form)], 1), gold, rcond=None)
    return float(alpha), float(beta)


def gold_form(d, alpha: float, beta: float, form: str) -> np.ndarray:
    d = np.asarray(d, dtype=np.float64)
    return alpha * d - beta * beta_term(d, form)


def gold_peak(alpha: float, beta: float, form: str) -> float | None:
    """The d >= 0 where the fitted gold curve peaks: RL exp(alpha / beta - 1), best-of-n alpha / (2 beta) (0 if
    that is below 0: the curve falls from the start); None if it never turns down (beta <= 0)."""
    if beta <= 0:
        return None
    return math.exp(alpha / beta - 1) if form == "rl" else max(0.0, alpha / (2 * beta))


def best_of_n_curves(bon: dict) -> list[dict]:
    """Per proxy: for n = 1, 2, 4, ... up to N / 4, the bound on KL, d, and the change of proxy and gold from
    n = 1 (the initial policy's mean), gold also in units of the initial policy's gold std, each with its 95%
    interval over prompts; the gold at the n where its mean peaks minus the gold at the largest n (with its
    interval: a fall, if it excludes 0); the proxy's correlation with gold over all responses (with its interval)."""
    gold, num_prompts = np.array(bon["gold"]), len(bon["gold"])
    ns, gold_std = [2**k for k in range(int(math.log2(max(bon["n"] // 4, 1))) + 1)], float(gold.std())
    curves = []
    for proxy in bon["proxies"]:
        p = np.array(proxy["scores"])
        per_prompt = {n: best_of_n(p, gold, n) for n in ns}  # per n: (proxy, gold) of each prompt's best
        points = []
        for n in ns:
            proxy_change, gold_change = (per_prompt[n][k] - per_prompt[1][k] for k in (0, 1))
            points.append({
                "n": n, "kl": float(best_of_n_kl(n)), "d": math.sqrt(float(best_of_n_kl(n))),
                "proxy_change": float(proxy_change.mean()), "gold_change": float(gold_change.mean()),
                "proxy_change_ci": bootstrap_interval(lambda i: proxy_change[i].mean(), num_prompts),
                "gold_change_ci": bootstrap_interval(lambda i: gold_change[i].mean(), num_prompts),
                "gold_change_std": float(gold_change.mean()) / gold_std if gold_std > 0 else None})
        peak = max(points, key=lambda pt: pt["gold_change"])
        fall = per_prompt[peak["n"]][1] - per_prompt[ns[-1]][1]
        curves.append({"name": proxy["name"], "points": points, "gold_std": gold_std,
                       "proxy_std": float(p.std()), "peak_n": peak["n"], "fall": float(fall.mean()),
                       "fall_ci": bootstrap_interval(lambda i: fall[i].mean(), num_prompts),
                       "correlation": float(np.corrcoef(p.ravel(), gold.ravel())[0, 1]),
                       "correlation_ci": bootstrap_interval(
                           lambda i: np.corrcoef(p[i].ravel(), gold[i].ravel())[0, 1], num_prompts)})
    return curves


def ppo_curve(run: dict) -> list[dict]:
    initial = run["initial"]
    return [{"iteration": it["iteration"], "kl": it["kl"], "d": math.sqrt(max(it["kl"], 0.0)),
             "proxy_change": it["proxy"] - initial["proxy"], "gold_change": it["gold"] - initial["gold"],
             "gold_change_std": (it["gold"] - initial["gold"]) / initial["gold_std"] if initial["gold_std"] > 0
             else None, **{k: it[k] for k in ("length", "stop_share", "repeated_words")}} for it in run["iterations"]]


def disagreements(responses, proxy, gold, k: int) -> list[tuple]:
    """The k samples with the highest proxy rank and the lowest gold rank: sorted by rank(proxy) - rank(gold)
    (ranks as shares of the pool, 0 lowest), then by proxy."""
    proxy, gold = np.asarray(proxy, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    def rank(x):
        return np.argsort(np.argsort(x, kind="stable"), kind="stable") / max(len(x) - 1, 1)

    gap = rank(proxy) - rank(gold)
    order = sorted(range(len(proxy)), key=lambda i: (-gap[i], -proxy[i]))[:k]
    return [(responses[i], float(proxy[i]), float(gold[i])) for i in order]


def fmt(x, digits=3, sign="") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:{sign}.{digits}f}"


def plot(path: str, bon_curves: list[dict], runs: list[dict], curves: list[list[dict]], fits: list[tuple]) -> None:
    """Proxy and gold change against d = sqrt(KL), the fitted gold forms drawn over the gold."""
    names = list(dict.fromkeys([c["name"] for c in bon_curves] + [r["proxy_name"] for r in runs]))
    colors = {name: f"C{i}" for i, name in enumerate(names)}
    fig, (ax_proxy, ax_gold) = plt.subplots(1, 2, figsize=(13, 5))
    styles, kl_coefs = ["o", "s", "^", "v", "D", "x"], sorted({r["kl_coef"] for r in runs})
    for c in bon_curves:
        d = [p["d"] for p in c["points"]]
        ax_proxy.plot(d, [p["proxy_change"] for p in c["points"]], "--*", color=colors[c["name"]], ms=8,
                      label=f"best-of-n, {c['name']}")
        ax_gold.plot(d, [p["gold_change"] for p in c["points"]], "*", color=colors[c["name"]], ms=8,
                     label=f"best-of-n, {c['name']}")
    for r, curve in zip(runs, curves):
        style = dict(color=colors[r["proxy_name"]], ms=3, alpha=0.6, label=f"PPO kl_coef {r['kl_coef']:g}, "
                     f"{r['proxy_name']}")
        marker, d = styles[kl_coefs.index(r["kl_coef"]) % len(styles)], [p["d"] for p in curve]
        ax_proxy.plot(d, [p["proxy_change"] for p in curve], marker, **style)
        ax_gold.plot(d, [p["gold_change"] for p in curve], marker, **style)
    for _, name, form, fit, d, _, _ in fits:
        if fit is not None and max(d) > 0:
            grid = np.linspace(0, max(d) * 1.05, 200)
            ax_gold.plot(grid, gold_form(grid, *fit, form), "-" if form == "rl" else ":", color=colors[name],
                         lw=1.2)
    ax_proxy.set_ylabel("proxy score change (proxy std on the initial responses = 1)")
    ax_gold.set_ylabel("gold (vader compound) change")
    gold_std = bon_curves[0]["gold_std"] if bon_curves else (runs[0]["initial"]["gold_std"] if runs else 0)
    if gold_std > 0:
        secondary = ax_gold.secondary_yaxis("right", functions=(lambda y: y / gold_std, lambda y: y * gold_std))
        secondary.set_ylabel(f"gold change in initial gold std ({gold_std:.3f})")
    for ax in (ax_proxy, ax_gold):
        ax.set_xlabel("d = sqrt(KL to the initial policy, nats)")
        ax.axhline(0, color="k", lw=0.5)
        ax.grid(alpha=0.3)
    ax_proxy.legend(fontsize=7)
    ax_proxy.set_title("proxy (the reward model optimized)")
    ax_gold.set_title("gold (vader): points measured; lines fitted (solid PPO, dotted best-of-n)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_report(args: Report) -> str:
    out = os.path.join(ROOT, args.out)
    bon_path = out + ".best_of_n.json"
    bon = json.load(open(bon_path)) if os.path.exists(bon_path) else None
    runs = []
    for path in args.ppo_json or [out + ".ppo.json"]:
        if os.path.exists(path):
            runs += json.load(open(path))
        elif args.ppo_json:
            raise SystemExit(f"error: --ppo-json {path}: no such file")
    if bon is None and not runs:
        raise SystemExit(f"error: neither {bon_path} nor {out}.ppo.json exists: run best-of-n or ppo first")
    bon_curves, curves = best_of_n_curves(bon) if bon else [], [ppo_curve(r) for r in runs]
    # each command once, numbered: the tables name theirs by number, listed below each table
    all_commands = ([bon["command"]] if bon else []) + [r["command"] for r in runs]
    numbered = {c: f"[{i + 1}]" for i, c in enumerate(dict.fromkeys(all_commands))}

    def commands_of(used) -> list[str]:
        return ["", "Commands: " + "; ".join(f"{numbered[c]} `{c}`" for c in dict.fromkeys(used)) + "."]

    fits = []  # (label, proxy name, form, (alpha, beta) or None, d, gold change, command)
    for c in bon_curves:
        d, g = [p["d"] for p in c["points"]], [p["gold_change"] for p in c["points"]]
        fits.append((f"best-of-n, {c['name']}", c["name"], "bon", fit_gold(d, g, "bon"), d, g, bon["command"]))
    for r, curve in zip(runs, curves):
        d, g = [p["d"] for p in curve], [p["gold_change"] for p in curve]
        fits.append((f"PPO kl_coef {r['kl_coef']:g}, {r['proxy_name']}", r["proxy_name"], "rl",
                     fit_gold(d, g, "rl"), d, g, r["command"]))
    plot(out + ".png", bon_curves, runs, curves, fits)

    report_command = command_of("report", args)
    lines = [
        "Gold: vader's compound sentiment of prompt + response (in [-1, 1]), standing in for the people whose "
        "comparisons a reward model learns from. Proxies: reward models trained on gold-labeled comparisons of the "
        "initial policy, their scores normalized to std 1 on the initial policy's responses. Scores are changes "
        "from the initial policy's mean: the proxy in its normalized units, gold in vader compound units and in "
        "units of the initial policy's gold std. d = sqrt(KL to the initial policy) in sqrt(nats): for best-of-n, "
        "the upper bound log n - (n - 1) / n (Gao et al.'s value); for PPO, the logged per-response estimate "
        "`objective/kl` of each PPO batch (negative estimates count as 0).", "",
        f"Page and figure: `{report_command}`.", "", f"![proxy and gold against d]({os.path.basename(out)}.png)", "",
        "## Fits of Gao et al.'s forms to the gold curves", "",
        "RL: gold(d) = d (alpha - beta log d), peak at d* = exp(alpha / beta - 1); best-of-n: gold(d) = d (alpha - "
        "beta d), peak at d* = alpha / (2 beta); least squares on the gold changes (vader units). No peak: beta <= "
        "0, the fitted curve never turns down.", "",
        "| curve | alpha | beta | peak d* | KL at the peak (nats) | largest d measured | rms residual | points "
        "| command |", "|---|---|---|---|---|---|---|---|---|"]
    for label, name, form, fit, d, g, command in fits:
        if fit is None:
            lines.append(f"| {label} | - | - | too few points | | {fmt(max(d))} | | {len(d)} | {numbered[command]} |")
            continue
        peak, rms = gold_peak(*fit, form), float(np.sqrt(np.mean((gold_form(d, *fit, form) - np.array(g)) ** 2)))
        lines.append(f"| {label} | {fit[0]:.4f} | {fit[1]:.4f} | {fmt(peak) if peak is not None else 'no peak'} | "
                     f"{fmt(peak**2 if peak is not None else None)} | {fmt(max(d))} | {rms:.4f} | {len(d)} | "
                     f"{numbered[command]} |")
    lines += commands_of([f[-1] for f in fits])

    # the best-of-n and PPO sections, and their rows of what the policy learned and where proxy and gold disagree
    learned, disagree = [], []

    def disagreement_table(heading: str, column: str, picked) -> list[str]:
        quoted = [(t.replace("|", "\\|").replace("\n", " ").replace("`", "'"), pr, g) for t, pr, g in picked]
        return [heading, "", f"| proxy | gold | {column} |", "|---|---|---|",
                *(f"| {pr:+.3f} | {g:+.3f} | {t} |" for t, pr, g in quoted), ""]

    if bon:
        s, n_shown = bon["settings"], bon_curves[0]["points"][-1]["n"]
        lines += ["", "## Best-of-n", "",
                  f"Command {numbered[bon['command']]}: `{bon['command']}`. {len(bon['prompts'])} held-out prompts "
                  f"({len(set(bon['prompts']))} distinct), N = {bon['n']} responses each from {s['model_name']} "
                  f"(temperature {s['temperature']:g}, {s['response_length']} tokens, stop token {s['stop_token']!r} "
                  f"from token {s['min_response_length']}). Expected best of n over all n-subsets of each prompt's N; "
                  f"initial policy (n = 1): gold {np.mean(bon['gold']):.4f} (std {bon_curves[0]['gold_std']:.4f}).",
                  f"Shown up to n = {n_shown} (N / 4); the intervals are 95% over the {len(bon['prompts'])} prompts "
                  "(4,000 bootstrap resamples of the prompts). KL: the upper bound log n - (n - 1) / n."]
        resp = np.array(bon["responses"], dtype=object)
        lengths, stops = np.array(bon["lengths"], dtype=float), np.array(bon["stops"], dtype=float)
    for c in bon_curves:
        lines += ["", f"**{c['name']}** (proxy std on these responses {c['proxy_std']:.3f}; correlation with gold "
                  f"over all {np.size(bon['gold'])} responses {c['correlation']:+.3f}, 95% "
                  f"[{c['correlation_ci'][0]:+.3f}, {c['correlation_ci'][1]:+.3f}]; gold at its peak mean, n = "
                  f"{c['peak_n']}, minus gold at n = {c['points'][-1]['n']}: {c['fall']:+.4f}, 95% "
                  f"[{c['fall_ci'][0]:+.4f}, {c['fall_ci'][1]:+.4f}])",
                  "", "| n | KL bound (nats) | d | proxy change [95%] | gold change (vader) [95%] | gold change "
                  "(initial std) |", "|---|---|---|---|---|---|"]
        lines += [f"| {p['n']} | {p['kl']:.4f} | {p['d']:.4f} | {p['proxy_change']:+.3f} "
                  f"[{p['proxy_change_ci'][0]:+.3f}, {p['proxy_change_ci'][1]:+.3f}] | {p['gold_change']:+.4f} "
                  f"[{p['gold_change_ci'][0]:+.4f}, {p['gold_change_ci'][1]:+.4f}] | "
                  f"{fmt(p['gold_change_std'], 3, '+')} |" for p in c["points"]]
        # the proxy's best of all N of each prompt (ties: the first)
        p = np.array(next(x["scores"] for x in bon["proxies"] if x["name"] == c["name"]))
        rows, best = np.arange(len(p)), np.argmax(p, 1)
        rep_all = np.mean([repeated_word_share(x) for x in resp.ravel()])
        rep_best = np.mean([repeated_word_share(x) for x in resp[rows, best]])
        learned.append(f"| best-of-{bon['n']}, {c['name']} | {len(best)} | {lengths.mean():.1f} -> "
                       f"{lengths[rows, best].mean():.1f} | {stops.mean():.2f} -> {stops[rows, best].mean():.2f} | "
                       f"{rep_all:.3f} -> {rep_best:.3f} | {numbered[bon['command']]} |")
        texts = [bon["prompts"][i] + bon["responses"][i][j] for i, j in zip(rows, best)]
        disagree += disagreement_table(f"**best-of-{bon['n']}, {c['name']}** (command {numbered[bon['command']]})",
                                       "text", disagreements(texts, p[rows, best], np.array(bon["gold"])[rows, best],
                                                             args.num_disagreements))

    for r, curve in zip(runs, curves):
        s, init = r["settings"], r["initial"]
        shown = sorted({0, len(curve) - 1, *range(0, len(curve), max(1, len(curve) // 10))})
        kl_mode = "fixed" if r["kl_target"] is None else f"adaptive, target {r['kl_target']:g} nats"
        lines += ["", f"## PPO on {r['proxy_name']}, kl_coef {r['kl_coef']:g} ({kl_mode})", "",
                  f"Command {numbered[r['command']]}: `{r['command']}`; this run is `{r['ppo_command']}` with the gold "
                  f"score recorded beside it. {len(curve)} iterations of {s['batch_size']} responses; initial policy "
                  f"(the batches before the first update, {init['responses']} responses of training prompts): proxy "
                  f"{init['proxy']:.4f}, gold {init['gold']:.4f} (std {init['gold_std']:.4f}). Each row is one "
                  "training batch (the policy before that iteration's update).", "",
                  "| iteration | KL (nats) | d | proxy change | gold change (vader) | gold change (initial std) "
                  "| length (tokens) | ends with stop | repeated words |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {p['iteration']} | {p['kl']:.3f} | {p['d']:.3f} | {p['proxy_change']:+.3f} | "
                  f"{p['gold_change']:+.4f} | {fmt(p['gold_change_std'], 3, '+')} | {p['length']:.1f} | "
                  f"{p['stop_share']:.2f} | {p['repeated_words']:.3f} |" for p in (curve[i] for i in shown)]
        if r["eval"]:
            lines += ["", "Held-out prompts (ppo_rlhf_gpt2's evaluation, sampled):", "",
                      "| after iteration | responses | proxy | gold (vader) | length | ends with stop | repeated words "
                      "|", "|---|---|---|---|---|---|---|"]
            lines += [f"| {e['after_iteration']} | {e['responses']} | {e['proxy']:.4f} | {e['gold']:.4f} | "
                      f"{e['length']:.1f} | {e['stop_share']:.2f} | {e['repeated_words']:.3f} |" for e in r["eval"]]
        last = r["iterations"][-len(r["samples"]):] if r["samples"] else r["iterations"][-1:]
        learned.append(f"| PPO kl_coef {r['kl_coef']:g}, {r['proxy_name']} | {sum(x['responses'] for x in last)} | "
                       + " | ".join(f"{init[k]:.{digits}f} -> {np.mean([x[k] for x in last]):.{digits}f}"
                                    for k, digits in (("length", 1), ("stop_share", 2), ("repeated_words", 3)))
                       + f" | {numbered[r['command']]} |")
        pool = [(x, pr, g) for s in r["samples"] for x, pr, g in zip(s["responses"], s["proxy"], s["gold"])]
        if pool:
            disagree += disagreement_table(
                f"**PPO kl_coef {r['kl_coef']:g}, {r['proxy_name']}, iterations {r['samples'][0]['iteration']}-"
                f"{r['samples'][-1]['iteration']}** (command {numbered[r['command']]}; the response only, without "
                "its prompt)", "response", disagreements(*zip(*pool), args.num_disagreements))

    lines += ["", "## What the policy learned", "",
              f"Page: `{report_command}`. Initial: the initial policy's responses; optimized: PPO's last kept "
              "iterations, best-of-n's chosen responses at the largest n. Length in tokens (stop token included), "
              "share ending with the stop token, share of words repeating an earlier word.", "",
              "| policy | responses | length: initial -> optimized | ends with stop | repeated words | command |",
              "|---|---|---|---|---|---|", *learned, *commands_of(all_commands),
              "", "## Where proxy and gold disagree most", "",
              "The samples with the highest proxy rank and the lowest gold rank (ranks within the pool: PPO's last "
              "kept iterations; best-of-n's chosen response of each prompt at the largest n).",
              *commands_of(all_commands), "", *disagree]
    path = out + ".md"
    text = open(path).read() if os.path.exists(path) else ""
    # hand-written text survives: a reading below READING_MARK, the title and a summary above GENERATED_MARK
    kept = text[text.index(READING_MARK):] if READING_MARK in text else ""
    above = text[: len(text) - len(kept)]
    head = above.split(GENERATED_MARK, 1)[0] if GENERATED_MARK in above else TITLE + "\n\n"
    page = head + GENERATED_MARK + "\n" + "\n".join(lines) + "\n" + ("\n" + kept if kept else "")
    with open(path, "w") as f:
        f.write(page)
    print(f"wrote {path} and {out}.png")
    if GENERATED_MARK in above:
        print(f"kept the hand-written top above {GENERATED_MARK} in {path}")
    if kept:
        print(f"kept the hand-written reading below {READING_MARK} in {path}: check it against the numbers")
    return page
