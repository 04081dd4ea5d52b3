"""Token-level PPO on a causal language model (GPT-2 by default) with a KL penalty: RLHF, every detail.

The PPO of `ppo_walker2d.py` seen through a language model: the state is the query (prompt) plus the response
tokens so far, the action is the next token, the policy is the language model, and an episode is one
response, which ends at its first stop token (or after `response_length` tokens). The reward is the reward
model's score at the end of the response minus a per-token KL penalty against a frozen reference model.
Four models: the policy and the value model (its own backbone, a scalar head) are trained; the reference (the
initial policy) and the reward model are frozen. Task: sentiment (the default) or `--reward-model arithmetic`,
a verifiable reward (RLVR): "What is 3 + 4? The answer is" gets +1 if the answer's first number is 7, else -1.

Papers: Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences" (arXiv:1909.08593);
Huang et al. 2024, "The N+ Implementation Details of RLHF with PPO" (arXiv:2403.17031);
PPO: Schulman et al. 2017 (arXiv:1707.06347); GAE: Schulman et al. 2016 (arXiv:1506.02438).

Usage:
    python ppo_rlhf_gpt2.py --model-name gpt2 --reward-model lvwerra/distilbert-imdb
    python ppo_rlhf_gpt2.py --model-name ./my-gpt2 --reward-model vader --save-model   # offline
    python ppo_rlhf_gpt2.py --eval-checkpoint runs/<run>/model --reward-model vader   # score a saved policy
    python ppo_rlhf_gpt2.py --reward-model arithmetic --response-length 8 --min-response-length 0  # RLVR
    torchrun --nproc_per_node 8 ppo_rlhf_gpt2.py --batch-size 512   # data parallel: 64 responses per GPU
    tensorboard --logdir runs

What the code computes (t is a response token; response_mask: True on real tokens, stop token included):
    pi(a_t | s_t) = softmax(logits_t / temperature)[a_t]     (logprobs: log pi; ref_logprobs: the reference's)
    kl_t          = logprobs_t - ref_logprobs_t   (k1; k3: (q - 1) - log q with q = pi_ref / pi)
    rewards_t     = -kl_coef * kl_t (non_score_reward), plus scores at the last real token
    delta_t       = rewards_t + gamma * values_{t+1} - values_t       (values after the last real token: 0)
    advantages_t  = delta_t + gamma * gae_lambda * advantages_{t+1},  returns_t = advantages_t + values_t
    ratio         = exp(newlogprob - logprobs)
    pg_loss       = mean over real tokens of max(-A * ratio, -A * clip(ratio, 1 - clip_coef, 1 + clip_coef))
    v_loss        = 0.5 * mean over real tokens of max((V - R)^2, (values + clip(V - values) - R)^2)
    loss          = pg_loss + vf_coef * v_loss                        (no entropy bonus)

Implementation details (1-13: "The 37 Implementation Details of PPO"; 23 on: RLHF's), marked "detail N":
 1. A batch of prompts plays the part of the vectorized envs: one response (episode) per query.
 2. The value head starts at zero (as in lm-human-preferences), so the first values are 0, not noise.
 3. Adam with eps = 1e-5.   4. The learning rate decays linearly to 0.   5. GAE over the real tokens.
 6. Epochs over shuffled minibatches; a minibatch may be split into micro-batches whose gradients are
    accumulated, each weighted by its share of the minibatch's real tokens.
 7. Advantage whitening over the whole batch, masked (padding enters neither the mean nor the std).
 8. Clipped surrogate objective.       9. Clipped value loss.       (both averaged over real tokens)
10. One loss, no entropy bonus, one Adam over the policy and the value model.  11. Gradient-norm clipping.
12. Debug variables: approx_kl, clipfrac, explained variance.  13. Separate policy and value networks.
23. A pad token distinct from EOS, never fed to a model and never sampled (masked out of the logits).
24. Left padding of the queries: every query ends in the same column and the response follows it.
25. Position ids computed from the attention mask in every forward pass.
26. Logits divided by the sampling temperature in every forward pass (policy and reference).
27. Pure sampling (no top-k, no top-p), the log-probs recorded from the sampling logits.
28. Dropout off in all models: eval mode everywhere, also during the update.
29. Truncation after the first stop token at or after --min-response-length tokens: what follows is
    padding, masked out of the KL, the values, the advantages and the losses.
30. The EOS trick: a response without that stop token gets --missing-eos-penalty instead of its score.
31. Reward normalization: the scores set to mean 0 and std 1 on the initial policy's samples, once;
    optionally the per-token rewards whitened (masked) in every batch.
32. Per-token KL penalty against the frozen reference model, the score added at the last real token.
33. KL coefficient fixed (--kl-coef) or adaptive (--kl-target, --kl-horizon), clamped so it stays positive.
34. The value of token t read at the position before it, where the logits that sampled t are read.
53. --bf16: the models' passes in bfloat16 autocast (not the reward model's); weights, log-probs, losses fp32;
    the old log-probs and the reference's from full passes of the update's shape: a first ratio of exactly 1.
Lines marked "torchrun" split the batch over processes, compute statistics over all, and sync gradients.
"""

import copy
import functools
import importlib.util
import json
import os
import random
import re
import sys
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter
from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification,
                          AutoTokenizer, Conv1D)


@dataclass
class Args:
    """Why the defaults differ from lm-human-preferences': docs/results/ppo_rlhf_gpt2.md#why-these-defaults"""

    # experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]  # part of the run directory name
    seed: int = 1  # seed of python, numpy and torch
    torch_deterministic: bool = True  # if toggled, `torch.backends.cudnn.deterministic=True`
    cuda: bool = True  # if toggled and a GPU is available, train on it (torchrun: one GPU a process)
    bf16: bool = False  # bfloat16 autocast (detail 53), not the reward model; slow on CPUs without bf16
    num_threads: int = 1  # torch CPU threads (each process's, under torchrun)
    runs_dir: str = "runs"  # TensorBoard logs and the saved model go to <runs_dir>/<run_name>/
    save_model: bool = False  # save the policy and its tokenizer (save_pretrained) to <run dir>/model
    log_samples_every: int = 10  # log a table of (query, response, score) every this many iterations
    eval_episodes: int = 256  # held-out responses scoring the initial and final policy (0: no evaluation)
    eval_checkpoint: str | None = None  # a --save-model folder: only score it on the held-out prompts
    eval_every: int = 0  # also score the held-out prompts every this many iterations (0: before and after)
    eval_split: Literal["held_out", "validation", "test"] = "held_out"  # validation: set-aside training sums
    eval_greedy: bool = False  # also score greedy decoding (the most likely token at every step)

    # models and task
    model_name: str = "gpt2"  # the policy: a causal LM's hub id or local directory
    value_model: str | None = None  # the value model's backbone (default: a copy of the policy's)
    reward_model: str = "lvwerra/distilbert-imdb"  # a classifier id or folder, vader, length or arithmetic
    arithmetic_digits: int = 1  # --reward-model arithmetic: the number of digits of each operand
    reward_label: int = 1  # the classifier's logit used as the score (1: POSITIVE in distilbert-imdb; a
    # one-label reward model, such as reward_model_gpt2.py's, has one logit, which is always used)
    prompts_file: str | None = None  # one prompt per line (default: the built-in movie-review openings)
    max_query_length: int = 32  # longer queries lose their first tokens (lm-human-preferences: 64)
    response_length: int = 24  # number of tokens sampled for each response
    min_response_length: int = 16  # a stop token earlier than this many tokens does not end the response
    temperature: float = 0.7  # sampling temperature: the policy is softmax(logits / temperature)
    stop_token: str = "."  # `eos` or a single-token string: responses are truncated after it

    # algorithm
    total_episodes: int = 10_000  # responses sampled during training (lm-human-preferences: 1M)
    batch_size: int = 64  # responses per iteration, over all torchrun processes (lm-human-preferences: 512)
    num_minibatches: int = 4  # minibatches per batch and epoch (lm-human-preferences: 1)
    gradient_accumulation_steps: int = 1  # micro-batches per minibatch, their gradients accumulated
    local_rollout_forward_batch_size: int = 16  # responses per reference, value and reward pass
    update_epochs: int = 4  # the K epochs to update the policy and value model per batch
    learning_rate: float = 1.41e-5  # the learning rate of Adam (TRL's; lm-human-preferences: 1e-5)
    vf_learning_rate: float | None = None  # the value model's learning rate (None: --learning-rate)
    anneal_lr: bool = True  # anneal the learning rate linearly to 0
    gamma: float = 1.0  # the discount factor
    gae_lambda: float = 0.95  # the lambda of generalized advantage estimation
    norm_adv: bool = True  # whiten the advantages of each batch
    clip_coef: float = 0.2  # the surrogate clipping coefficient
    clip_vloss: bool = True  # use a clipped value loss
    vf_coef: float = 0.1  # coefficient of the value loss
    max_grad_norm: float = 1.0  # the maximum norm of the global gradient
    kl_coef: float = 0.15  # the (initial) coefficient of the per-token KL penalty
    kl_estimator: Literal["k1", "k3"] = "k1"  # the per-token KL estimator (see the docstring)
    kl_target: float | None = 6.0  # adaptive KL: target KL per response in nats (None: --kl-coef fixed)
    kl_horizon: int = 10_000  # adaptive KL: the controller's horizon, in episodes
    missing_eos_penalty: float | None = -1.0  # the score of a response without the stop token (None: off)
    normalize_scores: bool = True  # scale and shift scores to mean 0, std 1 on the initial policy
    norm_batches: int = 4  # initial-policy batches that set the score normalization
    whiten_rewards: bool = False  # whiten the per-token rewards (masked, mean kept) before GAE (TRL's)

    # computed in check_args
    world_size: int = 0  # computed: the number of processes (1, or torchrun's)
    rank: int = 0  # computed: this process's index among them
    local_batch_size: int = 0  # computed: the responses this process samples per iteration
    minibatch_size: int = 0  # computed: this process's share of a minibatch
    micro_batch_size: int = 0  # computed: the micro-batch size
    num_iterations: int = 0  # computed: total_episodes // batch_size


