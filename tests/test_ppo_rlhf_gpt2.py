"""Tests of ppo_rlhf_gpt2.py, offline: a tiny GPT-2, its tokenizer and a tiny reward model are built here,
saved with save_pretrained, and loaded by the script's own loading code."""

import importlib
import inspect
import json
import math
import random
import re
import shutil
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2ForSequenceClassification,
                          GPT2LMHeadModel, PreTrainedTokenizerFast)
from transformers.activations import GELUTanh
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

from conftest import (EOS, bf16_run, check_bf16_needs_a_gpu_that_has_it, check_evaluation_samples_as_saved,
                      read_scalars, run_one_and_two_processes, run_torchrun, torchrun_folder)
import ppo_rlhf_gpt2 as rlhf


def tiny_args(tiny, tmp_path, **overrides) -> rlhf.Args:
    defaults = dict(model_name=tiny["policy"], reward_model=tiny["reward"], runs_dir=str(tmp_path / "runs"),
                    cuda=False, batch_size=8, num_minibatches=2, total_episodes=16, response_length=8,
                    norm_batches=1, min_response_length=0, eval_episodes=0)
    defaults.update(overrides)
    return rlhf.Args(**defaults)


# ---------------------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("overrides, flag", [
    (dict(response_length=0), "--response-length"),
    (dict(batch_size=10, num_minibatches=4), "--batch-size"),
    (dict(batch_size=8, num_minibatches=2, gradient_accumulation_steps=3), "--gradient-accumulation-steps"),
    (dict(total_episodes=4), "--total-episodes"),
    (dict(temperature=0.0), "--temperature"),
    # a path that does not exist: caught by the argument checks, before any loading is tried
    (dict(model_name="/no/such/model/dir"), "--model-name /no/such/model/dir: no such directory"),
    (dict(model_name="./no/such/model/dir"), "--model-name ./no/such/model/dir: no such directory"),
    (dict(reward_model="./no/such/reward/dir"), "--reward-model ./no/such/reward/dir: no such directory"),
    (dict(prompts_file="/no/such/prompts.txt"), "--prompts-file /no/such/prompts.txt: no such file"),
    (dict(value_model="./no/such/value/dir"), "--value-model ./no/such/value/dir: no such directory"),
    (dict(eval_checkpoint="no/such/checkpoint"), "--eval-checkpoint no/such/checkpoint: no such directory"),
    (dict(min_response_length=8), "--min-response-length"),
    (dict(learning_rate=0.0), "--learning-rate"),
    (dict(learning_rate=-1e-5), "--learning-rate"),
    (dict(vf_learning_rate=0.0), "--vf-learning-rate"),
    (dict(gamma=1.5), "--gamma"),
    (dict(gamma=0.0), "--gamma"),
    (dict(gae_lambda=0.0), "--gae-lambda"),
    (dict(gae_lambda=-0.1), "--gae-lambda"),
    (dict(gae_lambda=1.5), "--gae-lambda"),
    (dict(clip_coef=0.0), "--clip-coef"),
    (dict(clip_coef=-0.2), "--clip-coef"),
    (dict(local_rollout_forward_batch_size=0), "--local-rollout-forward-batch-size"),
    (dict(kl_coef=0.0, kl_target=6.0), "--kl-coef"),
    (dict(max_grad_norm=0.0), "--max-grad-norm"),
    (dict(max_grad_norm=-1.0), "--max-grad-norm"),  # a negative clip norm would flip the gradient
    (dict(eval_every=-1), "--eval-every"),
    (dict(eval_split="train"), "--eval-split must be held_out, validation or test"),
    (dict(eval_split="test"), "--eval-split test: the unread held-out sums need --reward-model arithmetic"),
    (dict(reward_model="arithmetic", arithmetic_digits=1, eval_split="test"), "--arithmetic-digits 2 or more"),
    (dict(reward_model="arithmetic", arithmetic_digits=0), "--arithmetic-digits"),
    (dict(reward_model="arithmetic", prompts_file=__file__), "--prompts-file: --reward-model arithmetic"),
])
def test_bad_arguments_fail_before_loading(tiny, tmp_path, overrides, flag):
    start = time.time()
    with pytest.raises(SystemExit, match=flag):
        rlhf.main(tiny_args(tiny, tmp_path, **overrides))
    assert time.time() - start < 5
    assert not (tmp_path / "runs").exists()


def test_eval_checkpoint_that_is_not_a_whole_saved_policy_fails_before_any_work(tiny, tmp_path):
    """--eval-checkpoint: a folder that is not what --save-model writes, or a truncated copy of one, gives a
    one-line error naming the flag, before a model is loaded (not a traceback from deep inside transformers)."""
    saved = tmp_path / "saved"
    rlhf.save_policy(rlhf.load_policy(tiny["policy"], torch.device("cpu")), tiny["policy"], str(saved))
    rlhf.check_saved_policy(str(saved))  # the folder as written passes
    broken = {}
    for name, damage in [("empty", lambda d: [p.unlink() for p in d.iterdir()]),
                         ("other_script", lambda d: ([p.unlink() for p in d.iterdir()],
                                                     (d / "agent.pt").write_bytes(b"not a policy"))),
                         ("no_weights", lambda d: (d / "model.safetensors").unlink()),
                         ("no_tokenizer", lambda d: (d / "tokenizer_config.json").unlink()),
                         ("bad_config", lambda d: (d / "config.json").write_text('{"model_type": "gp')),
                         ("truncated", lambda d: (d / "model.safetensors").write_bytes(
                             (saved / "model.safetensors").read_bytes()[:-1000]))]:
        broken[name] = tmp_path / name
        shutil.copytree(saved, broken[name])
        damage(broken[name])
    for name, path in broken.items():
        start = time.time()
        with pytest.raises(SystemExit, match=f"^error: --eval-checkpoint {re.escape(str(path))}: not a policy "
                                             f"saved by --save-model \\(.+\\)$") as error:
            rlhf.main(tiny_args(tiny, tmp_path / "runs_of" / name, eval_checkpoint=str(path), eval_episodes=4))
        assert "\n" not in str(error.value), name
        assert time.time() - start < 5, name
    assert not (tmp_path / "runs_of").exists()


def test_unloadable_models_fail_fast_with_a_hint(tiny, tmp_path):
    for overrides, flag in [(dict(model_name="no-such-org/no-such-model"), "--model-name"),
                            (dict(reward_model="no-such-org/no-such-reward-model"), "--reward-model")]:
        start = time.time()
        with pytest.raises(SystemExit, match=f"{flag}.*local directory"):
            rlhf.main(tiny_args(tiny, tmp_path, **overrides))
        assert time.time() - start < 30  # no network retries: conftest.py sets HF_HUB_OFFLINE=1
    with pytest.raises(SystemExit, match="--stop-token"):
        rlhf.main(tiny_args(tiny, tmp_path, stop_token="a multi token stop"))
    with pytest.raises(SystemExit, match="--value-model.*vocabulary"):
        rlhf.main(tiny_args(tiny, tmp_path, value_model=str(tiny["root"] / "other_vocab")))
    with pytest.raises(SystemExit, match="--reward-label"):
        rlhf.main(tiny_args(tiny, tmp_path, reward_label=5))


def test_prompts(tmp_path):
    assert len(rlhf.PROMPTS) >= 64 and len(set(rlhf.PROMPTS)) == len(rlhf.PROMPTS)
    assert all(p.strip() == p and p for p in rlhf.PROMPTS)
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\n  second prompt  \n")
    assert rlhf.load_prompts(rlhf.Args(prompts_file=str(path))) == (["first prompt", "second prompt"],
                                                                    rlhf.EVAL_PROMPTS)
    assert rlhf.load_prompts(rlhf.Args()) == (rlhf.PROMPTS, rlhf.EVAL_PROMPTS)
    path.write_text("\n\n")
    with pytest.raises(SystemExit, match="--prompts-file"):
        rlhf.load_prompts(rlhf.Args(prompts_file=str(path)))


def test_tokenizer_gets_a_pad_token_distinct_from_eos(tiny):
    tokenizer, pad_token_id, stop_token_id = rlhf.load_tokenizer(tiny["policy"], "eos")
    assert pad_token_id is not None and pad_token_id != tokenizer.eos_token_id
    assert stop_token_id == tokenizer.eos_token_id
    assert tokenizer.padding_side == "left"
    _, _, dot_id = rlhf.load_tokenizer(tiny["policy"], ".")
    assert tokenizer.decode([dot_id]) == "."


# ---------------------------------------------------------------------------------------------- the math


def test_truncate_after_stop_token():
    stop, pad = 7, 99
    responses = torch.tensor([[1, 7, 2, 7], [1, 2, 3, 4], [7, 1, 1, 1]])
    truncated, response_mask, contain_stop = rlhf.truncate_after_stop_token(responses, stop, pad)
    assert truncated.tolist() == [[1, 7, pad, pad], [1, 2, 3, 4], [7, pad, pad, pad]]
    assert response_mask.tolist() == [[True, True, False, False], [True] * 4, [True, False, False, False]]
    assert contain_stop.tolist() == [True, False, True]
    assert torch.equal(responses, torch.tensor([[1, 7, 2, 7], [1, 2, 3, 4], [7, 1, 1, 1]]))  # input kept


def test_min_response_length_ignores_early_stop_tokens():
    stop, pad = 7, 99
    responses = torch.tensor([[7, 1, 7, 2, 2], [1, 7, 2, 2, 2], [1, 2, 7, 7, 2], [1, 2, 3, 4, 7]])
    truncated, response_mask, contain_stop = rlhf.truncate_after_stop_token(responses, stop, pad, 2)
    assert truncated.tolist() == [[7, 1, 7, pad, pad], [1, 7, 2, 2, 2], [1, 2, 7, pad, pad], [1, 2, 3, 4, 7]]
    assert contain_stop.tolist() == [True, False, True, True]  # the second one's only stop came too early
    assert response_mask.sum(1).tolist() == [3, 5, 3, 5]


@pytest.mark.parametrize("kl_estimator", ["k1", "k3"])
@pytest.mark.parametrize("missing_eos_penalty", [-1.0, None])
def test_per_token_rewards(kl_estimator, missing_eos_penalty):
    torch.manual_seed(0)
    responses = torch.tensor([[3, 5, 7, 3, 3], [3, 3, 3, 3, 3], [7, 5, 5, 5, 5]])  # stop token 7
    _, response_mask, contain_stop = rlhf.truncate_after_stop_token(responses, 7, 0)
    logprobs, ref_logprobs = -torch.rand(3, 5) * 3, -torch.rand(3, 5) * 3
    scores, kl_coef = torch.tensor([2.0, 3.0, -4.0]), 0.1
    rewards, kl, non_score_reward, penalized_scores = rlhf.compute_rewards(
        scores, contain_stop, missing_eos_penalty, logprobs, ref_logprobs, response_mask, kl_coef,
        kl_estimator)
    for i, last in enumerate([2, 4, 0]):
        for t in range(5):
            log_q = (ref_logprobs[i, t] - logprobs[i, t]).item()
            expected_kl = -log_q if kl_estimator == "k1" else math.exp(log_q) - 1 - log_q
            if t > last:  # after the stop token: nothing
                assert rewards[i, t] == 0 and kl[i, t] == 0 and non_score_reward[i, t] == 0
                continue
            assert kl[i, t].item() == pytest.approx(expected_kl, abs=1e-6)
            expected = -kl_coef * expected_kl
            if t == last:  # the score (or the EOS penalty) lands on the last real token only
                has_stop = i != 1
                expected += scores[i].item() if has_stop or missing_eos_penalty is None else missing_eos_penalty
            assert rewards[i, t].item() == pytest.approx(expected, abs=1e-6)
    expected_scores = scores.clone()
    if missing_eos_penalty is not None:
        expected_scores[1] = missing_eos_penalty  # only the response without the stop token is penalized
    assert torch.equal(penalized_scores, expected_scores)
    assert torch.equal(scores, torch.tensor([2.0, 3.0, -4.0]))  # the input is not penalized in place
    if kl_estimator == "k3":
        assert (kl >= 0).all()


def reference_gae(rewards, values, lengths, gamma, gae_lambda):
    """One response at a time, over its real tokens only; the value after the last real token is 0."""
    advantages = torch.zeros_like(rewards)
    for i, n in enumerate(lengths):
        running = 0.0
        for t in reversed(range(n)):
            next_value = values[i, t + 1].item() if t + 1 < n else 0.0
            delta = rewards[i, t].item() + gamma * next_value - values[i, t].item()
            running = delta + gamma * gae_lambda * running
            advantages[i, t] = running
    returns = advantages + values
    for i, n in enumerate(lengths):
        returns[i, n:] = 0
    return advantages, returns


@pytest.mark.parametrize("gamma, gae_lambda", [(1.0, 0.95), (0.9, 0.5)])
def test_gae_on_masked_sequences(gamma, gae_lambda):
    torch.manual_seed(1)
    lengths = [6, 1, 3, 4]
    response_mask = torch.arange(6) < torch.tensor(lengths).unsqueeze(1)
    rewards = torch.randn(4, 6).masked_fill(~response_mask, 0)
    values = torch.randn(4, 6)
    advantages, returns = rlhf.compute_gae(rewards, values, response_mask, gamma, gae_lambda)
    expected_advantages, expected_returns = reference_gae(rewards, values, lengths, gamma, gae_lambda)
    torch.testing.assert_close(advantages, expected_advantages)
    torch.testing.assert_close(returns, expected_returns)
    # values after the end of a response (whatever the value model says there) change nothing
    perturbed = values + 100.0 * ~response_mask
    torch.testing.assert_close(rlhf.compute_gae(rewards, perturbed, response_mask, gamma, gae_lambda)[0],
                               advantages)


def test_masked_whiten():
    torch.manual_seed(2)
    x = torch.randn(5, 7) * 3 + 2
    mask = torch.rand(5, 7) > 0.4
    whitened = rlhf.masked_whiten(x, mask)
    real = x[mask]
    torch.testing.assert_close(whitened[mask], (real - real.mean()) / real.std(), rtol=1e-4, atol=1e-4)
    assert (whitened[~mask] == 0).all()
    perturbed = torch.where(mask, x, torch.full_like(x, 1e6))
    torch.testing.assert_close(rlhf.masked_whiten(perturbed, mask), whitened)
    kept_mean = rlhf.masked_whiten(x, mask, shift_mean=False)
    assert kept_mean[mask].mean().item() == pytest.approx(real.mean().item(), abs=1e-4)
    assert kept_mean[mask].std().item() == pytest.approx(1.0, abs=1e-3)


