"""Tests of grpo_gpt2.py, offline, on the tiny GPT-2 of conftest.py: the group advantages, the three loss
aggregations, the k3 term and the asymmetric clip against numbers worked out by hand; one iteration as the
plain policy gradient; main()'s glue in runs where a wrong wiring differs (several groups, responses of
different lengths, two passes over two minibatches); bad arguments; Ctrl-C; saving and re-evaluating."""

import copy
import json
import math
import os
import re
import statistics
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2LMHeadModel

from conftest import (bf16_run, check_bf16_needs_a_gpu_that_has_it, check_evaluation_samples_as_saved, read_scalars,
                      run_one_and_two_processes, torchrun_folder)
import grpo_gpt2 as grpo
import ppo_rlhf_gpt2 as rlhf


def tiny_args(tiny, tmp_path, **overrides) -> grpo.Args:
    defaults = dict(model_name=tiny["policy"], reward_model=tiny["reward"], runs_dir=str(tmp_path / "runs"),
                    cuda=False, batch_size=8, num_generations=4, gradient_accumulation_steps=1,
                    total_episodes=16, response_length=8, min_response_length=0, eval_episodes=0)
    defaults.update(overrides)
    return grpo.Args(**defaults)


def count_e_reward(args, device):
    """A fixed programmatic reward: the number of letters 'e' in the response."""
    return lambda texts, responses: torch.tensor([float(r.count("e")) for r in responses], device=device)


def mod3_reward(args, device):
    """A reward of -1, 0 or +1 from the response's number of characters (mod 3): varied within groups."""
    return lambda texts, responses: torch.tensor([float(len(r) % 3 - 1) for r in responses], device=device)


@pytest.fixture
def stops_at_lengths_1_to_8(tiny, monkeypatch):
    """Put the stop token "." at position i % 8 of response i, so that a batch has responses of 1 to 8 real
    tokens (a random tiny policy rarely samples "."), with the policy's log-probs of the tokens as they are
    now (as if the policy had sampled them)."""
    real_generate, (_, _, dot) = grpo.generate, grpo.load_tokenizer(tiny["policy"], ".")

    def generate(policy, queries, response_length, temperature, pad_token_id, greedy=False, bf16=False):
        responses, _ = real_generate(policy, queries, response_length, temperature, pad_token_id, greedy)
        responses = responses.clone()
        responses[torch.arange(len(responses)), torch.arange(len(responses)) % responses.shape[1]] = dot
        with torch.inference_mode():
            logits = grpo.response_logits(policy, torch.cat([queries, responses], 1), queries.shape[1],
                                          temperature, pad_token_id)
            return responses, grpo.gather_logprobs(logits, responses)

    monkeypatch.setattr(grpo, "generate", generate)


# ---------------------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("overrides, message", [
    (dict(num_generations=1), "--num-generations must be at least 2: a group of one response"),
    (dict(batch_size=10, num_generations=4), "--batch-size 10 is not a whole number of groups of "
                                             "--num-generations 4"),
    (dict(beta=-0.01), r"--beta must be at least 0 \(got -0.01\)"),
    (dict(batch_size=8, num_minibatches=3), "--batch-size 8 is not divisible by --num-minibatches 3"),
    (dict(batch_size=8, num_minibatches=2, gradient_accumulation_steps=3), "--gradient-accumulation-steps 3"),
    (dict(clip_coef_high=0.0), "--clip-coef-high must be positive or None"),
    (dict(clip_coef=-0.2), "--clip-coef must be positive"),
    (dict(update_epochs=0), "--update-epochs must be at least 1"),
    (dict(num_iterations=4), r"--num-iterations is computed \(--total-episodes / --batch-size\); the passes over "
                             r"each batch \(TRL's num_iterations\) are --update-epochs 4"),
    (dict(advantage="gae"), "--advantage must be grpo or rloo"),
    (dict(eval_split="train"), "--eval-split must be held_out, validation or test"),
    (dict(eval_split="test"), "--eval-split test: the unread held-out sums need --reward-model arithmetic"),
    (dict(reward_model="arithmetic", arithmetic_digits=1, eval_split="test"), "--arithmetic-digits 2 or more"),
    (dict(total_episodes=4), "--total-episodes 4 is smaller than one batch"),
    (dict(learning_rate=0.0), "--learning-rate must be positive"),
    (dict(min_response_length=8), "--min-response-length"),
    (dict(model_name="./no/such/model"), "--model-name ./no/such/model: no such directory"),
    (dict(reward_model="arithmetic", prompts_file=__file__), "--prompts-file: --reward-model arithmetic"),
    (dict(eval_checkpoint="no/such/checkpoint"), "--eval-checkpoint no/such/checkpoint: no such directory"),
])
def test_bad_arguments_fail_with_one_line_before_loading(tiny, tmp_path, overrides, message):
    start = time.time()
    with pytest.raises(SystemExit, match=message) as failure:
        grpo.main(tiny_args(tiny, tmp_path, **overrides))
    assert str(failure.value).startswith("error: ") and "\n" not in str(failure.value)
    assert time.time() - start < 5
    assert not (tmp_path / "runs").exists()


def test_the_upper_clip_defaults_to_the_lower_one(tiny, tmp_path):
    args = tiny_args(tiny, tmp_path, clip_coef=0.3)
    grpo.check_args(args)
    assert args.clip_coef_high == 0.3
    args = tiny_args(tiny, tmp_path, clip_coef=0.2, clip_coef_high=0.28)
    grpo.check_args(args)
    assert (args.clip_coef, args.clip_coef_high) == (0.2, 0.28)
    assert (args.prompts_per_batch, args.minibatch_size, args.micro_batch_size, args.num_iterations) == (2, 8, 8, 2)


def sums(prompts) -> set:
    """The unordered pairs {a, b} of arithmetic prompts, read back from their text."""
    return {frozenset(map(int, re.search(r"What is (\d+) \+ (\d+)\?", p).groups())) for p in prompts}


@pytest.mark.parametrize("digits, pairs, validation_pairs", [
    (1, 55, 5),  # 0..9: 10 * 11 / 2 pairs a <= b; held out 55 // 4 = 13; 42 train; 42 // 8 = 5 set aside
    (2, 4095, 384),  # 10..99: 90 * 91 / 2; held out 1023; 3072 train; 3072 // 8 = 384 set aside
])
def test_the_validation_split_is_fixed_disjoint_and_never_trained_on(tiny, tmp_path, digits, pairs,
                                                                     validation_pairs):
    held = grpo.load_prompts(tiny_args(tiny, tmp_path, reward_model="arithmetic", arithmetic_digits=digits))
    val = grpo.load_prompts(tiny_args(tiny, tmp_path, reward_model="arithmetic", arithmetic_digits=digits,
                                      eval_split="validation", seed=7))
    # --eval-split held_out: the training prompts as before, the same as ppo_rlhf_gpt2.py's
    assert held == (rlhf.arithmetic_problems(digits, held_out=False), rlhf.arithmetic_problems(digits, True))
    train, validation = val
    assert len(sums(validation)) == validation_pairs and len(sums(held[0])) + len(sums(held[1])) == pairs
    assert not set(validation) & set(train) and not set(validation) & set(held[1])
    assert not sums(validation) & sums(train)  # a + b and b + a on the same side
    assert set(train) | set(validation) == set(held[0]) and len(train) + len(validation) == len(held[0])
    if digits == 2:
        assert len(validation) >= 256
    # fixed: independent of --seed
    assert val == grpo.load_prompts(tiny_args(tiny, tmp_path, reward_model="arithmetic", arithmetic_digits=digits,
                                              eval_split="validation", seed=1))


