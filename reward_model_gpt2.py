"""A reward model trained from pairwise preferences (Bradley-Terry): the first step of RLHF, every detail.

Each comparison is a prompt and two responses to it, `chosen` and `rejected`. The reward model reads prompt +
response (the text ppo_rlhf_gpt2.py's reward function reads) with an end token appended, and outputs one
number, the score (detail 36). It starts from the policy's weights with a new scalar head and learns to score
the chosen response above the rejected one. Without human labelers, `--gold` makes the comparisons: two
responses per prompt sampled from the policy, a gold scorer (vader sentiment, the length, or a classifier)
standing in for the human, who prefers a response with the Bradley-Terry probability below. The file is
written first, then trained on, so it can be read and reused; its gold scores give the gold labeler's own
agreement with the labels, the ceiling of a reward model's held-out accuracy (the labels are noisy).

Papers: Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences" (arXiv:1909.08593); Stiennon
et al. 2020, "Learning to Summarize from Human Feedback" (arXiv:2009.01325); Ouyang et al. 2022, InstructGPT
(arXiv:2203.02155); Huang et al. 2024, "The N+ Implementation Details of RLHF with PPO" (arXiv:2403.17031).

Usage:
    python reward_model_gpt2.py --model-name ./my-lm --gold vader --num-comparisons 2000 --save-model
    python reward_model_gpt2.py --model-name ./my-lm --preferences my_comparisons.jsonl --save-model
    python ppo_rlhf_gpt2.py --model-name ./my-lm --reward-model runs/<run>/model   # RLHF on it
    tensorboard --logdir runs   # losses/reward_loss, charts/accuracy, eval/accuracy, eval/gold_accuracy, ...

One comparison a line of --preferences (JSON): {"prompt": ..., "chosen": ..., "rejected": ...}; --gold adds
"gold_chosen" and "gold_rejected". What the code computes (r: the reward model, sigma: the sigmoid):
    gold labeler:  P(a preferred to b) = sigma((gold_a - gold_b) / gold_beta)
    scores         = r(prompt + response + end), the head on the mean final state of response and end
    reward_loss    = mean over pairs of -log sigma(chosen_scores - rejected_scores)
    accuracy       = share of pairs with chosen_scores > rejected_scores (ties count 1/2)
    normalization: gain = 1 / std(scores), bias = -mean(scores) * gain over all responses of the file
    normalized score = gain * scores + bias = logits[:, 0] + config.reward_bias (the gain is in the head)

Implementation details; numbers as in ppo_rlhf_gpt2.py, 35 on for the reward model's own:
 3. Adam with eps = 1e-5.   4. The learning rate decays linearly to 0.   11. Gradient-norm clipping.
23-29 in the --gold sampling, 25 and 28 (eval mode) in every pass: a pad token other than EOS, left padding,
    position ids from the mask, logits / temperature, pure sampling, no dropout, truncation at the stop token.
31. Reward normalization after training, to mean 0 and std 1 on the file's responses (--gold: the initial
    policy's samples): the gain folded into the head (exact: no bias), the shift saved as config.reward_bias.
35. The reward model is the policy's backbone plus a scalar head, initialized N(0, 1 / (hidden + 1)).
36. The score is read from the mean final state over the response's tokens (those whose characters end
    after the prompt's) and an end token, the EOS, appended to every text and found from the attention mask
    whatever the padding side (--readout mean; saved as config.reward_end_token and reward_readout for the
    loaders). --readout end reads the end token alone, --readout last the text's last token.
37. The Bradley-Terry loss, averaged over pairs; chosen and rejected responses in one forward pass.
38. Synthetic labels: a gold scorer with Bradley-Terry noise, the pairs of identical responses dropped.
39. A seeded held-out split by prompt (held-out prompts are never trained on), beside the gold labeler.
40. The whole model trained, one epoch by default (reward models overfit fast); a random head (--no-probe) at
    1e-3: at the backbone's learning rate, Adam would move its random weights by a fraction of their scale.
45. LP-FT (Kumar et al. 2022, arXiv:2202.10054): first the head alone, fit_probe on the frozen features (its
    L2 on w * std the best of --probe-l2 by cross-validation over folds of training prompts), then the whole
    model, the head at the backbone's rate (unless --head-learning-rate).
53. --bf16: the policy's and the reward model's passes in bfloat16 autocast; weights, scores, losses fp32.
"""