# ------------------------------------------------------------------------------------------------------------
# The task: batches of queries (prompts) in, scored responses out; the rollout and the evaluation use both.


def query_batches(prompts: list[str], tokenizer, args: Args, device: torch.device):
    """detail 1: batches of args.batch_size queries, one shuffled pass over the prompts after another."""
    rng, indices = random.Random(args.seed), []  # the same draws in every process
    while True:
        while len(indices) < args.batch_size:
            order = list(range(len(prompts)))
            rng.shuffle(order)
            indices += order
        batch, indices = [prompts[i] for i in indices[: args.batch_size]], indices[args.batch_size :]
        batch = batch[args.rank * args.local_batch_size : (args.rank + 1) * args.local_batch_size]  # torchrun
        yield tokenize_queries(tokenizer, batch, args.max_query_length, device)


def tokenize_queries(tokenizer, prompts: list[str], max_query_length: int, device) -> torch.Tensor:
    # detail 24: the tokenizer pads (and truncates) on the left
    return tokenizer(prompts, padding=True, truncation=True, max_length=max_query_length,
                     return_tensors="pt")["input_ids"].to(device)


def sample_and_score(policy, queries, tokenizer, stop_token_id: int, reward_fn, args: Args, greedy=False):
    """Returns responses (truncated after the stop token), logprobs, response_mask (True on the real tokens,
    the stop token included), contain_stop and the raw scores of the reward function, which reads text."""
    pad_token_id = tokenizer.pad_token_id
    responses, logprobs = generate(policy, queries, args.response_length, args.temperature, pad_token_id,
                                   greedy, args.bf16)
    responses, response_mask, contain_stop = truncate_after_stop_token(responses, stop_token_id, pad_token_id,
                                                                       args.min_response_length)
    texts = tokenizer.batch_decode(torch.cat([queries, responses], dim=1), skip_special_tokens=True)
    response_texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    chunk = args.local_rollout_forward_batch_size  # the reward model's passes in chunks, to bound memory
    raw_scores = torch.cat([reward_fn(texts[i : i + chunk], response_texts[i : i + chunk])
                            for i in range(0, len(texts), chunk)])
    return responses, logprobs, response_mask, contain_stop, raw_scores


# ------------------------------------------------------------------------------------------------------------
# The networks: how the policy, the reference and the value model read (query, response) tokens.


class ValueModel(nn.Module):
    """detail 13: V(s_t), a transformer backbone of its own with a scalar head on every position."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)  # detail 2: the first values are 0, not noise
        nn.init.zeros_(self.head.bias)

    def forward(self, **inputs) -> torch.Tensor:  # detail 53: the head in fp32, as the reward model's
        return self.head(self.backbone(**inputs).last_hidden_state.float()).squeeze(-1)


def model_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
    """The inputs of every forward pass except generation's, any padding side (the mask: 1 on real tokens)."""
    attention_mask = attention_mask.bool()
    # detail 25: position ids from the attention mask: the first real token is at 0 whatever the padding
    position_ids = attention_mask.cumsum(1) - attention_mask.long()
    # detail 23: the pad id may be outside the vocabulary; padded positions are masked out, any id will do
    return dict(input_ids=input_ids.masked_fill(~attention_mask, 0), attention_mask=attention_mask,
                position_ids=position_ids, use_cache=False)  # one whole pass: no KV cache (less memory)


def scale_logits(logits: torch.Tensor, temperature: float, pad_token_id: int) -> torch.Tensor:
    """detail 26: the policy is softmax(logits / temperature), in every forward pass."""
    logits = logits.float() / temperature  # fp32 from here on, also under --bf16
    if pad_token_id < logits.shape[-1]:
        # detail 23: a pad id inside the vocabulary is never a valid action (it would be read as padding)
        logits[..., pad_token_id] = torch.finfo(logits.dtype).min
    return logits


def response_logits(model, query_responses: torch.Tensor, context_length: int, temperature: float,
                    pad_token_id: int) -> torch.Tensor:
    """Scaled logits of the distributions the response tokens were sampled from: (batch, response_length,
    vocab). The logits at position i predict token i + 1, so the response tokens are predicted at positions
    context_length - 1 ... L - 2; only those go through the (vocabulary-sized) output layer."""
    positions = torch.arange(context_length - 1, query_responses.shape[1] - 1, device=query_responses.device)
    output = model(**model_inputs(query_responses, query_responses != pad_token_id), logits_to_keep=positions)
    return scale_logits(output.logits, temperature, pad_token_id)


def response_values(value_model, query_responses: torch.Tensor, context_length: int,
                    pad_token_id: int) -> torch.Tensor:
    """detail 34: V(s_t) for each response token t, read where the logits that sampled token t are read."""
    inputs = model_inputs(query_responses, query_responses != pad_token_id)
    return value_model(**inputs)[:, context_length - 1 : -1].float()


def gather_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def autocast_bf16(bf16: bool, device: torch.device, *models, seed: int = 0, jitter: bool = True) -> None:
    """detail 53: with --bf16, each model's forward in bfloat16 autocast, weights fp32; a weight's bf16 copy
    lives for one pass (generate: its loop). After deep copies: a copy runs the original's forward. Each
    weight of a matrix product (nn.Linear, Conv1D) first moves to a random fp32 value that rounds to the same
    bf16 one (by --seed: alike in every copy; not if jitter is False), so that a step under that cell moves
    its bf16 value w.p. step / cell. A weight tied to an embedding stays: the lookup reads it in fp32."""
    for model in [m for m in models if bf16 and m is not None]:
        model.forward = torch.autocast(device.type, dtype=torch.bfloat16)(model.forward)
        generator = torch.Generator().manual_seed(seed)
        fp32 = {id(p) for m in model.modules() if not isinstance(m, (nn.Linear, Conv1D))  # norms, embeddings
                for p in m.parameters(recurse=False)}  # and a tied output layer's weight: read as they are
        for w in [w for w in model.parameters() if jitter and id(w) not in fp32]:  # +-0x7fff: bf16(w)'s cell
            noise = torch.randint(-0x7FFF, 0x8000, w.shape, dtype=torch.int32, generator=generator)
            bits = w.detach().bfloat16().float().abs().view(torch.int32) + noise.to(w.device)
            w.data.copy_(bits.clamp(min=0).view(torch.float32).copysign(w.detach()))


@torch.no_grad()  # not inference_mode, which turns autocast's weight cache off (53)
def generate(policy, queries: torch.Tensor, response_length: int, temperature: float, pad_token_id: int,
             greedy: bool = False, bf16: bool = False):
    """Sample response_length tokens after each left-padded query with the KV cache (greedy: the likeliest
    token, for evaluation). Returns the responses and their log-probs, both (batch, response_length)."""
    inputs = model_inputs(queries, queries != pad_token_id)  # details 24, 25: left padding, positions from it
    attention_mask, position_ids = inputs["attention_mask"], inputs["position_ids"]
    input_ids, past_key_values, responses, logprobs = inputs["input_ids"], None, [], []
    with torch.autocast(queries.device.type, dtype=torch.bfloat16, enabled=bf16):  # detail 53: cast once
        for _ in range(response_length):
            output = policy(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            past_key_values=past_key_values, use_cache=True, logits_to_keep=1)
            past_key_values = output.past_key_values
            logits = scale_logits(output.logits[:, -1], temperature, pad_token_id)  # detail 26
            # detail 27: pure sampling from the full distribution (no top-k, no top-p)
            token = logits.argmax(-1, keepdim=True) if greedy else torch.multinomial(logits.softmax(-1), 1)
            responses.append(token)
            logprobs.append(gather_logprobs(logits, token.squeeze(-1)))
            input_ids = token  # the next step feeds only the new token; the cache holds the rest
            attention_mask = torch.cat([attention_mask, torch.ones_like(token, dtype=torch.bool)], dim=1)
            position_ids = position_ids[:, -1:] + 1
    return torch.cat(responses, dim=1), torch.stack(logprobs, dim=1)