def test_the_validation_split_of_a_prompt_list_is_its_last_eighth(tiny, tmp_path):
    train, validation = grpo.load_prompts(tiny_args(tiny, tmp_path, eval_split="validation"))
    assert len(grpo.PROMPTS) == 72 and validation == grpo.PROMPTS[-9:] and train == grpo.PROMPTS[:-9]
    assert grpo.load_prompts(tiny_args(tiny, tmp_path)) == (grpo.PROMPTS, grpo.EVAL_PROMPTS)
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("one\ntwo\nthree\n")  # 3 // 8 = 0: at least one set aside
    assert grpo.load_prompts(tiny_args(tiny, tmp_path, prompts_file=str(prompts_file),
                                       eval_split="validation")) == (["one", "two"], ["three"])
    prompts_file.write_text("one\n")
    with pytest.raises(SystemExit, match="--eval-split validation: no training prompt is left"):
        grpo.load_prompts(tiny_args(tiny, tmp_path, prompts_file=str(prompts_file), eval_split="validation"))


# ---------------------------------------------------------------------------------------------- the math


def test_group_advantages_by_hand():
    # groups of 4: rewards +1/-1 (mean 0, unbiased std 2/sqrt(3)), all equal, and four different numbers
    scores = torch.tensor([1.0, -1.0, -1.0, 1.0, 0.7, 0.7, 0.7, 0.7, 3.0, 1.0, 0.0, 0.0])
    advantages, all_equal = grpo.group_advantages(scores, 4, "group")
    s1 = 2 / math.sqrt(3)  # sqrt(((1)^2 * 4) / 3)
    s3 = math.sqrt(((3 - 1) ** 2 + 0 + 1 + 1) / 3)  # mean 1: deviations 2, 0, -1, -1
    expected = [1 / (s1 + 1e-4), -1 / (s1 + 1e-4), -1 / (s1 + 1e-4), 1 / (s1 + 1e-4), 0, 0, 0, 0,
                2 / (s3 + 1e-4), 0, -1 / (s3 + 1e-4), -1 / (s3 + 1e-4)]
    assert advantages.tolist() == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert all_equal.tolist() == [False, True, False]
    # the all-equal group is exactly 0 (0.7 in float32: its mean, 4 * 0.7 / 4, need not be 0.7 again)
    assert advantages[4:8].tolist() == [0.0, 0.0, 0.0, 0.0] and not advantages.isnan().any()
    # --scale-rewards none: the centered scores, not divided
    centered, _ = grpo.group_advantages(scores, 4, "none")
    assert centered.tolist() == pytest.approx([1, -1, -1, 1, 0, 0, 0, 0, 2, 0, -1, -1], abs=1e-7)
    # groups of 2 from the same scores: other groups, other means
    pairs, pairs_equal = grpo.group_advantages(scores, 2, "none")
    assert pairs.tolist() == pytest.approx([1, -1, -1, 1, 0, 0, 0, 0, 1, -1, 0, 0], abs=1e-7)
    assert pairs_equal.tolist() == [False, False, True, True, False, True]


def test_an_all_equal_group_of_rounded_floats_gets_zero_not_a_blown_up_advantage():
    """Scores equal in value but whose float32 mean is not exactly that value: the std is rounding noise
    (about 1e-8), which divided into the centered scores would give nonzero advantages."""
    x = torch.tensor([0.1] * 8, dtype=torch.float32) * 3
    advantages, all_equal = grpo.group_advantages(x, 8, "group")
    assert all_equal.all() and (advantages == 0).all()


def token_losses():
    """Per-token losses of 3 responses of 1, 3 and 4 real tokens (response_length 4), padding holding junk
    that must not count."""
    loss = torch.tensor([[2.0, 99.0, 99.0, 99.0], [1.0, 2.0, 3.0, 99.0], [4.0, 4.0, 4.0, 4.0]])
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    return loss, mask


@pytest.mark.parametrize("loss_type, expected", [
    ("grpo", (2 / 1 + 6 / 3 + 16 / 4) / 3),  # a mean per response, then over the 3 responses: 8/3
    ("dapo", (2 + 6 + 16) / 8),  # over the 8 real tokens: 3
    ("dr_grpo", (2 + 6 + 16) / (3 * 4)),  # over 3 responses x response_length 4: 2
])
def test_each_aggregation_by_hand_and_its_micro_batch_shares_add_up(loss_type, expected):
    loss, mask = token_losses()
    assert grpo.aggregate(loss, mask, loss_type, 3, 8, 4).item() == pytest.approx(expected)
    # split into micro-batches of 1 and 2 responses, each with the whole minibatch's N = 3 and T = 8
    shares = grpo.aggregate(loss[:1], mask[:1], loss_type, 3, 8, 4) + grpo.aggregate(loss[1:], mask[1:],
                                                                                   loss_type, 3, 8, 4)
    assert shares.item() == pytest.approx(expected)


@pytest.mark.parametrize("loss_type, weights", [
    # d loss / d newlogprob of each real token at ratio 1, for A = 1 on every response: -weight
    ("grpo", [1 / (3 * 1), 1 / (3 * 3), 1 / (3 * 4)]),  # a short response's tokens weigh more: length bias
    ("dapo", [1 / 8, 1 / 8, 1 / 8]),
    ("dr_grpo", [1 / 12, 1 / 12, 1 / 12]),
])
def test_the_length_bias_of_each_aggregation_in_the_gradient(loss_type, weights):
    """The same advantage on three responses of 1, 3 and 4 tokens: the per-response mean gives each token of
    the one-token response 4 times the weight of a token of the four-token one; the two others weigh all
    tokens alike."""
    _, mask = token_losses()
    newlogprob = torch.full((3, 4), -1.0, requires_grad=True)
    token_loss, ratio, _ = grpo.policy_loss(newlogprob, torch.full((3, 4), -1.0), torch.ones(3), 0.2, 0.2)
    assert torch.equal(ratio, torch.ones(3, 4))
    grpo.aggregate(token_loss, mask, loss_type, 3, 8, 4).backward()
    expected = torch.tensor(weights).unsqueeze(1) * mask
    torch.testing.assert_close(newlogprob.grad, -expected)


