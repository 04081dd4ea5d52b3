"""Reward over-optimization: a learned proxy reward model against the gold scorer whose labels it learned.

Gao, Schulman and Hilton 2022 (arXiv:2210.10760): a policy optimizing a *learned* reward model (the proxy) drifts
toward text the proxy scores highly and the true preference does not; the gold first rises, then falls as the KL to
the initial policy grows. Gold: vader's compound sentiment of prompt + response (`--reward-model vader`). Proxies:
folders of `reward_model_gpt2.py --gold vader --save-model`, read as ppo_rlhf_gpt2.load_reward_fn reads them.
`best-of-n` samples N responses per held-out prompt once (shared.load_eval_prompts; the sampling of --ppo-flags),
scores them by every proxy and gold, and keeps the expected best-of-n over all n-subsets (shared.best_of_n). `ppo`
runs ppo_rlhf_gpt2.main() unchanged per proxy and --kl-coefs value, recording the gold beside the proxy
(record_ppo_run). `report` (rlhf_overoptimization_report.py) writes <out>.md and <out>.png: proxy and gold change
against d = sqrt(KL), Gao et al.'s forms fitted to the gold, what the policy learned, where proxy and gold disagree;
what stands above a line `<!-- generated -->` in the .md (its title and summary) and a reading below a line
`<!-- reading -->` are kept.

Usage (from the repository root; --ppo-flags= go to ppo_rlhf_gpt2.py as they are (write the "=": the value starts
with "--"); the KL coefficient is fixed, --kl-target None, unless they say otherwise):
    python experiments/rlhf_overoptimization.py best-of-n --proxies runs/rm_small/model runs/rm_large/model \
        --n 64 --num-prompts 64 --ppo-flags="--model-name models/smollm2-135m"
    python experiments/rlhf_overoptimization.py ppo --proxies runs/rm_small/model runs/rm_large/model \
        --kl-coefs 0.01 0.15 --ppo-flags="--model-name models/smollm2-135m --total-episodes 4096"
    python experiments/rlhf_overoptimization.py report
Writes docs/results/rlhf_overoptimization.{best_of_n.json,ppo.json,md,png} (--out sets the prefix); the PPO runs'
TensorBoard logs go to experiments/runs/rlhf_overoptimization/ unless --ppo-flags set --runs-dir.
"""

import dataclasses
import json
import math
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Annotated, Union
from unittest import mock

import numpy as np
import torch
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "experiments")]
import ppo_rlhf_gpt2 as rlhf  # noqa: E402
from rlhf_overoptimization_report import OUT, Report, command_of, repeated_word_share, run_report  # noqa: E402
from shared import load_eval_prompts  # noqa: E402  (the held-out prompts)


@dataclass
class BestOfN:
    proxies: list[str]  # proxy reward-model folders (reward_model_gpt2.py --save-model)
    proxy_names: list[str] = field(default_factory=list)
    """their names in the report (default: the folder, with the size of its run's preferences.jsonl)"""
    n: int = 64  # N: responses sampled per prompt; the report shows best-of-n for n = 1, 2, 4, ... up to N / 4
    num_prompts: int = 64  # held-out prompts, cycled from the list (each with its own N responses)
    prompts_file: str | None = None
    """held-out prompts, one a line (default: EVAL_PROMPTS + MORE_EVAL_PROMPTS, 64 distinct)"""
    batch_size: int = 64  # responses sampled per generate call
    ppo_flags: str = ""  # ppo_rlhf_gpt2.py flags setting the policy and its sampling (--model-name, --temperature, ...)
    out: str = OUT  # prefix of the written files (relative to the repository root)


@dataclass
class Ppo:
    proxies: list[str]
    """proxy reward-model folders (reward_model_gpt2.py --save-model): one run per proxy and KL coefficient"""
    proxy_names: list[str] = field(default_factory=list)
    """their names in the report (default: the folder, with the size of its run's preferences.jsonl)"""
    kl_coefs: list[float] = field(default_factory=lambda: [0.01, 0.15])
    """KL coefficients (fixed unless --ppo-flags set --kl-target): a small one, ppo_rlhf_gpt2.py's default"""
    ppo_flags: str = ""
    """further ppo_rlhf_gpt2.py flags, as they are (--model-name, --total-episodes, --save-model, ...)"""
    keep_iterations: int = 5  # the texts of this many last iterations are kept for the report's samples
    out: str = OUT  # prefix of the written files; the runs are added to <out>.ppo.json (a rerun of a run replaces it)