# ------------------------------------------------------------------------------------------------------------
# The math: tensors in, tensors out (each function is tested against an explicit reference).


def truncate_after_stop_token(responses: torch.Tensor, stop_token_id: int, pad_token_id: int,
                              min_response_length: int = 0):
    """detail 29: keep each response up to and including its first stop token at index min_response_length
    or later, and pad what follows. Returns the truncated responses, the response mask (True on the real
    tokens: up to and including that stop token) and whether each response contains such a stop token."""
    is_stop = responses == stop_token_id
    is_stop[:, :min_response_length] = False  # too early to end the response
    contain_stop = is_stop.any(dim=1)
    last_index = torch.where(contain_stop, is_stop.int().argmax(dim=1), responses.shape[1] - 1)
    response_mask = torch.arange(responses.shape[1], device=responses.device) <= last_index.unsqueeze(1)
    return responses.masked_fill(~response_mask, pad_token_id), response_mask, contain_stop


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x where mask is True; masked entries cannot leak in, even as inf or nan."""
    return torch.where(mask, x, 0.0).sum() / mask.sum()


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) / std over the entries where mask is True, in all processes under torchrun; masked entries
    become 0."""
    count = all_sum(mask.sum())  # torchrun: all_sum adds up the processes' tensors (one process: as is)
    mean = all_sum(torch.where(mask, x, 0.0).sum()) / count
    var = all_sum(torch.where(mask, (x - mean) ** 2, 0.0).sum()) / count
    var = var * count / (count - 1).clamp(min=1)  # unbiased
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask, whitened, 0.0)


def score_normalization(raw_scores: torch.Tensor) -> tuple[float, float]:
    """detail 31: (gain, bias) such that gain * raw_scores + bias has mean 0 and std 1. A reward that is
    constant on these samples has no scale to normalize: its gain is 1 (it is only shifted)."""
    std = raw_scores.std().item() if raw_scores.numel() > 1 else 0.0
    gain = 1.0 / std if std > 1e-6 else 1.0
    return gain, -raw_scores.mean().item() * gain


def compute_rewards(scores, contain_stop, missing_eos_penalty, logprobs, ref_logprobs, response_mask, kl_coef,
                    kl_estimator="k1"):
    """Per-token rewards: -kl_coef * kl on every real token, plus the score at the last real token. Returns
    rewards, kl and non_score_reward (batch, response_length), all 0 after the last real token, and
    penalized_scores (batch,): the scores after the EOS trick, the ones the rewards hold."""
    penalized_scores = scores
    if missing_eos_penalty is not None:
        # detail 30: the EOS trick: no stop token, no reward-model score
        penalized_scores = torch.where(contain_stop, scores, torch.full_like(scores, missing_eos_penalty))
    # detail 32: per-token KL penalty against the reference policy, the score at the last real token
    logr = ref_logprobs - logprobs  # log(pi_ref / pi) of the sampled token
    kl = -logr if kl_estimator == "k1" else (logr.exp() - 1) - logr
    kl = kl.masked_fill(~response_mask, 0.0)
    non_score_reward = -kl_coef * kl
    rewards = non_score_reward.clone()
    last_index = response_mask.sum(dim=1) - 1
    rewards[torch.arange(rewards.shape[0], device=rewards.device), last_index] += penalized_scores
    return rewards, kl, non_score_reward, penalized_scores


def compute_gae(rewards, values, response_mask, gamma: float, gae_lambda: float):
    """detail 5: generalized advantage estimation over the real tokens of each response. The episode ends at
    its last real token: the values after it count as 0 (no bootstrap), and the rewards there are 0, so
    padding adds nothing. Returns advantages and returns (batch, response_length)."""
    values = values.masked_fill(~response_mask, 0.0)
    response_length = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(response_length)):
        nextvalues = values[:, t + 1] if t < response_length - 1 else torch.zeros_like(values[:, t])
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * gae_lambda * lastgaelam
        advantages[:, t] = lastgaelam
    returns = advantages + values
    return advantages.masked_fill(~response_mask, 0.0), returns.masked_fill(~response_mask, 0.0)


def policy_loss(newlogprob, logprobs, advantages, response_mask, clip_coef: float):
    """detail 8: the clipped surrogate objective averaged over the real tokens (response_mask True), as a loss
    to minimize. Returns (pg_loss, ratio, logratio)."""
    logratio = newlogprob - logprobs
    ratio = logratio.exp()
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    return masked_mean(torch.max(pg_loss1, pg_loss2), response_mask), ratio, logratio


def value_loss(newvalue, values, returns, response_mask, clip_coef: float, clip_vloss: bool):
    """Squared-error value loss averaged over the real tokens, optionally clipped around the rollout's
    values (detail 9)."""
    v_loss_unclipped = (newvalue - returns) ** 2
    if not clip_vloss:
        return 0.5 * masked_mean(v_loss_unclipped, response_mask)
    v_clipped = values + torch.clamp(newvalue - values, -clip_coef, clip_coef)
    v_loss_clipped = (v_clipped - returns) ** 2
    return 0.5 * masked_mean(torch.max(v_loss_unclipped, v_loss_clipped), response_mask)


def debug_variables(all_logprobs, ratio, logratio, response_mask, clip_coef: float) -> dict:
    """detail 12: the policy's entropy, the KL estimates, the clip fraction and the mean ratio over the real
    tokens, as tensors (collecting them does not wait for the device)."""
    entropy = -(all_logprobs.exp() * all_logprobs).sum(-1)
    return {"entropy": masked_mean(entropy, response_mask),
            "old_approx_kl": masked_mean(-logratio, response_mask),
            "approx_kl": masked_mean((ratio - 1) - logratio, response_mask),
            "clipfrac": masked_mean(((ratio - 1.0).abs() > clip_coef).float(), response_mask),
            "ratio": masked_mean(ratio, response_mask)}


def adaptive_kl_coef(kl_coef: float, kl: float, kl_target: float, kl_horizon: int, n_steps: int,
                     initial_kl_coef: float) -> float:
    """detail 33: the proportional KL controller of Ziegler et al. (2019). Each change is at most a factor
    of 2 either way, and the coefficient stays within 1/100 and 100 times its initial value, so a short
    horizon or a large batch cannot make it negative or explode."""
    proportional_error = float(np.clip(kl / kl_target - 1, -0.2, 0.2))
    factor = float(np.clip(1 + proportional_error * n_steps / kl_horizon, 0.5, 2.0))
    return float(np.clip(kl_coef * factor, initial_kl_coef / 100, initial_kl_coef * 100))


# ------------------------------------------------------------------------------------------------------------
# Training