def test_k3_value_and_gradient_by_hand():
    # pi = 0.5, pi_ref = 0.25: q = 0.5, k3 = (q - 1) - log q = -0.5 + log 2; d k3 / d log pi = 1 - q = 0.5
    # pi = 0.2, pi_ref = 0.6: q = 3, k3 = 2 - log 3; gradient 1 - 3 = -2 (raising pi toward pi_ref lowers it)
    newlogprob = torch.tensor([math.log(0.5), math.log(0.2), math.log(0.3)], requires_grad=True)
    ref = torch.tensor([math.log(0.25), math.log(0.6), math.log(0.3)])
    kl = grpo.k3_kl(newlogprob, ref)
    assert kl.tolist() == pytest.approx([-0.5 + math.log(2), 2 - math.log(3), 0.0], abs=1e-6)
    kl.sum().backward()
    assert newlogprob.grad.tolist() == pytest.approx([0.5, -2.0, 0.0], abs=1e-6)


def test_rloo_advantages_by_hand():
    """RLOO: each score minus the mean of the other G - 1 scores of its group, no std, whatever --scale-rewards.
    [1, -1, -1, 1]: 1 - (-1 - 1 + 1) / 3 = 4/3 and -1 - (1 - 1 + 1) / 3 = -4/3; [3, 1, 0, 0]: 3 - 1/3 = 8/3,
    1 - 1 = 0, 0 - 4/3 = -4/3 (twice); [0.7] * 4: all equal, exactly 0. G = 3, [3, 0, 0]: 3, -1.5, -1.5."""
    scores = torch.tensor([1.0, -1.0, -1.0, 1.0, 3.0, 1.0, 0.0, 0.0, 0.7, 0.7, 0.7, 0.7])
    expected = [4 / 3, -4 / 3, -4 / 3, 4 / 3, 8 / 3, 0, -4 / 3, -4 / 3, 0, 0, 0, 0]
    for scale_rewards in ("group", "none"):
        advantages, all_equal = grpo.group_advantages(scores, 4, scale_rewards, "rloo")
        assert advantages.tolist() == pytest.approx(expected, abs=1e-6)
        assert all_equal.tolist() == [False, False, True]
        assert advantages.view(3, 4).sum(1).tolist() == pytest.approx([0, 0, 0], abs=1e-6)  # sums to 0
        assert advantages[8:].tolist() == [0.0] * 4
    three, _ = grpo.group_advantages(torch.tensor([3.0, 0.0, 0.0]), 3, "none", "rloo")
    assert three.tolist() == pytest.approx([3, -1.5, -1.5])
    rounded = torch.tensor([0.1] * 8, dtype=torch.float32) * 3  # equal, whose float sums need not be exact
    assert (grpo.group_advantages(rounded, 8, "none", "rloo")[0] == 0).all()


def test_bias_corrected_k3_value_and_gradient_by_hand():
    """k3 times the ratio pi / pi_old, the ratio not detached (as TRL): d(ratio * k3) / d log pi = ratio * (k3 +
    1 - q) = -ratio * log q = ratio * log(pi / pi_ref). pi = 0.5, pi_ref = 0.25 (q = 0.5, k3 = log 2 - 0.5):
    - not moved (pi_old = 0.5, ratio 1): the same value as the plain k3, the gradient log 2 (plain: 1 - q = 0.5;
      the two gradients agree only where pi = pi_ref, both 0);
    - moved (pi_old = 0.25, ratio 2): value 2 (log 2 - 0.5), gradient 2 log 2 (plain: 0.5 still);
    - stale and far: pi = 0.01, pi_ref = 0.5, pi_old = 0.5 (ratio 0.02): plain gradient 1 - 50 = -49, corrected
      0.02 * log(0.02) = -0.0782: bounded where the plain one is not."""
    for pi, ref, old, value, grad, plain_grad in [
            (0.5, 0.25, 0.5, math.log(2) - 0.5, math.log(2), 0.5),
            (0.5, 0.25, 0.25, 2 * (math.log(2) - 0.5), 2 * math.log(2), 0.5),
            (0.5, 0.5, 0.25, 0.0, 0.0, 0.0),
            (0.01, 0.5, 0.5, 0.02 * (50 - 1 - math.log(50)), 0.02 * math.log(0.02), -49.0)]:
        newlogprob = torch.tensor([math.log(pi)], requires_grad=True)
        _, ratio, _ = grpo.policy_loss(newlogprob.unsqueeze(0), torch.tensor([[math.log(old)]]), torch.ones(1),
                                       0.2, 0.2)
        corrected = grpo.k3_kl(newlogprob, torch.tensor([math.log(ref)]), ratio.squeeze(0))
        assert corrected.item() == pytest.approx(value, abs=1e-6)
        corrected.sum().backward()
        assert newlogprob.grad.item() == pytest.approx(grad, abs=1e-5)
        plain_logprob = torch.tensor([math.log(pi)], requires_grad=True)
        grpo.k3_kl(plain_logprob, torch.tensor([math.log(ref)])).sum().backward()
        assert plain_logprob.grad.item() == pytest.approx(plain_grad, abs=1e-5)
        if old == pi:  # ratio 1: the same value as the plain k3
            assert corrected.item() == pytest.approx(grpo.k3_kl(plain_logprob, torch.tensor([math.log(ref)])).item())


def test_asymmetric_clip_by_hand():
    """clip_coef 0.2 below, 0.28 above: the loss and whether its gradient flows at ratios inside and outside
    each side, for positive and negative advantages; the clip fractions count each case."""
    ratios = torch.tensor([[1.25, 1.30, 0.75, 0.85, 0.75, 1.30]])
    advantages = torch.tensor([2.0])
    signs = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0, -1.0]])  # the advantage of each case, as a per-token A
    newlogprob = ratios.log().requires_grad_(True)
    token_loss = []
    for j in range(6):
        loss, ratio, _ = grpo.policy_loss(newlogprob[:, j : j + 1], torch.zeros(1, 1), advantages * signs[0, j],
                                          0.2, 0.28)
        token_loss.append(loss)
    token_loss = torch.cat(token_loss, dim=1)
    # A > 0: 1.25 < 1.28 is inside (loss -2 * 1.25); 1.30 is clipped to 1.28. A < 0: 0.75 is clipped to
    # 0.8 (loss 2 * 0.8), 0.85 is inside. A > 0 at 0.75 and A < 0 at 1.30: the unclipped term is the larger
    # one, so the ratio is not held back (pessimistic bound) and the gradient flows
    assert token_loss[0].tolist() == pytest.approx([-2.5, -2.56, 1.6, 1.7, -1.5, 2.6], abs=1e-6)
    token_loss.sum().backward()
    flows = (newlogprob.grad[0] != 0).tolist()
    assert flows == [True, False, False, True, True, True]
    debug = grpo.debug_variables(torch.log_softmax(torch.zeros(1, 6, 3), -1), ratios, ratios.log(),
                                 torch.tensor([1.0]), torch.ones(1, 6, dtype=torch.bool), 0.2, 0.28)
    # with A = +1 on every token: out of [0.8, 1.28]: 1.30, 0.75, 0.75, 1.30 -> 4/6; high (A > 0): 2/6
    assert debug["clipfrac"].item() == pytest.approx(4 / 6)
    assert debug["clipfrac_high"].item() == pytest.approx(2 / 6) and debug["clipfrac_low"].item() == 0
    debug = grpo.debug_variables(torch.log_softmax(torch.zeros(1, 6, 3), -1), ratios, ratios.log(),
                                 torch.tensor([-1.0]), torch.ones(1, 6, dtype=torch.bool), 0.2, 0.28)
    assert debug["clipfrac_low"].item() == pytest.approx(2 / 6) and debug["clipfrac_high"].item() == 0
    assert debug["entropy"].item() == pytest.approx(math.log(3))
    logratio = ratios.log()
    assert debug["approx_kl"].item() == pytest.approx(((ratios - 1) - logratio).mean().item())
    assert debug["old_approx_kl"].item() == pytest.approx((-logratio).mean().item())