def parse_ppo_flags(flags: str, **set_here) -> rlhf.Args:
    """--ppo-flags parsed by tyro into ppo_rlhf_gpt2.Args; the KL coefficient fixed unless the flags say; the
    flags this experiment sets itself (set_here, e.g. --reward-model) may not be among them."""
    tokens = shlex.split(flags)
    for name in set_here:
        flag = "--" + name.replace("_", "-")
        if any(t.split("=")[0] in (flag, "--" + name) for t in tokens):
            raise SystemExit(f"error: --ppo-flags may not set {flag}: this experiment sets it")
    default = rlhf.Args(kl_target=None, runs_dir=os.path.join(ROOT, "experiments/runs/rlhf_overoptimization"))
    return dataclasses.replace(tyro.cli(rlhf.Args, args=tokens, default=default, prog="--ppo-flags"), **set_here)


def proxy_names(paths: list[str], names: list[str]) -> list[str]:
    if names and len(names) != len(paths):
        raise SystemExit(f"error: --proxy-names gives {len(names)} names for {len(paths)} --proxies")
    for path in paths:
        if not os.path.isdir(path):
            raise SystemExit(f"error: --proxies {path}: no such directory")
    if names:
        return names
    named = []
    for path in paths:  # reward_model_gpt2.py writes <run>/preferences.jsonl beside <run>/model
        preferences = os.path.join(os.path.dirname(os.path.normpath(path)), "preferences.jsonl")
        size = sum(1 for _ in open(preferences)) if os.path.isfile(preferences) else None
        named.append(path + (f" ({size} comparisons)" if size else ""))
    return named


def score(reward_fn, texts: list[str], responses: list[str], chunk: int) -> list[float]:
    return torch.cat([reward_fn(texts[i : i + chunk], responses[i : i + chunk]).float().cpu()
                      for i in range(0, len(texts), chunk)]).tolist()


def write_json(path: str, data) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)


def run_best_of_n(args: BestOfN) -> dict:
    if args.n < 1 or args.num_prompts < 1 or args.batch_size < 1:
        raise SystemExit("error: --n, --num-prompts and --batch-size must be at least 1")
    names = proxy_names(args.proxies, args.proxy_names)
    run_args = parse_ppo_flags(args.ppo_flags, reward_model="vader")
    rlhf.check_args(run_args)
    prompts = load_eval_prompts(args.prompts_file, args.num_prompts)
    device = torch.device("cuda" if run_args.cuda and torch.cuda.is_available() else "cpu")
    torch.set_num_threads(run_args.num_threads)
    torch.manual_seed(run_args.seed)
    # sample once: N responses per prompt, ppo_rlhf_gpt2's own sampling and truncation
    tokenizer, _, stop_token_id = rlhf.load_tokenizer(run_args.model_name, run_args.stop_token)
    policy = rlhf.load_policy(run_args.model_name, device)
    texts, responses, lengths, stops = [], [], [], []

    def collect(batch_texts, batch_responses):  # the reward function sample_and_score calls: keep the texts
        texts.extend(batch_texts)
        responses.extend(batch_responses)
        return torch.zeros(len(batch_texts))

    flat = [p for p in prompts for _ in range(args.n)]
    for start in range(0, len(flat), args.batch_size):
        queries = rlhf.tokenize_queries(tokenizer, flat[start : start + args.batch_size], run_args.max_query_length,
                                        device)
        _, _, mask, contain_stop, _ = rlhf.sample_and_score(policy, queries, tokenizer, stop_token_id, collect,
                                                           run_args)
        lengths += mask.sum(1).tolist()
        stops += contain_stop.tolist()
        print(f"sampled {len(texts)}/{len(flat)} responses", flush=True)
    del policy
    # score: every proxy as ppo_rlhf_gpt2 loads a folder (logits + reward_bias), and gold (its vader)
    chunk, shape = run_args.local_rollout_forward_batch_size, (len(prompts), args.n)
    gold = score(rlhf.load_reward_fn(run_args, device), texts, responses, chunk)
    proxies = [{"path": path, "name": name, "scores": np.reshape(score(rlhf.load_reward_fn(
        dataclasses.replace(run_args, reward_model=path), device), texts, responses, chunk), shape).tolist()}
        for path, name in zip(args.proxies, names)]
    result = {"command": command_of("best-of-n", args), "n": args.n, "prompts": prompts,
              "settings": settings_of(run_args), "proxies": proxies, "gold": np.reshape(gold, shape).tolist(),
              "responses": np.reshape(np.array(responses, dtype=object), shape).tolist(),
              "lengths": np.reshape(lengths, shape).tolist(), "stops": np.reshape(stops, shape).tolist()}
    path = os.path.join(ROOT, args.out + ".best_of_n.json")
    write_json(path, result)
    print(f"wrote {path}")
    return result


