"""The course-exercise scripts in experiments/: the clip-objective curve is the code's own and flat exactly where
theory says; the epsilon ablation builds the benchmark runs it means to and rejects bad input before running;
the numbers behind the figures and tables of the clip objective, the epsilon ablation and the KL-vs-collapse
study, worked out by hand on small inputs. Also benchmarks/preference_baselines.py, a tool outside the
scripts."""

import argparse
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(name, folder="experiments"):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, folder, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


clip_objective = load("clip_objective")
epsilon_ablation = load("epsilon_ablation")


@pytest.mark.parametrize("clip_coef", [0.1, 0.2, 0.3])
@pytest.mark.parametrize("advantage", [1.5, -0.7])
def test_clip_curve_is_flat_exactly_where_the_clip_binds(advantage, clip_coef):
    ratios = np.linspace(0.0, 2.0, 401)[1:]
    ratios = ratios[np.abs(np.abs(ratios - 1) - clip_coef) > 1e-6]  # not on the kinks themselves
    objective, grad = clip_objective.surrogate_curve(advantage, clip_coef, ratios)
    # slow and obvious: the textbook per-sample objective, and where its derivative is 0
    expected = np.minimum(ratios * advantage, np.clip(ratios, 1 - clip_coef, 1 + clip_coef) * advantage)
    np.testing.assert_allclose(objective, expected, rtol=1e-12, atol=1e-12)
    flat = ratios > 1 + clip_coef if advantage > 0 else ratios < 1 - clip_coef
    assert flat.any() and (~flat).any()
    assert np.all(grad[flat] == 0.0)
    np.testing.assert_allclose(grad[~flat], advantage, rtol=1e-12)


def test_epoch_stats_zero_the_gradient_only_on_the_side_of_the_advantage():
    ratio = np.array([0.5, 0.9, 1.3, 0.5, 1.1, 1.3], dtype=np.float32)
    adv = np.array([1.0, 1.0, 1.0, -1.0, -1.0, -1.0], dtype=np.float32)
    calls = [(ratio[:3], adv[:3]), (ratio[3:], adv[3:])]  # one epoch of two minibatches
    stats = clip_objective.epoch_stats(calls, num_minibatches=2, clip_coef=0.2)
    assert stats["clipfrac"] == [pytest.approx(4 / 6)]  # 0.5, 1.3, 0.5, 1.3 lie outside 1 +- 0.2
    assert stats["zero_grad"] == [pytest.approx(2 / 6)]  # only 1.3 with A > 0 and 0.5 with A < 0 stop pulling
    r = ratio.astype(np.float64)
    assert stats["approx_kl"] == [pytest.approx(np.mean(r - 1 - np.log(r)))]


def test_epsilon_ablation_builds_one_benchmark_setting_per_env_and_clip_coef():
    args = epsilon_ablation.Args(clip_coefs=[0.05, 0.5], cartpole_seeds=[1, 2], cartpole_timesteps=1000,
                                 walker_seeds=[3], walker_timesteps=2000, name="x")
    got = [(env, coef, b.scripts, b.seeds, b.total_timesteps, b.extra_args, b.name)
           for env, coef, b in epsilon_ablation.settings(args)]
    assert got == [
        ("CartPole-v1", 0.05, ["ppo_cartpole.py"], [1, 2], 1000, "--clip-coef 0.05", "x/CartPole-v1/clip0.05"),
        ("CartPole-v1", 0.5, ["ppo_cartpole.py"], [1, 2], 1000, "--clip-coef 0.5", "x/CartPole-v1/clip0.5"),
        ("Walker2d-v5", 0.05, ["ppo_walker2d.py"], [3], 2000, "--clip-coef 0.05", "x/Walker2d-v5/clip0.05"),
        ("Walker2d-v5", 0.5, ["ppo_walker2d.py"], [3], 2000, "--clip-coef 0.5", "x/Walker2d-v5/clip0.5"),
    ]


@pytest.mark.parametrize("kw, flag", [({"envs": ["Hopper-v5"]}, "--envs"), ({"clip_coefs": [0.2, 0.0]}, "--clip-coefs"),
                                      ({"parallel": 0}, "--parallel")])
def test_epsilon_ablation_rejects_bad_input_before_running(kw, flag, tmp_path):
    with pytest.raises(SystemExit, match=flag):
        epsilon_ablation.main(epsilon_ablation.Args(name="never_run", out=str(tmp_path), **kw))
    assert not os.listdir(tmp_path)
    assert not os.path.exists(os.path.join(ROOT, "benchmarks", "runs", "never_run"))


# ---------------------------------------- issue 41: what the experiments compute for their figures and tables


def test_epoch_stats_of_later_epochs_pair_each_ratio_with_its_own_advantage():
    # one update of 2 epochs x 2 minibatches over the same 4 samples, with advantages +1, -1, -1, +1; the
    # second epoch reshuffles them (samples 1, 0, 3, 2), so its advantages arrive in another order
    adv = np.array([1.0, -1.0, -1.0, 1.0], dtype=np.float32)
    first = np.array([0.5, 1.3, 1.1, 0.7], dtype=np.float32)  # epoch 1: samples 0-3
    second = np.array([0.6, 1.5, 1.25, 0.9], dtype=np.float32)  # epoch 2: samples 1, 0, 3, 2
    order = [1, 0, 3, 2]
    calls = [(first[:2], adv[:2]), (first[2:], adv[2:]),
             (second[:2], adv[order][:2]), (second[2:], adv[order][2:])]
    stats = clip_objective.epoch_stats(calls, num_minibatches=2, clip_coef=0.2)
    np.testing.assert_allclose(np.concatenate(stats["ratios"]), np.concatenate([first, second]))
    # outside 1 +- 0.2: 0.5, 1.3, 0.7; then 0.6, 1.5, 1.25
    assert stats["clipfrac"] == [pytest.approx(3 / 4), pytest.approx(3 / 4)]
    # epoch 1: 0.5 and 0.7 have A > 0, 1.3 has A < 0: each on the side where the min keeps r * A, none flat;
    # epoch 2: 0.6 (A < 0), 1.5 and 1.25 (A > 0) are past the clip on their advantage's side, 0.9 is not
    assert stats["zero_grad"] == [0.0, pytest.approx(3 / 4)]
    for epoch, r in enumerate((first, second)):
        r = r.astype(np.float64)
        assert stats["approx_kl"][epoch] == pytest.approx(sum(x - 1 - np.log(x) for x in r) / 4, rel=1e-12)


def ablation_run(seed, returns, evaluation, approx_kl, clipfrac, wall):
    steps = [100.0 * (i + 1) for i in range(len(approx_kl))]
    return {"seed": seed, "train_return": returns, "eval_return": evaluation, "approx_kl": approx_kl,
            "approx_kl_steps": steps, "clipfrac": clipfrac, "clipfrac_steps": steps,
            "process_wall_seconds": wall, "steps": steps, "returns": [returns] * len(steps)}


def test_epsilon_ablation_table_rows_by_hand(tmp_path):
    args = epsilon_ablation.Args(envs=["CartPole-v1"], clip_coefs=[0.2, 0.5], cartpole_seeds=[1, 2],
                                 cartpole_timesteps=1000, eval_episodes=3, name="t")
    (_, _, bargs), _ = epsilon_ablation.settings(args)
    results = {"CartPole-v1": {
        # approx_kl: run means 0.02 and 0.06; clipfrac: run means 0.2 and 0.4
        0.2: [ablation_run(1, 100.0, 10.0, [0.01, 0.03], [0.1, 0.3], 30.0),
              ablation_run(2, 200.0, 30.0, [0.05, 0.07], [0.3, 0.5], 50.0)],
        # approx_kl: run means 0.1 and 0.1; clipfrac: run means 0.5 and 0.6 (wall times 10, 20, median 15)
        0.5: [ablation_run(1, 50.0, 40.0, [0.1], [0.5], 10.0),
              ablation_run(2, 70.0, 40.0, [0.1], [0.6], 20.0)],
    }}
    md = tmp_path / "t.md"
    epsilon_ablation.write_page(args, results, {"CartPole-v1": bargs}, "python experiments/x.py", str(md))
    page = md.read_text()
    # mean ± std over the seeds of each run's mean over its updates
    assert ("| 0.2 (default) | 150.00 ± 50.00 | 20.00 ± 10.00 | 100.0, 200.0 | 0.0400 ± 0.0200 "
            "| 0.300 ± 0.100 | 40 |") in page
    assert ("| 0.5 | 60.00 ± 10.00 | 40.00 ± 0.00 | 50.0, 70.0 | 0.1000 ± 0.0000 | 0.550 ± 0.050 "
            "| 15 |") in page


def test_epsilon_ablation_mean_curve_ends_with_the_shortest_run_and_smooths_by_hand():
    runs = [{"x": [0.0, 10.0, 20.0, 30.0], "y": [1.0, 3.0, 5.0, 7.0]},
            {"x": [0.0, 10.0, 20.0], "y": [2.0, 2.0, 8.0]}]
    grid, curves = epsilon_ablation.mean_curve(runs, "x", "y", smooth=2, points=5)
    # trailing means over 2: [1, 2, 4, 6] and [2, 2, 5], interpolated on 0, 5, ..., 20 (the shorter run's end)
    np.testing.assert_allclose(grid, [0.0, 5.0, 10.0, 15.0, 20.0])
    np.testing.assert_allclose(curves, [[1.0, 1.5, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 3.5, 5.0]])


