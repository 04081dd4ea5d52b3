"""PPO against GRPO and RLOO at an equal budget of sampled completions, on two-digit sums.

The task is `--reward-model arithmetic --arithmetic-digits 2`: "What is 27 + 30? The answer is", +1 if the
first number of the response is the sum, else -1, on SmolLM2-135M-Instruct. Every method gets the same model,
temperature (0.7), response length (8 tokens), stop token (".") and number of sampled completions
(--total-episodes), and is evaluated the same way: held-out accuracy on 256 distinct held-out problems, one
sampled response each, every 2 iterations of 64 completions. The methods (METHODS below, the exact flags):
    ppo:        ppo_rlhf_gpt2.py with the flags of docs/results/rlhf_arithmetic.md (its defaults otherwise)
    grpo:       grpo_gpt2.py with its defaults: the original GRPO (per-response mean, std scaling, k3 at 0.04)
    dr_grpo:    grpo_gpt2.py --loss-type dr_grpo --scale-rewards none --beta 0 (no reference model)
    grpo_ppo_update: GRPO's defaults with PPO's update: --update-epochs 4 --num-minibatches 4, lr 1.41e-5
    grpo_tuned, rloo: the GRPO schedule and the RLOO run that the tuning runs chose (TUNING, its rule below)

Each run is the script itself in a subprocess (one torch thread), so that its peak resident memory and CPU
seconds are its own (os.wait4); runs go side by side, --jobs at a time, so that their wall-clock times compare.
Subcommands:
    python experiments/ppo_vs_grpo.py tune --jobs 2            # GRIDS, on the validation split, one seed
    python experiments/ppo_vs_grpo.py tune --methods rloo --jobs 1     # one method's grid (GRIDS' keys)
    python experiments/ppo_vs_grpo.py run --tuned --seeds 7 8 9 10 11 12 --jobs 2   # the rule's choices
    python experiments/ppo_vs_grpo.py run --tuned --equal-cpu --seeds 7 8 9 10 11 12   # at PPO's time
    python experiments/ppo_vs_grpo.py tune --earlier-grid --jobs 2    # TUNING, the earlier grid of GRPO and RLOO
    python experiments/ppo_vs_grpo.py run --methods ppo grpo_tuned rloo --seeds 1 2 3 4 5 6 --jobs 2
    python experiments/ppo_vs_grpo.py search --jobs 2   # protocol.py's search (SEARCH), on the validation split
    python experiments/ppo_vs_grpo.py run --searched --seeds 13 14 15 16 17 18   # its choices, on the test split
    python experiments/ppo_vs_grpo.py problems   # the test split's sums, and the held-out sums runs read before
`run`, `tune` and `search` append one record a run (method, seed, command, run folder, peak memory, wall-clock and
CPU seconds) to <runs>/records.jsonl and skip the runs recorded there already. The page:
`python experiments/ppo_vs_grpo_report.py --runs RUNS` (the records and each run's TensorBoard log).
"""

import argparse
import json
import os
import re
import shlex
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ppo_rlhf_gpt2 as rlhf  # noqa: E402  (the sums' splits)
import protocol  # noqa: E402  (the tuning rule and budget)
from runner import (ROOT, command_of, exp_name, flag_dict, last_mean, merge_flags, read_scalars,  # noqa: E402, F401
                    recorded, run_all, run_items)

COMMON = ("--model-name models/smollm2-135m --reward-model arithmetic --arithmetic-digits 2 "
          "--response-length 8 --min-response-length 0 --batch-size 64 --total-episodes 512 "
          "--eval-episodes 256 --eval-every 2 --no-cuda")