def test_clipped_losses_against_explicit_formulas():
    torch.manual_seed(3)
    new_logprobs, logprobs = -torch.rand(2, 4), -torch.rand(2, 4)
    advantages, response_mask = torch.randn(2, 4), torch.ones(2, 4, dtype=torch.bool)
    pg_loss, ratio, _ = rlhf.policy_loss(new_logprobs, logprobs, advantages, response_mask, 0.2)
    # the ratio worked out here, not taken from policy_loss (a wrong ratio would move both sides)
    ratios = [math.exp(n - o) for n, o in zip(new_logprobs.flatten().tolist(), logprobs.flatten().tolist())]
    assert ratio.flatten().tolist() == pytest.approx(ratios, rel=1e-6)
    expected = [max(-a * r, -a * min(max(r, 0.8), 1.2)) for a, r in zip(advantages.flatten().tolist(), ratios)]
    assert pg_loss.item() == pytest.approx(sum(expected) / len(expected), abs=1e-6)
    new_values, values, returns = torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 4)
    v_loss = rlhf.value_loss(new_values, values, returns, response_mask, 0.2, True)
    expected = [max((nv - R) ** 2, (v + min(max(nv - v, -0.2), 0.2) - R) ** 2)
                for nv, v, R in zip(new_values.flatten().tolist(), values.flatten().tolist(), returns.flatten().tolist())]
    assert v_loss.item() == pytest.approx(0.5 * sum(expected) / len(expected), abs=1e-6)
    unclipped = rlhf.value_loss(new_values, values, returns, response_mask, 0.2, False)
    assert unclipped.item() == pytest.approx(0.5 * ((new_values - returns) ** 2).mean().item(), abs=1e-6)


def test_nothing_after_the_stop_token_influences_losses_or_gradients():
    """Perturb every per-token input after the stop token: rewards, advantages, losses and gradients stay."""
    torch.manual_seed(4)
    responses = torch.tensor([[3, 7, 3, 3, 3], [3, 3, 3, 3, 3], [3, 3, 3, 7, 3]])
    _, response_mask, contain_stop = rlhf.truncate_after_stop_token(responses, 7, 0)
    base = dict(logprobs=-torch.rand(3, 5), ref_logprobs=-torch.rand(3, 5), values=torch.randn(3, 5),
                new_logprobs=-torch.rand(3, 5), new_values=torch.randn(3, 5))
    perturbed = {k: v + 20.0 * torch.randn(3, 5) * ~response_mask for k, v in base.items()}

    def run(t):
        rewards, kl, _, _ = rlhf.compute_rewards(torch.tensor([1.0, 2.0, 3.0]), contain_stop, -1.0,
                                                 t["logprobs"], t["ref_logprobs"], response_mask, 0.1)
        advantages, returns = rlhf.compute_gae(rewards, t["values"], response_mask, 1.0, 0.95)
        advantages = rlhf.masked_whiten(advantages, response_mask)
        new_logprobs = t["new_logprobs"].clone().requires_grad_(True)
        new_values = t["new_values"].clone().requires_grad_(True)
        pg_loss, _, _ = rlhf.policy_loss(new_logprobs, t["logprobs"], advantages, response_mask, 0.2)
        v_loss = rlhf.value_loss(new_values, t["values"], returns, response_mask, 0.2, True)
        (pg_loss + 0.1 * v_loss).backward()
        return [rewards, kl.sum(1), advantages, returns, pg_loss, v_loss, new_logprobs.grad, new_values.grad]

    for a, b in zip(run(base), run(perturbed)):
        torch.testing.assert_close(a, b)
    grads = run(base)[-2:]
    assert all((g[~response_mask] == 0).all() and (g[response_mask] != 0).any() for g in grads)


def test_adaptive_kl_coef():
    assert rlhf.adaptive_kl_coef(0.1, 12.0, 6.0, 100, 10, 0.1) == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    assert rlhf.adaptive_kl_coef(0.1, 3.0, 6.0, 100, 10, 0.1) == pytest.approx(0.1 * (1 - 0.2 * 10 / 100))
    assert rlhf.adaptive_kl_coef(0.1, 6.6, 6.0, 100, 10, 0.1) == pytest.approx(0.1 * (1 + 0.1 * 10 / 100))
    # a batch much larger than the horizon: one step would be x(1 - 0.2 * 50) < 0 or x(1 + 0.2 * 50)
    assert rlhf.adaptive_kl_coef(0.1, 0.0, 6.0, 10, 500, 0.1) == pytest.approx(0.05)
    assert rlhf.adaptive_kl_coef(0.1, 60.0, 6.0, 10, 500, 0.1) == pytest.approx(0.2)
    # and however long the KL stays off target, the coefficient stays within 1/100 .. 100 x its start
    low = high = 0.1
    for _ in range(1000):
        low = rlhf.adaptive_kl_coef(low, 0.0, 6.0, 100, 10, 0.1)
        high = rlhf.adaptive_kl_coef(high, 60.0, 6.0, 100, 10, 0.1)
    assert low == pytest.approx(0.001) and high == pytest.approx(10.0)


def test_score_normalization():
    raw = torch.tensor([0.3, -1.2, 2.5, 0.7, 0.1])
    gain, bias = rlhf.score_normalization(raw)
    normalized = gain * raw + bias
    assert normalized.mean().item() == pytest.approx(0, abs=1e-6)
    assert normalized.std().item() == pytest.approx(1, abs=1e-6)
    # a constant reward has no scale: shifted to 0, gain 1 instead of 1e8
    assert rlhf.score_normalization(torch.full((8,), 0.42)) == pytest.approx((1.0, -0.42))


def test_value_head_starts_at_zero():
    value_model = rlhf.ValueModel(torch.nn.Identity(), 1023)
    assert (value_model.head.bias == 0).all() and (value_model.head.weight == 0).all()


# ---------------------------------------------------------------------------------------------- the models


