"""Group relative policy optimization (GRPO) on a causal language model: PPO-RLHF without the value model.

`ppo_rlhf_gpt2.py` minus the value model and GAE, plus groups: the policy samples num_generations responses to
each prompt; a response's advantage, on each of its tokens, is its score against its group's (the baseline and
the scale: no reward normalization). The task, rewards, EOS trick and evaluation are the PPO file's.

Papers: Shao et al. 2024, "DeepSeekMath" (GRPO; arXiv:2402.03300); Liu et al. 2025, "Understanding
R1-Zero-Like Training" (Dr. GRPO; arXiv:2503.20783); Yu et al. 2025, "DAPO" (arXiv:2503.14476).

Usage:
    python grpo_gpt2.py --model-name ./my-gpt2 --reward-model arithmetic --response-length 8 \
        --min-response-length 0                                          # RLVR, the original GRPO
    python grpo_gpt2.py ... --loss-type dr_grpo --scale-rewards none --beta 0     # Dr. GRPO: no reference
    python grpo_gpt2.py ... --loss-type dapo --clip-coef-high 0.28 --beta 0       # DAPO's loss and clip
    torchrun --nproc_per_node 8 grpo_gpt2.py --batch-size 512   # data parallel: 8 groups of 8 per GPU

What the code computes (i: a response of a group of G; t: one of its |o_i| real tokens, stop token included):
    advantages_i = (scores_i - mean of the group's scores) / (their std + 1e-4)   (--scale-rewards none: no /,
                   Dr. GRPO: the division weighs groups that are nearly all right or all wrong the most)
      --advantage rloo (RLOO, Ahmadian et al. 2024, arXiv:2402.14740): scores_i - the mean of the OTHER
                   G - 1 scores of its group, no std (= G / (G - 1) times the centered score; its paper's loss
                   is the summed log-prob, one step a batch: --loss-type dr_grpo, --update-epochs 1)
    ratio_it     = exp(newlogprob_it - logprobs_it)            (logprobs: recorded when sampling; --bf16: 53)
    pg_loss_it   = max(-A_i * ratio_it, -A_i * clip(ratio_it, 1 - clip_coef, 1 + clip_coef_high))
    kl_it        = exp(ref_logprobs_it - newlogprob_it) - (ref_logprobs_it - newlogprob_it) - 1      (k3)
      --use-bias-correction-kl: kl_it * ratio_it, the ratio not detached (as TRL), whose gradient is
                   ratio_it * (newlogprob_it - ref_logprobs_it) grad newlogprob_it: KL(pi || pi_ref)'s
    loss         = aggregate(pg_loss_it + beta * kl_it), by --loss-type, over N responses, T real tokens:
      grpo:     1/N sum_i 1/|o_i| sum_t   every response weighs the same, a token of a long one less: long
                wrong answers are penalized less per token, short right ones more (Dr. GRPO's length bias).
      dapo:     1/T sum_i sum_t           every token weighs the same; no length bias within a batch, but a
                batch's step size depends on how many tokens it has.
      dr_grpo:  1/(N * response_length) sum_i sum_t   a constant: no length bias, and no batch-length effect.
    With --update-epochs 1 and one minibatch, ratio = 1 and the clip never acts: the gradient is the plain
    policy gradient sum_i A_i grad log pi(o_i), weighted as the aggregation says.

Implementation details, numbered as in ppo_rlhf_gpt2.py where they are the same idea (gone: 2, 5, 7, 9, 10,
13, 31-34: the value model, GAE, whitening, the KL in the reward):
 1. A batch of prompts plays the part of the vectorized envs.  3. Adam with eps = 1e-5.  4. The learning rate
    decays linearly to 0.  8. Clipped surrogate objective.  11. Gradient-norm clipping.  12. Debug variables.
 6. Passes over shuffled minibatches; a minibatch may be split into micro-batches whose gradients add up.
23-30: a pad token distinct from EOS, left padding, position ids from the mask, logits / temperature, pure
    sampling, dropout off, truncation after the first stop token, the EOS trick (in that order).
46. Groups: each batch is batch_size / G prompts, each repeated G times in a row (torchrun: whole groups).
47. The group-relative advantage (or RLOO's) on each token of a response; 0 where a group's scores all tie.
48. The loss aggregation over the whole minibatch: each micro-batch adds its share, with its N and T.
49. The KL to the reference in the loss (k3), not in the reward (at --beta 0 no reference model). On samples a
    pass or minibatch has made stale its gradient, (1 - pi_ref / pi) grad log pi, is unbounded where the clip
    turned the policy term off: k3 alone drives the step. --use-bias-correction-kl: ratio * log(pi / pi_ref).
50. An upper clip that may differ from the lower one (--clip-coef-high, DAPO's clip-higher).
51. --update-epochs passes over each batch (GRPO's mu, TRL's num_iterations); above 1 (or with minibatches)
    the samples go stale, and the k3 term acts on them as 49 says.  52. A validation split (--eval-split).
53. --bf16: the models' passes in bfloat16 autocast (not the reward model's); weights, log-probs, losses fp32;
    the old log-probs and the reference's from full passes of the update's shape: a first ratio of exactly 1.
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
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer,
                          Conv1D)


@dataclass
class Args:
    """The defaults are the original GRPO (DeepSeekMath): per-response mean, std scaling, k3 at beta 0.04."""

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
    batch_size: int = 64  # responses per iteration, over all torchrun processes: batch_size / G prompts
    num_generations: int = 8  # G, the responses sampled for each prompt (a group)
    num_minibatches: int = 1  # minibatches (optimizer steps) per batch and pass
    gradient_accumulation_steps: int = 4  # micro-batches per minibatch, their gradients accumulated
    local_rollout_forward_batch_size: int = 16  # responses per reference and reward pass
    update_epochs: int = 1  # detail 51: passes over each batch (GRPO's mu, TRL's num_iterations)
    learning_rate: float = 2e-5  # the learning rate of Adam
    anneal_lr: bool = True  # anneal the learning rate linearly to 0
    advantage: Literal["grpo", "rloo"] = "grpo"  # detail 47: the group's baseline, or RLOO's leave-one-out
    scale_rewards: Literal["group", "none"] = "group"  # divide by the group's std (none: Dr. GRPO; not RLOO)
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = "grpo"  # how token losses become one (see above)
    clip_coef: float = 0.2  # the surrogate clipping coefficient (the lower clip: 1 - clip_coef)
    clip_coef_high: float | None = None  # detail 50: the upper clip is 1 + this (None: clip_coef; DAPO: 0.28)
    beta: float = 0.04  # coefficient of the k3 KL in the loss (0: no reference model)
    use_bias_correction_kl: bool = False  # detail 49: the k3 term times the ratio pi / pi_old (TRL's flag)
    max_grad_norm: float = 1.0  # the maximum norm of the global gradient
    missing_eos_penalty: float | None = -1.0  # the score of a response without the stop token (None: off)

    # computed in check_args
    world_size: int = 0  # computed: the number of processes (1, or torchrun's)
    rank: int = 0  # computed: this process's index among them
    local_batch_size: int = 0  # computed: the responses this process samples per iteration (whole groups)
    prompts_per_batch: int = 0  # computed: batch_size // num_generations, over all processes
    minibatch_size: int = 0  # computed: this process's share of a minibatch
    micro_batch_size: int = 0  # computed: the micro-batch size
    num_iterations: int = 0  # computed: total_episodes // batch_size


# ------------------------------------------------------------------------------------------------------------
# The task: batches of queries (prompts) in, scored responses out; the rollout and the evaluation use both.


def query_batches(prompts: list[str], tokenizer, args: Args, device: torch.device):
    """details 1, 46: batches of args.batch_size queries: prompts_per_batch prompts, one shuffled pass over
    the prompts after another, each prompt repeated num_generations times in a row (a group)."""
    rng, indices = random.Random(args.seed), []  # the same draws in every process
    while True:
        while len(indices) < args.prompts_per_batch:
            order = list(range(len(prompts)))
            rng.shuffle(order)
            indices += order
        chosen, indices = indices[: args.prompts_per_batch], indices[args.prompts_per_batch :]
        local = args.local_batch_size // args.num_generations  # torchrun: this process's prompts (groups)
        chosen = chosen[args.rank * local : (args.rank + 1) * local]
        queries = tokenize_queries(tokenizer, [prompts[i] for i in chosen], args.max_query_length, device)
        yield queries.repeat_interleave(args.num_generations, dim=0)


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
# The networks: how the policy and the reference read (query, response) tokens.


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


def group_advantages(scores: torch.Tensor, num_generations: int, scale_rewards: str, advantage: str = "grpo"):
    """detail 47: each response's score minus the mean of its group (num_generations consecutive responses),
    divided by the group's std (unbiased) + 1e-4 unless scale_rewards is "none"; or (rloo) minus the mean of
    the group's other scores, no std. Returns the advantages (batch,) and, per group, whether all its scores
    are equal: those get exactly 0 (no signal; no rounding noise in their std blown up)."""
    grouped = scores.view(-1, num_generations)
    all_equal = (grouped == grouped[:, :1]).all(dim=1)
    advantages = grouped - grouped.mean(dim=1, keepdim=True)
    if advantage == "rloo":  # the leave-one-out baseline: the mean of the other G - 1 scores
        advantages = grouped - (grouped.sum(dim=1, keepdim=True) - grouped) / (num_generations - 1)
    elif scale_rewards == "group":
        advantages = advantages / (grouped.std(dim=1, keepdim=True) + 1e-4)
    return advantages.masked_fill(all_equal.unsqueeze(1), 0.0).flatten(), all_equal


def policy_loss(newlogprob, logprobs, advantages, clip_coef: float, clip_coef_high: float):
    """details 8, 50: the clipped surrogate per token, as a loss to minimize, with the response's advantage on
    each of its tokens (advantages: (batch,)). Returns (pg_loss per token, ratio, logratio)."""
    logratio = newlogprob - logprobs
    ratio = logratio.exp()
    pg_loss1 = -advantages.unsqueeze(1) * ratio
    pg_loss2 = -advantages.unsqueeze(1) * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef_high)
    return torch.max(pg_loss1, pg_loss2), ratio, logratio


def k3_kl(newlogprob, ref_logprobs, ratio=None) -> torch.Tensor:
    """detail 49: the k3 estimate of KL(pi || pi_ref) per token, (q - 1) - log q with q = pi_ref / pi of the
    sampled token: never negative, and its gradient is (1 - q) grad log pi, which pulls pi toward pi_ref.
    With the ratio pi / pi_old (--use-bias-correction-kl, not detached): times it, gradient -ratio log q."""
    logr = ref_logprobs - newlogprob
    kl = logr.exp() - logr - 1
    return kl if ratio is None else kl * ratio


def aggregate(token_loss, response_mask, loss_type: str, num_responses: int, num_tokens, response_length):
    """detail 48: these responses' share of the loss of a minibatch of num_responses responses and num_tokens
    real tokens (its micro-batches' shares add up to it), padding left out; the docstring says the weights."""
    token_loss = torch.where(response_mask, token_loss, 0.0)
    if loss_type == "grpo":
        return (token_loss.sum(1) / response_mask.sum(1)).sum() / num_responses
    if loss_type == "dapo":
        return token_loss.sum() / num_tokens
    return token_loss.sum() / (num_responses * response_length)  # dr_grpo


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
    query_iter = query_batches(prompts, tokenizer, args, device)  # details 1, 46
    policy = load_policy(args.model_name, device)
    ref_policy = copy.deepcopy(policy).requires_grad_(False) if args.beta > 0 else None  # detail 49: for k3
    autocast_bf16(args.bf16, device, policy, ref_policy, seed=args.seed)  # detail 53, after the copies
    reward_fn = load_reward_fn(args, device)
    # detail 3: Adam (eps 1e-5) over the policy, the only trained model; fused: one in-place kernel a tensor
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # torchrun: the update's passes go through DDP, whose backward averages the gradients over the processes
    train_policy = nn.parallel.DistributedDataParallel(policy) if args.world_size > 1 else policy

    writer = SummaryWriter(run_dir) if args.rank == 0 else NoWriter()  # torchrun: process 0 logs
    writer.add_text("hyperparameters", markdown_table(list(vars(args).items()), ("param", "value")))
    eval_stats = {}  # held_out_evaluation(policy, ...): sampled (and greedy with --eval-greedy), logged, kept
    held_out_evaluation = functools.partial(evaluate_and_log, eval_prompts, tokenizer, stop_token_id,
                                            reward_fn, args, device, writer, eval_stats)
    if args.eval_episodes > 0 and args.rank == 0:  # torchrun: process 0 evaluates
        held_out_evaluation(policy, "initial", 0)
    stats, iteration, interrupted, start_time, train_cpu = {}, 0, False, time.time(), 0.0
    try:
        for iteration in range(1, args.num_iterations + 1):
            if args.anneal_lr:  # detail 4
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            # 2. rollout: the groups of responses, their scores, and the reference's log-probs
            iteration_start, cpu_start = time.time(), time.process_time()  # train_cpu: no evaluation in it
            queries = next(query_iter)
            context_length = queries.shape[1]
            responses, logprobs, response_mask, contain_stop, raw_scores = sample_and_score(
                policy, queries, tokenizer, stop_token_id, reward_fn, args)
            real_responses = responses.masked_fill(~response_mask, 0)  # detail 23: pad ids may be outside
            query_responses = torch.cat([queries, responses], dim=1)
            # detail 53 (--bf16): passes of the update's micro-batch shape, the old log-probs from full passes
            chunk = args.micro_batch_size if args.bf16 else args.local_rollout_forward_batch_size
            ref_logprobs = None if ref_policy is None else logprobs_in_chunks(ref_policy,  # detail 49
                query_responses, real_responses, context_length, chunk, args.temperature, pad_token_id)
            if args.bf16:
                logprobs = logprobs_in_chunks(policy, query_responses, real_responses, context_length,
                                              chunk, args.temperature, pad_token_id)
            rollout_time = time.time() - iteration_start

            # 3. advantages
            scores = raw_scores  # raw: the group is the baseline and the scale (no detail 31)
            if args.missing_eos_penalty is not None:  # detail 30: the EOS trick
                scores = raw_scores.masked_fill(~contain_stop, args.missing_eos_penalty)
            advantages, all_equal = group_advantages(scores, args.num_generations, args.scale_rewards,
                                                     args.advantage)  # detail 47: one a response

            # 4. update
            update_start = time.time()
            update_stats = {}  # for each debug variable, one tensor per micro-batch; averaged in 5.
            for epoch in range(args.update_epochs):  # detail 51
                b_inds = torch.randperm(args.local_batch_size, device=device)
                for start in range(0, args.local_batch_size, args.minibatch_size):  # detail 6
                    mb_inds = b_inds[start : start + args.minibatch_size]
                    # torchrun: N this process's minibatch_size, T the processes' mean: DDP's mean of their
                    # gradients is then the gradient of the whole minibatch's loss (detail 48)
                    minibatch_tokens = all_sum(response_mask[mb_inds].sum()) / args.world_size
                    minibatch_losses = {}  # the minibatch's losses: the sums of its micro-batches' shares
                    for micro_start in range(0, args.minibatch_size, args.micro_batch_size):
                        micro_inds = mb_inds[micro_start : micro_start + args.micro_batch_size]
                        micro_mask = response_mask[micro_inds]
                        # only the log-softmax of the logits is kept (backward needs it, not the logits)
                        all_logprobs = response_logits(train_policy, query_responses[micro_inds],
                                                       context_length, args.temperature,
                                                       pad_token_id).log_softmax(-1)
                        newlogprob = all_logprobs.gather(-1, real_responses[micro_inds, :, None]).squeeze(-1)
                        token_pg_loss, ratio, logratio = policy_loss(newlogprob, logprobs[micro_inds],
                                                                     advantages[micro_inds], args.clip_coef,
                                                                     args.clip_coef_high)
                        # detail 48: this micro-batch's share of the minibatch's loss
                        sizes = (args.loss_type, args.minibatch_size, minibatch_tokens, args.response_length)
                        losses = {"policy_loss": aggregate(token_pg_loss, micro_mask, *sizes)}
                        if ref_logprobs is not None:  # detail 49: the KL to the reference, in the loss
                            kl = k3_kl(newlogprob, ref_logprobs[micro_inds],
                                       ratio if args.use_bias_correction_kl else None)
                            losses["kl"] = aggregate(kl, micro_mask, *sizes)
                        loss = losses["policy_loss"] + args.beta * losses.get("kl", 0.0)
                        loss.backward()
                        with torch.no_grad():
                            for k, v in losses.items():
                                minibatch_losses[k] = minibatch_losses.get(k, 0.0) + v.detach()
                            debug = debug_variables(all_logprobs, ratio, logratio, advantages[micro_inds],
                                                    micro_mask, args.clip_coef, args.clip_coef_high)
                            for k, v in debug.items():
                                update_stats.setdefault(k, []).append(v)
                        del all_logprobs, newlogprob, debug
                    nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)  # detail 11
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    for k, v in minibatch_losses.items():
                        update_stats.setdefault(k, []).append(v)
            update_time, train_cpu = time.time() - update_start, train_cpu + time.process_time() - cpu_start

            # 5. logging
            update_stats = {k: torch.stack(v).double().mean().item() for k, v in update_stats.items()}
            distinct_responses, distinct_2 = diversity(responses, response_mask)
            lengths, right = response_mask.sum(1).float(), raw_scores > 0  # right: the verifier's +1
            stats = {
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                "charts/SPS": iteration * args.batch_size * args.response_length / (time.time() - start_time),
                "charts/episodic_length": lengths.mean().item(),
                **{f"losses/{k}": v for k, v in update_stats.items() if k != "ratio"},
                "objective/scores": scores.mean().item(), "objective/raw_scores": raw_scores.mean().item(),
                # -log pi of the sampled tokens, summed over the response: a one-sample estimate of the
                # response's entropy, in nats (losses/entropy: the mean next-token entropy in the update)
                "objective/response_entropy": (-logprobs).masked_fill(~response_mask, 0).sum(1).mean().item(),
                "val/num_eos_tokens": contain_stop.sum().item() * args.world_size,  # a sum, after the mean
                "val/ratio": update_stats["ratio"],
                "val/distinct_responses": distinct_responses, "val/distinct_2": distinct_2,
                "val/zero_advantage_groups": all_equal.float().mean().item(),  # their advantage is 0
                "time/rollout": rollout_time, "time/update": update_time, "time/train_cpu": train_cpu,
            }
            if ref_logprobs is not None:  # the KL to the reference per response (k1, summed), as PPO logs it
                stats["objective/kl"] = ((logprobs - ref_logprobs) * response_mask).sum(1).mean().item()
            if args.reward_model == "arithmetic":  # lengths of the right and the wrong responses (nan: none)
                stats["val/length_right"] = lengths[right].mean().item()
                stats["val/length_wrong"] = lengths[~right].mean().item()
            stats = mean_over_processes(stats, device)  # torchrun: each statistic's mean over the processes
            for tag, value in stats.items():
                writer.add_scalar(tag, value, iteration)
            if iteration == 1 or iteration % args.log_samples_every == 0 or iteration == args.num_iterations:
                table = samples_table(tokenizer, queries, responses, scores, advantages, args)
                writer.add_text("samples", table, iteration)
            print(f"iteration {iteration}/{args.num_iterations} score {stats['objective/scores']:.3f} "
                  f"zero-advantage groups {stats['val/zero_advantage_groups']:.0%}")

            if args.eval_every > 0 and iteration % args.eval_every == 0 and iteration < args.num_iterations:
                if args.eval_episodes > 0 and args.rank == 0:
                    held_out_evaluation(policy, f"iteration_{iteration}", iteration)
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
            print_held_out_summary(eval_stats, args)
    except KeyboardInterrupt:  # saving or evaluating GPT-2 takes seconds
        print("interrupted while saving or evaluating: keeping the logs; the model folder may be incomplete")
        interrupted = True
    finally:
        writer.close()
        if args.world_size > 1:  # wait for process 0's saving and evaluation, then leave together
            torch.distributed.barrier()
            del train_policy  # DDP holds the group: destroy then ends its threads
            torch.distributed.destroy_process_group()
    return {"run_dir": run_dir, "eval": eval_stats, "interrupted": interrupted, **stats}


