"""Tests of reward_model_gpt2.py, offline: a tiny GPT-2 and its tokenizer are built here, saved with
save_pretrained, and loaded by the script's own loading code. Expected values come from plain python or
plain transformers, never from the function under test."""

import ast
import dataclasses
import json
import math
import os
import random
import statistics
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (AutoModelForSequenceClassification, AutoTokenizer, GPT2Config,
                          GPT2ForSequenceClassification, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          PreTrainedTokenizerFast)
from tyro._docstrings import get_field_docstring

import grpo_gpt2
import ppo_rlhf_gpt2 as rlhf
import reward_model_gpt2 as rm
from conftest import EOS, REVIEWS, bf16_run, byte_level_bpe

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny GPT-2 policy (dropout in its config, no pad token, like GPT-2) saved to a temporary folder."""
    torch.set_num_threads(1)  # as the script's runs: two threads on two busy cores are many times slower
    root = tmp_path_factory.mktemp("tiny_reward_models")
    tokenizer, hf_tokenizer = byte_level_bpe(rm.PROMPTS + REVIEWS, 400)
    eos_id = hf_tokenizer.eos_token_id
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(hf_tokenizer), n_positions=128, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=eos_id, eos_token_id=eos_id)
    assert config.resid_pdrop > 0  # dropout must be switched off by the script
    policy = GPT2LMHeadModel(config)
    policy.save_pretrained(root / "policy")
    hf_tokenizer.save_pretrained(root / "policy")
    # a policy that ends about one response in seven tokens with ".": lengths that differ by whole tokens
    dot = policy.transformer.wte.weight[hf_tokenizer.convert_tokens_to_ids(".")].detach()
    with torch.no_grad():
        policy.transformer.ln_f.bias.copy_(3.0 * dot / dot.dot(dot))  # adds 3 to the logit of "."
    policy.save_pretrained(root / "stops")
    hf_tokenizer.save_pretrained(root / "stops")
    # SmolLM2's case: a Llama whose tokenizer pads with its EOS
    smol_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=EOS, eos_token=EOS,
                                             unk_token=EOS, pad_token=EOS)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(hf_tokenizer), hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                 max_position_embeddings=128, bos_token_id=eos_id, eos_token_id=eos_id,
                                 pad_token_id=eos_id)).save_pretrained(root / "smol")
    smol_tokenizer.save_pretrained(root / "smol")
    return {"policy": str(root / "policy"), "stops": str(root / "stops"), "smol": str(root / "smol"),
            "root": root}


def tiny_args(tiny, tmp_path, **overrides) -> rm.Args:
    defaults = dict(model_name=tiny["policy"], gold="length", runs_dir=str(tmp_path / "runs"), cuda=False,
                    num_comparisons=32, eval_fraction=0.25, batch_size=8, forward_batch_size=16,
                    response_length=8, min_response_length=0, learning_rate=1e-3, eval_every=2)
    defaults.update(overrides)
    return rm.Args(**defaults)


def read_scalars(run_dir) -> dict:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def read_lines(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def write_lines(path, comparisons) -> str:
    Path(path).write_text("".join(json.dumps(c) + "\n" for c in comparisons))
    return str(path)


def loaded_reward_model(tiny):
    torch.manual_seed(0)
    return rm.load_reward_model(tiny["policy"], CPU)


# ---------------------------------------------------------------------------------------------- the math


def test_preference_loss_against_a_per_pair_formula():
    torch.manual_seed(0)
    chosen, rejected = torch.randn(7) * 3, torch.randn(7) * 3
    expected = sum(math.log(1 + math.exp(-(c - r))) for c, r in zip(chosen.tolist(), rejected.tolist())) / 7
    assert rm.preference_loss(chosen, rejected).item() == pytest.approx(expected, rel=1e-5)
    # swapping chosen and rejected is another loss; equal scores cost log 2
    assert rm.preference_loss(rejected, chosen).item() != pytest.approx(expected, rel=1e-3)
    assert rm.preference_loss(torch.zeros(3), torch.zeros(3)).item() == pytest.approx(math.log(2))


def test_comparison_accuracy_counts_ties_as_half():
    chosen, rejected = torch.tensor([2.0, 1.0, 0.5, 3.0]), torch.tensor([1.0, 1.0, 0.7, -1.0])
    assert rm.comparison_accuracy(chosen, rejected) == pytest.approx((1 + 0.5 + 0 + 1) / 4)


def test_bradley_terry_labels():
    gold_a = torch.tensor([0.3, -0.2, 0.5, 0.1] * 2000)
    gold_b = torch.tensor([0.1, 0.4, 0.5, -0.3] * 2000)
    # near-zero noise: the higher gold score always wins (ties: a coin flip)
    labels = rm.bradley_terry_labels(gold_a, gold_b, 1e-6, torch.Generator().manual_seed(0))
    assert labels[0::4].all() and not labels[1::4].any() and labels[3::4].all()
    assert 0.45 < labels[2::4].float().mean().item() < 0.55
    # beta 0.2: each pair is preferred with probability 1 / (1 + exp(-(a - b) / 0.2))
    labels = rm.bradley_terry_labels(gold_a, gold_b, 0.2, torch.Generator().manual_seed(1))
    for i, (a, b) in enumerate([(0.3, 0.1), (-0.2, 0.4), (0.5, 0.5), (0.1, -0.3)]):
        p = 1 / (1 + math.exp(-(a - b) / 0.2))
        tolerance = 4 * math.sqrt(p * (1 - p) / 2000) + 1e-3  # four standard errors
        assert labels[i::4].float().mean().item() == pytest.approx(p, abs=tolerance)
    again = rm.bradley_terry_labels(gold_a, gold_b, 0.2, torch.Generator().manual_seed(1))
    assert torch.equal(labels, again)


def test_score_normalization():
    raw = torch.tensor([1.0, 2.0, 4.0, 7.0])
    gain, bias = rm.score_normalization(raw)
    normalized = [gain * x + bias for x in raw.tolist()]
    assert statistics.mean(normalized) == pytest.approx(0, abs=1e-6)
    assert statistics.stdev(normalized) == pytest.approx(1)
    assert rm.score_normalization(torch.full((5,), 3.0)) == (1.0, pytest.approx(-3.0))
    with warnings.catch_warnings():  # one sample has no scale; torch warns if asked for its std: never ask
        warnings.simplefilter("error")
        assert rm.score_normalization(torch.tensor([3.0])) == (1.0, pytest.approx(-3.0))
    # two scores 0.5 apart: sample std 0.5 / sqrt(2) (below 1, so the gain is above 1), mean 0.25
    assert rm.score_normalization(torch.tensor([0.0, 0.5])) == (pytest.approx(2 ** 0.5 / 0.5),
                                                                pytest.approx(-0.25 * 2 ** 0.5 / 0.5))


def test_split_holds_out_whole_prompts_seeded_and_stable():
    """detail 39: round(fraction x distinct prompts) prompts (at least one) are held out with all their
    comparisons, those with the smallest keys random.Random(f"{seed} {prompt}").random(); so the first lines
    of a file that hold the same prompts hold out the same ones."""
    prompts = [f"prompt {k % 10}" for k in range(57)]  # 10 distinct prompts, 5 or 6 comparisons each
    train, held_out = rm.split_comparisons(prompts, 0.3, seed=3)
    assert sorted(train + held_out) == list(range(57)) and train == sorted(train) and held_out == sorted(held_out)
    held_prompts = {prompts[i] for i in held_out}
    assert len(held_prompts) == 3 and not held_prompts & {prompts[i] for i in train}
    keys = {p: random.Random(f"3 {p}").random() for p in set(prompts)}
    assert held_prompts == set(sorted(keys, key=keys.get)[:3])
    assert held_prompts != {f"prompt {k}" for k in range(3)}  # not the first prompts of the file
    assert (train, held_out) == rm.split_comparisons(prompts, 0.3, seed=3)
    assert held_prompts != {prompts[i] for i in rm.split_comparisons(prompts, 0.3, seed=4)[1]}
    # the first 30 lines hold all 10 prompts: the same prompts held out, whatever the order of the lines
    assert rm.split_comparisons(prompts[:30], 0.3, seed=3)[1] == [i for i in held_out if i < 30]
    shuffled = prompts[::-1]
    assert {shuffled[i] for i in rm.split_comparisons(shuffled, 0.3, seed=3)[1]} == held_prompts
    # at least one prompt held out; a single prompt leaves nothing to train on
    assert len({prompts[i] for i in rm.split_comparisons(prompts, 0.01, 0)[1]}) == 1
    assert rm.split_comparisons(["a"] * 4, 0.5, 0) == ([], [0, 1, 2, 3])


def newton_bradley_terry(chosen, rejected, l2, std, iterations=50):
    """The reference fit in numpy, on the raw features: Newton's method on mean(log(1 + exp(-d.w))) +
    l2 sum((std * w)^2), d = chosen - rejected (Newton's steps do not care how the features are scaled)."""
    d = chosen - rejected
    w = np.zeros(d.shape[1])
    for _ in range(iterations):
        p = 1 / (1 + np.exp(-(d @ w)))
        w -= np.linalg.solve((d.T * (p * (1 - p))) @ d / len(d) + 2 * l2 * np.diag(std ** 2),
                             bradley_terry_gradient(chosen, rejected, l2, std, w))
    return w


def bradley_terry_gradient(chosen, rejected, l2, std, w):
    """The gradient in w of mean over pairs of -log sigma(d.w) + l2 sum((std * w)^2), written out."""
    d = chosen - rejected
    return -(d * (1 / (1 + np.exp(d @ w)))[:, None]).mean(0) + 2 * l2 * std ** 2 * w


def badly_scaled_pairs(n, hidden, seed, noise=1.0):
    """Features with an offset and a few huge and tiny dimensions, as a language model's final states; chosen
    or rejected by a linear rule with noise (noise 0: separable)."""
    rng = np.random.default_rng(seed)
    scale = np.ones(hidden)
    scale[:2], scale[2:4] = 100.0, 0.1
    features = (rng.normal(size=(2 * n, hidden)) + 3.0) * scale
    rule = rng.normal(size=hidden) / scale
    margins = (features[:n] - features[n:]) @ rule + noise * rng.logistic(size=n)
    first = (margins > 0)[:, None]
    return np.where(first, features[:n], features[n:]), np.where(first, features[n:], features[:n]), rule


def test_fit_probe_is_the_minimum_of_the_regularized_loss():
    """detail 45: the weight fit_probe returns has the gradient 0 of mean(-log sigma(w.(chosen - rejected)))
    + l2 |w * std|^2 (written out in numpy), std over all the responses; it is Newton's minimum on the raw
    features (so fitting on standardized features and folding the std back is exact), with and without L2."""
    chosen, rejected, _ = badly_scaled_pairs(400, 12, seed=0)
    std = np.concatenate([chosen, rejected]).std(0, ddof=1)
    for l2 in (0.05, 0.0):
        w = rm.fit_probe(*(torch.tensor(x, dtype=torch.float32) for x in (chosen, rejected)), l2).numpy()
        # float32 features in, as the backbone's: the reference sees the same float32 values
        c32, r32 = (x.astype(np.float32).astype(np.float64) for x in (chosen, rejected))
        std32 = np.concatenate([c32, r32]).std(0, ddof=1)
        gradient = bradley_terry_gradient(c32, r32, l2, std32, w)
        assert np.abs(gradient / std32).max() < 1e-6, l2  # per unit of the standardized weight
        assert np.abs(bradley_terry_gradient(c32, r32, l2, std32, np.zeros(12)) / std32).max() > 0.1
        expected = newton_bradley_terry(c32, r32, l2, std32)
        assert np.abs(bradley_terry_gradient(c32, r32, l2, std32, expected) / std32).max() < 1e-10
        np.testing.assert_allclose((c32 - r32) @ w, (c32 - r32) @ expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(w * std32, expected * std32, rtol=1e-5, atol=1e-6)
    # the L2 is on the standardized weight: on the raw one (or without the std) the minimum is elsewhere
    unscaled = newton_bradley_terry(chosen, rejected, 0.05, np.ones(12))
    assert np.abs((unscaled - newton_bradley_terry(chosen, rejected, 0.05, std)) * std).max() > 1e-2
    assert std.max() / std.min() > 500  # the scales really differ


def test_fit_probe_separates_separable_pairs():
    """Pairs ordered by a linear rule without noise, those it orders by a wide margin: the fitted head orders
    every pair as labeled, its direction close to the rule's; chosen and rejected swapped, the weight flips
    sign."""
    chosen, rejected, rule = badly_scaled_pairs(600, 8, seed=1, noise=0.0)
    margins = (chosen - rejected) @ rule
    wide = margins > 0.5 * margins.std()
    chosen, rejected = chosen[wide], rejected[wide]
    assert len(chosen) > 150
    c, r = torch.tensor(chosen), torch.tensor(rejected)
    w = rm.fit_probe(c, r, 1e-3).numpy()
    assert ((chosen - rejected) @ w > 0).all()
    std = np.concatenate([chosen, rejected]).std(0, ddof=1)
    cosine = (w * std) @ (rule * std) / np.linalg.norm(w * std) / np.linalg.norm(rule * std)
    assert cosine > 0.9
    np.testing.assert_allclose(rm.fit_probe(r, c, 1e-3).numpy(), -w, rtol=1e-5, atol=1e-8)


def test_cross_validated_l2_scores_each_prompt_by_a_probe_fitted_without_it(monkeypatch):
    """detail 45: with as many folds as training prompts, each prompt's pairs are scored by Newton's fit
    (numpy) on the other prompts' pairs; an L2's accuracy is the share of all pairs ordered right (ties 1/2),
    the chosen L2 the most accurate. With fewer folds, every fit sees each prompt whole or not at all, and each
    prompt is left out once per L2. One L2: returned unscored."""
    chosen, rejected, _ = badly_scaled_pairs(60, 12, seed=6, noise=2.0)
    prompts = [f"prompt {k}" for k, size in enumerate((4, 6, 8, 10, 12, 20)) for _ in range(size)]  # in blocks
    c, r = torch.tensor(chosen), torch.tensor(rejected)
    l2s = (1e-4, 0.3, 30.0)
    expected = {}
    for l2 in l2s:
        right = 0.0
        for p in sorted(set(prompts)):
            fit = np.array([q != p for q in prompts])
            std = np.concatenate([chosen[fit], rejected[fit]]).std(0, ddof=1)
            w = newton_bradley_terry(chosen[fit], rejected[fit], l2, std)
            margins = (chosen[~fit] - rejected[~fit]) @ w
            right += np.sum(margins > 0) + 0.5 * np.sum(margins == 0)
        expected[l2] = right / 60
    assert expected[0.3] > max(expected[1e-4], expected[30.0])  # the middle one wins: neither end by default
    chosen_l2, accuracies = rm.cross_validated_l2(c, r, prompts, l2s, folds=6, seed=1)
    assert accuracies == pytest.approx(expected)
    assert chosen_l2 == max(l2s, key=expected.get)
    assert rm.cross_validated_l2(c, r, prompts, (0.3,), folds=6, seed=1) == (0.3, {})

    fitted_rows, real_fit = [], rm.fit_probe

    def fit_probe(fit_chosen, *a):
        fitted_rows.append({i for i in range(60) if any(torch.equal(c[i], row) for row in fit_chosen)})
        return real_fit(fit_chosen, *a)

    monkeypatch.setattr(rm, "fit_probe", fit_probe)
    rm.cross_validated_l2(c, r, prompts, l2s, folds=3, seed=1)
    assert len(fitted_rows) == 9
    left_out = []
    for rows in fitted_rows:
        whole = {prompts[i] for i in rows}
        assert rows == {i for i in range(60) if prompts[i] in whole}  # whole prompts only
        left_out += sorted(set(prompts) - whole)
        assert len(whole) == 4  # 6 prompts dealt to 3 folds: 2 left out a fit
    assert sorted(left_out) == sorted(sorted(set(prompts)) * 3)


def test_truncate_after_stop_token():
    stop, pad = 7, 99
    responses = torch.tensor([[1, 7, 2, 7], [1, 2, 3, 4], [7, 1, 7, 1]])
    assert rm.truncate_after_stop_token(responses, stop, pad)[0].tolist() == [[1, 7, pad, pad], [1, 2, 3, 4],
                                                                           [7, pad, pad, pad]]
    assert rm.truncate_after_stop_token(responses, stop, pad, 1)[0].tolist() == [[1, 7, pad, pad], [1, 2, 3, 4],
                                                                              [7, 1, 7, pad]]


# ---------------------------------------------------------------------------------------------- the model


def test_score_is_read_at_the_last_real_token_whatever_the_padding(tiny):
    model = loaded_reward_model(tiny)
    tokenizer, _ = rm.load_tokenizer(tiny["policy"], ".")
    texts = ["This movie was great.", "I went into this film expecting a lot, and it was", "The"]
    ids = [tokenizer(t)["input_ids"] for t in texts]
    # expected: plain transformers on each text alone (no padding: its last token is the last real one)
    with torch.no_grad():
        expected = torch.stack([model(input_ids=torch.tensor([i])).logits[0, 0] for i in ids])
    width = max(len(i) for i in ids) + 2
    torch.manual_seed(1)
    for side in ("left", "right"):
        input_ids = torch.randint(0, 300, (len(ids), width))  # garbage in the padding: changes scores if read
        attention_mask = torch.zeros(len(ids), width, dtype=torch.long)
        for row, i in enumerate(ids):
            cols = slice(width - len(i), width) if side == "left" else slice(0, len(i))
            input_ids[row, cols], attention_mask[row, cols] = torch.tensor(i), 1
        with torch.no_grad():
            scores = rm.reward_scores(model, input_ids, attention_mask)
            unmasked = rm.reward_scores(model, input_ids, torch.ones_like(attention_mask))
        assert scores.shape == (3,)
        torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-4)
        assert (unmasked - expected).abs().max() > 1e-3, side  # the garbage would change the result
    # the script's own tokenization (left padding, a pad id outside the embedding) gives the same scores
    with torch.no_grad():
        torch.testing.assert_close(rm.score_texts(model, tokenizer, texts, "", 64, CPU), expected, atol=1e-5,
                                   rtol=1e-4)
    # a text longer than max_length loses its first tokens: scored as its last 4 tokens alone
    with torch.no_grad():
        last_four = model(input_ids=torch.tensor([ids[1][-4:]])).logits[0, 0]
        truncated = rm.score_texts(model, tokenizer, texts[1:2], "", 4, CPU)[0]
    torch.testing.assert_close(truncated, last_four, atol=1e-5, rtol=1e-4)


def test_score_is_read_at_an_appended_end_token(tiny):
    """detail 36 (--readout end): every text gets the EOS appended, and the score is the head at that EOS:
    plain transformers on text + EOS alone. A text cut by max_length keeps its end and the EOS."""
    model = loaded_reward_model(tiny)
    tokenizer, _ = rm.load_tokenizer(tiny["policy"], ".")
    assert rm.end_token_of(tokenizer, rm.Args()) == EOS and rm.end_token_of(tokenizer, rm.Args(readout="last")) == ""
    assert rm.end_token_of(tokenizer, rm.Args(readout="end")) == EOS
    texts = ["This movie was great.", "I went into this film expecting a lot, and it was", "The"]
    eos_id = tokenizer.eos_token_id
    ids = [tokenizer(t)["input_ids"] + [eos_id] for t in texts]
    assert all(tokenizer(t + EOS)["input_ids"] == i for t, i in zip(texts, ids))  # the EOS is one token
    with torch.no_grad():
        expected = torch.stack([model(input_ids=torch.tensor([i])).logits[0, 0] for i in ids])
        at_last = torch.stack([model(input_ids=torch.tensor([i[:-1]])).logits[0, 0] for i in ids])
        scores = rm.score_texts(model, tokenizer, texts, EOS, 64, CPU)
        args = rm.Args(forward_batch_size=2, readout="end")
        comparisons = [dict(prompt=t[:3], chosen=t[3:], rejected=t[3:]) for t in texts]
        torch.testing.assert_close(rm.score_in_chunks(model, tokenizer, comparisons, args, CPU),
                                   torch.cat([expected, expected]), atol=1e-5, rtol=1e-4)
        truncated = rm.score_texts(model, tokenizer, texts[1:2], EOS, 4, CPU)[0]
        last_three_and_eos = model(input_ids=torch.tensor([ids[1][-4:]])).logits[0, 0]
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-4)
    assert (expected - at_last).abs().min() > 1e-3  # reading the last token instead would show
    torch.testing.assert_close(truncated, last_three_and_eos, atol=1e-5, rtol=1e-4)