def test_loaded_policy_uses_fused_gelu_and_computes_the_same_function(tiny):
    # GPT-2's "gelu_new" is swapped for torch's fused tanh GELU (less activation memory); the model must
    # still compute what the saved model computes
    policy = rlhf.load_policy(tiny["policy"], torch.device("cpu"))
    plain = AutoModelForCausalLM.from_pretrained(tiny["policy"]).eval()
    assert plain.config.activation_function == "gelu_new"
    activations = [m.act for m in policy.modules() if isinstance(m, GPT2MLP)]
    assert activations and all(isinstance(a, GELUTanh) for a in activations)
    assert not policy.training
    input_ids = torch.randint(0, policy.config.vocab_size, (3, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        new, old = policy(input_ids).logits, plain(input_ids).logits
    assert (new - old).abs().max() < 1e-4 * old.abs().max()


def test_sampling_logprobs_equal_training_forward_logprobs(tiny):
    """Left padding, position ids, temperature and dropout: the training forward pass over the whole padded
    sequence must give the log-probs the tokens were sampled with (ratio 1 before the first update)."""
    torch.manual_seed(5)
    tokenizer, pad_token_id, stop_token_id = rlhf.load_tokenizer(tiny["policy"], ".")
    policy = AutoModelForCausalLM.from_pretrained(tiny["policy"]).eval()
    prompts = rlhf.PROMPTS[:12]
    queries = tokenizer(prompts, padding=True, return_tensors="pt")["input_ids"]
    lengths = (queries != pad_token_id).sum(1)
    assert lengths.min() < lengths.max()  # the batch is really left-padded
    context_length = queries.shape[1]
    responses, logprobs = rlhf.generate(policy, queries, 10, 0.7, pad_token_id)
    responses, response_mask, _ = rlhf.truncate_after_stop_token(responses, stop_token_id, pad_token_id)
    query_responses = torch.cat([queries, responses], 1)
    real_responses = responses.masked_fill(~response_mask, 0)

    def training_logprobs(model, temperature=0.7):
        logits = rlhf.response_logits(model, query_responses, context_length, temperature, pad_token_id)
        return rlhf.gather_logprobs(logits, real_responses)

    new_logprobs = training_logprobs(policy)
    logratio = (new_logprobs - logprobs).masked_fill(~response_mask, 0)
    assert logratio.abs().max().item() < 1e-5
    ratio = logratio.exp()
    approx_kl = rlhf.masked_mean((ratio - 1) - logratio, response_mask)
    assert approx_kl.item() < 1e-6

    # Each sequence alone, without any padding, gives the same log-probs too.
    for i in (int(lengths.argmin()), int(lengths.argmax())):
        single = torch.cat([queries[i, context_length - lengths[i]:], responses[i]])[None]
        alone = rlhf.gather_logprobs(rlhf.response_logits(policy, single, int(lengths[i]), 0.7, pad_token_id),
                                     real_responses[i : i + 1])
        torch.testing.assert_close(alone.masked_fill(~response_mask[i], 0), logprobs[i : i + 1].masked_fill(
            ~response_mask[i], 0), atol=1e-5, rtol=0)

    # The check is sensitive to each detail: another temperature, dropout on, or default position ids differ.
    assert (training_logprobs(policy, 1.0) - logprobs).masked_fill(~response_mask, 0).abs().max() > 1e-2
    policy.train()
    assert (training_logprobs(policy) - logprobs).masked_fill(~response_mask, 0).abs().max() > 1e-2
    policy.eval()
    inputs = rlhf.model_inputs(query_responses, query_responses != pad_token_id)
    del inputs["position_ids"]
    logits = policy(**inputs).logits[:, context_length - 1 : -1] / 0.7
    default_positions = rlhf.gather_logprobs(logits, real_responses)
    assert (default_positions - logprobs).masked_fill(~response_mask, 0).abs().max() > 1e-2


def test_main_first_minibatch_ratio_one_logging_and_save(tiny, tmp_path):
    # One epoch over one minibatch (two accumulated micro-batches): every forward pass of the update comes
    # before the optimizer step, so each is a "first minibatch of the first epoch".
    args = tiny_args(tiny, tmp_path, batch_size=8, num_minibatches=1, gradient_accumulation_steps=2,
                     update_epochs=1, total_episodes=16, temperature=0.7, stop_token=".", save_model=True,
                     log_samples_every=1)
    stats = rlhf.main(args)
    scalars = read_scalars(stats["run_dir"])
    shared = ["charts/learning_rate", "charts/SPS", "charts/episodic_length",
              "losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/old_approx_kl",
              "losses/approx_kl", "losses/clipfrac", "losses/explained_variance"]
    rlhf_tags = ["objective/scores", "objective/kl", "objective/kl_coef", "objective/non_score_reward",
                 "objective/rlhf_reward", "objective/response_entropy", "val/num_eos_tokens"]
    for tag in shared + rlhf_tags:
        assert len(scalars[tag]) == 2, tag
    # the episode's return is objective/rlhf_reward, score plus KL penalty (charts/episodic_return would
    # log the same number); objective/response_entropy is -log pi summed over the sampled response, per
    # response, and losses/entropy the entropy of the next-token distribution, per token
    assert "charts/episodic_return" not in scalars and "objective/entropy" not in scalars
    for rlhf_reward, score, non_score_reward in zip(scalars["objective/rlhf_reward"],
                                                    scalars["objective/scores"],
                                                    scalars["objective/non_score_reward"]):
        assert rlhf_reward == pytest.approx(score + non_score_reward, abs=1e-5)
    for response_entropy, length, entropy in zip(scalars["objective/response_entropy"],
                                                 scalars["charts/episodic_length"],
                                                 scalars["losses/entropy"]):
        # a near-uniform tiny policy: -log pi of a sampled token is close to the distribution's entropy
        assert response_entropy / length == pytest.approx(entropy, rel=0.1)
    for approx_kl, old_approx_kl, ratio, clipfrac in zip(scalars["losses/approx_kl"], scalars["losses/old_approx_kl"],
                                                         scalars["val/ratio"], scalars["losses/clipfrac"]):
        assert 0 <= approx_kl < 1e-6 and abs(old_approx_kl) < 1e-5
        assert abs(ratio - 1) < 1e-5 and clipfrac == 0
    assert scalars["objective/kl"][0] == pytest.approx(0, abs=1e-4)  # the policy is the reference at first
    events = EventAccumulator(stats["run_dir"])
    events.Reload()
    assert {"hyperparameters/text_summary", "samples/text_summary"} <= set(events.Tags()["tensors"])
    sample_table = events.Tensors("samples/text_summary")[0].tensor_proto.string_val[0].decode()
    assert sample_table.startswith("|query|response|score|")

    # save / load round trip: the saved directory loads with from_pretrained and is a valid --model-name
    model_dir = Path(stats["run_dir"]) / "model"
    saved = AutoModelForCausalLM.from_pretrained(model_dir)
    initial = AutoModelForCausalLM.from_pretrained(tiny["policy"])
    assert any(not torch.equal(a, b) for a, b in zip(saved.parameters(), initial.parameters()))
    assert_usable_as_saved(model_dir)
    again = rlhf.main(tiny_args(tiny, tmp_path / "again", model_name=str(model_dir), total_episodes=8,
                                num_minibatches=1, update_epochs=1, normalize_scores=False))
    assert math.isfinite(again["objective/scores"])


def test_bf16_runs_the_models_in_bfloat16_with_a_first_ratio_of_exactly_1(tiny, tmp_path, monkeypatch):
    """--bf16 (detail 53), one iteration of one minibatch in 4 micro-batches, one epoch: every pass of the update
    comes before the optimizer step and the policy is the reference, so the ratio is exactly 1 and the KL
    exactly 0 (the old log-probs and the reference's recomputed by passes of the update's shape: with responses
    of 16 tokens, the sampling's cached bf16 passes give other log-probs); the policy, the reference and the
    value model ran in bfloat16, the reward model in fp32, and the weights and Adam's state stayed fp32."""
    args = tiny_args(tiny, tmp_path, bf16=True, num_minibatches=1, gradient_accumulation_steps=4,
                     update_epochs=1, total_episodes=8, response_length=16)
    scalars, outputs, steps = bf16_run(rlhf, args, monkeypatch)
    # the value model's backbone in bfloat16, its scalar head in fp32 (as the reward model's)
    assert outputs == {"policy": {torch.bfloat16}, "value_model": {torch.bfloat16, torch.float32},
                       "reward": {torch.float32}}
    assert steps == [{torch.float32}]
    assert scalars["val/ratio"] == [1.0] and scalars["objective/kl"] == [0.0]
    assert scalars["losses/approx_kl"] == scalars["losses/old_approx_kl"] == scalars["losses/clipfrac"] == [0.0]


def test_bf16_keeps_log_probs_and_values_in_fp32_through_gae_and_the_losses(tiny, tmp_path, monkeypatch):
    """--bf16, two iterations: the log-probs the ratio is made of and the values GAE reads are float32 and not all
    on the bf16 grid (8 significant bits), once the value head has moved from its zeros."""
    seen = {"values": [], "newlogprob": []}
    real_gae, real_loss = rlhf.compute_gae, rlhf.policy_loss
    monkeypatch.setattr(rlhf, "compute_gae", lambda rewards, values, *a: seen["values"].append(values.clone())
                        or real_gae(rewards, values, *a))
    monkeypatch.setattr(rlhf, "policy_loss", lambda newlogprob, *a: seen["newlogprob"].append(newlogprob.detach())
                        or real_loss(newlogprob, *a))
    rlhf.main(tiny_args(tiny, tmp_path, bf16=True, total_episodes=16, batch_size=8, num_minibatches=1,
                        update_epochs=1))
    for name, tensors in seen.items():
        last = tensors[-1]
        assert last.dtype == torch.float32, name
        assert not torch.equal(last, last.bfloat16().float()), f"{name} on the bf16 grid"


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_eval_checkpoint_of_the_starting_model_reads_a_kl_of_exactly_0(tiny, tmp_path, bf16):
    """The saved policy is its own starting model: its KL to it, both sides' log-probs by the same passes, is 0
    to the bit, in bfloat16 too (the sampler's cached passes would give other log-probs)."""
    saved = tmp_path / "saved"
    rlhf.save_policy(rlhf.load_policy(tiny["policy"], torch.device("cpu")), tiny["policy"], str(saved),
                     tiny_args(tiny, tmp_path))
    result = rlhf.main(tiny_args(tiny, tmp_path, bf16=bf16, eval_checkpoint=str(saved), eval_episodes=8,
                                 response_length=16))
    assert result["eval"]["final"]["kl_mean"] == 0.0 and result["eval"]["final"]["kl_stderr"] == 0.0


def test_bf16_eval_checkpoint_scores_in_bfloat16(tiny, tmp_path, monkeypatch):
    """--eval-checkpoint with --bf16: the saved policy and its starting model (the KL's reference) in bfloat16,
    the reward model in fp32; nothing trained."""
    saved = tmp_path / "saved"
    rlhf.save_policy(rlhf.load_policy(tiny["policy"], torch.device("cpu")), tiny["policy"], str(saved),
                     tiny_args(tiny, tmp_path))
    _, outputs, steps = bf16_run(rlhf, tiny_args(tiny, tmp_path, bf16=True, eval_checkpoint=str(saved),
                                                 eval_episodes=4), monkeypatch)
    assert outputs == {"policy": {torch.bfloat16}, "reward": {torch.float32}} and steps == []


def test_bf16_on_a_gpu_without_it_fails_before_any_work(tiny, tmp_path, monkeypatch):
    check_bf16_needs_a_gpu_that_has_it(rlhf.main, tiny_args(tiny, tmp_path, bf16=True, cuda=True), tmp_path / "runs",
                                       monkeypatch)


def assert_usable_as_saved(model_dir):
    """A saved policy folder works with plain transformers: tokenizer and model from_pretrained, then
    generate on a left-padded batch (a pad id outside the embedding would raise IndexError here)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert tokenizer.padding_side == "left"
    batch = tokenizer(["This movie was", "I went into this film expecting a lot and"], padding=True,
                      return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # really padded
    assert batch["input_ids"].max() < model.get_input_embeddings().num_embeddings
    output = model.generate(**batch, max_new_tokens=4, do_sample=False)
    assert output.shape == (2, batch["input_ids"].shape[1] + 4)


def test_ctrl_c_keeps_logs_and_saves(tiny, tmp_path, interrupted_generation):
    # generate's calls: 1 for the score statistics (norm_batches=1), 2 in iteration 1, 3 in iteration 2
    interrupted_generation(rlhf, rlhf.main, tiny_args(tiny, tmp_path, total_episodes=24, save_model=True), calls=3)


def test_ctrl_c_while_saving_closes_the_logs(tiny, tmp_path, interrupted_save):
    # a Ctrl-C while --save-model writes the policy: the run returns normally and both iterations are in the
    # closed TensorBoard file (the writer flushes only every 120 s unless closed)
    stats, calls = interrupted_save(GPT2LMHeadModel, rlhf.main, tiny_args(tiny, tmp_path, save_model=True))
    assert calls == 1
    scores = read_scalars(stats["run_dir"])["objective/scores"]
    assert len(scores) == 2 and scores[-1] == pytest.approx(stats["objective/scores"])


def tiny_reward_folder(tiny, path, seed: int, **config):
    """A one-layer scalar reward model with reward_model_gpt2.py's config fields, saved to `path` with the
    policy's tokenizer padding on the right with its EOS. Returns (tokenizer, model)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny["policy"])
    tokenizer.pad_token, tokenizer.padding_side = EOS, "right"
    torch.manual_seed(seed)
    model = GPT2ForSequenceClassification(GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32,
                                                     n_layer=1, n_head=2, num_labels=1,
                                                     pad_token_id=tokenizer.pad_token_id)).eval()
    for name, value in config.items():
        setattr(model.config, name, value)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return tokenizer, model


@pytest.mark.parametrize("script", ["ppo_rlhf_gpt2", "grpo_gpt2"])  # one load_reward_fn, in both RL files
def test_reward_model_folder_with_an_end_token_is_read_at_that_token(script, tiny, tmp_path):
    """A reward_model_gpt2.py folder whose config names reward_end_token: every text gets that token appended
    and is scored there, also where the end token is the pad token (transformers' own readout would then
    skip it and read the token before), plus config.reward_bias; texts of different lengths, padded."""
    tokenizer, model = tiny_reward_folder(tiny, tmp_path / "rm", 3, reward_end_token=EOS, reward_bias=0.5)
    texts = ["This movie was great.", "The acting in this one is bad, and the plot of this movie is worse."]
    module = importlib.import_module(script)
    reward_fn = module.load_reward_fn(module.Args(reward_model=str(tmp_path / "rm")), torch.device("cpu"))
    scores = reward_fn(texts, ["", ""])
    for text, score in zip(texts, scores.tolist()):
        ids = tokenizer(text + EOS, return_tensors="pt")["input_ids"]  # alone: no padding
        assert ids[0, -1].item() == tokenizer.eos_token_id
        with torch.no_grad():
            hidden = model.transformer(input_ids=ids).last_hidden_state[0]
            at_end, before = (model.score(hidden[i]).item() + 0.5 for i in (-1, -2))
        assert score == pytest.approx(at_end, abs=1e-5) and abs(score - before) > 1e-4


@pytest.mark.parametrize("script", ["ppo_rlhf_gpt2", "grpo_gpt2"])  # one load_reward_fn, in both RL files
def test_reward_model_folder_with_the_mean_readout_averages_the_response_and_its_end_token(script, tiny, tmp_path):
    """config.reward_readout `mean` (reward_model_gpt2.py's default): the head on the mean final state over the
    response's tokens and the appended end token, the query's tokens left out; the response found as the end
    of the text; texts of different lengths padded together, and an empty response (the end token alone)."""
    tokenizer, model = tiny_reward_folder(tiny, tmp_path / "rm", 4, reward_end_token=EOS, reward_readout="mean",
                                          reward_bias=-0.25)
    queries = ["This movie was", "The acting in this one is bad, and the plot", "I"]
    responses = [" great.", " of this movie is worse, much worse.", ""]
    module = importlib.import_module(script)
    reward_fn = module.load_reward_fn(module.Args(reward_model=str(tmp_path / "rm")), torch.device("cpu"))
    scores = reward_fn([q + r for q, r in zip(queries, responses)], responses)
    for query, response, score in zip(queries, responses, scores.tolist()):
        query_ids, ids = tokenizer(query)["input_ids"], tokenizer(query + response + EOS)["input_ids"]
        assert ids[: len(query_ids)] == query_ids  # the query's tokens are the text's first ones
        with torch.no_grad():
            hidden = model.transformer(input_ids=torch.tensor([ids])).last_hidden_state[0]
            mean = model.score(hidden[len(query_ids) :].mean(0)).item() - 0.25
            whole, at_end = model.score(hidden.mean(0)).item() - 0.25, model.score(hidden[-1]).item() - 0.25
        assert score == pytest.approx(mean, abs=1e-5) and abs(score - whole) > 1e-4
        assert abs(score - at_end) > 1e-4 if response else score == pytest.approx(at_end, abs=1e-5)


def test_vader_reward():
    reward_fn = rlhf.load_reward_fn(rlhf.Args(reward_model="vader"), torch.device("cpu"))
    scores = reward_fn(["This movie was wonderful, I loved it.", "This movie was terrible and boring."],
                       [" wonderful, I loved it.", " terrible and boring."])
    assert scores[0] > 0 > scores[1]


def test_length_reward_counts_the_characters_of_the_response_only():
    reward_fn = rlhf.load_reward_fn(rlhf.Args(reward_model="length", response_length=8), torch.device("cpu"))
    scores = reward_fn(["a long query and abc", "query"], ["abc", "defghijkl"])
    assert scores.tolist() == pytest.approx([3 / 8, 9 / 8])


@pytest.mark.parametrize("response, reward", [
    (" 7.", 1.0), (" 7", 1.0), ("7 apples", 1.0), (" 07.", 1.0), (" 7.0", 1.0),  # right
    (" 8.", -1.0), (" 70", -1.0), (" -7", -1.0), (" 7.5", -1.0),  # wrong: another number
    (" seven.", -1.0), ("", -1.0), (" the sum.", -1.0),  # missing: no number at all
    (" 7, not 8.", 1.0), (" 8, no, 7.", -1.0),  # several numbers: the first one counts
])
def test_verifier_scores_the_first_number_of_the_response(response, reward):
    assert rlhf.verify_sum("What is 3 + 4? The answer is" + response, response) == reward


def test_verifier_reads_the_question_of_each_text():
    reward_fn = rlhf.load_reward_fn(rlhf.Args(reward_model="arithmetic"), torch.device("cpu"))
    texts = ["What is 12 + 30? The answer is 42.", "What is 12 + 30? The answer is 4", "What is 9 + 9? The answer is 18"]
    assert reward_fn(texts, [" 42.", " 4", " 18"]).tolist() == [1.0, -1.0, 1.0]


@pytest.mark.parametrize("digits", [1, 2])
def test_arithmetic_problems_split_once_disjoint_with_both_orders_on_one_side(digits):
    random.seed(123)  # the split must not depend on the global random state (or on --seed)
    train, held_out = rlhf.arithmetic_problems(digits, held_out=False), rlhf.arithmetic_problems(digits, True)
    random.seed(456)
    assert rlhf.arithmetic_problems(digits, held_out=False) == train
    assert rlhf.arithmetic_problems(digits, held_out=True) == held_out
    operands = range(10) if digits == 1 else range(10, 100)
    everything = {f"What is {a} + {b}? The answer is" for a in operands for b in operands}
    assert len(train) == len(set(train)) and len(held_out) == len(set(held_out))
    assert set(train) | set(held_out) == everything and not set(train) & set(held_out)
    assert 0.2 < len(held_out) / len(everything) < 0.3
    for prompt in held_out:  # a + b held out means b + a is held out too: no problem is seen in mirror
        a, b = prompt.split()[2], prompt.split()[4][:-1]
        assert f"What is {b} + {a}? The answer is" in held_out
    assert train[:20] != sorted(train[:20])  # shuffled, not in order


@pytest.mark.parametrize("name", ["ppo_rlhf_gpt2", "grpo_gpt2", "reward_model_gpt2", "dpo_gpt2"])
def test_greedy_decoding_takes_the_most_likely_token(tiny, name):
    """generate() of each language-model file (one contract): greedy, every token the argmax after its context
    (read by ppo_rlhf_gpt2's full forward pass), its log-probs those of the argmax; sampling by default."""
    generate = importlib.import_module(name).generate
    torch.manual_seed(3)
    tokenizer, pad_token_id, _ = rlhf.load_tokenizer(tiny["policy"], ".")
    policy = AutoModelForCausalLM.from_pretrained(tiny["policy"]).eval()
    queries = tokenizer(rlhf.PROMPTS[:6], padding=True, return_tensors="pt")["input_ids"]
    responses, logprobs = generate(policy, queries, 6, 0.7, pad_token_id, greedy=True)
    again, _ = generate(policy, queries, 6, 0.7, pad_token_id, greedy=True)
    assert torch.equal(responses, again)
    # the full forward pass over query + response: every response token is the argmax after its context
    logits = rlhf.response_logits(policy, torch.cat([queries, responses], 1), queries.shape[1], 0.7,
                                  pad_token_id)
    assert torch.equal(logits.argmax(-1), responses)
    torch.testing.assert_close(logprobs, logits.log_softmax(-1).max(-1).values, atol=1e-5, rtol=0)
    sampled, _ = generate(policy, queries, 6, 0.7, pad_token_id)
    assert not torch.equal(sampled, responses)  # sampling (the default) is not greedy


def first_number(text: str):
    """The first number in a text, read character by character (an independent reading of the verifier's rule)."""
    start = next((i for i, c in enumerate(text) if c.isdigit()), None)
    if start is None:
        return None
    end = start
    while end < len(text) and text[end].isdigit():
        end += 1
    if end + 1 < len(text) and text[end] == "." and text[end + 1].isdigit():
        end += 1
        while end < len(text) and text[end].isdigit():
            end += 1
    return float(text[start:end]) * (-1 if start > 0 and text[start - 1] == "-" else 1)


def test_arithmetic_task_end_to_end(tiny, tmp_path, capsys):
    """The verifiable-reward task on a tiny model: held-out accuracy before, during (every iteration) and
    after training, sampled and greedy, in TensorBoard, in the returned stats and in the printed summary."""
    stats = rlhf.main(tiny_args(tiny, tmp_path, reward_model="arithmetic", total_episodes=24, eval_episodes=30,
                                eval_every=1, eval_greedy=True, response_length=4))
    held_out = set(rlhf.arithmetic_problems(1, held_out=True))
    evaluations = stats["eval"]
    assert set(evaluations) >= {"initial", "iteration_1", "iteration_2", "final", "initial_greedy",
                                "iteration_1_greedy", "iteration_2_greedy", "final_greedy"}
    for name, result in evaluations.items():
        if not isinstance(result, dict):
            continue
        assert len(result["samples"]) == 30 and {q for q, _ in result["samples"]} <= held_out
        for (query, response), score in zip(result["samples"], result["raw_scores"]):
            a, b = int(query.split()[2]), int(query.split()[4][:-1])
            assert score == (1.0 if first_number(response) == a + b else -1.0)
        # counted over problems: the 30 responses answer 24 problems, 6 of them twice (each of those counts
        # once, with its share of right answers), the standard error is over the 24
        per_problem = {}
        for (query, _), score in zip(result["samples"], result["raw_scores"]):
            per_problem.setdefault(query, []).append(score > 0)
        shares = [statistics.mean(r) for r in per_problem.values()]
        assert len(shares) == result["prompts"] == 24
        assert result["accuracy"] == pytest.approx(statistics.mean(shares))
        assert result["accuracy_stderr"] == pytest.approx(statistics.stdev(shares) / 24 ** 0.5)
    greedy = evaluations["final_greedy"]
    answers = {}
    for query, response in greedy["samples"]:  # prompts 0-5 come twice: greedy gives the same answer
        assert answers.setdefault(query, response) == response
    scalars = read_scalars(stats["run_dir"])
    for tag, suffix in [("eval/accuracy", ""), ("eval/greedy_accuracy", "_greedy")]:
        assert scalars[tag] == pytest.approx([evaluations[w + suffix]["accuracy"] for w in
                                              ("initial", "iteration_1", "iteration_2", "final")])
    printed = capsys.readouterr().out
    assert "held-out accuracy: " in printed and "held-out accuracy, greedy: " in printed


def test_arithmetic_task_without_greedy_evaluation_ends_with_the_sampled_accuracy(tiny, tmp_path, capsys):
    """The README's RLVR command has no --eval-greedy: the final summary prints the sampled accuracy only
    (it once looked up the greedy evaluation that was never made, and crashed after training)."""
    stats = rlhf.main(tiny_args(tiny, tmp_path, reward_model="arithmetic", total_episodes=8, eval_episodes=10,
                                response_length=4))
    assert set(stats["eval"]) == {"initial", "final", "normalized_score_change"}
    printed = capsys.readouterr().out
    final = stats["eval"]["final"]["accuracy"]
    assert f"-> {final:.1%}" in printed.split("held-out accuracy: ")[1].splitlines()[0]
    assert "greedy" not in printed


# ---------------------------------------------------------------------------------------------- learning


def count_e_reward(args, device):
    """A fixed programmatic reward: the number of letters 'e' in the text (query + response)."""
    return lambda texts, responses: torch.tensor([float(t.count("e")) for t in texts], device=device)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])  # detail 53: --bf16 learns too
