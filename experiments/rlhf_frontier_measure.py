"""How rlhf_frontier.py measures a method: one evaluation for every method, and a script's run in this process
with its held-out evaluation replaced by it.

One evaluation (`Frontier.measure`): --samples-per-prompt responses to each of --num-prompts prompts (the split's:
shared.py's), sampled as the RL files sample (dpo_gpt2.generate) from one seeded random stream (the same draws at
every point); the gold of prompt + response, the KL to the initial policy from the sampled tokens,
sum_t log pi(y_t) - log pi_ref(y_t) (k1); means over prompts of each prompt's mean, standard errors over prompts.
A script runs unchanged in this process (`train_and_measure`), its held-out evaluation (ppo_rlhf_gpt2.evaluate,
grpo_gpt2.evaluate, dpo_gpt2.evaluate_samples) replaced by the measure at its --eval-every points (the first, step
0, the initial point all runs share). CPU time: the process time minus the measure's and the held-out accuracy's
(DPO's, the reward model's); also before each point. A run's gold (and CPU time) at a KL (`at_kl`): linear between
its first point at or past the KL and the one before. Best-of-n (`best_of_n_record`): on the initial policy's
samples, no training.
"""

import contextlib
import dataclasses
import json
import math
import os
import shlex
import sys
import time

import numpy as np
import torch
import tyro

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "experiments")]
import dpo_gpt2 as dpo  # noqa: E402
import grpo_gpt2 as grpo  # noqa: E402
import ppo_rlhf_gpt2 as rlhf  # noqa: E402
import shared  # noqa: E402  (the prompt sets and the best-of-n math)

MEASURED = {dpo: "evaluate_samples", rlhf: "evaluate", grpo: "evaluate"}  # the evaluation each script calls
BEST_OF_N = "best_of_n"

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

    def __init__(self, common):  # rlhf_frontier.Common: the model, the prompts and the evaluation's seed
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


def script_args(module, flags: str, seed: int, common, runs_dir: str):
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


def train_and_measure(frontier: Frontier, initial: dict, module, method: str, setting: str, seed: int, flags: str,
                      common, stop_kl: float | None = None) -> dict:
    """One run of a script (module: dpo_gpt2, ppo_rlhf_gpt2 or grpo_gpt2), measured along the way; the record of
    its points, steps and CPU time. With stop_kl (a tuning run), the run ends at its first point at KL >= stop_kl,
    and the record says so."""
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