def test_epsilon_ablation_reads_the_k3_approx_kl_and_the_clipfrac_each_update_logged(tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    benchmark = epsilon_ablation.benchmark
    monkeypatch.setattr(benchmark, "run_dir_of", lambda bargs, script, seed: str(tmp_path / f"seed{seed}"))
    args = epsilon_ablation.Args(envs=["CartPole-v1"], clip_coefs=[0.2], cartpole_seeds=[1], name="t")
    ((_, _, bargs),) = epsilon_ablation.settings(args)
    writer = SummaryWriter(str(tmp_path / "seed1" / "run"))
    for step, (k1, k3, clipfrac) in enumerate([(-0.01, 0.002, 0.1), (0.03, 0.004, 0.3)], 1):
        for tag, value in (("old_approx_kl", k1), ("approx_kl", k3), ("clipfrac", clipfrac)):
            writer.add_scalar(f"losses/{tag}", value, 256 * step)
        writer.add_scalar("charts/episodic_return", 10.0 * step, 256 * step)
        writer.add_scalar("charts/SPS", 1000, 256 * step)
    writer.close()
    (run,) = epsilon_ablation.read_setting(bargs)
    assert run["approx_kl"] == pytest.approx([0.002, 0.004]) and run["approx_kl_steps"] == [256, 512]
    assert run["clipfrac"] == pytest.approx([0.1, 0.3]) and run["clipfrac_steps"] == [256, 512]


kl_vs_collapse = load("rlhf_kl_vs_collapse")
COLLAPSE_TAGS = ("objective/scores", "objective/kl", "losses/entropy", "val/distinct_2",
                 "val/distinct_responses")


def collapse_curves():
    """Two seeds of 7 iterations for kl_coef 0 and 1; every tag of seed 1 is a, of seed 2 b."""
    def run(a, b):
        return {tag: np.array(a if i % 2 == 0 else b, dtype=float) for i, tag in enumerate(COLLAPSE_TAGS)}

    return {0.0: [run([9, 9, 1, 2, 3, 4, 5], [0, 0, 1, 1, 1, 1, 1]),
                  run([9, 9, 3, 4, 5, 6, 7], [0, 0, 2, 2, 3, 4, 4])],
            1.0: [run([0, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]),
                  run([0, 0, 0, 0, 0, 0, 2], [1, 1, 1, 1, 1, 1, 1])]}


def test_kl_vs_collapse_curves_are_the_mean_and_range_over_seeds(tmp_path, monkeypatch):
    figures, subplots = [], kl_vs_collapse.plt.subplots
    monkeypatch.setattr(kl_vs_collapse.plt, "subplots",
                        lambda *a, **kw: figures.append(subplots(*a, **kw)) or figures[-1])
    curves = collapse_curves()
    kl_vs_collapse.plot(curves, tmp_path / "c.png")
    (fig, axes), = figures
    kl_vs_collapse.plt.close(fig)
    assert [ax.get_title().split(" ")[0] for ax in axes] == ["reward:", "KL", "policy", "distinct-2", "share"]
    for ax, tag in zip(axes, COLLAPSE_TAGS):
        for line, band, runs in zip(ax.get_lines(), ax.collections, curves.values()):
            a, b = (run[tag] for run in runs)
            x, y = line.get_data()
            np.testing.assert_array_equal(x, np.arange(1, 8))  # iterations numbered from 1
            np.testing.assert_allclose(y, [(p + q) / 2 for p, q in zip(a, b)])
            vertices = band.get_paths()[0].vertices
            for i, (p, q) in enumerate(zip(a, b), 1):  # the band spans the seeds' lowest and highest
                at = vertices[np.isclose(vertices[:, 0], i), 1]
                assert at.min() == pytest.approx(min(p, q)) and at.max() == pytest.approx(max(p, q))


def test_kl_vs_collapse_table_is_the_mean_of_the_last_five_iterations_over_seeds(tmp_path):
    args = kl_vs_collapse.Args(kl_coefs=[0.0, 1.0], seeds=[1, 2], iterations=7, out=str(tmp_path / "page"))

    def final(reward, stop, distinct, distinct_2, bits, minutes):
        return {"reward": reward, "ends_with_stop": stop, "distinct_responses": distinct,
                "distinct_2_words": distinct_2, "ref_bits_per_char": bits, "minutes": minutes,
                "samples": [("[p]", "a response")]}

    finals = {0.0: [final(0.5, 1.0, 0.25, 0.4, 2.0, 1.0), final(0.7, 0.5, 0.75, 0.6, 3.0, 2.0)],
              1.0: [final(0.1, 0.0, 1.0, 0.9, 1.5, 1.0), final(0.1, 0.0, 1.0, 0.9, 1.5, 1.0)]}
    kl_vs_collapse.write_report(args, collapse_curves(), finals, final(-1.0, 0.0, 1.0, 0.95, 1.25, 0.0), 1.5,
                                60.0, 1000)
    page = (tmp_path / "page.md").read_text()
    # kl_coef 0: scores of the last 5 iterations average 3 and 5, KL (seed 1: 1; seed 2: 3), entropy 3 and 5
    assert ("| 0 | 4.000 ± 1.000 | 2.000 ± 1.000 | 4.000 ± 1.000 | 0.600 ± 0.100 | 0.750 ± 0.250 "
            "| 0.500 ± 0.250 | 0.500 ± 0.100 | 2.500 ± 0.500 | 1.5 |") in page
    # kl_coef 1: scores 0 and 0.4, KL 1 and 1
    assert ("| 1 | 0.200 ± 0.200 | 1.000 ± 0.000 | 0.200 ± 0.200 | 0.100 ± 0.000 | 0.000 ± 0.000 "
            "| 1.000 ± 0.000 | 0.900 ± 0.000 | 1.500 ± 0.000 | 1.0 |") in page
    assert "| pretrained model | | | | -1.000 | 0.000 | 1.000 | 0.950 | 1.250 | |" in page
    assert "final training loss 1.500 nats/char (2.16 bits/char)" in page


@pytest.fixture
def one_torch_thread():
    """Tiny matrices run fastest on one torch thread (as the script's main() runs them); restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_kl_vs_collapse_final_policy_measures_by_hand(tiny, monkeypatch, one_torch_thread):
    """sample_final_policy on the tiny GPT-2 with planted stop tokens: a "." at index 20, one too early (5)
    then at 30, none, one at 16 (the first allowed), and a copy of the first response; the reward (length / 48
    with a ".", else -1), the distinct shares and the reference's negative log-likelihood in bits per token,
    worked out here with a plain forward pass of each unpadded prompt + response."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rlhf = kl_vs_collapse.rlhf
    tokenizer = AutoTokenizer.from_pretrained(tiny["policy"])
    (stop,) = tokenizer.encode(".")
    other = tokenizer.encode(" the")[0]
    generate, planted = rlhf.generate, []

    def generate_with_stops(*a, **kw):
        responses, logprobs = generate(*a, **kw)
        responses = responses.masked_fill(responses == stop, other)
        for row, places in enumerate([[20], [5, 30], [], [16]]):
            responses[row, places] = stop
        responses[4] = responses[0]
        planted.append(responses.clone())
        return responses, logprobs

    monkeypatch.setattr(rlhf, "generate", generate_with_stops)
    prompts = ["The film was", "I think that", "A long story", "It is"]
    got = kl_vs_collapse.sample_final_policy(tiny["policy"], tiny["policy"], prompts, 5)
    (responses,) = planted
    assert responses.shape == (5, 48)
    ends = [21, 31, 48, 17, 21]  # tokens kept: up to and including the first "." at index 16 or later
    stops = [True, True, False, True, True]
    model = AutoModelForCausalLM.from_pretrained(tiny["policy"]).eval()
    texts, nats, tokens = [], 0.0, 0
    for i, end in enumerate(ends):
        query = tokenizer(prompts[i % 4])["input_ids"]
        response = responses[i, :end].tolist()
        with torch.no_grad():
            logits = model(torch.tensor([query + response])).logits[0, len(query) - 1 : -1].double()
        nats -= logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None]).sum().item()
        tokens += end
        texts.append(tokenizer.decode(response, skip_special_tokens=True))
    assert [text for _, text in got["samples"]] == texts
    assert got["reward"] == pytest.approx(np.mean([len(t) / 48 if s else -1.0 for t, s in zip(texts, stops)]))
    assert got["ends_with_stop"] == pytest.approx(4 / 5)
    assert got["distinct_responses"] == pytest.approx(4 / 5)
    bigrams = [pair for t in texts for pair in zip(t.split(), t.split()[1:])]
    assert got["distinct_2_words"] == pytest.approx(len(set(bigrams)) / len(bigrams))
    assert got["ref_bits_per_char"] == pytest.approx(nats / tokens / np.log(2), rel=1e-5)


# ------------------------------------------------------------------------- rlhf_overoptimization (issue 31)

rlhf_overoptimization = load("rlhf_overoptimization")
overopt_report = load("rlhf_overoptimization_report")  # its report subcommand's module
OVEROPT_TRAIN_PROMPTS = ["I loved this great film and", "What an awful, boring movie:", "A happy story, and",
                         "The sad ending made me"]


def brute_force_best_of_n(proxy, gold, n):
    """Mean over every n-subset of a row's samples of the proxy and gold of the subset's best by proxy; a tie
    for the best is broken at random, so a subset counts the mean gold of its tied best."""
    import itertools

    proxies, golds = [], []
    for subset in itertools.combinations(range(len(proxy)), n):
        top = max(proxy[i] for i in subset)
        best = [i for i in subset if proxy[i] == top]
        proxies.append(top)
        golds.append(sum(gold[i] for i in best) / len(best))
    return sum(proxies) / len(proxies), sum(golds) / len(golds)


def test_overopt_best_of_n_is_the_average_over_all_n_subsets():
    rng = np.random.default_rng(0)
    proxy = np.vstack([rng.normal(size=7), rng.integers(0, 3, size=7).astype(float),  # ties
                       np.full(7, 0.5), [3.0, 1.0, 3.0, 2.0, 1.0, 3.0, 0.0]])
    gold = rng.normal(size=proxy.shape)
    for n in range(1, 8):
        got_proxy, got_gold = overopt_report.best_of_n(proxy, gold, n)
        for row in range(len(proxy)):
            want_proxy, want_gold = brute_force_best_of_n(proxy[row].tolist(), gold[row].tolist(), n)
            assert got_proxy[row] == pytest.approx(want_proxy, abs=1e-12)
            assert got_gold[row] == pytest.approx(want_gold, abs=1e-12)
    # n = 1 is the plain mean; n = N the best of all (the mean gold of the tied best in row 3)
    np.testing.assert_allclose(overopt_report.best_of_n(proxy, gold, 1)[1], gold.mean(1))
    assert overopt_report.best_of_n(proxy, gold, 7)[1][3] == pytest.approx(gold[3, [0, 2, 5]].mean())


def test_overopt_best_of_n_kl_is_the_kl_of_the_maximum_of_n_uniforms():
    assert overopt_report.best_of_n_kl(1) == 0.0
    assert overopt_report.best_of_n_kl(2) == pytest.approx(np.log(2) - 0.5, abs=1e-15)
    # independently: the best of n draws has density n u^(n-1) on the quantile u of the initial policy,
    # KL = integral over u of n u^(n-1) log(n u^(n-1)), by the midpoint rule
    u = (np.arange(200_000) + 0.5) / 200_000
    for n in (2, 5, 16):
        density = n * u ** (n - 1)
        assert overopt_report.best_of_n_kl(n) == pytest.approx(np.mean(density * np.log(density)), abs=1e-6)


@pytest.mark.parametrize("form, alpha, beta", [("rl", 0.3, 0.2), ("rl", 0.05, 0.1), ("bon", 0.4, 0.15),
                                               ("bon", 0.2, 0.05), ("rl", -0.1, 0.3), ("bon", -0.1, 0.3)])
def test_overopt_fits_recover_the_forms_and_their_peaks(form, alpha, beta):
    d = np.concatenate([[0.0], np.linspace(0.05, 4.0, 30)])
    curve = d * (alpha - beta * (np.log(np.where(d > 0, d, 1.0)) if form == "rl" else d))
    fitted = overopt_report.fit_gold(d, curve, form)
    assert fitted == pytest.approx((alpha, beta), abs=1e-9)
    grid = np.linspace(1e-4, 50, 2_000_001)
    values = grid * (alpha - beta * (np.log(grid) if form == "rl" else grid))
    peak = overopt_report.gold_peak(alpha, beta, form)
    assert peak == pytest.approx(grid[values.argmax()], abs=1e-4)
    assert overopt_report.gold_peak(alpha, -beta, form) is None  # never turns down
    assert overopt_report.fit_gold([0.0, 1.0], [0.0, 0.3], form) is None  # one point with d > 0


def test_overopt_repeated_words_and_disagreements():
    assert rlhf_overoptimization.repeated_word_share("Good, good GOOD film.") == pytest.approx(0.5)
    assert rlhf_overoptimization.repeated_word_share("...") == 0.0
    picked = overopt_report.disagreements(["a", "b", "c", "d"], [3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0], 2)
    assert [t for t, _, _ in picked] == ["a", "b"]


