"""Direct preference optimization (DPO) on a causal language model: preferences learned with no reward model.

reward_model_gpt2.py learns a reward from comparisons, then ppo_rlhf_gpt2.py or grpo_gpt2.py maximizes it with
a KL penalty to the reference. The KL-regularized optimum is pi = pi_ref exp(r / beta) / Z, so
r = beta log(pi / pi_ref) + beta log Z: put in the reward model's Bradley-Terry loss (Z cancels within a
comparison), this reward makes the loss train the policy itself. The scalar head goes, and beta times the
policy's log-ratio to the reference becomes the reward. The same preference file as reward_model_gpt2.py (a
--gold run's preferences.jsonl, or any prompt/chosen/rejected file) and the same held-out split by prompt: the
implicit reward's held-out accuracy is measured on the comparisons the reward model reports on. On the
held-out prompts, the RL files' evaluation: sampled responses, their gold score, the KL to the reference.

Papers: Rafailov et al. 2023, "Direct Preference Optimization" (arXiv:2305.18290); Azar et al. 2023, "A
General Theoretical Paradigm to Understand Learning from Human Preferences" (IPO; arXiv:2310.12036); Mitchell
2023, "A note on DPO with noisy preferences and relationship to IPO" (conservative DPO: --label-smoothing).

Usage:
    python reward_model_gpt2.py --model-name ./my-lm --gold vader   # writes runs/<run>/preferences.jsonl
    python dpo_gpt2.py --model-name ./my-lm --preferences runs/<run>/preferences.jsonl --gold vader \
        --save-model
    python ppo_rlhf_gpt2.py --eval-checkpoint runs/<run>/model --reward-model vader   # score the policy
    tensorboard --logdir runs   # rewards/{chosen,rejected,margins,accuracies}, logps/*, losses/*, eval/*

What the code computes (pi = softmax(logits / temperature), as the RL files sample; t: a response's tokens):
    chosen_logps = sum_t log pi(y_t | prompt, y_<t) over the chosen response's tokens (detail 42); the same
        for rejected_logps; ref_chosen_logps, ref_rejected_logps: the reference's
    chosen_logratios = chosen_logps - ref_chosen_logps,   rejected_logratios likewise
    rewards = beta * logratios (the implicit reward),   margins = chosen_logratios - rejected_logratios
    loss (sigmoid) = -(1 - label_smoothing) log sigma(beta margins) - label_smoothing log sigma(-beta margins)
    loss (ipo) = (chosen_logratios / chosen_lengths - rejected_logratios / rejected_lengths - 1 / (2 beta))^2
        with lengths the responses' numbers of tokens
    accuracy = share of pairs with margins > 0 (ties count 1/2), as reward_model_gpt2.py counts
    eval/kl = mean over held-out prompts of sum_t log pi(y_t) - log pi_ref(y_t), y sampled from pi (k1)
IPO's margin is over per-token means, as TRL computes it: summed log-ratios grow with the length, the target
1 / (2 beta) does not. Both losses are means over pairs.

Implementation details; numbers as in ppo_rlhf_gpt2.py and reward_model_gpt2.py, 41 on for DPO's own:
 3. Adam with eps = 1e-5.   4. The learning rate decays linearly to 0.   11. Gradient-norm clipping.
23-29 in the held-out sampling: a pad token distinct from EOS, left padding, position ids from the mask,
    logits / temperature, pure sampling, dropout off, truncation after the first stop token.
26. Logits divided by the sampling temperature in every forward pass, training included: DPO trains the
    policy that is sampled, against the reference that sampled a --gold file (--temperature 1: the paper's).
28. Dropout off: eval mode, also while training (the reference's numbers depend on no dropout draw).
37. The Bradley-Terry loss, averaged over pairs; chosen and rejected responses in one forward pass.
39. A seeded held-out split by prompt (held-out prompts are never trained on), beside the gold labeler.
    The same flags hold out reward_model_gpt2.py's comparisons; --split-seed fixes the split, --seed the rest.
40. The whole model trained, one epoch by default; a higher learning rate moves it further (a larger KL).
41. The reference is the policy before its first step: its log-probs of every training response are computed
    once, in chunks without gradients, before training, so no second model is in memory while training; those
    of the held-out responses are the policy's own at the step-0 evaluation (one pass, not two). The sampled
    evaluation reloads it from --model-name, for the KL only, and lets it go again.
42. A response's tokens: prompt + response is tokenized whole (the text the reward model reads), and the
    response's tokens are those ending after the prompt's characters (a token merged across the boundary is
    the response's); never the prompt's, never padding. No end token is scored: responses are scored as the
    sampler wrote them, the stop token included where they stopped; an EOS after each (TRL's convention,
    --append-eos) would teach a token the sampler here does not stop at. The reward model's appended EOS is
    only the place its head reads.
43. The implicit reward logged under TRL's names; the held-out accuracy with a standard error over prompts
    (a prompt's comparisons are not independent draws).
44. The held-out KL estimated from the sampled tokens (k1, summed per response), as the RL files log it.
53. --bf16: the policy's passes in bfloat16 autocast (not the gold scorer's); weights, log-probs, losses fp32;
    the reference's log-probs over the first epoch's micro-batches, the update's shapes: first margins 0.
"""

import importlib.util
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer,
                          Conv1D)