def main(args: Args) -> dict:
    # 1. setup
    check_args(args)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed + args.rank)  # torchrun: each process samples its own responses
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate_checkpoint(args, device)
    if args.world_size > 1:  # torchrun: join the other processes (NCCL on GPUs, gloo on CPUs)
        device = init_process_group(args, device)

    run_dir = os.path.join(args.runs_dir, f"{args.exp_name}__{args.seed}__{int(time.time())}")
    prompts, eval_prompts = load_prompts(args)  # training, held-out; the loading functions are below main()
    tokenizer, pad_token_id, stop_token_id = load_tokenizer(args.model_name, args.stop_token)
    query_iter = query_batches(prompts, tokenizer, args, device)  # detail 1
    policy = load_policy(args.model_name, device)
    ref_policy = copy.deepcopy(policy).requires_grad_(False)  # the frozen reference: the initial policy
    value_model = load_value_model(args.value_model, policy, device)  # detail 13
    # detail 53, after the copies
    autocast_bf16(args.bf16, device, policy, ref_policy, value_model.backbone, seed=args.seed)
    reward_fn = load_reward_fn(args, device)
    # details 3 and 10: one Adam (eps 1e-5) over both trained models, as one loss trains them both, with a
    # learning rate for each (the same by default); fused: one in-place kernel per tensor, faster and
    # without full-size temporaries
    policy_parameters, value_parameters = list(policy.parameters()), list(value_model.parameters())
    trained_parameters = policy_parameters + value_parameters
    vf_learning_rate = args.learning_rate if args.vf_learning_rate is None else args.vf_learning_rate
    optimizer = torch.optim.Adam([{"params": policy_parameters, "lr": args.learning_rate},
                                  {"params": value_parameters, "lr": vf_learning_rate}], eps=1e-5, fused=True)
    # torchrun: the update's passes go through DDP, whose backward averages the gradients over the processes
    train_policy, train_value_model = policy, value_model
    if args.world_size > 1:
        train_policy, train_value_model = (nn.parallel.DistributedDataParallel(m)
                                           for m in (policy, value_model))

    def sample(model, queries):
        return sample_and_score(model, queries, tokenizer, stop_token_id, reward_fn, args)

    # detail 31: reward normalization, computed once from the initial policy's samples
    score_gain, score_bias = 1.0, 0.0
    if args.normalize_scores:
        initial_samples = [sample(policy, next(query_iter)) for _ in range(args.norm_batches)]
        initial_raw_scores = torch.cat([raw_scores for _, _, _, _, raw_scores in initial_samples])
        initial_raw_scores = all_gather(initial_raw_scores)  # torchrun: the scores of all processes
        score_gain, score_bias = score_normalization(initial_raw_scores)
        if score_gain == 1.0:
            print(f"the reward is constant ({initial_raw_scores[0].item():.4g}) on the initial policy's "
                  "samples: scores are shifted to mean 0 but not scaled")

    writer = SummaryWriter(run_dir) if args.rank == 0 else NoWriter()  # torchrun: process 0 logs
    writer.add_text("hyperparameters", markdown_table(list(vars(args).items()), ("param", "value")))
    eval_stats = {}  # held_out_evaluation(policy, ...): sampled (and greedy with --eval-greedy), logged, kept
    held_out_evaluation = functools.partial(evaluate_and_log, eval_prompts, tokenizer, stop_token_id,
                                            reward_fn, args, device, writer, eval_stats)
    if args.eval_episodes > 0 and args.rank == 0:  # torchrun: process 0 evaluates
        held_out_evaluation(policy, "initial", 0)
    kl_coef = args.kl_coef
    stats, iteration, interrupted, start_time, train_cpu = {}, 0, False, time.time(), 0.0
    try:
        for iteration in range(1, args.num_iterations + 1):
            if args.anneal_lr:  # detail 4
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate
                optimizer.param_groups[1]["lr"] = frac * vf_learning_rate

            # 2. rollout: the responses and their scores, the reference's log-probs and the values
            iteration_start, cpu_start = time.time(), time.process_time()  # train_cpu: no evaluation in it
            queries = next(query_iter)
            context_length = queries.shape[1]
            responses, logprobs, response_mask, contain_stop, raw_scores = sample(policy, queries)
            real_responses = responses.masked_fill(~response_mask, 0)  # detail 23: pad ids may be outside
            query_responses = torch.cat([queries, responses], dim=1)
            # detail 53 (--bf16): passes of the update's micro-batch shape, the old log-probs from full passes
            chunk = args.micro_batch_size if args.bf16 else args.local_rollout_forward_batch_size
            ref_logprobs = logprobs_in_chunks(ref_policy, query_responses, real_responses, context_length,
                                              chunk, args.temperature, pad_token_id)
            if args.bf16:
                logprobs = logprobs_in_chunks(policy, query_responses, real_responses, context_length,
                                              chunk, args.temperature, pad_token_id)
            with torch.inference_mode():
                values = torch.cat([response_values(value_model, query_responses[i : i + chunk],
                                                    context_length, pad_token_id)
                                    for i in range(0, args.local_batch_size, chunk)])
                scores = score_gain * raw_scores + score_bias  # detail 31
            rollout_time = time.time() - iteration_start

            # 3. advantages
            with torch.inference_mode():
                rewards, kl, non_score_reward, penalized_scores = compute_rewards(  # details 30, 32
                    scores, contain_stop, args.missing_eos_penalty, logprobs, ref_logprobs, response_mask,
                    kl_coef, args.kl_estimator)
                if args.whiten_rewards:  # detail 31: optional reward whitening, keeping the mean
                    rewards = masked_whiten(rewards, response_mask, shift_mean=False)
                advantages, returns = compute_gae(rewards, values, response_mask, args.gamma, args.gae_lambda)
                if args.norm_adv:  # detail 7: over the whole batch, masked
                    advantages = masked_whiten(advantages, response_mask)

            # 4. update
            update_start = time.time()
            update_stats = {}  # for each debug variable, one tensor per micro-batch; averaged in 5.
            for epoch in range(args.update_epochs):
                b_inds = torch.randperm(args.local_batch_size, device=device)
                for start in range(0, args.local_batch_size, args.minibatch_size):  # detail 6
                    mb_inds = b_inds[start : start + args.minibatch_size]
                    minibatch_tokens = all_sum(response_mask[mb_inds].sum())  # torchrun: of all processes
                    for micro_start in range(0, args.minibatch_size, args.micro_batch_size):
                        micro_inds = mb_inds[micro_start : micro_start + args.micro_batch_size]
                        micro_mask = response_mask[micro_inds]  # the micro-batch's rows of response_mask
                        # only the log-softmax of the logits is kept (backward needs it, not the logits)
                        all_logprobs = response_logits(train_policy, query_responses[micro_inds],
                                                       context_length, args.temperature,
                                                       pad_token_id).log_softmax(-1)
                        newlogprob = all_logprobs.gather(-1, real_responses[micro_inds, :, None]).squeeze(-1)
                        newvalue = response_values(train_value_model, query_responses[micro_inds],
                                                   context_length, pad_token_id)
                        pg_loss, ratio, logratio = policy_loss(newlogprob, logprobs[micro_inds],
                                                               advantages[micro_inds], micro_mask,
                                                               args.clip_coef)
                        v_loss = value_loss(newvalue, values[micro_inds], returns[micro_inds], micro_mask,
                                            args.clip_coef, args.clip_vloss)
                        loss = pg_loss + args.vf_coef * v_loss  # detail 10
                        # detail 6: the minibatch's loss, a mean over its real tokens, is the weighted mean
                        # of its micro-batches' losses, weights micro_tokens / minibatch_tokens (torchrun:
                        # times world_size, as DDP averages the gradients over the processes). With the
                        # defaults (one process, no accumulation) the weight is 1: this is loss.backward().
                        micro_tokens = micro_mask.sum()
                        (loss * micro_tokens * args.world_size / minibatch_tokens).backward()
                        with torch.no_grad():
                            debug = debug_variables(all_logprobs, ratio, logratio, micro_mask, args.clip_coef)
                            for k, v in dict(policy_loss=pg_loss, value_loss=v_loss, **debug).items():
                                update_stats.setdefault(k, []).append(v.detach())
                        del all_logprobs, newlogprob, debug
                    nn.utils.clip_grad_norm_(trained_parameters, args.max_grad_norm)  # detail 11
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            update_time, train_cpu = time.time() - update_start, train_cpu + time.process_time() - cpu_start

            # 5. logging
            update_stats = {k: torch.stack(v).double().mean().item() for k, v in update_stats.items()}
            mean_kl = kl.sum(1).mean().item()
            mean_non_score_reward = non_score_reward.sum(1).mean().item()
            y_pred, y_true = values[response_mask], returns[response_mask]
            var_y = y_true.var().item()
            explained_var = np.nan if var_y == 0 else 1 - (y_true - y_pred).var().item() / var_y  # detail 12
            distinct_responses, distinct_2 = diversity(responses, response_mask)
            lengths, right = response_mask.sum(1).float(), raw_scores > 0  # right: the verifier's +1
            stats = {
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                "charts/SPS": iteration * args.batch_size * args.response_length / (time.time() - start_time),
                "charts/episodic_length": lengths.mean().item(),
                **{f"losses/{k}": v for k, v in update_stats.items() if k != "ratio"},
                "losses/explained_variance": explained_var,
                "objective/scores": penalized_scores.mean().item(),
                "objective/raw_scores": raw_scores.mean().item(),
                "objective/kl": mean_kl,
                "objective/kl_coef": kl_coef,
                "objective/non_score_reward": mean_non_score_reward,
                # the episode's return: its score plus its KL penalty
                "objective/rlhf_reward": mean_non_score_reward + penalized_scores.mean().item(),
                # -log pi of the sampled tokens, summed over the response: a one-sample estimate of the
                # response's entropy, in nats (losses/entropy: the mean next-token entropy in the update)
                "objective/response_entropy": (-logprobs).masked_fill(~response_mask, 0).sum(1).mean().item(),
                "val/num_eos_tokens": contain_stop.sum().item() * args.world_size,  # a sum, after the mean
                "val/ratio": update_stats["ratio"],
                "val/distinct_responses": distinct_responses, "val/distinct_2": distinct_2,
                "time/rollout": rollout_time, "time/update": update_time, "time/train_cpu": train_cpu,
            }
            if args.reward_model == "arithmetic":  # lengths of the right and the wrong responses (nan: none)
                stats["val/length_right"] = lengths[right].mean().item()
                stats["val/length_wrong"] = lengths[~right].mean().item()
            stats = mean_over_processes(stats, device)  # torchrun: each statistic's mean over the processes
            for tag, value in stats.items():
                writer.add_scalar(tag, value, iteration)
            if iteration == 1 or iteration % args.log_samples_every == 0 or iteration == args.num_iterations:
                table = samples_table(tokenizer, queries, responses, penalized_scores)
                writer.add_text("samples", table, iteration)
            print(f"iteration {iteration}/{args.num_iterations} score {stats['objective/scores']:.3f} "
                  f"kl {stats['objective/kl']:.3f} kl_coef {kl_coef:.4f} SPS {stats['charts/SPS']:.1f}")

            if args.eval_every > 0 and iteration % args.eval_every == 0 and iteration < args.num_iterations:
                if args.eval_episodes > 0 and args.rank == 0:
                    held_out_evaluation(policy, f"iteration_{iteration}", iteration)

            if args.kl_target is not None:  # detail 33: the next iteration's KL coefficient
                kl_coef = adaptive_kl_coef(kl_coef, stats["objective/kl"], args.kl_target, args.kl_horizon,
                                           args.batch_size, args.kl_coef)
    except KeyboardInterrupt:
        print(f"interrupted in iteration {iteration}: keeping the logs, skipping the evaluation")
        interrupted = True

    # 6. save / evaluate
    try:
        if args.save_model and args.rank == 0:
            model_path = os.path.join(run_dir, "model")
            policy.config.interrupted_at = iteration if interrupted else None  # in config.json: a Ctrl-C's
            save_policy(policy, args.model_name, model_path, args)
            print(f"policy saved to {model_path}")
        if args.eval_episodes > 0 and not interrupted and args.rank == 0:
            held_out_evaluation(policy, "final", iteration)
            initial, final = eval_stats["initial"]["raw_score_mean"], eval_stats["final"]["raw_score_mean"]
            eval_stats["normalized_score_change"] = (final - initial) * score_gain
            print_held_out_summary(eval_stats, args)
    except KeyboardInterrupt:  # saving or evaluating GPT-2 takes seconds
        print("interrupted while saving or evaluating: keeping the logs; the model folder may be incomplete")
        interrupted = True
    finally:
        writer.close()
        if args.world_size > 1:  # wait for process 0's saving and evaluation, then leave together
            torch.distributed.barrier()
            del train_policy, train_value_model  # DDP holds the group: destroy then ends its threads
            torch.distributed.destroy_process_group()
    return {"run_dir": run_dir, "eval": eval_stats, "interrupted": interrupted, **stats}


