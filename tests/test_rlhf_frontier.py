"""experiments/rlhf_frontier.py, its evaluation (rlhf_frontier_measure.py) and its page (rlhf_frontier_report.py):
reading the gold at a KL by hand, and the harness on the tiny models of
tests/conftest.py: every method measured by the one evaluation at the steps its flags say, the initial point
shared and at KL 0, the last point that of the policy the run saved, records skipped when they exist, the
report's rows from the records."""

import copy
import importlib.util
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("rlhf_frontier_report",
                                              os.path.join(ROOT, "experiments", "rlhf_frontier_report.py"))
R = importlib.util.module_from_spec(spec)  # the page
spec.loader.exec_module(R)
F = R.harness  # the runs (rlhf_frontier.py), the one its page reads
M = sys.modules["rlhf_frontier_measure"]  # the one evaluation, a measured run, the gold at a KL
shared = F.shared  # the prompt sets


def test_gold_at_kl_by_hand():
    points = [{"kl": 0.0, "gold": 0.2}, {"kl": 2.0, "gold": 0.4}, {"kl": 4.0, "gold": 0.5}]
    assert F.gold_at_kl(points, 1.0) == pytest.approx(0.3)  # halfway from 0 to 2
    assert F.gold_at_kl(points, 3.0) == pytest.approx(0.45)
    assert F.gold_at_kl(points, 4.0) == pytest.approx(0.5)
    assert F.gold_at_kl(points, 6.0) is None  # never reached
    # the first crossing counts, not a later one after the KL fell back
    wavy = [{"kl": 0.0, "gold": 0.0}, {"kl": 4.0, "gold": 1.0}, {"kl": 1.0, "gold": 5.0}, {"kl": 5.0, "gold": 9.0}]
    assert F.gold_at_kl(wavy, 3.0) == pytest.approx(0.75)


def test_each_prompt_s_gold_and_the_cpu_minutes_at_a_kl_by_hand(tmp_path):
    point = lambda kl, per_prompt, step, **cpu: {"kl": kl, "gold": float(np.mean(per_prompt)), "gold_se": 0.0,
                                                 "gold_per_prompt": per_prompt, "step": step, **cpu}
    ppo = [point(0.0, [0.0, 0.0, 0.0], 0, cpu_minutes=0.5), point(2.0, [0.2, 0.4, 0.6], 5, cpu_minutes=4.0),
           point(4.0, [1.0, 1.0, 1.0], 20, cpu_minutes=10.0)]
    np.testing.assert_allclose(M.at_kl(ppo, 1.0, "gold_per_prompt"), [0.1, 0.2, 0.3])
    np.testing.assert_allclose(M.at_kl(ppo, 3.0, "gold_per_prompt"), [0.6, 0.7, 0.8])
    # the same run recorded without a time at each point: grpo (RL, estimated), dpo (no estimate)
    bare = [{k: v for k, v in p.items() if k != "cpu_minutes"} for p in ppo]
    runs = tmp_path / "runs"
    for method, points in (("dpo", bare), ("ppo", ppo), ("grpo", bare)):
        (runs / method).mkdir(parents=True)
        (runs / method / "a__1.json").write_text(json.dumps(
            {"method": method, "setting": "a", "seed": 1, "cpu_minutes": 12.0, "points": points, "command": "c"}))
    (runs / "initial.json").write_text(json.dumps(point(0.0, [0.0, 0.0, 0.0], 0)))
    text = R.report(R.Report(runs=str(runs), out=str(tmp_path / "page")))
    # to KL 3, halfway from the point at KL 2 to the one at 4: recorded 4 and 10 minutes, so 7.0; estimated,
    # 12 minutes times 5/20 and 20/20 of the iterations, 3 and 12, so 7.5
    assert "| ppo | a | 1 | 0.200 | 0.400 | 0.700 | not reached | 4.00, 1.000 | 12.0 | 7.0 |" in text
    assert "| grpo | a | 1 | 0.200 | 0.400 | 0.700 | not reached | 4.00, 1.000 | 12.0 | ≈7.5 |" in text
    assert "| dpo | a | 1 | 0.200 | 0.400 | 0.700 | not reached | 4.00, 1.000 | 12.0 | - |" in text


