"""The reward-KL frontier of DPO, PPO and GRPO on a learned reward model, PPO on the gold, and best-of-n.

The DPO paper's figure (Rafailov et al. 2023, arXiv:2305.18290, Fig. 2) at this project's scale: from one file of
comparisons labeled by a gold scorer, which method buys the most gold for a given KL to the initial policy? Every
method starts from --model-name and sees the same comparisons, directly (dpo_gpt2.py) or through the reward model
learned from them (reward_model_gpt2.py, then ppo_rlhf_gpt2.py or grpo_gpt2.py); PPO on the gold shows what the
reward model stands in for; best-of-n on it, the frontier with no training. Every run is measured by one evaluation
(rlhf_frontier_measure.py: gold and KL to the initial policy at the run's --eval-every points, means and standard
errors over prompts, CPU time without the evaluation); each run's gold at KL 1, 2, 3 and 6 nats, over seeds the mean
and a 95% t-interval, DPO minus each other method a 95% Welch one (rlhf_frontier_report.py writes the page).

Usage (from the repository root; each step skips the runs whose record exists, so it can span sittings):
    python experiments/rlhf_frontier.py reward-model --preferences vader_2000.jsonl
    python experiments/rlhf_frontier.py run --preferences vader_2000.jsonl --methods dpo ppo --seeds 1 2 3
    python experiments/rlhf_frontier.py tune --preferences vader_2000.jsonl     # each grid, validation prompts
    python experiments/rlhf_frontier.py run --preferences vader_2000.jsonl --tuned --seeds 4 5 6   # its choices
    python experiments/rlhf_frontier.py run --preferences vader_2000.jsonl --tuned --seeds 4 5 6 --bf16
    python experiments/rlhf_frontier.py search --preferences vader_2000.jsonl   # protocol.py's search
    python experiments/rlhf_frontier.py run --preferences vader_2000.jsonl --searched --seeds 7 8 9
    python experiments/rlhf_frontier.py prompts --preferences vader_2000.jsonl  # the fresh test prompts
    python experiments/rlhf_frontier_report.py
Records go to --runs (experiments/runs/rlhf_frontier/<method>/<setting>__<seed>.json); the report writes
docs/results/rlhf_frontier.{md,png}, keeping what is above a line `<!-- generated -->` in the page.
"""

import dataclasses
import glob
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Annotated, Union
from unittest import mock

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
import shared  # noqa: E402  (the prompt sets)
from rlhf_frontier_measure import (BEST_OF_N, Frontier, best_of_n_record, check_file, cpu_at_kl,  # noqa: E402
                                   gold_at_kl, initial_point, read_json, script_args, timed, train_and_measure,
                                   write_json)

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
    # above 128 responses an iteration, micro-batches of 16 (memory only: the same update, detail 6; batch 256's
    # first run, at seed 100, took micro-batches of 32: 16 let its second seed run beside another PPO run)
    "ppo": lambda lr, kl_coef, batch: f"--reward-model {{rm}} --kl-coef {kl_coef} --kl-target None --learning-rate "
                                      f"{lr} --batch-size {batch} --total-episodes {20 * int(batch)} {TUNE_RL}"
                                      + (f" --gradient-accumulation-steps {int(batch) // 64}" if int(batch) > 128
                                         else ""),
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


# ----------------------------------------------------------------------------------------------- the runs


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
            record = train_and_measure(frontier, initial, METHODS[method][0], method, setting, seed,
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


if __name__ == "__main__":
    sub = tyro.conf.subcommand
    args = tyro.cli(Union[Annotated[RewardModel, sub("reward-model")], Annotated[Tune, sub("tune")],
                          Annotated[Search, sub("search")], Annotated[Run, sub("run")],
                          Annotated[Prompts, sub("prompts")]])
    {RewardModel: run_reward_model, Tune: tune, Search: search, Run: run,
     Prompts: lambda a: print(list_prompts(a))}[type(args)](args)