# ------------------------------------------------------------------------------------------------------------
# Plumbing, skippable on a first reading: the rollout's passes in chunks, the held-out evaluation,
# --eval-checkpoint, argument checks, loading and saving, the task's prompts.


@torch.inference_mode()
def logprobs_in_chunks(model, query_responses, responses, context_length: int, chunk: int, temperature: float,
                       pad_token_id: int) -> torch.Tensor:
    """The log-probs of the (real) response tokens, by the update's functions, response_logits and
    gather_logprobs, over chunk responses a pass, so that no pass holds batch x length x vocab floats."""
    return torch.cat([gather_logprobs(response_logits(model, query_responses[i : i + chunk], context_length,
                                                      temperature, pad_token_id), responses[i : i + chunk])
                      for i in range(0, len(query_responses), chunk)])


@torch.no_grad()  # not inference_mode: generate's bf16 weight cache (53)
def evaluate(policy, eval_prompts, tokenizer, stop_token_id: int, reward_fn, args: Args, device,
             greedy=False, reference=None) -> dict:
    """Sample args.eval_episodes responses to the held-out prompts (never trained on) with the training
    temperature and truncation (or greedy), and score them with the reward model, raw (no normalization, no
    EOS trick). The random draws come from their own generator state: evaluating does not change training.
    With a reference model, each response's KL to it too (k1: log pi - log pi_ref summed over its tokens)."""
    prompts = [eval_prompts[i % len(eval_prompts)] for i in range(args.eval_episodes)]
    raw_scores, contain_stop, samples, kls = [], [], [], []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(args.seed)
        for i in range(0, len(prompts), args.local_batch_size):
            batch = prompts[i : i + args.local_batch_size]
            queries = tokenize_queries(tokenizer, batch, args.max_query_length, device)
            responses, logprobs, response_mask, stopped, batch_raw_scores = sample_and_score(
                policy, queries, tokenizer, stop_token_id, reward_fn, args, greedy)
            if reference is not None:  # both by full passes (under --bf16 the sampler's cached ones differ)
                query_responses = torch.cat([queries, responses], 1)
                logprobs, ref_logprobs = (gather_logprobs(response_logits(
                    model, query_responses, queries.shape[1], args.temperature, tokenizer.pad_token_id),
                    responses.masked_fill(~response_mask, 0)) for model in (policy, reference))
                kls += ((logprobs - ref_logprobs) * response_mask).sum(1).tolist()
            raw_scores.append(batch_raw_scores)
            contain_stop.append(stopped)
            samples += list(zip(batch, tokenizer.batch_decode(responses, skip_special_tokens=True)))
    raw_scores, contain_stop = torch.cat(raw_scores).float(), torch.cat(contain_stop).float()

    def mean_and_stderr(x):
        return x.mean().item(), (x.std() / len(x) ** 0.5).item() if len(x) > 1 else 0.0

    # means over the distinct prompts, the unit that varies (a prompt asked several times counts once, with
    # the mean of its responses), and standard errors over them; the verifier's accuracy: each problem's share
    # of right answers (0 or 1 when it is asked once)
    per_prompt = {}
    for (prompt, _), score in zip(samples, raw_scores.tolist()):
        per_prompt.setdefault(prompt, []).append(score)
    result = {"stop_share": contain_stop.mean().item(), "raw_scores": raw_scores.tolist(), "samples": samples,
              "prompts": len(per_prompt)}
    prompt_means = torch.tensor([sum(scores) / len(scores) for scores in per_prompt.values()])
    result["raw_score_mean"], result["raw_score_stderr"] = mean_and_stderr(prompt_means)
    if kls:
        per_prompt_kl = {}
        for (prompt, _), kl in zip(samples, kls):
            per_prompt_kl.setdefault(prompt, []).append(kl)
        result["kl_mean"], result["kl_stderr"] = mean_and_stderr(torch.tensor(
            [sum(v) / len(v) for v in per_prompt_kl.values()]))
    if args.reward_model == "arithmetic":
        right = torch.tensor([sum(s > 0 for s in scores) / len(scores) for scores in per_prompt.values()])
        result["accuracy"], result["accuracy_stderr"] = mean_and_stderr(right)
    return result

def evaluate_and_log(eval_prompts, tokenizer, stop_token_id: int, reward_fn, args: Args, device, writer,
                     eval_stats: dict, model, when: str, iteration: int) -> None:
    """Score the held-out prompts, sampled (and greedy with --eval-greedy); log and keep the results."""
    for greedy in [False, True] if args.eval_greedy else [False]:
        result = evaluate(model, eval_prompts, tokenizer, stop_token_id, reward_fn, args, device, greedy)
        eval_stats[when + ("_greedy" if greedy else "")] = result
        for key, tag in [("raw_score_mean", "raw_scores"), ("accuracy", "accuracy")]:  # accuracy: RLVR
            if key in result:
                writer.add_scalar(f"eval/{'greedy_' if greedy else ''}{tag}", result[key], iteration)


def print_held_out_summary(eval_stats: dict, args: Args) -> None:
    """The held-out evaluations of the initial and the final policy, in a few printed lines."""
    initial, final = eval_stats["initial"]["raw_score_mean"], eval_stats["final"]["raw_score_mean"]
    split = args.eval_split.replace("_", "-")  # held-out, validation or test
    print(f"{split} prompts: raw score {initial:.3f} -> {final:.3f} "
          f"({eval_stats['normalized_score_change']:+.3f} in normalized units)")
    for mode in (["", "_greedy"] if args.eval_greedy else [""]) if "accuracy" in eval_stats["final"] else []:
        before, after = eval_stats["initial" + mode], eval_stats["final" + mode]
        print(f"{split} accuracy{mode.replace('_', ', ')}: {before['accuracy']:.1%} +- "
              f"{before['accuracy_stderr']:.1%} -> {after['accuracy']:.1%} +- {after['accuracy_stderr']:.1%} "
              f"(standard error over {after['prompts']} problems)")