def test_the_differences_over_seeds_by_hand(tmp_path):
    runs = tmp_path / "runs"
    point = lambda kl, gold: {"kl": kl, "gold": gold, "gold_se": 0.0, "gold_per_prompt": [gold, gold], "step": kl}
    # gold at KL 3, halfway between the points at KL 2 and 4: dpo 0.5 and 0.7, ppo 0.2 and 0.4; only one
    # ppo seed reaches KL 6, and grpo has one seed: no line for either
    golds = {("dpo", 1): (0.4, 0.6, 0.7), ("dpo", 2): (0.6, 0.8, 0.9), ("ppo", 1): (0.1, 0.3, 0.5),
             ("ppo", 2): (0.3, 0.5, None), ("grpo", 1): (0.0, 1.0, 1.0)}
    for (method, seed), (g2, g4, g7) in golds.items():
        points = [point(0.0, 0.0), point(2.0, g2), point(4.0, g4)] + ([point(7.0, g7)] if g7 else [])
        (runs / method).mkdir(parents=True, exist_ok=True)
        (runs / method / f"a__{seed}.json").write_text(json.dumps(
            {"method": method, "setting": "a", "seed": seed, "cpu_minutes": 1.0, "points": points}))
    (runs / "initial.json").write_text(json.dumps(point(0.0, 0.0)))
    text = R.report(R.Report(runs=str(runs), out=str(tmp_path / "page")))
    lines = [line for line in text.splitlines() if ", at KL " in line]
    # difference 0.6 - 0.3; each mean's variance 0.02 / 2 = 0.01; Welch dof (0.02)^2 / (2 * 0.01^2) = 2,
    # t(0.975, 2) = 4.303: half-width 4.303 * sqrt(0.02) = 0.609. At KL 1: 0.25 - 0.1, half the spread; at KL 2
    # the points themselves, 0.5 - 0.2.
    assert lines == ["- dpo a minus ppo a, at KL 1: +0.150 ± 0.304", "- dpo a minus ppo a, at KL 2: +0.300 ± 0.609",
                     "- dpo a minus ppo a, at KL 3: +0.300 ± 0.609"]
    # the same settings run with --bf16 (`run --bf16`: setting "a bf16"), golds at KL 2 and 4 as written
    golds = {("dpo", 1): (0.5, 0.7), ("dpo", 2): (0.7, 0.9), ("ppo", 1): (0.1, 0.3), ("ppo", 2): (0.3, 0.5)}
    for (method, seed), (g2, g4) in golds.items():
        (runs / method / f"a_bf16__{seed}.json").write_text(json.dumps(
            {"method": method, "setting": "a bf16", "seed": seed, "cpu_minutes": 1.0,
             "points": [point(0.0, 0.0), point(2.0, g2), point(4.0, g4)]}))
    text = R.report(R.Report(runs=str(runs), out=str(tmp_path / "page")))
    # DPO against the others within one precision only; bf16 minus fp32 per setting: dpo at KL 3 0.7 - 0.6,
    # ppo 0.3 - 0.3, and DPO minus PPO in bf16 0.7 - 0.3, each spread as above (Welch dof 2): the half-width
    # 0.609; at KL 1 half of it
    assert [line for line in text.splitlines() if " minus " in line and ", at KL 3" in line] == [
        "- dpo a minus ppo a, at KL 3: +0.300 ± 0.609", "- dpo a bf16 minus ppo a bf16, at KL 3: +0.400 ± 0.609"]
    bf16 = text.split("bf16 against fp32")[1].splitlines()
    assert [line for line in bf16 if line.startswith("- ")] == [
        "- dpo a, at KL 1: +0.050 ± 0.304", "- dpo a, at KL 2: +0.100 ± 0.609", "- dpo a, at KL 3: +0.100 ± 0.609",
        "- ppo a, at KL 1: +0.000 ± 0.304", "- ppo a, at KL 2: +0.000 ± 0.609", "- ppo a, at KL 3: +0.000 ± 0.609"]
    # the same settings on the fresh test prompts (`run --searched`: split "fresh"), golds at KL 2 and 4: rows of
    # their own, compared with each other only; the test prompts' rows, lines and last points as before
    golds = {("dpo", 7): (0.2, 0.4), ("dpo", 8): (0.4, 0.6), ("ppo", 7): (0.0, 0.2), ("ppo", 8): (0.2, 0.4)}
    for (method, seed), (g2, g4) in golds.items():
        (runs / method / f"a__{seed}.json").write_text(json.dumps(
            {"method": method, "setting": "a", "seed": seed, "cpu_minutes": 1.0, "split": "fresh",
             "command": f"python {method}.py --seed {seed}", "points": [point(0.0, 0.0), point(2.0, g2),
                                                                        point(4.0, g4)]}))
    text = R.report(R.Report(runs=str(runs), out=str(tmp_path / "page")))
    assert sorted(line for line in text.splitlines() if " minus " in line and ", at KL 3" in line) == [
        "- dpo a (fresh) minus ppo a (fresh), at KL 3: +0.200 ± 0.609",
        "- dpo a bf16 minus ppo a bf16, at KL 3: +0.400 ± 0.609", "- dpo a minus ppo a, at KL 3: +0.300 ± 0.609"]
    rows = {tuple(line.split(" | ")[:2]): line.split(" | ") for line in text.splitlines() if line.startswith("| ")}
    # the last points: dpo's test seeds end at KL 7 (0.7, 0.9), its fresh seeds at KL 4 (0.4, 0.6)
    assert rows[("| dpo", "a")][2] == "1, 2" and rows[("| dpo", "a")][7] == "7.00, 0.800"
    assert rows[("| dpo", "a (fresh)")][2] == "7, 8" and rows[("| dpo", "a (fresh)")][7] == "4.00, 0.500"
    assert "- ppo, a (fresh): `python ppo.py --seed 1`" in text.splitlines()


def test_the_report_keeps_the_page_s_hand_written_top(tmp_path):
    """The report on the committed records into a copy of the committed page's top (its title and summary, above
    `<!-- generated -->`): the top stays as written, what stood below the marker is replaced."""
    top = Path(ROOT, "docs/results/rlhf_frontier.md").read_text().split("<!-- generated -->\n", 1)[0]
    assert top.startswith("# The reward-KL frontier") and "**What holds.**" in top
    page = tmp_path / "rlhf_frontier.md"
    page.write_text(top + "<!-- generated -->\nSTALE\n")
    text = R.report(R.Report(runs="docs/results/rlhf_frontier_runs", out=str(tmp_path / "rlhf_frontier")))
    assert page.read_text() == top + "<!-- generated -->\n" + text and "STALE" not in text
    # and the tables are the committed page's: the page is what its report writes from the committed records
    assert top + "<!-- generated -->\n" + text == Path(ROOT, "docs/results/rlhf_frontier.md").read_text()


def test_t_interval_by_hand():
    mean, half, _ = R.mean_interval([0.1, 0.3, 0.5])
    # std 0.2, sqrt(3), t(0.975, 2) = 4.303
    assert mean == pytest.approx(0.3) and half == pytest.approx(4.303 * 0.2 / math.sqrt(3))
    assert R.mean_interval([0.4])[:2] == (0.4, 0.0)


def test_rows_need_every_seed_to_reach_the_kl():
    run = lambda seed, kls: {"method": "dpo", "setting": "beta 0.1", "seed": seed, "cpu_minutes": seed,
                             "command": "c", "points": [{"kl": k, "gold": k / 10} for k in kls]}
    rows = R.frontier_rows([run(1, [0, 2, 4]), run(2, [0, 1, 2])])
    assert rows[0][1.0][:2] == pytest.approx(R.mean_interval([0.1, 0.1])[:2])
    assert rows[0][3.0] == (None, None, 1)  # one of the two seeds reached KL 3
    assert rows[0]["cpu_minutes"] == 1.5