def test_overopt_cli_subcommands_and_flag_checks():
    import tyro

    args = tyro.cli(rlhf_overoptimization.Command, args=["ppo", "--proxies", "a", "--kl-coefs", "0.01",
                                                         "--ppo-flags=--model-name m --total-episodes 64"])
    assert isinstance(args, rlhf_overoptimization.Ppo)
    assert args.ppo_flags == "--model-name m --total-episodes 64"
    command = rlhf_overoptimization.command_of("ppo", args)
    assert command.endswith("ppo --proxies a --kl-coefs 0.01 --ppo-flags='--model-name m "
                            "--total-episodes 64'")
    again = tyro.cli(rlhf_overoptimization.Command, args=__import__("shlex").split(command)[2:])
    assert again == args
    run_args = rlhf_overoptimization.parse_ppo_flags("--model-name m --temperature 0.5", reward_model="r",
                                                     kl_coef=0.02)
    assert (run_args.model_name, run_args.temperature, run_args.reward_model, run_args.kl_coef,
            run_args.kl_target) == ("m", 0.5, "r", 0.02, None)  # a fixed coefficient unless the flags say
    assert rlhf_overoptimization.parse_ppo_flags("--kl-target 3", kl_coef=0.1).kl_target == 3.0
    with pytest.raises(SystemExit, match="--kl-coef"):
        rlhf_overoptimization.parse_ppo_flags("--kl-coef 0.3", reward_model="r", kl_coef=0.02)
    with pytest.raises(SystemExit, match="--proxies /no/such/proxy"):
        rlhf_overoptimization.main(rlhf_overoptimization.Ppo(proxies=["/no/such/proxy"]))


@pytest.fixture(scope="module")
def overopt_models(tmp_path_factory):
    """A tiny GPT-2 policy and two tiny one-label proxy reward models with a reward_bias, saved with
    save_pretrained (no model hub here), and a file of training prompts with sentiment words."""
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    from conftest import byte_level_bpe

    root = tmp_path_factory.mktemp("overopt")
    texts = OVEROPT_TRAIN_PROMPTS + rlhf_overoptimization.rlhf.EVAL_PROMPTS + [
        "It was great. I loved it, a wonderful film.", "Terrible acting, an awful plot. A bad, sad movie."]
    _, hf_tokenizer = byte_level_bpe(texts, 300)
    eos_id = hf_tokenizer.eos_token_id
    torch.manual_seed(0)
    config = dict(vocab_size=len(hf_tokenizer), n_positions=64, n_embd=16, n_layer=1, n_head=2,
                  bos_token_id=eos_id, eos_token_id=eos_id)
    GPT2LMHeadModel(GPT2Config(**config)).save_pretrained(root / "policy")
    hf_tokenizer.save_pretrained(root / "policy")
    for name, bias in (("proxy_small", 0.7), ("proxy_large", -0.3)):
        proxy = GPT2ForSequenceClassification(GPT2Config(num_labels=1, **config))
        proxy.config.reward_bias = bias
        proxy.save_pretrained(root / name)
        hf_tokenizer.save_pretrained(root / name)
    (root / "prompts.txt").write_text("\n".join(OVEROPT_TRAIN_PROMPTS) + "\n")
    return root


def overopt_flags(root, tmp_path, **extra) -> str:
    flags = dict(model_name=root / "policy", prompts_file=root / "prompts.txt", runs_dir=tmp_path / "runs",
                 batch_size=4, num_minibatches=2, total_episodes=8, response_length=6, min_response_length=0,
                 norm_batches=1, eval_episodes=4, local_rollout_forward_batch_size=3, update_epochs=1,
                 learning_rate=1e-3)
    flags.update(extra)
    return "--no-cuda " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in flags.items())