def evaluate_checkpoint(args: Args, device: torch.device) -> dict:
    """--eval-checkpoint: score a saved policy on the held-out prompts; nothing is trained or written."""
    use_saved_sampling(args)  # the sampling settings saved with the policy, not the command's
    tokenizer, _, stop_token_id = load_tokenizer(args.eval_checkpoint, args.stop_token, "--eval-checkpoint")
    policy = load_policy(args.eval_checkpoint, device, "--eval-checkpoint")
    reference, start = starting_model(args, device)
    autocast_bf16(args.bf16, device, policy, reference, jitter=False)  # a trained policy stays as saved
    eval_stats = {}
    for greedy in [False, True] if args.eval_greedy else [False]:
        eval_prompts = load_prompts(args)[1]
        result = evaluate(policy, eval_prompts, tokenizer, stop_token_id, load_reward_fn(args, device), args,
                          device, greedy, reference)
        accuracy = f", accuracy {result['accuracy']:.1%} +- {result['accuracy_stderr']:.1%}" if (
            "accuracy" in result) else ""
        kl = (f", KL to {start} {result['kl_mean']:.3f} +- {result['kl_stderr']:.3f} nats per response"
              if "kl_mean" in result else f", no KL ({start})")
        split = args.eval_split.replace("_", "-")
        where = f"{split} sums" if args.reward_model == "arithmetic" else f"{split} prompts"
        print(f"{args.eval_checkpoint}{' (greedy)' if greedy else ''}: raw score "
              f"{result['raw_score_mean']:.4f} +- {result['raw_score_stderr']:.4f} over {args.eval_episodes} "
              f"responses to {result['prompts']} {where} (standard errors over them), "
              f"{result['stop_share']:.0%} with the stop token{accuracy}{kl}")
        eval_stats["final_greedy" if greedy else "final"] = result
    return {"eval": eval_stats}


def starting_model(args: Args, device: torch.device):
    """--eval-checkpoint: the model the policy was trained from (named in its sampling.json), to measure the
    KL against; (None, why) if the folder does not name one or it cannot be loaded."""
    path = os.path.join(os.path.expanduser(args.eval_checkpoint), "sampling.json")
    name = json.load(open(path)).get("model_name") if os.path.isfile(path) else None
    if name is None:
        return None, "the starting model is not named in its sampling.json"
    try:
        return load_policy(name, device, "the starting model"), name
    except SystemExit:
        return None, f"the starting model {name} cannot be loaded here"


def check_args(args: Args) -> None:
    """Validate the arguments and compute the derived sizes; fail before any model is loaded."""

    def require(names: tuple, ok, requirement: str):
        for name in names:
            if not ok(getattr(args, name)):
                flag = "--" + name.replace("_", "-")
                raise SystemExit(f"error: {flag} must be {requirement} (got {getattr(args, name)})")

    require(("response_length", "max_query_length", "batch_size", "num_minibatches", "update_epochs",
             "gradient_accumulation_steps", "local_rollout_forward_batch_size", "norm_batches",
             "log_samples_every", "num_threads", "arithmetic_digits"), lambda v: v >= 1, "at least 1")
    require(("eval_episodes", "eval_every", "kl_coef"), lambda v: v >= 0, "at least 0")
    require(("temperature", "learning_rate", "clip_coef", "max_grad_norm"), lambda v: v > 0, "positive")
    require(("vf_learning_rate",), lambda v: v is None or v > 0, "positive or None")
    require(("gamma", "gae_lambda"), lambda v: 0 < v <= 1, "in (0, 1]")
    require(("kl_estimator",), lambda v: v in ("k1", "k3"), "k1 or k3")
    require(("eval_split",), lambda v: v in ("held_out", "validation", "test"),
            "held_out, validation or test")
    if args.eval_split == "test" and (args.reward_model != "arithmetic" or args.arithmetic_digits < 2):
        raise SystemExit("error: --eval-split test: the unread held-out sums need --reward-model arithmetic "
                         "--arithmetic-digits 2 or more; use --eval-split held_out")
    if args.bf16 and args.cuda and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise SystemExit("error: --bf16: this GPU cannot compute in bfloat16 (torch.cuda.is_bf16_supported() "
                         "is False); run without --bf16")
    if not 0 <= args.min_response_length < args.response_length:
        raise SystemExit(f"error: --min-response-length {args.min_response_length} must be at least 0 and "
                         f"smaller than --response-length {args.response_length}")
    # torchrun sets WORLD_SIZE and RANK; every process checks the arguments and fails with the same message
    args.world_size, args.rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if args.eval_checkpoint is not None and args.world_size > 1:
        raise SystemExit("error: --eval-checkpoint runs in one process: run it with python, not torchrun")
    processes = f" times the {args.world_size} torchrun processes" if args.world_size > 1 else ""
    if args.batch_size % (args.num_minibatches * args.world_size) != 0:
        raise SystemExit(f"error: --batch-size {args.batch_size} is not divisible by --num-minibatches "
                         f"{args.num_minibatches}{processes}; choose a batch size that is a multiple of it")
    args.local_batch_size = args.batch_size // args.world_size
    args.minibatch_size = args.local_batch_size // args.num_minibatches
    if args.minibatch_size % args.gradient_accumulation_steps != 0:
        raise SystemExit(f"error: the minibatch size {args.minibatch_size} (--batch-size / "
                         f"--num-minibatches / processes) is not divisible by --gradient-accumulation-steps "
                         f"{args.gradient_accumulation_steps}")
    args.micro_batch_size = args.minibatch_size // args.gradient_accumulation_steps
    if args.total_episodes < args.batch_size:
        raise SystemExit(f"error: --total-episodes {args.total_episodes} is smaller than one batch "
                         f"(--batch-size {args.batch_size})")
    args.num_iterations = args.total_episodes // args.batch_size
    if args.kl_target is not None and (args.kl_target <= 0 or args.kl_horizon < 1 or args.kl_coef <= 0):
        raise SystemExit("error: --kl-target needs a positive target, --kl-horizon at least 1 and a positive "
                         "--kl-coef to adapt (or pass --kl-target None for a fixed coefficient)")
    if not args.stop_token:
        raise SystemExit("error: --stop-token must be `eos` or a single-token string such as `.`")
    for flag, name in [("--model-name", args.model_name), ("--reward-model", args.reward_model),
                       ("--value-model", args.value_model), ("--eval-checkpoint", args.eval_checkpoint)]:
        # A path (not a hub id) that does not exist fails here, without asking the network.
        if name is None or not (flag == "--eval-checkpoint" or name.startswith(("/", ".", "~"))):
            continue
        if not os.path.isdir(os.path.expanduser(name)):
            raise SystemExit(f"error: {flag} {name}: no such directory")
    if args.eval_checkpoint is not None:
        check_saved_policy(os.path.expanduser(args.eval_checkpoint))
    if args.prompts_file is not None and args.reward_model == "arithmetic":
        raise SystemExit("error: --prompts-file: --reward-model arithmetic makes its own prompts; pass one "
                         "or the other")
    if args.prompts_file is not None and not os.path.isfile(args.prompts_file):
        raise SystemExit(f"error: --prompts-file {args.prompts_file}: no such file")
    if args.reward_model == "vader" and importlib.util.find_spec("vaderSentiment") is None:
        raise SystemExit("error: --reward-model vader needs the vaderSentiment package (pip install "
                         "vaderSentiment)")


def init_process_group(args: Args, device: torch.device) -> torch.device:
    """torchrun: join the process group; on GPUs, each process takes the GPU torchrun assigns it. Returns
    this process's device."""
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    # imported after the process group, as DDP's imports would, this module keeps the group as its functions'
    # default argument, and destroy_process_group cannot end the group's threads before the interpreter exits
    import torch.distributed.nn.functional  # noqa: F401
    torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if args.rank > 0:
        sys.stdout = open(os.devnull, "w")  # process 0 prints the progress; errors still reach stderr
    return device


def all_sum(x: torch.Tensor) -> torch.Tensor:
    """torchrun: the sum of x over the processes, in place (one process: x as it is)."""
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(x)
    return x