# ---------------------------------------------------------------------------------------------- main()


def plain_response_logprobs(model, queries, responses, response_mask, pad_token_id, temperature):
    """log pi of each response token from one plain forward pass of `model` (not the script's helpers):
    left-padded query + response, positions counted from the first real token."""
    sequences = torch.cat([queries, responses.masked_fill(~response_mask, pad_token_id)], dim=1)
    attention = sequences != pad_token_id
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=sequences.masked_fill(~attention, 0), attention_mask=attention,
                   position_ids=positions).logits[:, queries.shape[1] - 1 : -1] / temperature
    tokens = responses.masked_fill(~response_mask, 0)
    return logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def rows_of(old, logprobs) -> list[int]:
    """The rollout rows of a micro-batch, found by its stored log-probs (distinct floats in every row)."""
    rows = [[i for i in range(len(logprobs)) if torch.equal(row, logprobs[i])] for row in old]
    assert all(len(found) == 1 for found in rows), "old log-probs that are not one row the rollout stored"
    return [found[0] for found in rows]


class Recorder:
    """Wraps the script's functions for one run and keeps what went in and came out."""

    def __init__(self, monkeypatch):
        self.rollouts, self.policy_losses, self.aggregates, self.kls, self.grads = [], [], [], [], []
        self.monkeypatch = monkeypatch
        real_sample, real_policy_loss = grpo.sample_and_score, grpo.policy_loss
        real_aggregate, real_k3 = grpo.aggregate, grpo.k3_kl

        def sample_and_score(policy, queries, *a, **kw):
            out = real_sample(policy, queries, *a, **kw)
            self.rollouts.append((queries, *out))
            return out

        def policy_loss(newlogprob, logprobs, advantages, *a):
            out = real_policy_loss(newlogprob, logprobs, advantages, *a)
            self.policy_losses.append((newlogprob.detach(), logprobs, advantages, out[1].detach()))
            return out

        def aggregate(token_loss, response_mask, *a):
            self.aggregates.append((token_loss.detach(), response_mask, a))
            return real_aggregate(token_loss, response_mask, *a)

        def k3_kl(newlogprob, ref_logprobs, ratio=None):
            self.kls.append((newlogprob.detach(), ref_logprobs, None if ratio is None else ratio.detach()))
            return real_k3(newlogprob, ref_logprobs, ratio)

        real_clip = torch.nn.utils.clip_grad_norm_

        def clip_grad_norm_(parameters, max_norm):
            parameters = list(parameters)
            self.grads.append([p.grad.detach().clone() for p in parameters])
            return real_clip(parameters, max_norm)

        for name, f in [("sample_and_score", sample_and_score), ("policy_loss", policy_loss),
                        ("aggregate", aggregate), ("k3_kl", k3_kl)]:
            monkeypatch.setattr(grpo, name, f)
        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_grad_norm_)


def test_one_iteration_is_the_plain_policy_gradient(tiny, tmp_path, monkeypatch, stops_at_lengths_1_to_8):
    """--update-epochs 1, one minibatch (two micro-batches), beta 0: the ratio is 1 on every token, and the
    gradient applied is that of -1/N sum_i A_i / |o_i| sum_t log pi(o_it), A_i the group-relative advantage
    worked out here from the scores, log pi from a plain forward pass of the initial policy."""
    monkeypatch.setattr(grpo, "load_reward_fn", mod3_reward)
    record = Recorder(monkeypatch)
    args = tiny_args(tiny, tmp_path, batch_size=8, num_generations=4, total_episodes=8, beta=0.0,
                     gradient_accumulation_steps=2, missing_eos_penalty=-1.0, stop_token=".",
                     min_response_length=3)  # the stops put at 0-2 come too early: those get the penalty
    grpo.main(args)
    (queries, responses, logprobs, mask, contain_stop, raw), = record.rollouts
    assert len(record.policy_losses) == 2
    for _, old, _, ratio in record.policy_losses:
        assert ((ratio - 1) * mask[rows_of(old, logprobs)]).abs().max() < 1e-5
    scores = torch.where(contain_stop, raw, torch.tensor(-1.0))
    assert contain_stop.any() and not contain_stop.all() and scores.view(2, 4).std(1).max() > 0
    advantages = []
    for group in scores.view(2, 4).tolist():
        mean, std = statistics.mean(group), statistics.stdev(group)
        advantages += [(s - mean) / (std + 1e-4) for s in group]
    policy = AutoModelForCausalLM.from_pretrained(tiny["policy"]).eval()
    tokenizer, pad_token_id, _ = grpo.load_tokenizer(tiny["policy"], ".")
    new = plain_response_logprobs(policy, queries, responses, mask, pad_token_id, args.temperature)
    torch.testing.assert_close(new.masked_fill(~mask, 0), logprobs.masked_fill(~mask, 0), atol=1e-5, rtol=0)
    lengths = mask.sum(1)
    plain = -sum(advantages[i] / lengths[i] * new[i][mask[i]].sum() for i in range(8)) / 8
    plain.backward()
    (applied,) = record.grads
    for p, g in zip(policy.parameters(), applied):
        torch.testing.assert_close(g, p.grad, atol=1e-6, rtol=1e-4)
    assert any(g.abs().max() > 1e-4 for g in applied)


