"""Tests of benchmarks/reward_probe.py and benchmarks/preference_baselines.py: the split they share with
reward_model_gpt2.py, the intervals over prompts, the Bradley-Terry fit, the cross-validated L2 and the probe's
features, each against a slow reference worked out here; then the command lines on tiny files and models."""

import itertools
import json
import math
import sys

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

import reward_model_gpt2 as rm
from conftest import load_benchmark

EOS = "<|endoftext|>"


baselines = load_benchmark("preference_baselines")
probe = load_benchmark("reward_probe")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny GPT-2 and its tokenizer, saved; and a preference file of 12 prompts where the chosen response
    says "good" and the rejected one "bad" among shared filler words (gold agrees with 3 labels in 4)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("tiny_probe")
    fillers = ["the film", "a scene", "this plot", "an actor", "the music"]
    comparisons = [{"prompt": rm.PROMPTS[i % 12], "chosen": f" {fillers[i % 5]} good {fillers[(i + 2) % 5]}",
                    "rejected": f" {fillers[(i + 1) % 5]} bad {fillers[(i + 3) % 5]}",
                    "gold_chosen": 1.0 if i % 4 else -1.0, "gold_rejected": 0.0} for i in range(60)]
    path = root / "preferences.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in comparisons))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(rm.PROMPTS + [c["chosen"] + c["rejected"] for c in comparisons],
                                  trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS], show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, unk_token=EOS)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(hf_tokenizer), n_positions=64, n_embd=16, n_layer=2, n_head=2)
                    ).save_pretrained(root / "model")
    hf_tokenizer.save_pretrained(root / "model")
    return {"comparisons": comparisons, "preferences": str(path), "model": str(root / "model"), "root": root}


def run_tool(module, monkeypatch, capsys, *argv) -> str:
    monkeypatch.setattr(sys, "argv", ["tool", *map(str, argv)])
    module.main()
    return capsys.readouterr().out


# ------------------------------------------------------------------------------------------ the math


def test_prompt_bootstrap_against_the_exact_distribution():
    """Resampling 4 prompts with replacement has 4^4 equally likely outcomes; the pooled accuracy of each
    (correct over compared, over the picked prompts' comparisons) gives the exact quantiles."""
    per_prompt = {"a": [1.0], "b": [0.0, 0.0, 0.0], "c": [1.0, 0.5], "d": [1.0, 0.0, 1.0, 1.0]}
    values = [v for p in per_prompt for v in per_prompt[p]]
    prompts = [p for p in per_prompt for _ in per_prompt[p]]
    outcomes = sorted(sum(sum(per_prompt[p]) for p in picks) / sum(len(per_prompt[p]) for p in picks)
                      for picks in itertools.product(per_prompt, repeat=4))
    low, high = baselines.prompt_bootstrap(np.array(values), prompts, num_resamples=40000)
    assert low == pytest.approx(outcomes[math.floor(0.025 * 256)], abs=0.02)
    assert high == pytest.approx(outcomes[math.ceil(0.975 * 256) - 1], abs=0.02)
    # one outcome per prompt alike: no spread; comparisons of one prompt move together, so 4 prompts of 50
    # comparisons give a much wider interval than 200 independent comparisons would (about +-0.07)
    assert baselines.prompt_bootstrap(np.ones(6), list("aabbcc")) == (1.0, 1.0)
    low, high = baselines.prompt_bootstrap(np.repeat([1.0, 0.0, 1.0, 1.0], 50), list(np.repeat(list("abcd"), 50)))
    assert high - low > 0.4


def newton_logistic_regression(x: np.ndarray, y: np.ndarray, l2: float, n: int, iterations: int = 50):
    """The reference: logistic regression with an intercept by Newton's method, minimizing the mean
    cross-entropy over the rows plus l2 |w|^2 / n (no penalty on the intercept)."""
    design = np.hstack([x, np.ones((len(x), 1))])
    theta = np.zeros(design.shape[1])
    penalty = np.full(design.shape[1], 2 * l2 / n)
    penalty[-1] = 0.0
    for _ in range(iterations):
        p = 1 / (1 + np.exp(-design @ theta))
        gradient = design.T @ (p - y) / len(x) + penalty * theta
        hessian = design.T @ (design * (p * (1 - p))[:, None]) / len(x) + np.diag(penalty)
        theta -= np.linalg.solve(hessian, gradient)
    return theta[:-1], theta[-1]


def test_fit_bradley_terry_is_logistic_regression_on_the_symmetrized_pairs():
    rng = np.random.default_rng(0)
    differences = rng.normal(size=(40, 3))
    differences[:, 0] += 1.0  # chosen ones higher in feature 0, mostly
    for l2 in (0.1, 3.0):
        weights = baselines.fit_bradley_terry(torch.tensor(differences), l2).numpy()
        x, y = np.vstack([differences, -differences]), np.r_[np.ones(40), np.zeros(40)]
        expected, intercept = newton_logistic_regression(x, y, l2, n=40)
        np.testing.assert_allclose(weights, expected, atol=1e-5)  # LBFGS stops within about 1e-6
        assert abs(intercept) < 1e-9  # symmetrized: an intercept carries nothing
    strong = baselines.fit_bradley_terry(torch.tensor(differences), 1e4).numpy()
    assert np.abs(strong).max() < 0.01 * np.abs(weights).max()  # the penalty shrinks the weights