def all_gather(x: torch.Tensor) -> torch.Tensor:
    """torchrun: the processes' x concatenated in process order (one process: x as it is)."""
    if not torch.distributed.is_initialized():
        return x
    parts = [torch.empty_like(x) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(parts, x)
    return torch.cat(parts)


def mean_over_processes(stats: dict, device: torch.device) -> dict:
    """torchrun: each value's mean over the processes (one process: the values as they are)."""
    if not torch.distributed.is_initialized():
        return stats
    values = torch.tensor(list(stats.values()), dtype=torch.float64, device=device)
    torch.distributed.all_reduce(values)
    return dict(zip(stats, (values / torch.distributed.get_world_size()).tolist()))


class NoWriter:
    """torchrun: the SummaryWriter of the processes other than 0, which write nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def check_saved_policy(path: str) -> None:
    """--eval-checkpoint: a whole folder written by --save-model, or a one-line error before any work."""
    from safetensors import safe_open

    files = os.listdir(path)
    weights = [os.path.join(path, f) for f in files if f.endswith(".safetensors")]
    try:
        if not weights or not {"config.json", "tokenizer_config.json"} <= set(files):
            raise ValueError("it needs config.json, tokenizer_config.json and .safetensors weights")
        for settings in ("config.json", "sampling.json"):
            if settings in files:
                with open(os.path.join(path, settings)) as f:
                    json.load(f)
        for weights_file in weights:
            with safe_open(weights_file, "pt"):  # fails if the file is shorter than its header says
                pass
    except Exception as e:  # a missing file, bad JSON or truncated weights: all mean the same here
        raise SystemExit(f"error: --eval-checkpoint {path}: not a policy saved by --save-model "
                         f"({first_line(e)})")


def first_line(e: Exception) -> str:
    return (str(e).strip() or type(e).__name__).splitlines()[0]


def from_pretrained(auto_class, name: str, flag: str, **kwargs):
    """Load a model or tokenizer; if it cannot be loaded, stop with a message that says what to pass."""
    try:
        return auto_class.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {flag} {name!r} could not be loaded ({first_line(e)}). Without network "
                         f"access, pass a local directory written by save_pretrained (and set "
                         f"HF_HUB_OFFLINE=1 to skip the retries).")


def load_tokenizer(model_name: str, stop_token: str, flag: str = "--model-name"):
    """The policy's tokenizer, set up for RLHF; returns it with the pad and stop token ids."""
    # detail 24: left padding (and left truncation) of the queries
    tokenizer = from_pretrained(AutoTokenizer, model_name, flag, padding_side="left", truncation_side="left")
    if tokenizer.pad_token is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        # detail 23: a pad token distinct from EOS, so that padding and a sampled EOS are never confused
        tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    if stop_token == "eos":
        if tokenizer.eos_token_id is None:
            raise SystemExit(f"error: --stop-token eos: the tokenizer of {model_name} has no EOS token")
        return tokenizer, tokenizer.pad_token_id, tokenizer.eos_token_id
    # The id the policy samples is the one the token has inside text: "." alone may encode to a word-initial
    # variant (SentencePiece's "▁."), so the id is read off a word followed by the stop token.
    for word in ("word", "x", "7"):
        word_ids = tokenizer.encode(word, add_special_tokens=False)
        ids = tokenizer.encode(word + stop_token, add_special_tokens=False)
        if len(ids) == len(word_ids) + 1 and ids[: len(word_ids)] == word_ids:
            return tokenizer, tokenizer.pad_token_id, ids[-1]
    raise SystemExit(f"error: --stop-token {stop_token!r} is not a single token inside text for this "
                     f"tokenizer ({'x' + stop_token!r} encodes as {ids}); pass `eos` or a single token, such "
                     f"as `.`")


def load_config(name: str, flag: str):
    config = from_pretrained(AutoConfig, name, flag)
    if getattr(config, "activation_function", None) == "gelu_new":
        # GPT-2's "gelu_new" is the tanh GELU as six element-wise operations whose outputs backward keeps;
        # torch's fused GELU(approximate="tanh") is the same function (to float rounding) and keeps only its
        # input: less activation memory in the update, and faster
        config.activation_function = "gelu_pytorch_tanh"
    return config


def load_policy(model_name: str, device: torch.device, flag: str = "--model-name") -> nn.Module:
    config = load_config(model_name, flag)
    policy = from_pretrained(AutoModelForCausalLM, model_name, flag, config=config, dtype=torch.float32)
    return policy.to(device).eval()  # detail 28: dropout off, eval mode everywhere, also while training


def load_value_model(value_model_name: str | None, policy: nn.Module, device: torch.device) -> ValueModel:
    """detail 13: a copy of the policy's backbone, or the backbone of another model that reads its tokens."""
    if value_model_name is None:
        backbone = copy.deepcopy(policy.base_model)
    else:
        config = load_config(value_model_name, "--value-model")
        if config.vocab_size != policy.config.vocab_size:
            raise SystemExit(f"error: --value-model {value_model_name} has a vocabulary of "
                             f"{config.vocab_size} tokens, the policy {policy.config.vocab_size}: it must "
                             f"read the policy's tokens")
        backbone = from_pretrained(AutoModel, value_model_name, "--value-model", config=config,
                                   dtype=torch.float32)
    return ValueModel(backbone, backbone.config.hidden_size).to(device).eval()  # detail 28


def load_reward_fn(args: Args, device: torch.device):
    """A function that maps texts (query + response) and the responses alone to a tensor of scores."""
    if args.reward_model == "length":
        # the toy reward of the KL-vs-collapse experiment: the response's length in characters, scaled
        return lambda texts, responses: torch.tensor([len(r) / args.response_length for r in responses],
                                                     device=device)
    if args.reward_model == "arithmetic":
        return lambda texts, responses: torch.tensor([verify_sum(t, r) for t, r in zip(texts, responses)],
                                                     device=device)
    if args.reward_model == "vader":
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

        analyzer = SentimentIntensityAnalyzer()
        return lambda texts, responses: torch.tensor([analyzer.polarity_scores(t)["compound"] for t in texts],
                                                     device=device)

    reward_tokenizer = from_pretrained(AutoTokenizer, args.reward_model, "--reward-model")
    reward_model = from_pretrained(AutoModelForSequenceClassification, args.reward_model, "--reward-model",
                                   dtype=torch.float32).to(device)
    reward_model.eval().requires_grad_(False)  # detail 28
    reward_model.config.use_cache = False  # one pass, no KV cache (for models that have one)
    # a scalar reward model (one label, as reward_model_gpt2.py writes) has one score; a classifier has one
    # per label
    label = 0 if reward_model.config.num_labels == 1 else args.reward_label
    # reward_model_gpt2.py's normalization: its gain is in the weights, its shift (a head has no bias) here
    reward_bias = getattr(reward_model.config, "reward_bias", 0.0)
    if not 0 <= label < reward_model.config.num_labels:
        raise SystemExit(f"error: --reward-label {args.reward_label} is not one of the reward model's "
                         f"{reward_model.config.num_labels} labels {reward_model.config.id2label}")
    if reward_tokenizer.pad_token is None:
        # The reward model reads plain detokenized text, without special tokens, so EOS is a safe pad here.
        reward_tokenizer.pad_token = reward_tokenizer.eos_token
    reward_model.config.pad_token_id = reward_tokenizer.pad_token_id
    # reward_model_gpt2.py's readout: the score at an end token appended to every text, or (config
    # reward_readout `mean`) the head on the mean final state over the response's tokens and that end token,
    # so that it is read at the same kind of position whether or not the response ended; found from the
    # attention mask, as that end token may also be the pad token (which transformers' own readout would skip)
    end_token = getattr(reward_model.config, "reward_end_token", None)
    mean_readout = getattr(reward_model.config, "reward_readout", None) == "mean"

    @torch.inference_mode()
    def reward_fn(texts: list[str], responses: list[str]) -> torch.Tensor:
        # The reward model reads the text with its own tokenizer, not the policy's token ids.
        if end_token is None:
            inputs = reward_tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(device)
            return reward_model(**inputs).logits[:, label].float() + reward_bias
        inputs = reward_tokenizer([t + end_token for t in texts], padding=True, truncation=True,
                                  return_tensors="pt", return_offsets_mapping=mean_readout)
        mask = inputs["attention_mask"].bool().to(device)
        hidden = reward_model.base_model(input_ids=inputs["input_ids"].to(device), attention_mask=mask,
                                         position_ids=(mask.cumsum(1) - 1).clamp(min=0)).last_hidden_state
        if mean_readout:  # the tokens ending after the query: the response's and the end token
            starts = torch.tensor([len(t) - len(r) for t, r in zip(texts, responses)])
            keep = (mask & (inputs["offset_mapping"][..., 1] > starts[:, None]).to(device)).float()
            features = (keep.unsqueeze(-1) * hidden).sum(1) / keep.sum(1, keepdim=True)
        else:
            last = (torch.arange(mask.shape[1], device=device) * mask).argmax(1)  # the end token, any padding
            features = hidden[torch.arange(len(hidden), device=device), last]
        return reward_model.score(features)[:, 0].float() + reward_bias

    return reward_fn


SAMPLING = ("temperature", "response_length", "min_response_length", "stop_token", "max_query_length")


def save_policy(policy: nn.Module, model_name: str, path: str, args: Args | None = None) -> None:
    """save_pretrained, with a tokenizer that plain `from_pretrained` + `generate` can use as it is: the
    original one, left padding, and a pad id the model can embed (EOS, if it has no pad token); and the
    settings the policy was trained to sample with (sampling.json), which --eval-checkpoint uses."""
    tokenizer = from_pretrained(AutoTokenizer, model_name, "--model-name", padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    policy.generation_config.pad_token_id = tokenizer.pad_token_id
    policy.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if args is not None:
        with open(os.path.join(path, "sampling.json"), "w") as f:
            json.dump({**{name: getattr(args, name) for name in SAMPLING}, "model_name": model_name}, f)


def use_saved_sampling(args: Args) -> None:
    """--eval-checkpoint: sample as the policy was trained to (its sampling.json), whatever the flags say."""
    path = os.path.join(os.path.expanduser(args.eval_checkpoint), "sampling.json")
    if not os.path.isfile(path):  # saved by an older version, or by something else
        return
    with open(path) as f:
        for name, value in json.load(f).items():
            if name in SAMPLING and getattr(args, name) != value:
                print(f"--eval-checkpoint: --{name.replace('_', '-')} {value}, as saved with the policy "
                      f"(not {getattr(args, name)})")
                setattr(args, name, value)


def verify_sum(text: str, response: str) -> float:
    """The verifier: +1 if the first number in the response is the sum asked for in the text, else -1."""
    a, b = re.search(r"What is (\d+) \+ (\d+)\?", text).groups()
    answer = re.search(r"-?\d+(\.\d+)?", response)  # "7.5" is not 7
    return 1.0 if answer is not None and float(answer.group()) == int(a) + int(b) else -1.0


def arithmetic_problems(digits: int, held_out: bool, validation: bool = False,
                        test: bool = False) -> list[str]:
    """The prompts of --reward-model arithmetic: every sum of two numbers of `digits` digits, split once by a
    fixed seed (whatever --seed) into training and held-out problems; a + b and b + a on the same side. An
    eighth of the training pairs (fixed too) is the validation split: validation=True gives it,
    held_out=False with validation=False the training problems including it. test=True: the held-out pairs
    past the first 256, in one order each (a fixed coin): held-out problems that an evaluation of up to 256
    held-out prompts never reaches (those list both orders of the first pairs), each a distinct sum."""
    numbers = range(0 if digits == 1 else 10 ** (digits - 1), 10**digits)
    pairs = [(a, b) for a in numbers for b in numbers if a <= b]
    random.Random(0).shuffle(pairs)
    pairs = pairs[: len(pairs) // 4] if held_out else pairs[len(pairs) // 4 :]
    if validation:
        pairs = pairs[: max(1, len(pairs) // 8)]
    if test:
        coin = random.Random(1)
        return [f"What is {a} + {b}? The answer is" for a, b in (p if coin.random() < 0.5 else p[::-1]
                                                                  for p in pairs[256:])]
    return [f"What is {a} + {b}? The answer is" for x, y in pairs for a, b in dict.fromkeys([(x, y), (y, x)])]


def load_prompts(args: Args) -> tuple[list[str], list[str]]:
    """The training prompts and the evaluated ones: the held-out ones, or (--eval-split validation) a fixed
    slice of the training ones, then left out of training."""
    if args.reward_model == "arithmetic":
        prompts = arithmetic_problems(args.arithmetic_digits, held_out=False)
        eval_prompts = arithmetic_problems(args.arithmetic_digits, held_out=True)
        if args.eval_split != "held_out":
            eval_prompts = arithmetic_problems(args.arithmetic_digits, held_out=args.eval_split == "test",
                                               validation=args.eval_split == "validation",
                                               test=args.eval_split == "test")
    elif args.prompts_file is None:
        prompts, eval_prompts = list(PROMPTS), list(EVAL_PROMPTS)
    else:
        with open(args.prompts_file) as f:
            prompts, eval_prompts = [line.strip() for line in f if line.strip()], list(EVAL_PROMPTS)
        if not prompts:
            raise SystemExit(f"error: --prompts-file {args.prompts_file} contains no prompts")
    if args.eval_split == "validation" and args.reward_model != "arithmetic":
        eval_prompts = prompts[-max(1, len(prompts) // 8) :]  # the last eighth, fixed
    if args.eval_split == "validation":
        prompts = [p for p in prompts if p not in set(eval_prompts)]  # never trained on
        if not prompts:
            raise SystemExit("error: --eval-split validation: no training prompt is left; give more distinct "
                             "prompts or use --eval-split held_out")
    return prompts, eval_prompts


def diversity(responses: torch.Tensor, response_mask: torch.Tensor) -> tuple[float, float]:
    """Share of distinct responses in the batch, and distinct-2 (distinct token bigrams / all bigrams):
    both fall toward 0 when the policy collapses onto a few strings."""
    rows = [tuple(r[m].tolist()) for r, m in zip(responses, response_mask)]
    bigrams = [pair for row in rows for pair in zip(row, row[1:])]
    return len(set(rows)) / len(rows), len(set(bigrams)) / max(len(bigrams), 1)


def samples_table(tokenizer, queries, responses, scores) -> str:
    """The first eight responses of a batch: query, response and score."""
    rows = list(zip(tokenizer.batch_decode(queries, skip_special_tokens=True),
                    tokenizer.batch_decode(responses, skip_special_tokens=True),
                    [f"{s:.3f}" for s in scores.tolist()]))
    return markdown_table(rows[:8], ("query", "response", "score"))


def markdown_table(rows: list[tuple], header: tuple) -> str:
    cells = [[str(x).replace("|", "\\|").replace("\n", " ") for x in row] for row in rows]
    lines = [header, ["-"] * len(header)] + cells
    return "\n".join("|" + "|".join(line) + "|" for line in lines)


# ------------------------------------------------------------------------------------------------------------
# Data, skippable: openings of movie reviews written for this project; the policy continues them.

PROMPTS = [
    "This movie was", "I went into this film expecting", "The acting in this one is",
    "Honestly, the plot of this movie", "From the very first scene, I",
    "My friends dragged me to see this, and", "The director clearly wanted to",
    "I have seen a lot of westerns, but this one", "The soundtrack alone",
    "After two hours in the theater, I", "The lead actress gives a performance that",
    "This is the kind of comedy that", "I rented this on a rainy Sunday and", "The special effects were",
    "Watching this with my kids,", "The dialogue in the second half",
    "If you liked the book, this adaptation", "I did not expect a horror movie to", "The ending of this film",
    "Critics have called it a masterpiece, but", "The cinematography is", "Three words describe this movie:",
    "I walked out of the cinema feeling", "The villain in this story",
    "It has been years since a documentary", "The first twenty minutes are",
    "As a fan of the original series, I", "The chemistry between the two leads", "This low-budget thriller",
    "I watched it twice, and", "The screenplay tries to", "Nothing about this sequel",
    "My expectations were low, and the film", "The pacing of this movie",
    "Every scene with the old detective", "This animated feature", "The costumes and sets",
    "I can't remember the last time a movie", "The story follows a young woman who",
    "What starts as a simple romance", "The humor in this film", "Halfway through, I realized",
    "This remake of a classic", "The cast is full of familiar faces, and", "As war films go, this one",
    "The music, the colors, the camera work:", "I really wanted to like this movie, but",
    "The child actors in this film", "By the time the credits rolled,", "This is a slow film that",
    "The twist at the end", "Compared to the director's earlier work,", "Nobody in my family",
    "The script was written by", "On paper, this movie", "The action sequences",
    "I saw this at a small festival and", "This musical", "The performances are uneven, but",
    "For a film about friendship, it", "The first time I saw this movie,", "This science fiction epic",
    "Despite the famous cast, the film", "The editing makes every scene",
    "The movie opens with a long shot of", "I laughed, I cried, and", "The small town setting",
    "Years from now, people will", "This courtroom drama", "The heist in the middle of the film",
    "It is rare for a family movie to", "The best thing about this film is",
]

# Held-out openings, never used in training: the evaluation of the initial and the final policy.
EVAL_PROMPTS = [
    "The trailer made this film look", "I bought a ticket for the late show and",
    "The first act of this drama", "My grandmother loved this movie because",
    "The sound design in the battle scenes", "This biopic of a famous painter",
    "Two minutes into the opening credits, I", "The writers of this comedy",
    "Of all the films I saw this year, this one", "The young director's debut", "This spy thriller",
    "The love story at the center of the film", "Watching it again after ten years,", "The supporting cast",
    "This film about a small fishing village", "The final battle",
]


if __name__ == "__main__":
    try:
        result = main(tyro.cli(Args))
    except KeyboardInterrupt:  # a Ctrl-C before training began (loading, setup): nothing to keep yet
        print("interrupted before training began")
        sys.exit(130)
    sys.exit(130 if result.get("interrupted") else 0)  # 130: the shell's status for a Ctrl-C