METHODS = {
    "ppo": "ppo_rlhf_gpt2.py",
    "grpo": "grpo_gpt2.py",
    "dr_grpo": "grpo_gpt2.py --loss-type dr_grpo --scale-rewards none --beta 0",
    # GRPO with PPO's update: 4 passes over 4 minibatches a batch (16 steps, PPO's) at PPO's learning rate
    "grpo_ppo_update": "grpo_gpt2.py --update-epochs 4 --num-minibatches 4 --gradient-accumulation-steps 1 "
                       "--learning-rate 1.41e-5",
    # the best GRPO schedule and the better RLOO of the tuning runs (TUNING, chosen by the rule of `tune`)
    "grpo_tuned": "grpo_gpt2.py --gradient-accumulation-steps 1 --num-minibatches 16 --beta 0 --learning-rate 1e-5",
    "rloo": "grpo_gpt2.py --advantage rloo --beta 0",
}
LABELS = {"ppo": "PPO", "grpo": "GRPO", "dr_grpo": "Dr. GRPO", "grpo_ppo_update": "GRPO, PPO's update",
          "grpo_tuned": "GRPO, tuned schedule", "rloo": "RLOO", "tuned_ppo": "PPO, tuned",
          "tuned_grpo": "GRPO, tuned", "tuned_rloo": "RLOO, tuned",
          "searched_ppo": "PPO, searched", "searched_grpo": "GRPO, searched", "searched_rloo": "RLOO, searched",
          "searched_grpo_equal_cpu": "GRPO, searched, PPO's training CPU time",
          "searched_rloo_equal_cpu": "RLOO, searched, PPO's training CPU time",
          "tuned_grpo_equal_cpu": "GRPO, tuned, PPO's training time", "tuned_rloo_equal_cpu": "RLOO, tuned, "
          "PPO's training time"}
# The tuning runs: one seed (100, not one of the comparison's), 512 completions, scored on 256 problems set aside
# from the TRAINING problems (--eval-split validation), never on the held-out ones. S: optimizer steps a batch.
# The rule: among the GRPO runs the highest validation accuracy after 512 completions becomes grpo_tuned, among
# the RLOO runs likewise rloo; a tie (within 1 point) goes to the run with fewer steps a batch. The grid grew toward
# larger learning rates after the first runs: at 3e-6 and 5e-6 the multi-step schedules moved the policy within a
# batch (losses/approx_kl) a tenth as much as PPO's update does.
MB = "--gradient-accumulation-steps 1 --num-minibatches"
TUNING = {
    "grpo S1 lr2e-5 k3 0.04 (defaults)": "grpo_gpt2.py",
    "grpo S4 lr5e-6": f"grpo_gpt2.py {MB} 4 --beta 0 --learning-rate 5e-6",
    "grpo S16 lr3e-6": f"grpo_gpt2.py {MB} 16 --beta 0 --learning-rate 3e-6",
    "rloo S1 lr2e-5": "grpo_gpt2.py --advantage rloo --beta 0",
    "grpo S16 lr3e-6 corrected k3 0.04": f"grpo_gpt2.py {MB} 16 --use-bias-correction-kl --learning-rate 3e-6",
    "grpo S4 lr1e-5": f"grpo_gpt2.py {MB} 4 --beta 0 --learning-rate 1e-5",
    "grpo S16 lr1e-5": f"grpo_gpt2.py {MB} 16 --beta 0 --learning-rate 1e-5",
    "grpo S8 (2 passes) lr1e-5": f"grpo_gpt2.py {MB} 4 --update-epochs 2 --beta 0 --learning-rate 1e-5",
}
TUNING_COMMON = COMMON.replace("--eval-every 2", "--eval-every 0") + " --eval-split validation"
TUNING_SEED = 100
RUNS = "experiments/runs/ppo_vs_grpo"
# The protocol's grids (experiments/protocol.py), stated before their first run: 8 settings a method, one run each
# at protocol.TUNING_SEED, 512 completions, scored on the validation split (TUNING_COMMON); the rule: the highest
# validation accuracy after 512 completions, the cheapest (CPU minutes of the run) within 1 point. PPO: learning
# rate and epochs (the flags above, lr 1.41e-5 and 4 epochs, are a point of its grid); GRPO and RLOO: the group
# size at 64 completions a batch (G 2: 32 problems a batch, G 16: 4), GRPO with its defaults' schedule and with
# the earlier tuning's (16 steps a batch, beta 0, lr 1e-5), RLOO at two rates. The chosen settings then run at
# SEEDS, fresh seeds, on the held-out problems: methods tuned_ppo, tuned_grpo, tuned_rloo (`run --tuned`).
GRIDS = {
    "ppo": protocol.grid(lambda lr, epochs: f"ppo_rlhf_gpt2.py --learning-rate {lr} --update-epochs {epochs}",
                         lr=("7e-6", "1.41e-5", "3e-5", "6e-5"), epochs=("2", "4")),
    "grpo": protocol.grid(lambda G, steps: f"grpo_gpt2.py --num-generations {G}" + (
        "" if steps == "1" else f" {MB} 16 --beta 0 --learning-rate 1e-5"), G=("2", "4", "8", "16"), steps=("1", "16")),
    "rloo": protocol.grid(lambda G, lr: f"grpo_gpt2.py --advantage rloo --beta 0 --num-generations {G} "
                          f"--learning-rate {lr}", G=("2", "4", "8", "16"), lr=("1e-5", "2e-5")),
}
# The search (protocol.next_runs), its grids stated before its first run, the cap protocol.EXTRA_RUNS. Each setting
# at 512 completions on the validation split (TUNING_COMMON), seed protocol.TUNING_SEED. PPO: learning rate, epochs
# and responses a batch (its data per update); GRPO and RLOO (GRPO's loss with RLOO's leave-one-out baseline): the
# learning rate, the group size G at 64 completions a batch and the optimizer steps a batch (1: the defaults' one
# step of 4 accumulated micro-batches; more: minibatches of 64 / steps completions), beta 0 (no reference model).
# The runs of the grids above whose commands are a setting's here count as its runs (`search --reuse`): the code
# they ran differs from today's only in the bf16 path and torchrun's teardown. The chosen settings then run at
# TEST_SEEDS on the test split (`run --searched`): held-out sums no earlier run evaluated, each once.
LR = protocol.Axis(("5e-6", "1e-5", "2e-5", "4e-5"))
GROUP = protocol.Axis(("4", "8", "16"), low=2, high=64)
STEPS = protocol.Axis(("1", "16"), factor=4, low=1, high=64)