@dataclass
class Args:
    # experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]  # part of the run directory name
    seed: int = 1  # seed of python, numpy and torch (split, shuffling, held-out sampling)
    torch_deterministic: bool = True  # if toggled, `torch.backends.cudnn.deterministic=True`
    cuda: bool = True  # if toggled and a GPU is available, run on it
    bf16: bool = False  # bfloat16 autocast (detail 53), not the gold scorer; slow on CPUs without bf16
    num_threads: int = 1  # torch CPU threads
    runs_dir: str = "runs"  # TensorBoard logs, held-out scores and the model go to <runs_dir>/<run_name>/
    save_model: bool = False  # save the policy, its tokenizer and sampling.json to <run dir>/model

    # data
    preferences: str | None = None  # a JSONL file of comparisons, {"prompt", "chosen", "rejected"} a line
    eval_fraction: float = 0.1  # share of the distinct prompts held out with all their comparisons (seeded)
    split_seed: int | None = None  # seed of that split (None: --seed), to vary --seed on one split
    gold: str | None = None  # scores held-out samples: `vader`, `length`, a classifier folder (None: KL only)
    gold_label: int = 1  # --gold FOLDER: the classifier's logit used as the gold score (one label: it)

    # model and sampling (the sampling of ppo_rlhf_gpt2.py)
    model_name: str = "gpt2"  # the policy and the reference: a causal LM's hub id or local directory
    max_query_length: int = 32  # prompts longer than this many tokens lose their first tokens when sampled
    response_length: int = 24  # number of tokens sampled for each response
    min_response_length: int = 16  # a stop token earlier than this many tokens does not end the response
    temperature: float = 0.7  # the policy is softmax(logits / temperature), in training too (detail 26)
    stop_token: str = "."  # `eos` or a single-token string: responses are truncated after it
    max_length: int = 128  # texts longer than this many tokens lose their first tokens (the end is scored)
    append_eos: bool = False  # score an EOS after every response, as TRL does (detail 42)

    # algorithm
    loss_type: Literal["sigmoid", "ipo"] = "sigmoid"  # DPO's loss, or IPO's (Azar et al.)
    beta: float = 0.1  # the KL coefficient the implicit reward is scaled by (TRL's and the paper's default)
    label_smoothing: float = 0.0  # --loss-type sigmoid: the share of labels assumed flipped (cDPO)
    num_epochs: int = 1  # passes over the training comparisons
    batch_size: int = 32  # comparisons per optimizer step
    gradient_accumulation_steps: int = 4  # micro-batches per batch (each holds vocabulary-sized logits)
    forward_batch_size: int = 16  # prompts per sampling pass, texts per pass without gradients
    learning_rate: float = 5e-5  # Adam's (TRL: 1e-6 over many more steps); higher: further from the reference
    anneal_lr: bool = True  # anneal the learning rate linearly to 0
    max_grad_norm: float = 1.0  # the maximum norm of the global gradient
    eval_every: int = 0  # also evaluate every this many steps (0: before and after training only)
    eval_episodes: int = 256  # held-out responses sampled for the gold score and the KL (0: none)

    # computed in check_args
    micro_batch_size: int = 0  # computed: batch_size // gradient_accumulation_steps


# ------------------------------------------------------------------------------------------------------------
# The policy's log-probabilities of responses, and the math (each function is tested against a reference).


def model_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
    """The inputs of every forward pass except generation's, any padding side (the mask: 1 on real tokens)."""
    attention_mask = attention_mask.bool()
    # detail 25: position ids from the attention mask: the first real token is at 0 whatever the padding
    position_ids = attention_mask.cumsum(1) - attention_mask.long()
    # detail 23: the pad id may be outside the vocabulary; padded positions are masked out, any id will do
    return dict(input_ids=input_ids.masked_fill(~attention_mask, 0), attention_mask=attention_mask,
                position_ids=position_ids, use_cache=False)  # one whole pass: no KV cache (less memory)


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


def scale_logits(logits: torch.Tensor, temperature: float, pad_token_id: int) -> torch.Tensor:
    """detail 26: the policy is softmax(logits / temperature), in every forward pass."""
    logits = logits.float() / temperature  # fp32 from here on, also under --bf16
    if pad_token_id < logits.shape[-1]:
        # detail 23: a pad id inside the vocabulary is never a valid action (it would be read as padding)
        logits[..., pad_token_id] = torch.finfo(logits.dtype).min
    return logits


def sequence_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor,
                   temperature: float, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """detail 42: the sum of log pi over the positions response_mask keeps, and their number, (batch,) each.
    The logits at position i predict token i + 1; the output layer runs from the first position needed."""
    first = int(response_mask.float().argmax(1).min().clamp(min=1)) - 1  # where the earliest response starts
    output = model(**model_inputs(input_ids, attention_mask), logits_to_keep=input_ids.shape[1] - first)
    logits = scale_logits(output.logits[:, :-1], temperature, pad_token_id)
    tokens, mask = input_ids[:, first + 1 :], response_mask[:, first + 1 :].bool()
    token_logps = logits.log_softmax(-1).gather(-1, tokens.masked_fill(~mask, 0).unsqueeze(-1)).squeeze(-1)
    return torch.where(mask, token_logps, 0.0).sum(1), mask.sum(1)