def write_preferences(path: Path, prompts) -> str:
    rows = []
    for p in prompts:
        for k in range(3):
            rows.append({"prompt": p, "chosen": [" great. I loved it.", " a joy.", " the best film."][k],
                         "rejected": [" awful. A bad movie.", " boring.", " terrible."][k],
                         "gold_chosen": 0.6, "gold_rejected": -0.6})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def tiny_frontier(tiny, tmp_path, monkeypatch):
    """The harness with the tiny policy and schedules a few steps long."""
    import ppo_rlhf_gpt2 as rlhf

    rl = ("--total-episodes 24 --batch-size 8 --num-minibatches 2 --update-epochs 1 --learning-rate 1e-3 "
          "--eval-every 2 --response-length 8 --min-response-length 4 --local-rollout-forward-batch-size 8")
    methods = {
        "dpo": (F.dpo, {"beta 0.1": "--beta 0.1 --preferences {prefs} --eval-fraction 0.25 --split-seed 1 "
                        "--eval-every 2 --batch-size 4 --gradient-accumulation-steps 2 --learning-rate 1e-3"}),
        "ppo": (F.rlhf, {"kl_coef 0.05": "--reward-model {rm} --kl-coef 0.05 --kl-target None --norm-batches 1 "
                         f"--save-model {rl}"}),
        "grpo": (F.grpo, {"beta 0.04": "--reward-model {rm} --beta 0.04 --num-generations 4 "
                                        f"--missing-eos-penalty None {rl}"}),
    }
    monkeypatch.setattr(F, "METHODS", methods)
    prefs = write_preferences(tmp_path / "prefs.jsonl", rlhf.PROMPTS[:8])
    common = dict(runs=str(tmp_path / "runs"), model_name=tiny["policy"], num_prompts=3, samples_per_prompt=2)
    F.run_reward_model(F.RewardModel(preferences=prefs, rm_flags="--eval-fraction 0.25 --save-model "
                                     "--batch-size 4", **common))
    return {"prefs": prefs, "common": common, "tmp": tmp_path}


def half_a_second_slower(fn, results: list):
    """fn after half a CPU second of busy waiting, each result appended to results."""
    def slow(*args, **kwargs):
        start = time.process_time()
        while time.process_time() - start < 0.5:
            pass
        results.append(fn(*args, **kwargs))
        return results[-1]
    return slow


def test_the_reward_model_s_cpu_minutes_leave_its_held_out_passes_out(tiny, tmp_path, monkeypatch):
    """Each held-out pass of reward_model_gpt2.py, made half a CPU second slower, is timed apart: the record's
    minutes are the rest of the run; the module is restored after."""
    calls = []
    slow_evaluate = half_a_second_slower(F.rm.evaluate_comparisons, calls)
    monkeypatch.setattr(F.rm, "evaluate_comparisons", slow_evaluate)
    prefs = write_preferences(tmp_path / "prefs.jsonl", F.rlhf.PROMPTS[:8])
    start = time.process_time()
    record = F.run_reward_model(F.RewardModel(
        preferences=prefs, rm_flags="--eval-fraction 0.25 --save-model --batch-size 4 --eval-every 1",
        runs=str(tmp_path / "runs"), model_name=tiny["policy"]))
    total = time.process_time() - start
    assert len(calls) == 5  # steps 0, 1, 2, 3 and the end: 18 training comparisons, 4 a step
    assert record["eval_cpu_minutes"] * 60 >= 0.5 * len(calls)
    assert (record["cpu_minutes"] + record["eval_cpu_minutes"]) * 60 == pytest.approx(total, abs=0.2)
    assert record["held_out_accuracy"] == calls[-1]["accuracy"] and F.rm.evaluate_comparisons is slow_evaluate
    assert json.loads((tmp_path / "runs" / "reward_model.json").read_text()) == record
    # again: skipped while its model is there; trained again (same seed, same accuracy) where it is not
    rm_args = F.RewardModel(preferences=prefs, rm_flags="--eval-fraction 0.25 --save-model --batch-size 4",
                            runs=str(tmp_path / "runs"), model_name=tiny["policy"])
    assert F.run_reward_model(rm_args) == record and len(calls) == 5
    shutil.rmtree(record["model_path"])
    again = F.run_reward_model(rm_args)
    assert os.path.isdir(again["model_path"]) and again["model_path"] != record["model_path"]
    assert again["held_out_accuracy"] == record["held_out_accuracy"] and len(calls) > 5


def test_every_method_is_measured_by_the_one_evaluation(tiny_frontier, monkeypatch):
    common, runs = tiny_frontier["common"], Path(tiny_frontier["common"]["runs"])
    burned = []  # DPO's held-out accuracy, half a CPU second slower: not training
    monkeypatch.setattr(F.dpo, "evaluate_comparisons", half_a_second_slower(F.dpo.evaluate_comparisons, burned))
    F.run(F.Run(preferences=tiny_frontier["prefs"], methods=["dpo", "ppo", "grpo", "best_of_n"], seeds=[1],
                best_of_n=4, **common))
    initial = json.loads((runs / "initial.json").read_text())
    assert initial["kl"] == 0.0 and initial["kl_se"] == 0.0  # the reference against itself
    assert len(initial["gold_per_prompt"]) == 3 and -1 <= initial["gold"] <= 1
    records = {p.parent.name: json.loads(p.read_text()) for p in runs.glob("*/*.json")}
    # PPO and GRPO: 3 iterations of 8, evaluated at 0, 2 and the end; DPO: 6 prompts' 18 comparisons, 4 a step
    assert [p["step"] for p in records["ppo"]["points"]] == [0, 2, 3]
    assert [p["episodes"] for p in records["grpo"]["points"]] == [0, 16, 24]
    assert [p["step"] for p in records["dpo"]["points"]] == [0, 2, 4]
    for record in (records["ppo"], records["grpo"], records["dpo"]):
        first, *later = record["points"]
        assert first["gold"] == initial["gold"] and first["kl"] == 0.0
        assert all(p["kl"] != 0.0 for p in later)  # trained policies, measured against the reference
        assert record["cpu_minutes"] > 0 and "--seed 1" in record["command"]
        cpu = [p["cpu_minutes"] for p in record["points"]]  # the training time before each point, measures excluded
        assert 0 <= cpu[0] < cpu[1] < cpu[2] <= record["cpu_minutes"]
    assert len(burned) == 3 and records["dpo"]["cpu_minutes"] * 60 < 0.5  # at steps 0, 2 and 4, none counted
    assert records["dpo"]["held_out_accuracy"][0] == burned[-1][0]["accuracy"]  # still the record's accuracy
    # the last point is the policy the run saved, measured afresh
    frontier = F.Frontier(F.Common(**common))
    saved = F.dpo.load_policy(os.path.join(records["ppo"]["run_dir"], "model"), torch.device("cpu"))
    again = frontier.point(saved)
    assert again["gold"] == pytest.approx(records["ppo"]["points"][-1]["gold"], abs=1e-6)
    assert again["kl"] == pytest.approx(records["ppo"]["points"][-1]["kl"], abs=1e-4)
    # best-of-n: n = 1, 2, 4; n = 1 is the initial policy's samples, its KL bound 0
    bon = records["best_of_n"]["points"]
    assert [p["n"] for p in bon] == [1, 2, 4] and bon[0]["kl"] == 0.0
    assert bon[2]["kl"] == pytest.approx(math.log(4) - 3 / 4)
    # a second call skips every record that exists: nothing trains
    for module in (F.dpo, F.rlhf, F.grpo):
        monkeypatch.setattr(module, "main", lambda args: pytest.fail("a recorded run was run again"))
    monkeypatch.setattr(F, "best_of_n_record", lambda *a: pytest.fail("best-of-n was sampled again"))
    F.run(F.Run(preferences=tiny_frontier["prefs"], methods=["dpo", "ppo", "grpo", "best_of_n"], seeds=[1],
                best_of_n=4, **common))
    # the report: a row per method and setting, the page's hand-written head kept
    out = tiny_frontier["tmp"] / "frontier"
    (tiny_frontier["tmp"] / "frontier.md").write_text("# head\nkept\n<!-- generated -->\nSTALE\n")
    text = R.report(R.Report(runs=common["runs"], out=str(out)))
    page = (tiny_frontier["tmp"] / "frontier.md").read_text()
    assert page.startswith("# head\nkept\n<!-- generated -->\n") and "STALE" not in page
    for row in ("| dpo | beta 0.1 | 1 |", "| ppo | kl_coef 0.05 | 1 |", "| grpo | beta 0.04 | 1 |",
                "| best_of_n | N 4 | - |"):
        assert row in text
    assert (tiny_frontier["tmp"] / "frontier.png").stat().st_size > 0