def test_learning_raises_the_score_and_kl_coef_bounds_the_kl(tiny, tmp_path, monkeypatch, bf16):
    monkeypatch.setattr(rlhf, "load_reward_fn", count_e_reward)
    common = dict(batch_size=32, num_minibatches=2, total_episodes=32 * 25, response_length=12,
                  learning_rate=3e-3, norm_batches=2, kl_target=None, stop_token="eos", missing_eos_penalty=None,
                  bf16=bf16)
    runs = {}
    for kl_coef in (0.01, 1.0):
        stats = rlhf.main(tiny_args(tiny, tmp_path / f"kl{kl_coef}", kl_coef=kl_coef, **common))
        runs[kl_coef] = read_scalars(stats["run_dir"])
    weak, strong = runs[0.01], runs[1.0]
    scores = weak["objective/scores"]  # normalized: the initial policy's have mean 0, std 1
    first, last = sum(scores[:3]) / 3, sum(scores[-5:]) / 5
    print(f"scores first 3 iterations {first:.3f}, last 5 {last:.3f}; final KL {weak['objective/kl'][-1]:.3f} "
          f"(kl_coef 0.01) vs {strong['objective/kl'][-1]:.3f} (kl_coef 1.0)")
    assert last - first > 1.0
    kl_weak, kl_strong = sum(weak["objective/kl"][-5:]) / 5, sum(strong["objective/kl"][-5:]) / 5
    assert math.isfinite(kl_weak) and kl_weak > 0
    assert kl_strong < 0.3 * kl_weak


# ---------------------------------------------------------------------------------------------- wiring


def test_stop_token_is_the_id_used_inside_text(tmp_path):
    """A SentencePiece-style tokenizer encodes "." alone as the word-initial "▁.", but inside text (what the
    policy samples after a word) as "."; the stop token must be the second."""
    texts = ["a word . and . more .", "the end. it was good. it was bad."] * 20
    sp = Tokenizer(models.BPE(unk_token="<unk>"))
    sp.pre_tokenizer = pre_tokenizers.Metaspace()
    sp.decoder = decoders.Metaspace()
    sp.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", EOS],
                                                      show_progress=False))
    hf = PreTrainedTokenizerFast(tokenizer_object=sp, eos_token=EOS, unk_token="<unk>")
    hf.save_pretrained(tmp_path)
    alone = hf.encode(".", add_special_tokens=False)
    inside = hf.encode("x.", add_special_tokens=False)
    assert len(alone) == 1 and alone != inside[-1:]  # the two ids really differ for this tokenizer
    _, _, stop_token_id = rlhf.load_tokenizer(str(tmp_path), ".")
    assert stop_token_id == inside[-1]
    with pytest.raises(SystemExit, match="--stop-token 'end. it'"):
        rlhf.load_tokenizer(str(tmp_path), "end. it")


def test_value_alignment_and_left_padding_invariance(tiny):
    """V(s_t) for response token t is read where the logits that sampled t are read: it depends on the query
    and the tokens before t, not on t itself nor on left padding."""
    torch.manual_seed(6)
    tokenizer, pad_token_id, _ = rlhf.load_tokenizer(tiny["policy"], ".")
    policy = rlhf.load_policy(tiny["policy"], torch.device("cpu"))
    value_model = rlhf.load_value_model(None, policy, torch.device("cpu"))
    torch.nn.init.normal_(value_model.head.weight)  # a trained head: a zero head would make every check pass
    queries = tokenizer(rlhf.PROMPTS[:6], padding=True, return_tensors="pt")["input_ids"]
    context_length = queries.shape[1]
    responses = torch.randint(0, policy.config.vocab_size, (6, 5))
    with torch.no_grad():
        values = rlhf.response_values(value_model, torch.cat([queries, responses], 1), context_length, pad_token_id)
        assert values.shape == (6, 5)
        changed = responses.clone()
        changed[:, 2] = (changed[:, 2] + 1) % policy.config.vocab_size
        values_changed = rlhf.response_values(value_model, torch.cat([queries, changed], 1), context_length,
                                              pad_token_id)
        torch.testing.assert_close(values_changed[:, :3], values[:, :3])  # V(s_0..s_2) do not see token 2
        assert (values_changed[:, 3] - values[:, 3]).abs().min() > 0  # V(s_3) does
        for i in range(6):
            query = queries[i][queries[i] != pad_token_id]
            alone = rlhf.response_values(value_model, torch.cat([query, responses[i]])[None], len(query),
                                         pad_token_id)
            torch.testing.assert_close(alone[0], values[i], atol=1e-5, rtol=0)


def test_value_model_from_another_model(tiny):
    """--value-model: the critic's backbone is the reward model's (as in the N+ paper), with a new zero head."""
    policy = rlhf.load_policy(tiny["policy"], torch.device("cpu"))
    value_model = rlhf.load_value_model(tiny["reward"], policy, torch.device("cpu"))
    reward_model = GPT2ForSequenceClassification.from_pretrained(tiny["reward"])
    reward_state = reward_model.transformer.state_dict()
    assert len(reward_state) > 0
    for name, tensor in value_model.backbone.state_dict().items():
        assert torch.equal(tensor, reward_state[name]), name
    assert (value_model.head.weight == 0).all() and not value_model.training


@pytest.fixture
def stops_at_lengths_1_to_8(tiny, monkeypatch):
    """A random tiny policy rarely samples ".": put one at position i % 8 of response i, so that a batch of 8
    (with stop token ".") has responses of 1 to 8 real tokens. The log-probs stay those of the sampled tokens."""
    real_generate, (_, _, dot) = rlhf.generate, rlhf.load_tokenizer(tiny["policy"], ".")

    def generate(*a, **kw):
        responses, logprobs = real_generate(*a, **kw)
        responses = responses.clone()
        responses[torch.arange(len(responses)), torch.arange(len(responses)) % responses.shape[1]] = dot
        return responses, logprobs

    monkeypatch.setattr(rlhf, "generate", generate)


def test_gradient_accumulation_gives_the_update_of_one_micro_batch(tiny, tmp_path, stops_at_lengths_1_to_8):
    """One minibatch in 1 or in 4 micro-batches (of different numbers of real tokens): the same update."""
    deltas = []
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny["policy"]).named_parameters())
    for steps in (1, 4):
        stats = rlhf.main(tiny_args(tiny, tmp_path / str(steps), total_episodes=8, num_minibatches=1,
                                    update_epochs=1, gradient_accumulation_steps=steps, learning_rate=1e-3,
                                    stop_token=".", save_model=True))
        saved = AutoModelForCausalLM.from_pretrained(Path(stats["run_dir"]) / "model")
        deltas.append({name: p.detach() - initial[name].detach() for name, p in saved.named_parameters()})
        assert stats["charts/episodic_length"] < 8  # responses of different lengths: weighting matters
    assert any(d.abs().max() > 1e-4 for d in deltas[0].values())
    for name in deltas[0]:
        torch.testing.assert_close(deltas[1][name], deltas[0][name], atol=2e-6, rtol=1e-3)


@pytest.mark.parametrize("norm_adv", [True, False])
def test_the_update_sees_whitened_advantages_of_real_tokens(tiny, tmp_path, monkeypatch, norm_adv,
                                                            stops_at_lengths_1_to_8):
    """Over one epoch the policy loss sees every real token's advantage once: whitened over the real tokens of
    the whole batch (mean 0, std 1; padding does not count), or as GAE gave them with --no-norm-adv."""
    real_policy_loss, real_compute_gae = rlhf.policy_loss, rlhf.compute_gae
    seen, gae = [], []

    def policy_loss(newlogprob, logprobs, advantages, response_mask, clip_coef):
        seen.append(advantages[response_mask])
        return real_policy_loss(newlogprob, logprobs, advantages, response_mask, clip_coef)

    def compute_gae(rewards, values, response_mask, *a):
        advantages, returns = real_compute_gae(rewards, values, response_mask, *a)
        gae.append(advantages[response_mask])
        return advantages, returns

    monkeypatch.setattr(rlhf, "policy_loss", policy_loss)
    monkeypatch.setattr(rlhf, "compute_gae", compute_gae)
    rlhf.main(tiny_args(tiny, tmp_path, total_episodes=8, update_epochs=1, missing_eos_penalty=None,
                        norm_adv=norm_adv))
    seen = torch.cat(seen)
    assert len(seen) == len(gae[0]) == sum(range(1, 9))
    if norm_adv:
        assert seen.mean().item() == pytest.approx(0, abs=1e-5) and seen.std().item() == pytest.approx(1, abs=1e-4)
    else:
        torch.testing.assert_close(seen.sort().values, gae[0].sort().values)


def test_main_passes_each_quantity_where_it_belongs(tiny, tmp_path, monkeypatch, stops_at_lengths_1_to_8):
    """The glue of main(), checked where a wrong wiring differs: a reward that varies, responses of 1 to 8 real
    tokens (padding placed by construction), a second iteration (values no longer 0), reward whitening on.
    Expected values are computed here from the recorded inputs, never by the script's own helpers."""
    monkeypatch.setattr(rlhf, "load_reward_fn", count_e_reward)
    calls = {name: [] for name in ("sample", "compute_rewards", "compute_gae", "value_loss", "clip", "adam")}

    def record(name, function, keep):
        def wrapper(*a, **kw):
            out = function(*a, **kw)
            calls[name].append(keep(a, out))
            return out
        return wrapper

    monkeypatch.setattr(rlhf, "sample_and_score", record("sample", rlhf.sample_and_score, lambda a, out: out))
    monkeypatch.setattr(rlhf, "compute_rewards", record("compute_rewards", rlhf.compute_rewards,
                                                        lambda a, out: (a[0], out[0], a[5])))
    monkeypatch.setattr(rlhf, "compute_gae", record("compute_gae", rlhf.compute_gae, lambda a, out: (a, out)))
    monkeypatch.setattr(rlhf, "value_loss", record("value_loss", rlhf.value_loss, lambda a, out: a[2]))
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", record("clip", torch.nn.utils.clip_grad_norm_,
                                                                  lambda a, out: {id(p) for p in a[0]}))
    real_adam = torch.optim.Adam

    def adam(param_groups, **kw):
        param_groups = list(param_groups)
        calls["adam"].append({id(p) for group in param_groups for p in group["params"]})
        return real_adam(param_groups, **kw)

    monkeypatch.setattr(torch.optim, "Adam", adam)
    stats = rlhf.main(tiny_args(tiny, tmp_path, total_episodes=16, update_epochs=2, num_minibatches=2,
                                whiten_rewards=True, missing_eos_penalty=None, kl_coef=0.5, kl_target=None,
                                learning_rate=1e-3))
    scalars = read_scalars(stats["run_dir"])
    norm_raw, rollouts = calls["sample"][0][4], calls["sample"][1:]
    assert len(rollouts) == 2 and norm_raw.std() > 0
    gain = 1 / statistics.stdev(norm_raw.tolist())
    bias = -statistics.fmean(norm_raw.tolist()) * gain
    for (_, _, mask, _, raw), (scores, rewards, reward_mask), ((gae_rewards, values, gae_mask, *_), (_, returns)) \
            in zip(rollouts, calls["compute_rewards"], calls["compute_gae"]):
        # the normalized score is gain * raw + bias, with the gain and bias of the initial policy's samples
        torch.testing.assert_close(scores, gain * raw + bias, rtol=1e-5, atol=1e-5)
        assert torch.equal(reward_mask, mask) and torch.equal(gae_mask, mask)
        # --whiten-rewards: the real tokens' rewards get std 1 and keep their mean (lm-human-preferences)
        real, whitened = rewards[mask].double(), gae_rewards[mask].double()
        assert abs(real.mean()) > 1e-3
        assert whitened.mean().item() == pytest.approx(real.mean().item(), abs=1e-5)
        assert whitened.std().item() == pytest.approx(1, rel=1e-2)
    # the value loss's targets are rows of the returns GAE gave (first iteration: 2 epochs x 2 minibatches)
    first_returns = calls["compute_gae"][0][1][1]
    for targets in calls["value_loss"][:4]:
        for row in targets:
            assert any(torch.equal(row, r) for r in first_returns)
    # explained variance over the real tokens only, in the second iteration (the values are no longer all 0)
    (_, values, mask, *_), (_, returns) = calls["compute_gae"][1]
    y_pred, y_true = values[mask].double(), returns[mask].double()
    assert y_pred.abs().max() > 0
    expected = 1 - (y_true - y_pred).var().item() / y_true.var().item()
    assert scalars["losses/explained_variance"][1] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    # the gradient clipped is that of everything the optimizer trains (policy and value model alike)
    assert calls["clip"] and all(clipped == calls["adam"][0] for clipped in calls["clip"])


def test_every_minibatch_of_every_epoch_uses_the_rollout_s_stored_values(tiny, tmp_path, monkeypatch,
                                                                         stops_at_lengths_1_to_8):
    """Two iterations of 2 epochs x 2 minibatches: every call of the losses gets, as the old log-probs and old
    values, rows of what the rollout stored (the log-probs of the sampled tokens, the values before the
    update), also after the weights have moved, where the new ones differ; and the adaptive KL controller gets
    the KL per response (the sum over its tokens, then the mean: objective/kl), not the per-token mean,
    worked out here from the log-probs the rollout passed to compute_rewards (responses of 1 to 8 tokens)."""
    monkeypatch.setattr(rlhf, "load_reward_fn", count_e_reward)
    calls = {name: [] for name in ("compute_rewards", "compute_gae", "policy_loss", "value_loss", "kl")}

    def record(name, keep):
        function = getattr(rlhf, name)

        def wrapper(*a, **kw):
            calls[name].append(keep(a))
            return function(*a, **kw)
        monkeypatch.setattr(rlhf, name, wrapper)

    record("compute_rewards", lambda a: (a[3].clone(), a[4].clone(), a[5].clone()))
    record("compute_gae", lambda a: a[1].clone())
    record("policy_loss", lambda a: (a[0].detach().clone(), a[1].clone(), a[3].clone()))
    record("value_loss", lambda a: (a[0].detach().clone(), a[1].clone(), a[3].clone()))
    real_controller = rlhf.adaptive_kl_coef
    monkeypatch.setattr(rlhf, "adaptive_kl_coef", lambda kl_coef, kl, *a: calls["kl"].append(kl) or
                        real_controller(kl_coef, kl, *a))
    stats = rlhf.main(tiny_args(tiny, tmp_path, total_episodes=16, update_epochs=2, num_minibatches=2,
                                learning_rate=3e-3, kl_target=1.0, kl_coef=0.1, missing_eos_penalty=None))
    scalars = read_scalars(stats["run_dir"])
    assert len(calls["compute_rewards"]) == 2 and len(calls["policy_loss"]) == len(calls["value_loss"]) == 8

    def is_a_row_of(row, stored):
        return any(torch.equal(row, other) for other in stored)

    moved = {"policy_loss": 0, "value_loss": 0}
    for iteration in range(2):
        stored_logprobs, ref_logprobs, mask = calls["compute_rewards"][iteration]
        stored_values = calls["compute_gae"][iteration]
        for name, stored in (("policy_loss", stored_logprobs), ("value_loss", stored_values)):
            for new, old, micro_mask in calls[name][4 * iteration : 4 * iteration + 4]:
                assert all(is_a_row_of(row, stored) for row in old), name
                moved[name] += (new - old)[micro_mask].abs().max().item() > 1e-3
        # the controller's KL: per response (sum over its real tokens), then the mean over responses
        per_token = (stored_logprobs - ref_logprobs).masked_fill(~mask, 0)
        per_response = per_token.sum(1).mean().item()
        token_mean = per_token.sum().item() / mask.sum().item()
        assert abs(per_response - token_mean) > 1e-3  # lengths 1 to 8: the two units differ
        assert calls["kl"][iteration] == pytest.approx(per_response, rel=1e-5, abs=1e-6)
        assert scalars["objective/kl"][iteration] == pytest.approx(per_response, rel=1e-5, abs=1e-6)
    # after the first step of each iteration the weights have moved: the new values differ from the stored
    assert moved["policy_loss"] >= 6 and moved["value_loss"] >= 6


