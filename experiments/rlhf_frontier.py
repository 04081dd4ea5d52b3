"""The reward-KL frontier of DPO, PPO and GRPO on a learned reward model, PPO on the gold, and best-of-n.

The DPO paper's figure (Rafailov et al. 2023, arXiv:2305.18290, Fig. 2) at this project's scale: from one file of
comparisons labeled by a gold scorer, which method buys the most gold for a given KL to the initial policy? Every
method starts from --model-name and sees the same comparisons, directly (dpo_gpt2.py) or through the reward model
learned from them (reward_model_gpt2.py, then ppo_rlhf_gpt2.py or grpo_gpt2.py); PPO on the gold shows what the
reward model stands in for; best-of-n on it, the frontier with no training.

One evaluation for every method (`measure`): --samples-per-prompt responses to each of --num-prompts held-out
prompts (shared.py's 64 openings; the preference file's are ppo_rlhf_gpt2.PROMPTS), sampled as the RL
files sample (dpo_gpt2.generate) from one seeded random stream (the same draws at every point); the gold of prompt +
response, the KL to the initial policy from the sampled tokens, sum_t log pi(y_t) - log pi_ref(y_t) (k1); means over
prompts of each prompt's mean, standard errors over prompts. The scripts run unchanged in this process, their
held-out evaluation (ppo_rlhf_gpt2.evaluate, grpo_gpt2.evaluate, dpo_gpt2.evaluate_samples) replaced by `measure` at
their --eval-every points (the first, step 0, the initial point all runs share). CPU time: the process time minus
measure's and the held-out accuracy's (DPO's, the reward model's); also before each point. Each run's gold (and CPU
time) at KL 1, 2, 3 and 6 nats: linear between its first point at or past the KL and the one before; over seeds the
mean and a 95% t-interval, DPO minus each other method a 95% Welch one. Best-of-n (best_of_n_record): an interval
over prompts.

Usage (from the repository root; each step skips the runs whose record exists, so it can span sittings):
    python experiments/rlhf_frontier.py reward-model --preferences vader_2000.jsonl
    python experiments/rlhf_frontier.py run --preferences vader_2000.jsonl --methods dpo ppo --seeds 1 2 3
    python experiments/rlhf_frontier.py tune --preferences vader_2000.jsonl     # each grid, validation prompts
    python experiments/rlhf_frontier.py run --preferences vader_2000.jsonl --tuned --seeds 4 5 6   # its choices
    python experiments/rlhf_frontier.py run --preferences vader_2000.jsonl --tuned --seeds 4 5 6 --bf16
    python experiments/rlhf_frontier.py report
Records go to --runs (experiments/runs/rlhf_frontier/<method>/<setting>__<seed>.json); the report writes
docs/results/rlhf_frontier.{md,png}, keeping what is above a line `<!-- generated -->` in the page.
"""

import contextlib
import dataclasses
import glob
import itertools
import json
import math
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Annotated, Union
from unittest import mock

import numpy as np
import torch
import tyro

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "experiments")]
import dpo_gpt2 as dpo  # noqa: E402
import grpo_gpt2 as grpo  # noqa: E402
import ppo_rlhf_gpt2 as rlhf  # noqa: E402
import reward_model_gpt2 as rm  # noqa: E402
import protocol  # noqa: E402  (the tuning rule, the grids' seeds, the t- and Welch intervals)
import shared  # noqa: E402  (the held-out prompts and the best-of-n math)
from protocol import difference_interval, mean_interval  # noqa: E402

KL_TARGETS = (1.0, 2.0, 3.0, 6.0)
# The RL runs' schedule: 20 iterations of 64 responses, 4 minibatch steps each, one epoch, lr 5e-5 (the PPO
# settings of docs/results/ppo_rlhf_gpt2.md; the defaults take hours a run on a CPU), GRPO's the same.
RL = "--total-episodes 1280 --batch-size 64 --num-minibatches 4 --update-epochs 1 --learning-rate 5e-5 --eval-every 4"
# method: (script, {setting: flags}); {rm}: the reward model, {prefs}: the file. DPO: (beta, lr, --eval-every), on
# the reward model's split, at 2e-5 (DPO's default then, 5e-6, barely moved in an epoch), and further at 5e-5 to 1e-4:
DPO = (("0.1", "2e-5", 17), ("0.03", "2e-5", 17), ("0.3", "2e-5", 17), ("0.1", "5e-5", 17), ("0.1", "1e-4", 6),
       ("0.1", "7e-5", 9), ("0.03", "7e-5", 9), ("0.3", "7e-5", 9))