@pytest.mark.parametrize("advantage, use_bias_correction_kl", [("grpo", False), ("rloo", True)])
def test_main_glue_over_groups_lengths_minibatches_and_passes(tiny, tmp_path, monkeypatch, stops_at_lengths_1_to_8,
                                                              advantage, use_bias_correction_kl):
    """Two iterations of 3 groups of 4 (responses of 1 to 8 tokens, the EOS trick on some), two passes over two
    minibatches, beta 0.1, micro-batches of 3: what reaches each function, checked where a wrong wiring
    differs; expected values worked out here from the recorded rollout, not by the script's helpers. With
    RLOO's advantage and the corrected k3: the leave-one-out advantages, and the policy's ratio in the k3."""
    monkeypatch.setattr(grpo, "load_reward_fn", mod3_reward)
    record = Recorder(monkeypatch)
    args = tiny_args(tiny, tmp_path, batch_size=12, num_generations=4, total_episodes=24, update_epochs=2,
                     num_minibatches=2, gradient_accumulation_steps=2, beta=0.1, learning_rate=1e-2,
                     stop_token=".", loss_type="dapo", min_response_length=3, reward_model="arithmetic",
                     advantage=advantage, use_bias_correction_kl=use_bias_correction_kl)
    stats = grpo.main(args)
    scalars = read_scalars(stats["run_dir"])
    assert len(record.rollouts) == 2
    reference = AutoModelForCausalLM.from_pretrained(tiny["policy"]).eval()
    _, pad_token_id, _ = grpo.load_tokenizer(tiny["policy"], ".")
    per_iteration = len(record.policy_losses) // 2  # 2 passes x 2 minibatches x 2 micro-batches
    assert per_iteration == 8 and len(record.aggregates) == 2 * len(record.policy_losses)
    for it, (queries, responses, logprobs, mask, contain_stop, raw) in enumerate(record.rollouts):
        # each group is one prompt, 4 times in a row
        assert all(torch.equal(queries[g * 4], queries[g * 4 + k]) for g in range(3) for k in range(4))
        assert not torch.equal(queries[0], queries[4])
        scores = [s if stop else -1.0 for s, stop in zip(raw.tolist(), contain_stop.tolist())]
        advantages, equal_groups = {}, 0
        for g in range(3):
            group = scores[4 * g : 4 * g + 4]
            equal_groups += len(set(group)) == 1
            for k, s in enumerate(group):
                others = group[:k] + group[k + 1 :]  # RLOO: minus the mean of the other three, no std
                advantages[4 * g + k] = 0.0 if len(set(group)) == 1 else (s - statistics.mean(others)) if (
                    advantage == "rloo") else (s - statistics.mean(group)) / (statistics.stdev(group) + 1e-4)
        assert scalars["val/zero_advantage_groups"][it] == pytest.approx(equal_groups / 3)
        ref = plain_response_logprobs(reference, queries, responses, mask, pad_token_id, args.temperature)
        lengths = mask.sum(1).tolist()
        calls = record.policy_losses[it * per_iteration : (it + 1) * per_iteration]
        kls = record.kls[it * per_iteration : (it + 1) * per_iteration]
        aggregates = record.aggregates[2 * it * per_iteration : 2 * (it + 1) * per_iteration]
        seen = []
        for j, ((new, old, adv, ratio), (_, ref_seen, kl_ratio)) in enumerate(zip(calls, kls)):
            # match each micro-batch's rows to the rollout's by the stored log-probs (distinct floats)
            rows = rows_of(old, logprobs)
            seen += rows
            # the corrected k3 is weighted by the same ratio as the surrogate; the plain one by none
            assert kl_ratio is None if not use_bias_correction_kl else torch.equal(kl_ratio, ratio)
            assert adv.tolist() == pytest.approx([advantages[i] for i in rows], rel=1e-5, abs=1e-6)
            torch.testing.assert_close(ref_seen.masked_fill(~mask[rows], 0), ref[rows].masked_fill(~mask[rows], 0),
                                       atol=1e-5, rtol=0)
            # the token loss goes to the aggregation with the minibatch's sizes: 6 responses, their real tokens
            minibatch = calls[(j // 2) * 2 : (j // 2) * 2 + 2]
            minibatch_rows = [i for _, o, _, _ in minibatch for i in rows_of(o, logprobs)]
            for token_loss, agg_mask, sizes in aggregates[2 * j : 2 * j + 2]:
                assert torch.equal(agg_mask, mask[rows])
                assert sizes[0] == "dapo" and sizes[1] == 6 and sizes[3] == 8
                assert int(sizes[2]) == sum(lengths[i] for i in minibatch_rows)
            if j >= 2:  # after the first optimizer step the policy has moved: the ratio must not be 1
                assert (ratio - 1).masked_fill(~mask[rows], 0).abs().max() > 1e-4
        assert sorted(seen) == sorted(list(range(12)) * 2)  # every response once per pass
        # logged: the lengths of the right responses (the verifier's +1: here, a length of 2 mod 3), the
        # KL to the reference (k1 summed over each response, mean over responses), the scores
        right = [n for n, r in zip(lengths, raw.tolist()) if r > 0]
        kl = ((logprobs - ref).masked_fill(~mask, 0)).sum(1).mean().item()
        assert scalars["objective/kl"][it] == pytest.approx(kl, abs=1e-4)
        assert scalars["charts/episodic_length"][it] == pytest.approx(statistics.mean(lengths))
        assert scalars["objective/scores"][it] == pytest.approx(statistics.mean(scores), abs=1e-6)
        assert scalars["objective/raw_scores"][it] == pytest.approx(raw.mean().item(), abs=1e-6)
        assert scalars["val/num_eos_tokens"][it] == contain_stop.sum().item()
        if right:
            assert scalars["val/length_right"][it] == pytest.approx(statistics.mean(right))
        else:
            assert math.isnan(scalars["val/length_right"][it])
    # the logged policy loss is the mean over the minibatches of each minibatch's loss (the sum of its
    # micro-batches' shares), the first iteration's from the recorded aggregations
    first = record.aggregates[: 2 * per_iteration]
    pg_shares = [a for a in first[0::2]]
    minibatch_losses = []
    for m in range(4):
        total = 0.0
        for token_loss, agg_mask, (_, n, t, _) in pg_shares[2 * m : 2 * m + 2]:
            total += token_loss[agg_mask].sum().item() / int(t)
        minibatch_losses.append(total)
    assert scalars["losses/policy_loss"][0] == pytest.approx(statistics.mean(minibatch_losses), rel=1e-4, abs=1e-6)
    # the gradient norm is clipped on the policy's parameters only, once per minibatch
    assert len(record.grads) == 2 * 2 * 2


def test_beta_zero_loads_no_reference_model(tiny, tmp_path, monkeypatch):
    copies = []
    real_deepcopy = copy.deepcopy
    def deepcopy(x, *a):
        if isinstance(x, torch.nn.Module):
            copies.append(type(x).__name__)
        return real_deepcopy(x, *a)

    monkeypatch.setattr(grpo.copy, "deepcopy", deepcopy)
    stats = grpo.main(tiny_args(tiny, tmp_path / "zero", beta=0.0))
    assert copies == [] and "objective/kl" not in read_scalars(stats["run_dir"])
    assert "losses/kl" not in read_scalars(stats["run_dir"])
    stats = grpo.main(tiny_args(tiny, tmp_path / "some", beta=0.04))
    assert copies == ["GPT2LMHeadModel"]
    scalars = read_scalars(stats["run_dir"])
    assert scalars["objective/kl"][0] == pytest.approx(0, abs=1e-4)  # the policy is the reference at first
    assert len(scalars["losses/kl"]) == 2


@pytest.mark.parametrize("beta", [0.04, 0.0])
def test_bf16_runs_the_models_in_bfloat16_with_a_first_ratio_of_exactly_1(tiny, tmp_path, monkeypatch, beta):
    """--bf16 (detail 53), one iteration of one minibatch in 4 micro-batches, one pass: every pass of the update
    comes before the optimizer step and the policy is the reference, so the ratio is exactly 1 and the KL (the
    logged k1 and the k3 term of the loss) exactly 0, with or without a reference (the old log-probs and the
    reference's recomputed by passes of the update's shape); the policy and the reference ran in bfloat16, the
    reward model in fp32, and the weights and Adam's state stayed fp32."""
    args = tiny_args(tiny, tmp_path, bf16=True, gradient_accumulation_steps=4, update_epochs=1, total_episodes=8,
                     beta=beta)
    scalars, outputs, steps = bf16_run(grpo, args, monkeypatch)
    assert outputs == {"policy": {torch.bfloat16}, "reward": {torch.float32}} and steps == [{torch.float32}]
    assert scalars["val/ratio"] == [1.0]
    assert scalars["losses/approx_kl"] == scalars["losses/old_approx_kl"] == scalars["losses/clipfrac"] == [0.0]
    assert (scalars["objective/kl"] == scalars["losses/kl"] == [0.0]) if beta else "objective/kl" not in scalars


def test_bf16_on_a_gpu_without_it_fails_before_any_work(tiny, tmp_path, monkeypatch):
    check_bf16_needs_a_gpu_that_has_it(grpo.main, tiny_args(tiny, tmp_path, bf16=True, cuda=True), tmp_path / "runs",
                                       monkeypatch)


def test_all_equal_groups_give_a_zero_loss_and_no_step(tiny, tmp_path, monkeypatch):
    """A reward that is the same for every response: every group's advantage is 0, the policy loss is
    exactly 0, and with beta 0 the policy does not move (Adam's step of a zero gradient is 0)."""
    monkeypatch.setattr(grpo, "load_reward_fn", lambda args, device: lambda texts, responses: torch.ones(
        len(responses)))
    stats = grpo.main(tiny_args(tiny, tmp_path, beta=0.0, save_model=True, missing_eos_penalty=None))
    scalars = read_scalars(stats["run_dir"])
    assert scalars["val/zero_advantage_groups"] == [1.0, 1.0]
    assert scalars["losses/policy_loss"] == [0.0, 0.0]
    saved = AutoModelForCausalLM.from_pretrained(Path(stats["run_dir"]) / "model")
    initial = AutoModelForCausalLM.from_pretrained(tiny["policy"])
    assert all(torch.equal(a, b) for a, b in zip(saved.parameters(), initial.parameters()))


def test_the_kl_term_alone_pulls_the_moved_policy_back_with_a_gradient_linear_in_beta(
        tiny, tmp_path, monkeypatch, stops_at_lengths_1_to_8):
    """Iteration 1 has rewards that vary within groups (the policy moves; at the reference the k3 term has
    gradient 0), iteration 2 rewards every response alike (all advantages 0): its gradient is the KL term's
    alone, taken through the new log-probs: 0 at beta 0, and at beta 1 twice that at beta 0.5."""
    norms, real_clip = {}, torch.nn.utils.clip_grad_norm_
    for beta in (0.0, 0.5, 1.0):
        scored = []

        def reward_fn(texts, responses):
            first = len(scored) < 8  # the 8 responses of iteration 1
            scored.extend(responses)
            return torch.tensor([float(len(r) % 3 - 1) if first else 1.0 for r in responses])

        monkeypatch.setattr(grpo, "load_reward_fn", lambda args, device: reward_fn)
        seen = []
        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **kw: seen.append(
            real_clip(*a, **kw).item()) or seen[-1])
        stats = grpo.main(tiny_args(tiny, tmp_path / str(beta), beta=beta, learning_rate=1e-2,
                                    missing_eos_penalty=None))
        scalars = read_scalars(stats["run_dir"])
        assert scalars["val/zero_advantage_groups"] == [0.0, 1.0] and len(seen) == 2
        norms[beta] = seen
    assert norms[0.5][0] == pytest.approx(norms[1.0][0], rel=1e-4) == pytest.approx(norms[0.0][0], rel=1e-4)
    assert norms[0.0][1] == 0.0 and norms[0.5][1] > 1e-4
    assert norms[1.0][1] == pytest.approx(2 * norms[0.5][1], rel=1e-3)


@pytest.mark.parametrize("beta", [0.5, 0.0])
def test_the_kl_term_enters_the_loss_with_its_sign_and_beta(tiny, tmp_path, monkeypatch, beta):
    """The direction, which a test of gradient sizes cannot see. Every response scores alike (all advantages 0)
    and the KL estimate is replaced by the new log-prob itself, so main()'s loss is beta * aggregate(log pi of
    the sampled tokens): one step must lower those log-probs (a minus sign in main() would raise them), and at
    beta 0 leave the policy as it was. k3's own direction is tested by hand above."""
    monkeypatch.setattr(grpo, "k3_kl", lambda newlogprob, ref_logprobs, ratio=None: newlogprob)
    monkeypatch.setattr(grpo, "load_reward_fn", lambda args, device: lambda texts, responses: torch.ones(len(texts)))
    sampled, real_sample_and_score = [], grpo.sample_and_score

    def recording(policy, queries, *rest, **kw):
        out = real_sample_and_score(policy, queries, *rest, **kw)
        sampled.append((queries.clone(), out[0].clone(), out[2].clone()))
        return out

    monkeypatch.setattr(grpo, "sample_and_score", recording)
    args = tiny_args(tiny, tmp_path, beta=beta, learning_rate=1e-3, total_episodes=8, save_model=True,
                     missing_eos_penalty=None)
    result = grpo.main(args)
    assert result["val/zero_advantage_groups"] == 1.0
    (queries, responses, mask), = sampled
    tokenizer, pad_token_id, _ = grpo.load_tokenizer(tiny["policy"], ".")

    def summed_logprob(model) -> float:  # log pi of the sampled tokens, summed over the real ones
        with torch.no_grad():
            logits = grpo.response_logits(model, torch.cat([queries, responses], 1), queries.shape[1],
                                          args.temperature, pad_token_id)
            logprobs = grpo.gather_logprobs(logits, responses.masked_fill(~mask, 0))
        return logprobs[mask].sum().item()

    before = summed_logprob(AutoModelForCausalLM.from_pretrained(tiny["policy"]).eval())
    after = summed_logprob(AutoModelForCausalLM.from_pretrained(os.path.join(result["run_dir"], "model")).eval())
    if beta > 0:
        assert after < before - 1e-3
    else:
        assert after == pytest.approx(before, abs=1e-5)


def test_held_out_means_and_standard_errors_are_over_prompts(tiny, tmp_path, monkeypatch):
    """20 held-out responses to 16 prompts: the 4 prompts asked twice count once, with their mean, and the
    standard error is over the 16 prompts, not the 20 responses (worked out here from the samples)."""
    monkeypatch.setattr(grpo, "load_reward_fn", lambda args, device: lambda texts, responses: torch.tensor(
        [float(t.count("e")) for t in texts]))
    stats = grpo.main(tiny_args(tiny, tmp_path, eval_episodes=20, missing_eos_penalty=None))
    final = stats["eval"]["final"]
    per_prompt = {}
    for (q, r), score in zip(final["samples"], final["raw_scores"]):
        assert score == float((q + r).count("e"))
        per_prompt.setdefault(q, []).append(score)
    means = [statistics.mean(v) for v in per_prompt.values()]
    assert final["prompts"] == len(means) == 16 and sorted(map(len, per_prompt.values())) == [1] * 12 + [2] * 4
    assert statistics.stdev(means) > 0 and statistics.stdev(means) / 4 != pytest.approx(
        statistics.stdev(final["raw_scores"]) / 20 ** 0.5)
    assert final["raw_score_mean"] == pytest.approx(statistics.mean(means))
    assert final["raw_score_stderr"] == pytest.approx(statistics.stdev(means) / 4)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])  # detail 53: --bf16 learns too