def independent_proxy(folder, texts):
    """The proxy's normalized score of each text, one text at a time (no padding), with plain transformers."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        return [model(**tokenizer(t, return_tensors="pt")).logits[0, 0].item() + model.config.reward_bias
                for t in texts]


def test_overopt_wrapped_reward_records_gold_of_the_scored_texts_by_phase(overopt_models, tmp_path,
                                                                          monkeypatch):
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    rlhf = rlhf_overoptimization.rlhf
    real = rlhf.load_reward_fn, rlhf.sample_and_score, rlhf.evaluate
    proxy = str(overopt_models / "proxy_small")
    run_args = rlhf_overoptimization.parse_ppo_flags(overopt_flags(overopt_models, tmp_path),
                                                     reward_model=proxy, kl_coef=0.1)
    result, batches = rlhf_overoptimization.record_ppo_run(run_args)
    assert (rlhf.load_reward_fn, rlhf.sample_and_score, rlhf.evaluate) == real
    # order of main(): normalization batch, initial evaluation, 2 iterations, final evaluation (4 responses
    # each, the reward function called in chunks of 3)
    assert [(b["phase"], b["iteration"], len(b["texts"]), b["calls"]) for b in batches] == [
        ("normalization", 0, 4, 2), ("eval", 0, 4, 2), ("train", 1, 4, 2), ("train", 2, 4, 2),
        ("eval", 2, 4, 2)]
    analyzer = SentimentIntensityAnalyzer()
    gold = [g for b in batches for g in b["gold"]]
    texts = [t for b in batches for t in b["texts"]]
    # the reward function returns float32 tensors, as ppo_rlhf_gpt2's vader does
    assert gold == [float(np.float32(analyzer.polarity_scores(t)["compound"])) for t in texts]
    assert len(set(gold)) > 1  # the prompts carry sentiment: not a trivially constant gold
    np.testing.assert_allclose([p for b in batches for p in b["proxy"]],
                               independent_proxy(overopt_models / "proxy_small", texts), atol=1e-4)
    for b in batches:  # evaluation on the held-out prompts, the rest on the training prompts
        prompts = rlhf.EVAL_PROMPTS if b["phase"] == "eval" else OVEROPT_TRAIN_PROMPTS
        assert all(any(t.startswith(p) for p in prompts) for t in b["texts"]), b["phase"]
        assert all(t.endswith(r) for t, r in zip(b["texts"], b["responses"]))
    summary = rlhf_overoptimization.summarize_run(run_args, result, batches, keep_iterations=1)
    assert [it["iteration"] for it in summary["iterations"]] == [1, 2]
    assert summary["iterations"][1]["gold"] == pytest.approx(np.mean(batches[3]["gold"]))
    assert summary["initial"]["gold"] == pytest.approx(np.mean(batches[0]["gold"] + batches[2]["gold"]))
    assert [e["after_iteration"] for e in summary["eval"]] == [0, 2]
    assert [s["iteration"] for s in summary["samples"]] == [2]

    # restored also when the run fails, after the reward function was loaded and used
    def broken_gae(*a, **kw):
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(rlhf, "compute_gae", broken_gae)
    with pytest.raises(RuntimeError, match="on purpose"):
        rlhf_overoptimization.record_ppo_run(run_args)
    assert (rlhf.load_reward_fn, rlhf.sample_and_score, rlhf.evaluate) == real


def test_overopt_end_to_end_writes_the_page_and_the_figure(overopt_models, tmp_path):

    root, out = overopt_models, str(tmp_path / "overopt")
    proxies = [str(root / "proxy_small"), str(root / "proxy_large")]
    flags = overopt_flags(root, tmp_path, total_episodes=12)
    rlhf_overoptimization.main(rlhf_overoptimization.BestOfN(  # prompts with sentiment: gold not all 0
        proxies=proxies, proxy_names=["small", "large"], n=16, num_prompts=3, batch_size=8, ppo_flags=flags,
        prompts_file=str(root / "prompts.txt"), out=out))
    rlhf_overoptimization.main(rlhf_overoptimization.Ppo(
        proxies=proxies[:1], proxy_names=["small"], kl_coefs=[0.05], ppo_flags=flags, keep_iterations=2,
        out=out))
    rlhf_overoptimization.main(rlhf_overoptimization.Report(out=out, num_disagreements=2))
    page = open(out + ".md").read()
    assert os.path.getsize(out + ".png") > 10_000

    bon = json.load(open(out + ".best_of_n.json"))
    assert np.array(bon["gold"]).shape == (3, 16)
    assert bon["prompts"] == OVEROPT_TRAIN_PROMPTS[:3]
    # the page shows n up to N / 4 = 4; the n = 4 row of the small proxy, computed here by brute force over
    # all 1820 4-subsets of each prompt's 16 responses: the gold of the subset's best by proxy (a tie shares),
    # minus the mean of all
    proxy, gold = np.array(bon["proxies"][0]["scores"]), np.array(bon["gold"])
    best = []
    for i in range(3):
        for subset in itertools.combinations(range(16), 4):
            p, g = proxy[i][list(subset)], gold[i][list(subset)]
            best.append(g[p == p.max()].mean())
    assert len(set(gold.ravel())) > 1 and np.mean(best) != gold.mean()
    kl4 = np.log(4) - 3 / 4
    assert f"| 4 | {kl4:.4f} | {np.sqrt(kl4):.4f} | " in page and f"| 8 | {np.log(8) - 7 / 8:.4f} |" not in page
    assert f"| {np.mean(best) - gold.mean():+.4f} [" in page
    ppo = json.load(open(out + ".ppo.json"))
    assert len(ppo) == 1 and len(ppo[0]["iterations"]) == 3
    for heading in ["## Fits of Gao et al.'s forms", "## Best-of-n", "## PPO on small, kl_coef 0.05 (fixed)",
                    "## What the policy learned", "## Where proxy and gold disagree most", "**small**",
                    "**large**", "| curve | alpha | beta | peak d*", "| iteration | KL (nats) | d |",
                    "| after iteration |", "| best-of-16, small |", "| PPO kl_coef 0.05, small |",
                    "**PPO kl_coef 0.05, small, iterations 2-3**"]:
        assert heading in page, heading
    # every table names its command
    assert "Command [1]: `python experiments/rlhf_overoptimization.py best-of-n --proxies" in page
    assert "Command [2]: `python experiments/rlhf_overoptimization.py ppo --proxies" in page
    assert page.count("Commands: [1] `python experiments/rlhf_overoptimization.py best-of-n") == 3
    assert "| best-of-n, small | " in page and "| [1] |" in page and "| [2] |" in page
    assert "`python experiments/rlhf_overoptimization.py report --out" in page
    # a hand-written reading survives a rerun
    with open(out + ".md", "a") as f:
        f.write("\n<!-- reading -->\nThe gold peaks early.\n")
    rlhf_overoptimization.main(rlhf_overoptimization.Report(out=out, num_disagreements=2))
    assert open(out + ".md").read().endswith("<!-- reading -->\nThe gold peaks early.\n")


# ------------------------------------------------------ benchmarks/preference_baselines.py (issue 31)


def test_preference_baselines_learn_a_word_preference_and_report_the_gold_labeler(tmp_path):
    """benchmarks/preference_baselines.py on a file where the chosen response holds "good" and the rejected
    one "bad" among shared filler words: the bag-of-words model learns it from the training split (held-out
    1.0), and the gold labeler's accuracy is the share of held-out lines whose gold order agrees with the
    label."""
    baselines = load("preference_baselines", "benchmarks")
    sys.path.insert(0, ROOT)
    import reward_model_gpt2
    fillers = ["the film", "a scene", "this plot", "an actor", "the music"]
    comparisons = [{"prompt": f"Review {i % 8}: it was", "chosen": f" {fillers[i % 5]} good {fillers[(i + 2) % 5]}",
                    "rejected": f" {fillers[(i + 1) % 5]} bad {fillers[(i + 3) % 5]}",
                    "gold_chosen": 1.0 if i % 4 else -1.0, "gold_rejected": 0.0} for i in range(40)]
    prompts = [c["prompt"] for c in comparisons]
    train, held_out = reward_model_gpt2.split_comparisons(prompts, 0.25, 1)
    assert len(held_out) == 10 and not {prompts[i] for i in train} & {prompts[i] for i in held_out}
    assert baselines.bag_of_words_accuracy(comparisons, train, held_out, 0.1) == 1.0
    # words never seen in training score 0: a held-out pair made only of them is a tie (1/2)
    unseen = comparisons + [{"prompt": "It was", "chosen": " superb", "rejected": " dull"}]
    assert baselines.bag_of_words_accuracy(unseen, train, [40], 0.1) == 0.5
    path = tmp_path / "preferences.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in comparisons))
    tool = os.path.join(ROOT, "benchmarks", "preference_baselines.py")
    out = subprocess.run([sys.executable, tool, str(path), "--eval-fraction", "0.25", "--sizes", "8", "100",
                          "--l2", "0.1", "--folds", "2"], capture_output=True, text=True, check=True).stdout
    expected_gold = sum(1 for i in held_out if i % 4) / len(held_out)
    assert f"gold labeler: {expected_gold:.3f} [" in out
    assert "bag of words, 8 training comparisons: " in out
    assert "bag of words, 30 training comparisons: 1.000 [1.000, 1.000] at l2 0.1" in out


# ---------------------------------------------------------------------------------------------- ppo_vs_grpo


def test_ppo_vs_grpo_curves_count_completions_and_training_seconds_by_hand():
    pvg = load("ppo_vs_grpo")
    # 4 iterations; evaluations before training (step 0) and after iterations 2 and 4
    scalars = {"time/rollout": [(1, 10.0), (2, 11.0), (3, 12.0), (4, 13.0)],
               "time/update": [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)],
               "eval/accuracy": [(0, 0.1), (2, 0.3), (4, 0.5)]}
    curves = pvg.run_curves(scalars, 64)
    assert curves["completions"] == [0, 128, 256]
    assert curves["seconds"] == [0.0, 11 + 13, 11 + 13 + 15 + 17]  # rollout + update of iterations 1..i
    assert curves["accuracy"] == [0.1, 0.3, 0.5]


def test_ppo_vs_grpo_intervals_by_hand():
    pvg = load("ppo_vs_grpo")
    mean, half, std = pvg.protocol.mean_interval([0.5, 0.6, 0.7])
    assert mean == pytest.approx(0.6) and std == pytest.approx(0.1)
    assert half == pytest.approx(4.303 * 0.1 / 3 ** 0.5)  # t with 2 degrees of freedom
    assert pvg.protocol.mean_interval([0.4]) == (0.4, 0.0, 0.0)
    # Welch: equal variances 0.01 and 3 seeds each: se = sqrt(0.01/3 + 0.01/3), dof = 4, t = 2.776
    d, h = pvg.protocol.difference_interval([0.5, 0.6, 0.7], [0.3, 0.4, 0.5])
    assert d == pytest.approx(0.2) and h == pytest.approx(2.776 * (0.02 / 3) ** 0.5)
    # unequal variances: dof from the Welch-Satterthwaite formula, t interpolated in the table
    a, b = [0.5, 0.6, 0.7], [0.40, 0.41, 0.42]
    va, vb = 0.01 / 3, 0.0001 / 3
    dof = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    assert 2 < dof < 3
    t = 4.303 + (dof - 2) * (3.182 - 4.303)
    assert pvg.protocol.difference_interval(a, b)[1] == pytest.approx(t * (va + vb) ** 0.5)
    # 6 seeds: t with 5 degrees of freedom; Welch with equal variances, 6 and 6: dof 10; 40 and 40: dof 78,
    # past the table's end at 30 (t = 2.042, a little wider than the exact 1.991)
    six = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]  # std sqrt(0.035)
    assert pvg.protocol.mean_interval(six)[1] == pytest.approx(2.571 * 0.035**0.5 / 6**0.5)
    assert pvg.protocol.difference_interval(six, [x + 0.05 for x in six])[1] == pytest.approx(2.228 * (0.07 / 6) ** 0.5)
    forty = [0.0, 1.0] * 20  # variance 40 / (4 * 39)
    assert pvg.protocol.difference_interval(forty, forty)[1] == pytest.approx(2.042 * (2 * (10 / 39) / 40) ** 0.5)
    assert pvg.last_mean({"x": [(1, 1.0), (2, float("nan")), (3, 3.0)]}, "x", 2) == 3.0
    assert np.isnan(pvg.last_mean({"x": [(1, float("nan"))]}, "x", 2)) and np.isnan(pvg.last_mean({}, "x", 2))


def test_ppo_vs_grpo_report_from_fake_runs(tmp_path):
    """summarize() and write_report() on made-up logs of 3 seeds a method, an earlier sitting of 2 seeds and
    tuning runs: the table rows, ratios to the same sitting's PPO, the intervals (none on 2 seeds), the tuning
    choice and the commands are those of the numbers given, worked out by hand."""
    R = load("ppo_vs_grpo_report")  # the page
    pvg = R.harness
    logs, records = {}, []
    for method, seed, final, secs, wall, cpu, gb in [
            ("ppo", 1, 0.5, 10.0, 100.0, 90.0, 6.0), ("ppo", 2, 0.6, 10.0, 100.0, 90.0, 6.0),
            ("ppo", 3, 0.7, 10.0, 100.0, 90.0, 6.0), ("grpo_tuned", 1, 0.4, 2.0, 30.0, 27.0, 3.0),
            ("grpo_tuned", 2, 0.5, 3.0, 40.0, 36.0, 3.0), ("grpo_tuned", 3, 0.6, 4.0, 50.0, 45.0, 3.0)]:
        logs[f"{method}{seed}"] = {"time/rollout": [(1, secs), (2, secs)], "time/update": [(1, 0.0), (2, 0.0)],
                                   "eval/accuracy": [(0, 0.1), (2, final)],
                                   "val/length_right": [(1, 3.0), (2, 4.0)], "val/length_wrong": [(1, 5.0), (2, 7.0)],
                                   "objective/kl": [(1, 9.0), (2, 1.5)]}
        command = f"python {method}.py --seed {seed} --x {1 if seed < 3 or method == 'ppo' else 2}"
        records.append({"method": method, "seed": seed, "command": command, "run_dir": f"{method}{seed}",
                        "peak_rss_gb": gb, "wall_s": wall, "cpu_s": cpu, "commit": "abc", "date": "2026-11-26"})
    methods = pvg.summarize(records, logs.__getitem__)
    assert [r["train_s"] for r in methods["grpo_tuned"]] == [4.0, 6.0, 8.0]
    assert methods["ppo"][0]["length_right"] == 3.5 and methods["ppo"][0]["length_wrong"] == 6.0
    earlier_run = dict(methods["ppo"][0], cpu_s=None, command="python old.py --seed 1")
    methods["earlier:ppo"] = [dict(earlier_run, accuracy=[0.1, 0.5]), dict(earlier_run, seed=2, accuracy=[0.1, 0.7])]
    methods["earlier:grpo"] = [dict(earlier_run, accuracy=[0.1, 0.4]), dict(earlier_run, seed=2, accuracy=[0.1, 0.6])]
    tuning_logs = {name: {"eval/accuracy": [(0, 0.1), (8, final)], "time/rollout": [(i, 6.0) for i in range(1, 9)],
                          "time/update": [(i, 1.5) for i in range(1, 9)]}
                   for name, final in [("grpo S1 a", 0.40), ("grpo S16 b", 0.52), ("grpo S4 c", 0.515),
                                       ("rloo S1 d", 0.45), ("rloo S4 e", 0.47)]}
    tuning = pvg.tuning_results([{"method": name, "command": f"python t.py --seed 100 --name {name[-1]}",
                                  "run_dir": name, "cpu_s": 120.0} for name in tuning_logs], tuning_logs.__getitem__)
    # S4 c is within a point of S16 b's 52% and takes fewer steps; rloo S1's 45% is 2 points below S4's 47%
    assert R.choose(tuning, "grpo") == "grpo S4 c" and R.choose(tuning, "rloo") == "rloo S4 e"
    assert tuning[0]["train_s"] == 60.0 and np.isnan(tuning[0]["kl"])
    # a hand-written summary above <!-- generated --> and a reading below <!-- reading --> are kept, the rest rewritten
    (tmp_path / "page.md").write_text("# Summary\nwhat holds\n<!-- generated -->\nold tables\n<!-- reading -->\nread\n")
    text = R.write_report(methods, tmp_path / "page", tuning)
    assert text.startswith("# Summary\nwhat holds\n<!-- generated -->\n## The runs: tables, tuning and commands\n")
    assert "old tables" not in text and text.endswith("<!-- reading -->\nread\n") and text.count("what holds") == 1
    assert "| GRPO, tuned schedule | 1 | 10.0% | 40.0% |" in text
    # 3 seeds: t with 2 degrees of freedom, 4.303 * 0.1 / sqrt(3) = 24.8 points
    assert "| PPO | mean ± 95% | 10.0% ± 0.0% | 60.0% ± 24.8% |" in text
    assert "| GRPO (earlier sitting) | mean ± 95% | 10.0% / 10.0% (2 seeds, no interval) | 40.0% / 60.0% (2 seeds, " \
           "no interval) |" in text
    # training minutes 6 / 20 s = 30%, wall 40 / 100 s, CPU 36 / 90 s, peak memory half; KL 1.5 at the end
    assert "| GRPO, tuned schedule | 0.1 | 30% | 0.7 | 40% | 0.6 | 40% | 3.00 | 50% | 3.50 / 6.00 | n/a | 1.50 |" in text
    assert "| PPO (earlier sitting) | 0.3 | 100% | 1.7 | 100% | n/a | n/a | 6.00 | 100% |" in text
    # Welch with equal variances 0.01, 3 and 3 seeds: 4 degrees of freedom, 2.776 * sqrt(0.02 / 3) = 22.7 points
    assert "| GRPO, tuned schedule | -10.0% ± 22.7% |" in text
    assert "| GRPO (earlier sitting) | -10.0% |" in text  # against the earlier PPO, no interval on 2 seeds
    assert "| grpo S4 c | 4 | 10.0% | 51.5% | n/a | 1.0 | 2.0 | yes |" in text
    assert "| grpo S16 b | 16 | 10.0% | 52.0% | n/a | 1.0 | 2.0 |  |" in text
    assert "| rloo S4 e | 4 | 10.0% | 47.0% | n/a | 1.0 | 2.0 | yes |" in text
    assert (tmp_path / "page.png").exists()
    assert set(json.loads((tmp_path / "page.json").read_text())) == {"ppo", "grpo_tuned"}  # not the earlier rows
    # the commands: one line where a method's runs differ only in the seed, else one line a run
    assert "- `python ppo.py --seed 1 --x 1`; seeds 2, 3: the same with their `--seed`\n" in text
    assert "- `python grpo_tuned.py --seed 2 --x 1`\n- `python grpo_tuned.py --seed 3 --x 2`\n" in text
    assert "- `python t.py --seed 100 --name e`\n" in text


def test_ppo_vs_grpo_tune_runs_the_grids_of_the_methods_named():
    pvg = load("ppo_vs_grpo")
    rloo = pvg.protocol_tuning(["rloo"])
    assert list(rloo) == [f"rloo G {g} lr {lr}" for g in (2, 4, 8, 16) for lr in ("1e-5", "2e-5")]
    assert rloo["rloo G 16 lr 2e-5"].endswith("--num-generations 16 --learning-rate 2e-5")
    both = pvg.protocol_tuning(["ppo", "rloo"])
    assert len(both) == 16 and [n.split(" ")[0] for n in both] == ["ppo"] * 8 + ["rloo"] * 8
    assert pvg.protocol_tuning(["ppo", "grpo", "rloo"]) == pvg.PROTOCOL_TUNING


def test_ppo_vs_grpo_tuned_methods_run_the_chosen_flags():
    """grpo_tuned and rloo run exactly the flags of a tuning run (the grid is where they come from)."""
    R = load("ppo_vs_grpo_report")  # the page
    pvg = R.harness
    flags = {name: sorted(pvg.shlex.split(f)) for name, f in pvg.TUNING.items()}
    assert sorted(pvg.shlex.split(pvg.METHODS["grpo_tuned"])) in [f for n, f in flags.items() if n.startswith("grpo")]
    assert sorted(pvg.shlex.split(pvg.METHODS["rloo"])) in [f for n, f in flags.items() if n.startswith("rloo")]
    assert all(R.steps_per_batch(name) >= 1 for name in pvg.TUNING)
    assert "--eval-split validation" in pvg.TUNING_COMMON and "--eval-every 0" in pvg.TUNING_COMMON


def test_overopt_bootstrap_interval_resamples_prompts_by_hand():
    # two prompts with means 0 and 1: a resample's mean is 0, 1/2 or 1 with chances 1/4, 1/2, 1/4
    low, high = overopt_report.bootstrap_interval(lambda i: np.array([0.0, 1.0])[i].mean(), 2)
    assert (low, high) == (0.0, 1.0)
    assert overopt_report.bootstrap_interval(lambda i: np.full(5, 0.3)[i].mean(), 5) == pytest.approx(
        (0.3, 0.3))
    # 40 prompts of value 1 and 40 of 0: the interval is about mean +- 1.96 * 0.5 / sqrt(80)
    values = np.array([1.0] * 40 + [0.0] * 40)
    low, high = overopt_report.bootstrap_interval(lambda i: values[i].mean(), 80)
    assert low == pytest.approx(0.5 - 1.96 * 0.5 / 80**0.5, abs=0.03)
    assert high == pytest.approx(0.5 + 1.96 * 0.5 / 80**0.5, abs=0.03)
    # each resample draws all 10 prompts with replacement: 10 indices, some repeated, on average
    # 10 (1 - 0.9^10) = 6.51 distinct (a half-sample without replacement has about the mean's spread, not this)
    drawn = []
    overopt_report.bootstrap_interval(lambda i: drawn.append(np.array(i)) or 0.0, 10, resamples=2000)
    assert len(drawn) == 2000 and all(len(i) == 10 and set(i.tolist()) <= set(range(10)) for i in drawn)
    assert np.mean([len(set(i.tolist())) for i in drawn]) == pytest.approx(10 * (1 - 0.9**10), abs=0.1)


def test_overopt_best_of_n_curves_by_hand():
    """N = 8 responses with gold 0..7 for each of 3 prompts: shown up to n = 2 (N / 4). A proxy equal to gold:
    best of 2 gives sum_k k^2 / 28 = 5 against the mean 3.5 (+1.5 on every prompt, so the interval is a
    point), correlation 1, and no fall (the peak is the largest n). A proxy that reverses gold: -1.5."""
    gold = [list(range(8))] * 3
    bon = {"n": 8, "gold": gold, "proxies": [{"name": "same", "path": "a", "scores": gold},
                                             {"name": "reversed", "path": "b", "scores": [[-g for g in row]
                                                                                       for row in gold]}]}
    same, reversed_ = overopt_report.best_of_n_curves(bon)
    assert [p["n"] for p in same["points"]] == [1, 2]
    assert same["points"][1]["gold_change"] == pytest.approx(1.5)
    assert same["points"][1]["gold_change_ci"] == pytest.approx((1.5, 1.5))
    assert same["points"][1]["kl"] == pytest.approx(np.log(2) - 0.5)
    assert same["correlation"] == pytest.approx(1.0) and same["correlation_ci"] == pytest.approx((1.0, 1.0))
    assert same["peak_n"] == 2 and same["fall"] == pytest.approx(0.0)
    assert reversed_["points"][1]["gold_change"] == pytest.approx(-1.5)
    assert reversed_["peak_n"] == 1 and reversed_["fall"] == pytest.approx(1.5)  # the gold at n=1 minus at n=2
    assert reversed_["correlation"] == pytest.approx(-1.0)
    assert same["gold_std"] == pytest.approx(np.std(range(8)))


# ------------------------------------------- the reports' columns and axes, on made-up logs where all differ


def distinct_collapse_curves():
    """Two seeds of 7 iterations for kl_coef 0 and 0.5, every tag its own series (tag j, seed s, kl_coef k:
    iteration i holds 100 j + 10 s + 1000 k + (j + 1) i), so a column or a panel read from another tag shows."""
    return {kl: [{tag: np.array([100 * j + 10 * s + 1000 * k + (j + 1) * i for i in range(7)], dtype=float)
                  for j, tag in enumerate(COLLAPSE_TAGS)} for s in range(2)]
            for k, kl in enumerate((0.0, 0.5))}


def test_kl_vs_collapse_table_and_panels_read_each_tag_s_own_series(tmp_path, monkeypatch):
    curves = distinct_collapse_curves()
    args = kl_vs_collapse.Args(kl_coefs=[0.0, 0.5], seeds=[1, 2], iterations=7, out=str(tmp_path / "page"))
    final = {"reward": 0.0, "ends_with_stop": 0.0, "distinct_responses": 0.0, "distinct_2_words": 0.0,
             "ref_bits_per_char": 0.0, "minutes": 0.0, "samples": []}
    kl_vs_collapse.write_report(args, curves, {0.0: [final] * 2, 0.5: [final] * 2}, final, 1.0, 1.0, 10)
    page = (tmp_path / "page.md").read_text()
    for k, kl in enumerate((0.0, 0.5)):
        # the last 5 iterations (2..6) of tag j, seed s: 100 j + 10 s + 1000 k + 4 (j + 1); mean over the
        # seeds + 5, std 5
        cells = [f"{100 * j + 1000 * k + 4 * (j + 1) + 5:.3f} ± 5.000" for j in range(3)]
        assert f"| {kl:g} | " + " | ".join(cells) + " | 0.000 ± 0.000 |" in page
    figures, subplots = [], kl_vs_collapse.plt.subplots
    monkeypatch.setattr(kl_vs_collapse.plt, "subplots",
                        lambda *a, **kw: figures.append(subplots(*a, **kw)) or figures[-1])
    kl_vs_collapse.plot(curves, tmp_path / "c.png")
    (fig, axes), = figures
    kl_vs_collapse.plt.close(fig)
    titles = ["reward", "KL", "policy entropy", "distinct-2", "share of distinct responses"]
    for ax, title, j in zip(axes, titles, range(5)):
        assert ax.get_title().startswith(title)
        for line, k in zip(ax.get_lines(), range(2)):
            np.testing.assert_allclose(line.get_data()[1], [100 * j + 1000 * k + 5 + (j + 1) * i
                                                            for i in range(7)])


def overopt_made_up_logs(out):
    """A best-of-n file (3 prompts, N = 16, the proxy equal to gold = 0..15 shifted by the prompt) and a PPO
    run whose gold changes lie on Gao et al.'s RL form 0.3 d - 0.2 d log d at d = sqrt(KL) = 0, 0.5, ..., 2,
    its proxy changes elsewhere (2 d + 0.05), written where the report reads them."""
    gold = [[float(g + p) for g in range(16)] for p in range(3)]
    bon = {"command": "python experiments/rlhf_overoptimization.py best-of-n --n 16", "n": 16,
           "prompts": ["a", "b", "c"], "gold": gold, "proxies": [{"name": "small", "path": "x", "scores": gold}],
           "settings": {"model_name": "m", "temperature": 1.0, "response_length": 4, "stop_token": ".",
                        "min_response_length": 0},
           "responses": [[f" r{g}" for g in range(16)] for _ in range(3)],
           "lengths": [[4] * 16 for _ in range(3)], "stops": [[1] * 16 for _ in range(3)]}
    ds = [0.0, 0.5, 1.0, 1.5, 2.0]
    batch = {"proxy_std": 1.0, "gold_std": 0.5, "responses": 8, "length": 4.0, "stop_share": 1.0,
             "repeated_words": 0.0}
    iterations = [{**batch, "iteration": i + 1, "kl": d * d, "proxy": 2 * d + 0.05,
                   "gold": 0.1 + (0.3 * d - 0.2 * d * np.log(d) if d > 0 else 0.0)} for i, d in enumerate(ds)]
    run = {"proxy": "x", "proxy_name": "small", "kl_coef": 0.1, "kl_target": None,
           "command": "python experiments/rlhf_overoptimization.py ppo --kl-coefs 0.1",
           "ppo_command": "python ppo_rlhf_gpt2.py --kl-coef 0.1", "settings": {"batch_size": 8},
           "iterations": iterations, "initial": {**batch, "proxy": 0.0, "gold": 0.1}, "eval": [], "samples": [],
           "run_dir": "r"}
    with open(out + ".best_of_n.json", "w") as f:
        json.dump(bon, f)
    with open(out + ".ppo.json", "w") as f:
        json.dump([run], f)
    return gold, ds


def test_overopt_report_plots_d_and_draws_each_fitted_form_on_made_up_logs(tmp_path, monkeypatch):
    out = str(tmp_path / "overopt")
    gold, ds = overopt_made_up_logs(out)
    figures, subplots = [], overopt_report.plt.subplots
    monkeypatch.setattr(overopt_report.plt, "subplots",
                        lambda *a, **kw: figures.append(subplots(*a, **kw)) or figures[-1])
    page = overopt_report.run_report(overopt_report.Report(out=out, num_disagreements=2))
    (fig, (ax_proxy, ax_gold)), = figures
    overopt_report.plt.close(fig)
    # best of n = 1, 2, 4 (up to N / 4) by brute force over the n-subsets of each prompt's 16 (distinct)
    # responses: the expected maximum minus the mean; at d = sqrt(log n - (n - 1) / n)
    bon_d = [np.sqrt(np.log(n) - (n - 1) / n) for n in (1, 2, 4)]
    bon_gold = [np.mean([max(s) for s in itertools.combinations(range(16), n)]) - 7.5 for n in (1, 2, 4)]
    bon_points, ppo_points, bon_fit, ppo_fit = ax_gold.get_lines()[:4]  # then the axis line at 0
    for ax in (ax_proxy, ax_gold):
        assert ax.get_xlabel().startswith("d = sqrt(KL")
    np.testing.assert_allclose(bon_points.get_xdata(), bon_d)
    np.testing.assert_allclose(bon_points.get_ydata(), bon_gold, atol=1e-9)
    np.testing.assert_allclose(ppo_points.get_xdata(), ds)
    np.testing.assert_allclose(ax_proxy.get_lines()[1].get_xdata(), ds)
    np.testing.assert_allclose(ax_proxy.get_lines()[1].get_ydata(), [2 * d + 0.05 for d in ds])
    # PPO: the RL form through its points, alpha 0.3 and beta 0.2 exactly; drawn as such
    x = ppo_fit.get_xdata()
    np.testing.assert_allclose(ppo_fit.get_ydata(), [0.3 * v - 0.2 * v * np.log(v) if v > 0 else 0.0 for v in x],
                               atol=1e-9)
    assert "| PPO kl_coef 0.1, small | 0.3000 | 0.2000 | " in page
    # best-of-n: the form d (alpha - beta d) through its two points with d > 0, solved here by hand
    (d2, d4), (g2, g4) = bon_d[1:], bon_gold[1:]
    beta = (g2 / d2 - g4 / d4) / (d4 - d2)
    alpha = g2 / d2 + beta * d2
    x = bon_fit.get_xdata()
    np.testing.assert_allclose(bon_fit.get_ydata(), alpha * x - beta * x**2, atol=1e-9)
    assert f"| best-of-n, small | {alpha:.4f} | {beta:.4f} | " in page


def test_overopt_report_keeps_the_page_s_hand_written_top_and_reading(tmp_path):
    """A rerun rewrites only what lies between `<!-- generated -->` and `<!-- reading -->`: the title and summary
    above and the reading below stay as written. A first run writes the title, the marker and the generated part;
    the committed page has its marker right above its generated part, so the documented command keeps its top."""
    out = str(tmp_path / "overopt")
    overopt_made_up_logs(out)
    first = overopt_report.run_report(overopt_report.Report(out=out, num_disagreements=2))
    generated = first.split("<!-- generated -->\n", 1)[1]
    assert first == overopt_report.TITLE + "\n\n<!-- generated -->\n" + generated and "<!-- reading -->" not in first
    top = "# Over-optimization\n\n**What holds.** No peak.\n\n    python experiments/rlhf_overoptimization.py report\n"
    reading = "<!-- reading -->\n## Reading\n\nThe gold rises.\n"
    with open(out + ".md", "w") as f:
        f.write(top + "<!-- generated -->\nSTALE\n\n" + reading)
    page = overopt_report.run_report(overopt_report.Report(out=out, num_disagreements=2))
    assert page == top + "<!-- generated -->\n" + generated + "\n" + reading == open(out + ".md").read()
    committed = open(os.path.join(ROOT, "docs/results/rlhf_overoptimization.md")).read()
    assert committed.split("<!-- generated -->\n", 1)[1].startswith("Gold: vader's compound sentiment")


def test_ppo_vs_grpo_protocol_grids_and_the_rule_s_choice_by_hand():
    """Every method's grid has the protocol's budget, PPO's earlier flags are a point of its grid, the group size
    is GRPO's and RLOO's axis; the tuned methods take the rule's choice (best validation accuracy, the cheapest
    within a point) and refuse to run before the whole grid is recorded."""
    pvg = load("ppo_vs_grpo")
    assert {len(grid) for grid in pvg.GRIDS.values()} == {pvg.protocol.MIN_RUNS}
    ppo = [pvg.shlex.split(f)[1:] for f in pvg.GRIDS["ppo"].values()]
    assert ["--learning-rate", "1.41e-5", "--update-epochs", "4"] in ppo  # ppo_rlhf_gpt2.py's defaults
    for method in ("grpo", "rloo"):
        sizes = {re.search(r"--num-generations (\d+)", f).group(1) for f in pvg.GRIDS[method].values()}
        assert sizes == {"2", "4", "8", "16"}
    assert pvg.protocol.TUNING_SEED not in pvg.SEEDS and len(pvg.SEEDS) == 6
    for name in pvg.PROTOCOL_TUNING:  # each command parses as its script's flags, and its checks pass
        script, *flags = pvg.command_of(name, 100, "runs", pvg.TUNING_COMMON, pvg.PROTOCOL_TUNING)[1:]
        module = importlib.import_module(script[:-3])
        args = tyro.cli(module.Args, args=flags)
        module.check_args(args)
        assert args.eval_split == "validation" and args.total_episodes == 512
    final = {"ppo": [0.30, 0.50, 0.495, 0.20, 0.1, 0.1, 0.1, 0.1], "grpo": [0.4] * 8, "rloo": [0.2] * 7 + [0.25]}
    cpu = {"ppo": [1, 9, 5, 1, 1, 1, 1, 1], "grpo": [8, 7, 6, 5, 4, 3, 2, 9], "rloo": [1] * 8}
    rows = [{"name": f"{m} {s}", "final": final[m][i], "cpu_s": cpu[m][i]}
            for m in pvg.GRIDS for i, s in enumerate(pvg.GRIDS[m])]
    chosen = pvg.tuned_methods(rows)
    grids = {m: list(g.values()) for m, g in pvg.GRIDS.items()}
    # PPO: 0.495 is within a point of 0.50 and costs 5 against 9; GRPO: all tied, the 7th is cheapest; RLOO: the 8th
    assert chosen == {"tuned_ppo": grids["ppo"][2], "tuned_grpo": grids["grpo"][6], "tuned_rloo": grids["rloo"][7]}
    with pytest.raises(SystemExit, match="7 of rloo's 8 tuning runs are recorded"):
        pvg.tuned_methods(rows[:-1])


def test_ppo_vs_grpo_at_equal_training_time_and_the_protocol_s_tuning_table_by_hand(tmp_path):
    """The completions that tuned PPO's training time buys each critic-free method, and the report's table at
    equal training time and its tuning table by the protocol, from made-up logs worked out by hand."""
    R = load("ppo_vs_grpo_report")  # the page
    pvg = R.harness
    logs, records = {}, []

    def add(method, seed, train_s, final, iterations):
        logs[f"{method}{seed}"] = {"time/rollout": [(i, train_s / iterations) for i in range(1, iterations + 1)],
                                   "time/update": [(i, 0.0) for i in range(1, iterations + 1)],
                                   "eval/accuracy": [(0, 0.1), (iterations, final)]}
        records.append({"method": method, "seed": seed, "command": f"python {method}.py --seed {seed}",
                        "run_dir": f"{method}{seed}", "peak_rss_gb": 1.0, "wall_s": 1.0, "cpu_s": 60.0,
                        "commit": "abc", "date": "2026-11-27"})

    for seed, final in ((7, 0.6), (8, 0.7), (9, 0.8)):
        add("tuned_ppo", seed, 800.0, final, 8)  # 8 iterations of 64: 512 completions in 800 s
        add("tuned_grpo", seed, 200.0, final - 0.2, 8)  # 512 completions in 200 s: 2,048 in PPO's 800 s
        add("tuned_rloo", seed, 300.0, final - 0.3, 8)  # 800 s buy 1,365 completions: 21 whole batches, 1,344
    methods = pvg.summarize(records, logs.__getitem__)
    assert pvg.equal_cpu_completions(methods) == {"tuned_grpo_equal_cpu": 2048, "tuned_rloo_equal_cpu": 1344}
    # 2,048 completions are 32 iterations: evaluated every 8, as 512's 8 iterations are every 2
    assert pvg.equal_cpu_common(pvg.COMMON, 2048).split() == pvg.COMMON.replace(
        "--total-episodes 512", "--total-episodes 2048").replace("--eval-every 2", "--eval-every 8").split()
    assert "--total-episodes 1344 " in pvg.equal_cpu_common(pvg.COMMON, 1344) and "--eval-every 5 " in (
        pvg.equal_cpu_common(pvg.COMMON, 1344))
    for seed, final in ((7, 0.7), (8, 0.8), (9, 0.9)):
        add("tuned_grpo_equal_cpu", seed, 800.0, final, 32)
    tuning = []
    for i, name in enumerate(pvg.PROTOCOL_TUNING):
        accuracy = 0.5 + 0.02 * (i % 8) if name.startswith("ppo") else 0.4
        tuning.append({"name": name, "command": f"python x.py --seed 100 --n {i}", "initial": 0.1,
                       "final": accuracy, "kl": 1.0, "train_s": 60.0, "cpu_s": 120.0 + i})
    text = R.write_report(pvg.summarize(records, logs.__getitem__), tmp_path / "page", tuning)
    # tuned PPO 0.7 ± t(2) 0.1 / sqrt(3); GRPO at PPO's time 0.8: +10.0 points, Welch 2.776 * sqrt(0.02 / 3)
    assert "| PPO, tuned | 512 | 13.3 | 70.0% ± 24.8% | 60.0, 70.0, 80.0% | |" in text
    # at 512 completions each tuned method against tuned PPO (not the untuned PPO rows): finals 0.4-0.6 against
    # 0.6-0.8, -20.0 ± 2.776 * sqrt(0.02 / 3); training time 200 of PPO's 800 s
    assert "| GRPO, tuned | -20.0% ± 22.7% |" in text and "| RLOO, tuned | -30.0% ± 22.7% |" in text
    assert "| GRPO, tuned | 3.3 | 25% |" in text and "| PPO, tuned | 13.3 | 100% |" in text
    assert "| GRPO, tuned, PPO's training time | 2048 | 13.3 | 80.0% ± 24.8% | 70.0, 80.0, 90.0% | +10.0% ± 22.7% |" in text
    assert [s["seed"] for s in json.loads((tmp_path / "page.json").read_text())["tuned_grpo_equal_cpu"]] == [7, 8, 9]
    # the protocol's table: PPO's 8th setting has the best 0.64 (the 7th's 0.62 is 2 points below); GRPO's and RLOO's tie at 0.40, the cheapest
    # (the first of each grid, 120 + i CPU seconds) wins
    ppo, grpo, rloo = (list(pvg.GRIDS[m]) for m in ("ppo", "grpo", "rloo"))
    for name in (f"ppo {ppo[7]}", f"grpo {grpo[0]}", f"rloo {rloo[0]}"):
        assert f"| {name} | 10.0% | " in text and text.split(f"| {name} |")[1].split("\n")[0].endswith("| yes |")
    assert text.split(f"| ppo {ppo[6]} |")[1].split("\n")[0].endswith("|  |")
    assert "Tuning CPU minutes, each method's runs together: ppo 16.5, grpo 17.5, rloo 18.6." in text


def test_ppo_vs_grpo_reads_a_committed_copy_of_runs_from_beside_its_records(tmp_path):
    pvg = load("ppo_vs_grpo")
    (tmp_path / "ppo__7__1").mkdir()
    (tmp_path / "records.jsonl").write_text(
        json.dumps({"method": "ppo", "run_dir": "/elsewhere/runs/ppo__7__1"}) + "\n"
        + json.dumps({"method": "grpo", "run_dir": str(tmp_path / "ppo__7__1")}) + "\n"
        + json.dumps({"method": "rloo", "run_dir": "/elsewhere/runs/gone__7__1"}) + "\n")
    assert [r["run_dir"] for r in pvg.recorded(tmp_path / "records.jsonl")] == [
        str(tmp_path / "ppo__7__1"), str(tmp_path / "ppo__7__1"), "/elsewhere/runs/gone__7__1"]


# ------------------------------------------------------------------------------------ ppo_vs_grpo's search


def test_ppo_vs_grpo_search_grids_meet_the_protocol_and_their_commands_parse():
    pvg = load("ppo_vs_grpo")
    for method, (axes, _) in pvg.SEARCH.items():
        lr = [float(v) for v in axes["lr"].values]
        assert len(lr) >= 4 and all(1.8 <= b / a <= 2.3 for a, b in zip(lr, lr[1:]))  # about 2x apart
        assert len(axes) == 3 and all(len(axis.values) >= 2 for axis in axes.values())
        for name in pvg.protocol.first_grid(axes):
            command = pvg.command_of(f"{method} {name}", 100, "runs", pvg.TUNING_COMMON,
                                     {f"{method} {name}": pvg.search_flags(method, name)})
            flags = [w for w in command if w.startswith("--")]
            assert len(flags) == len(set(flags))  # a setting's flag replaces the common one
            module = importlib.import_module(command[1][:-3])
            args = tyro.cli(module.Args, args=command[2:])
            module.check_args(args)
            setting = pvg.protocol.parse_setting(name, axes)
            assert args.eval_split == "validation" and args.total_episodes == 512 and args.eval_every == 0
            assert args.learning_rate == float(setting["lr"])
            if method == "ppo":
                assert (args.update_epochs, args.batch_size) == (int(setting["epochs"]), int(setting["batch"]))
            else:
                assert args.beta == 0 and args.num_generations == int(setting["G"])
                assert args.num_minibatches == int(setting["steps"]) and args.advantage == method
    assert pvg.merge_flags(["--a", "1", "--no-cuda", "--b", "2"], ["--b", "3", "--c", "x"]) == [
        "--a", "1", "--no-cuda", "--b", "3", "--c", "x"]


def test_ppo_vs_grpo_search_counts_earlier_runs_by_their_flags_and_report_and_run_agree(tmp_path, monkeypatch):
    """A search over a small made-up grid: an earlier run with the same flags in another order is recorded, not
    run; one with another flag runs; the search ends; the setting `run --searched` runs is the one the page marks."""
    R = load("ppo_vs_grpo_report")  # the page
    pvg = R.harness
    axes = {"lr": pvg.protocol.Axis(("1e-5", "2e-5", "4e-5", "8e-5")), "G": pvg.protocol.Axis(("4", "8"), low=2, high=8)}
    monkeypatch.setattr(pvg, "SEARCH", {"rloo": (axes, lambda lr, G: f"grpo_gpt2.py --advantage rloo --num-generations "
                                                                      f"{G} --learning-rate {lr}")})
    monkeypatch.setattr(pvg, "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules["runner"], "ROOT", tmp_path)  # where recorded() reads relative run folders
    truth = {("2e-5", "4"): 0.50, ("2e-5", "8"): 0.49, ("4e-5", "4"): 0.45}  # 2e-5 G 8 within a point, cheaper
    logs, ran = {}, []

    def score(flags: str) -> float:
        d = pvg.flag_dict(flags)
        return truth.get((d["--learning-rate"], d["--num-generations"]), 0.2)

    def fake_run_items(items, runs, jobs, common, flags):
        for name, seed in items:
            ran.append((name, seed))
            logs[f"{name}{seed}"] = {"eval/accuracy": [(0, 0.1), (8, score(flags[name]) - 0.01 * (seed == 101))]}
            record = {"method": name, "seed": seed, "run_dir": f"{name}{seed}", "cpu_s": 60.0 * (2 if "G 4" in name else 1),
                      "command": "python " + " ".join(pvg.command_of(name, seed, "r", common, flags)[1:])}
            with open(runs / "records.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    monkeypatch.setattr(pvg, "run_items", fake_run_items)
    monkeypatch.setattr(pvg, "read_scalars", lambda run_dir: logs[Path(run_dir).name])
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    same = ("python grpo_gpt2.py --learning-rate 1e-5 --num-generations 4 --advantage rloo " + pvg.TUNING_COMMON +
            " --seed 100 --runs-dir elsewhere --exp-name old_a")
    other = same.replace("--exp-name old_a", "--exp-name old_b").replace("--num-generations 4", "--num-generations 8 --beta 0.1")
    (earlier / "records.jsonl").write_text(
        json.dumps({"method": "old a", "seed": 100, "command": same, "run_dir": "/x/old_a__100__1", "cpu_s": 30.0}) + "\n" +
        json.dumps({"method": "old b", "seed": 100, "command": other, "run_dir": "/x/old_b__100__1", "cpu_s": 30.0}) + "\n")
    logs["old_a__100__1"] = {"eval/accuracy": [(0, 0.1), (8, 0.2)]}
    runs = tmp_path / "search"
    runs.mkdir()
    pvg.run_search(["rloo"], runs, 2, [earlier])
    records = pvg.recorded(runs / "records.jsonl")
    assert ("rloo lr 1e-5 G 4", 100) not in ran and ("rloo lr 1e-5 G 8", 100) in ran  # old b has --beta 0.1
    reused = [r for r in records if "reused_from" in r]
    assert [(r["method"], r["reused_from"]) for r in reused] == [("rloo lr 1e-5 G 4", "old a")]
    assert Path(reused[0]["run_dir"]) == earlier / "old_a__100__1"
    # the grid's 8, then the choice (2e-5 G 8: within a point of 2e-5 G 4's 0.50 and half its CPU) sits at the
    # top of G (high 8: none allowed) and inside lr; then the top two (2e-5 G 8 and 2e-5 G 4) at seed 101
    assert [n for n, s in ran if s == 100] == [f"rloo {n}" for n in pvg.protocol.first_grid(axes)][1:]
    assert [(n, s) for n, s in ran if s == 101] == [("rloo lr 2e-5 G 8", 101), ("rloo lr 2e-5 G 4", 101)]
    assert pvg.searched_methods(records) == {"searched_rloo": pvg.search_flags("rloo", "lr 2e-5 G 8")}
    page = "\n".join(R.search_lines(records))
    assert "| lr 2e-5 G 8 | 49.0% | 48.0% | 1.0 | chosen |" in page
    assert "| lr 1e-5 G 4 (earlier) | 20.0% | - | 0.5 |  |" in page
    assert "Chosen: `lr 2e-5 G 8`; on its axes: lr inside; G highest (none allowed)." in page
    assert "would choose the same setting" in page
    # a second seed left does not hold the test runs back (it cannot move the choice); a first-seed run does
    assert pvg.searched_methods([r for r in records if r["method"] != "rloo lr 2e-5 G 4" or r["seed"] != 101]) == {
        "searched_rloo": pvg.search_flags("rloo", "lr 2e-5 G 8")}
    unfinished = [r for r in records if r["method"] != "rloo lr 1e-5 G 8" or r["seed"] != 100]
    with pytest.raises(SystemExit, match="search has 1 run left"):
        pvg.searched_methods(unfinished)
    # `run --searched --methods`: a method whose search is done runs its test seeds while another's goes on
    monkeypatch.setitem(pvg.SEARCH, "ppo", ({"lr": pvg.protocol.Axis(("1e-5", "2e-5", "4e-5", "8e-5"))},
                                            lambda lr: f"ppo_rlhf_gpt2.py --learning-rate {lr}"))
    started = []
    monkeypatch.setattr(pvg, "run_all", lambda methods, seeds, *rest: started.append((methods, seeds)))
    asked = argparse.Namespace(search=str(runs), methods=["rloo"], seeds=[13, 14], jobs=1, equal_cpu=False)
    pvg.run_searched(asked, tmp_path / "test")
    assert started == [(["searched_rloo"], [13, 14])]
    with pytest.raises(SystemExit, match="ppo's search has 4 runs left"):
        pvg.run_searched(argparse.Namespace(**{**vars(asked), "methods": ["ppo", "rloo"]}), tmp_path / "test")
    assert len(started) == 1



def test_runner_runs_each_missing_run_once_records_it_and_skips_failures(tmp_path, monkeypatch, capsys):
    """experiments/runner.py on a stand-in script (no model): 3 runs two at a time, each with the common flags and
    its setting's (the setting's value wins), one record a finished run with its own folder and CPU seconds; a
    run that fails leaves no record, though its folder exists; a second call runs only what is not recorded, and
    a run that leaves no folder of its own is not recorded from an earlier try's."""
    runner = load("runner")
    monkeypatch.setattr(runner, "ROOT", tmp_path)
    (tmp_path / "fake.py").write_text(
        "import argparse, os, sys, time\n"
        "p = argparse.ArgumentParser(); [p.add_argument(f) for f in ('--seed', '--runs-dir', '--exp-name', '--x', "
        "'--fail')]\n"
        "a = p.parse_args()\n"
        "end = time.process_time() + 0.2\n"
        "while time.process_time() < end: pass\n"  # CPU seconds the record must count
        "os.makedirs(os.path.join(a.runs_dir, f'{a.exp_name}__{a.seed}__{a.x}'))\n"
        "if a.fail == a.seed: sys.exit(3)\n")  # a crash after the run's folder exists
    runs = tmp_path / "runs"
    runs.mkdir()
    flags = {"m a": "fake.py --x 7", "m/b": "fake.py --fail 2"}
    runner.run_items([("m a", 1), ("m/b", 1), ("m/b", 2)], runs, 2, "--x 1 --fail 0", flags)
    records = runner.recorded(runs / "records.jsonl")
    assert sorted((r["method"], r["seed"]) for r in records) == [("m a", 1), ("m/b", 1)]
    by = {(r["method"], r["seed"]): r for r in records}
    assert Path(by["m a", 1]["run_dir"]) == runs / "m_a__1__7"  # the setting's --x 7 over the common --x 1
    assert Path(by["m/b", 1]["run_dir"]) == runs / "m_b__1__1"
    assert by["m a", 1]["command"] == ("python fake.py --x 7 --fail 0 --seed 1 --runs-dir runs --exp-name m_a")
    assert all(r["cpu_s"] >= 0.2 and r["wall_s"] >= 0.2 for r in records)
    assert (runs / "m_b__2.log").exists() and (runs / "m_b__2__1").exists()  # failed, its folder left
    (tmp_path / "fake.py").write_text("open('ran', 'a').write('x')\n")  # a run now: a mark, success, no folder
    runner.run_items([("m a", 1), ("m/b", 1), ("m/b", 2)], runs, 1, "--x 1 --fail 0", flags)
    assert (tmp_path / "ran").read_text() == "x"  # the failed run only, again
    assert len(runner.recorded(runs / "records.jsonl")) == 2  # the failed try's folder is not this run's
    (runs / "STOP").touch()  # no run starts; the harness says how many are left and exits with status 0
    with pytest.raises(SystemExit) as stopped:
        runner.run_items([("m a", 1), ("m/b", 2)], runs, 1, "--x 1 --fail 0", flags)
    assert (tmp_path / "ran").read_text() == "x" and stopped.value.code == 0
    assert capsys.readouterr().out.endswith("STOP: 1 runs left (remove it to go on)\n")