def steps_flags(steps: str) -> str:
    return "" if steps == "1" else f" {MB} {steps}"


SEARCH = {
    "ppo": (dict(lr=protocol.Axis(("7e-6", "1.41e-5", "3e-5", "6e-5")),
                 epochs=protocol.Axis(("2", "4"), low=1, high=16),
                 batch=protocol.Axis(("32", "64"), low=8, high=256)),
            lambda lr, epochs, batch: f"ppo_rlhf_gpt2.py --learning-rate {lr} --update-epochs {epochs} "
                                      f"--batch-size {batch}"),
    "grpo": (dict(lr=LR, G=GROUP, steps=STEPS),
             lambda lr, G, steps: f"grpo_gpt2.py --num-generations {G}{steps_flags(steps)} --beta 0 "
                                  f"--learning-rate {lr}"),
    "rloo": (dict(lr=LR, G=GROUP, steps=STEPS),
             lambda lr, G, steps: f"grpo_gpt2.py --advantage rloo --beta 0 --num-generations {G}"
                                  f"{steps_flags(steps)} --learning-rate {lr}"),
}
TEST_COMMON = COMMON + " --eval-split test"
TEST_SEEDS = (13, 14, 15, 16, 17, 18)
TEST_EVAL = 256  # --eval-episodes: the first 256 sums of the test split, each once
SEARCH_RUNS = "docs/results/ppo_vs_grpo_runs/search"
SEARCHED = ("searched_ppo", "searched_grpo", "searched_rloo")


def search_flags(method: str, setting: str) -> str:
    axes, flags = SEARCH[method]
    return flags(**protocol.parse_setting(setting, axes))


def search_results(records: list[dict], method: str, scalars_of) -> tuple[dict, dict]:
    """protocol.next_runs's view of a method's recorded runs: ({setting: (validation accuracy, CPU minutes)} at
    TUNING_SEED, {setting: accuracy} at SECOND_SEED)."""
    first, second = {}, {}
    for record in records:
        if record["method"].split(" ")[0] != method:
            continue
        accuracy = [value for _, value in scalars_of(record["run_dir"])["eval/accuracy"]]
        final = accuracy[-1] if len(accuracy) > 1 else None
        setting = record["method"][len(method) + 1 :]
        if record["seed"] == protocol.TUNING_SEED:
            first[setting] = (final, record["cpu_s"] / 60)
        elif record["seed"] == protocol.SECOND_SEED:
            second[setting] = final
    return protocol.in_grid_order(SEARCH[method][0], first), second