METHODS = {
    "dpo": (dpo, {f"beta {b}" + ("" if lr == "2e-5" else f" lr {lr}"): f"--beta {b} --preferences {{prefs}} "
                  f"--eval-fraction 0.2 --split-seed 1 --learning-rate {lr} --eval-every {e}" for b, lr, e in DPO}),
    "ppo": (rlhf, {f"kl_coef {k}": f"--reward-model {{rm}} --kl-coef {k} --kl-target None {RL}"
                   for k in ("0.01", "0.05")}),
    "grpo": (grpo, {f"beta {b}": f"--reward-model {{rm}} --beta {b} {RL}" for b in ("0.04", "0.2")}),
    "ppo_gold": (rlhf, {"kl_coef 0.05": f"--reward-model vader --kl-coef 0.05 --kl-target None {RL}"}),
}
# The tuning grids (experiments/protocol.py), stated before the first tuning run: 8 settings a method, each run once
# at protocol.TUNING_SEED on the validation prompts, points twice as dense as above; a tuning run stops at its first
# point at KL >= STOP_KL, past which the rule reads nothing. PPO: learning rate, KL coefficient, responses per
# iteration (20 iterations either way); GRPO: learning rate, beta, group size (64 responses an iteration); DPO:
# learning rate and beta. The ranges were set after the runs above, which read the test prompts.
STOP_KL = 3.0
TUNE_RL = "--num-minibatches 4 --update-epochs 1 --eval-every 2"
FLAGS = {
    "dpo": lambda lr, beta: f"--beta {beta} --preferences {{prefs}} --eval-fraction 0.2 --split-seed 1 "
                            f"--learning-rate {lr} --eval-every 3",
    "ppo": lambda lr, kl_coef, batch: f"--reward-model {{rm}} --kl-coef {kl_coef} --kl-target None --learning-rate "
                                      f"{lr} --batch-size {batch} --total-episodes {20 * int(batch)} {TUNE_RL}",
    "grpo": lambda lr, beta, G: f"--reward-model {{rm}} --beta {beta} --num-generations {G} --learning-rate {lr} "
                                f"--batch-size 64 --total-episodes 1280 {TUNE_RL}",
}
TUNING = {
    "dpo": protocol.grid(FLAGS["dpo"], lr=("5e-5", "1e-4", "2e-4", "4e-4"), beta=("0.1", "0.3")),
    "ppo": protocol.grid(FLAGS["ppo"], lr=("5e-5", "1e-4"), kl_coef=("0.01", "0.05"), batch=("64", "128")),
    "grpo": protocol.grid(FLAGS["grpo"], lr=("5e-5", "1e-4"), beta=("0.01", "0.04"), G=("4", "8")),
}
# The search (protocol.next_runs), stated before its first run: the grids above with 4 learning rates about 2x
# apart (PPO's and GRPO's two lower ones added, where their choices sat), each other axis stepped by its values'
# spacing beyond an edge, the cap protocol.EXTRA_RUNS. TUNING's runs are its runs (the same names and flags).
# The chosen settings then run at FRESH_SEEDS on shared.FRESH_TEST_PROMPTS (--split fresh), read by no run before.
Axis = protocol.Axis
SEARCH = {
    "dpo": dict(lr=Axis(("5e-5", "1e-4", "2e-4", "4e-4")), beta=Axis(("0.1", "0.3"), factor=3)),
    "ppo": dict(lr=Axis(("1.25e-5", "2.5e-5", "5e-5", "1e-4")), kl_coef=Axis(("0.01", "0.05"), factor=5),
                batch=Axis(("64", "128"), low=16, high=512)),
    "grpo": dict(lr=Axis(("1.25e-5", "2.5e-5", "5e-5", "1e-4")), beta=Axis(("0.01", "0.04"), factor=4),
                 G=Axis(("4", "8"), low=2, high=64)),
}
FRESH_SEEDS = (7, 8, 9)
MEASURED = {dpo: "evaluate_samples", rlhf: "evaluate", grpo: "evaluate"}  # the evaluation each script calls
BEST_OF_N = "best_of_n"


@dataclass
class Common:
    runs: str = "experiments/runs/rlhf_frontier"
    """where the records go (relative to the repository root)"""
    model_name: str = "models/smollm2-135m"
    """the initial policy and reference of every method"""
    num_prompts: int = 64
    """held-out prompts, cycled from shared.py's 64 (EVAL_PROMPTS + MORE_EVAL_PROMPTS)"""
    samples_per_prompt: int = 2
    """responses sampled per prompt at each point of a run"""
    eval_seed: int = 0
    """the seed of the evaluation's random stream (the same draws at every point)"""
    split: str = "test"
    """the prompts measured: `test` (the tables' before the search), `validation` (the tuning's,
    shared.VALIDATION_PROMPTS) or `fresh` (the search's test prompts, shared.FRESH_TEST_PROMPTS)"""
    flags: str = "--no-cuda --num-threads 1"
    """flags added to every script's command"""


@dataclass
class RewardModel(Common):
    preferences: str = "vader_2000.jsonl"
    """the preference file (prompt, chosen, rejected, gold_chosen, gold_rejected a line)"""
    rm_flags: str = "--eval-fraction 0.2 --save-model"
    """reward_model_gpt2.py's flags besides --preferences, --model-name and --runs-dir"""


@dataclass
class Run(Common):
    preferences: str = "vader_2000.jsonl"
    """the preference file: DPO trains on it, the others on the reward model learned from it"""
    methods: list[str] = field(default_factory=lambda: [*METHODS, BEST_OF_N])
    """which methods (dpo ppo grpo ppo_gold best_of_n)"""
    settings: list[str] = field(default_factory=list)
    """only these settings of each method, e.g. 'beta 0.1' (default: all)"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """the seeds of each setting"""
    best_of_n: int = 64
    """best-of-n: responses sampled per prompt (n = 1, 2, 4, ... up to it)"""
    tuned: bool = False
    """run each method's setting chosen by its tuning runs (<runs>/tuning) instead of --settings"""
    searched: bool = False
    """run each method's setting chosen by its search (SEARCH, <runs>/tuning) on the fresh test prompts"""
    bf16: bool = False
    """each setting with --bf16 (detail 53; measured in fp32 all the same): rows of their own, '<setting> bf16'"""


@dataclass
class Tune(Common):
    preferences: str = "vader_2000.jsonl"
    """the preference file: DPO trains on it, the others on the reward model learned from it"""
    methods: list[str] = field(default_factory=lambda: [*TUNING])
    """which methods' grids (dpo ppo grpo)"""
    settings: list[str] = field(default_factory=list)
    """only these settings of each grid (default: all)"""
    split: str = "validation"
    """the prompts the tuning runs are measured on"""