def test_run_bf16_trains_each_setting_with_bf16_in_rows_of_its_own(tiny_frontier):
    """`run --bf16`: the setting's flags plus --bf16, its record beside the fp32 one as "<setting> bf16"."""
    common, runs = tiny_frontier["common"], Path(tiny_frontier["common"]["runs"])
    F.run(F.Run(preferences=tiny_frontier["prefs"], methods=["dpo"], seeds=[1], bf16=True, **common))
    assert [p.name for p in (runs / "dpo").glob("*.json")] == ["beta_0.1_bf16__1.json"]
    record = json.loads((runs / "dpo" / "beta_0.1_bf16__1.json").read_text())
    assert record["setting"] == "beta 0.1 bf16" and record["command"].split().count("--bf16") == 1
    assert [p["step"] for p in record["points"]] == [0, 2, 4] and record["points"][0]["kl"] == 0.0
    assert all(p["kl"] != 0.0 for p in record["points"][1:])
    text = R.report(R.Report(runs=common["runs"], out=str(tiny_frontier["tmp"] / "page")))
    assert "| dpo | beta 0.1 bf16 | 1 |" in text


def test_the_evaluation_draws_the_same_samples_and_scores_vader(tiny):
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    frontier = F.Frontier(F.Common(model_name=tiny["policy"], num_prompts=2, samples_per_prompt=3))
    same_weights = copy.deepcopy(frontier.reference)  # measured against the reference, not skipped
    a, b = frontier.measure(same_weights, 3), frontier.measure(frontier.reference, 3)
    assert a["texts"] == b["texts"]  # one seeded stream
    assert len(set(a["texts"][:3])) > 1  # several samples of a prompt differ
    np.testing.assert_array_equal(a["kl"], 0.0)
    with torch.no_grad():
        same_weights.lm_head.weight.mul_(1.5)  # another policy: a KL that is not 0
    assert (frontier.measure(same_weights, 3)["kl"] != 0).all()
    analyzer = SentimentIntensityAnalyzer()
    prompts = [p for p in frontier.prompts for _ in range(3)]
    expected = [analyzer.polarity_scores(p + r)["compound"] for p, r in zip(prompts, a["texts"])]
    np.testing.assert_allclose(a["gold"].ravel(), expected, atol=1e-6)


def test_bad_input_fails_in_one_line_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(F, "Frontier", lambda *a: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit, match="--preferences .*no such file"):
        F.run(F.Run(preferences=str(tmp_path / "missing.jsonl"), runs=str(tmp_path)))
    prefs = tmp_path / "p.jsonl"
    prefs.write_text("{}\n")
    with pytest.raises(SystemExit, match="need the reward model"):
        F.run(F.Run(preferences=str(prefs), runs=str(tmp_path), methods=["ppo"]))
    with pytest.raises(SystemExit, match="--methods sft"):
        F.run(F.Run(preferences=str(prefs), runs=str(tmp_path), methods=["sft"]))


def test_the_protocol_s_rule_by_hand():
    P = F.protocol
    scores = {"a": 0.40, "b": 0.45, "c": 0.442, "d": None, "e": 0.30}
    costs = {"a": 1.0, "b": 9.0, "c": 5.0, "d": 0.1, "e": 0.5}
    assert P.choose(scores, costs) == "c"  # within 0.01 of b's 0.45 and cheaper; d has no score, e is far below
    assert P.choose(scores, {**costs, "c": 9.5}) == "b"
    assert P.choose({**scores, "c": 0.439}, costs) == "b"  # 0.011 below: not a tie
    assert P.choose({"a": 0.5, "b": 0.5}, {"a": 2.0, "b": 2.0}) == "a"  # equal cost: the grid's order
    assert P.choose({"a": 0.5, "b": 0.5}, {"a": None, "b": 3.0}) == "b"  # a known cost before an unknown one
    # no run reached the point the score is read at: the best fallback
    assert P.choose({"a": None, "b": None}, {"a": 1.0, "b": 2.0}, {"a": 0.2, "b": 0.3}) == "b"
    with pytest.raises(ValueError):
        P.choose({"a": None}, {"a": 1.0})
    assert P.grid(lambda x, y: f"--x {x} --y {y}", x=("1", "2"), y=("a", "b")) == {
        "x 1 y a": "--x 1 --y a", "x 1 y b": "--x 1 --y b", "x 2 y a": "--x 2 --y a", "x 2 y b": "--x 2 --y b"}


def test_the_grids_meet_the_protocol_and_the_three_prompt_sets_are_disjoint():
    assert set(F.TUNING) == {"dpo", "ppo", "grpo"}
    assert {len(g) for g in F.TUNING.values()} == {F.protocol.MIN_RUNS}  # the same budget for every method
    for method, settings in F.TUNING.items():  # each flag string parses as its script's arguments
        for flags in settings.values():
            args, _ = F.script_args(F.METHODS[method][0], flags.format(rm="vader", prefs="p.jsonl"), 1,
                                    F.Common(), "/tmp/unused")
            assert args.learning_rate > 0
    # PPO's batch axis up to its bound (512): 20 iterations, 4 minibatches, one micro-batch up to 32 responses,
    # micro-batches of 16 above
    for batch, minibatch, micro in (("64", 16, 16), ("128", 32, 32), ("256", 64, 16), ("512", 128, 16)):
        args, _ = F.script_args(F.rlhf, F.FLAGS["ppo"]("2.5e-5", "0.01", batch).format(rm="vader", prefs="p.jsonl"),
                                1, F.Common(), "/tmp/unused")
        F.rlhf.check_args(args)
        assert (args.num_iterations, args.minibatch_size, args.micro_batch_size) == (20, minibatch, micro)
    validation, test = set(shared.VALIDATION_PROMPTS), set(shared.load_eval_prompts(None, 64))
    assert len(validation) == len(shared.VALIDATION_PROMPTS) == 64 and len(test) == 64
    assert not validation & test and not validation & set(F.rlhf.PROMPTS) and not test & set(F.rlhf.PROMPTS)
    assert F.protocol.TUNING_SEED not in F.protocol.TEST_SEEDS