def test_learning_raises_the_score(tiny, tmp_path, monkeypatch, bf16):
    """A short run on the tiny GPT-2 with the 'e'-counting reward: the group-relative gradient raises the
    score well beyond its start (a flipped sign or a zero advantage would not)."""
    monkeypatch.setattr(grpo, "load_reward_fn", count_e_reward)
    stats = grpo.main(tiny_args(tiny, tmp_path, batch_size=32, num_generations=8, total_episodes=32 * 20,
                                response_length=12, learning_rate=3e-3, stop_token="eos",
                                missing_eos_penalty=None, beta=0.0, num_minibatches=2, bf16=bf16))
    scores = read_scalars(stats["run_dir"])["objective/scores"]
    first, last = statistics.mean(scores[:3]), statistics.mean(scores[-4:])
    print(f"scores: first 3 iterations {first:.3f}, last 4 {last:.3f}")
    assert last > first + 1.0


@pytest.mark.parametrize("loss_type, scale_rewards, clip_coef_high", [("dapo", "group", 0.28),
                                                                      ("dr_grpo", "none", None)])
def test_variants_run_on_the_llama_architecture(tiny, tmp_path, loss_type, scale_rewards, clip_coef_high):
    stats = grpo.main(tiny_args(tiny, tmp_path, model_name=tiny["llama"], loss_type=loss_type,
                                scale_rewards=scale_rewards, clip_coef_high=clip_coef_high, update_epochs=2,
                                reward_model="arithmetic"))
    scalars = read_scalars(stats["run_dir"])
    assert all(math.isfinite(v) for v in scalars["losses/policy_loss"])
    assert {"losses/clipfrac", "losses/clipfrac_low", "losses/clipfrac_high", "val/length_wrong"} <= set(scalars)