def response_logps(model, tokenizer, comparisons: list[dict], args: Args, device):
    """(chosen_logps, rejected_logps, chosen_lengths, rejected_lengths) of the comparisons: each text
    tokenized whole, the response's tokens those that end after the prompt's characters (detail 42)."""
    texts, starts = texts_of(comparisons)
    end_token = tokenizer.eos_token if args.append_eos else ""  # an EOS scored after each response, or none
    batch = tokenizer([text + end_token for text in texts], padding=True, truncation=True,
                      max_length=args.max_length, return_tensors="pt", return_offsets_mapping=True)
    ends_after_prompt = batch["offset_mapping"][..., 1] > torch.tensor(starts)[:, None]
    response_mask = batch["attention_mask"].bool() & ends_after_prompt
    logps, lengths = sequence_logps(model, batch["input_ids"].to(device), batch["attention_mask"].to(device),
                                    response_mask.to(device), args.temperature, tokenizer.pad_token_id)
    n = len(comparisons)
    return logps[:n], logps[n:], lengths[:n], lengths[n:]


def dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float, loss_type: str,
             label_smoothing: float = 0.0, chosen_lengths=None, rejected_lengths=None):
    """The loss (mean over pairs), and the implicit rewards beta * logratios of the chosen and the rejected
    responses (detached), as the docstring writes them."""
    chosen_logratios = chosen_logps - ref_chosen_logps
    rejected_logratios = rejected_logps - ref_rejected_logps
    if loss_type == "ipo":  # per-token means (Azar et al.'s target does not grow with the length)
        margins = (chosen_logratios / chosen_lengths.clamp(min=1)  # 0 tokens: an empty prompt's first token
                   - rejected_logratios / rejected_lengths.clamp(min=1))
        losses = (margins - 1 / (2 * beta)) ** 2
    else:
        margins = chosen_logratios - rejected_logratios
        losses = (-(1 - label_smoothing) * F.logsigmoid(beta * margins)
                  - label_smoothing * F.logsigmoid(-beta * margins))
    return losses.mean(), beta * chosen_logratios.detach(), beta * rejected_logratios.detach()