def test_tuning_runs_stop_at_the_kl_and_the_tuned_run_takes_the_rule_s_choice(tiny_frontier, monkeypatch):
    """Two PPO settings tuned on the validation prompts, their KLs scripted: one never reaches KL 3 (a whole
    run), one passes it at its third point (stopped there); the rule picks the second, which `run --tuned`
    runs in full on the test prompts; the report shows both."""
    common, runs = tiny_frontier["common"], Path(tiny_frontier["common"]["runs"])
    rl = ("--total-episodes 48 --batch-size 8 --num-minibatches 2 --update-epochs 1 --eval-every 2 "
          "--response-length 8 --min-response-length 4 --local-rollout-forward-batch-size 8 --kl-target None "
          "--reward-model {rm} --norm-batches 1")
    monkeypatch.setattr(F, "TUNING", {"ppo": {"lr 1e-3": f"--learning-rate 1e-3 {rl}",
                                              "lr 2e-3": f"--learning-rate 2e-3 {rl}"}})
    scripted = iter([1.0, 2.0, 2.5, 1.0, 4.0])  # lr 1e-3 at steps 2, 4, 6; lr 2e-3 at 2, 4 (then stopped)
    seen = []
    real_point = F.Frontier.point

    def point(self, policy):
        p = real_point(self, policy)
        seen.append(list(self.prompts))
        return p if policy is self.reference or not self.common.split == "validation" else {**p, "kl": next(scripted)}

    monkeypatch.setattr(F.Frontier, "point", point)
    F.tune(F.Tune(preferences=tiny_frontier["prefs"], methods=["ppo"], **common))
    assert all(s == shared.VALIDATION_PROMPTS[:3] for s in seen) and len(seen) == 6  # the initial point and five
    slow = json.loads((runs / "tuning" / "ppo" / f"lr_1e-3__{F.protocol.TUNING_SEED}.json").read_text())
    fast = json.loads((runs / "tuning" / "ppo" / f"lr_2e-3__{F.protocol.TUNING_SEED}.json").read_text())
    assert [p["step"] for p in slow["points"]] == [0, 2, 4, 6] and slow["stopped"] is False
    assert [p["step"] for p in fast["points"]] == [0, 2, 4] and fast["stopped"] is True
    assert [p["kl"] for p in fast["points"]] == [0.0, 1.0, 4.0] and "--seed 100" in fast["command"]
    assert F.tuned_settings(str(runs / "tuning"), ["ppo"]) == {"ppo": "lr 2e-3"}
    # the chosen setting, full length, at a test seed, on the test prompts
    seen.clear()
    F.run(F.Run(preferences=tiny_frontier["prefs"], methods=["ppo"], seeds=[4], tuned=True, **common))
    test_prompts = F.shared.load_eval_prompts(None, 3)
    assert seen and all(s == test_prompts for s in seen)
    record = json.loads((runs / "ppo" / "lr_2e-3__4.json").read_text())
    assert [p["step"] for p in record["points"]] == [0, 2, 4, 6] and "--learning-rate 2e-3" in record["command"]
    assert not (runs / "ppo" / "lr_1e-3__4.json").exists() and "stopped" not in record
    text = R.report(R.Report(runs=common["runs"], out=str(tiny_frontier["tmp"] / "page")))
    assert "| ppo | lr 2e-3 | 4 |" in text  # the tuned row (one seed: no interval)
    assert "| lr 1e-3 | not reached | - |" in text and "| lr 2e-3 | " in text.split("ppo's tuning runs")[1]


def test_a_tuned_run_waits_for_the_whole_grid(tiny_frontier, monkeypatch):
    monkeypatch.setattr(F, "TUNING", {"ppo": {"a": "--learning-rate 1e-3", "b": "--learning-rate 2e-3"}})
    monkeypatch.setattr(F, "Frontier", lambda *a: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit, match="0 of ppo's 2 tuning runs"):
        F.run(F.Run(preferences=tiny_frontier["prefs"], methods=["ppo"], seeds=[4], tuned=True,
                    **tiny_frontier["common"]))


def test_a_bf16_run_s_policy_is_measured_in_fp32_and_keeps_its_autocast(tiny):
    """A --bf16 run's policy (detail 53: its forward wrapped in bf16 autocast) gets the samples, gold and KL of
    the same weights without the wrapper: both precisions measured alike. The wrapper is back afterwards."""
    frontier = F.Frontier(F.Common(model_name=tiny["policy"], num_prompts=2, samples_per_prompt=2))
    plain = copy.deepcopy(frontier.reference)
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(0.05 * torch.randn_like(p))
    wrapped = copy.deepcopy(plain)
    F.dpo.autocast_bf16(True, torch.device("cpu"), wrapped)
    wrapped_forward = wrapped.forward
    with torch.no_grad():  # the moved weights of the wrapped copy, for the plain one too: the same weights
        for a, b in zip(plain.parameters(), wrapped.parameters()):
            a.copy_(b)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert not torch.equal(wrapped(ids).logits.float(), plain(ids).logits)  # bf16 computes otherwise
    measured, expected = frontier.measure(wrapped, 2), frontier.measure(plain, 2)
    assert measured["texts"] == expected["texts"] and not np.allclose(expected["kl"], 0.0)
    np.testing.assert_array_equal(measured["kl"], expected["kl"])
    np.testing.assert_array_equal(measured["gold"], expected["gold"])
    assert wrapped.forward is wrapped_forward and "forward" not in vars(plain)