@dataclass
class Search(Common):
    preferences: str = "vader_2000.jsonl"
    """the preference file: DPO trains on it, the others on the reward model learned from it"""
    methods: list[str] = field(default_factory=lambda: [*SEARCH])
    """which methods' searches (dpo ppo grpo)"""


@dataclass
class Prompts:
    runs: str = "experiments/runs/rlhf_frontier"
    """the records read"""
    preferences: str = "vader_2000.jsonl"
    """the preference file, whose prompts the test prompts must not be"""


@dataclass
class Report:
    runs: str = "experiments/runs/rlhf_frontier"
    """the records read"""
    out: str = "docs/results/rlhf_frontier"
    """prefix of the written .md and .png"""


# --------------------------------------------------------------------------------------------------- the math


def at_kl(points: list[dict], target: float, key: str = "gold"):
    """points[key] (a number, or a list: each prompt's gold) where a run's KL first reaches target, linear between
    that point and the one before (points in training order, the first the initial policy); None if it never does."""
    for before, after in zip(points, points[1:]):
        if after["kl"] >= target:
            w = 1.0 if after["kl"] == before["kl"] else (target - before["kl"]) / (after["kl"] - before["kl"])
            w = min(max(w, 0.0), 1.0)
            return (1 - w) * np.asarray(before[key]) + w * np.asarray(after[key])
    return None


def gold_at_kl(points: list[dict], target: float) -> float | None:
    value = at_kl(points, target)
    return None if value is None else float(value)


def cpu_at_kl(record: dict, target: float) -> float | None:
    """The CPU minutes a run trained before its KL reached target, read as the gold is. An RL run recorded without
    them: its minutes times the share of its iterations done (an estimate); a DPO one: None (its setup is uneven)."""
    points = record["points"]
    if "cpu_minutes" not in points[-1] and record["method"] in ("ppo", "grpo", "ppo_gold"):
        points = [{**p, "cpu_minutes": record["cpu_minutes"] * p["step"] / points[-1]["step"]} for p in points]
    value = at_kl(points, target, "cpu_minutes") if "cpu_minutes" in points[-1] else None
    return None if value is None else float(value)


def over_prompts(values: np.ndarray) -> tuple[float, float, list[float]]:
    """values (prompts, samples): the mean of the prompts' means, its standard error over prompts, the means."""
    means = values.mean(1)
    return float(means.mean()), float(means.std(ddof=1) / math.sqrt(len(means))), means.tolist()


# ------------------------------------------------------------------------------------------ the one evaluation


class Frontier:
    """The reference, the gold scorer and the held-out prompts, loaded once; `measure` scores any policy."""

    def __init__(self, common: Common):
        self.common, self.device = common, torch.device("cpu")
        self.args = dpo.Args(model_name=common.model_name, gold="vader", seed=common.eval_seed)
        self.tokenizer, self.stop_token_id = dpo.load_tokenizer(common.model_name, self.args.stop_token)
        self.reference = dpo.load_policy(common.model_name, self.device)
        self.gold_fn = dpo.load_gold_fn(self.args, self.device)
        prompts = {"validation": shared.VALIDATION_PROMPTS, "fresh": shared.FRESH_TEST_PROMPTS}.get(common.split)
        self.prompts = (shared.load_eval_prompts(None, common.num_prompts) if prompts is None else
                        [prompts[i % len(prompts)] for i in range(common.num_prompts)])

    def measure(self, policy, samples_per_prompt: int, reward_fn=None, batch_size: int = 16) -> dict:
        """(prompts, samples) arrays of gold, KL (k1, summed over the response) and, given reward_fn, its score;
        the texts; the share that stopped. batch_size prompts per pass (each pass its own draws). Always in fp32:
        a --bf16 run's policy (its forward wrapped in autocast, detail 53) is measured by its class's forward,
        its weights as an fp32 run's are, and its wrapper put back after."""
        autocast = vars(policy).pop("forward", None)
        try:
            return self.measure_fp32(policy, samples_per_prompt, reward_fn, batch_size)
        finally:
            if autocast is not None:
                policy.forward = autocast

    @torch.inference_mode()
    def measure_fp32(self, policy, samples_per_prompt: int, reward_fn, batch_size: int) -> dict:
        args, tokenizer = self.args, self.tokenizer
        prompts = [p for p in self.prompts for _ in range(samples_per_prompt)]
        was_training = policy.training
        policy.eval()
        gold, kl, proxy, texts, stopped = [], [], [], [], []
        with torch.random.fork_rng():
            torch.manual_seed(self.common.eval_seed)
            for i in range(0, len(prompts), batch_size):
                batch = prompts[i : i + batch_size]
                queries = tokenizer(batch, padding=True, truncation=True, max_length=args.max_query_length,
                                    return_tensors="pt")["input_ids"]
                responses, _ = dpo.generate(policy, queries, args.response_length, args.temperature,
                                            tokenizer.pad_token_id)
                responses, response_mask, contain_stop = dpo.truncate_after_stop_token(
                    responses, self.stop_token_id, tokenizer.pad_token_id, args.min_response_length)
                query_responses = torch.cat([queries, responses], dim=1)
                mask = torch.cat([torch.zeros_like(queries, dtype=torch.bool), response_mask], dim=1)
                if policy is self.reference:  # the KL is 0: best-of-n's samples, the initial point
                    kl += [0.0] * len(batch)
                else:
                    logps = [dpo.sequence_logps(model, query_responses, query_responses != tokenizer.pad_token_id,
                                                mask, args.temperature, tokenizer.pad_token_id)[0]
                             for model in (policy, self.reference)]
                    kl += (logps[0] - logps[1]).tolist()
                full = tokenizer.batch_decode(query_responses, skip_special_tokens=True)
                response_texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
                gold += self.gold_fn(full, response_texts).float().tolist()
                if reward_fn is not None:
                    proxy += reward_fn(full, response_texts).float().tolist()
                texts += response_texts
                stopped += contain_stop.tolist()
        policy.train(was_training)
        shape = (len(self.prompts), samples_per_prompt)
        out = {"gold": np.array(gold).reshape(shape), "kl": np.array(kl).reshape(shape), "texts": texts,
               "stop_share": float(np.mean(stopped))}
        if reward_fn is not None:
            out["proxy"] = np.array(proxy).reshape(shape)
        return out

    def point(self, policy) -> dict:
        """One point of the frontier: gold and KL, means and standard errors over prompts."""
        m = self.measure(policy, self.common.samples_per_prompt)
        gold, gold_se, gold_prompts = over_prompts(m["gold"])
        kl, kl_se, _ = over_prompts(m["kl"])
        return {"gold": gold, "gold_se": gold_se, "kl": kl, "kl_se": kl_se, "stop_share": m["stop_share"],
                "gold_per_prompt": gold_prompts, "example": m["texts"][0]}


