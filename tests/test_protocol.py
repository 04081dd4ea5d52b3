"""experiments/protocol.py's search, on small made-up score tables: the first grid runs whole; a choice at an
edge of an axis runs the value beyond it (a value another run has, else one factor beyond, within the axis's
range); a choice inside every axis stops the search; the cap holds; ties go to the cheaper setting; the top two
get a second seed, and a flip is reported. Expected settings are written out by hand."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("protocol", os.path.join(ROOT, "experiments", "protocol.py"))
protocol = importlib.util.module_from_spec(spec)
spec.loader.exec_module(protocol)
Axis, next_runs, FIRST, SECOND = protocol.Axis, protocol.next_runs, protocol.TUNING_SEED, protocol.SECOND_SEED

AXES = {"lr": Axis(("1e-5", "2e-5", "4e-5", "8e-5")), "G": Axis(("4", "8"), low=2, high=16)}
GRID = ["lr 1e-5 G 4", "lr 1e-5 G 8", "lr 2e-5 G 4", "lr 2e-5 G 8", "lr 4e-5 G 4", "lr 4e-5 G 8",
        "lr 8e-5 G 4", "lr 8e-5 G 8"]


def table(best: str, others: float = 0.3, cost: float = 1.0, **scores) -> dict:
    """{setting: (score, CPU minutes)} over GRID: `best` at 0.6, the rest at `others` unless given."""
    out = {name: (others, cost) for name in GRID}
    out[best] = (0.6, cost)
    out.update(scores)
    return out


def test_the_first_grid_is_every_combination_in_order_and_runs_before_anything_else():
    assert protocol.first_grid(AXES) == GRID
    assert next_runs(AXES, {}, {}) == [(name, FIRST) for name in GRID]
    half = {name: (0.5, 1.0) for name in GRID[:5]}
    assert next_runs(AXES, half, {}) == [(name, FIRST) for name in GRID[5:]]


def test_a_choice_at_the_top_of_the_learning_rate_runs_one_factor_beyond_it():
    # lr 8e-5 G 4: the highest lr (edge), and G 4 has G 8 above it but nothing below: two runs, in the axes' order
    assert next_runs(AXES, table("lr 8e-5 G 4"), {}) == [("lr 1.6e-4 G 4", FIRST), ("lr 8e-5 G 2", FIRST)]


def test_a_choice_inside_every_axis_ends_the_search_with_the_top_two_at_a_second_seed():
    # G 8 is the top of its axis: give the grid a G 16 row so that G 8 sits inside
    axes = {"lr": AXES["lr"], "G": Axis(("4", "8", "16"), low=2, high=16)}
    first = {protocol.setting_name({"lr": lr, "G": g}): (0.3, 1.0) for lr in axes["lr"].values for g in ("4", "8", "16")}
    first["lr 2e-5 G 8"], first["lr 4e-5 G 16"] = (0.6, 1.0), (0.5, 1.0)
    assert next_runs(axes, first, {}) == [("lr 2e-5 G 8", SECOND), ("lr 4e-5 G 16", SECOND)]
    assert next_runs(axes, first, {"lr 2e-5 G 8": 0.5}) == [("lr 4e-5 G 16", SECOND)]
    assert next_runs(axes, first, {"lr 2e-5 G 8": 0.5, "lr 4e-5 G 16": 0.4}) == []
    assert protocol.edges(axes, first) == {"lr": "inside", "G": "inside"}


def test_the_range_stops_an_axis_and_an_extension_fills_the_other_axis_from_the_values_run():
    # best at G 2 (an extension, at the axis's low end) and lr 1e-5: lower lr runs, lower G is not allowed
    first = table("lr 1e-5 G 4", **{"lr 1e-5 G 2": (0.7, 1.0)})
    assert next_runs(AXES, first, {}) == [("lr 5e-6 G 2", FIRST), ("lr 2e-5 G 2", FIRST)]
    assert protocol.edges(AXES, first, cap=1) == {"lr": "lowest (cap reached), highest (cap reached)",
                                                  "G": "lowest (none allowed)"}
    # the second neighbour along lr is lr 2e-5, a value the grid has, not 1e-5 * 2 computed again


def test_the_cap_holds_and_a_choice_still_at_an_edge_is_reported():
    axes = {"lr": AXES["lr"]}
    first = {"lr 1e-5": (0.6, 1.0), "lr 2e-5": (0.5, 1.0), "lr 4e-5": (0.4, 1.0), "lr 8e-5": (0.3, 1.0)}
    score = 0.6
    for lr in ("5e-6", "2.5e-6", "1.25e-6", "6.25e-7", "3.13e-7", "1.57e-7"):
        assert next_runs(axes, first, {}, cap=6) == [(f"lr {lr}", FIRST)]
        score += 0.05  # each lower rate better by more than TIE: the choice stays at the edge
        first[f"lr {lr}"] = (score, 1.0)
    # six runs beyond the grid: nothing more at the first seed, the top two at the second
    assert next_runs(axes, first, {}, cap=6) == [("lr 1.57e-7", SECOND), ("lr 3.13e-7", SECOND)]
    assert protocol.edges(axes, first, cap=6) == {"lr": "lowest (cap reached)"}
    (name, seed), = next_runs(axes, first, {}, cap=7)
    assert seed == FIRST and name.startswith("lr 7.8") and name.endswith("e-8")
    # a choice within TIE of a better one at the edge goes to the cheaper (here the inside) setting: done
    first["lr 1.57e-7"] = (score, 5.0)
    first["lr 3.13e-7"] = (score - protocol.TIE / 2, 1.0)
    assert protocol.edges(axes, first, cap=6) == {"lr": "inside"}


def test_ties_go_to_the_cheaper_setting_and_the_search_follows_the_tie_s_choice():
    # lr 8e-5 G 8 scores highest but lr 2e-5 G 8 is within TIE and cheaper: it is chosen, and it sits inside
    # along lr, at the top of G: G 16 runs there, not lr 1.6e-4
    first = table("lr 8e-5 G 8", cost=2.0, **{"lr 2e-5 G 8": (0.6 - protocol.TIE / 2, 1.0)})
    assert protocol.choose({k: v[0] for k, v in first.items()}, {k: v[1] for k, v in first.items()}) == "lr 2e-5 G 8"
    assert next_runs(AXES, first, {}) == [("lr 2e-5 G 16", FIRST)]


def test_a_second_seed_that_reverses_the_top_two_is_reported_as_a_flip():
    first = table("lr 2e-5 G 8", **{"lr 4e-5 G 4": (0.55, 1.0)})
    result = protocol.second_seed(first, {"lr 2e-5 G 8": 0.40, "lr 4e-5 G 4": 0.50})
    assert result["chosen"] == "lr 2e-5 G 8" and result["by_mean"] == "lr 4e-5 G 4" and result["flips"]
    assert result["rows"]["lr 2e-5 G 8"] == pytest.approx((0.6, 0.4, 0.5))
    kept = protocol.second_seed(first, {"lr 2e-5 G 8": 0.58, "lr 4e-5 G 4": 0.50})
    assert kept["by_mean"] == "lr 2e-5 G 8" and not kept["flips"]
    # the choice alone at the second seed, however low it reads there, says nothing of a flip yet
    half = protocol.second_seed(first, {"lr 2e-5 G 8": 0.10})
    assert half["by_mean"] is None and not half["flips"] and half["rows"]["lr 2e-5 G 8"] == pytest.approx((0.6, 0.1, 0.35))


@pytest.mark.parametrize("value, direction, axis, expected", [
    ("1.41e-5", 1, Axis(("1",)), "2.82e-5"), ("7e-6", -1, Axis(("1",)), "3.5e-6"), ("16", 1, Axis(("1",)), "32"),
    ("0.04", 1, Axis(("1",)), "0.08"), ("16", 1, Axis(("1",), factor=4, high=64), "64"),
    ("64", 1, Axis(("1",), factor=4, high=64), None), ("2", -1, Axis(("1",), low=2), None),
    ("8e-5", 1, Axis(("1",)), "1.6e-4"), ("6.25e-7", -1, Axis(("1",)), "3.13e-7")])
def test_one_step_beyond_is_written_as_the_grid_writes_numbers(value, direction, axis, expected):
    assert protocol.step_beyond(axis, value, direction) == expected


def test_search_runs_rounds_until_every_method_is_done_and_stops_on_runs_that_record_nothing():
    truth = {"lr": {"1e-5": 0.2, "2e-5": 0.5, "4e-5": 0.4, "8e-5": 0.1}, "G": {"2": 0.0, "4": 0.1, "8": -0.05, "16": 0.0}}
    recorded, rounds = {"m": ({}, {})}, []

    def run(todo):
        rounds.append(todo)
        for method, name, seed in todo:
            s = protocol.parse_setting(name, AXES)
            score = truth["lr"].get(s["lr"], 0.0) + truth["G"][s["G"]]
            (recorded[method][0].__setitem__(name, (score, 1.0)) if seed == FIRST else
             recorded[method][1].__setitem__(name, score - 0.05))

    protocol.search({"m": AXES}, lambda m: recorded[m], run)
    # round 1 the grid; round 2 G 2 below the choice lr 2e-5 G 4; round 3 the top two at the second seed
    assert [len(r) for r in rounds] == [8, 1, 2]
    assert rounds[1] == [("m", "lr 2e-5 G 2", FIRST)]
    assert rounds[2] == [("m", "lr 2e-5 G 4", SECOND), ("m", "lr 4e-5 G 4", SECOND)]
    with pytest.raises(SystemExit, match="did not record"):
        protocol.search({"m": AXES}, lambda m: ({}, {}), lambda todo: None)


def test_a_setting_name_must_name_the_axes_in_order():
    assert protocol.parse_setting("lr 1e-5 G 4", AXES) == {"lr": "1e-5", "G": "4"}
    for bad in ("G 4 lr 1e-5", "lr 1e-5", "lr 1e-5 G 4 beta 0"):
        with pytest.raises(ValueError):
            protocol.parse_setting(bad, AXES)


def test_the_t_interval_reads_the_quantile_of_n_minus_1_degrees_of_freedom_by_hand():
    # [1, 2, 3]: mean 2, std 1, t(0.975, 2) = 4.303: 4.303 / sqrt(3)
    assert protocol.mean_interval([1, 2, 3]) == pytest.approx((2.0, 4.303 / 3**0.5, 1.0))
    # 1..7: std sqrt(28 / 6), t(0.975, 6) = 2.447
    assert protocol.mean_interval(range(1, 8))[1] == pytest.approx(2.447 * (28 / 6) ** 0.5 / 7**0.5)
    # 26 values: 25 degrees of freedom, halfway between the table's 20 (2.086) and 30 (2.042): 2.064
    values = [0.0, 1.0] * 13
    std = (26 * 0.25 / 25) ** 0.5
    assert protocol.mean_interval(values)[1] == pytest.approx(2.064 * std / 26**0.5)
    assert protocol.mean_interval([5.0]) == (5.0, 0.0, 0.0)


def test_the_welch_interval_by_hand():
    # variances of the means 1/3 and (20/3)/4 = 5/3; dof (2)^2 / ((1/3)^2 / 2 + (5/3)^2 / 3) = 4.0755;
    # t between 4 (2.776) and 5 (2.571): 2.776 - 0.0755 * 0.205
    d, half = protocol.difference_interval([1, 2, 3], [2, 4, 6, 8])
    dof = 4 / ((1 / 3) ** 2 / 2 + (5 / 3) ** 2 / 3)
    assert d == -3.0 and half == pytest.approx((2.776 - (dof - 4) * 0.205) * 2**0.5)
    assert protocol.difference_interval([1, 1], [2, 2]) == (-1.0, 0.0)


def test_an_edge_s_next_value_is_the_nearest_one_run_before_a_new_step():
    # lr values 3x apart, factor 2: at the extension G 2 (lr 3e-5) the lr line holds nothing else, and its
    # neighbours are the grid's 1e-5 and 9e-5, not 3e-5 / 2 and 3e-5 * 2
    axes = {"lr": Axis(("1e-5", "3e-5", "9e-5", "2.7e-4")), "G": Axis(("4", "8"), low=2, high=16)}
    first = {protocol.setting_name({"lr": lr, "G": g}): (0.3, 1.0) for lr in axes["lr"].values for g in ("4", "8")}
    first["lr 3e-5 G 4"], first["lr 3e-5 G 2"] = (0.5, 1.0), (0.6, 1.0)
    assert next_runs(axes, first, {}) == [("lr 1e-5 G 2", FIRST), ("lr 9e-5 G 2", FIRST)]


def test_the_page_s_search_report_counts_runs_marks_the_choice_and_its_edges_by_hand():
    # lr 8e-5 G 4 at the top of lr; G 8 above it, G 2 below run (no score); two runs beyond the grid reach the
    # cap of 2 before lr's next value; the runner-up lr 4e-5 G 4 beats the choice at the second seed: a flip
    first = table("lr 8e-5 G 4", **{"lr 4e-5 G 4": (0.55, 2.0), "lr 4e-5 G 2": (0.2, 1.0),
                                    "lr 8e-5 G 2": (None, None)})
    second = {"lr 8e-5 G 4": 0.4, "lr 4e-5 G 4": 0.7}
    lines = protocol.search_report("RLOO", AXES, first, second, 12.34, "accuracy", "CPU minutes",
                                   lambda v: "n/a" if v is None else f"{v:.0%}", {"lr 1e-5 G 4"}, cap=2)
    assert lines[0] == ("**RLOO**: 10 settings at seed 100 (8 of the first grid's 8, 2 beyond it), 2 at seed 101; "
                        "12.3 CPU minutes in all. Chosen: `lr 8e-5 G 4`; on its axes: lr highest (cap reached); "
                        "G inside. The mean of seeds 100 and 101 would choose `lr 4e-5 G 4` instead: the choice "
                        "flips.")
    rows = lines[4:-1]
    assert rows[0] == "| lr 1e-5 G 4 (earlier) | 30% | - | 1.0 |  |"
    assert rows[4] == "| lr 4e-5 G 4 | 55% | 70% | 2.0 |  |" and rows[6] == "| lr 8e-5 G 4 | 60% | 40% | 1.0 | chosen |"
    assert rows[8:] == ["| lr 4e-5 G 2 (beyond the grid) | 20% | - | 1.0 |  |",
                        "| lr 8e-5 G 2 (beyond the grid) | n/a | - | n/a |  |"]
    # before the second seed: the runs left are counted, no verdict on a flip
    assert protocol.search_report("RLOO", AXES, first, {}, 1.0, "accuracy", "CPU minutes", str, cap=2)[0].endswith(
        "G inside. Not finished: 2 runs left.")
    assert "lr highest (not run yet)" in protocol.search_report("RLOO", AXES, first, {}, 1.0, "a", "c", str)[0]
    # the choice alone at the second seed: one run left, still no verdict on a flip
    assert protocol.search_report("RLOO", AXES, first, {"lr 8e-5 G 4": 0.1}, 1.0, "accuracy", "CPU minutes", str,
                                  cap=2)[0].endswith("1 at seed 101; 1.0 CPU minutes in all. Chosen: `lr 8e-5 G 4`; on "
                                                     "its axes: lr highest (cap reached); G inside. Not finished: 1 run "
                                                     "left.")
    assert "at most 6 runs beyond the grid" in protocol.rule_text("score", "CPU minutes", "1 point")


def test_the_test_runs_take_the_rule_s_choice_once_each_search_asked_for_is_done():
    """searched_choices, what both harnesses' `run --searched` read: the rule's choice (a tie within TIE to the
    cheaper, not the highest score), for the methods asked only; a method with runs left stops it, naming the
    command that runs them."""
    axes = {"lr": AXES["lr"], "G": Axis(("4", "8", "16"), low=2, high=16)}
    done = {protocol.setting_name({"lr": lr, "G": g}): (0.3, 2.0) for lr in axes["lr"].values for g in ("4", "8", "16")}
    done["lr 2e-5 G 16"], done["lr 4e-5 G 8"] = (0.6, 2.0), (0.6 - protocol.TIE / 2, 1.0)  # a tie, half the cost
    seconds = {"lr 4e-5 G 8": 0.5, "lr 2e-5 G 16": 0.5}
    results = {"a": (done, seconds), "b": (dict(list(done.items())[:5]), {})}  # b: its first grid not run
    assert protocol.searched_choices({"a": axes, "b": axes}, results.get, ["a"], "x") == {"a": "lr 4e-5 G 8"}
    # the second seed's runs left do not hold the test runs back: they cannot move the choice
    assert next_runs(axes, done, {}) == [("lr 4e-5 G 8", protocol.SECOND_SEED), ("lr 2e-5 G 16", protocol.SECOND_SEED)]
    assert protocol.searched_choices({"a": axes}, {"a": (done, {})}.get, ["a"], "x") == {"a": "lr 4e-5 G 8"}
    with pytest.raises(SystemExit, match=r"^error: --searched: b's search has 7 runs left; run `x search` first$"):
        protocol.searched_choices({"a": axes, "b": axes}, results.get, ["a", "b"], "x search")