def test_the_measure_s_kl_is_summed_over_each_response_s_real_tokens_by_hand(tiny, monkeypatch):
    """The frontier's KL of each sample, by hand: the sum over the response's tokens up to its stop (not the
    prompt's, not the padding) of log pi - log pi_ref at the sampling temperature, from plain forward passes on
    the unpadded ids; in the order of the prompts, then their samples."""
    frontier = F.Frontier(F.Common(model_name=tiny["policy"], num_prompts=3, samples_per_prompt=2))
    policy = copy.deepcopy(frontier.reference)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    passes, real_truncate = [], F.dpo.truncate_after_stop_token

    def truncate(responses, *args, **kwargs):
        out = real_truncate(responses, *args, **kwargs)
        passes.append((out[0].clone(), out[1].clone()))
        return out

    monkeypatch.setattr(F.dpo, "truncate_after_stop_token", truncate)
    m = frontier.measure(policy, 2, batch_size=4)
    tokenizer = frontier.tokenizer
    prompts = [p for p in frontier.prompts for _ in range(2)]
    expected, i = [], 0
    for responses, masks in passes:
        for response, mask in zip(responses, masks):
            query = tokenizer(prompts[i], truncation=True, max_length=frontier.args.max_query_length)["input_ids"]
            ids = torch.cat([torch.tensor(query), response[mask]])[None]
            total = 0.0
            for model, sign in ((policy, 1.0), (frontier.reference, -1.0)):
                with torch.no_grad():
                    logp = torch.log_softmax(model(ids).logits[0, :-1].double() / frontier.args.temperature, -1)
                steps = torch.arange(len(query) - 1, ids.shape[1] - 1)
                total += sign * float(logp[steps, ids[0, len(query) :]].sum())
            expected.append(total)
            i += 1
    assert i == 6 and not np.allclose(expected, 0.0)
    np.testing.assert_allclose(m["kl"].ravel(), expected, rtol=1e-4, atol=1e-5)


def test_a_point_s_means_and_standard_errors_are_over_prompts_by_hand(tiny, monkeypatch):
    """The unit of a point's statistics is the prompt: gold 0.1 to 0.6 for six samples of three prompts give the
    mean of the prompts' means and their standard error, not the samples' (which would be 0.0764, not 0.1)."""
    frontier = F.Frontier(F.Common(model_name=tiny["policy"], num_prompts=3, samples_per_prompt=2))
    gold = np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])
    kl = np.array([[1.0, 3.0], [2.0, 2.0], [0.0, 4.0]])
    monkeypatch.setattr(F.Frontier, "measure", lambda self, policy, n: {"gold": gold, "kl": kl, "texts": ["t"] * 6,
                                                                          "stop_share": 0.5})
    point = frontier.point(None)
    # prompt means 0.15, 0.35, 0.55: mean 0.35, std 0.2, standard error 0.2 / sqrt(3)
    assert point["gold"] == pytest.approx(0.35) and point["gold_se"] == pytest.approx(0.2 / math.sqrt(3))
    assert point["gold_per_prompt"] == pytest.approx([0.15, 0.35, 0.55])
    # KL prompt means 2, 2, 2: standard error 0, though the samples vary
    assert point["kl"] == pytest.approx(2.0) and point["kl_se"] == pytest.approx(0.0)


def test_the_tuned_table_counts_tuning_the_reward_model_and_one_run_all_in(tmp_path, monkeypatch):
    """Made-up records: DPO's two tuning runs took 3 and 5 CPU minutes, PPO's 10 and 30; each test seed passes
    KL 3 a quarter of the way from a point at KL 2 to one at KL 6 (gold 0.3 and 0.7: 0.4 at KL 3; minutes 2 and 6
    for DPO: 3.0, 8 and 12 for PPO: 9.0). All in: DPO 3 + 5 + 3 = 11, PPO 10 + 30 + the reward model's 20 + 9 = 69."""
    monkeypatch.setattr(F, "TUNING", {"dpo": {"a": "", "b": ""}, "ppo": {"c": "", "d": ""}})
    tuning = tmp_path / "tuning"

    def record(method, setting, seed, minutes, golds, kls, cpus):
        points = [{"kl": k, "gold": g, "gold_se": 0.02, "cpu_minutes": c, "step": i}
                  for i, (k, g, c) in enumerate(zip(kls, golds, cpus))]
        return {"method": method, "setting": setting, "seed": seed, "cpu_minutes": minutes, "points": points}

    (tuning / "dpo").mkdir(parents=True)
    (tuning / "ppo").mkdir()
    (tuning / "initial.json").write_text(json.dumps({"gold": 0.1, "gold_se": 0.01}))
    for method, setting, minutes, gold in [("dpo", "a", 3.0, 0.5), ("dpo", "b", 5.0, 0.2), ("ppo", "c", 10.0, 0.6),
                                           ("ppo", "d", 30.0, 0.1)]:
        run = record(method, setting, F.protocol.TUNING_SEED, minutes, [0.1, gold], [0.0, 4.0], [0.0, minutes])
        (tuning / method / f"{setting}__{F.protocol.TUNING_SEED}.json").write_text(json.dumps(run))
    tests = [record("dpo", "a", s, 9.0, [0.1, 0.3, 0.7], [0.0, 2.0, 6.0], [0.0, 2.0, 6.0]) for s in (4, 5)]
    tests += [record("ppo", "c", s, 20.0, [0.1, 0.3, 0.7], [0.0, 2.0, 6.0], [0.0, 8.0, 12.0]) for s in (4, 5)]
    text = "\n".join(R.tuned_lines(str(tuning), tests, rm_minutes=20.0))
    assert "| dpo | a | 4, 5 | 0.400 ± 0.000 | 0.020 | 3.0 | 2/2, 8.0 | 11.0 |" in text
    assert "| ppo | c | 4, 5 | 0.400 ± 0.000 | 0.020 | 9.0 | 2/2, 40.0 | 69.0 |" in text
    assert f"All in, DPO's CPU minutes are {11 / 69:.1%} of PPO's" in text
    assert "- dpo minus ppo: +0.000 ± 0.000 (inconclusive)" in text
    # without the reward model's minutes, PPO's all-in cost is not stated
    assert "| 2/2, 40.0 | - |" in "\n".join(R.tuned_lines(str(tuning), tests))
    # one seed: its gold without an interval, and no difference
    one = "\n".join(R.tuned_lines(str(tuning), tests[:1] + tests[2:3], rm_minutes=20.0))
    assert "| dpo | a | 4 | 0.400 (one seed, no interval) | 0.020 | 3.0 | 2/2, 8.0 | 11.0 |" in one
    assert "dpo minus ppo" not in one and "Differences" not in one