# ----------------------------------------------------------------------------------------------- the runs


def initial_point(frontier: Frontier, runs: str) -> dict:
    """The initial policy's point, measured once and shared by every run (KL 0 by construction)."""
    path = os.path.join(runs, "initial.json" if frontier.common.split != "fresh" else "initial_fresh.json")
    if not os.path.exists(path):
        write_json(path, {**frontier.point(frontier.reference), "common": dataclasses.asdict(frontier.common)})
    return read_json(path)


def timed(fn, cpu: list):  # fn, each call's CPU time appended to cpu: an evaluation, left out of the run's
    def call(*args, **kwargs):
        start = time.process_time()
        result = fn(*args, **kwargs)
        cpu.append(time.process_time() - start)
        return result
    return call


class StopRun(Exception):
    """Raised by the evaluation at a tuning run's first point at KL >= its stop_kl: the run ends there."""


@contextlib.contextmanager
def measured_by(frontier: Frontier, module, initial: dict, points: list, cpu: list, stop_kl: float | None = None):
    """Replace the script's held-out evaluation by frontier.point for the run (restored after); the first call (step
    0, the initial policy) returns the shared initial point, in a dict with the keys the script logs and prints.
    With stop_kl, the first point at KL >= stop_kl ends the run (StopRun)."""
    name, begun = MEASURED[module], time.process_time()
    original, accuracy = getattr(module, name), dpo.evaluate_comparisons

    def evaluation(policy, *args, **kwargs):  # each point with the CPU minutes trained before it
        spent = (time.process_time() - begun - sum(cpu)) / 60
        point = {**(initial if not points else frontier.point(policy)), "cpu_minutes": spent}
        points.append(point)
        if stop_kl is not None and point["kl"] >= stop_kl:
            raise StopRun
        return {"raw_score_mean": point["gold"], "raw_score_stderr": point["gold_se"], "samples": [],
                "stop_share": point["stop_share"], "prompts": len(point["gold_per_prompt"]), "kl_mean": point["kl"],
                "kl_stderr": point["kl_se"], "gold_scores_mean": point["gold"], "gold_scores_stderr": point["gold_se"]}

    setattr(module, name, timed(evaluation, cpu))
    # DPO's held-out accuracy: kept, its time not counted
    dpo.evaluate_comparisons = timed(accuracy, cpu) if module is dpo else accuracy
    try:
        yield
    finally:
        setattr(module, name, original)
        dpo.evaluate_comparisons = accuracy


def script_args(module, flags: str, seed: int, common: Common, runs_dir: str):
    """The script's Args from its command line (tyro, as the script reads it): the setting's flags, the common
    flags, the model and the seed; and that command as the records print it (without --runs-dir)."""
    command = f"{flags} {common.flags} --model-name {common.model_name} --seed {seed}"
    args = tyro.cli(module.Args, args=shlex.split(f"{command} --runs-dir {runs_dir}"),
                    prog=os.path.basename(module.__file__))
    return args, f"python {os.path.basename(module.__file__)} {command}"