def mean_readout_by_hand(model, tokenizer, prompt: str, response: str, end: str = EOS) -> torch.Tensor | None:
    """The head on the mean final state over the response's tokens and the end token, the text alone: the
    tokens after the prompt's own tokenization (None where prompt + response tokenizes across the border)."""
    prompt_ids, ids = tokenizer(prompt)["input_ids"], tokenizer(prompt + response + end)["input_ids"]
    if ids[: len(prompt_ids)] != prompt_ids:
        return None
    with torch.no_grad():
        hidden = model.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        return model.score(hidden[len(prompt_ids) :].mean(0))[0]


def test_score_is_the_mean_over_the_response_and_the_end_token(tiny):
    """detail 36 (--readout mean, the default): the head on the mean final state over the response's tokens
    and the appended EOS, the prompt's tokens left out; texts of different lengths padded together, an empty
    response (the EOS alone: the end readout), a prompt cut by max_length, and chunks of comparisons."""
    model = loaded_reward_model(tiny)
    tokenizer, _ = rm.load_tokenizer(tiny["policy"], ".")
    assert rm.Args().readout == "mean"
    prompts = ["This movie was", "I went into this film expecting a lot, and it was", "The", "Okay"]
    responses = [" great. I loved it.", " bad.", " best film of the year", ""]
    texts = [p + r for p, r in zip(prompts, responses)]
    expected = torch.stack([mean_readout_by_hand(model, tokenizer, p, r) for p, r in zip(prompts, responses)])
    starts = [len(p) for p in prompts]
    with torch.no_grad():
        scores = rm.score_texts(model, tokenizer, texts, EOS, 64, CPU, starts)
        at_end = rm.score_texts(model, tokenizer, texts, EOS, 64, CPU)
        whole_text = rm.score_texts(model, tokenizer, texts, EOS, 64, CPU, [0] * len(texts))
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(scores[3], at_end[3], atol=1e-5, rtol=1e-4)  # only the EOS is averaged
    assert (scores[:3] - at_end[:3]).abs().min() > 1e-3 and (scores[:3] - whole_text[:3]).abs().min() > 1e-3
    # a prompt cut from the left by max_length: the mean over what is left of the response and the EOS
    ids = tokenizer(texts[0] + EOS)["input_ids"]
    with torch.no_grad():
        hidden = model.base_model(input_ids=torch.tensor([ids[-3:]])).last_hidden_state[0]
        cut = rm.score_texts(model, tokenizer, texts[:1], EOS, 3, CPU, starts[:1])[0]
    torch.testing.assert_close(cut, model.score(hidden.mean(0))[0], atol=1e-5, rtol=1e-4)
    # in chunks of comparisons: the chosen texts, then the rejected ones, each read after its own prompt
    comparisons = [dict(prompt=p, chosen=r, rejected=responses[(i + 1) % 4]) for i, (p, r) in
                   enumerate(zip(prompts, responses))]
    rejected = [mean_readout_by_hand(model, tokenizer, c["prompt"], c["rejected"]) for c in comparisons]
    assert all(r is not None for r in rejected)
    with torch.no_grad():
        chunked = rm.score_in_chunks(model, tokenizer, comparisons, rm.Args(forward_batch_size=3), CPU)
    torch.testing.assert_close(chunked, torch.cat([expected, torch.stack(rejected)]), atol=1e-5, rtol=1e-4)