def record_ppo_run(run_args: rlhf.Args) -> tuple[dict, list[dict]]:
    """ppo_rlhf_gpt2.main(run_args) with load_reward_fn, sample_and_score and evaluate wrapped from outside
    (restored afterwards, also when the run raises): every call of the reward function also scores the same texts
    by gold. Returns the run's result and its batches in order, each {"phase": "normalization" | "train" | "eval",
    "iteration" (train: its number; eval: the training iterations before it), "greedy", "texts", "responses",
    "proxy", "gold", "lengths", "stops", "calls"}."""
    real_load, real_sample, real_evaluate = rlhf.load_reward_fn, rlhf.sample_and_score, rlhf.evaluate
    batches, state = [], {"eval": None, "train": 0, "normalization": 0}

    def watched_load_reward_fn(args, device):
        proxy_fn = real_load(args, device)
        gold_fn = real_load(dataclasses.replace(args, reward_model="vader"), device)

        def reward_fn(texts, responses):  # called by sample_and_score only: its batch is open
            scores, batch = proxy_fn(texts, responses), batches[-1]
            batch["texts"] += texts
            batch["responses"] += responses
            batch["proxy"] += scores.float().cpu().tolist()
            batch["gold"] += gold_fn(texts, responses).float().cpu().tolist()
            batch["calls"] += 1
            return scores

        return reward_fn

    def watched_sample_and_score(*a, **kw):
        if state["eval"] is not None:
            phase, iteration = "eval", state["train"]
        elif run_args.normalize_scores and state["normalization"] < run_args.norm_batches:  # sampled first
            phase, iteration, state["normalization"] = "normalization", 0, state["normalization"] + 1
        else:
            phase, iteration = "train", state["train"] + 1
            state["train"] = iteration
        batches.append(dict(phase=phase, iteration=iteration, greedy=bool(state["eval"]), texts=[], responses=[],
                            proxy=[], gold=[], lengths=[], stops=[], calls=0))
        out = real_sample(*a, **kw)
        batches[-1]["lengths"] += out[2].sum(1).tolist()  # the response mask
        batches[-1]["stops"] += out[3].tolist()  # contain_stop
        return out

    def watched_evaluate(*a, **kw):
        state["eval"] = bool(kw.get("greedy", a[7] if len(a) > 7 else False))
        try:
            return real_evaluate(*a, **kw)
        finally:
            state["eval"] = None

    with mock.patch.multiple(rlhf, load_reward_fn=watched_load_reward_fn, sample_and_score=watched_sample_and_score,
                             evaluate=watched_evaluate):
        return rlhf.main(run_args), batches


def read_scalars(run_dir: str) -> dict:
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def batch_summary(batches: list[dict]) -> dict:
    proxy, gold = (np.concatenate([b[key] for b in batches]) for key in ("proxy", "gold"))
    return {"proxy": float(proxy.mean()), "gold": float(gold.mean()), "proxy_std": float(proxy.std()),
            "gold_std": float(gold.std()), "responses": len(proxy),
            "length": float(np.mean([x for b in batches for x in b["lengths"]])),
            "stop_share": float(np.mean([x for b in batches for x in b["stops"]])),
            "repeated_words": float(np.mean([repeated_word_share(r) for b in batches for r in b["responses"]]))}