def test_lengths_of_right_and_wrong_responses_are_logged_apart(tiny, tmp_path, monkeypatch,
                                                               stops_at_lengths_1_to_8):
    """RLVR logs the mean length (real tokens) of the right responses and of the wrong ones: here responses of
    1 to 8 tokens, right when their text has an even number of characters (a stand-in verifier)."""
    monkeypatch.setattr(rlhf, "load_reward_fn", lambda args, device: lambda texts, responses: torch.tensor(
        [1.0 if len(r) % 2 == 0 else -1.0 for r in responses]))
    rollouts = []
    real_sample = rlhf.sample_and_score
    monkeypatch.setattr(rlhf, "sample_and_score", lambda *a, **kw: rollouts.append(real_sample(*a, **kw)) or
                        rollouts[-1])
    stats = rlhf.main(tiny_args(tiny, tmp_path, reward_model="arithmetic", total_episodes=16, stop_token="."))
    scalars = read_scalars(stats["run_dir"])
    for i, (_, _, mask, _, raw) in enumerate(rollouts[1:]):  # the first batch sets the score normalization
        lengths = mask.sum(1).tolist()
        right = [n for n, score in zip(lengths, raw.tolist()) if score > 0]
        wrong = [n for n, score in zip(lengths, raw.tolist()) if score < 0]
        assert right and wrong and statistics.mean(right) != statistics.mean(wrong)
        assert scalars["val/length_right"][i] == pytest.approx(statistics.mean(right))
        assert scalars["val/length_wrong"][i] == pytest.approx(statistics.mean(wrong))


def test_one_loss_one_optimizer_trains_both_models(tiny, tmp_path, monkeypatch):
    """One Adam over the policy and the value model; the value model learns from vf_coef * v_loss only."""
    optimizers, value_models = [], []
    real_adam, real_load_value_model = torch.optim.Adam, rlhf.load_value_model

    def adam(param_groups, **kw):
        param_groups = list(param_groups)
        optimizers.append([p for group in param_groups for p in group["params"]])
        return real_adam(param_groups, **kw)

    def load_value_model(*a):
        value_models.append(real_load_value_model(*a))
        return value_models[-1]

    monkeypatch.setattr(torch.optim, "Adam", adam)
    monkeypatch.setattr(rlhf, "load_value_model", load_value_model)
    for vf_coef in (0.1, 0.0):
        rlhf.main(tiny_args(tiny, tmp_path / str(vf_coef), total_episodes=8, vf_coef=vf_coef, learning_rate=1e-3))
    assert len(optimizers) == 2
    value_model = value_models[0]
    assert {id(p) for p in optimizers[0]} >= {id(p) for p in value_model.parameters()}
    assert len(optimizers[0]) == len(list(value_model.parameters())) + len(
        [p for p in optimizers[0] if all(p is not q for q in value_model.parameters())])
    assert (value_model.head.weight != 0).any()  # trained by vf_coef * v_loss
    assert (value_models[1].head.weight == 0).all()  # vf_coef 0: no gradient reaches the value model