def test_ppo_vs_grpo_problems_read_are_the_first_evaluated_held_out_prompts_of_two_digit_runs():
    pvg = load("ppo_vs_grpo")
    held_out = pvg.rlhf.arithmetic_problems(2, held_out=True)
    base = "python ppo_rlhf_gpt2.py --reward-model arithmetic --arithmetic-digits 2 --seed 1"
    records = [{"command": base + " --eval-episodes 4"}, {"command": base + " --eval-episodes 6 --eval-split validation"},
               {"command": base.replace("digits 2", "digits 1") + " --eval-episodes 9"}, {"command": base}]
    read, runs = pvg.problems_read(records)
    assert runs == 2 and read == set(held_out[:256])  # the default --eval-episodes is 256
    read, runs = pvg.problems_read(records[:3])
    assert runs == 1 and read == set(held_out[:4])


def test_ppo_vs_grpo_lists_the_runs_that_evaluated_the_test_split_by_method():
    pvg = load("ppo_vs_grpo")
    base = "python grpo_gpt2.py --reward-model arithmetic --arithmetic-digits 2 --seed 1"
    records = [{"method": "searched_grpo", "command": base + " --eval-split test"},
               {"method": "searched_grpo", "command": base + " --eval-split test --seed 2"},
               {"method": "searched_ppo", "command": base + " --eval-split test"},
               {"method": "tuned_ppo", "command": base},  # the held-out split
               {"method": "x", "command": base + " --eval-split validation"},
               {"method": "y", "command": base.replace("digits 2", "digits 1") + " --eval-split test"}]
    assert pvg.runs_reading_the_test_split(records) == {"searched_grpo": 2, "searched_ppo": 1}
    assert pvg.runs_reading_the_test_split(records[3:]) == {}