def test_a_method_whose_test_seeds_stop_below_kl_3_is_compared_at_kl_2_by_hand():
    """Made-up fresh records: DPO's three seeds pass KL 2 at gold 0.3, 0.4, 0.5 and reach KL 3; PPO's seed 7 ends at
    KL 2.5 (points at KL 1 and 2.5, gold 0.0 and 0.15: 0.1 at KL 2), its seeds 8 and 9 have points at KL 2 (0.2,
    0.3); GRPO's seed 11 ends at KL 1.5 (the records come out of seed order; the tables list seeds in order). At
    KL 2: DPO 0.4 ± 4.303 * 0.1 / sqrt(3) = 0.248, PPO 0.2 ± 0.248, GRPO none;
    DPO minus PPO 0.2, Welch with equal variances and 3 seeds each: 4 degrees of freedom, 2.776 * sqrt(2 * 0.01 / 3)
    = 0.227. A point's SE is read linearly too (PPO seed 7's 0.01 at KL 1, 0.03 at 2.5: 0.0233; the mean with
    0.03 and 0.03 is 0.028). Records of other splits and tuning seeds do not count."""

    def record(method, seed, points, split="fresh"):
        return {"method": method, "setting": "a", "seed": seed, "split": split, "cpu_minutes": 3.0,
                "points": [{"kl": k, "gold": g, "gold_se": se, "cpu_minutes": k} for k, g, se in points]}

    records = [record("dpo", s, [(0.0, 0.1, 0.01), (2.0, g, 0.03), (4.0, g + 0.2, 0.05)])
               for s, g in [(7, 0.3), (8, 0.4), (9, 0.5)]]
    records += [record("ppo", 7, [(0.0, 0.0, 0.01), (1.0, 0.0, 0.01), (2.5, 0.15, 0.03)])]
    records += [record("ppo", s, [(0.0, 0.1, 0.01), (2.0, g, 0.03), (4.0, 0.5, 0.05)]) for s, g in [(9, 0.3), (8, 0.2)]]
    records += [record("grpo", s, [(0.0, 0.1, 0.01), (k, 0.3, 0.03)]) for s, k in [(11, 1.5), (7, 4.0)]]
    records += [record("ppo", 4, [(0.0, 0.1, 0.01), (4.0, 0.9, 0.05)], split="test"),
                record("dpo", F.protocol.TUNING_SEED, [(0.0, 0.1, 0.01), (2.0, 0.9, 0.03)])]
    tuning = {m: ("8", 10.0) for m in ("dpo", "ppo", "grpo")}
    lines = R.test_lines({m: "a" for m in tuning}, records, tuning, 5.0, "fresh")
    assert "| ppo | a | 7, 8, 9: not all reach KL 3 | - | - | - | 8, 10.0 | - |" in lines
    assert "- dpo minus ppo: +0.200 ± 0.227 (inconclusive)" in lines
    at_2 = lines[lines.index("| method | test seeds | gold at KL 2 | per-point SE |"):]
    assert at_2[2:5] == ["| dpo | 7, 8, 9 | 0.400 ± 0.248 | 0.030 |", "| ppo | 7, 8, 9 | 0.200 ± 0.248 | 0.028 |",
                         "| grpo | 7, 11: not all reach KL 2 | - | - |"]
    assert "Differences at KL 2 on the test prompts" in at_2[6]
    assert at_2[8:] == ["- dpo minus ppo: +0.200 ± 0.227 (inconclusive)"]
    assert ("ppo's test seeds do not all reach KL 3 (their last points at KL 2.50, 4.00, 4.00). grpo's test seeds do "
            "not all reach KL 3 (their last points at KL 4.00, 1.50).") in lines[lines.index(at_2[0]) - 2]
    # every seed at KL 3 or beyond: no KL 2 part
    reached = [r for r in records if r["method"] == "dpo"]
    assert not any("KL 2" in line for line in R.test_lines({"dpo": "a"}, reached, {"dpo": ("8", 10.0)}, 5.0, "fresh"))