def comparison_correct(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> torch.Tensor:
    """1 for each pair rewarded in the labels' order, 0 in the other, 1/2 for a tie (a coin flip would get it
    half right; TRL counts it 0): the accuracy is their mean."""
    return (chosen_rewards > rejected_rewards).double() + 0.5 * (chosen_rewards == rejected_rewards).double()


def prompt_stderr(values: torch.Tensor, prompts: list[str]) -> float:
    """detail 43: the standard error of the mean of values (one per comparison) when a prompt's comparisons
    are not independent: sqrt(G / (G - 1) * sum over the G prompts of (sum of its values - mean)^2) / n, the
    cluster standard error (with one comparison per prompt, the usual std / sqrt(n))."""
    values = values.double()
    deviations = {}
    for prompt, deviation in zip(prompts, (values - values.mean()).tolist()):
        deviations[prompt] = deviations.get(prompt, 0.0) + deviation
    groups = len(deviations)
    if groups < 2:
        return 0.0
    return math.sqrt(groups / (groups - 1) * sum(d * d for d in deviations.values())) / len(values)


@torch.no_grad()
def logps_in_chunks(model, tokenizer, comparisons: list[dict], args: Args, device,
                    chunk: int | None = None) -> torch.Tensor:
    """(4, len(comparisons)): chosen_logps, rejected_logps, chosen_lengths and rejected_lengths (as
    response_logps), forward_batch_size texts at a time (half of them chosen, half rejected) or chunk
    comparisons, no gradients: the reference's numbers (detail 41), and the held-out comparisons'."""
    chunk = chunk or max(1, args.forward_batch_size // 2)
    return torch.cat([torch.stack(response_logps(model, tokenizer, comparisons[i : i + chunk], args, device))
                      for i in range(0, len(comparisons), chunk)], dim=1)


@torch.no_grad()
def evaluate_comparisons(policy, tokenizer, comparisons: list[dict], ref_logps: torch.Tensor | None,
                         args: Args, device) -> tuple[dict, torch.Tensor]:
    """The held-out comparisons: the implicit reward's accuracy with its standard error over prompts (detail
    43) and their number, the loss, each comparison's margin beta * (chosen_logratios - rejected_logratios);
    and the policy's log-probs (as logps_in_chunks), the reference's where ref_logps is None (step 0)."""
    logps = logps_in_chunks(policy, tokenizer, comparisons, args, device)
    ref_logps = logps if ref_logps is None else ref_logps
    loss, chosen_rewards, rejected_rewards = dpo_loss(logps[0], logps[1], ref_logps[0], ref_logps[1],
                                                      args.beta, args.loss_type, args.label_smoothing,
                                                      logps[2], logps[3])
    correct = comparison_correct(chosen_rewards, rejected_rewards).cpu()
    margins = (chosen_rewards - rejected_rewards).cpu()
    return {"accuracy": correct.mean().item(), "dpo_loss": loss.item(), "margins_mean": margins.mean().item(),
            "accuracy_stderr": prompt_stderr(correct, [c["prompt"] for c in comparisons]),
            "margins": margins.tolist(), "prompts": len({c["prompt"] for c in comparisons})}, logps


# ------------------------------------------------------------------------------------------------------------
# Training


def main(args: Args) -> dict:
    # 1. setup
    check_args(args)
    comparisons = read_preferences(args.preferences, args)  # a bad file fails before any model loads
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
    run_dir = os.path.join(args.runs_dir, f"{args.exp_name}__{args.seed}__{int(time.time())}")
    tokenizer, stop_token_id = load_tokenizer(args.model_name, args.stop_token)
    check_tokenizer(tokenizer, args)
    check_max_length(args.model_name, tokenizer, texts_of(comparisons)[0], args)

    # 2. preferences: the held-out split by prompt, and the gold scorer of the held-out samples
    split_seed = args.seed if args.split_seed is None else args.split_seed
    train_indices, eval_indices = split_comparisons([c["prompt"] for c in comparisons], args.eval_fraction,
                                                    split_seed)  # detail 39
    train_set, eval_set = [comparisons[i] for i in train_indices], [comparisons[i] for i in eval_indices]
    eval_prompts = list(dict.fromkeys(c["prompt"] for c in eval_set))  # never trained on
    has_gold = all("gold_chosen" in c and "gold_rejected" in c for c in eval_set)
    gold_accuracy = comparison_correct(*(torch.tensor([c[k] for c in eval_set], dtype=torch.float64)
                                         for k in ("gold_chosen", "gold_rejected"))).mean().item() if (
        has_gold) else None  # the gold labeler's own agreement with the labels: the ceiling
    gold_fn = load_gold_fn(args, device) if args.gold and args.eval_episodes > 0 else None

    # 3. the reference's log-probs, once (detail 41): the policy before its first step is the reference
    policy = load_policy(args.model_name, device)
    autocast_bf16(args.bf16, device, policy, seed=args.seed)  # detail 53, as the reloaded reference below
    # detail 53: with --bf16, over the first epoch's micro-batches (the update's shapes): first margins 0
    first_order = torch.randperm(len(train_set)).tolist() if args.bf16 else list(range(len(train_set)))
    ref_train = torch.zeros(4, len(train_set), device=device)
    ref_train[:, first_order] = logps_in_chunks(policy, tokenizer, [train_set[i] for i in first_order], args,
                                                device, args.micro_batch_size if args.bf16 else None)
    ref_eval = None  # the held-out ones: the policy's at the step-0 evaluation
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.learning_rate, eps=1e-5)  # detail 3
    writer = SummaryWriter(run_dir)
    writer.add_text("hyperparameters", markdown_table(list(vars(args).items()), ("param", "value")))
    num_steps = args.num_epochs * (len(train_set) // args.batch_size)
    step, interrupted, eval_stats = 0, False, {}

    def held_out_evaluation():
        nonlocal ref_eval
        stats, logps = evaluate_comparisons(policy, tokenizer, eval_set, ref_eval, args, device)
        ref_eval = logps if ref_eval is None else ref_eval
        eval_stats.update(stats)
        for key in ("accuracy", "accuracy_stderr", "dpo_loss", "margins_mean"):
            writer.add_scalar(f"eval/{key}", eval_stats[key], step)
        if gold_accuracy is not None:  # detail 39: the ceiling, beside the held-out accuracy
            writer.add_scalar("eval/gold_accuracy", gold_accuracy, step)
        if args.eval_episodes > 0:  # detail 41: at step 0 the policy is the reference, later it is reloaded
            reference = policy if step == 0 else load_policy(args.model_name, device)
            if reference is not policy:  # detail 53: moved as the policy was before its first step (--seed)
                autocast_bf16(args.bf16, device, reference, seed=args.seed)
            eval_stats.update(evaluate_samples(policy, reference, eval_prompts, tokenizer, stop_token_id,
                                               gold_fn, args, device))
            del reference
            for key in ("kl", "gold_scores") if gold_fn else ("kl",):
                writer.add_scalar(f"eval/{key}", eval_stats[f"{key}_mean"], step)

    print(f"{len(train_set)} training and {len(eval_set)} held-out comparisons ({len(eval_prompts)} held-out "
          f"prompts), {num_steps} steps")
    try:
        held_out_evaluation()
        for epoch in range(args.num_epochs):  # detail 40
            order = first_order if epoch == 0 and args.bf16 else torch.randperm(len(train_set)).tolist()
            for start in range(0, len(train_set) - args.batch_size + 1, args.batch_size):
                step += 1
                if args.anneal_lr:  # detail 4
                    optimizer.param_groups[0]["lr"] = (1.0 - (step - 1.0) / num_steps) * args.learning_rate

                # 4. update: the loss of each micro-batch against the stored reference, gradients accumulated
                stats = {}
                for micro_start in range(start, start + args.batch_size, args.micro_batch_size):
                    indices = order[micro_start : micro_start + args.micro_batch_size]
                    chosen_logps, rejected_logps, chosen_lengths, rejected_lengths = response_logps(
                        policy, tokenizer, [train_set[i] for i in indices], args, device)  # detail 37
                    loss, chosen_rewards, rejected_rewards = dpo_loss(
                        chosen_logps, rejected_logps, ref_train[0][indices], ref_train[1][indices], args.beta,
                        args.loss_type, args.label_smoothing, chosen_lengths, rejected_lengths)
                    (loss / args.gradient_accumulation_steps).backward()
                    for key, value in [("losses/dpo_loss", loss.item()),
                                       ("rewards/chosen", chosen_rewards.mean().item()),
                                       ("rewards/rejected", rejected_rewards.mean().item()),
                                       ("rewards/margins", (chosen_rewards - rejected_rewards).mean().item()),
                                       ("rewards/accuracies",
                                        comparison_correct(chosen_rewards, rejected_rewards).mean().item()),
                                       ("logps/chosen", chosen_logps.mean().item()),
                                       ("logps/rejected", rejected_logps.mean().item())]:
                        stats.setdefault(key, []).append(value)
                nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)  # detail 11
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

                # 5. logging: detail 43, TRL's names
                stats = {k: float(np.mean(v)) for k, v in stats.items()}
                stats["charts/learning_rate"] = optimizer.param_groups[0]["lr"]
                for tag, value in stats.items():
                    writer.add_scalar(tag, value, step)
                if args.eval_every > 0 and step % args.eval_every == 0 and step < num_steps:
                    held_out_evaluation()
                print(f"epoch {epoch + 1} step {step}/{num_steps} loss {stats['losses/dpo_loss']:.4f} "
                      f"margin {stats['rewards/margins']:.3f} accuracy {stats['rewards/accuracies']:.3f}")
        held_out_evaluation()
    except KeyboardInterrupt:
        print(f"interrupted at step {step}: keeping the logs, skipping the final evaluation")
        interrupted, eval_stats = True, {}

    # 6. save
    result = {"run_dir": run_dir, "preferences": args.preferences, "steps": step, "interrupted": interrupted,
              "gold_accuracy": gold_accuracy,
              **{f"eval_{k}": v for k, v in eval_stats.items() if k not in ("margins", "samples")}}
    try:
        if not interrupted:
            print_held_out_summary(dict(eval_stats, gold_accuracy=gold_accuracy), args)
            result["held_out_scores"] = write_held_out_scores(eval_indices, eval_stats["margins"], run_dir)
        if args.save_model:
            result["model_path"] = os.path.join(run_dir, "model")
            policy.config.interrupted_at = step if interrupted else None  # in config.json: a Ctrl-C's step
            save_policy(policy, args.model_name, result["model_path"], args)
            print(f"policy saved to {result['model_path']}")
    except KeyboardInterrupt:
        print("interrupted while saving: keeping the logs; the model folder may be incomplete")
        result["interrupted"] = True
    finally:
        writer.close()
    return result


# ------------------------------------------------------------------------------------------------------------
# Plumbing, skippable on a first reading: the held-out split and evaluation, argument checks, the preference
# file, loading and saving.


def texts_of(comparisons: list[dict]) -> tuple[list[str], list[int]]:
    """The texts prompt + chosen of the comparisons, then prompt + rejected (one forward pass scores both);
    and where each response starts (the prompt's length)."""
    texts = [c["prompt"] + c[key] for key in ("chosen", "rejected") for c in comparisons]
    starts = [len(c["prompt"]) for _ in ("chosen", "rejected") for c in comparisons]
    return texts, starts


def split_comparisons(prompts: list[str], eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """detail 39: (training, held-out) indices of the comparisons whose prompts are given, split by prompt:
    the eval_fraction of the distinct prompts (at least one) with the smallest seeded keys is held out with
    all its comparisons. A prompt's key depends on the seed and its text only: files with the same prompts (a
    file and its first lines, most often) hold out the same ones."""
    distinct = sorted(set(prompts), key=lambda p: (random.Random(f"{seed} {p}").random(), p))
    held_out = set(distinct[: max(1, round(eval_fraction * len(distinct)))])
    return ([i for i, p in enumerate(prompts) if p not in held_out],
            [i for i, p in enumerate(prompts) if p in held_out])


def mean_and_stderr_over_prompts(values: list[float], prompts: list[str]) -> tuple[float, float]:
    """The mean over the distinct prompts of each prompt's mean value, and its standard error over them."""
    per_prompt = {}
    for prompt, value in zip(prompts, values):
        per_prompt.setdefault(prompt, []).append(value)
    means = torch.tensor([sum(v) / len(v) for v in per_prompt.values()], dtype=torch.float64)
    return means.mean().item(), (means.std() / len(means) ** 0.5).item() if len(means) > 1 else 0.0


@torch.no_grad()  # not inference_mode: generate's bf16 weight cache (53)
def evaluate_samples(policy, reference, eval_prompts: list[str], tokenizer, stop_token_id: int, gold_fn,
                     args: Args, device) -> dict:
    """The RL files' held-out evaluation: eval_episodes responses to the held-out prompts (cycled), sampled
    with the training temperature and truncation, their gold scores (with --gold) and the KL to the reference
    (detail 44): sum over each response's real tokens of log pi - log pi_ref, both from one full forward pass
    at the temperature. Means over prompts, standard errors over prompts. The random draws come from their
    own generator state: evaluating does not change training."""
    prompts = [eval_prompts[i % len(eval_prompts)] for i in range(args.eval_episodes)]
    kls, gold, samples, stopped = [], [], [], []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(args.seed)
        for i in range(0, len(prompts), args.forward_batch_size):
            batch = prompts[i : i + args.forward_batch_size]
            queries, responses, response_mask, contain_stop = sample_responses(policy, batch, tokenizer,
                                                                               stop_token_id, args, device)
            query_responses = torch.cat([queries, responses], dim=1)
            attention_mask = query_responses != tokenizer.pad_token_id
            mask = torch.cat([torch.zeros_like(queries, dtype=torch.bool), response_mask], dim=1)
            logps = [sequence_logps(model, query_responses, attention_mask, mask, args.temperature,
                                    tokenizer.pad_token_id)[0] for model in (policy, reference)]
            kls += (logps[0] - logps[1]).tolist()
            stopped += contain_stop.tolist()
            texts = tokenizer.batch_decode(query_responses, skip_special_tokens=True)
            response_texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
            samples += list(zip(batch, response_texts))
            if gold_fn is not None:
                gold += gold_fn(texts, response_texts).float().tolist()
    result = {"samples": samples, "stop_share": sum(stopped) / len(stopped)}
    result["kl_mean"], result["kl_stderr"] = mean_and_stderr_over_prompts(kls, prompts)
    if gold_fn is not None:
        result["gold_scores_mean"], result["gold_scores_stderr"] = mean_and_stderr_over_prompts(gold, prompts)
    return result


def print_held_out_summary(eval_stats: dict, args: Args) -> None:
    """The final held-out numbers, and the gold labeler's accuracy (eval_stats holds it as gold_accuracy)."""
    gold = eval_stats["gold_accuracy"]
    gold = f", the gold labeler's {gold:.3f}" if gold is not None else ""
    num_comparisons, num_prompts = len(eval_stats["margins"]), eval_stats["prompts"]
    accuracy, stderr = eval_stats["accuracy"], eval_stats["accuracy_stderr"]
    print(f"held-out accuracy {accuracy:.3f} +- {stderr:.3f} (95%: [{accuracy - 1.96 * stderr:.3f}, "
          f"{accuracy + 1.96 * stderr:.3f}], standard error over {num_prompts} prompts) on {num_comparisons} "
          f"comparisons{gold}")
    if "kl_mean" in eval_stats:
        score = (f"gold score {eval_stats['gold_scores_mean']:.4f} +- "
                 f"{eval_stats['gold_scores_stderr']:.4f}, " if "gold_scores_mean" in eval_stats else "")
        print(f"held-out samples: {score}KL {eval_stats['kl_mean']:.3f} +- {eval_stats['kl_stderr']:.3f} "
              f"nats (standard errors over {num_prompts} prompts)")


def check_args(args: Args) -> None:
    """Validate the arguments and compute the derived sizes; fail before any model is loaded."""

    def require(names: tuple, ok, requirement: str):
        for name in names:
            if not ok(getattr(args, name)):
                flag = "--" + name.replace("_", "-")
                raise SystemExit(f"error: {flag} must be {requirement} (got {getattr(args, name)})")

    require(("max_query_length", "response_length", "num_epochs", "batch_size", "gradient_accumulation_steps",
             "forward_batch_size", "num_threads"), lambda v: v >= 1, "at least 1")
    require(("max_length",), lambda v: v >= 2, "at least 2")
    require(("eval_every",), lambda v: v >= 0, "at least 0")
    require(("temperature", "learning_rate", "max_grad_norm"), lambda v: v > 0 and math.isfinite(v),
            "positive")
    require(("eval_fraction",), lambda v: 0 < v < 1, "between 0 and 1 (exclusive)")
    require(("eval_episodes",), lambda v: v >= 0, "at least 0")
    require(("beta",), lambda v: v > 0 and math.isfinite(v), "positive")
    require(("label_smoothing",), lambda v: 0 <= v < 0.5, "in [0, 0.5): the share of labels assumed flipped")
    require(("loss_type",), lambda v: v in ("sigmoid", "ipo"), "`sigmoid` or `ipo`")
    if args.bf16 and args.cuda and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise SystemExit("error: --bf16: this GPU cannot compute in bfloat16 (torch.cuda.is_bf16_supported() "
                         "is False); run without --bf16")
    if args.label_smoothing > 0 and args.loss_type != "sigmoid":
        raise SystemExit(f"error: --label-smoothing {args.label_smoothing}: it applies to --loss-type "
                         "sigmoid only; pass 0 with ipo")
    if not 0 <= args.min_response_length < args.response_length:
        raise SystemExit(f"error: --min-response-length {args.min_response_length} must be at least 0 and "
                         f"smaller than --response-length {args.response_length}")
    if args.batch_size % args.gradient_accumulation_steps != 0:
        raise SystemExit(f"error: --batch-size {args.batch_size} is not divisible by "
                         f"--gradient-accumulation-steps {args.gradient_accumulation_steps}")
    args.micro_batch_size = args.batch_size // args.gradient_accumulation_steps
    if not args.stop_token:
        raise SystemExit("error: --stop-token must be `eos` or a single-token string such as `.`")
    if args.model_name.startswith(("/", ".", "~")) and not os.path.isdir(os.path.expanduser(args.model_name)):
        raise SystemExit(f"error: --model-name {args.model_name}: no such directory")
    if args.preferences is None:
        raise SystemExit("error: --preferences: pass a JSONL file of comparisons (reward_model_gpt2.py "
                         "--gold writes one)")
    if not os.path.isfile(args.preferences):
        raise SystemExit(f"error: --preferences {args.preferences}: no such file")
    if args.gold == "vader" and importlib.util.find_spec("vaderSentiment") is None:
        raise SystemExit("error: --gold vader needs the vaderSentiment package (pip install vaderSentiment)")
    if args.gold not in (None, "vader", "length") and not os.path.isdir(os.path.expanduser(args.gold)):
        raise SystemExit(f"error: --gold {args.gold}: not `vader`, `length` or a sequence-classifier folder")


def check_split(prompts: list[str], args: Args) -> None:
    """Stop if the split by prompt (the one main makes, with --split-seed) leaves no training prompt, or fewer
    training comparisons than a batch."""
    split_seed = args.seed if args.split_seed is None else args.split_seed
    train, _ = split_comparisons(prompts, args.eval_fraction, split_seed)
    if not train:
        raise SystemExit(f"error: --eval-fraction {args.eval_fraction} holds out all {len(set(prompts))} "
                         f"distinct prompts: the split is by prompt; lower it or use more prompts")
    if len(train) < args.batch_size:
        raise SystemExit(f"error: --batch-size {args.batch_size} is larger than the {len(train)} training "
                         f"comparisons (after --eval-fraction {args.eval_fraction} of the prompts held out); "
                         f"lower it or add comparisons")


def check_tokenizer(tokenizer, args: Args) -> None:
    """--append-eos appends the EOS to every text: it must exist and be read as one token; the response's
    tokens are found by their character offsets, which only fast tokenizers give."""
    if args.append_eos and (tokenizer.eos_token is None or tokenizer.encode(
            "x" + tokenizer.eos_token, add_special_tokens=False)[-1:] != [tokenizer.eos_token_id]):
        raise SystemExit(f"error: --append-eos: the tokenizer of {args.model_name} has no EOS token that "
                         "text can end with")
    if not tokenizer.is_fast:
        raise SystemExit(f"error: --model-name {args.model_name}: its tokenizer gives no character offsets "
                         "(not a fast tokenizer), which find the response's tokens")


def markdown_table(rows: list[tuple], header: tuple) -> str:
    cells = [[str(x).replace("|", "\\|").replace("\n", " ") for x in row] for row in rows]
    lines = [header, ["-"] * len(header)] + cells
    return "\n".join("|" + "|".join(line) + "|" for line in lines)


def write_held_out_scores(indices: list[int], margins: list[float], run_dir: str) -> str:
    """<run dir>/held_out_scores.jsonl: the held-out comparisons (0-based lines of the preference file) and
    their margins, the chosen response's score minus the rejected one's (the reward model's score, DPO's
    implicit reward), which benchmarks/preference_baselines.py --scores reads."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "held_out_scores.jsonl")
    with open(path, "w") as f:
        for index, margin in zip(indices, margins):
            f.write(json.dumps({"index": index, "margin": margin}) + "\n")
    return path


def read_preferences(path: str, args: Args) -> list[dict]:
    """The comparisons of a JSONL file, or a one-line error that names the line."""
    comparisons = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            where = f"error: --preferences {path}: line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise SystemExit(f"{where} is not UTF-8 text: save the file as UTF-8")
            if not line.strip():
                raise SystemExit(f"{where} is empty: write one JSON object per line, with no blank lines")
            try:
                comparison = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{where} is not JSON ({e.msg})")
            missing = [k for k in ("prompt", "chosen", "rejected")
                       if not isinstance(comparison, dict) or not isinstance(comparison.get(k), str)]
            if missing:
                raise SystemExit(f"{where} lacks the text field(s) {', '.join(missing)}: each line needs "
                                 '{"prompt": ..., "chosen": ..., "rejected": ...}')
            if not comparison["chosen"].strip() or not comparison["rejected"].strip():
                raise SystemExit(f"{where}: an empty response; both responses need text")
            if comparison["chosen"] == comparison["rejected"]:
                raise SystemExit(f"{where}: chosen and rejected are the same text; drop the line")
            comparisons.append(comparison)
    if not comparisons:
        raise SystemExit(f"error: --preferences {path} contains no comparisons")
    check_split([c["prompt"] for c in comparisons], args)
    return comparisons


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
    """The policy's tokenizer: left padding and truncation, a pad token distinct from EOS; and the stop id."""
    tokenizer = from_pretrained(AutoTokenizer, model_name, flag, padding_side="left",
                                truncation_side="left")  # detail 24
    if tokenizer.pad_token is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        tokenizer.add_special_tokens({"pad_token": "[PAD]"})  # detail 23
    if stop_token == "eos":
        if tokenizer.eos_token_id is None:
            raise SystemExit(f"error: --stop-token eos: the tokenizer of {model_name} has no EOS token")
        return tokenizer, tokenizer.eos_token_id
    # the id the policy samples is the one the token has inside text (SentencePiece may encode "." alone
    # as "▁."), so it is read off a word followed by the stop token
    for word in ("word", "x", "7"):
        word_ids = tokenizer.encode(word, add_special_tokens=False)
        ids = tokenizer.encode(word + stop_token, add_special_tokens=False)
        if len(ids) == len(word_ids) + 1 and ids[: len(word_ids)] == word_ids:
            return tokenizer, ids[-1]
    raise SystemExit(f"error: --stop-token {stop_token!r} is not a single token inside text for this "
                     f"tokenizer; pass `eos` or a single token, such as `.`")


def check_max_length(model_name: str, tokenizer, texts: list[str], args: Args) -> None:
    """--max-length is cut to the model's positions (said); texts longer than it lose their first tokens: how
    many is said."""
    config = from_pretrained(AutoConfig, model_name, "--model-name")
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and args.max_length > positions:
        print(f"--max-length {args.max_length} is more than the {positions} positions of --model-name "
              f"{model_name}: texts are cut to {positions} tokens")
        args.max_length = positions
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    cut = sum(n > args.max_length for n in lengths)
    if cut:
        print(f"{cut} of {len(texts)} texts are longer than --max-length {args.max_length} tokens: they lose "
              "their first tokens")


def load_policy(model_name: str, device: torch.device, flag: str = "--model-name") -> nn.Module:
    policy = from_pretrained(AutoModelForCausalLM, model_name, flag, dtype=torch.float32)
    return policy.to(device).eval()  # detail 28


def load_gold_fn(args: Args, device: torch.device):
    """The gold scorer of the held-out samples: texts (prompt + response) and responses in. A classifier
    folder saved by reward_model_gpt2.py is read as it was trained (its end token and readout)."""
    if args.gold == "length":  # ppo_rlhf_gpt2.py's toy reward: characters of the response, scaled
        return lambda texts, responses: torch.tensor([len(r) / args.response_length for r in responses])
    if args.gold == "vader":
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

        analyzer = SentimentIntensityAnalyzer()
        return lambda texts, responses: torch.tensor([analyzer.polarity_scores(t)["compound"] for t in texts])
    gold_tokenizer = from_pretrained(AutoTokenizer, args.gold, "--gold")
    gold_model = from_pretrained(AutoModelForSequenceClassification, args.gold, "--gold", dtype=torch.float32)
    gold_model.to(device).eval().requires_grad_(False)
    label = 0 if gold_model.config.num_labels == 1 else args.gold_label
    if not 0 <= label < gold_model.config.num_labels:
        raise SystemExit(f"error: --gold-label {args.gold_label} is not one of the gold classifier's "
                         f"{gold_model.config.num_labels} labels")
    if gold_tokenizer.pad_token is None:
        gold_tokenizer.pad_token = gold_tokenizer.eos_token  # it reads plain text: EOS is a safe pad
    gold_model.config.pad_token_id = gold_tokenizer.pad_token_id
    reward_bias = getattr(gold_model.config, "reward_bias", 0.0)  # a folder reward_model_gpt2.py saved
    end_token = getattr(gold_model.config, "reward_end_token", None)
    mean = getattr(gold_model.config, "reward_readout", None) == "mean"

    @torch.inference_mode()
    def gold_fn(texts, responses):
        if end_token is None:
            inputs = gold_tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(device)
            return gold_model(**inputs).logits[:, label].float() + reward_bias
        inputs = gold_tokenizer([t + end_token for t in texts], padding=True, truncation=True,
                                max_length=args.max_length, return_tensors="pt", return_offsets_mapping=mean)
        mask = inputs["attention_mask"].bool().to(device)
        hidden = gold_model.base_model(**model_inputs(inputs["input_ids"].to(device), mask)).last_hidden_state
        if mean:  # the tokens ending after the prompt: the response's and the end token
            starts = torch.tensor([len(t) - len(r) for t, r in zip(texts, responses)])
            keep = (mask & (inputs["offset_mapping"][..., 1] > starts[:, None]).to(device)).float()
            features = (keep.unsqueeze(-1) * hidden).sum(1) / keep.sum(1, keepdim=True)
        else:  # the end token, whatever the padding
            features = hidden[torch.arange(len(hidden), device=device),
                              (torch.arange(mask.shape[1], device=device) * mask).argmax(1)]
        return gold_model.score(features)[:, 0].float() + reward_bias

    return gold_fn


SAMPLING = ("temperature", "response_length", "min_response_length", "stop_token", "max_query_length")


def save_policy(policy: nn.Module, model_name: str, path: str, args: Args) -> None:
    """save_pretrained, with a tokenizer that plain `from_pretrained` + `generate` can use as it is (left
    padding, a pad id the model can embed), and the settings the policy was trained to sample with
    (sampling.json, which ppo_rlhf_gpt2.py --eval-checkpoint reads)."""
    tokenizer = from_pretrained(AutoTokenizer, model_name, "--model-name", padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    policy.generation_config.pad_token_id = tokenizer.pad_token_id
    policy.save_pretrained(path)
    tokenizer.save_pretrained(path)
    with open(os.path.join(path, "sampling.json"), "w") as f:
        json.dump({name: getattr(args, name) for name in SAMPLING}, f)


# ------------------------------------------------------------------------------------------------------------
# Generation, skippable: ppo_rlhf_gpt2.py's, copied (no code is shared between the scripts).


def sample_responses(policy, prompts: list[str], tokenizer, stop_token_id: int, args: Args, device):
    """One response to each prompt, sampled as ppo_rlhf_gpt2.py samples: the queries (left-padded, their
    first tokens cut beyond --max-query-length), the responses truncated after their stop token, the response
    mask and whether each response stopped."""
    queries = tokenizer(prompts, padding=True, truncation=True, max_length=args.max_query_length,
                        return_tensors="pt")["input_ids"].to(device)
    responses, _ = generate(policy, queries, args.response_length, args.temperature, tokenizer.pad_token_id,
                            bf16=args.bf16)
    responses, response_mask, contain_stop = truncate_after_stop_token(
        responses, stop_token_id, tokenizer.pad_token_id, args.min_response_length)
    return queries, responses, response_mask, contain_stop


def gather_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


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


if __name__ == "__main__":
    try:
        result = main(tyro.cli(Args))
    except KeyboardInterrupt:  # a Ctrl-C before training began (loading, setup): nothing to keep yet
        print("interrupted before training began")
        sys.exit(130)
    sys.exit(130 if result.get("interrupted") else 0)  # 130: the shell's status for a Ctrl-C