def test_arithmetic_evaluation_counts_problems_and_the_checkpoint_reevaluates(tiny, tmp_path, capsys):
    """Held-out accuracy before and after, counted over the distinct held-out problems; the saved policy,
    evaluated alone with --eval-checkpoint, gives the same responses and scores."""
    common = dict(reward_model="arithmetic", eval_episodes=30, response_length=4)
    stats = grpo.main(tiny_args(tiny, tmp_path, save_model=True, eval_every=1, **common))
    held_out = set(grpo.arithmetic_problems(1, held_out=True))
    final = stats["eval"]["final"]
    assert set(stats["eval"]) == {"initial", "iteration_1", "final"}
    assert {q for q, _ in final["samples"]} == held_out and final["prompts"] == 24
    per_problem = {}
    for (query, _), score in zip(final["samples"], final["raw_scores"]):
        per_problem.setdefault(query, []).append(score > 0)
    shares = [statistics.mean(r) for r in per_problem.values()]
    assert final["accuracy"] == pytest.approx(statistics.mean(shares))
    assert final["accuracy_stderr"] == pytest.approx(statistics.stdev(shares) / 24 ** 0.5)
    assert read_scalars(stats["run_dir"])["eval/accuracy"] == pytest.approx(
        [stats["eval"][w]["accuracy"] for w in ("initial", "iteration_1", "final")])
    assert "held-out accuracy: " in capsys.readouterr().out
    again = grpo.main(tiny_args(tiny, tmp_path / "again", eval_checkpoint=str(Path(stats["run_dir"]) / "model"),
                                **common))
    assert again["eval"]["final"]["samples"] == final["samples"]
    assert "responses to 24 held-out sums (standard errors over them)" in capsys.readouterr().out


def test_ctrl_c_keeps_logs_and_saves(tiny, tmp_path, interrupted_generation):
    # generate's calls: 1 in iteration 1, 2 in iteration 2
    interrupted_generation(grpo, grpo.main, tiny_args(tiny, tmp_path, total_episodes=24, save_model=True,
                                                      missing_eos_penalty=None), calls=2)


def test_ctrl_c_while_saving_closes_the_logs(tiny, tmp_path, interrupted_save):
    stats, _ = interrupted_save(GPT2LMHeadModel, grpo.main, tiny_args(tiny, tmp_path, save_model=True))
    assert len(read_scalars(stats["run_dir"])["objective/scores"]) == 2


def test_eval_checkpoint_samples_with_the_settings_saved_with_the_policy(tiny, tmp_path, capsys):
    """check_evaluation_samples_as_saved; then a folder whose sampling.json is broken is refused."""
    _, _, model_dir, _ = check_evaluation_samples_as_saved(grpo, lambda *a, **kw: tiny_args(tiny, *a, **kw),
                                                           tmp_path, capsys)
    (model_dir / "sampling.json").write_text("{not json")
    with pytest.raises(SystemExit, match="--eval-checkpoint .*: not a policy saved by --save-model"):
        grpo.main(tiny_args(tiny, tmp_path / "bad", eval_checkpoint=str(model_dir)))


# ---------------------------------------------------------------------------------------------- torchrun

# The script run by both: sampling is replaced by a fixed function of each query and of the response's place
# in its group (random tokens from a generator seeded with both, and a stop token at a position that depends
# on both, so that the lengths and the "length" reward vary within a group), with the log-probs recomputed by
# the policy. One process with a batch of 8 and two processes with 4 each (one group of 4) then see the same
# (query, response) pairs. It runs main() once for each --loss-type (grpo: N matters, dapo: T), in
# <runs_dir>/<loss_type>, and records the gradient norm of each optimizer step, before clipping.
DRIVER = '''
import copy, json, os, sys
import torch, tyro
sys.path.insert(0, {repo!r})
import grpo_gpt2 as grpo
script = grpo

args = tyro.cli(grpo.Args)

draws = []  # this process's next draw from the global stream at each sampling: processes must draw apart

@torch.inference_mode()
def generate(policy, queries, response_length, temperature, pad_token_id, greedy=False, bf16=False):
    draws.append(torch.rand(1).item())
    rows = []
    for j, query in enumerate(queries.tolist()):
        place = j % args.num_generations  # a process holds whole groups, so this is the place in the group
        generator = torch.Generator().manual_seed(abs(hash((tuple(query), place))) % 2**31)
        row = torch.randint(0, {vocab_size}, (response_length,), generator=generator)
        row[(sum(query) + place) % response_length] = {stop_id}
        rows.append(row)
{scored_responses}

{recorded_norms}

{recorded_exit}

# one process group for both runs (torchrun's rendezvous serves one): joined once, left by the last run's main()
init = grpo.init_process_group
grpo.init_process_group = lambda a, device: device if torch.distributed.is_initialized() else init(a, device)
grpo.generate, grpo.nn.utils.clip_grad_norm_ = generate, record_norm
for loss_type in ("grpo", "dapo"):
    torch.distributed.destroy_process_group = (lambda: None) if loss_type == "grpo" else recording_destroy
    norms.clear()
    run_args = copy.deepcopy(args)
    run_args.loss_type, run_args.runs_dir = loss_type, os.path.join(args.runs_dir, loss_type)
    grpo.main(run_args)
    with open(os.path.join(args.runs_dir, f"grad_norms_{{loss_type}}_{{run_args.rank}}.json"), "w") as f:
        json.dump(norms, f)
with open(os.path.join(args.runs_dir, f"draws_{{run_args.rank}}.json"), "w") as f:
    json.dump(draws, f)
with open(os.path.join(args.runs_dir, f"threads_left_{{run_args.rank}}.json"), "w") as f:
    json.dump(left, f)
'''