import importlib.util
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass

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
    seed: int = 1  # seed of python, numpy and torch (sampling, labels, split, shuffling)
    torch_deterministic: bool = True  # if toggled, `torch.backends.cudnn.deterministic=True`
    cuda: bool = True  # if toggled and a GPU is available, run on it
    bf16: bool = False  # bfloat16 autocast (detail 53), not the gold scorer; slow on CPUs without bf16
    num_threads: int = 1  # torch CPU threads
    runs_dir: str = "runs"  # TensorBoard logs, held-out scores and the model go to <runs_dir>/<run_name>/
    save_model: bool = False  # save the reward model and its tokenizer (save_pretrained) to <run dir>/model

    # data
    preferences: str | None = None  # a JSONL file of comparisons, {"prompt", "chosen", "rejected"} a line
    eval_fraction: float = 0.1  # share of the distinct prompts held out with all their comparisons (seeded)
    gold: str | None = None  # make <run dir>/preferences.jsonl: `vader`, `length` or a classifier folder
    gold_label: int = 1  # --gold FOLDER: the classifier's logit used as the gold score (one label: it)
    gold_beta: float = 0.1  # labeler noise: a vader difference of 0.1 is preferred 73% of the time, 0.3: 95%
    num_comparisons: int = 2000  # --gold: comparisons written (two responses sampled per prompt)
    prompts_file: str | None = None  # --gold: one prompt per line (default: ppo_rlhf_gpt2.py's prompts)
    preferences_only: bool = False  # --gold: write <run dir>/preferences.jsonl and stop (no reward model)

    # model and sampling (the sampling of ppo_rlhf_gpt2.py)
    model_name: str = "gpt2"  # the policy: samples the comparisons; its backbone starts the reward model
    max_query_length: int = 32  # prompts longer than this many tokens lose their first tokens when sampled
    response_length: int = 24  # number of tokens sampled for each response
    min_response_length: int = 16  # a stop token earlier than this many tokens does not end the response
    temperature: float = 0.7  # sampling temperature
    stop_token: str = "."  # `eos` or a single-token string: responses are truncated after it
    max_length: int = 128  # texts longer than this many tokens lose their first tokens (the end is scored)
    readout: str = "mean"  # `mean` over the response and an appended EOS; `end`: that EOS; `last`: last token

    # algorithm
    num_epochs: int = 1  # passes over the training comparisons
    batch_size: int = 32  # comparisons per optimizer step
    gradient_accumulation_steps: int = 1  # micro-batches per batch, their gradients accumulated
    forward_batch_size: int = 32  # prompts per sampling pass, texts per pass without gradients
    learning_rate: float = 2e-5  # the learning rate of Adam for the backbone
    head_learning_rate: float | None = None  # the head's rate; None: the backbone's after --probe, else 1e-3
    probe: bool = True  # fit the head on the frozen backbone's features, then train the whole model (LP-FT)
    probe_l2: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0, 10.0)  # the probe's L2 on w * std; several: by CV
    probe_folds: int = 5  # the cross-validation's folds of training prompts (with several --probe-l2)
    anneal_lr: bool = True  # anneal the learning rate linearly to 0
    max_grad_norm: float = 1.0  # the maximum norm of the global gradient
    eval_every: int = 10  # also evaluate every this many steps (0: before and after training only)
    normalize: bool = True  # fold mean 0, std 1 on the file's responses into the saved model

    # computed in check_args
    micro_batch_size: int = 0  # computed: batch_size // gradient_accumulation_steps


# ------------------------------------------------------------------------------------------------------------
# The gold labeler's comparisons (--gold); the generation is ppo_rlhf_gpt2.py's, copied below the plumbing.


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


def bradley_terry_labels(gold_a: torch.Tensor, gold_b: torch.Tensor, beta: float, generator: torch.Generator):
    """detail 38: True where the gold labeler prefers a, with probability sigma((gold_a - gold_b) / beta)."""
    return torch.rand(gold_a.shape, generator=generator) < torch.sigmoid((gold_a - gold_b) / beta)