def test_folds_hold_whole_prompts_and_the_cross_validated_l2_is_the_best_pooled_one():
    prompts = [f"p{k % 7}" for k in range(50)]
    folds = baselines.prompt_folds(prompts, 3, seed=1)
    assert sorted(i for fold in folds for i in fold) == list(range(50))
    fold_prompts = [{prompts[i] for i in fold} for fold in folds]
    assert all(fold_prompts) and sum(len(f) for f in fold_prompts) == 7  # no prompt in two folds
    assert baselines.prompt_folds(prompts, 3, seed=1) == folds
    rng = np.random.default_rng(1)
    differences = torch.tensor(rng.normal(size=(50, 20)))
    differences[:, 0] += 0.6
    l2s = [0.3, 10.0, 1e4]
    chosen, scores = baselines.cross_validated_l2(differences, prompts, l2s, 3, seed=1)
    for l2 in l2s:  # by hand: each fold scored by a fit on the other folds, the accuracy pooled
        margins = np.zeros(50)
        for fold in folds:
            rest = [i for i in range(50) if i not in fold]
            margins[fold] = (differences[fold] @ baselines.fit_bradley_terry(differences[rest], l2)).numpy()
        assert scores[l2] == pytest.approx(np.mean((margins > 0) + 0.5 * (margins == 0)))
    assert chosen == max(l2s, key=lambda l2: scores[l2])
    assert len(set(scores.values())) > 1


def test_bag_of_words_learns_a_word_preference(tiny):
    comparisons = tiny["comparisons"]
    train, held_out = rm.split_comparisons([c["prompt"] for c in comparisons], 0.25, 1)
    assert baselines.bag_of_words_accuracy(comparisons, train, held_out, 0.1) == 1.0
    # words never seen in training score 0: a held-out pair made only of them is a tie (1/2)
    unseen = comparisons + [{"prompt": "It was", "chosen": " superb", "rejected": " dull"}]
    assert baselines.bag_of_words_accuracy(unseen, train, [60], 0.1) == 0.5


# ------------------------------------------------------------------------------------------ the probe