def test_reward_model_starts_from_the_policy_with_a_scaled_head_and_dropout_off(tiny):
    model = loaded_reward_model(tiny)
    policy = GPT2LMHeadModel.from_pretrained(tiny["policy"])
    assert torch.equal(model.transformer.h[0].attn.c_attn.weight, policy.transformer.h[0].attn.c_attn.weight)
    assert model.score.weight.shape == (1, 32) and model.score.bias is None
    std = model.score.weight.std().item()  # N(0, 1 / (32 + 1)): std 0.174 (transformers' default: 0.02)
    assert 0.1 < std < 0.25
    assert not model.training and not any(m.training for m in model.modules())


def test_generation_is_left_padded_with_positions_from_the_mask(tiny):
    """At a near-zero temperature, sampling is greedy decoding: a left-padded batch must continue each
    prompt as plain transformers does on the prompt alone."""
    tokenizer, _ = rm.load_tokenizer(tiny["policy"], ".")
    policy = rm.load_policy(tiny["policy"], CPU)
    prompts = ["This movie was", "I went into this film expecting a lot and"]
    queries = tokenizer(prompts, padding=True, return_tensors="pt")["input_ids"]
    assert (queries[0] == tokenizer.pad_token_id).any()  # really left-padded, with a pad id out of vocab
    torch.manual_seed(0)
    responses, _ = rm.generate(policy, queries, 6, 1e-4, tokenizer.pad_token_id)
    for row, prompt in enumerate(prompts):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        expected = policy.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)[0, ids.shape[1]:]
        assert responses[row].tolist() == expected.tolist()


def test_evaluate_by_hand_over_several_chunks(tiny):
    """Held-out loss and accuracy of 3 comparisons scored 2 texts at a time (chunks that cut across the chosen
    and rejected halves), against plain transformers on each text alone and the per-pair formulas."""
    model = loaded_reward_model(tiny)
    tokenizer, _ = rm.load_tokenizer(tiny["policy"], ".")
    comparisons = [{"prompt": "This movie was", "chosen": " bad, and too long.", "rejected": " great."},
                   {"prompt": "I went into this film expecting", "chosen": " a lot", "rejected": " nothing"},
                   {"prompt": "The", "chosen": " plot works.", "rejected": " ending fails"}]

    def score(prompt, response):  # detail 36: the mean over the response and the EOS appended to the text
        return mean_readout_by_hand(model, tokenizer, prompt, response).item()

    margins = [score(c["prompt"], c["chosen"]) - score(c["prompt"], c["rejected"]) for c in comparisons]
    assert len({m > 0 for m in margins}) == 2  # some pairs in order, some not: the accuracy is informative
    stats = rm.evaluate_comparisons(model, tokenizer, comparisons, rm.Args(forward_batch_size=2), CPU)
    assert stats["reward_loss"] == pytest.approx(sum(math.log1p(math.exp(-m)) for m in margins) / 3, rel=1e-4)
    assert stats["accuracy"] == pytest.approx(sum(m > 0 for m in margins) / 3)
    assert stats["margins"] == pytest.approx(margins, rel=1e-4, abs=1e-5)


def test_sample_comparisons_pairs_two_responses_to_one_prompt_labeled_by_gold(tiny, monkeypatch):
    """Called directly: each batch samples every prompt twice (response a, then b), each response cut after
    its first stop token from --min-response-length on (worked out here from the sampled tokens); the gold
    function gets prompt + response and the response; with beta ~ 0 the label follows the gold scores; the
    same seed gives the same comparisons."""
    tokenizer, stop_token_id = rm.load_tokenizer(tiny["stops"], ".")
    policy = rm.load_policy(tiny["stops"], CPU)
    prompts = ["This movie was", "I went into this film expecting", "The ending of this film"]
    args = rm.Args(model_name=tiny["stops"], num_comparisons=10, forward_batch_size=4, response_length=10,
                   min_response_length=3, gold_beta=1e-6, seed=3)
    sampled, calls = [], []
    real_generate = rm.generate

    def generate(*a, **kw):
        responses, logprobs = real_generate(*a, **kw)
        sampled.append(responses)
        return responses, logprobs

    monkeypatch.setattr(rm, "generate", generate)

    def gold_fn(texts, responses):  # characters of the response; the arguments recorded
        calls.append((texts, responses))
        return torch.tensor([float(len(r)) for r in responses])

    comparisons = rm.sample_comparisons(policy, prompts, tokenizer, stop_token_id, gold_fn, args, CPU)
    assert len(comparisons) == 10 and len(calls) == len(sampled) == 3
    cut_somewhere = False
    for tokens, (texts, responses) in zip(sampled, calls):
        assert tokens.shape == (8, 10) and len(texts) == len(responses) == 8
        for row, response in zip(tokens.tolist(), responses):
            stops = [k for k, t in enumerate(row) if t == stop_token_id and k >= 3]
            kept = row[: stops[0] + 1] if stops else row
            cut_somewhere |= len(kept) < 10
            assert response == tokenizer.decode(kept, skip_special_tokens=True)
        prompt_parts = [t[: len(t) - len(r)] for t, r in zip(texts, responses)]
        assert [t[len(p) :] for t, p in zip(texts, prompt_parts)] == responses
        assert prompt_parts[:4] == prompt_parts[4:] and all(p in prompts for p in prompt_parts)
    assert cut_somewhere
    in_batches = [r for _, responses in calls for r in responses]
    for c in comparisons:
        assert c["prompt"] in prompts and c["chosen"] != c["rejected"] and c["chosen"] and c["rejected"]
        assert c["chosen"] in in_batches and c["rejected"] in in_batches
        assert (c["gold_chosen"], c["gold_rejected"]) == (len(c["chosen"]), len(c["rejected"]))
        assert c["gold_chosen"] >= c["gold_rejected"]  # beta ~ 0: the longer one is preferred (ties: a coin)
    assert any(c["gold_chosen"] > c["gold_rejected"] for c in comparisons)
    torch.manual_seed(0)
    again = rm.sample_comparisons(policy, prompts, tokenizer, stop_token_id, gold_fn, args, CPU)
    torch.manual_seed(0)
    assert rm.sample_comparisons(policy, prompts, tokenizer, stop_token_id, gold_fn, args, CPU) == again