def sample_comparisons(policy, prompts: list[str], tokenizer, stop_token_id: int, gold_fn, args: Args,
                       device: torch.device) -> list[dict]:
    """Two responses to each prompt, labeled by the gold scorer; identical or empty pairs are dropped."""
    rng, generator, comparisons = random.Random(args.seed), torch.Generator().manual_seed(args.seed), []
    while len(comparisons) < args.num_comparisons:
        batch = [prompts[rng.randrange(len(prompts))] for _ in range(args.forward_batch_size)]
        queries, responses, _, _ = sample_responses(policy, batch + batch, tokenizer, stop_token_id, args,
                                                    device)  # response a of each prompt, then response b
        # the prompt is the decoded query: prompt + response is the text ppo_rlhf_gpt2.py's reward reads
        texts = tokenizer.batch_decode(torch.cat([queries, responses], dim=1), skip_special_tokens=True)
        prompt_texts = tokenizer.batch_decode(queries, skip_special_tokens=True)
        response_texts = [t[len(p):] if t.startswith(p) else tokenizer.decode(r, skip_special_tokens=True)
                          for t, p, r in zip(texts, prompt_texts, responses)]
        gold = gold_fn([p + r for p, r in zip(prompt_texts, response_texts)], response_texts).float().cpu()
        n = len(batch)
        a_preferred = bradley_terry_labels(gold[:n], gold[n:], args.gold_beta, generator)
        for i in range(n):
            a, b = (i, n + i) if a_preferred[i] else (n + i, i)
            if response_texts[a] == response_texts[b] or not response_texts[a] or not response_texts[b]:
                continue  # detail 38: no preference between identical responses
            comparisons.append(dict(prompt=prompt_texts[i], chosen=response_texts[a],
                                    rejected=response_texts[b], gold_chosen=gold[a].item(),
                                    gold_rejected=gold[b].item()))
        print(f"sampled {min(len(comparisons), args.num_comparisons)}/{args.num_comparisons} comparisons")
    return comparisons[: args.num_comparisons]


# ------------------------------------------------------------------------------------------------------------
# The reward model and the math (each function is tested against an explicit reference).


def reward_scores(reward_model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  readout_mask: torch.Tensor | None = None) -> torch.Tensor:
    """detail 36: the scalar head on the mean final state over the positions readout_mask keeps (--readout
    mean: the response's tokens and the end token), or without one at the rightmost position the mask keeps
    (the end token where one was appended), so left and right padding give the same scores: (batch,)."""
    hidden = reward_model.base_model(**model_inputs(input_ids, attention_mask)).last_hidden_state.float()
    if readout_mask is not None:
        weights = readout_mask.to(hidden.dtype) / readout_mask.sum(1, keepdim=True)
        return reward_model.score((weights.unsqueeze(-1) * hidden).sum(1)).squeeze(-1)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    last_index = (positions * attention_mask.long()).argmax(1)
    return reward_model.score(hidden[torch.arange(len(hidden), device=hidden.device), last_index]).squeeze(-1)


def score_texts(reward_model, tokenizer, texts: list[str], end_token: str, max_length: int, device,
                response_starts: list[int] | None = None) -> torch.Tensor:
    """The scores of texts + end_token (detail 36; "" with --readout last), truncated from the left. Given the
    character where each response starts (--readout mean), the mean over the tokens that end after it: the
    response's tokens and the end token."""
    batch = tokenizer([text + end_token for text in texts], padding=True, truncation=True,
                      max_length=max_length, return_tensors="pt",
                      return_offsets_mapping=response_starts is not None)
    readout_mask = None if response_starts is None else (batch["attention_mask"].bool() & (
        batch["offset_mapping"][..., 1] > torch.tensor(response_starts)[:, None])).to(device)
    return reward_scores(reward_model, batch["input_ids"].to(device), batch["attention_mask"].to(device),
                         readout_mask)