@pytest.mark.parametrize("vf_learning_rate", [None, 4e-3])
def test_vf_learning_rate_is_the_value_model_s_annealed_like_the_policy_s(tiny, tmp_path, vf_learning_rate):
    """The policy's parameters and the value model's are two Adam groups: the first at --learning-rate, the
    second at --vf-learning-rate (default: --learning-rate), both annealed by the same factor."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    steps = []

    def record(optimizer, args, kwargs):
        steps.append([(group["lr"], sum(p.numel() for p in group["params"]))
                      for group in optimizer.param_groups])

    handle = register_optimizer_step_pre_hook(record)  # called before every Adam step
    try:
        rlhf.main(tiny_args(tiny, tmp_path, learning_rate=1e-3, vf_learning_rate=vf_learning_rate,
                            update_epochs=1))
    finally:
        handle.remove()
    policy = rlhf.load_policy(tiny["policy"], torch.device("cpu"))
    n_policy = sum(p.numel() for p in policy.parameters())
    n_value = sum(p.numel() for p in policy.base_model.parameters()) + policy.config.hidden_size + 1
    vf_lr = 1e-3 if vf_learning_rate is None else vf_learning_rate
    # 2 iterations of 2 minibatches; the second iteration's learning rates are half the first's
    expected = [[(1e-3, n_policy), (vf_lr, n_value)]] * 2 + [[(5e-4, n_policy), (vf_lr / 2, n_value)]] * 2
    assert [[(pytest.approx(lr), n) for lr, n in step] for step in steps] == expected


def test_adaptive_kl_moves_the_coefficient_toward_the_target(tiny, tmp_path):
    """Iteration 1 has KL 0 (policy = reference): the coefficient falls. After an update the KL is above a tiny
    target (the coefficient rises) and below a huge one (it falls further)."""
    coefs = {}
    for target in (1e-6, 1e6):
        stats = rlhf.main(tiny_args(tiny, tmp_path / str(target), total_episodes=24, learning_rate=3e-3,
                                    kl_target=target, kl_horizon=16, kl_coef=0.2))
        coefs[target] = read_scalars(stats["run_dir"])["objective/kl_coef"]
    for target, third in ((1e-6, 0.2 * 0.9 * 1.1), (1e6, 0.2 * 0.9 * 0.9)):
        assert coefs[target] == pytest.approx([0.2, 0.2 * 0.9, third])  # factor 1 -+ 0.2 * 8 / 16


def test_constant_reward_does_not_blow_up_the_normalization(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rlhf, "load_reward_fn", lambda args, device: lambda texts, responses: torch.full(
        (len(texts),), 0.5, device=device))
    stats = rlhf.main(tiny_args(tiny, tmp_path, missing_eos_penalty=None))
    assert "constant" in capsys.readouterr().out
    assert stats["objective/scores"] == pytest.approx(0.0) and stats["objective/raw_scores"] == pytest.approx(0.5)


def test_pad_token_inside_the_vocabulary_is_never_sampled(tiny, tmp_path):
    tokenizer, pad_token_id, _ = rlhf.load_tokenizer(tiny["padded"], "eos")
    assert pad_token_id == tokenizer.convert_tokens_to_ids("<pad>") and pad_token_id < len(tokenizer)
    policy = rlhf.load_policy(tiny["padded"], torch.device("cpu"))
    with torch.no_grad():  # make the pad token the most likely next token everywhere
        policy.lm_head.weight[pad_token_id] = 10 * policy.lm_head.weight.abs().max()
    queries = tokenizer(rlhf.PROMPTS[:8], padding=True, return_tensors="pt")["input_ids"]
    responses, logprobs = rlhf.generate(policy, queries, 12, 2.0, pad_token_id)
    assert (responses != pad_token_id).all() and torch.isfinite(logprobs).all()
    stats = rlhf.main(tiny_args(tiny, tmp_path, model_name=tiny["padded"], stop_token="eos", save_model=True))
    assert math.isfinite(stats["losses/policy_loss"])
    assert_usable_as_saved(Path(stats["run_dir"]) / "model")


def test_llama_architecture_end_to_end(tiny, tmp_path):
    stats = rlhf.main(tiny_args(tiny, tmp_path, model_name=tiny["llama"], num_minibatches=1, update_epochs=1,
                                save_model=True))
    scalars = read_scalars(stats["run_dir"])
    assert all(abs(r - 1) < 1e-5 for r in scalars["val/ratio"])  # sampling and training passes agree
    assert scalars["objective/kl"][0] == pytest.approx(0, abs=1e-4)
    assert_usable_as_saved(Path(stats["run_dir"]) / "model")


def test_evaluation_scores_held_out_prompts_without_changing_training(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(rlhf, "load_reward_fn", count_e_reward)
    common = dict(total_episodes=16, save_model=True, stop_token=".", missing_eos_penalty=None)
    plain = rlhf.main(tiny_args(tiny, tmp_path / "plain", **common))
    evaluated = rlhf.main(tiny_args(tiny, tmp_path / "evaluated", eval_episodes=20, **common))
    for tag in ("objective/raw_scores", "objective/kl", "losses/policy_loss"):  # evaluation draws its own
        assert [read_scalars(run["run_dir"])[tag] for run in (plain, evaluated)] == [  # random numbers
            read_scalars(plain["run_dir"])[tag]] * 2, tag
    initial, final = evaluated["eval"]["initial"], evaluated["eval"]["final"]
    assert len(initial["raw_scores"]) == len(final["raw_scores"]) == 20
    assert {q for q, _ in final["samples"]} == set(rlhf.EVAL_PROMPTS[:16]) and not set(rlhf.EVAL_PROMPTS) & set(
        rlhf.PROMPTS)
    for q, r in final["samples"][:5]:  # the raw score is the reward of the query + response text
        assert final["raw_scores"][final["samples"].index((q, r))] == float((q + r).count("e"))
    assert read_scalars(evaluated["run_dir"])["eval/raw_scores"] == pytest.approx(
        [initial["raw_score_mean"], final["raw_score_mean"]])
    # 20 responses to 16 prompts: the 4 asked twice count once, with their mean; the standard error is over
    # the 16 prompts, not the 20 responses
    per_prompt = {}
    for (q, _), score in zip(final["samples"], final["raw_scores"]):
        per_prompt.setdefault(q, []).append(score)
    means = [statistics.mean(v) for v in per_prompt.values()]
    assert final["prompts"] == len(means) == 16 and statistics.stdev(means) > 0
    assert final["raw_score_mean"] == pytest.approx(statistics.mean(means))
    assert final["raw_score_stderr"] == pytest.approx(statistics.stdev(means) / 4)
    # the held-out change of the mean score, in units of the training scores' normalization (gain > 0)
    change = evaluated["eval"]["normalized_score_change"]
    assert change * (final["raw_score_mean"] - initial["raw_score_mean"]) >= 0
    assert "score_gain" not in evaluated["eval"]
    # --eval-checkpoint: the saved policy, evaluated alone, gives the same responses and scores
    again = rlhf.main(tiny_args(tiny, tmp_path / "checkpoint", eval_checkpoint=str(
        Path(evaluated["run_dir"]) / "model"), eval_episodes=20, **common))
    assert again["eval"]["final"]["samples"] == final["samples"]
    assert again["eval"]["final"]["raw_scores"] == final["raw_scores"]
    assert not (tmp_path / "checkpoint" / "runs").exists()


# ------------------------------------------------------------------------------------------------------------
# torchrun: two gloo processes on the CPU against one process with the same global batch.

# The script run by both: sampling is replaced by a fixed function of each query (random tokens drawn from a
# generator seeded with the query's token ids, and a stop token at a query-dependent position), with the
# log-probs recomputed by the policy. So one process with a batch of 8 and two processes with 4 each see the
# same (query, response) pairs, whichever process samples them. It also records the gradient norm of each
# optimizer step, before clipping, in grad_norms_<rank>.json beside the runs folder.
DRIVER = '''
import json, os, sys
import torch, tyro
sys.path.insert(0, {repo!r})
import ppo_rlhf_gpt2 as rlhf
script = rlhf

draws = []  # this process's next draw from the global stream at each sampling: processes must draw apart

@torch.inference_mode()
def generate(policy, queries, response_length, temperature, pad_token_id, greedy=False, bf16=False):
    draws.append(torch.rand(1).item())
    rows = []
    for query in queries.tolist():
        generator = torch.Generator().manual_seed(abs(hash(tuple(query))) % 2**31)
        row = torch.randint(0, {vocab_size}, (response_length,), generator=generator)
        row[sum(query) % response_length] = {stop_id}
        rows.append(row)
{scored_responses}

{recorded_norms}

{recorded_exit}

rlhf.generate, rlhf.nn.utils.clip_grad_norm_ = generate, record_norm
torch.distributed.destroy_process_group = recording_destroy
args = tyro.cli(rlhf.Args)
rlhf.main(args)
with open(os.path.join(args.runs_dir, "..", f"threads_left_{{args.rank}}.json"), "w") as f:
    json.dump(left, f)
with open(os.path.join(args.runs_dir, "..", f"grad_norms_{{args.rank}}.json"), "w") as f:
    json.dump(norms, f)
with open(os.path.join(args.runs_dir, "..", f"draws_{{args.rank}}.json"), "w") as f:
    json.dump(draws, f)
'''


@pytest.fixture(scope="module")
def torchrun_case(tiny, tmp_path_factory):
    """The driver script and flags: 8 prompts of the same token length (so that a batch of 4 is padded as
    the batch of 8), one iteration, two epochs over one minibatch of two accumulated micro-batches."""
    root, prompts = torchrun_folder(tmp_path_factory, Path(rlhf.__file__).parent, rlhf.PROMPTS, DRIVER,
                                    tiny["policy"], 8)
    assert len(prompts) == 8
    flags = ["--model-name", tiny["policy"], "--reward-model", "length", "--no-cuda", "--prompts-file",
             str(root / "prompts.txt"), "--batch-size", "8", "--num-minibatches", "1", "--update-epochs", "2",
             "--gradient-accumulation-steps", "2", "--total-episodes", "8", "--response-length", "8",
             "--min-response-length", "0", "--norm-batches", "1", "--eval-episodes", "0", "--learning-rate",
             "1e-3", "--missing-eos-penalty", "None", "--save-model"]
    return root, flags


def test_torchrun_two_processes_make_the_update_of_one_process(torchrun_case):
    """Same responses, same update: the prompts split over the processes, the score normalization, the
    advantage whitening and the token weighting of the loss computed over both processes, the gradients
    averaged by DDP. Each of these, done per process, changes the weights or the gradient norm below."""
    root, flags = torchrun_case
    run_one_and_two_processes(root, flags)
    run_dirs = {name: list((root / name / "runs").iterdir()) for name in ("one", "two")}
    assert [len(d) for d in run_dirs.values()] == [1, 1]  # process 1 writes no run folder of its own
    run_dirs = {name: d[0] for name, d in run_dirs.items()}
    initial = AutoModelForCausalLM.from_pretrained(flags[1]).state_dict()
    one, two = (AutoModelForCausalLM.from_pretrained(run_dirs[n] / "model").state_dict() for n in ("one", "two"))
    moved = max((one[k] - initial[k]).abs().max().item() for k in initial)
    differ = max((one[k] - two[k]).abs().max().item() for k in initial)
    assert moved > 1e-3 and differ < 1e-6, (moved, differ)  # the update is far larger than the float noise
    # the gradient norm of each optimizer step (2 epochs x 1 minibatch), before clipping: Adam alone would
    # hide a gradient scaled by a constant, the norm does not
    norms = [json.loads((root / f).read_text()) for f in ("one/grad_norms_0.json", "two/grad_norms_0.json",
                                                          "two/grad_norms_1.json")]
    assert len(norms[0]) == 2 and norms[0][0] > 0
    assert norms[1] == pytest.approx(norms[0], rel=1e-4) and norms[2] == pytest.approx(norms[0], rel=1e-4)
    # each process samples from its own random stream (seed + rank), not a copy of the other's
    draws = [json.loads((root / "two" / f"draws_{rank}.json").read_text()) for rank in (0, 1)]
    assert len(draws[0]) == len(draws[1]) >= 1 and draws[0][0] != draws[1][0]
    # main()'s destroy_process_group ends the process group's threads (none left to outlive the interpreter)
    assert [json.loads((root / "two" / f"threads_left_{rank}.json").read_text()) for rank in (0, 1)] == [[0], [0]]
    # the logged statistics of the rollout are over both processes' responses
    scalars = {name: read_scalars(d) for name, d in run_dirs.items()}
    for tag in ("objective/scores", "objective/raw_scores", "charts/episodic_length", "val/num_eos_tokens",
                "objective/kl"):
        assert scalars["two"][tag] == pytest.approx(scalars["one"][tag], abs=1e-5), tag


def test_torchrun_bad_flag_fails_in_every_process_with_one_message(torchrun_case):
    root, flags = torchrun_case
    # 6 responses split into 2 minibatches works in one process, not in 2 x 2 shares of 1.5
    result = run_torchrun(root, "bad", flags + ["--batch-size", "6", "--num-minibatches", "2"], processes=2)
    message = ("error: --batch-size 6 is not divisible by --num-minibatches 2 times the 2 torchrun processes; "
               "choose a batch size that is a multiple of it")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    # each process checks the flags before any collective, so none waits for the other; the first to fail
    # makes torchrun stop the other, which may or may not have printed the same line by then
    assert 1 <= output.count(message) <= 2 and output.count("error:") == output.count(message)
    assert 'ppo_rlhf_gpt2.py", line' not in output  # no traceback from the script (torchrun prints its own)
    assert not (root / "bad" / "runs").exists()


# ------------------------------------------------------------------------------------------------------------
# Issue 34: every helper against numbers worked out by hand or a plain, independent computation (never the
# script's own helpers on both sides), and the gradients of one update.


def test_model_inputs_scale_logits_gather_logprobs_and_masked_mean_by_hand():
    pad = 9
    ids = torch.tensor([[9, 9, 5, 6], [1, 2, 3, 4], [9, 7, 9, 8]])
    inputs = rlhf.model_inputs(ids, ids != pad)
    # a tokenizer's 0/1 mask reads the same; any padding side (here the first row padded on the right)
    as_ints = rlhf.model_inputs(ids, (ids != pad).long())
    assert all(torch.equal(inputs[k], as_ints[k]) for k in ("input_ids", "attention_mask", "position_ids"))
    right = rlhf.model_inputs(torch.tensor([[5, 6, 9, 9]]), torch.tensor([[1, 1, 0, 0]]))
    assert right["position_ids"].tolist() == [[0, 1, 2, 2]] and right["input_ids"].tolist() == [[5, 6, 0, 0]]
    assert inputs["attention_mask"].tolist() == [[False, False, True, True], [True] * 4,
                                                 [False, True, False, True]]
    # the first real token is at position 0, each real token one further (padding between them is skipped)
    assert inputs["position_ids"].tolist() == [[0, 0, 0, 1], [0, 1, 2, 3], [0, 0, 1, 1]]
    assert inputs["input_ids"].tolist() == [[0, 0, 5, 6], [1, 2, 3, 4], [0, 7, 0, 8]]
    assert inputs["use_cache"] is False
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert rlhf.scale_logits(logits, 0.5, 4).tolist() == [[2.0, 4.0, 6.0, 8.0]]  # pad id outside the vocab
    assert rlhf.scale_logits(logits, 0.5, 2).tolist() == [[2.0, 4.0, torch.finfo(torch.float32).min, 8.0]]
    assert logits.tolist() == [[1.0, 2.0, 3.0, 4.0]]  # not scaled in place
    # (batch, response_length, vocab) as in the update: the pad id is compared with the vocabulary size
    scaled = rlhf.scale_logits(torch.ones(1, 2, 4), 1.0, 3)
    assert (scaled[..., 3] == torch.finfo(torch.float32).min).all() and (scaled[..., :3] == 1).all()
    # softmax of (0, ln 3) is (1/4, 3/4)
    logits = torch.tensor([[[0.0, math.log(3)], [math.log(3), 0.0]], [[0.0, 0.0], [0.0, math.log(3)]]])
    torch.testing.assert_close(rlhf.gather_logprobs(logits, torch.tensor([[1, 1], [0, 0]])),
                               torch.tensor([[0.75, 0.25], [0.5, 0.25]]).log())
    x = torch.tensor([[1.0, 2.0, math.inf], [math.nan, 4.0, -math.inf]])
    mask = torch.tensor([[True, True, False], [False, True, False]])
    assert rlhf.masked_mean(x, mask).item() == pytest.approx(7 / 3)


def test_masked_whiten_score_normalization_and_gae_by_hand():
    x, mask = torch.tensor([[1.0, 2.0], [3.0, 100.0]]), torch.tensor([[True, True], [True, False]])
    # mean 2, unbiased variance ((-1)^2 + 0 + 1^2) / 2 = 1
    torch.testing.assert_close(rlhf.masked_whiten(x, mask), torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
    torch.testing.assert_close(rlhf.masked_whiten(x, mask, shift_mean=False),
                               torch.tensor([[1.0, 2.0], [3.0, 0.0]]))
    torch.testing.assert_close(rlhf.masked_whiten(x * 3, mask), torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
    # two real entries 1 and 3: mean 2, unbiased variance 2; a constant batch whitens to 0, not nan
    two = torch.tensor([[True, False], [True, False]])
    torch.testing.assert_close(rlhf.masked_whiten(x, two), torch.tensor([[-(2**-0.5), 0.0], [2**-0.5, 0.0]]))
    assert rlhf.masked_whiten(torch.full((2, 2), 3.0), mask).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    # std 2, mean 4; two samples: std sqrt(2); a std of 0.5 is a scale, not a constant reward
    assert rlhf.score_normalization(torch.tensor([2.0, 4.0, 6.0])) == pytest.approx((0.5, -2.0))
    assert rlhf.score_normalization(torch.tensor([1.0, 3.0])) == pytest.approx((2**-0.5, -2 * 2**-0.5))
    assert rlhf.score_normalization(torch.tensor([-0.5, 0.0, 0.5])) == pytest.approx((2.0, 0.0))
    # the threshold: a std of 1e-6 (exactly, in float64) or less is a constant reward
    assert rlhf.score_normalization(torch.tensor([-1e-6, 0.0, 1e-6], dtype=torch.float64)) == (1.0, 0.0)
    with warnings.catch_warnings():  # one sample has no scale; torch warns if asked for its std: never ask
        warnings.simplefilter("error")
        assert rlhf.score_normalization(torch.tensor([3.0])) == pytest.approx((1.0, -3.0))
    # one response of 2 real tokens and a padded one; gamma 0.9, lambda 0.5
    rewards, values = torch.tensor([[1.0, 2.0, 0.0]]), torch.tensor([[0.5, 1.0, 7.0]])
    advantages, returns = rlhf.compute_gae(rewards, values, torch.tensor([[True, True, False]]), 0.9, 0.5)
    # delta_1 = 2 + 0.9 * 0 - 1 = 1 = A_1;  delta_0 = 1 + 0.9 * 1 - 0.5 = 1.4, A_0 = 1.4 + 0.45 * 1 = 1.85
    torch.testing.assert_close(advantages, torch.tensor([[1.85, 1.0, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[2.35, 2.0, 0.0]]))
    # responses of one token (--response-length 1): A = r - V, the return r
    advantages, returns = rlhf.compute_gae(torch.tensor([[3.0]]), torch.tensor([[1.0]]),
                                           torch.tensor([[True]]), 0.9, 0.5)
    assert advantages.tolist() == [[2.0]] and returns.tolist() == [[3.0]]
    # rewards: log pi -1, -2 and log pi_ref -1.5, -1 on two real tokens, kl_coef 0.1, score 2
    logprobs, ref_logprobs = torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.5, -1.0, 5.0]])
    mask = torch.tensor([[True, True, False]])
    rewards, kl, non_score_reward, penalized = rlhf.compute_rewards(  # the default estimator: k1
        torch.tensor([2.0]), torch.tensor([True]), -1.0, logprobs, ref_logprobs, mask, 0.1)
    torch.testing.assert_close(kl, torch.tensor([[0.5, -1.0, 0.0]]))  # log pi - log pi_ref
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.1 + 2.0, 0.0]]))
    # k3: (q - 1) - log q with log q = log pi_ref - log pi = -0.5, 1
    kl = rlhf.compute_rewards(torch.tensor([2.0]), torch.tensor([True]), -1.0, logprobs, ref_logprobs, mask,
                              0.1, "k3")[1]
    torch.testing.assert_close(kl, torch.tensor([[math.exp(-0.5) - 0.5, math.e - 2, 0.0]]))


def test_losses_and_debug_variables_by_hand():
    # ratios 1.5 and 0.5 with advantages +1 and -1: the clipped term wins where the ratio moved too far in
    # the advantage's direction; a third, masked token holds garbage
    newlogprob = torch.tensor([[math.log(1.5), math.log(1.5), math.log(0.5), math.log(0.5), 50.0]])
    logprobs = torch.zeros(1, 5)
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1e6]])
    mask = torch.tensor([[True, True, True, True, False]])
    pg_loss, ratio, logratio = rlhf.policy_loss(newlogprob, logprobs, advantages, mask, 0.2)
    # max(-A r, -A clip(r)): A=+1, r=1.5: max(-1.5, -1.2) = -1.2; A=-1, r=1.5: 1.5; A=+1, r=0.5: max(-0.5,
    # -0.8) = -0.5; A=-1, r=0.5: max(0.5, 0.8) = 0.8
    assert pg_loss.item() == pytest.approx((-1.2 + 1.5 - 0.5 + 0.8) / 4)
    torch.testing.assert_close(ratio[:, :4], torch.tensor([[1.5, 1.5, 0.5, 0.5]]))
    torch.testing.assert_close(logratio, newlogprob - logprobs)
    newlogprob = newlogprob + 2.0  # the ratio is relative to the rollout's log-probs, not absolute
    pg_loss = rlhf.policy_loss(newlogprob, logprobs + 2.0, advantages, mask, 0.2)[0]
    assert pg_loss.item() == pytest.approx(0.15)

    newvalue, values = torch.tensor([[1.0, 0.1, 9.0]]), torch.tensor([[0.0, 0.0, -9.0]])
    returns, mask = torch.tensor([[2.0, 0.0, 5.0]]), torch.tensor([[True, True, False]])
    # token 0: unclipped (1 - 2)^2 = 1, clipped (0 + 0.2 - 2)^2 = 3.24 -> 3.24; token 1: 0.01 either way
    assert rlhf.value_loss(newvalue, values, returns, mask, 0.2, True).item() == pytest.approx(0.5 * 3.25 / 2)
    unclipped = rlhf.value_loss(newvalue, values, returns, mask, 0.2, False)
    assert unclipped.item() == pytest.approx(0.5 * 1.01 / 2)
    # token 0 from the other side: newvalue 3, values 2.5: clipped to 2.7, (2.7 - 2)^2 = 0.49 < (3 - 2)^2 = 1
    assert rlhf.value_loss(torch.tensor([[3.0]]), torch.tensor([[2.5]]), torch.tensor([[2.0]]),
                           torch.tensor([[True]]), 0.2, True).item() == pytest.approx(0.5)
    # below: newvalue -1, values 0 clipped to -0.2; returns -2: (-0.2 + 2)^2 = 3.24 > (-1 + 2)^2 = 1
    assert rlhf.value_loss(torch.tensor([[-1.0]]), torch.tensor([[0.0]]), torch.tensor([[-2.0]]),
                           torch.tensor([[True]]), 0.2, True).item() == pytest.approx(0.5 * 3.24)

    # distributions (1/4, 3/4) and (1/2, 1/2) at two real tokens; ratios 1.5 and 0.9; a masked third token
    all_logprobs = torch.tensor([[[math.log(0.25), math.log(0.75)], [math.log(0.5), math.log(0.5)],
                                  [0.0, 0.0]]])
    ratio = torch.tensor([[1.5, 0.9, 100.0]])
    debug = rlhf.debug_variables(all_logprobs, ratio, ratio.log(), torch.tensor([[True, True, False]]), 0.2)
    entropy = (-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)) + math.log(2)) / 2
    assert debug["entropy"].item() == pytest.approx(entropy, rel=1e-6)
    assert debug["old_approx_kl"].item() == pytest.approx(-(math.log(1.5) + math.log(0.9)) / 2, rel=1e-6)
    approx_kl = (0.5 - math.log(1.5) - 0.1 - math.log(0.9)) / 2
    assert debug["approx_kl"].item() == pytest.approx(approx_kl, rel=1e-5)
    assert debug["clipfrac"].item() == 0.5  # |1.5 - 1| > 0.2, |0.9 - 1| is not
    assert debug["ratio"].item() == pytest.approx(1.2)
    # a ratio exactly at the clip boundary (1.5 with clip_coef 0.5, exact in floats) is not clipped
    at_boundary = torch.tensor([[1.5]])
    debug = rlhf.debug_variables(all_logprobs[:, :1], at_boundary, at_boundary.log(), torch.tensor([[True]]),
                                 0.5)
    assert debug["clipfrac"].item() == 0.0


def test_diversity_by_hand():
    responses = torch.tensor([[1, 2, 3, 9], [1, 2, 3, 5], [4, 5, 9, 9], [6, 9, 9, 9], [7, 2, 9, 9]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]]).bool()
    # rows (1 2 3), (1 2 3), (4 5), (6), (7 2): 4 distinct of 5; bigrams 12 23 12 23 45 72: 4 distinct of 6
    assert rlhf.diversity(responses, mask) == pytest.approx((0.8, 4 / 6))
    assert rlhf.diversity(torch.tensor([[3, 4], [3, 4]]), torch.tensor([[True, False]] * 2)) == (0.5, 0.0)
    assert rlhf.diversity(torch.tensor([[3, 4]]), torch.tensor([[True, True]])) == (1.0, 1.0)  # one bigram


def test_query_batches_are_shuffled_passes_split_over_processes(tiny):
    tokenizer, pad_token_id, _ = rlhf.load_tokenizer(tiny["policy"], ".")
    prompts = rlhf.PROMPTS[:6]

    def batches(n, **kw):
        kw.setdefault("local_batch_size", 4)
        args = rlhf.Args(batch_size=4, max_query_length=64, **kw)
        iterator = rlhf.query_batches(prompts, tokenizer, args, torch.device("cpu"))
        return [tokenizer.batch_decode(next(iterator), skip_special_tokens=True) for _ in range(n)]

    drawn = sum(batches(3), [])
    assert len(drawn) == 12 and all(len(b) == 4 for b in batches(3))
    assert sorted(drawn[:6]) == sorted(prompts) and sorted(drawn[6:12]) == sorted(prompts)  # pass after pass
    assert drawn[:6] != prompts and drawn[6:12] != drawn[:6]  # shuffled, again for each pass
    assert batches(3) == batches(3) and batches(3, seed=2) != batches(3)  # by --seed, not the global state
    # torchrun: 2 processes of 2 queries; together the same batches as one process of 4
    halves = [batches(3, rank=r, local_batch_size=2) for r in (0, 1)]
    assert [a + b for a, b in zip(*halves)] == batches(3)
    # left padding and left truncation to max_query_length tokens
    long_prompt = " ".join(prompts)
    assert len(tokenizer.encode(long_prompt)) > 8
    queries = rlhf.tokenize_queries(tokenizer, [long_prompt, "I"], 3, torch.device("cpu"))
    assert queries[0].tolist() == tokenizer.encode(long_prompt)[-3:]
    assert queries[1, :2].tolist() == [pad_token_id] * 2 and queries[1, 2].item() == tokenizer.encode("I")[0]
    args = rlhf.Args(batch_size=2, local_batch_size=2, max_query_length=5)
    iterator = rlhf.query_batches([long_prompt], tokenizer, args, torch.device("cpu"))
    assert next(iterator).tolist() == [tokenizer.encode(long_prompt)[-5:]] * 2


def test_sample_and_score_truncates_decodes_and_scores_in_chunks(tiny, monkeypatch):
    """The reward function gets query + response text and the response text, both cut after the stop token,
    in chunks of --local-rollout-forward-batch-size; the sampled tokens come back with the mask and stops."""
    tokenizer, pad_token_id, stop_token_id = rlhf.load_tokenizer(tiny["policy"], ".")
    prompts = ["This movie was", "I", "The film"]
    continuations = [" great. Not bad", " bad and dull", ". Yes, it was"]
    encoded = [tokenizer.encode(c) for c in continuations]
    length = min(len(e) for e in encoded)
    responses = torch.tensor([e[:length] for e in encoded])
    assert responses[0].tolist().index(stop_token_id) < length - 1 and stop_token_id not in responses[1]
    logprobs = -torch.rand(3, length)
    real_generate, generated = rlhf.generate, []

    def generate(*a, **kw):
        arguments = inspect.signature(real_generate).bind(*a, **kw)
        arguments.apply_defaults()
        generated.append(dict(arguments.arguments))
        return responses.clone(), logprobs

    monkeypatch.setattr(rlhf, "generate", generate)
    calls = []

    def reward_fn(texts, response_texts):
        calls.append((texts, response_texts))
        return torch.tensor([float(len(t)) for t in texts])

    queries = rlhf.tokenize_queries(tokenizer, prompts, 32, torch.device("cpu"))
    args = rlhf.Args(response_length=length, min_response_length=0, local_rollout_forward_batch_size=2,
                     temperature=0.6, bf16=True)
    policy = object()
    out, out_logprobs, mask, contain_stop, raw_scores = rlhf.sample_and_score(
        policy, queries, tokenizer, stop_token_id, reward_fn, args)
    (arguments,) = generated
    assert arguments.pop("policy") is policy and torch.equal(arguments.pop("queries"), queries)
    assert arguments == dict(response_length=length, temperature=0.6, pad_token_id=pad_token_id, greedy=False,
                             bf16=True)  # detail 53: the sampling loop in one autocast region
    texts = sum([c[0] for c in calls], [])
    response_texts = sum([c[1] for c in calls], [])
    assert [len(c[0]) for c in calls] == [2, 1]
    cut = [tokenizer.decode(e[:length]) for e in encoded]
    cut = [" great.", cut[1], "."]
    assert response_texts == cut and texts == [p + c for p, c in zip(prompts, cut)]
    assert raw_scores.tolist() == [float(len(t)) for t in texts]
    assert contain_stop.tolist() == [True, False, True] and mask.sum(1).tolist()[::2] == [
        responses[0].tolist().index(stop_token_id) + 1, 1]
    assert (out[~mask] == pad_token_id).all() and torch.equal(out[mask], responses[mask])
    assert torch.equal(out_logprobs, logprobs)
    # --min-response-length 1: the third response's stop token (its first token) does not end it; greedy
    args.min_response_length = 1
    _, _, mask, contain_stop, _ = rlhf.sample_and_score(policy, queries, tokenizer, stop_token_id, reward_fn,
                                                        args, greedy=True)
    assert generated[-1]["greedy"] is True
    assert contain_stop.tolist() == [True, False, False] and mask[2].all()


def test_response_logprobs_and_values_against_a_plain_forward_pass(tiny):
    """Each (query, response) alone, no padding, through the plain transformers model with its default
    positions: the log-probs at temperature T of the response tokens and V(s_t) read at the position before
    token t must equal what the batched, left-padded helpers give."""
    torch.manual_seed(7)
    tokenizer, pad_token_id, _ = rlhf.load_tokenizer(tiny["policy"], ".")
    policy = rlhf.load_policy(tiny["policy"], torch.device("cpu"))
    value_model = rlhf.load_value_model(None, policy, torch.device("cpu"))
    torch.nn.init.normal_(value_model.head.weight)
    torch.nn.init.normal_(value_model.head.bias)
    queries = tokenizer(rlhf.PROMPTS[:4], padding=True, return_tensors="pt")["input_ids"]
    responses = torch.randint(0, policy.config.vocab_size, (4, 5))
    query_responses, context_length = torch.cat([queries, responses], 1), queries.shape[1]
    with torch.no_grad():
        logprobs = rlhf.gather_logprobs(rlhf.response_logits(policy, query_responses, context_length, 0.7,
                                                             pad_token_id), responses)
        values = rlhf.response_values(value_model, query_responses, context_length, pad_token_id)
        for i in range(4):
            query = [t for t in queries[i].tolist() if t != pad_token_id]
            ids = torch.tensor([query + responses[i].tolist()])
            logits = policy(ids).logits[0].double()
            hidden = value_model.backbone(ids).last_hidden_state[0]
            for t in range(5):
                position = len(query) - 1 + t  # the logits here predict response token t
                expected = (logits[position] / 0.7).log_softmax(-1)[responses[i, t]].item()
                assert logprobs[i, t].item() == pytest.approx(expected, abs=1e-4), (i, t)
                expected_value = (hidden[position] @ value_model.head.weight[0]
                                  + value_model.head.bias).item()
                assert values[i, t].item() == pytest.approx(expected_value, abs=1e-4), (i, t)


def test_one_update_s_gradients_reach_the_trained_models_only(tiny, tmp_path, monkeypatch):
    """One iteration of 2 minibatches: pg_loss reaches every tensor of the policy and none of the value model,
    vf_coef * v_loss every tensor of the value model (backbone and head) and none of the policy; each
    optimizer step applies a gradient to every trained tensor (the value backbone's is exactly 0 at the
    first step, as the head starts at 0); the frozen reference and reward model get no gradient and do not
    change."""
    models = {}
    real_load_policy, real_load_value_model = rlhf.load_policy, rlhf.load_value_model
    real_deepcopy, real_from_pretrained = rlhf.copy.deepcopy, rlhf.from_pretrained

    def deepcopy(x, *a):
        out = real_deepcopy(x, *a)
        if x is models.get("policy"):
            models["reference"] = out
        return out

    def from_pretrained(auto_class, name, *a, **kw):
        out = real_from_pretrained(auto_class, name, *a, **kw)
        if auto_class is rlhf.AutoModelForSequenceClassification:
            models["reward"] = out
        return out

    monkeypatch.setattr(rlhf, "load_policy", lambda *a: models.setdefault("policy", real_load_policy(*a)))
    monkeypatch.setattr(rlhf, "load_value_model", lambda *a: models.setdefault("value",
                                                                                real_load_value_model(*a)))
    monkeypatch.setattr(rlhf.copy, "deepcopy", deepcopy)
    monkeypatch.setattr(rlhf, "from_pretrained", from_pretrained)
    reached = {"pg_loss": [], "v_loss": []}

    def tensors_reached(loss):
        named = [(f"policy.{n}", p) for n, p in models["policy"].named_parameters()] + [
            (f"value.{n}", p) for n, p in models["value"].named_parameters()]
        grads = torch.autograd.grad(loss, [p for _, p in named], retain_graph=True, allow_unused=True)
        return {n for (n, _), g in zip(named, grads) if g is not None and (g != 0).any()}

    def recorded(name, function):
        def wrapper(*a, **kw):
            out = function(*a, **kw)
            reached[name].append(tensors_reached(out[0] if name == "pg_loss" else out))
            return out
        return wrapper

    monkeypatch.setattr(rlhf, "policy_loss", recorded("pg_loss", rlhf.policy_loss))
    monkeypatch.setattr(rlhf, "value_loss", recorded("v_loss", rlhf.value_loss))
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    steps = []
    handle = register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: steps.append(
        {id(p): p.grad.clone() for group in optimizer.param_groups for p in group["params"]}))
    try:
        rlhf.main(tiny_args(tiny, tmp_path, total_episodes=8, update_epochs=1, learning_rate=1e-3))
    finally:
        handle.remove()
    policy, value, reference, reward = (models[k] for k in ("policy", "value", "reference", "reward"))
    policy_names = {f"policy.{n}" for n, _ in policy.named_parameters()}
    value_names = {f"value.{n}" for n, _ in value.named_parameters()}
    head = {"value.head.weight", "value.head.bias"}
    assert len(steps) == 2 and len(reached["pg_loss"]) == len(reached["v_loss"]) == 2
    assert reached["pg_loss"] == [policy_names] * 2
    assert reached["v_loss"] == [head, value_names]  # the backbone from the second step on (head no longer 0)
    trained = list(policy.parameters()) + list(value.parameters())
    assert set(steps[0]) == set(steps[1]) == {id(p) for p in trained}  # one optimizer over exactly these
    for p in trained:
        zero_at_first = any(p is q for q in value.backbone.parameters())
        assert (steps[0][id(p)] != 0).any() != zero_at_first and (steps[1][id(p)] != 0).any()
    initial_policy = real_load_policy(tiny["policy"], torch.device("cpu")).state_dict()
    initial_reward = real_from_pretrained(rlhf.AutoModelForSequenceClassification, tiny["reward"], "")
    initial_reward = initial_reward.state_dict()
    for model, initial in ((reference, initial_policy), (reward, initial_reward)):
        assert all(p.grad is None and not p.requires_grad for p in model.parameters())
        assert all(torch.equal(t, initial[k]) for k, t in model.state_dict().items())
    assert all(not torch.equal(t, initial_policy[k]) for k, t in policy.state_dict().items()
               if t.dtype.is_floating_point)


def test_arithmetic_split_is_the_published_one_and_three_digits_start_at_100():
    """The held-out problems are those the results pages report accuracies on: the split is pinned (another
    seed of the shuffle, or another shuffle, would change them); operands of d digits run from 10^(d-1)."""
    assert rlhf.arithmetic_problems(1, held_out=True)[:3] == [
        "What is 3 + 5? The answer is", "What is 5 + 3? The answer is", "What is 1 + 3? The answer is"]
    held_out = rlhf.arithmetic_problems(3, held_out=True)
    operands = [int(p.split()[i].rstrip("?")) for p in held_out for i in (2, 4)]
    assert min(operands) == 100 and max(operands) == 999


def test_eval_checkpoint_samples_with_the_settings_saved_with_the_policy(tiny, tmp_path, capsys):
    """check_evaluation_samples_as_saved (trained at learning rate 3e-3), with the KL to the starting model;
    then a folder that names no starting model, and one whose sampling.json is broken."""
    again, printed, model_dir, trained = check_evaluation_samples_as_saved(
        rlhf, lambda *a, **kw: tiny_args(tiny, *a, **kw), tmp_path, capsys, learning_rate=3e-3)
    # the KL to the starting model its sampling.json names, and which prompts were scored
    assert "responses to 6 held-out prompts (standard errors over them)" in printed
    assert f"KL to {tiny['policy']} {again['eval']['final']['kl_mean']:.3f} +- " in printed
    # the starting model saved as a policy of its own: its KL to itself is 0 (up to the sampling pass's rounding)
    start = tmp_path / "start"
    rlhf.save_policy(rlhf.load_policy(tiny["policy"], torch.device("cpu")), tiny["policy"], str(start),
                     rlhf.Args(**trained))
    itself = rlhf.main(tiny_args(tiny, tmp_path / "itself", eval_checkpoint=str(start), eval_episodes=6))
    # (the trained policy's, a k1 mean over 6 responses of a small move, may have either sign, not 0)
    assert abs(itself["eval"]["final"]["kl_mean"]) < 1e-4 < abs(again["eval"]["final"]["kl_mean"])
    json.dump(trained, open(start / "sampling.json", "w"))  # an older folder: no starting model named
    capsys.readouterr()
    rlhf.main(tiny_args(tiny, tmp_path / "older", eval_checkpoint=str(start), eval_episodes=6))
    assert "no KL (the starting model is not named in its sampling.json)" in capsys.readouterr().out
    (model_dir / "sampling.json").write_text("{not json")
    with pytest.raises(SystemExit, match="--eval-checkpoint .*: not a policy saved by --save-model"):
        rlhf.main(tiny_args(tiny, tmp_path / "bad", eval_checkpoint=str(model_dir)))


# ------------------------------------- a direction, a passed flag, a schedule, a statistic's unit, old folders


def record_rollouts(monkeypatch) -> list:
    """Wrap sample_and_score: each call's (queries, responses, logprobs, response_mask) is appended."""
    calls, real = [], rlhf.sample_and_score

    def sample_and_score(policy, queries, *a, **kw):
        out = real(policy, queries, *a, **kw)
        calls.append((queries, out[0], out[1], out[2]))
        return out

    monkeypatch.setattr(rlhf, "sample_and_score", sample_and_score)
    return calls