def summarize_run(run_args: rlhf.Args, result: dict, batches: list[dict], keep_iterations: int) -> dict:
    """Per iteration: the batch's proxy, gold, KL (from the TensorBoard log), length, stop share and repeated
    words; the initial policy's batches; the held-out evaluations; the last iterations' texts."""
    scalars = read_scalars(result["run_dir"])
    kl, logged_raw = (dict(scalars.get(tag, [])) for tag in ("objective/kl", "objective/raw_scores"))
    train = [b for b in batches if b["phase"] == "train"]
    # the recording is of the run the script logged: one batch per logged iteration, the same mean proxy
    if sorted(kl) != [b["iteration"] for b in train]:
        raise SystemExit(f"error: recorded {len(train)} training batches, the log has {len(kl)} iterations")
    for b in train:
        if not math.isclose(np.mean(b["proxy"]), logged_raw[b["iteration"]], rel_tol=1e-4, abs_tol=1e-4):
            raise SystemExit(f"error: iteration {b['iteration']}: the recorded proxy mean differs from the "
                             "logged objective/raw_scores")
    # the initial policy's responses on training prompts: the normalization batches and iteration 1's
    initial = [b for b in batches if b["phase"] == "normalization"] + train[:1]
    evals = {}
    for b in (b for b in batches if b["phase"] == "eval" and not b["greedy"]):
        evals.setdefault(b["iteration"], []).append(b)
    return {"iterations": [{"iteration": b["iteration"], "kl": kl[b["iteration"]], **batch_summary([b])}
                           for b in train], "initial": batch_summary(initial),
            "eval": [{"after_iteration": it, **batch_summary(bs)} for it, bs in sorted(evals.items())],
            "samples": [{"iteration": b["iteration"], "responses": b["responses"], "proxy": b["proxy"],
                         "gold": b["gold"]} for b in train[-keep_iterations:]], "run_dir": result["run_dir"]}


def run_ppo(args: Ppo) -> list[dict]:
    names = proxy_names(args.proxies, args.proxy_names)
    if not args.kl_coefs or min(args.kl_coefs) < 0:
        raise SystemExit("error: --kl-coefs must give at least one coefficient, each at least 0")
    parse_ppo_flags(args.ppo_flags, reward_model=args.proxies[0], kl_coef=args.kl_coefs[0])  # fails early
    path, runs = os.path.join(ROOT, args.out + ".ppo.json"), []
    for proxy, name in zip(args.proxies, names):
        for kl_coef in args.kl_coefs:
            run_args = parse_ppo_flags(args.ppo_flags, reward_model=proxy, kl_coef=kl_coef)
            fixed = " --kl-target None" if run_args.kl_target is None else ""
            if "--runs-dir" not in args.ppo_flags:  # where this experiment puts the logs
                fixed += " --runs-dir experiments/runs/rlhf_overoptimization"
            ppo_command = (f"python ppo_rlhf_gpt2.py {args.ppo_flags} --reward-model {shlex.quote(proxy)} "
                           f"--kl-coef {kl_coef:g}{fixed}")
            result, batches = record_ppo_run(run_args)
            run = {"proxy": proxy, "proxy_name": name, "kl_coef": kl_coef, "kl_target": run_args.kl_target,
                   "command": command_of("ppo", args), "ppo_command": " ".join(ppo_command.split()),
                   "settings": settings_of(run_args), **summarize_run(run_args, result, batches, args.keep_iterations)}
            runs.append(run)
            # saved after every run, added to the runs already in the file (the same run again replaces it)
            saved, key = json.load(open(path)) if os.path.exists(path) else [], (proxy, kl_coef, run["ppo_command"])
            write_json(path, [r for r in saved if (r["proxy"], r["kl_coef"], r["ppo_command"]) != key] + [run])
            print(f"{name}, kl_coef {kl_coef:g}: saved to {path}")
    return runs


def settings_of(run_args: rlhf.Args) -> dict:
    keys = ("model_name", "temperature", "response_length", "min_response_length", "stop_token", "max_query_length",
            "seed", "total_episodes", "batch_size", "learning_rate", "kl_target", "eval_episodes")
    return {k: getattr(run_args, k) for k in keys}


Command = Union[Annotated[BestOfN, tyro.conf.subcommand("best-of-n")], Annotated[Ppo, tyro.conf.subcommand("ppo")],
                Annotated[Report, tyro.conf.subcommand("report")]]


def main(args) -> None:
    torch.set_num_threads(1)
    {BestOfN: run_best_of_n, Ppo: run_ppo, Report: run_report}[type(args)](args)


if __name__ == "__main__":
    main(tyro.cli(Command))