def preference_loss(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> torch.Tensor:
    """detail 37: the Bradley-Terry negative log-likelihood, mean over pairs of -log sigma(r_c - r_r)."""
    return -F.logsigmoid(chosen_scores - rejected_scores).mean()


def comparison_accuracy(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> float:
    """Share of pairs scored in the labels' order; a tie counts 1/2 (a coin flip would get it half right)."""
    return ((chosen_scores > rejected_scores).float() + 0.5 * (chosen_scores == rejected_scores).float()
            ).mean().item()


def score_normalization(raw_scores: torch.Tensor) -> tuple[float, float]:
    """detail 31: (gain, bias) such that gain * raw_scores + bias has mean 0 and std 1 (constant: gain 1)."""
    std = raw_scores.std().item() if raw_scores.numel() > 1 else 0.0
    gain = 1.0 / std if std > 1e-6 else 1.0
    return gain, -raw_scores.mean().item() * gain


def fit_probe(chosen_features: torch.Tensor, rejected_features: torch.Tensor, l2: float,
              max_iter: int = 500) -> torch.Tensor:
    """detail 45: the head's weight w, (hidden,), on frozen features of the pairs, (pairs, hidden) each: the
    minimum of preference_loss(chosen_features @ w, rejected_features @ w) + l2 |w * std|^2, std the features'
    per-dimension std over all the responses. Fitted by L-BFGS on (x - mean) / std, where it converges at any
    scales (a few dimensions may be huge), folded back exactly: (w_std / std).x - const, const cancels."""
    features = torch.cat([chosen_features, rejected_features]).double()
    mean, std = features.mean(0), features.std(0).clamp_min(1e-12)
    chosen, rejected = ((f.double() - mean) / std for f in (chosen_features, rejected_features))
    w_std = torch.zeros_like(mean, requires_grad=True)
    optimizer = torch.optim.LBFGS([w_std], max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=0.0,
                                  line_search_fn="strong_wolfe")  # stops at a gradient of 1e-9 (or max_iter)

    def closure():
        optimizer.zero_grad()
        loss = preference_loss(chosen @ w_std, rejected @ w_std) + l2 * w_std.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    return w_std.detach() / std


# ------------------------------------------------------------------------------------------------------------
# Training


def main(args: Args) -> dict:
    # 1. setup
    check_args(args)
    comparisons = [] if args.gold else read_preferences(args.preferences, args)  # fails before loading
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
    run_dir = os.path.join(args.runs_dir, f"{args.exp_name}__{args.seed}__{int(time.time())}")
    tokenizer, stop_token_id = load_tokenizer(args.model_name, args.stop_token)
    check_end_token(tokenizer, args)
    check_max_length(args.model_name, tokenizer, texts_of(comparisons)[0], args)
    end_token = end_token_of(tokenizer, args)  # detail 36: appended to every text scored

    # 2. preferences: with --gold, sample and label them, and write the file before training on it
    preferences = args.preferences
    if args.gold:
        sampled = sample_comparisons(load_policy(args.model_name, device), load_gold_prompts(args), tokenizer,
                                     stop_token_id, load_gold_fn(args, device), args, device)  # freed after
        preferences = write_preferences(sampled, os.path.join(run_dir, "preferences.jsonl"))
        if args.preferences_only:
            return {"run_dir": run_dir, "preferences": preferences}
        comparisons = read_preferences(preferences, args)
    train_indices, eval_indices = split_comparisons([c["prompt"] for c in comparisons], args.eval_fraction,
                                                    args.seed)  # detail 39
    train_set, eval_set = [comparisons[i] for i in train_indices], [comparisons[i] for i in eval_indices]
    eval_prompts = list(dict.fromkeys(c["prompt"] for c in eval_set))  # never trained on
    has_gold = all("gold_chosen" in c and "gold_rejected" in c for c in eval_set)
    gold_accuracy = comparison_accuracy(*(torch.tensor([c[k] for c in eval_set], dtype=torch.float64)
                                          for k in ("gold_chosen", "gold_rejected"))) if has_gold else None

    # 3. the reward model: the policy's backbone and a scalar head (detail 35), Adam (detail 3), the head at
    # its own learning rate if it starts random (detail 40), at the backbone's if probed first (detail 45)
    reward_model = load_reward_model(args.model_name, device, args.bf16, args.seed)
    backbone = [p for name, p in reward_model.named_parameters() if not name.startswith("score.")]
    head_learning_rate = args.head_learning_rate or (args.learning_rate if args.probe else 1e-3)
    learning_rates = (args.learning_rate, head_learning_rate)
    optimizer = torch.optim.Adam([{"params": backbone, "lr": args.learning_rate},
                                  {"params": reward_model.score.parameters(), "lr": head_learning_rate}],
                                 eps=1e-5)
    writer = SummaryWriter(run_dir)
    writer.add_text("hyperparameters", markdown_table(list(vars(args).items()), ("param", "value")))
    num_steps = args.num_epochs * (len(train_set) // args.batch_size)
    step, interrupted, eval_stats = 0, False, {}

    def held_out_evaluation():
        eval_stats.update(evaluate_comparisons(reward_model, tokenizer, eval_set, args, device))
        for key in ("accuracy", "reward_loss"):
            writer.add_scalar(f"eval/{key}", eval_stats[key], step)
        if gold_accuracy is not None:  # detail 39: the ceiling, beside the held-out accuracy
            writer.add_scalar("eval/gold_accuracy", gold_accuracy, step)

    print(f"{len(train_set)} training and {len(eval_set)} held-out comparisons ({len(eval_prompts)} held-out "
          f"prompts), {num_steps} steps")
    try:
        if args.probe:  # detail 45: the head fitted on the frozen features of the training texts, once
            features = readout_features(reward_model, tokenizer, train_set, args, device)  # chosen, rejected
            probe_l2, cross_validated = cross_validated_l2(*features, [c["prompt"] for c in train_set],
                                                           args.probe_l2, args.probe_folds, args.seed)
            scores = ", ".join(f"{k:g}: {v:.3f}" for k, v in cross_validated.items())
            print(f"probe L2 {probe_l2:g}" + (f" (cross-validated accuracies {scores})" if scores else ""))
            writer.add_scalar("probe/l2", probe_l2, 0)
            with torch.no_grad():
                reward_model.score.weight.copy_(fit_probe(*features, probe_l2))
        held_out_evaluation()  # step 0: the probed head, or the random one
        print(f"step 0 held-out accuracy {eval_stats['accuracy']:.3f}" + (" (probed)" if args.probe else ""))
        for epoch in range(args.num_epochs):  # detail 40
            order = torch.randperm(len(train_set)).tolist()
            for start in range(0, len(train_set) - args.batch_size + 1, args.batch_size):
                step += 1
                if args.anneal_lr:  # detail 4
                    for group, learning_rate in zip(optimizer.param_groups, learning_rates):
                        group["lr"] = (1.0 - (step - 1.0) / num_steps) * learning_rate

                # 4. update: the Bradley-Terry loss of each micro-batch, gradients accumulated
                stats = {}
                for micro_start in range(start, start + args.batch_size, args.micro_batch_size):
                    batch = [train_set[i] for i in order[micro_start : micro_start + args.micro_batch_size]]
                    texts, starts = texts_of(batch)
                    scores = score_texts(reward_model, tokenizer, texts, end_token, args.max_length, device,
                                         starts if args.readout == "mean" else None)  # detail 37
                    chosen_scores, rejected_scores = scores[: len(batch)], scores[len(batch) :]
                    loss = preference_loss(chosen_scores, rejected_scores)
                    (loss / args.gradient_accumulation_steps).backward()
                    accuracy = comparison_accuracy(chosen_scores.detach(), rejected_scores.detach())
                    for key, value in [("losses/reward_loss", loss.item()), ("charts/accuracy", accuracy)]:
                        stats.setdefault(key, []).append(value)
                nn.utils.clip_grad_norm_(reward_model.parameters(), args.max_grad_norm)  # detail 11
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

                # 5. logging
                stats = {k: float(np.mean(v)) for k, v in stats.items()}
                stats["charts/learning_rate"] = optimizer.param_groups[0]["lr"]
                stats["charts/head_learning_rate"] = optimizer.param_groups[1]["lr"]
                for tag, value in stats.items():
                    writer.add_scalar(tag, value, step)
                if args.eval_every > 0 and step % args.eval_every == 0 and step < num_steps:
                    held_out_evaluation()
                print(f"epoch {epoch + 1} step {step}/{num_steps} loss {stats['losses/reward_loss']:.4f} "
                      f"accuracy {stats['charts/accuracy']:.3f}")
        held_out_evaluation()
    except KeyboardInterrupt:
        print(f"interrupted at step {step}: keeping the logs, skipping the final evaluation")
        interrupted, eval_stats = True, {}

    # 6. normalize / save
    result = {"run_dir": run_dir, "preferences": preferences, "steps": step, "interrupted": interrupted,
              "gold_accuracy": gold_accuracy,
              **{f"eval_{k}": v for k, v in eval_stats.items() if k != "margins"}}
    try:
        if not interrupted:
            print_held_out_summary(dict(eval_stats, gold_accuracy=gold_accuracy), args)
            result["held_out_scores"] = write_held_out_scores(eval_indices, eval_stats["margins"], run_dir)
        if args.save_model:
            gain, bias = 1.0, 0.0
            if args.normalize:  # detail 31: on the responses of the preference file
                raw_scores = score_in_chunks(reward_model, tokenizer, comparisons, args, device)
                gain, bias = score_normalization(raw_scores)
                with torch.no_grad():
                    reward_model.score.weight.mul_(gain)  # exact: the head is linear and has no bias
            result.update(model_path=os.path.join(run_dir, "model"), reward_gain=gain, reward_bias=bias)
            reward_model.config.interrupted_at = step if interrupted else None  # in config.json: a Ctrl-C's
            save_reward_model(reward_model, args.model_name, result["model_path"], bias, end_token,
                              args.readout)
            print(f"reward model saved to {result['model_path']} (gain {gain:.4g}, reward_bias {bias:.4g})")
    except KeyboardInterrupt:
        print("interrupted while normalizing or saving: keeping the logs; the model folder may be incomplete")
        result["interrupted"] = True
    finally:
        writer.close()
    return result


# ------------------------------------------------------------------------------------------------------------
# Plumbing, skippable on a first reading: the held-out split and evaluation, argument checks, the preference
# file, loading and saving; the probe's L2 by cross-validation.


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


def end_token_of(tokenizer, args: Args) -> str:
    """detail 36: what is appended to every text before it is scored: the EOS, or nothing (--readout last)."""
    return "" if args.readout == "last" else tokenizer.eos_token


@torch.inference_mode()
def score_in_chunks(reward_model, tokenizer, comparisons: list[dict], args: Args, device) -> torch.Tensor:
    """The scores of the comparisons' texts (texts_of), forward_batch_size at a time, without gradients."""
    chunk, end_token = args.forward_batch_size, end_token_of(tokenizer, args)
    texts, starts = texts_of(comparisons)
    mean = args.readout == "mean"  # only the mean readout needs where each response starts
    return torch.cat([score_texts(reward_model, tokenizer, texts[i : i + chunk], end_token, args.max_length,
                                  device, starts[i : i + chunk] if mean else None)
                      for i in range(0, len(texts), chunk)])


@torch.inference_mode()
def readout_features(reward_model, tokenizer, comparisons: list[dict], args: Args, device):
    """detail 45: (chosen, rejected) features, (len(comparisons), hidden) each: what the head reads of each
    text (detail 36), as score_in_chunks computes it with the head swapped for the identity; on the CPU, where
    the probe is fitted."""
    head, reward_model.score = reward_model.score, nn.Identity()
    try:
        features = score_in_chunks(reward_model, tokenizer, comparisons, args, device).cpu()
    finally:
        reward_model.score = head
    return features[: len(comparisons)], features[len(comparisons) :]


def evaluate_comparisons(reward_model, tokenizer, comparisons: list[dict], args: Args, device) -> dict:
    """Loss and accuracy on held-out comparisons, each one's margin chosen_scores - rejected_scores, and the
    number of their distinct prompts."""
    scores = score_in_chunks(reward_model, tokenizer, comparisons, args, device)
    chosen_scores, rejected_scores = scores[: len(comparisons)], scores[len(comparisons) :]
    return {"reward_loss": preference_loss(chosen_scores, rejected_scores).item(),
            "accuracy": comparison_accuracy(chosen_scores, rejected_scores),
            "margins": (chosen_scores - rejected_scores).tolist(),
            "prompts": len({c["prompt"] for c in comparisons})}


def cross_validated_l2(chosen_features: torch.Tensor, rejected_features: torch.Tensor, prompts: list[str],
                       l2s: tuple[float, ...], folds: int, seed: int) -> tuple[float, dict]:
    """detail 45: the L2 among l2s whose probes rank the most training pairs right, each fold scored by the
    probe fitted on the other folds, which hold whole prompts (their seeded keys dealt round-robin as in
    split_comparisons); and every L2's pooled accuracy. Ties: the first. One L2: it, unscored."""
    if len(l2s) == 1:
        return l2s[0], {}
    distinct = sorted(set(prompts), key=lambda p: (random.Random(f"{seed} fold {p}").random(), p))
    if len(distinct) < folds:  # fewer prompts than folds: one prompt a fold (leave one prompt out)
        print(f"--probe-folds {folds}: {len(distinct)} training prompts, so {len(distinct)} folds of one "
              "prompt each")
        folds = len(distinct)
    fold_of = {p: i % folds for i, p in enumerate(distinct)}
    fold = torch.tensor([fold_of[p] for p in prompts])
    differences, accuracies = chosen_features.double() - rejected_features.double(), {}
    for l2 in l2s:
        margins = torch.zeros(len(prompts), dtype=torch.float64)
        for k in range(folds):  # each pair's margin from the probe fitted without its fold
            margins[fold == k] = differences[fold == k] @ fit_probe(chosen_features[fold != k],
                                                                    rejected_features[fold != k], l2)
        accuracies[l2] = comparison_accuracy(margins, torch.zeros_like(margins))
    return max(l2s, key=accuracies.__getitem__), accuracies


def print_held_out_summary(eval_stats: dict, args: Args) -> None:
    """The final held-out accuracy, and the gold labeler's (eval_stats holds it as gold_accuracy)."""
    gold = eval_stats["gold_accuracy"]
    gold = f", the gold labeler's {gold:.3f}" if gold is not None else ""
    print(f"held-out accuracy {eval_stats['accuracy']:.3f} on {len(eval_stats['margins'])} comparisons of "
          f"{eval_stats['prompts']} prompts{gold}")


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
    require(("num_comparisons",), lambda v: v >= 1, "at least 1")
    require(("probe_folds",), lambda v: v >= 2, "at least 2")
    require(("gold_beta", "head_learning_rate"), lambda v: v is None or v > 0 and math.isfinite(v),
            "positive")
    require(("probe_l2",), lambda v: len(v) >= 1 and all(x >= 0 and math.isfinite(x) for x in v),
            "one or more numbers, each at least 0")
    require(("readout",), lambda v: v in ("mean", "end", "last"), "`mean`, `end` or `last`")
    if args.bf16 and args.cuda and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise SystemExit("error: --bf16: this GPU cannot compute in bfloat16 (torch.cuda.is_bf16_supported() "
                         "is False); run without --bf16")
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
    if args.gold is not None and args.preferences is not None:
        raise SystemExit(f"error: --preferences {args.preferences}: --gold writes its own comparisons to "
                         "<run dir>/preferences.jsonl; pass one or the other")
    if args.gold is None and args.preferences is None:
        raise SystemExit("error: --preferences: pass a JSONL file of comparisons, or --gold vader (or "
                         "length, or a classifier folder) to sample and label them")
    if args.preferences is not None and not os.path.isfile(args.preferences):
        raise SystemExit(f"error: --preferences {args.preferences}: no such file")
    if args.gold == "vader" and importlib.util.find_spec("vaderSentiment") is None:
        raise SystemExit("error: --gold vader needs the vaderSentiment package (pip install vaderSentiment)")
    if args.gold not in (None, "vader", "length") and not os.path.isdir(os.path.expanduser(args.gold)):
        raise SystemExit(f"error: --gold {args.gold}: not `vader`, `length` or a sequence-classifier folder")
    if args.gold is None and (args.prompts_file is not None or args.preferences_only):
        flag = "--prompts-file" if args.prompts_file is not None else "--preferences-only"
        raise SystemExit(f"error: {flag}: only --gold samples responses to prompts; add --gold")
    if args.prompts_file is not None and not os.path.isfile(args.prompts_file):
        raise SystemExit(f"error: --prompts-file {args.prompts_file}: no such file")
    if args.gold is not None:
        check_split(load_gold_prompts(args), args)


def check_split(prompts: list[str], args: Args) -> None:
    """Stop if the split by prompt leaves no training prompt, fewer than two to cross-validate the probe on
    (detail 45; fewer than --probe-folds make one fold each), or fewer training comparisons than a batch: the
    prompts are a file's (one per comparison), or --gold's, from which --num-comparisons are drawn (so about
    as many are expected)."""
    train, _ = split_comparisons(prompts, args.eval_fraction, args.seed)
    if not train:
        raise SystemExit(f"error: --eval-fraction {args.eval_fraction} holds out all {len(set(prompts))} "
                         f"distinct prompts: the split is by prompt; lower it or use more prompts")
    num_train_prompts = len({prompts[i] for i in train})
    if args.probe and len(args.probe_l2) > 1 and num_train_prompts < 2:
        raise SystemExit(f"error: --probe-l2: {len(args.probe_l2)} values cannot be cross-validated on "
                         f"{num_train_prompts} training prompt; pass one --probe-l2, or use more prompts")
    num_comparisons = args.num_comparisons if args.gold else len(prompts)
    num_train = round(len(train) * num_comparisons / len(prompts))
    about = "" if num_comparisons == len(prompts) else "about "
    if num_train < args.batch_size:
        raise SystemExit(f"error: --batch-size {args.batch_size} is larger than the {about}{num_train} "
                         f"training comparisons (after --eval-fraction {args.eval_fraction} of the prompts "
                         f"held out); lower it or add comparisons")


def check_end_token(tokenizer, args: Args) -> None:
    """--readout mean and end append the EOS to every text: it must exist and be read as one token; mean finds
    the response's tokens by their character offsets, which only fast tokenizers give."""
    if args.readout != "last" and (tokenizer.eos_token is None or tokenizer.encode(
            "x" + tokenizer.eos_token, add_special_tokens=False)[-1:] != [tokenizer.eos_token_id]):
        raise SystemExit(f"error: --readout {args.readout}: the tokenizer of {args.model_name} has no EOS "
                         f"token that text can end with; pass --readout last")
    if args.readout == "mean" and not tokenizer.is_fast:
        raise SystemExit(f"error: --readout mean: the tokenizer of {args.model_name} gives no character "
                         f"offsets (not a fast tokenizer); pass --readout end")


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


def write_preferences(comparisons: list[dict], path: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for comparison in comparisons:
            f.write(json.dumps(comparison) + "\n")
    print(f"{len(comparisons)} comparisons written to {path}")
    return path


def load_gold_prompts(args: Args) -> list[str]:
    if args.prompts_file is None:
        return list(PROMPTS)
    with open(args.prompts_file) as f:
        prompts = [line.strip() for line in f if line.strip()]
    if not prompts:
        raise SystemExit(f"error: --prompts-file {args.prompts_file} contains no prompts")
    return prompts


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


def load_reward_model(model_name: str, device: torch.device, bf16: bool = False, seed: int = 0) -> nn.Module:
    """detail 35: the policy's backbone with a new one-output head `score` (no bias in GPT-2's or Llama's)."""
    reward_model = from_pretrained(AutoModelForSequenceClassification, model_name, "--model-name",
                                   num_labels=1, dtype=torch.float32)
    if not isinstance(getattr(reward_model, "score", None), nn.Linear) or reward_model.score.bias is not None:
        raise SystemExit(f"error: --model-name {model_name}: {type(reward_model).__name__} has no bias-free "
                         "linear head `score` (GPT-2 and Llama models have one)")
    nn.init.normal_(reward_model.score.weight, std=1 / math.sqrt(reward_model.config.hidden_size + 1))
    autocast_bf16(bf16, device, reward_model.base_model, seed=seed)  # the backbone; the head reads fp32
    return reward_model.to(device).eval()  # detail 28: dropout off, also while training


def load_gold_fn(args: Args, device: torch.device):
    """The gold scorer standing in for the human labeler: texts (prompt + response) and responses in. A
    classifier folder saved by reward_model_gpt2.py is read as it was trained (its end token and readout)."""
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
    end_token = getattr(gold_model.config, "reward_end_token", None)  # read as it was trained
    mean = getattr(gold_model.config, "reward_readout", None) == "mean"

    @torch.inference_mode()
    def gold_fn(texts, responses):
        if end_token is None:
            inputs = gold_tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(device)
            return gold_model(**inputs).logits[:, label].float() + reward_bias
        starts = [len(t) - len(r) for t, r in zip(texts, responses)] if mean else None
        scores = score_texts(gold_model, gold_tokenizer, texts, end_token, args.max_length, device, starts)
        return scores.float() + reward_bias

    return gold_fn


def save_reward_model(reward_model: nn.Module, model_name: str, path: str, reward_bias: float,
                      end_token: str, readout: str) -> None:
    """save_pretrained with a tokenizer that pads on the right with an id the model can embed (EOS if none),
    the end token the loaders append and the readout (detail 36; with --readout last, plain transformers'
    readout is the score; the loaders find the end token from the attention mask: it may be the pad too)."""
    tokenizer = from_pretrained(AutoTokenizer, model_name, "--model-name", padding_side="right",
                                truncation_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    reward_model.config.pad_token_id = tokenizer.pad_token_id
    reward_model.config.reward_bias = reward_bias  # detail 31: normalized score = logits[:, 0] + reward_bias
    reward_model.config.reward_end_token = end_token or None  # detail 36: appended by the loaders (None: not)
    reward_model.config.reward_readout = readout  # detail 36: `mean` over the response and end token, or not
    reward_model.save_pretrained(path)
    tokenizer.save_pretrained(path)


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


def scale_logits(logits: torch.Tensor, temperature: float, pad_token_id: int) -> torch.Tensor:
    """detail 26: the policy is softmax(logits / temperature), in every forward pass."""
    logits = logits.float() / temperature  # fp32 from here on, also under --bf16
    if pad_token_id < logits.shape[-1]:
        # detail 23: a pad id inside the vocabulary is never a valid action (it would be read as padding)
        logits[..., pad_token_id] = torch.finfo(logits.dtype).min
    return logits


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


# ------------------------------------------------------------------------------------------------------------
# Data, skippable: ppo_rlhf_gpt2.py's training prompts, openings of movie reviews (a test keeps them equal).

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


if __name__ == "__main__":
    try:
        result = main(tyro.cli(Args))
    except KeyboardInterrupt:  # a Ctrl-C before training began (loading, setup): nothing to keep yet
        print("interrupted before training began")
        sys.exit(130)
    sys.exit(130 if result.get("interrupted") else 0)  # 130: the shell's status for a Ctrl-C