def kl_to_reference_by_hand(policy, reference, queries, responses, response_mask, pad_token_id, temperature):
    """Mean over the responses of the exact KL(pi || pi_ref) of the next-token distributions at the
    temperature, summed over each response's real tokens: each unpadded query + response in a plain forward
    pass of its own."""
    total = 0.0
    for query, response, mask in zip(queries, responses, response_mask):
        ids = torch.cat([query[query != pad_token_id], response[mask]])[None]
        n = int(mask.sum())
        with torch.no_grad():
            logp, logq = (torch.log_softmax(m(input_ids=ids).logits[0, -n - 1 : -1] / temperature, -1)
                          for m in (policy, reference))
        total += (logp.exp() * (logp - logq)).sum().item()
    return total / len(queries)


def test_with_every_score_0_an_update_moves_the_policy_toward_the_reference(tiny, tmp_path, monkeypatch):
    """detail 32's direction: a reference that is not the initial policy (its weights perturbed), every score
    0, no EOS trick: the only reward is the KL penalty, and one iteration's update must lower the exact KL of
    the policy to the reference on the responses it sampled (a flipped sign raises it)."""
    real_deepcopy = rlhf.copy.deepcopy

    def deepcopy(model):
        copied = real_deepcopy(model)
        if hasattr(copied, "lm_head"):  # the reference (the value model's backbone is copied too)
            generator = torch.Generator().manual_seed(5)
            with torch.no_grad():
                for p in copied.parameters():
                    p.add_(0.05 * torch.randn(p.shape, generator=generator))
            references.append(copied)
        return copied

    references, rollouts = [], record_rollouts(monkeypatch)
    monkeypatch.setattr(rlhf, "copy", type("copy", (), {"deepcopy": staticmethod(deepcopy)}))
    monkeypatch.setattr(rlhf, "load_reward_fn", lambda args, device: lambda texts, responses: torch.zeros(
        len(texts), device=device))
    args = tiny_args(tiny, tmp_path, batch_size=64, total_episodes=64, num_minibatches=1, update_epochs=2,
                     response_length=4, learning_rate=1e-3, kl_coef=1.0, kl_target=None,
                     normalize_scores=False, missing_eos_penalty=None,
                     temperature=1.0, save_model=True)
    stats = rlhf.main(args)
    (reference,) = references
    (queries, responses, _, response_mask), = rollouts
    pad_token_id = rlhf.load_tokenizer(tiny["policy"], ".")[1]
    before, after = (kl_to_reference_by_hand(rlhf.load_policy(path, torch.device("cpu")), reference, queries,
                                             responses, response_mask, pad_token_id, 1.0)
                     for path in (tiny["policy"], Path(stats["run_dir"]) / "model"))
    # (measured on this seed: 0.21 before, 0.20 after; 0.22 after with the penalty's sign flipped)
    assert before > 0.05  # the reference differs from the initial policy
    assert after < 0.98 * before