def test_ppo_vs_grpo_equal_cpu_budget_by_training_cpu_seconds_by_hand():
    pvg = load("ppo_vs_grpo")
    logs, records = {}, []
    for method, seed, cpu in [("searched_ppo", 13, 600.0), ("searched_ppo", 14, 900.0),
                              ("searched_grpo", 13, 150.0), ("searched_grpo", 14, 200.0), ("searched_rloo", 13, 700.0)]:
        logs[f"{method}{seed}"] = {"time/rollout": [(i, 1.0) for i in range(1, 9)], "time/update": [(i, 0.0) for i in range(1, 9)],
                                   "time/train_cpu": [(i, cpu * i / 8) for i in range(1, 9)],
                                   "eval/accuracy": [(0, 0.1), (8, 0.5)]}
        records.append({"method": method, "seed": seed, "command": f"python x.py --batch-size 64 --seed {seed}",
                        "run_dir": f"{method}{seed}", "peak_rss_gb": 1.0, "wall_s": 1.0, "cpu_s": 1.0,
                        "commit": "abc", "date": "2026-11-29"})
    methods = pvg.summarize(records, logs.__getitem__)
    assert [r["train_cpu_s"] for r in methods["searched_grpo"]] == [150.0, 200.0]
    # PPO's mean 750 CPU s; GRPO 175 s per 512: 750 / 175 * 512 = 2194 -> 34 whole batches of 64 = 2176;
    # RLOO 700 s per 512: 548 -> 8 batches = 512
    assert pvg.equal_cpu_completions(methods, key="train_cpu_s", ppo_key="searched_ppo", others=pvg.SEARCHED[1:]) == {
        "searched_grpo_equal_cpu": 2176, "searched_rloo_equal_cpu": 512}