def problems_read(records: list[dict]) -> tuple[set, int]:
    """The two-digit held-out sums the recorded runs evaluated (the first --eval-episodes prompts of the held-out
    split, which evaluate() cycles from the start), and how many runs read them."""
    held_out, read, runs = rlhf.arithmetic_problems(2, held_out=True), set(), 0
    for record in records:
        flags = flag_dict(record["command"])
        if flags.get("--arithmetic-digits") == "2" and flags.get("--eval-split", "held_out") == "held_out":
            read |= set(held_out[: int(flags.get("--eval-episodes", 256))])
            runs += 1
    return read, runs


def runs_reading_the_test_split(records: list[dict]) -> dict[str, int]:
    """{method: runs} of the recorded two-digit runs that evaluated the test split (--eval-split test)."""
    readers = {}
    for record in records:
        flags = flag_dict(record["command"])
        if flags.get("--arithmetic-digits") == "2" and flags.get("--eval-split") == "test":
            readers[record["method"]] = readers.get(record["method"], 0) + 1
    return dict(sorted(readers.items()))


def distinct_problems(prompts) -> set:
    """The problems a list of arithmetic prompts asks, a + b and b + a one problem."""
    return {frozenset(map(int, re.findall(r"\d+", p))) for p in prompts}


def list_problems() -> None:
    """`problems`: the test split's sums, and the held-out sums every recorded run under docs/results read."""
    records = [r for f in sorted((ROOT / "docs/results").rglob("records.jsonl")) for r in recorded(f)]
    read, runs = problems_read(records)
    test = rlhf.arithmetic_problems(2, held_out=True, test=True)
    pairs = distinct_problems(read)
    unread = [p for p in test if not distinct_problems([p]) & pairs]
    print(f"{len(records)} recorded runs under docs/results; {runs} evaluated held-out sums: {len(read)} prompts, "
          f"{len(pairs)} distinct sums")
    readers = runs_reading_the_test_split(records)
    print(f"test split (--eval-split test): {len(test)} distinct sums, {len(test) - len(unread)} of them among the "
          f"held-out sums read; the first {TEST_EVAL} are the tables', evaluated by {sum(readers.values())} runs ("
          + (", ".join(f"{method} {n}" for method, n in readers.items()) or "none") + "):")
    print("\n".join(test[:TEST_EVAL]))


def searched_methods(records: list[dict], methods=None) -> dict[str, str]:
    """{searched_<method>: the flags the search chose} for methods (all of SEARCH's if None): protocol's one
    choice, the report's; a clear error while a method's search has runs left."""
    chosen = protocol.searched_choices({m: axes for m, (axes, _) in SEARCH.items()},
                                       lambda m: search_results(records, m, read_scalars),
                                       list(SEARCH) if methods is None else [m for m in SEARCH if m in methods],
                                       "python experiments/ppo_vs_grpo.py search")
    return {f"searched_{method}": search_flags(method, setting) for method, setting in chosen.items()}


def run_searched(args, runs: Path) -> None:
    """`run --searched`: the search's choices at --seeds on the test split, every 128 completions evaluated
    (whatever a setting's batch); with --equal-cpu, GRPO's and RLOO's for PPO's mean training CPU seconds. With
    --methods, only those methods' (each once its own search is done)."""
    chosen = searched_methods(recorded((ROOT / args.search).resolve() / "records.jsonl"),
                              [m for m in args.methods if m in SEARCH])
    runs.mkdir(parents=True, exist_ok=True)

    def common(flags: str, base: str = TEST_COMMON) -> str:
        return base.replace("--eval-every 2", f"--eval-every {128 // int(flag_dict(flags).get('--batch-size', 64))}")

    if not args.equal_cpu:
        for method, flags in chosen.items():
            run_all([method], args.seeds, runs, args.jobs, common(flags), chosen)
        return
    done = summarize([r for r in recorded(runs / "records.jsonl") if r["method"] in SEARCHED], read_scalars)
    if "searched_ppo" not in done:
        raise SystemExit("error: --equal-cpu: no run of searched_ppo in --runs; run `run --searched` first")
    budget = equal_cpu_completions(done, key="train_cpu_s", ppo_key="searched_ppo", others=SEARCHED[1:])
    for method, completions in [(m, c) for m, c in budget.items() if m[: -len("_equal_cpu")] in chosen]:
        flags = chosen[method[: -len("_equal_cpu")]]
        run_all([method], args.seeds, runs, args.jobs, equal_cpu_common(TEST_COMMON, completions), {method: flags})