def test_each_flag_reaches_its_math_with_the_others_set_apart(tiny, tmp_path, monkeypatch):
    """Every coefficient main() hands to the math set to its own value: the KL coefficient the rewards get in
    each iteration is the adaptive one logged for it (not --kl-coef after the first), GAE gets --gamma and
    --gae-lambda in their places, the losses get --clip-coef, and the value loss enters the loss times
    --vf-coef (the gradient reaching v_loss; the policy loss's is 1: one micro-batch, one process)."""
    seen = {"kl_coef": [], "gae": [], "clip": [], "v_grad": [], "pg_grad": []}
    real = {name: getattr(rlhf, name) for name in ("compute_rewards", "compute_gae", "policy_loss", "value_loss")}

    def compute_rewards(*a):
        seen["kl_coef"].append(a[6])
        return real["compute_rewards"](*a)

    def compute_gae(rewards, values, response_mask, gamma, gae_lambda):
        seen["gae"].append((gamma, gae_lambda))
        return real["compute_gae"](rewards, values, response_mask, gamma, gae_lambda)

    def policy_loss(*a):
        pg_loss, ratio, logratio = real["policy_loss"](*a)
        seen["clip"].append(a[4])
        pg_loss.register_hook(lambda g: seen["pg_grad"].append(g.item()))
        return pg_loss, ratio, logratio

    def value_loss(*a):
        v_loss = real["value_loss"](*a)
        seen["clip"].append(a[4])
        v_loss.register_hook(lambda g: seen["v_grad"].append(g.item()))
        return v_loss

    for name, f in (("compute_rewards", compute_rewards), ("compute_gae", compute_gae),
                    ("policy_loss", policy_loss), ("value_loss", value_loss)):
        monkeypatch.setattr(rlhf, name, f)
    stats = rlhf.main(tiny_args(tiny, tmp_path, total_episodes=24, learning_rate=3e-3, kl_coef=0.2,
                                kl_target=1e-6, kl_horizon=16, vf_coef=0.3, gamma=0.9, gae_lambda=0.8,
                                clip_coef=0.25, update_epochs=1))
    logged = read_scalars(stats["run_dir"])["objective/kl_coef"]
    # iteration 1: KL 0, the coefficient falls by 1 - 0.2 * 8 / 16; then a tiny target: it rises by 1.1
    assert logged == pytest.approx([0.2, 0.2 * 0.9, 0.2 * 0.9 * 1.1])
    assert seen["kl_coef"] == pytest.approx(logged)
    assert seen["gae"] == [(0.9, 0.8)] * 3
    assert seen["clip"] == [0.25] * 12  # 3 iterations x 2 minibatches x (policy loss, value loss)
    assert seen["v_grad"] == pytest.approx([0.3] * 6) and seen["pg_grad"] == pytest.approx([1.0] * 6)


def test_learning_rate_at_every_iteration_and_minibatch_orders_that_differ_between_epochs(tiny, tmp_path,
                                                                                         monkeypatch):
    """detail 4: charts/learning_rate of iteration i is --learning-rate x (1 - (i - 1) / 3) over 3 iterations
    (and --learning-rate throughout with --no-anneal-lr); detail 6: each epoch takes every response once, in
    minibatches, in an order drawn again for each epoch (found from the rollout's log-probs each minibatch's
    policy loss gets)."""
    rollouts, orders, real_policy_loss = record_rollouts(monkeypatch), [], rlhf.policy_loss

    def policy_loss(newlogprob, logprobs, *a):
        _, _, rollout_logprobs, _ = rollouts[-1]
        orders.append([next(i for i, row in enumerate(rollout_logprobs) if torch.equal(row, x)) for x in logprobs])
        return real_policy_loss(newlogprob, logprobs, *a)

    monkeypatch.setattr(rlhf, "policy_loss", policy_loss)
    for anneal_lr in (True, False):
        orders.clear()
        stats = rlhf.main(tiny_args(tiny, tmp_path / str(anneal_lr), total_episodes=24, learning_rate=3e-3,
                                    vf_learning_rate=7e-3, update_epochs=3, anneal_lr=anneal_lr))
        expected = [3e-3, 2e-3, 1e-3] if anneal_lr else [3e-3] * 3
        assert read_scalars(stats["run_dir"])["charts/learning_rate"] == pytest.approx(expected)
        assert len(orders) == 3 * 3 * 2  # iterations x epochs x minibatches of 4
        epochs = [orders[k] + orders[k + 1] for k in range(0, len(orders), 2)]
        for iteration in range(3):
            this = epochs[3 * iteration : 3 * iteration + 3]
            assert all(sorted(order) == list(range(8)) for order in this)
            assert this[0] != this[1] and this[1] != this[2] and this[0] != this[2]


def test_held_out_accuracy_and_its_standard_error_are_over_problems(tiny, monkeypatch):
    """Made-up verifier scores on 4 problems asked 3, 3, 2 and 2 times (10 responses): problem 0 always
    right, 1 never, 2 right once of twice, 3 never. Over problems: shares 1, 0, 1/2, 0, accuracy 0.375 and
    its standard error over the 4; over responses it would be 4 / 10, and counting a problem right when any
    response is, 0.5. The mean raw score is over problems too: (1 - 1 + 0 - 1) / 4."""
    problems = [f"What is {a} + 1? The answer is" for a in range(4)]
    right = {problems[0]: [True] * 3, problems[1]: [False] * 3, problems[2]: [True, False],
             problems[3]: [False, False]}
    asked = {p: 0 for p in problems}

    def sample_and_score(policy, queries, tokenizer, stop_token_id, reward_fn, args, greedy=False):
        scores = []
        for prompt in queries:  # tokenize_queries below passes the prompts through
            scores.append(1.0 if right[prompt][asked[prompt]] else -1.0)
            asked[prompt] += 1
        n = len(queries)
        return (torch.zeros(n, 2, dtype=torch.long), None, None, torch.ones(n, dtype=torch.bool),
                torch.tensor(scores))

    monkeypatch.setattr(rlhf, "tokenize_queries", lambda tokenizer, prompts, *a: prompts)
    monkeypatch.setattr(rlhf, "sample_and_score", sample_and_score)
    args = rlhf.Args(reward_model="arithmetic", eval_episodes=10, cuda=False)
    args.local_batch_size = 4
    tokenizer = rlhf.load_tokenizer(tiny["policy"], ".")[0]
    result = rlhf.evaluate(None, problems, tokenizer, 0, None, args, torch.device("cpu"))
    assert asked == {problems[0]: 3, problems[1]: 3, problems[2]: 2, problems[3]: 2}
    shares = [1.0, 0.0, 0.5, 0.0]
    assert result["prompts"] == 4
    assert result["accuracy"] == pytest.approx(0.375)
    assert result["accuracy_stderr"] == pytest.approx(statistics.stdev(shares) / 2)
    assert result["raw_score_mean"] == pytest.approx(-0.25)
    assert result["raw_score_stderr"] == pytest.approx(statistics.stdev([1.0, -1.0, 0.0, -1.0]) / 2)


@pytest.mark.parametrize("saved_before", ["reward_end_token", "reward_readout"])
def test_a_reward_model_folder_saved_before_a_config_key_existed_is_read_as_it_was_written(tiny, tmp_path,
                                                                                          saved_before):
    """A reward_model_gpt2.py folder from before config.reward_end_token existed has neither key: it was read
    with transformers' own readout, the score at the text's last token, nothing appended. One from before
    config.reward_readout existed names its end token only: the score at that token, not the mean. Texts of
    different lengths padded together; each score checked against the text alone, by hand."""
    config = {"reward_bias": 0.5} if saved_before == "reward_end_token" else {"reward_bias": 0.5,
                                                                              "reward_end_token": EOS}
    tokenizer, model = tiny_reward_folder(tiny, tmp_path / "rm", 6, **config)
    queries = ["This movie was", "The acting in this one is bad, and the plot"]
    responses = [" great.", " of this movie is worse, much worse."]
    texts = [q + r for q, r in zip(queries, responses)]
    reward_fn = rlhf.load_reward_fn(rlhf.Args(reward_model=str(tmp_path / "rm")), torch.device("cpu"))
    scores = reward_fn(texts, responses)
    for query, text, score in zip(queries, texts, scores.tolist()):
        ids = tokenizer(text)["input_ids"]
        with_end = ids + [tokenizer.eos_token_id]
        with torch.no_grad():
            hidden = model.transformer(input_ids=torch.tensor([with_end])).last_hidden_state[0]
            at_last = model.score(model.transformer(input_ids=torch.tensor([ids])).last_hidden_state[0, -1])
            at_end = model.score(hidden[-1])
            mean = model.score(hidden[len(tokenizer(query)["input_ids"]) :].mean(0))
        written, others = (at_last, [at_end, mean]) if saved_before == "reward_end_token" else (at_end, [mean])
        assert score == pytest.approx(written.item() + 0.5, abs=1e-5)
        assert all(abs(score - other.item() - 0.5) > 1e-4 for other in others)


@pytest.mark.parametrize("digits, test_pairs", [(2, 767), (3, 101106)])  # 4095 // 4 - 256; 405450 // 4 - 256
def test_the_test_split_is_held_out_sums_no_256_prompt_evaluation_reached_each_once(digits, test_pairs):
    import grpo_gpt2 as grpo

    random.seed(5)
    test = rlhf.arithmetic_problems(digits, held_out=True, test=True)
    random.seed(6)
    assert test == rlhf.arithmetic_problems(digits, held_out=True, test=True)  # fixed, whatever the random state
    assert test == grpo.arithmetic_problems(digits, held_out=True, test=True)
    held_out = rlhf.arithmetic_problems(digits, held_out=True)
    pairs = [tuple(sorted(map(int, re.findall(r"\d+", p)))) for p in test]
    assert len(test) == len(set(pairs)) == test_pairs  # every sum once: no a + b beside b + a
    assert set(test) <= set(held_out) and not set(test) & set(held_out[:256])
    assert not set(test) & set(rlhf.arithmetic_problems(digits, held_out=False))
    read = {tuple(sorted(map(int, re.findall(r"\d+", p)))) for p in held_out[:256]}
    assert not set(pairs) & read  # nor the other order of a sum read before
    ordered = [int(re.findall(r"\d+", p)[0]) <= int(re.findall(r"\d+", p)[1]) for p in test]
    assert 0.4 < np.mean(ordered) < 0.6  # both orders, by the coin


def test_main_scores_the_test_split_and_logs_the_training_cpu_seconds(tiny, tmp_path, monkeypatch):
    scored, real = [], rlhf.evaluate
    monkeypatch.setattr(rlhf, "evaluate", lambda policy, prompts, *a, **kw: scored.append(list(prompts)) or
                        real(policy, prompts, *a, **kw))
    before = time.process_time()
    stats = rlhf.main(tiny_args(tiny, tmp_path, reward_model="arithmetic", arithmetic_digits=2, eval_split="test",
                                eval_episodes=4, total_episodes=24, batch_size=8))
    spent = time.process_time() - before
    assert len(scored) == 2 and all(p == rlhf.arithmetic_problems(2, held_out=True, test=True) for p in scored)
    events = EventAccumulator(stats["run_dir"])
    events.Reload()
    cpu = [e.value for e in events.Scalars("time/train_cpu")]
    assert len(cpu) == 3 and 0 < cpu[0] < cpu[1] < cpu[2] < spent  # a running total of this process's CPU


def test_the_validation_split_is_grpo_s_and_main_evaluates_it(tiny, tmp_path, monkeypatch):
    """--eval-split validation (the tuning of experiments/ppo_vs_grpo.py): the same training and evaluated
    prompts as grpo_gpt2.py's, and what main() scores at each evaluation."""
    import grpo_gpt2 as grpo

    for split in ("held_out", "validation"):
        for task in (dict(reward_model="arithmetic", arithmetic_digits=1), dict()):
            ours = rlhf.load_prompts(tiny_args(tiny, tmp_path, eval_split=split, **task))
            theirs = grpo.load_prompts(grpo.Args(model_name=tiny["policy"], eval_split=split, **task))
            assert ours == theirs
    validation = grpo.arithmetic_problems(1, held_out=False, validation=True)
    scored = []
    real = rlhf.evaluate
    monkeypatch.setattr(rlhf, "evaluate", lambda policy, prompts, *a, **kw: scored.append(list(prompts)) or
                        real(policy, prompts, *a, **kw))
    rlhf.main(tiny_args(tiny, tmp_path, reward_model="arithmetic", arithmetic_digits=1, eval_split="validation",
                        eval_episodes=4))
    assert len(scored) == 2 and all(p == validation for p in scored)  # the initial and the final policy