def test_ppo_vs_grpo_report_of_the_searched_runs_compares_with_the_searched_ppo(tmp_path):
    R = load("ppo_vs_grpo_report")  # the page
    pvg = R.harness
    logs, records = {}, []
    for method, seed, final in [("searched_ppo", 13, 0.6), ("searched_ppo", 14, 0.7), ("searched_ppo", 15, 0.8),
                                ("ppo", 13, 0.1), ("ppo", 14, 0.1), ("ppo", 15, 0.1),
                                ("searched_rloo", 13, 0.4), ("searched_rloo", 14, 0.5), ("searched_rloo", 15, 0.6)]:
        logs[f"{method}{seed}"] = {"time/rollout": [(i, 1.0) for i in range(1, 9)],
                                   "time/update": [(i, 0.0) for i in range(1, 9)], "eval/accuracy": [(0, 0.1), (8, final)]}
        records.append({"method": method, "seed": seed, "command": f"python x.py --seed {seed}", "run_dir": f"{method}{seed}",
                        "peak_rss_gb": 1.0, "wall_s": 1.0, "cpu_s": 1.0, "commit": "abc", "date": "2026-11-29"})
    # RLOO's seed 14 all wrong from iteration 6 to its end (8), seed 15 only at its last iteration (not stuck), seed 13
    # all wrong at 3 and 4 and then not
    raw = {13: [-0.5, -0.5, -1.0, -1.0, -0.9, -0.5, -0.5, -0.5], 14: [-0.8] * 5 + [-1.0] * 3, 15: [-0.5] * 7 + [-1.0]}
    for seed, values in raw.items():
        logs[f"searched_rloo{seed}"]["objective/raw_scores"] = list(zip(range(1, 9), values))
    text = R.write_report(pvg.summarize(records, logs.__getitem__), tmp_path / "page", search=["## The search", "x"])
    # against the searched PPO (0.6-0.8), not the other PPO rows (0.1): -20.0 ± 2.776 * sqrt(0.02 / 3)
    assert "| RLOO, searched | -20.0% ± 22.7% |" in text
    # every run starts at 10% (step 0); RLOO's seeds end at 40-60%, none below; a run of PPO's seed 16 ending at 5%
    assert "| RLOO, searched | 0 of 3 | - | 1 of 3 | 14 from 6 |" in text
    assert "| PPO, searched | 0 of 3 | - | 0 of 3 | - |" in text
    logs["searched_ppo16"] = {**logs["searched_ppo13"], "eval/accuracy": [(0, 0.1), (8, 0.05)]}
    records.append({**records[0], "seed": 16, "run_dir": "searched_ppo16"})
    text = R.write_report(pvg.summarize(records, logs.__getitem__), tmp_path / "page", search=["## The search", "x"])
    assert "| PPO, searched | 1 of 4 | 16, 10.0%, 5.0% | 0 of 4 | - |" in text
    assert "\n## The search\nx\n\n## Commands" in text