def run_search(methods: list[str], runs: Path, jobs: int, reuse: list[Path]) -> None:
    """Every method's search to its end (protocol.search), the runs `jobs` at a time, PPO's first (the longest);
    a run whose command (its flags) a record in a --reuse folder has is recorded from that record, not run."""
    records_file = runs / "records.jsonl"
    earlier = [(r, folder) for folder in reuse for r in recorded(folder / "records.jsonl")]

    def results(method):
        return search_results(recorded(records_file), method, read_scalars)

    def run(todo):
        flags = {f"{m} {name}": search_flags(m, name) for m, name, _ in todo}
        items = []
        for method, name, seed in sorted(todo, key=lambda t: t[0] != "ppo"):
            wanted = flag_dict(shlex.join(command_of(f"{method} {name}", seed, str(runs), TUNING_COMMON, flags)))
            same = [(r, folder) for r, folder in earlier if r["seed"] == seed and flag_dict(r["command"]) == wanted]
            if same:
                record, folder = same[0]
                run_dir = os.path.relpath(folder / Path(record["run_dir"]).name, ROOT)
                with open(records_file, "a") as f:
                    f.write(json.dumps({**record, "method": f"{method} {name}", "run_dir": run_dir,
                                        "reused_from": record["method"]}) + "\n")
                print(f"reused {record['method']} as {method} {name}", flush=True)
            else:
                items.append((f"{method} {name}", seed))
        run_items(items, runs, jobs, TUNING_COMMON, flags)

    protocol.search({m: SEARCH[m][0] for m in methods}, results, run)


PROTOCOL_TUNING = {f"{method} {setting}": flags for method, grid in GRIDS.items() for setting, flags in grid.items()}


def protocol_tuning(methods) -> dict[str, str]:
    """PROTOCOL_TUNING's runs of these methods (`tune --methods`: two processes can tune different methods)."""
    return {name: flags for name, flags in PROTOCOL_TUNING.items() if name.split(" ")[0] in methods}
SEEDS = (7, 8, 9, 10, 11, 12)
# At equal training time: each critic-free method's chosen setting again, with as many completions as its training
# seconds per completion (at 512) buy in tuned PPO's mean training seconds at 512, in whole batches of 64
# (`run --tuned --equal-cpu`, after the runs at 512 completions are recorded).
EQUAL_CPU = ("tuned_grpo", "tuned_rloo")