def test_features_at_each_readout_are_those_of_each_text_alone(tiny):
    """Left-padded batches give, per text alone (prompt + response + EOS, no padding): the final state at the
    text's last token, at the EOS, and the mean over the response's tokens; and the state after block 1."""
    tokenizer, _ = rm.load_tokenizer(tiny["model"], ".")
    model = probe.AutoModel.from_pretrained(tiny["model"]).eval()
    prompts = ["This movie was", "The acting in this one is", "This movie was"]
    responses = [" the film good.", " bad", " a scene good the music"]
    features = probe.response_features(model, tokenizer, prompts, responses, [-1, 1], 64, batch_size=2)
    assert set(features) == {"last", "end", "mean"} and features["end"].shape == (3, 2, 16)
    for k, (prompt, response) in enumerate(zip(prompts, responses)):
        prompt_ids, response_ids = tokenizer(prompt)["input_ids"], tokenizer(response)["input_ids"]
        ids = prompt_ids + response_ids + [tokenizer.eos_token_id]
        assert tokenizer(prompt + response + EOS)["input_ids"] == ids  # the boundary is a token boundary
        with torch.no_grad():
            output = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        for j, states in enumerate([output.last_hidden_state[0], output.hidden_states[1][0]]):
            torch.testing.assert_close(features["last"][k, j].float(), states[-2], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(features["end"][k, j].float(), states[-1], atol=1e-5, rtol=1e-4)
            mean = states[len(prompt_ids) : -1].mean(0)
            torch.testing.assert_close(features["mean"][k, j].float(), mean, atol=1e-5, rtol=1e-4)


def test_standardized_differences_use_the_training_responses():
    rng = np.random.default_rng(2)
    chosen, rejected = rng.normal(3.0, 2.0, (10, 4)), rng.normal(0.0, 5.0, (10, 4))
    train = [0, 2, 3, 7, 9]
    responses = np.vstack([chosen[train], rejected[train]])
    mean, std = responses.mean(0), responses.std(0, ddof=1)
    expected = (chosen - mean) / std - (rejected - mean) / std
    got = probe.standardized_differences(torch.tensor(chosen), torch.tensor(rejected), train).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_the_probe_finds_a_signal_in_one_feature():
    """Feature 0 says which response is chosen, the other 9 are noise: cross-validation keeps the L2 that
    predicts held-out prompts, and the held-out accuracy at it is high; with no signal, it is near 1/2."""
    rng = np.random.default_rng(3)
    prompts = [f"p{k % 12}" for k in range(240)]
    train, held_out = rm.split_comparisons(prompts, 0.25, 1)
    differences = torch.tensor(rng.normal(size=(240, 10)))
    differences[:, 0] += 1.5
    result = probe.probe(differences, prompts, train, held_out, [0.1, 10.0], 4, seed=1)
    assert result["l2"] in (0.1, 10.0) and set(result["cross_validated"]) == {0.1, 10.0}
    assert np.mean(baselines.correct(result["margins"])) == result["held_out"][result["l2"]] > 0.85
    differences[:, 0] -= 1.5
    noise = probe.probe(differences, prompts, train, held_out, [0.1, 10.0], 4, seed=1)
    assert abs(noise["held_out"][noise["l2"]] - 0.5) < 0.15


# ------------------------------------------------------------------------------------------ the tools


def test_preference_baselines_prints_each_model_with_an_interval_over_prompts(tiny, monkeypatch, capsys):
    comparisons = tiny["comparisons"]
    train, held_out = rm.split_comparisons([c["prompt"] for c in comparisons], 0.25, 1)
    out = run_tool(baselines, monkeypatch, capsys, tiny["preferences"], "--eval-fraction", 0.25, "--sizes", 8,
                   "--l2", 0.1, 1.0, "--folds", 3)
    assert f"{len(train)} training comparisons of 9 prompts, {len(held_out)} held-out comparisons of 3 prompts" in out
    gold = [1.0 if i % 4 else 0.0 for i in held_out]
    low, high = baselines.prompt_bootstrap(np.array(gold), [comparisons[i]["prompt"] for i in held_out])
    assert f"gold labeler: {np.mean(gold):.3f} [{low:.3f}, {high:.3f}]" in out
    assert "bag of words, 8 training comparisons: " in out
    assert f"bag of words, {len(train)} training comparisons: 1.000 [1.000, 1.000] at l2 " in out


def test_reward_model_scores_are_read_on_the_same_split(tiny, tmp_path, monkeypatch, capsys):
    """A reward_model_gpt2.py run on the file writes its held-out margins; preference_baselines.py --scores
    reads them on its own split (the same one: it would stop otherwise), gives the run's accuracy, and its
    difference from the bag-of-words model (accuracy 1 here) over the same prompts."""
    result = rm.main(rm.Args(model_name=tiny["model"], preferences=tiny["preferences"], eval_fraction=0.25,
                             batch_size=8, runs_dir=str(tmp_path / "runs"), cuda=False, stop_token="eos"))
    out = run_tool(baselines, monkeypatch, capsys, tiny["preferences"], "--eval-fraction", 0.25, "--l2", 0.1,
                   "--folds", 3, "--sizes", 60, "--scores", result["held_out_scores"], result["held_out_scores"])
    accuracy = result["eval_accuracy"]
    assert f"reward model {result['held_out_scores']}: {accuracy:.3f} [" in out
    assert f"minus bag of words (45 comparisons): {accuracy - 1:.3f} [" in out
    assert out.count("minus the first reward model: 0.000 [0.000, 0.000]") == 1  # the second, the same run
    with pytest.raises(SystemExit, match="^error: --scores .*not this split's"):
        run_tool(baselines, monkeypatch, capsys, tiny["preferences"], "--eval-fraction", 0.5, "--scores",
                 result["held_out_scores"])


def test_reward_probe_command_line(tiny, monkeypatch, capsys):
    out = run_tool(probe, monkeypatch, capsys, tiny["preferences"], "--model-name", tiny["model"],
                   "--eval-fraction", 0.25, "--l2", 1.0, 100.0, "--folds", 3, "--layers", -1, 1, "--sizes", 20)
    for readout in ("last", "end", "mean"):
        for layer, size in itertools.product((-1, 1), (20, 45)):
            assert f"{readout}, layer {layer}, {size} training comparisons: held-out " in out
    assert "(cross-validated / held-out: l2 1: " in out


@pytest.mark.parametrize("argv, message", [
    (["--eval-fraction", "1.0"], "--eval-fraction must be between 0 and 1"),
    (["--folds", "1"], "--folds must be at least 2"),
    (["--layers", "5"], "--layers \\[5\\]: each must be -1, or 0 to 2"),
    (["--eval-fraction", "0.95"], "fewer than 2 training prompts"),
])
def test_reward_probe_bad_arguments_fail_with_one_line(tiny, monkeypatch, capsys, argv, message):
    with pytest.raises(SystemExit, match=f"^error: .*{message}") as error:
        run_tool(probe, monkeypatch, capsys, tiny["preferences"], "--model-name", tiny["model"], *argv)
    assert "\n" not in str(error.value)
    with pytest.raises(SystemExit, match="^error: /no/such.jsonl: no such file"):
        run_tool(baselines, monkeypatch, capsys, "/no/such.jsonl")