def test_the_sums_page_is_what_its_report_command_writes_from_the_committed_records(tmp_path, monkeypatch):
    """The report command the page names (`python experiments/ppo_vs_grpo_report.py ...`), run on the committed
    records into a copy of the page: every table, its top and its reading come out as committed."""
    R = load("ppo_vs_grpo_report")
    page = Path(ROOT, "docs/results/ppo_vs_grpo.md").read_text()
    command = next(line.split() for line in page.splitlines()
                   if line.startswith("    python experiments/ppo_vs_grpo_report.py"))
    (tmp_path / "ppo_vs_grpo.md").write_text(page.replace("| PPO, tuned | 7 |", "| PPO, tuned | 70 |"))  # a stale row
    monkeypatch.setattr(sys, "argv", [command[1], *command[2:], "--out", str(tmp_path / "ppo_vs_grpo")])
    R.main()
    assert (tmp_path / "ppo_vs_grpo.md").read_text() == page


def test_the_sums_page_reads_several_runs_folders_each_equal_cost_run_beside_its_own_ppo(tmp_path, monkeypatch):
    """`ppo_vs_grpo_report.py --runs A B`: the protocol's tuned runs in one folder, the search's in another (real
    TensorBoard logs); each method's difference and each run at PPO's training time is against the PPO of its own
    kind (tuned against tuned PPO, searched against searched PPO), worked out by hand."""
    from torch.utils.tensorboard import SummaryWriter

    R = load("ppo_vs_grpo_report")
    finals = {"tuned": {"tuned_ppo": (0.5, 0.6, 0.7), "tuned_rloo": (0.2, 0.3, 0.4),
                        "tuned_rloo_equal_cpu": (0.6, 0.7, 0.8)},
              "search": {"searched_ppo": (0.6, 0.7, 0.8), "searched_rloo": (0.6, 0.7, 0.8),
                         "searched_rloo_equal_cpu": (0.3, 0.4, 0.5)}}
    for folder, methods in finals.items():
        (tmp_path / folder).mkdir()
        with open(tmp_path / folder / "records.jsonl", "w") as f:
            for method, ends in methods.items():
                for seed, end in zip((7, 8, 9), ends):
                    run_dir = tmp_path / folder / f"{method}__{seed}"
                    writer = SummaryWriter(str(run_dir))
                    for i in range(1, 9):
                        writer.add_scalar("time/rollout", 1.0, i)
                        writer.add_scalar("time/update", 0.5, i)
                    writer.add_scalar("eval/accuracy", 0.1, 0)
                    writer.add_scalar("eval/accuracy", end, 8)
                    writer.close()
                    split = " --eval-split test" * (folder == "search")  # the search's: the test split
                    f.write(json.dumps({"method": method, "seed": seed, "command": f"python x.py{split} --seed {seed}",
                                        "run_dir": str(run_dir), "peak_rss_gb": 1.0, "wall_s": 60.0, "cpu_s": 60.0,
                                        "commit": "abc", "date": "2026-12-01"}) + "\n")
    monkeypatch.setattr(sys, "argv", ["ppo_vs_grpo_report.py", "--runs", str(tmp_path / "tuned"),
                                      str(tmp_path / "search"), "--out", str(tmp_path / "page")])
    R.main()
    text = (tmp_path / "page.md").read_text()
    # a seed's 256 prompts: on the held-out split both orders of 126 sums, one of another, 3 of a + a (130); on the
    # test split 256 sums
    assert ("## Held-out accuracy (one sampled response a prompt; `--eval-split held_out`: 256 prompts, 130 distinct "
            "problems; `--eval-split test`: 256 prompts, 256 distinct problems)") in text
    half = "22.7%"  # 2.776 (4 degrees of freedom) * sqrt(0.01 / 3 + 0.01 / 3)
    assert f"| RLOO, tuned | -30.0% ± {half} |" in text and f"| RLOO, searched | +0.0% ± {half} |" in text
    tuned, searched = text.split("## At the training time of PPO, tuned")[1], text.split(
        "## At the training time of PPO, searched")[1]
    rows = lambda section: [line for line in section.split("##")[0].splitlines() if line.startswith("| RLOO")]
    assert rows(tuned) == [f"| RLOO, tuned, PPO's training time | 512 | 0.2 | 70.0% ± 24.8% | 60.0, 70.0, 80.0% | "
                           f"+10.0% ± {half} |"]
    assert rows(searched) == [f"| RLOO, searched, PPO's training CPU time | 512 | 0.2 | 40.0% ± 24.8% | 30.0, 40.0, "
                              f"50.0% | -30.0% ± {half} |"]
    # an earlier sitting's tuned runs (--earlier) against that sitting's tuned PPO, not today's
    pvg = R.harness
    methods = pvg.summarize(pvg.recorded(tmp_path / "tuned" / "records.jsonl"), pvg.read_scalars)
    earlier = {f"earlier:{m}": [dict(r, accuracy=[0.1, r["accuracy"][-1] - 0.2]) if m == "tuned_ppo" else r
                                for r in runs] for m, runs in methods.items()}
    text = R.write_report({**methods, **earlier}, tmp_path / "page")
    assert f"| RLOO, tuned (earlier sitting) | -10.0% ± {half} |" in text  # 20-40% against 30-50%
    assert "## At the training time of PPO, tuned (earlier sitting)" in text