# ------------------------------------------------------------------------------------------------------------
# Plumbing, skippable on a first reading: the debug variables, the rollout's passes in chunks, the held-out
# evaluation, --eval-checkpoint, argument checks, the process group (torchrun), loading and saving, the task's
# prompts and verifier.


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x where mask is True; masked entries cannot leak in, even as inf or nan."""
    return torch.where(mask, x, 0.0).sum() / mask.sum()


def debug_variables(all_logprobs, ratio, logratio, advantages, response_mask, clip_coef: float,
                    clip_coef_high: float) -> dict:
    """detail 12: over the real tokens, the entropy, the KL estimates of the step, and the clip fractions:
    out of the range, and where the clip stops the gradient (low: ratio < 1 - clip_coef and A < 0; high)."""
    entropy = -(all_logprobs.exp() * all_logprobs).sum(-1)
    low, high = ratio < 1 - clip_coef, ratio > 1 + clip_coef_high
    advantages = advantages.unsqueeze(1)
    return {"entropy": masked_mean(entropy, response_mask),
            "old_approx_kl": masked_mean(-logratio, response_mask),
            "approx_kl": masked_mean((ratio - 1) - logratio, response_mask),
            "clipfrac": masked_mean((low | high).float(), response_mask),
            "clipfrac_low": masked_mean((low & (advantages < 0)).float(), response_mask),
            "clipfrac_high": masked_mean((high & (advantages > 0)).float(), response_mask),
            "ratio": masked_mean(ratio, response_mask)}


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
    print(f"{split} prompts: raw score {initial:.3f} -> {final:.3f}")
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
             "gradient_accumulation_steps", "local_rollout_forward_batch_size", "log_samples_every",
             "num_threads", "arithmetic_digits"), lambda v: v >= 1, "at least 1")
    require(("num_generations",), lambda v: v >= 2, "at least 2: a group of one response has no other to be "
            "compared with, so its advantage would always be 0")
    require(("eval_episodes", "eval_every", "beta"), lambda v: v >= 0, "at least 0")
    require(("temperature", "learning_rate", "clip_coef", "max_grad_norm"), lambda v: v > 0, "positive")
    require(("clip_coef_high",), lambda v: v is None or v > 0, "positive or None")
    require(("scale_rewards",), lambda v: v in ("group", "none"), "group or none")
    require(("loss_type",), lambda v: v in ("grpo", "dapo", "dr_grpo"), "grpo, dapo or dr_grpo")
    require(("advantage",), lambda v: v in ("grpo", "rloo"), "grpo or rloo")
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
    if args.batch_size % (args.num_generations * args.world_size) != 0:  # a group is never split
        raise SystemExit(f"error: --batch-size {args.batch_size} is not a whole number of groups of "
                         f"--num-generations {args.num_generations}{processes}; choose a multiple of it")
    args.prompts_per_batch = args.batch_size // args.num_generations
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
    if args.num_iterations not in (0, args.total_episodes // args.batch_size):
        raise SystemExit(f"error: --num-iterations is computed (--total-episodes / --batch-size); the passes "
                         f"over each batch (TRL's num_iterations) are --update-epochs {args.num_iterations}")
    args.num_iterations = args.total_episodes // args.batch_size
    if args.clip_coef_high is None:  # a symmetric clip unless asked
        args.clip_coef_high = args.clip_coef
    if not args.stop_token:
        raise SystemExit("error: --stop-token must be `eos` or a single-token string such as `.`")
    for flag, name in [("--model-name", args.model_name), ("--reward-model", args.reward_model),
                       ("--eval-checkpoint", args.eval_checkpoint)]:
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


def samples_table(tokenizer, queries, responses, scores, advantages, args: Args) -> str:
    """The first two groups of a batch: query, response, score and advantage."""
    rows = list(zip(tokenizer.batch_decode(queries, skip_special_tokens=True),
                    tokenizer.batch_decode(responses, skip_special_tokens=True),
                    [f"{s:.2f} (A {a:+.2f})" for s, a in zip(scores.tolist(), advantages)]))
    return markdown_table(rows[: 2 * args.num_generations], ("query", "response", "score"))


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