@pytest.fixture(scope="module")
def torchrun_case(tiny, tmp_path_factory):
    """The driver script and flags: 2 prompts of the same token length (so that one process's query is padded
    as in the batch of both), one iteration of 2 groups of 4, two passes over one minibatch of two
    accumulated micro-batches, the corrected k3 at beta 0.1 (a reference on every process)."""
    root, _ = torchrun_folder(tmp_path_factory, Path(grpo.__file__).parent, grpo.PROMPTS, DRIVER, tiny["policy"], 2)
    flags = ["--model-name", tiny["policy"], "--reward-model", "length", "--no-cuda", "--prompts-file",
             str(root / "prompts.txt"), "--batch-size", "8", "--num-generations", "4", "--num-minibatches", "1",
             "--update-epochs", "2", "--gradient-accumulation-steps", "2", "--total-episodes", "8",
             "--response-length", "8", "--min-response-length", "0", "--eval-episodes", "0", "--learning-rate",
             "1e-3", "--missing-eos-penalty", "None", "--beta", "0.1", "--use-bias-correction-kl", "--save-model"]
    return root, flags


def test_torchrun_two_processes_make_the_update_of_one_process(torchrun_case):
    """Same responses, same update, for --loss-type grpo and dapo: one group on each process, the loss's N
    (grpo) or T (dapo) over both processes, the gradients averaged by DDP. A per-process N or T, or a
    gradient off by the number of processes, changes the gradient norm below (Adam alone would hide it)."""
    root, flags = torchrun_case
    run_one_and_two_processes(root, flags)
    # each process samples from its own random stream (seed + rank), not a copy of the other's
    draws = [json.loads((root / "two" / "runs" / f"draws_{rank}.json").read_text()) for rank in (0, 1)]
    assert len(draws[0]) == len(draws[1]) >= 1 and draws[0][0] != draws[1][0]
    # main()'s destroy_process_group ends the process group's threads (none left to outlive the interpreter)
    left = [json.loads((root / "two" / "runs" / f"threads_left_{rank}.json").read_text()) for rank in (0, 1)]
    assert left == [[0], [0]]
    initial = AutoModelForCausalLM.from_pretrained(flags[1]).state_dict()
    for loss_type in ("grpo", "dapo"):
        run_dirs = {n: list((root / n / "runs" / loss_type).iterdir()) for n in ("one", "two")}
        assert [len(d) for d in run_dirs.values()] == [1, 1]  # process 1 writes no run folder of its own
        run_dirs = {name: d[0] for name, d in run_dirs.items()}
        one, two = (AutoModelForCausalLM.from_pretrained(run_dirs[n] / "model").state_dict() for n in ("one", "two"))
        moved = max((one[k] - initial[k]).abs().max().item() for k in initial)
        differ = max((one[k] - two[k]).abs().max().item() for k in initial)
        assert moved > 1e-3 and differ < 1e-6, (loss_type, moved, differ)  # far larger than the float noise
        norms = [json.loads((root / n / "runs" / f"grad_norms_{loss_type}_{rank}.json").read_text())
                 for n, rank in (("one", 0), ("two", 0), ("two", 1))]
        assert len(norms[0]) == 2 and norms[0][0] > 0  # 2 passes x 1 minibatch
        assert norms[1] == pytest.approx(norms[0], rel=1e-4) and norms[2] == pytest.approx(norms[0], rel=1e-4)
        # the logged statistics are over both processes' responses, the losses those of the whole minibatch
        # (the debug variables are means over micro-batches, which differ: not compared)
        scalars = {name: read_scalars(d) for name, d in run_dirs.items()}
        assert scalars["one"]["val/zero_advantage_groups"] == [0.0]
        for tag in ("objective/scores", "charts/episodic_length", "val/num_eos_tokens", "losses/policy_loss",
                    "losses/kl", "objective/kl"):
            assert scalars["two"][tag] == pytest.approx(scalars["one"][tag], abs=1e-5), (loss_type, tag)


@pytest.mark.parametrize("overrides, message", [
    # 12 responses are 3 groups of 4: one process takes them, 2 processes would split a group
    (dict(batch_size=12, total_episodes=12), "--batch-size 12 is not a whole number of groups of --num-generations "
                                             "4 times the 2 torchrun processes; choose a multiple of it"),
    # 8 responses in 8 minibatches: one each in one process, half a response each in 2
    (dict(num_minibatches=8), "--batch-size 8 is not divisible by --num-minibatches 8 times the 2 torchrun "
                              "processes; choose a batch size that is a multiple of it"),
    (dict(eval_checkpoint="."), "--eval-checkpoint runs in one process: run it with python, not torchrun"),
])
def test_torchrun_bad_flags_fail_in_every_process_with_one_message(tiny, tmp_path, monkeypatch, overrides,
                                                                   message):
    """As torchrun sets them for each of 2 processes: the same one-line error in both, before any model
    loads or any collective (so that no process waits for another). The same flags pass in one process."""
    for rank in (0, 1):
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", str(rank))
        with pytest.raises(SystemExit, match=re.escape(message)) as failure:
            grpo.main(tiny_args(tiny, tmp_path, **overrides))
        assert str(failure.value).startswith("error: ") and "\n" not in str(failure.value)
    assert not (tmp_path / "runs").exists()
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    if "eval_checkpoint" not in overrides:
        grpo.check_args(tiny_args(tiny, tmp_path, **overrides))


def test_clip_coef_high_reaches_the_loss_and_the_logged_clipfrac_through_main(tiny, tmp_path, monkeypatch):
    """--clip-coef 0.1 --clip-coef-high 0.5 (detail 50): main() hands both bounds to the loss and to the debug
    variables whose clipfrac is logged, at every micro-batch; without --clip-coef-high both get 0.1 twice."""
    seen = {"policy_loss": [], "debug_variables": []}
    for name in seen:
        real = getattr(grpo, name)
        monkeypatch.setattr(grpo, name, lambda *a, _real=real, _name=name: seen[_name].append(a[-2:]) or _real(*a))
    grpo.main(tiny_args(tiny, tmp_path, reward_model="length", missing_eos_penalty=None, clip_coef=0.1,
                        clip_coef_high=0.5, update_epochs=2))
    for name, calls in seen.items():
        assert len(calls) == 2 * 2 and set(calls) == {(0.1, 0.5)}, (name, calls)  # 2 iterations x 2 passes
    seen = {"policy_loss": [], "debug_variables": []}
    grpo.main(tiny_args(tiny, tmp_path / "symmetric", reward_model="length", missing_eos_penalty=None,
                        clip_coef=0.1))
    assert all(set(calls) == {(0.1, 0.1)} for calls in seen.values())