def planned_steps(module, args) -> int:
    """The optimizer steps (DPO) or iterations (RL) a run's flags give it, as the script counts them."""
    if module is not dpo:
        return args.num_iterations  # computed by the script's check_args
    comparisons = dpo.read_preferences(args.preferences, args)
    train, _ = dpo.split_comparisons([c["prompt"] for c in comparisons], args.eval_fraction,
                                     args.seed if args.split_seed is None else args.split_seed)
    return args.num_epochs * (len(train) // args.batch_size)


def train_and_measure(frontier: Frontier, initial: dict, method: str, setting: str, seed: int, flags: str,
                      common: Common, stop_kl: float | None = None) -> dict:
    """One run of a script, measured along the way; the record of its points, steps and CPU time. With stop_kl (a
    tuning run), the run ends at its first point at KL >= stop_kl, and the record says so."""
    module = METHODS[method][0]
    args, command = script_args(module, flags, seed, common, os.path.join(ROOT, common.runs, method, "tensorboard"))
    points, eval_cpu, stopped = [], [], False
    start = time.process_time()
    with measured_by(frontier, module, initial, points, eval_cpu, stop_kl):
        try:
            result = module.main(args)
        except StopRun:
            result, stopped = {"run_dir": None}, True
    cpu = time.process_time() - start - sum(eval_cpu)
    last = result["steps"] if module is dpo and not stopped else planned_steps(module, args)
    steps = [*range(0, last, args.eval_every), last]
    steps = steps[: len(points)] if stopped else steps
    if len(steps) != len(points):
        raise RuntimeError(f"{method} {setting} seed {seed}: {len(points)} evaluations for steps {steps}: the "
                           "run was interrupted or the script evaluates at other steps")
    unit = "comparisons" if module is dpo else "episodes"
    for step, point in zip(steps, points):
        point.update(step=step, **{unit: step * args.batch_size})
    record = dict(method=method, setting=setting, seed=seed, command=command, cpu_minutes=cpu / 60, points=points,
                  run_dir=result["run_dir"], split=common.split)
    if stop_kl is not None:
        record["stop_kl"], record["stopped"] = stop_kl, stopped
    if module is dpo and not stopped:
        record["held_out_accuracy"] = [result["eval_accuracy"], result["eval_accuracy_stderr"]]
    return record


def best_of_n_record(frontier: Frontier, reward_model: str, largest: int) -> dict:
    """Best-of-n on the reward model: N samples per prompt from the initial policy, scored by gold and the
    reward model; each n's expected gold over all n-subsets, its KL bound."""
    reward_fn = rlhf.load_reward_fn(rlhf.Args(reward_model=reward_model, cuda=False), frontier.device)
    start = time.process_time()
    m = frontier.measure(frontier.reference, largest, reward_fn, batch_size=64)  # no KL to compute: larger
    points, n = [], 1
    while n <= largest:
        _, gold = shared.best_of_n(m["proxy"], m["gold"], n)
        points.append({"n": n, "kl": float(shared.best_of_n_kl(n)), "gold": float(gold.mean()),
                       "gold_se": float(gold.std(ddof=1) / math.sqrt(len(gold)))})
        n *= 2
    return {"method": BEST_OF_N, "setting": f"N {largest}", "seed": 0, "points": points,
            "cpu_minutes": (time.process_time() - start) / 60, "reward_model": reward_model,
            "proxy_gold_correlation": float(np.corrcoef(m["proxy"].ravel(), m["gold"].ravel())[0, 1])}


def run_reward_model(args: RewardModel) -> dict:
    """reward_model_gpt2.py on the preference file, once (again where the record's model folder is missing); its
    record (folder, held-out accuracy, CPU time)."""
    path = os.path.join(ROOT, args.runs, "reward_model.json")
    if os.path.exists(path) and os.path.isdir(read_json(path)["model_path"]):
        print(f"{path} exists: skipped")
        return read_json(path)
    if os.path.exists(path):  # a record from another machine: its model (not committed) is trained again here
        print(f"{path}: its model {read_json(path)['model_path']} is not on this machine: training it again")
    check_file(args.preferences)
    flags = f"--preferences {args.preferences} {args.rm_flags}"
    rm_args, command = script_args(rm, flags, 1, args, os.path.join(ROOT, args.runs, "reward_model"))
    start, eval_cpu = time.process_time(), []
    # the held-out passes, as DPO's, not counted
    with mock.patch.object(rm, "evaluate_comparisons", timed(rm.evaluate_comparisons, eval_cpu)):
        result = rm.main(rm_args)
    record = {"model_path": result["model_path"], "held_out_accuracy": result["eval_accuracy"],
              "command": command, "cpu_minutes": (time.process_time() - start - sum(eval_cpu)) / 60,
              "eval_cpu_minutes": sum(eval_cpu) / 60, "preferences": args.preferences}
    write_json(path, record)
    return record


def reward_model_path(args, methods) -> str | None:
    """The saved reward model's folder, for the methods that need it (a clear error if not trained yet)."""
    rm_record = os.path.join(ROOT, args.runs, "reward_model.json")
    needs_rm = set(methods) & {"ppo", "grpo", BEST_OF_N}
    if needs_rm and not os.path.exists(rm_record):
        raise SystemExit(f"error: --methods {' '.join(sorted(needs_rm))} need the reward model: run "
                         "`python experiments/rlhf_frontier.py reward-model` first")
    return read_json(rm_record)["model_path"] if needs_rm else None


def run_settings(frontier: Frontier, initial: dict, method: str, settings: dict, seeds, args, reward_model,
                 stop_kl: float | None = None) -> None:
    """Each setting's runs at each seed, measured; a record each in <args.runs>/<method>/, skipped if it exists."""
    for setting, flags in settings.items():
        for seed in seeds:
            path = os.path.join(ROOT, args.runs, method, f"{setting.replace(' ', '_')}__{seed}.json")
            if os.path.exists(path):
                print(f"{path} exists: skipped")
                continue
            print(f"== {method}, {setting}, seed {seed}", flush=True)
            record = train_and_measure(frontier, initial, method, setting, seed,
                                       flags.format(rm=reward_model, prefs=args.preferences), args, stop_kl)
            write_json(path, record)


def run(args: Run) -> None:
    check_file(args.preferences)
    unknown = set(args.methods) - set(METHODS) - {BEST_OF_N}
    if unknown:
        raise SystemExit(f"error: --methods {' '.join(sorted(unknown))}: not one of {[*METHODS, BEST_OF_N]}")
    if args.tuned:
        chosen = tuned_settings(os.path.join(ROOT, args.runs, "tuning"), [m for m in args.methods if m in TUNING])
    if args.searched:  # the search's choices, measured on the prompts no run read before (split "fresh")
        chosen = searched_settings(os.path.join(ROOT, args.runs, "tuning"), [m for m in args.methods if m in SEARCH])
        args = dataclasses.replace(args, split="fresh")
    reward_model = reward_model_path(args, args.methods)
    torch.set_num_threads(1)  # as the scripts' --num-threads 1: best-of-n runs in this process
    frontier = Frontier(args)
    initial = initial_point(frontier, os.path.join(ROOT, args.runs))
    if BEST_OF_N in args.methods:
        path = os.path.join(ROOT, args.runs, BEST_OF_N, f"N{args.best_of_n}.json")
        if not os.path.exists(path):
            write_json(path, best_of_n_record(frontier, reward_model, args.best_of_n))
    for method in [m for m in METHODS if m in args.methods]:
        if args.searched:
            settings = {chosen[method]: FLAGS[method](**protocol.parse_setting(chosen[method], SEARCH[method]))
                        } if method in chosen else {}
        elif args.tuned:
            settings = {chosen[method]: TUNING[method][chosen[method]]} if method in chosen else {}
        else:
            settings = {k: v for k, v in METHODS[method][1].items() if not args.settings or k in args.settings}
        if args.bf16:
            settings = {f"{k} bf16": f"{v} --bf16" for k, v in settings.items()}
        run_settings(frontier, initial, method, settings, args.seeds, args, reward_model)


def tune(args: Tune) -> None:
    """Each method's grid, one run a setting at protocol.TUNING_SEED, on the validation prompts, each stopped at
    its first point at KL >= STOP_KL; records in <runs>/tuning/."""
    check_file(args.preferences)
    unknown = set(args.methods) - set(TUNING)
    if unknown:
        raise SystemExit(f"error: --methods {' '.join(sorted(unknown))}: not one of {[*TUNING]}")
    if args.split != "validation":
        raise SystemExit(f"error: --split {args.split}: the tuning runs read the validation prompts only")
    reward_model = reward_model_path(args, args.methods)
    tuning = dataclasses.replace(args, runs=os.path.join(args.runs, "tuning"))
    torch.set_num_threads(1)
    frontier = Frontier(tuning)
    initial = initial_point(frontier, os.path.join(ROOT, tuning.runs))
    for method in args.methods:
        settings = {k: v for k, v in TUNING[method].items() if not args.settings or k in args.settings}
        run_settings(frontier, initial, method, settings, [protocol.TUNING_SEED], tuning, reward_model, STOP_KL)


def search(args: Search) -> None:
    """Each method's search (protocol.search over SEARCH) on the validation prompts, each run stopped at its first
    point at KL >= STOP_KL; records in <runs>/tuning/, where TUNING's count as the search's."""
    check_file(args.preferences)
    unknown = set(args.methods) - set(SEARCH)
    if unknown:
        raise SystemExit(f"error: --methods {' '.join(sorted(unknown))}: not one of {[*SEARCH]}")
    reward_model = reward_model_path(args, args.methods)
    tuning = dataclasses.replace(args, runs=os.path.join(args.runs, "tuning"), split="validation")
    torch.set_num_threads(1)
    frontier = Frontier(tuning)
    initial = initial_point(frontier, os.path.join(ROOT, tuning.runs))

    def run(todo):
        for method, setting, seed in todo:
            flags = {setting: FLAGS[method](**protocol.parse_setting(setting, SEARCH[method]))}
            run_settings(frontier, initial, method, flags, [seed], tuning, reward_model, STOP_KL)

    protocol.search({m: SEARCH[m] for m in args.methods},
                    lambda method: search_results(os.path.join(ROOT, tuning.runs), method), run)


def search_results(tuning_runs: str, method: str) -> tuple[dict, dict]:
    """protocol.next_runs's view of a method's tuning records: ({setting: (validation gold at KL STOP_KL, CPU
    minutes to it)} at TUNING_SEED, {setting: gold} at SECOND_SEED); None where a run never reached STOP_KL."""
    first, second = {}, {}
    for path in sorted(glob.glob(os.path.join(tuning_runs, method, "*.json"))):
        r = read_json(path)
        if r["seed"] == protocol.TUNING_SEED:
            first[r["setting"]] = (gold_at_kl(r["points"], STOP_KL), cpu_at_kl(r, STOP_KL))
        elif r["seed"] == protocol.SECOND_SEED:
            second[r["setting"]] = gold_at_kl(r["points"], STOP_KL)
    return protocol.in_grid_order(SEARCH[method], first), second


def searched_settings(tuning_runs: str, methods) -> dict[str, str]:
    """Each method's setting by the protocol's rule over its search's first seed, once the search is done."""
    return protocol.searched_choices(SEARCH, lambda method: search_results(tuning_runs, method), methods,
                                     "python experiments/rlhf_frontier.py search")


def tuning_table(tuning_runs: str, method: str) -> list[dict]:
    """A method's tuning runs in its grid's order: setting, validation gold at KL STOP_KL (None: not reached),
    CPU minutes to it, the run's CPU minutes, its last point; missing runs left out."""
    rows = []
    for setting in TUNING[method]:
        path = os.path.join(tuning_runs, method, f"{setting.replace(' ', '_')}__{protocol.TUNING_SEED}.json")
        if os.path.exists(path):
            r = read_json(path)
            rows.append({"setting": setting, "gold": gold_at_kl(r["points"], STOP_KL),
                         "cpu_at": cpu_at_kl(r, STOP_KL), "cpu_minutes": r["cpu_minutes"], "last": r["points"][-1]})
    return rows


def tuned_settings(tuning_runs: str, methods) -> dict[str, str]:
    """Each method's setting by the protocol's rule, once its whole grid has run (else a clear error)."""
    chosen = {}
    for method in methods:
        rows = tuning_table(tuning_runs, method)
        if len(rows) < len(TUNING[method]):
            raise SystemExit(f"error: --tuned: {len(rows)} of {method}'s {len(TUNING[method])} tuning runs are "
                             "recorded; run `python experiments/rlhf_frontier.py tune` first")
        chosen[method] = protocol.choose({r["setting"]: r["gold"] for r in rows},
                                         {r["setting"]: r["cpu_at"] for r in rows},
                                         {r["setting"]: r["last"]["gold"] for r in rows})
    return chosen


def list_prompts(args: Prompts) -> str:
    """`prompts`: the search's test prompts (--split fresh) and, for each split, how many recorded runs read it;
    a clear error if a fresh prompt is also a validation, earlier test, training or preference-file prompt."""
    check_file(args.preferences)
    fresh, records = shared.FRESH_TEST_PROMPTS, {}
    for path in sorted(glob.glob(os.path.join(ROOT, args.runs, "**", "*.json"), recursive=True)):
        record = read_json(path)
        if "points" in record and record.get("method") != BEST_OF_N:  # best-of-n: the earlier test prompts
            tuning = os.path.basename(os.path.dirname(os.path.dirname(path))) == "tuning"
            records.setdefault(record.get("split", "validation" if tuning else "test"), []).append(record)
    others = {"validation": shared.VALIDATION_PROMPTS, "earlier test": shared.load_eval_prompts(None, 64),
              "training": rlhf.PROMPTS + rlhf.EVAL_PROMPTS,
              "preference file": [json.loads(line)["prompt"] for line in open(args.preferences) if line.strip()]}
    if len(set(fresh)) != len(fresh):
        raise SystemExit(f"error: the fresh test prompts repeat {len(fresh) - len(set(fresh))} of themselves")
    for name, prompts in others.items():
        both = {p.strip() for p in fresh} & {p.strip() for p in prompts}
        if both:
            raise SystemExit(f"error: {len(both)} fresh test prompts are {name} prompts too: {sorted(both)[0]!r}")
    lines = [f"{len(fresh)} fresh test prompts (--split fresh), distinct, none a validation, earlier test, training "
             f"or preference-file prompt; recorded runs under {args.runs} by the prompts they read: " + ", ".join(
                 f"{split} {len(rs)}" + (f" (seeds {sorted({r['seed'] for r in rs})})" if split == "fresh" else "")
                 for split, rs in sorted(records.items())), *fresh]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------- report


def frontier_rows(records: list[dict]) -> list[dict]:
    """One row per method and setting: the gold at each KL target over its seeds, and its CPU minutes."""
    rows = {}
    for r in records:  # the fresh test prompts' runs are rows of their own
        rows.setdefault((r["method"], r["setting"] + " (fresh)" * (r.get("split") == "fresh")), []).append(r)
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


def test_lines(chosen: dict, records: list[dict], tuning: dict, rm_minutes: float | None, split: str) -> list[str]:
    """Each method's chosen setting at its test seeds (records of `split`): gold at KL 3 over seeds, CPU minutes
    to it, the tuning's runs and CPU minutes (tuning {method: (runs text, minutes)}) and all in (the tuning, the
    reward model the RL methods need, one run to KL 3); then the differences between methods."""
    lines = ["| method | chosen setting | test seeds | gold at KL 3 | per-point SE | CPU minutes to KL 3 | "
             "tuning: runs, CPU minutes | all in |", "|---" * 8 + "|"]
    tested, all_in = {}, {}
    for m, (runs_text, tuning_minutes) in tuning.items():
        if m not in chosen:
            lines.append(f"| {m} | (tuning runs missing) | - | - | - | - | {runs_text}, {tuning_minutes:.1f} | - |")
            continue
        seeds = [r for r in records if (r["method"], r["setting"]) == (m, chosen[m]) and r.get("split", "test")
                 == split and r["seed"] not in (protocol.TUNING_SEED, protocol.SECOND_SEED)]
        golds = [gold_at_kl(r["points"], 3.0) for r in seeds]
        if not seeds or None in golds:
            lines.append(f"| {m} | {chosen[m]} | " + (f"{len(seeds)}, not all reach KL 3" if seeds else "none yet")
                         + f" | - | - | - | {runs_text}, {tuning_minutes:.1f} | - |")
            continue
        tested[m] = golds
        mean, half, _ = mean_interval(golds)
        gold = f"{mean:.3f} ± {half:.3f}" if len(golds) > 1 else f"{mean:.3f} (one seed, no interval)"
        se = np.mean([float(at_kl(r["points"], 3.0, "gold_se")) for r in seeds])
        cpu = [cpu_at_kl(r, 3.0) for r in seeds]
        needs_rm = m != "dpo"
        if None not in cpu and (rm_minutes is not None or not needs_rm):
            all_in[m] = tuning_minutes + (rm_minutes if needs_rm else 0.0) + np.mean(cpu)
        lines.append(f"| {m} | {chosen[m]} | {', '.join(str(r['seed']) for r in seeds)} | {gold} | "
                     f"{se:.3f} | " + ("-" if None in cpu else f"{np.mean(cpu):.1f}") +
                     f" | {runs_text}, {tuning_minutes:.1f} | " + (f"{all_in[m]:.1f}" if m in all_in else "-") + " |")
    tested = {m: golds for m, golds in tested.items() if len(golds) > 1}  # an interval needs two seeds
    if len(tested) > 1:
        lines += ["", "Differences at KL 3 on the test prompts, 95% Welch intervals over seeds:", ""]
        for a, b in itertools.combinations(tested, 2):
            d, h = difference_interval(tested[a], tested[b])
            lines.append(f"- {a} minus {b}: {d:+.3f} ± {h:.3f}" + ("" if abs(d) > h else " (inconclusive)"))
    if "dpo" in all_in and "ppo" in all_in:
        lines += ["", f"All in, DPO's CPU minutes are {all_in['dpo'] / all_in['ppo']:.1%} of PPO's (the goal: at most "
                  "a quarter, with DPO's gold at KL 3 at least PPO's)."]
    return lines


def tuned_lines(tuning_runs: str, records: list[dict], rm_minutes: float | None = None) -> list[str]:
    """The page's part on the tuning: each method's chosen setting on the test prompts (its test seeds), the
    differences between them, what a user pays to reach KL 3 (the tuning runs, the reward model the RL methods
    need, one run), and each grid's validation runs."""
    tables = {m: tuning_table(tuning_runs, m) for m in TUNING}  # each grid's recorded runs, read once
    methods = [m for m in TUNING if tables[m]]
    if not methods:
        return []
    chosen = tuned_settings(tuning_runs, [m for m in methods if len(tables[m]) == len(TUNING[m])])
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
    tuning = {m: (f"{len(tables[m])}/{len(TUNING[m])}", sum(r["cpu_minutes"] for r in tables[m])) for m in methods}
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
    """The page's part on the search (SEARCH): the rule, each method's search (protocol.search_report: its runs,
    choice, edges, second seed), then each choice at FRESH_SEEDS on the fresh test prompts (test_lines)."""
    runs = {m: [read_json(p) for p in sorted(glob.glob(os.path.join(tuning_runs, m, "*.json")))] for m in SEARCH}
    if not any(r["setting"] not in TUNING.get(m, ()) for m in SEARCH for r in runs[m]):
        return []  # the search has not begun beyond the earlier grids
    results = {m: search_results(tuning_runs, m) for m in SEARCH}
    lines = ["## The search, then the fresh test prompts", "",
             protocol.rule_text(f"validation gold at KL {STOP_KL:g}", f"CPU minutes to KL {STOP_KL:g}",
                                f"{protocol.TIE} gold") +
             f" Each run on the {len(shared.VALIDATION_PROMPTS)} validation prompts, stopped at its first point at "
             f"KL >= {STOP_KL:g}; a setting that never reaches it is chosen only if none does. Runs marked (earlier) "
             "ran before the search's grids were written (the grids of `TUNING`). The choices then run at seeds "
             f"{', '.join(map(str, FRESH_SEEDS))} on {len(shared.FRESH_TEST_PROMPTS)} test prompts written before the "
             "search and read by no run before (`--split fresh`).", ""]
    tuning, chosen = {}, {}
    for m, (first, second) in results.items():
        if not first:
            continue
        minutes = sum(r["cpu_minutes"] for r in runs[m])
        lines += protocol.search_report(m, SEARCH[m], first, second, minutes, f"validation gold at KL {STOP_KL:g}",
                                        f"CPU minutes to KL {STOP_KL:g}", lambda v: "not reached" if v is None
                                        else f"{v:.3f}", set(TUNING.get(m, ())))
        tuning[m] = (f"{len(runs[m])}", minutes)
        if not protocol.next_runs(SEARCH[m], first, second):
            chosen[m] = protocol.first_choice(first)
    return lines + ["The choices on the fresh test prompts (gold at KL 3: mean over seeds, 95% t-interval):", "",
                    *test_lines(chosen, records, tuning, rm_minutes, "fresh"), ""]


def report(args: Report) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = os.path.join(ROOT, args.runs)
    records = [read_json(p) for p in sorted(glob.glob(os.path.join(runs, "*", "*.json")))
               if os.path.basename(os.path.dirname(p)) in [*METHODS, BEST_OF_N]]
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
        last = [r["points"][-1] for r in records if (r["method"], r["setting"]) == (row["method"], row["setting"])]
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
    for r in {(r["method"], r["setting"]): r for r in records if "command" in r}.values():
        command = r["command"].replace(f" --seed {r['seed']}", " --seed 1")
        # the paths of the machine a run ran on, as the page names them
        command = re.sub(r"--reward-model \S*/reward_model_gpt2__\d+__\d+/model", "--reward-model reward_model/model",
                         command)
        if rm_record:
            command = command.replace(rm_record["preferences"], os.path.basename(rm_record["preferences"]))
        lines.append(f"- {r['method']}, {r['setting']}: `{command}`")
    rows = {(r["method"], r["setting"]): r for r in frontier_rows(records) if len(r["seeds"]) > 1}
    lines += ["", "Over seeds, where two settings each have two or more seeds and all of them reach the KL: DPO's "
              "gold minus theirs, the mean over seeds and its 95% Welch interval:", ""]
    bf16_lines = []  # each setting run with --bf16 against the same setting in fp32
    for (a, b), target in itertools.product(itertools.permutations(rows, 2), KL_TARGETS):
        ga, gb = ([gold_at_kl(r["points"], target) for r in records if (r["method"], r["setting"]) == key]
                  for key in (a, b))
        same_precision = a[1].endswith(" bf16") == b[1].endswith(" bf16")
        if a[0] == "dpo" != b[0] and same_precision and None not in ga + gb:
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


# -------------------------------------------------------------------------------------------------- plumbing


def check_file(path: str) -> None:
    if not os.path.isfile(path):
        raise SystemExit(f"error: --preferences {path}: no such file (reward_model_gpt2.py --gold vader writes "
                         "one: <run dir>/preferences.jsonl)")


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def write_json(path: str, record: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)  # a record exists only whole: an interrupted run is redone



if __name__ == "__main__":
    sub = tyro.conf.subcommand
    args = tyro.cli(Union[Annotated[RewardModel, sub("reward-model")], Annotated[Tune, sub("tune")],
                          Annotated[Search, sub("search")], Annotated[Run, sub("run")],
                          Annotated[Prompts, sub("prompts")], Annotated[Report, sub("report")]])
    {RewardModel: run_reward_model, Tune: tune, Search: search, Run: run, Prompts: lambda a: print(list_prompts(a)),
     Report: lambda a: print(report(a))}[type(args)](args)