def test_sample_comparisons_edge_cases_placed_by_construction(tiny, monkeypatch):
    """Called directly with the sampling replaced by fixed responses, four pairs per batch: a kept pair, two
    identical responses (dropped), a pair where the decoded prompt + response does not start with the decoded
    prompt (a tokenizer that cleans up spaces before punctuation: the response is then decoded alone, without
    its padding), and an empty response against a real one (dropped). The prompt is longer than
    --max-query-length and truncated from the left; exactly the batches needed are sampled; the labels come
    from the seed, not torch's global random state."""
    tokenizer, stop_token_id = rm.load_tokenizer(tiny["stops"], ".")
    tokenizer.clean_up_tokenization_spaces = True  # " ." -> "." in decoded text, as WordPiece tokenizers do
    tokenizer.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    ids = lambda text: tokenizer.encode(text, add_special_tokens=False)
    assert ids("This movie was ")[1:] == ids(" movie was ") and len(ids(" movie was ")) == 3
    pad, dot = tokenizer.pad_token_id, ids(".")
    assert dot == [stop_token_id]
    rows = [ids(" good fun") + dot, ids(" I loved it") + dot, dot + ids(" the end"), ids(" the acting") + dot,
            ids(" bad acting") + dot, ids(" I loved it") + dot, ids(" the actors"), [pad] * 4]
    width = max(len(r) for r in rows)
    rows = torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # responses a of the 4 pairs, then b
    queries_seen = []

    def generate(policy, queries, response_length, temperature, pad_token_id, greedy=False, bf16=False):
        queries_seen.append(queries.tolist())
        return rows.clone(), torch.zeros(rows.shape)

    monkeypatch.setattr(rm, "generate", generate)
    args = rm.Args(model_name=tiny["stops"], num_comparisons=4, forward_batch_size=4, response_length=width,
                   min_response_length=0, max_query_length=3, gold_beta=100.0, seed=5)
    gold_fn = lambda texts, responses: torch.tensor([float(len(r)) for r in responses])
    runs = []
    for global_seed in range(4):
        torch.manual_seed(global_seed)
        queries_seen.clear()
        runs.append(rm.sample_comparisons(None, ["This movie was "], tokenizer, stop_token_id, gold_fn, args, CPU))
        assert queries_seen == [[ids(" movie was ")] * 8] * 2  # two batches of two kept pairs: no third
    assert runs[1] == runs[0] and runs[2] == runs[0] and runs[3] == runs[0]
    # the third pair's "." alone: " movie was ." decodes to " movie was.", so the response is decoded alone
    pairs = [{" good fun.", " bad acting."}, {".", " the actors"}] * 2
    assert [{c["chosen"], c["rejected"]} for c in runs[0]] == pairs
    for c in runs[0]:
        assert c["prompt"] == " movie was " and (c["gold_chosen"], c["gold_rejected"]) == (
            len(c["chosen"]), len(c["rejected"]))
    assert len({c["chosen"] for c in runs[0]}) > 2  # coin-flip labels (beta 100): not every pair one way


def test_responses_keep_their_leading_space_with_a_sentencepiece_style_tokenizer(tmp_path, monkeypatch):
    """With a SentencePiece-style tokenizer ("▁" marks a space, dropped at the start of a decoded text) a
    response decoded alone loses its leading space; the comparisons' responses are cut from the decoded
    prompt + response instead, so that prompt + response is the text the gold scorer and the reward model
    read."""
    vocab = {"[UNK]": 0, EOS: 1, "▁This": 2, "▁movie": 3, "▁was": 4, "▁good": 5, "▁fun": 6, ".": 7, "▁bad": 8}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(prepend_scheme="first"),
                                                       pre_tokenizers.Punctuation()])
    tokenizer.decoder = decoders.Metaspace(prepend_scheme="first")
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, unk_token="[UNK]")
    hf_tokenizer.save_pretrained(tmp_path)
    tokenizer, stop_token_id = rm.load_tokenizer(str(tmp_path), ".")
    assert stop_token_id == 7 and tokenizer.decode([5, 6, 7]) == "good fun."  # alone: no leading space
    fixed = torch.tensor([[5, 6, 7], [8, 6, 7]])
    monkeypatch.setattr(rm, "generate", lambda *a, **kw: (fixed, torch.zeros(fixed.shape)))
    texts_seen = []

    def gold_fn(texts, responses):
        texts_seen.extend(texts)
        return torch.tensor([float(r.startswith(" good")) for r in responses])

    args = rm.Args(num_comparisons=1, forward_batch_size=1, response_length=3, min_response_length=0,
                   gold_beta=1e-6)
    [c] = rm.sample_comparisons(None, ["This movie was"], tokenizer, stop_token_id, gold_fn, args, CPU)
    assert c == dict(prompt="This movie was", chosen=" good fun.", rejected=" bad fun.", gold_chosen=1.0,
                     gold_rejected=0.0)
    assert texts_seen == ["This movie was good fun.", "This movie was bad fun."]

# ---------------------------------------------------------------------------------------------- runs


def test_preferences_file_fields_labels_and_seed(tiny, tmp_path):
    args = dict(num_comparisons=24, num_epochs=1, gold_beta=1e-6, batch_size=6)
    first = rm.main(tiny_args(tiny, tmp_path / "a", **args))
    lines = read_lines(first["preferences"])
    assert first["preferences"] == os.path.join(first["run_dir"], "preferences.jsonl")
    assert len(lines) == 24
    for c in lines:
        assert set(c) == {"prompt", "chosen", "rejected", "gold_chosen", "gold_rejected"}
        assert c["prompt"] in rm.PROMPTS and c["chosen"] != c["rejected"] and c["chosen"] and c["rejected"]
        # gold `length`: characters of the response over --response-length; at beta ~ 0, the longer wins
        assert c["gold_chosen"] == pytest.approx(len(c["chosen"]) / 8)
        assert c["gold_rejected"] == pytest.approx(len(c["rejected"]) / 8)
        assert c["gold_chosen"] >= c["gold_rejected"]
    assert any(c["gold_chosen"] > c["gold_rejected"] for c in lines)
    assert read_lines(rm.main(tiny_args(tiny, tmp_path / "b", **args))["preferences"]) == lines
    assert read_lines(rm.main(tiny_args(tiny, tmp_path / "c", seed=2, **args))["preferences"]) != lines
    # the file is a valid --preferences for another run
    again = rm.main(tiny_args(tiny, tmp_path / "d", gold=None, preferences=first["preferences"],
                              batch_size=6))
    assert again["gold_accuracy"] == first["gold_accuracy"]


def test_texts_are_those_ppo_rlhf_gpt2_scores(tiny, tmp_path, monkeypatch):
    """prompt + response in the file is the text ppo_rlhf_gpt2.py's reward function receives for the same
    query and response tokens."""
    seen = []
    real_generate = rm.generate

    def generate(policy, queries, *a, **kw):
        responses, logprobs = real_generate(policy, queries, *a, **kw)
        seen.append((queries, responses))
        return responses, logprobs

    monkeypatch.setattr(rm, "generate", generate)
    result = rm.main(tiny_args(tiny, tmp_path, num_comparisons=8, forward_batch_size=64, batch_size=4,
                               stop_token=".", response_length=8, min_response_length=3))
    (queries, responses), = seen
    tokenizer, pad_token_id, stop_token_id = rlhf.load_tokenizer(tiny["policy"], ".")
    truncated, _, _ = rlhf.truncate_after_stop_token(responses, stop_token_id, pad_token_id, 3)
    ppo_texts = set(tokenizer.batch_decode(torch.cat([queries, truncated], 1), skip_special_tokens=True))
    for c in read_lines(result["preferences"]):
        assert c["prompt"] + c["chosen"] in ppo_texts and c["prompt"] + c["rejected"] in ppo_texts


def test_identical_responses_are_dropped(tiny, tmp_path, monkeypatch):
    """Every other prompt gets the same response twice: those pairs are not written, and sampling goes on
    until --num-comparisons pairs of different responses are in the file."""
    real_generate, calls = rm.generate, 0

    def generate(policy, queries, *a, **kw):
        nonlocal calls
        calls += 1
        responses, logprobs = real_generate(policy, queries, *a, **kw)
        responses, n = responses.clone(), len(responses) // 2
        responses[n::2] = responses[:n:2]  # response b = response a for prompts 0, 2, 4, ...
        return responses, logprobs

    monkeypatch.setattr(rm, "generate", generate)
    result = rm.main(tiny_args(tiny, tmp_path, num_comparisons=12, forward_batch_size=8, batch_size=4))
    lines = read_lines(result["preferences"])
    assert calls == 3 and len(lines) == 12
    assert all(c["chosen"] != c["rejected"] for c in lines)


def test_accumulated_micro_batches_give_the_gradient_of_the_whole_batch(tiny, tmp_path, monkeypatch):
    grads = []
    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(parameters, *a, **kw):
        parameters = list(parameters)
        grads.append([p.grad.clone() for p in parameters])
        return real_clip(parameters, *a, **kw)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    for steps in (1, 4):
        rm.main(tiny_args(tiny, tmp_path / str(steps), num_comparisons=12, batch_size=8, eval_fraction=0.1,
                          gradient_accumulation_steps=steps))
    whole, accumulated = grads
    for a, b in zip(whole, accumulated):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])  # detail 53: --bf16 learns too