def test_the_search_reads_the_tuning_records_and_the_fresh_prompts_are_unread(tmp_path, monkeypatch):
    """search_results reads each record's gold and CPU minutes at KL 3 (linear between the points around it) by
    seed; the search asks for the runs its rule wants; `run --searched` refuses before the search is done, then
    takes the rule's choice, and the page's tables show it; the fresh test prompts are 64, distinct and in no
    other prompt list."""

    def record(setting, seed, gold_at_3, cpu=1.0):  # KL 0, 2, 4: KL 3 halfway between the last two points
        points = [{"kl": 0.0, "gold": 0.1, "cpu_minutes": 0.0}, {"kl": 2.0, "gold": gold_at_3 - 0.1, "cpu_minutes": cpu},
                  {"kl": 4.0, "gold": gold_at_3 + 0.1, "cpu_minutes": 3.0 * cpu}]
        folder = tmp_path / "dpo"
        folder.mkdir(exist_ok=True)
        (folder / f"{setting.replace(' ', '_')}__{seed}.json").write_text(json.dumps(
            {"method": "dpo", "setting": setting, "seed": seed, "points": points, "cpu_minutes": 3.0}))

    for name in F.protocol.first_grid(F.SEARCH["dpo"]):
        record(name, 100, 0.5 if name == "lr 1e-4 beta 0.1" else 0.3)
    first, second = F.search_results(str(tmp_path), "dpo")
    assert first["lr 1e-4 beta 0.1"] == (pytest.approx(0.5), pytest.approx(2.0)) and second == {}
    # lr inside; beta 0.1 the lowest: one factor (3) below, 0.0333; then the top two at seed 101: the choice and,
    # among the rest (all 0.3 at equal cost), the grid's first, lr 5e-5 beta 0.1 (not the first file's name)
    assert F.protocol.next_runs(F.SEARCH["dpo"], first, second) == [("lr 1e-4 beta 0.0333", 100)]
    with pytest.raises(SystemExit, match="dpo's search has 1 run left"):
        F.searched_settings(str(tmp_path), ["dpo"])
    record("lr 1e-4 beta 0.0333", 100, 0.2)
    record("lr 1e-4 beta 0.1", 101, 0.45)
    record("lr 5e-5 beta 0.1", 101, 0.3)
    first, second = F.search_results(str(tmp_path), "dpo")
    assert second == {"lr 1e-4 beta 0.1": pytest.approx(0.45), "lr 5e-5 beta 0.1": pytest.approx(0.3)}
    assert F.searched_settings(str(tmp_path), ["dpo"]) == {"dpo": "lr 1e-4 beta 0.1"}
    # the page: the search's paragraph and table, then the choice on the fresh prompts: seeds 7-9 at gold 0.4,
    # 0.5, 0.6 at KL 3 (t with 2 degrees of freedom: 4.303 * 0.1 / sqrt(3) = 0.248), 2.0 CPU minutes to KL 3;
    # the search's 11 runs of 3.0 minutes; a run of the choice on the earlier test prompts does not count
    tests = [{"method": "dpo", "setting": "lr 1e-4 beta 0.1", "seed": seed, "split": split, "cpu_minutes": 3.0,
              "points": [{"kl": 0.0, "gold": 0.1, "gold_se": 0.02, "cpu_minutes": 0.0},
                         {"kl": 2.0, "gold": gold - 0.1, "gold_se": 0.02, "cpu_minutes": 1.0},
                         {"kl": 4.0, "gold": gold + 0.1, "gold_se": 0.02, "cpu_minutes": 3.0}]}
             for seed, gold, split in [(7, 0.4, "fresh"), (8, 0.5, "fresh"), (9, 0.6, "fresh"), (4, 0.9, "test")]]
    monkeypatch.setattr(F, "SEARCH", {"dpo": F.SEARCH["dpo"]})
    monkeypatch.setattr(F, "TUNING", {"dpo": {"lr 5e-5 beta 0.3": ""}})
    page = "\n".join(R.searched_lines(str(tmp_path), tests))
    assert "**dpo**: 9 settings at seed 100 (8 of the first grid's 8, 1 beyond it), 2 at seed 101; 33.0 CPU " \
           "minutes in all. Chosen: `lr 1e-4 beta 0.1`; on its axes: lr inside; beta inside." in page
    assert "| lr 5e-5 beta 0.3 (earlier) | 0.300 | - | 2.0 |  |" in page
    assert "| lr 1e-4 beta 0.0333 (beyond the grid) | 0.200 | - | 2.0 |  |" in page
    assert "| dpo | lr 1e-4 beta 0.1 | 7, 8, 9 | 0.500 ± 0.248 | 0.020 | 2.0 | 11, 33.0 | 35.0 |" in page
    monkeypatch.setattr(F, "TUNING", {"dpo": {name: "" for name in first}})
    assert R.searched_lines(str(tmp_path), tests) == []  # nothing run beyond the earlier grids: no section
    # a setting within 0.01 of the best at half its CPU minutes to KL 3 (1.0 against 2.0) is the rule's choice,
    # once its edge (beta 0.0333) and its second seed have run: `run --searched` takes it, not the highest gold
    record("lr 2e-4 beta 0.1", 100, 0.495, cpu=0.5)
    with pytest.raises(SystemExit, match="dpo's search has 1 run left"):
        F.searched_settings(str(tmp_path), ["dpo"])
    monkeypatch.setattr(F, "TUNING", {"dpo": {"lr 5e-5 beta 0.3": ""}})  # a search with runs left: no test row
    page = "\n".join(R.searched_lines(str(tmp_path), tests))
    assert "Not finished: 1 run left." in page and "| dpo | (search not finished) | - | - |" in page
    record("lr 2e-4 beta 0.0333", 100, 0.2)
    # only the new runner-up's second seed left: the choice is final, `run --searched` and the page's test row take it
    assert F.protocol.next_runs(F.SEARCH["dpo"], *F.search_results(str(tmp_path), "dpo")) == [("lr 2e-4 beta 0.1", 101)]
    assert F.searched_settings(str(tmp_path), ["dpo"]) == {"dpo": "lr 2e-4 beta 0.1"}
    assert "| dpo | lr 2e-4 beta 0.1 | none yet | - |" in "\n".join(R.searched_lines(str(tmp_path), tests))
    record("lr 2e-4 beta 0.1", 101, 0.4)
    assert F.searched_settings(str(tmp_path), ["dpo"]) == {"dpo": "lr 2e-4 beta 0.1"}
    fresh = set(shared.FRESH_TEST_PROMPTS)
    others = (set(shared.VALIDATION_PROMPTS) | set(shared.load_eval_prompts(None, 64)) | set(F.rlhf.PROMPTS)
              | set(F.rlhf.EVAL_PROMPTS))
    assert len(fresh) == len(shared.FRESH_TEST_PROMPTS) == 64 and not fresh & others


def test_prompts_lists_the_fresh_test_prompts_and_the_runs_that_read_each_split(tmp_path, monkeypatch, capsys):
    """`prompts`: the fresh test prompts, and the recorded runs counted by the prompts they read (a record's
    split; before the field existed, validation under tuning/ and the earlier test prompts elsewhere; best-of-n
    and the initial point are no runs); a fresh prompt that repeats, or is also a prompt of another list or of
    the preference file, is a clear error."""
    prefs = write_preferences(tmp_path / "prefs.jsonl", ["A prompt of the file,"])
    run = {"method": "dpo", "setting": "s", "points": [{"kl": 0.0, "gold": 0.1}]}
    for where, extra in [("tuning/dpo/a__100", {}), ("tuning/ppo/b__101", {"split": "validation"}),
                         ("dpo/c__1", {}), ("dpo/d__7", {"split": "fresh"}), ("grpo/e__8", {"split": "fresh"}),
                         ("best_of_n/N4", {"method": "best_of_n"})]:
        (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"{where}.json").write_text(json.dumps({**run, "seed": int(where.split("__")[-1][-1]), **extra}))
    (tmp_path / "initial.json").write_text(json.dumps({"gold": 0.1, "gold_se": 0.0}))
    text = F.list_prompts(F.Prompts(runs=str(tmp_path), preferences=prefs))
    assert text.splitlines()[1:] == shared.FRESH_TEST_PROMPTS
    assert text.splitlines()[0].endswith("by the prompts they read: fresh 2 (seeds [7, 8]), test 1, validation 2")
    fresh = list(shared.FRESH_TEST_PROMPTS)
    for planted, error in [(fresh[:63] + [fresh[0]], "repeat 1 of themselves"),
                           (fresh[:63] + [shared.VALIDATION_PROMPTS[5]], "1 fresh test prompts are validation"),
                           (fresh[:63] + [shared.load_eval_prompts(None, 64)[9]], "are earlier test prompts"),
                           (fresh[:63] + ["A prompt of the file, "], "are preference file prompts too")]:
        monkeypatch.setattr(shared, "FRESH_TEST_PROMPTS", planted)
        with pytest.raises(SystemExit, match=error):
            F.list_prompts(F.Prompts(runs=str(tmp_path), preferences=prefs))