def equal_cpu_completions(methods: dict, completions: int = 512, batch_size: int = 64, key: str = "train_s",
                          ppo_key: str = "tuned_ppo", others=EQUAL_CPU) -> dict[str, int]:
    """{<method>_equal_cpu: completions} from summarize()'s runs at `completions` of ppo_key and the others: as
    many as each one's `key` (training seconds, or training CPU seconds) per completion buys in PPO's mean."""
    ppo = float(np.mean([run[key] for run in methods[ppo_key]]))
    out = {}
    for method in others:
        if method in methods:
            per_completion = float(np.mean([run[key] for run in methods[method]])) / completions
            out[f"{method}_equal_cpu"] = int(ppo / per_completion // batch_size * batch_size)
    return out


def equal_cpu_common(common: str, completions: int, batch_size: int = 64) -> str:
    """The common flags of a run at equal training time: `completions` in place of 512, and the held-out
    evaluation as often as at 512 (four times over the run, the last at its end); the evaluations are not
    training time, so this changes only the wall time."""
    iterations = completions // batch_size
    return common.replace("--total-episodes 512", f"--total-episodes {completions}").replace(
        "--eval-every 2", f"--eval-every {max(1, iterations // 4)}")


def tuned_methods(tuning: list[dict]) -> dict[str, str]:
    """{tuned_<method>: the flags the rule chose} from the protocol's tuning rows (tuning_results), once each
    method's whole grid is recorded (else a clear error)."""
    chosen = {}
    for method, grid in GRIDS.items():
        rows = {row["name"][len(method) + 1 :]: row for row in tuning if row["name"].startswith(method + " ")}
        if set(rows) != set(grid):
            raise SystemExit(f"error: --tuned: {len(set(rows) & set(grid))} of {method}'s {len(grid)} tuning runs "
                             "are recorded; run `python experiments/ppo_vs_grpo.py tune` first")
        setting = protocol.choose({k: r["final"] for k, r in rows.items()}, {k: r["cpu_s"] for k, r in rows.items()})
        chosen[f"tuned_{method}"] = grid[setting]
    return chosen


# ------------------------------------------------------------------------------------------------------------
# What a run's log says: its curves and end-of-run measures, as the page (ppo_vs_grpo_report.py) and the runs at
# PPO's training CPU time read them (tested on small inputs).


def run_curves(scalars: dict, batch_size: int) -> dict:
    """One run's held-out accuracy against completions and against training seconds: the evaluation at
    iteration i (0: the initial policy) comes after i * batch_size completions and after the rollout and
    update seconds of iterations 1..i (loading and the evaluations themselves are not counted)."""
    seconds = {step: value for step, value in scalars["time/rollout"]}
    for step, value in scalars["time/update"]:
        seconds[step] += value
    elapsed = np.cumsum([0.0] + [seconds[step] for step in sorted(seconds)])
    steps = [step for step, _ in scalars["eval/accuracy"]]
    return {"completions": [step * batch_size for step in steps],
            "seconds": [float(elapsed[step]) for step in steps],
            "accuracy": [value for _, value in scalars["eval/accuracy"]]}


def all_wrong_from(scalars: dict) -> int | None:
    """The iteration from which every batch to the run's end was all wrong (objective/raw_scores at the verifier's
    -1): every group's advantage is then 0, and at beta 0 no step moves the policy again. None unless that streak
    holds for two or more iterations."""
    scores, start = scalars.get("objective/raw_scores", []), None
    for step, value in scores:
        start = (step if start is None else start) if value <= -1 + 1e-6 else None
    return start if start is not None and scores[-1][0] > start else None


def summarize(records: list[dict], scalars_of) -> dict:
    """Per method: the runs' curves and end-of-run measures, seed by seed."""
    methods = {}
    order = [*METHODS, "tuned_ppo", "tuned_grpo", "tuned_rloo", *(f"{m}_equal_cpu" for m in EQUAL_CPU),
             *SEARCHED, *(f"{m}_equal_cpu" for m in SEARCHED[1:])]
    for record in sorted(records, key=lambda r: (order.index(r["method"]), r["seed"])):
        scalars = scalars_of(record["run_dir"])
        curves = run_curves(scalars, int(flag_dict(record["command"]).get("--batch-size", 64)))
        methods.setdefault(record["method"], []).append({
            "seed": record["seed"], "command": record["command"], "date": record["date"],
            "commit": record["commit"], **curves,
            "peak_rss_gb": record["peak_rss_gb"], "wall_s": record["wall_s"], "cpu_s": record.get("cpu_s"),
            "train_s": curves["seconds"][-1],
            # process CPU seconds of the training (rollouts, advantages, updates), where the run logged them
            "train_cpu_s": scalars["time/train_cpu"][-1][1] if "time/train_cpu" in scalars else None,
            "length_right": last_mean(scalars, "val/length_right", 2),
            "length_wrong": last_mean(scalars, "val/length_wrong", 2),
            "zero_advantage_groups": last_mean(scalars, "val/zero_advantage_groups", 10**6),
            "all_wrong_from": all_wrong_from(scalars),
            "kl": last_mean(scalars, "objective/kl", 1),
        })
    return methods


def tuning_results(records: list[dict], scalars_of) -> list[dict]:
    """Each tuning run's validation accuracy before and after training, its KL at the end, its minutes."""
    rows = []
    for record in records:
        scalars = scalars_of(record["run_dir"])
        accuracy = [value for _, value in scalars["eval/accuracy"]]
        rows.append({"name": record["method"], "command": record["command"], "initial": accuracy[0],
                     "final": accuracy[-1], "kl": last_mean(scalars, "objective/kl", 1),
                     "train_s": run_curves(scalars, 64)["seconds"][-1] if len(accuracy) > 1 else float("nan"),
                     "cpu_s": record.get("cpu_s")})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="subcommand", required=True)
    run = sub.add_parser("run", help="run the methods over the seeds, side by side")
    run.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    run.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    run.add_argument("--jobs", type=int, default=2, help="runs at a time (at most one per idle core)")
    run.add_argument("--runs", default=RUNS, help="runs folder and records.jsonl")
    run.add_argument("--common", default=COMMON, help="the flags every method gets")
    run.add_argument("--tuned", action="store_true", help="run the protocol's chosen settings (tuned_ppo, "
                     "tuned_grpo, tuned_rloo) at --seeds, read from --tuning")
    run.add_argument("--tuning", default=RUNS + "_protocol_tuning", help="the protocol's tuning runs (--tuned)")
    run.add_argument("--equal-cpu", action="store_true", help="with --tuned: GRPO's and RLOO's chosen settings "
                     "for as many completions as tuned PPO's training time buys them (EQUAL_CPU)")
    run.add_argument("--searched", action="store_true", help="run the search's chosen settings (searched_ppo, "
                     "searched_grpo, searched_rloo) at --seeds on the test split, read from --search")
    run.add_argument("--search", default=SEARCH_RUNS + "/tuning", help="the search's runs (--searched)")
    tune = sub.add_parser("tune", help="the protocol's tuning runs (GRIDS), on the validation split, one seed")
    tune.add_argument("--jobs", type=int, default=2, help="runs at a time (at most one per idle core)")
    tune.add_argument("--runs", default=RUNS + "_protocol_tuning", help="runs folder and records.jsonl")
    tune.add_argument("--earlier-grid", action="store_true", help="the earlier grid (TUNING) instead")
    tune.add_argument("--methods", nargs="+", default=list(GRIDS), choices=list(GRIDS), help="the grids to run")
    search = sub.add_parser("search", help="the protocol's search (SEARCH), on the validation split")
    search.add_argument("--jobs", type=int, default=2, help="runs at a time (at most one per idle core)")
    search.add_argument("--runs", default=SEARCH_RUNS + "/tuning", help="runs folder and records.jsonl")
    search.add_argument("--methods", nargs="+", default=list(SEARCH), choices=list(SEARCH))
    search.add_argument("--reuse", nargs="*", default=["docs/results/ppo_vs_grpo_runs/protocol_tuning"],
                        help="runs folders whose runs count where their commands are a setting's")
    sub.add_parser("problems", help="list the test sums and the held-out sums the recorded runs read")
    args = parser.parse_args()
    runs = (ROOT / args.runs).resolve() if args.subcommand != "problems" else None
    if args.subcommand == "run" and args.searched:
        run_searched(args, runs)
    elif args.subcommand == "run" and args.tuned:
        tuning = recorded((ROOT / args.tuning).resolve() / "records.jsonl")
        chosen = tuned_methods(tuning_results(tuning, read_scalars))
        runs.mkdir(parents=True, exist_ok=True)
        if not args.equal_cpu:
            run_all(list(chosen), args.seeds, runs, args.jobs, args.common, chosen)
            return
        done = summarize([r for r in recorded(runs / "records.jsonl") if r["method"] in chosen], read_scalars)
        if "tuned_ppo" not in done:
            raise SystemExit("error: --equal-cpu: no run of tuned_ppo in --runs; run `run --tuned` first")
        for method, completions in equal_cpu_completions(done).items():
            common = equal_cpu_common(args.common, completions)
            run_all([method], args.seeds, runs, args.jobs, common, {method: chosen[method[: -len("_equal_cpu")]]})
    elif args.subcommand == "run":
        runs.mkdir(parents=True, exist_ok=True)
        run_all(args.methods, args.seeds, runs, args.jobs, args.common, METHODS)
    elif args.subcommand == "problems":
        list_problems()
    elif args.subcommand == "search":
        runs.mkdir(parents=True, exist_ok=True)
        run_search(args.methods, runs, args.jobs, [(ROOT / folder).resolve() for folder in args.reuse])
    else:  # tune
        runs.mkdir(parents=True, exist_ok=True)
        grid = TUNING if args.earlier_grid else protocol_tuning(args.methods)
        run_all(list(grid), [protocol.TUNING_SEED], runs, args.jobs, TUNING_COMMON, grid)

if __name__ == "__main__":
    main()