def test_learning_a_separable_preference_and_the_logs(tiny, tmp_path, bf16):
    """gold `length` with beta ~ 0: the longer response is chosen (ties aside). A few epochs from a random
    head (--no-probe) must put the held-out accuracy near the gold labeler's; an untrained or broken model
    stays near 1/2."""
    args = tiny_args(tiny, tmp_path, model_name=tiny["stops"], num_comparisons=192, eval_fraction=0.25,
                     batch_size=16, num_epochs=4, learning_rate=3e-3, head_learning_rate=1e-2, gold_beta=1e-6,
                     eval_every=3, response_length=12, probe=False, bf16=bf16)
    result = rm.main(args)
    scalars = read_scalars(result["run_dir"])
    lines = read_lines(result["preferences"])
    train_indices, held_out_indices = rm.split_comparisons([c["prompt"] for c in lines], 0.25, 1)
    held_out = [lines[i] for i in held_out_indices]
    gold = sum(1.0 if c["gold_chosen"] > c["gold_rejected"] else 0.5 if c["gold_chosen"] == c["gold_rejected"]
               else 0.0 for c in held_out) / len(held_out)
    assert result["gold_accuracy"] == pytest.approx(gold)
    distinct = len({c["prompt"] for c in lines})
    assert len({c["prompt"] for c in held_out}) == round(0.25 * distinct) and distinct > 60
    assert scalars["eval/accuracy"][0][1] < 0.75  # at step 0, before any training
    assert gold > 0.9
    assert result["eval_accuracy"] > 0.75 and result["eval_accuracy"] > gold - 0.2, (result, gold)
    steps = 4 * (len(train_indices) // 16)
    assert result["steps"] == steps
    for tag in ("losses/reward_loss", "charts/accuracy", "charts/learning_rate", "charts/head_learning_rate"):
        assert [s for s, _ in scalars[tag]] == list(range(1, steps + 1)), tag
    assert [v for _, v in scalars["charts/learning_rate"]] == pytest.approx(
        [3e-3 * (1 - k / steps) for k in range(steps)])
    assert [v for _, v in scalars["charts/head_learning_rate"]] == pytest.approx(
        [1e-2 * (1 - k / steps) for k in range(steps)])
    eval_steps = [0] + list(range(3, steps, 3)) + [steps]
    for tag in ("eval/accuracy", "eval/reward_loss", "eval/gold_accuracy"):
        assert [s for s, _ in scalars[tag]] == eval_steps, tag
    assert scalars["eval/accuracy"][-1][1] == pytest.approx(result["eval_accuracy"])
    assert all(v == pytest.approx(gold) for _, v in scalars["eval/gold_accuracy"])
    losses = [v for _, v in scalars["losses/reward_loss"]]
    assert sum(losses[-5:]) < sum(losses[:5])


def test_bf16_samples_and_trains_in_bfloat16_with_fp32_weights_and_losses(tiny, tmp_path, monkeypatch):
    """--bf16 (detail 53): the policy samples the --gold comparisons and the reward model's backbone runs in
    bfloat16 (its head reads fp32 states); the losses are finite and, on the same comparisons, differ from an
    fp32 run's; the weights and Adam's state stay fp32."""
    scalars, outputs, steps = bf16_run(rm, tiny_args(tiny, tmp_path / "gold", bf16=True), monkeypatch)
    assert outputs == {"policy": {torch.bfloat16}, "reward_model": {torch.bfloat16}}
    assert steps and all(s == {torch.float32} for s in steps)
    (preferences,) = (tmp_path / "gold" / "runs").glob("*/preferences.jsonl")
    losses = {}
    for bf16 in (True, False):
        args = tiny_args(tiny, tmp_path / str(bf16), bf16=bf16, gold=None, preferences=str(preferences))
        scalars, outputs, steps = bf16_run(rm, args, monkeypatch)
        assert outputs == {"reward_model": {torch.bfloat16 if bf16 else torch.float32}}, bf16
        assert len(steps) > 1 and all(s == {torch.float32} for s in steps)
        losses[bf16] = scalars["losses/reward_loss"]
    assert all(map(math.isfinite, losses[True])) and len(losses[True]) == len(losses[False])
    assert losses[True] != losses[False]


def test_main_passes_each_quantity_where_it_belongs(tiny, tmp_path, monkeypatch):
    """main()'s glue, checked where the wrong wirings differ: a held-out split whose gold accuracy differs
    from the training split's, two epochs of three steps, each step two micro-batches. What main() gives the
    scoring and evaluation functions is recorded and checked against the split and the file, and every
    logged loss and accuracy against numbers computed here from the recorded scores."""
    n, seed = 24, 1
    prompts = [rm.PROMPTS[i // 2] for i in range(n)]  # 12 prompts, two comparisons each
    keys = {p: random.Random(f"{seed} {p}").random() for p in prompts}  # detail 39, written out
    held_out_prompts = sorted(keys, key=keys.get)[:3]  # 0.25 of the 12 prompts
    held_out = [i for i in range(n) if prompts[i] in held_out_prompts]
    training = [i for i in range(n) if i not in held_out]
    assert len(held_out) == 6 and held_out != [i for i in range(n) if i // 2 < 3]
    # gold agrees with the label on every training pair, and on 2 of the 6 held-out ones
    comparisons = [{"prompt": prompts[i], "chosen": f" a good film, scene {i}.",
                    "rejected": f" a bad film, scene {i}.", "gold_chosen": 1.0, "gold_rejected": 0.0}
                   for i in range(n)]
    for i in held_out[2:]:
        comparisons[i]["gold_chosen"], comparisons[i]["gold_rejected"] = 0.0, 1.0
    args = tiny_args(tiny, tmp_path, gold=None, preferences=write_lines(tmp_path / "p.jsonl", comparisons),
                     eval_fraction=0.25, seed=seed, batch_size=6, gradient_accumulation_steps=2, num_epochs=2,
                     eval_every=0, probe=False)  # a random head: micro-batches of differing accuracies

    evaluated, trained = [], []  # each evaluation's comparisons; each micro-batch's texts and scores
    real_evaluate, real_score_texts = rm.evaluate_comparisons, rm.score_texts

    def evaluate(model, tokenizer, comps, *a):
        evaluated.append(sorted(int(c["chosen"].split()[-1].rstrip(".")) for c in comps))
        return real_evaluate(model, tokenizer, comps, *a)

    def score_texts(*a, **kw):
        scores = real_score_texts(*a, **kw)
        if torch.is_grad_enabled():
            assert a[3] == EOS  # detail 36: trained where it is read
            trained.append((a[2], scores.detach().clone()))
        return scores

    monkeypatch.setattr(rm, "evaluate_comparisons", evaluate)
    monkeypatch.setattr(rm, "score_texts", score_texts)
    result = rm.main(args)
    scalars = read_scalars(result["run_dir"])

    assert evaluated == [sorted(held_out)] * 2  # before and after training, the held-out comparisons only
    assert result["gold_accuracy"] == pytest.approx(2 / 6)
    assert [v for _, v in scalars["eval/gold_accuracy"]] == pytest.approx([2 / 6] * 2)
    # 2 epochs x 3 steps x 2 micro-batches of 3 comparisons: the chosen texts, then the rejected ones
    assert len(trained) == 12
    indices = []
    for texts, _ in trained:
        indices.append([int(t.split()[-1][:-1]) for t in texts[:3]])
        chosen = [prompts[i] + f" a good film, scene {i}." for i in indices[-1]]
        assert texts == chosen + [t.replace(" a good film", " a bad film") for t in chosen]
    epochs = [sum(indices[6 * e : 6 * e + 6], []) for e in range(2)]
    for epoch in epochs:  # each training comparison once an epoch, in a shuffled order
        assert sorted(epoch) == sorted(training)
    assert epochs[0] != epochs[1] and sorted(training) not in epochs and training not in epochs
    # the logs: the mean over a step's two micro-batches of their loss and accuracy (ties count 1/2)
    losses, accuracies, differing = [], [], False
    for k in range(0, 12, 2):
        margins = [(scores[:3] - scores[3:]).tolist() for _, scores in trained[k : k + 2]]
        micro_accuracies = [sum(1.0 if m > 0 else 0.5 if m == 0 else 0.0 for m in ms) / 3 for ms in margins]
        losses.append(sum(sum(math.log1p(math.exp(-m)) for m in ms) / 3 for ms in margins) / 2)
        accuracies.append(sum(micro_accuracies) / 2)
        if micro_accuracies[0] != micro_accuracies[1]:
            differing = True
    assert differing  # some step's micro-batches differ, so a wrong mean would show
    assert [v for _, v in scalars["losses/reward_loss"]] == pytest.approx(losses, rel=1e-5)
    assert [v for _, v in scalars["charts/accuracy"]] == pytest.approx(accuracies)
    # the final held-out margins, in the file's order, with the final accuracy and loss
    lines = read_lines(result["held_out_scores"])
    assert result["held_out_scores"] == os.path.join(result["run_dir"], "held_out_scores.jsonl")
    assert [line["index"] for line in lines] == held_out
    margins = [line["margin"] for line in lines]
    assert result["eval_accuracy"] == pytest.approx(sum(1.0 if m > 0 else 0.5 if m == 0 else 0.0
                                                        for m in margins) / 6)
    assert result["eval_reward_loss"] == pytest.approx(sum(math.log1p(math.exp(-m)) for m in margins) / 6,
                                                       rel=1e-5)
    assert len(set(margins)) == 6 and "eval_margins" not in result


def test_one_step_trains_every_parameter_the_head_at_its_own_learning_rate(tiny, tmp_path, monkeypatch):
    """After the first backward pass, every parameter (the backbone's and the head's) has a nonzero
    gradient, and the optimizer changes them all; Adam's first step moves a weight by its learning rate times
    g / (|g| + eps), so the largest move is about the learning rate: --head-learning-rate for the head,
    --learning-rate for the backbone (detail 40). The parameters before the step are recorded at the gradient
    clipping, after the probe (detail 45)."""
    grads, models = [], []
    real_clip = torch.nn.utils.clip_grad_norm_
    real_load = rm.load_reward_model

    def clip(parameters, *a, **kw):
        parameters = list(parameters)
        grads.append([p.grad for p in parameters])
        models.append({n: p.detach().clone() for n, p in models[0].named_parameters()})
        return real_clip(parameters, *a, **kw)

    def load(*a):
        models.append(real_load(*a))
        return models[0]

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    monkeypatch.setattr(rm, "load_reward_model", load)
    rm.main(tiny_args(tiny, tmp_path, num_comparisons=12, batch_size=8, eval_fraction=0.1, learning_rate=1e-4,
                      head_learning_rate=3e-2, probe_l2=(1e-2,)))  # a head whose gradients dwarf Adam's eps
    model, initial = models
    assert len(grads) == 1
    named = dict(model.named_parameters())
    assert len(grads[0]) == len(named) and "score.weight" in named
    for (name, p), g in zip(named.items(), grads[0]):
        assert g is not None and g.abs().sum() > 0, name
        assert not torch.equal(p, initial[name]), name
    moves = {name: (p - initial[name]).abs().max().item() for name, p in named.items()}
    assert moves.pop("score.weight") == pytest.approx(3e-2, rel=1e-2)
    assert max(moves.values()) == pytest.approx(1e-4, rel=1e-2)


def readout_state_by_hand(backbone, tokenizer, prompt: str, response: str, readout: str) -> np.ndarray:
    """The final state the head reads of prompt + response + EOS, the text alone: at the EOS (--readout end)
    or the mean over the tokens after the prompt's own tokenization and the EOS (mean)."""
    prompt_ids, ids = tokenizer(prompt)["input_ids"], tokenizer(prompt + response + EOS)["input_ids"]
    assert ids[: len(prompt_ids)] == prompt_ids  # the response's tokens are those after the prompt's
    with torch.no_grad():
        hidden = backbone(input_ids=torch.tensor([ids])).last_hidden_state[0].double().numpy()
    return hidden[-1] if readout == "end" else hidden[len(prompt_ids) :].mean(0)


@pytest.mark.parametrize("readout", ["mean", "end"])
def test_the_probe_fits_the_head_on_the_frozen_features_before_training(tiny, tmp_path, monkeypatch, readout):
    """detail 45, main()'s wiring. With --probe (the default) the head that the step-0 evaluation reads is
    Newton's fit (numpy) on features computed here from the frozen policy, each text alone, of the training
    comparisons only; eval/accuracy and eval/reward_loss at step 0 are that head's on the held-out pairs; then
    the head trains at --learning-rate. With --no-probe the step-0 head is the random one from loading, its
    held-out loss logged, and it trains at 1e-3. An explicit --head-learning-rate wins in both."""
    n, seed, l2 = 24, 1, 0.03
    prompts = [rm.PROMPTS[i // 2] for i in range(n)]  # 12 prompts, two comparisons each
    keys = {p: random.Random(f"{seed} {p}").random() for p in prompts}  # detail 39, written out
    held_out_prompts = sorted(keys, key=keys.get)[:3]
    held_out = [i for i in range(n) if prompts[i] in held_out_prompts]
    training = [i for i in range(n) if i not in held_out]
    rng = random.Random(0)
    good = [" a fine film", " great acting", " I loved it", " the best"]
    bad = [" a dull film", " awful acting", " I hated it", " the worst"]
    comparisons = [{"prompt": prompts[i], "chosen": rng.choice(good) + rng.choice(good + bad) + ".",
                    "rejected": rng.choice(bad) + rng.choice(good + bad) + "."} for i in range(n)]
    preferences = write_lines(tmp_path / "p.jsonl", comparisons)

    backbone = GPT2LMHeadModel.from_pretrained(tiny["policy"]).transformer.eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny["policy"])
    features = {key: np.stack([readout_state_by_hand(backbone, tokenizer, c["prompt"], c[key], readout)
                               for c in comparisons]) for key in ("chosen", "rejected")}
    chosen, rejected = features["chosen"][training], features["rejected"][training]
    std = np.concatenate([chosen, rejected]).std(0, ddof=1)
    expected_head = newton_bradley_terry(chosen, rejected, l2, std)
    held_out_differences = features["chosen"][held_out] - features["rejected"][held_out]

    def held_out_stats(head):  # (accuracy, reward_loss) of a head on the held-out pairs, by hand
        margins = held_out_differences @ head
        return np.mean((margins > 0) + 0.5 * (margins == 0)), np.mean(np.log1p(np.exp(-margins)))

    heads, real_load, real_evaluate = [], rm.load_reward_model, rm.evaluate_comparisons

    def load(*a):  # the head as loaded (random), then the head at each evaluation
        model = real_load(*a)
        heads.append(model.score.weight.detach().double().clone()[0].numpy())
        return model

    def evaluate(model, *a):
        heads.append(model.score.weight.detach().double().clone()[0].numpy())
        return real_evaluate(model, *a)

    monkeypatch.setattr(rm, "load_reward_model", load)
    monkeypatch.setattr(rm, "evaluate_comparisons", evaluate)
    runs = {}
    for probe, head_lr in ((True, None), (False, None), (True, 3e-2), (False, 3e-2)):
        heads.clear()
        result = rm.main(tiny_args(tiny, tmp_path / f"{probe}{head_lr}", gold=None, preferences=preferences,
                                   eval_fraction=0.25, seed=seed, batch_size=6, eval_every=0, readout=readout,
                                   learning_rate=1e-4, head_learning_rate=head_lr, probe=probe, probe_l2=(l2,)))
        scalars = read_scalars(result["run_dir"])
        assert result["steps"] == 3 and len(heads) == 3  # loaded, step 0, the end
        head_learning_rate = head_lr or (1e-4 if probe else 1e-3)  # the backbone's after the probe
        assert scalars["charts/head_learning_rate"][0] == (1, pytest.approx(head_learning_rate))
        runs[probe, head_lr] = heads[:2], scalars["eval/accuracy"][0], scalars["eval/reward_loss"][0]

    (random_head, probed_head), accuracy, loss = runs[True, None]
    np.testing.assert_allclose(probed_head * std, expected_head * std, rtol=1e-3, atol=1e-4)
    assert accuracy == (0, pytest.approx(held_out_stats(expected_head)[0]))
    assert loss == (0, pytest.approx(held_out_stats(expected_head)[1], rel=1e-3))
    assert abs(held_out_stats(random_head)[1] - loss[1]) > 0.05  # the random head's loss differs
    (loaded_head, step_0_head), accuracy, loss = runs[False, None]
    np.testing.assert_array_equal(step_0_head, loaded_head)
    np.testing.assert_array_equal(loaded_head, random_head)  # the same seed, the same random head
    assert accuracy == (0, pytest.approx(held_out_stats(loaded_head)[0]))
    assert loss == (0, pytest.approx(held_out_stats(loaded_head)[1], rel=1e-3))
    explicit = runs[True, 3e-2]  # --head-learning-rate changes the rate, not the probe
    assert explicit[0][1] == pytest.approx(probed_head) and explicit[1:] == runs[True, None][1:]

    # several --probe-l2: the one that orders most training pairs right, each of the 9 training prompts
    # scored by Newton's fit on the other 8 (--probe-folds 9), then fitted on all of them
    l2s, train_prompts = (30.0, l2, 1e-4), [prompts[i] for i in training]
    cross_validated = {}
    for candidate in l2s:
        right = 0.0
        for p in set(train_prompts):
            fit = np.array([q != p for q in train_prompts])
            w = newton_bradley_terry(chosen[fit], rejected[fit], candidate,
                                     np.concatenate([chosen[fit], rejected[fit]]).std(0, ddof=1))
            margins = (chosen[~fit] - rejected[~fit]) @ w
            right += np.sum(margins > 0) + 0.5 * np.sum(margins == 0)
        cross_validated[candidate] = right / len(training)
    best = max(l2s, key=cross_validated.get)  # the first of equals
    assert best != l2s[0]  # (here: 0.03 for mean, tied with 1e-4; 1e-4 for end)
    heads.clear()
    result = rm.main(tiny_args(tiny, tmp_path / "cv", gold=None, preferences=preferences, eval_fraction=0.25,
                               seed=seed, batch_size=6, eval_every=0, readout=readout, learning_rate=1e-4,
                               probe_l2=l2s, probe_folds=9))
    assert read_scalars(result["run_dir"])["probe/l2"] == [(0, pytest.approx(best))]
    expected_head = newton_bradley_terry(chosen, rejected, best, std)
    np.testing.assert_allclose(heads[1] * std, expected_head * std, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("policy, readout", [("policy", "mean"), ("smol", "mean"), ("policy", "end"),
                                             ("smol", "end"), ("smol", "last")])
def test_saved_folder_normalized_and_read_by_the_loaders_as_here(tiny, tmp_path, policy, readout):
    """The saved folder, read by ppo_rlhf_gpt2.py's and grpo_gpt2.py's load_reward_fn, gives the scores this
    script gives the same texts, and those are the head on the mean over the response and the appended EOS
    (--readout end: at the EOS; last: at the text's last token) computed by hand, normalized to mean 0 and std
    1 on the file's responses (detail 31). The
    saved tokenizers pad with the EOS (`smol`'s own pad token is its EOS, as SmolLM2's; GPT-2 has none), so
    transformers' own readout skips an appended EOS: right only with --readout last."""
    result = rm.main(tiny_args(tiny, tmp_path, model_name=tiny[policy], save_model=True, num_comparisons=24,
                               num_epochs=2, readout=readout))
    folder = result["model_path"]
    assert folder == os.path.join(result["run_dir"], "model")
    lines = read_lines(result["preferences"])
    texts = [c["prompt"] + c[k] for c in lines for k in ("chosen", "rejected")]
    responses = [c[k] for c in lines for k in ("chosen", "rejected")]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert model.config.num_labels == 1 and model.config.reward_readout == readout
    assert model.config.reward_end_token == (None if readout == "last" else EOS)
    assert isinstance(model.config.reward_bias, float) and model.config.reward_bias == result["reward_bias"]
    end = [] if readout == "last" else [tokenizer.eos_token_id]
    with torch.no_grad():  # by hand: each text alone, the head on the final hidden state of its last token
        by_hand = torch.stack([model.score(model.base_model(input_ids=torch.tensor(
            [tokenizer(t)["input_ids"] + end])).last_hidden_state[0, -1])[0] for t in texts])
    checked = list(range(len(texts)))
    if readout == "mean":  # by hand: the mean over the tokens after the prompt's own (where they align)
        means = [mean_readout_by_hand(model, tokenizer, c["prompt"], c[k]) for c in lines
                 for k in ("chosen", "rejected")]
        checked = [i for i, m in enumerate(means) if m is not None]
        assert len(checked) >= 0.75 * len(texts)
        by_hand = torch.stack([m if m is not None else torch.tensor(float("nan")) for m in means])
    by_hand += model.config.reward_bias
    own_tokenizer, _ = rm.load_tokenizer(folder, ".")
    own_args = rm.Args(readout=readout, max_length=128)
    with torch.no_grad():
        own = rm.score_in_chunks(model, own_tokenizer, lines, own_args, CPU) + model.config.reward_bias
    own = own.view(2, -1).T.reshape(-1)  # chosen, rejected of each comparison in turn, as `texts`
    assert statistics.mean(own.tolist()) == pytest.approx(0, abs=1e-4)  # normalized on the file's responses
    assert statistics.stdev(own.tolist()) == pytest.approx(1, abs=1e-4)
    torch.testing.assert_close(own[checked], by_hand[checked], atol=1e-4, rtol=1e-4)
    for loader in (rlhf, grpo_gpt2):
        reward_fn = loader.load_reward_fn(loader.Args(reward_model=folder), CPU)
        torch.testing.assert_close(reward_fn(texts, responses), own, atol=1e-4, rtol=1e-4)
    if readout == "mean":  # the loaders find the response from its text: the whole text is another score
        assert (reward_fn(texts, texts) - own).abs().max() > 1e-3
    batch = tokenizer(texts if readout == "last" else [t + EOS for t in texts], padding=True,
                      return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # really padded
    with torch.no_grad():
        transformers_readout = model(**batch).logits[:, 0] + model.config.reward_bias
    if readout != "last":
        assert (transformers_readout - own).abs().max() > 1e-3
    else:
        torch.testing.assert_close(transformers_readout, own, atol=1e-4, rtol=1e-4)


def test_round_trip_into_ppo_rlhf_gpt2(tiny, tmp_path):
    result = rm.main(tiny_args(tiny, tmp_path / "rm", save_model=True, num_comparisons=16))
    stats = rlhf.main(rlhf.Args(model_name=tiny["policy"], reward_model=result["model_path"],
                                runs_dir=str(tmp_path / "ppo"), cuda=False, batch_size=8, num_minibatches=2,
                                total_episodes=8, response_length=8, min_response_length=0, norm_batches=1,
                                eval_episodes=0))
    assert math.isfinite(stats["objective/scores"]) and math.isfinite(stats["losses/policy_loss"])


# ---------------------------------------------------------------------------------------------- bad input


BAD_FILES = {
    "empty_line": ('{"prompt": "a", "chosen": " b", "rejected": " c"}\n\n', "line 2 is empty"),
    "not_json": ('{"prompt": "a", "chosen": " b", "rejected": " c"}\n{"prompt": "a",\n',
                 "line 2 is not JSON"),
    "missing": ('{"prompt": "a", "chosen": " b"}\n', "line 1 lacks the text field\\(s\\) rejected"),
    "not_text": ('{"prompt": "a", "chosen": 3, "rejected": " c"}\n',
                 "line 1 lacks the text field\\(s\\) chosen"),
    "same": ('{"prompt": "a", "chosen": " b", "rejected": " c"}\n{"prompt": "a", "chosen": " b", '
             '"rejected": " b"}\n', "line 2: chosen and rejected are the same"),
    "empty_response": ('{"prompt": "a", "chosen": " ", "rejected": " c"}\n', "line 1: an empty response"),
    "no_lines": ("", "contains no comparisons"),
    "too_few": ("".join(f'{{"prompt": "{p}", "chosen": " b", "rejected": " c"}}\n' for p in "abcdefgh"),
                "--batch-size 8 is larger than the 6 training comparisons"),  # 2 of 8 prompts held out
    "two_prompts": ("".join(f'{{"prompt": "{p}", "chosen": " b", "rejected": " c"}}\n' * 20 for p in "ab"),
                    "--probe-l2: 5 values cannot be cross-validated on 1 training prompt"),  # 1 of 2 held out
    "latin1": ('{"prompt": "a", "chosen": " b", "rejected": " c"}\n{"prompt": "caf\xe9", "chosen": " b", '
               '"rejected": " c"}\n', "line 2 is not UTF-8 text"),
    "one_prompt": ('{"prompt": "a", "chosen": " b", "rejected": " c"}\n' * 9,
                   "--eval-fraction 0.25 holds out all 1 distinct prompts"),
}


@pytest.mark.parametrize("overrides, message", [
    (dict(gold=None), "--preferences: pass a JSONL file"),
    (dict(gold=None, preferences="/no/such/file.jsonl"), "--preferences /no/such/file.jsonl: no such file"),
    (dict(preferences="x.jsonl"), "--preferences x.jsonl: --gold writes"),
    (dict(gold="sentiment"), "--gold sentiment: not `vader`, `length`"),
    (dict(gold_beta=0.0), "--gold-beta"),
    (dict(learning_rate=0.0), "--learning-rate"),
    (dict(learning_rate=-1e-5), "--learning-rate"),
    (dict(learning_rate=float("nan")), "--learning-rate"),
    (dict(eval_fraction=0.0), "--eval-fraction"),
    (dict(eval_fraction=1.0), "--eval-fraction"),
    (dict(batch_size=8, gradient_accumulation_steps=3), "--batch-size 8 is not divisible by"),
    (dict(batch_size=0), "--batch-size"),
    # 18 of the 72 prompts held out: about 32 x 54 / 72 = 24 of 32 comparisons left to train on
    (dict(batch_size=32, num_comparisons=32), "--batch-size 32 is larger than the about 24 training"),
    (dict(eval_fraction=0.995), "--eval-fraction 0.995 holds out all 72 distinct prompts"),
    (dict(readout="first"), "--readout must be `mean`, `end` or `last`"),
    (dict(head_learning_rate=0.0), "--head-learning-rate"),
    (dict(head_learning_rate=float("inf")), "--head-learning-rate"),
    (dict(probe_l2=(0.1, -1.0)), "--probe-l2 must be one or more numbers, each at least 0 \\(got \\(0.1, -1"),
    (dict(probe_l2=(float("nan"),)), "--probe-l2 must be one or more numbers, each at least 0"),
    (dict(probe_l2=()), "--probe-l2 must be one or more numbers"),
    (dict(probe_folds=1), "--probe-folds must be at least 2"),
    (dict(num_comparisons=0), "--num-comparisons"),
    (dict(num_epochs=0), "--num-epochs"),
    (dict(temperature=0.0), "--temperature"),
    (dict(min_response_length=8), "--min-response-length"),
    (dict(model_name="./no/such/model"), "--model-name ./no/such/model: no such directory"),
    (dict(prompts_file="/no/such/prompts.txt"), "--prompts-file /no/such/prompts.txt: no such file"),
    (dict(gold=None, preferences=__file__, prompts_file=__file__), "--prompts-file: only --gold"),
    *[(dict(gold=None, preferences=name), message) for name, (_, message) in BAD_FILES.items()],
])
def test_bad_input_fails_before_any_model_loads(tiny, tmp_path, fails_before_loading, overrides, message):
    fails_before_loading(rm, lambda **kw: rm.main(tiny_args(tiny, tmp_path, **kw)), BAD_FILES, overrides, message)


def test_fewer_training_prompts_than_folds_make_one_fold_each_and_say_so(tiny, tmp_path, capsys):
    """Four prompts, one held out: the default 5 folds become 3 of one prompt each (leave one prompt out), said
    in one line, and the L2 chosen is the one leave-one-prompt-out fits by hand rank best."""
    few = tmp_path / "few.jsonl"
    few.write_text("".join(f'{{"prompt": "{p}", "chosen": " b{i}", "rejected": " c{i}"}}\n'
                           for p in "abcd" for i in range(3)))
    args = tiny_args(tiny, tmp_path, gold=None, preferences=str(few))
    rm.check_args(args)
    rm.read_preferences(args.preferences, args)  # no error: the split is checked here
    torch.manual_seed(0)
    chosen, rejected = torch.randn(9, 4), torch.randn(9, 4)
    prompts = [p for p in "abc" for _ in range(3)]
    l2, accuracies = rm.cross_validated_l2(chosen, rejected, prompts, (1e-3, 10.0), 5, seed=1)
    assert capsys.readouterr().out.strip() == "--probe-folds 5: 3 training prompts, so 3 folds of one prompt each"
    for value in (1e-3, 10.0):  # leave one prompt out, by hand
        right = 0
        for p in "abc":
            held = torch.tensor([q == p for q in prompts])
            w = rm.fit_probe(chosen[~held], rejected[~held], value)
            right += int(((chosen[held] - rejected[held]).double() @ w > 0).sum())
        assert accuracies[value] == pytest.approx(right / 9)
    assert l2 == max((1e-3, 10.0), key=accuracies.__getitem__)


def test_unloadable_models_and_bad_labels_fail_with_the_flag(tiny, tmp_path):
    with pytest.raises(SystemExit, match="--model-name 'no-such-org/no-such-model'.*local directory"):
        rm.main(tiny_args(tiny, tmp_path, model_name="no-such-org/no-such-model"))
    with pytest.raises(SystemExit, match="--stop-token"):
        rm.main(tiny_args(tiny, tmp_path, stop_token="a multi token stop"))
    folder = tiny["root"] / "classifier"
    GPT2ForSequenceClassification(GPT2Config(vocab_size=400, n_positions=64, n_embd=16, n_layer=1, n_head=2,
                                             num_labels=2)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny["policy"]).save_pretrained(folder)
    with pytest.raises(SystemExit, match="--gold-label 5"):
        rm.main(tiny_args(tiny, tmp_path, gold=str(folder), gold_label=5))
    # --readout end needs an EOS to append; the error comes before any sampling, and names the way out
    no_eos = tiny["root"] / "no_eos"
    tokenizer = AutoTokenizer.from_pretrained(tiny["policy"])
    tokenizer.eos_token = None
    tokenizer.save_pretrained(no_eos)
    GPT2LMHeadModel.from_pretrained(tiny["policy"]).save_pretrained(no_eos)
    for readout in ("mean", "end"):
        with pytest.raises(SystemExit, match=f"^error: --readout {readout}: .* no EOS token .*pass --readout last$"):
            rm.main(tiny_args(tiny, tmp_path / "no_eos", model_name=str(no_eos), readout=readout))
    assert not (tmp_path / "no_eos" / "runs").exists()


def test_a_classifier_folder_as_gold(tiny, tmp_path):
    """--gold FOLDER: a saved reward model of this script labels the comparisons with its normalized score,
    read where it was trained to read: the head on the mean over the response and the appended EOS (by hand,
    each text alone), or at that EOS (--readout end)."""
    for readout in ("mean", "end"):
        first = rm.main(tiny_args(tiny, tmp_path / readout / "first", save_model=True, num_comparisons=16,
                                  readout=readout))
        second = rm.main(tiny_args(tiny, tmp_path / readout / "second", gold=first["model_path"],
                                   num_comparisons=16))
        model = AutoModelForSequenceClassification.from_pretrained(first["model_path"])
        tokenizer = AutoTokenizer.from_pretrained(first["model_path"])
        checked = 0
        for c in read_lines(second["preferences"]):
            for key in ("chosen", "rejected"):
                ids = tokenizer(c["prompt"] + c[key])["input_ids"] + [tokenizer.eos_token_id]
                with torch.no_grad():
                    score = model.score(model.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1])
                if readout == "mean":
                    score = mean_readout_by_hand(model, tokenizer, c["prompt"], c[key])
                if score is not None:
                    assert c[f"gold_{key}"] == pytest.approx(score.item() + model.config.reward_bias, abs=1e-4)
                    checked += 1
        assert checked >= 24


# ---------------------------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_keeps_the_file_the_logs_and_saves(tiny, tmp_path, monkeypatch):
    real_loss, calls = rm.preference_loss, 0

    def preference_loss(*a):
        nonlocal calls
        calls += 1
        if calls == 3:  # 1: the step-0 evaluation, 2: step 1, 3: step 2 (no probe: its loss would count)
            raise KeyboardInterrupt
        return real_loss(*a)

    monkeypatch.setattr(rm, "preference_loss", preference_loss)
    try:
        result = rm.main(tiny_args(tiny, tmp_path, save_model=True, probe=False))
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C during training escaped main() instead of ending the run cleanly")
    assert calls == 3 and result["steps"] == 2
    assert len(read_lines(result["preferences"])) == 32
    scalars = read_scalars(result["run_dir"])
    assert [s for s, _ in scalars["losses/reward_loss"]] == [1]  # the closed file holds step 1
    assert [s for s, _ in scalars["eval/accuracy"]] == [0]
    assert "eval_accuracy" not in result
    AutoModelForSequenceClassification.from_pretrained(result["model_path"])


def test_ctrl_c_during_the_probe_keeps_the_logs(tiny, tmp_path, monkeypatch):
    def fit_probe(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(rm, "fit_probe", fit_probe)
    try:
        result = rm.main(tiny_args(tiny, tmp_path))
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C during the probe escaped main() instead of ending the run cleanly")
    assert result["steps"] == 0 and "eval_accuracy" not in result
    assert len(read_lines(result["preferences"])) == 32


def test_ctrl_c_while_saving_closes_the_logs(tiny, tmp_path, interrupted_save):
    result, _ = interrupted_save(GPT2ForSequenceClassification, rm.main, tiny_args(tiny, tmp_path, save_model=True))
    assert len(read_scalars(result["run_dir"])["losses/reward_loss"]) == result["steps"] == 3


# ---------------------------------------------------------------------------------------------- reading


def test_prompts_are_ppo_rlhf_gpt2_s():
    assert rm.PROMPTS == rlhf.PROMPTS
    path = Path(rm.__file__)
    assert "import ppo_rlhf_gpt2" not in path.read_text() and "from ppo_rlhf_gpt2" not in path.read_text()


def test_house_style():
    source = Path(rm.__file__).read_text()
    assert max(len(line) for line in source.splitlines()) <= 110
    assert len(ast.get_docstring(ast.parse(source), clean=False).splitlines()) <= 60
    plumbing = [i for i, line in enumerate(source.splitlines()) if line.startswith("# Plumbing")]
    assert len(plumbing) == 1 and source.splitlines().index("def main(args: Args) -> dict:") < plumbing[0]
    missing = [f.name for f in dataclasses.fields(rm.Args) if not get_field_docstring(rm.Args, f.name, ())]
    assert not missing


# ------------------------------------------------------------- a passed flag, a schedule, old saved folders


def test_without_annealing_each_group_keeps_its_own_learning_rate(tiny, tmp_path):
    """--no-anneal-lr: charts/learning_rate is --learning-rate and charts/head_learning_rate
    --head-learning-rate at every step (the head's group must not take the backbone's rate)."""
    result = rm.main(tiny_args(tiny, tmp_path, anneal_lr=False, learning_rate=1e-4, head_learning_rate=3e-2,
                               num_epochs=2, eval_every=0))
    scalars = read_scalars(result["run_dir"])
    steps = result["steps"]
    assert steps >= 4
    assert scalars["charts/learning_rate"] == [(s, pytest.approx(1e-4)) for s in range(1, steps + 1)]
    assert scalars["charts/head_learning_rate"] == [(s, pytest.approx(3e-2)) for s in range(1, steps + 1)]


def test_the_labeler_s_noise_is_gold_beta(tiny, monkeypatch):
    """--gold-beta, not another float flag such as --temperature, is the beta the labels are drawn with."""
    betas, real = [], rm.bradley_terry_labels

    def bradley_terry_labels(gold_a, gold_b, beta, generator):
        betas.append(beta)
        return real(gold_a, gold_b, beta, generator)

    monkeypatch.setattr(rm, "bradley_terry_labels", bradley_terry_labels)
    tokenizer, stop_token_id = rm.load_tokenizer(tiny["policy"], ".")
    args = rm.Args(model_name=tiny["policy"], num_comparisons=4, forward_batch_size=4, response_length=4,
                   min_response_length=0, gold_beta=0.37, temperature=0.9, max_length=60)
    rm.sample_comparisons(rm.load_policy(tiny["policy"], CPU), ["This movie was"], tokenizer, stop_token_id,
                          lambda texts, responses: torch.tensor([float(len(r)) for r in responses]), args, CPU)
    assert betas and set(betas) == {0.37}


@pytest.mark.parametrize("saved_before", ["reward_end_token", "reward_readout"])
def test_a_gold_folder_saved_before_a_config_key_existed_is_read_as_it_was_written(tiny, tmp_path,
                                                                                  saved_before):
    """--gold FOLDER written before config.reward_end_token existed (neither key): labeled with
    transformers' own readout, the score at the text's last token with nothing appended; written before
    config.reward_readout existed (its end token only): the score at that end token, not the mean. By
    hand, each text alone."""
    tokenizer = AutoTokenizer.from_pretrained(tiny["policy"])
    tokenizer.pad_token, tokenizer.padding_side = EOS, "right"
    torch.manual_seed(7)
    model = GPT2ForSequenceClassification(GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32,
                                                     n_layer=1, n_head=2, num_labels=1,
                                                     pad_token_id=tokenizer.pad_token_id)).eval()
    model.config.reward_bias = 0.5
    if saved_before == "reward_readout":
        model.config.reward_end_token = EOS
    model.save_pretrained(tmp_path / "gold")
    tokenizer.save_pretrained(tmp_path / "gold")
    result = rm.main(tiny_args(tiny, tmp_path, gold=str(tmp_path / "gold"), num_comparisons=16))
    checked = 0
    for c in read_lines(result["preferences"]):
        for key in ("chosen", "rejected"):
            ids = tokenizer(c["prompt"] + c[key])["input_ids"]
            with torch.no_grad():
                at_last = model.score(model.transformer(input_ids=torch.tensor([ids])).last_hidden_state[0, -1])
                hidden = model.transformer(input_ids=torch.tensor([ids + [tokenizer.eos_token_id]]))
                at_end = model.score(hidden.last_hidden_state[0, -1])
            written, other = (at_last, at_end) if saved_before == "reward_end_token" else (at_end, at_last)
            assert c[f"gold_{key}"] == pytest.approx(written.item() + 0.5, abs=1e-4)
            assert abs(c[f"gold_{key}"] - other.item() - 0.5) > 1e-4
            mean = mean_readout_by_hand(model, tokenizer, c["prompt"], c[key])
            if mean is not None:
                assert abs(c[f"gold_{key}"] - mean.item() - 0.5) > 1e-4
                checked += 1
    assert checked >= 16


def test_preferences_only_writes_the_file_of_a_full_run_and_stops(tiny, tmp_path, monkeypatch):
    """--preferences-only: the same comparisons a full run samples first, then no reward model (none loaded)."""
    full = rm.main(tiny_args(tiny, tmp_path / "full", num_epochs=1))
    monkeypatch.setattr(rm, "load_reward_model", lambda *a: pytest.fail("a reward model was loaded"))
    only = rm.main(tiny_args(tiny, tmp_path / "only", preferences_only=True))
    assert read_lines(only["preferences"]) == read_lines(os.path.join(full["run_dir"], "preferences.jsonl"))
    assert len(read_lines(only["preferences"])) == 32 and "model_path" not in only
    with pytest.raises(SystemExit, match="^error: --preferences-only: only --gold samples"):
        rm.main(tiny_args(tiny, tmp_path, gold=None, preferences=only["preferences"], preferences_only=True))
