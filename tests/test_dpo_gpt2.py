"""Tests of dpo_gpt2.py, offline, on the tiny GPT-2 (and Llama) of tests/conftest.py. Expected values are worked
out by hand or come from plain transformers, one text at a time without padding, never from the function under
test."""

import ast
import dataclasses
import json
import math
import os
import statistics
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from tyro._docstrings import get_field_docstring

from conftest import bf16_run, check_bf16_needs_a_gpu_that_has_it
import dpo_gpt2 as dpo
import ppo_rlhf_gpt2 as rlhf
import reward_model_gpt2 as rm

CPU = torch.device("cpu")
CHOSEN = [" great. I loved it.", " the best film of the year.", " a joy to watch."]
REJECTED = [" awful. A bad movie.", " terrible acting and a bad plot.", " boring."]


def comparisons_of(prompts, per_prompt=2, gold=True) -> list[dict]:
    """per_prompt comparisons for each prompt, a positive response chosen over a negative one."""
    rows = []
    for p in prompts:
        for k in range(per_prompt):
            row = {"prompt": p, "chosen": CHOSEN[k % 3], "rejected": REJECTED[k % 3]}
            if gold:
                row.update(gold_chosen=0.5 + 0.1 * k, gold_rejected=-0.5)
            rows.append(row)
    return rows


def write_lines(path, rows) -> str:
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def tiny_args(tiny, tmp_path, **overrides) -> dpo.Args:
    tmp_path.mkdir(parents=True, exist_ok=True)
    preferences = overrides.pop("preferences", None) or write_lines(tmp_path / "preferences.jsonl",
                                                                     comparisons_of(rlhf.PROMPTS[:12]))
    defaults = dict(model_name=tiny["policy"], preferences=preferences, runs_dir=str(tmp_path / "runs"),
                    cuda=False, eval_fraction=0.25, batch_size=4, gradient_accumulation_steps=2,
                    forward_batch_size=6, learning_rate=1e-3, eval_episodes=0, response_length=8,
                    min_response_length=0)
    defaults.update(overrides)
    return dpo.Args(**defaults)


def read_scalars(run_dir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


# ---------------------------------------------------------------------------------------------- the math


def test_sigmoid_loss_and_rewards_by_hand():
    # chosen_logratios = (-3 + 3.5, -5 + 4) = (0.5, -1), rejected_logratios = (-4 + 3, -2 + 3) = (-1, 1),
    # margins = (1.5, -2); beta 0.5: beta * margins = (0.75, -1)
    args = [torch.tensor(v) for v in ([-3.0, -5.0], [-4.0, -2.0], [-3.5, -4.0], [-3.0, -3.0])]
    loss, chosen_rewards, rejected_rewards = dpo.dpo_loss(*args, beta=0.5, loss_type="sigmoid")
    # -log sigma(x) = log(1 + exp(-x)): log(1 + e^-0.75) = 0.386871, log(1 + e^1) = 1.313262
    assert loss.item() == pytest.approx((0.386871 + 1.313262) / 2, abs=1e-5)
    assert chosen_rewards.tolist() == pytest.approx([0.25, -0.5])
    assert rejected_rewards.tolist() == pytest.approx([-0.5, 0.5])
    # conservative DPO, label smoothing 0.2: 0.8 (-log sigma(x)) + 0.2 (-log sigma(-x)) for each pair
    loss, _, _ = dpo.dpo_loss(*args, beta=0.5, loss_type="sigmoid", label_smoothing=0.2)
    by_hand = [0.8 * 0.386871 + 0.2 * 1.136871, 0.8 * 1.313262 + 0.2 * 0.313262]  # log(1+e^.75), log(1+e^-1)
    assert loss.item() == pytest.approx(sum(by_hand) / 2, abs=1e-5)
    # the gradient pushes the chosen log-prob up and the rejected one down
    chosen = args[0].clone().requires_grad_()
    rejected = args[1].clone().requires_grad_()
    dpo.dpo_loss(chosen, rejected, args[2], args[3], beta=0.5, loss_type="sigmoid")[0].backward()
    assert (chosen.grad < 0).all() and (rejected.grad > 0).all()


def test_ipo_loss_by_hand_on_per_token_means():
    args = [torch.tensor(v) for v in ([-3.0, -5.0], [-4.0, -2.0], [-3.5, -4.0], [-3.0, -3.0])]
    # logratios (0.5, -1) over 2 and 4 tokens: (0.25, -0.25); (-1, 1) over 5 and 1 tokens: (-0.2, 1);
    # margins (0.45, -1.25); beta 0.5: target 1 / (2 * 0.5) = 1; losses 0.55^2 = 0.3025, 2.25^2 = 5.0625
    loss, chosen_rewards, _ = dpo.dpo_loss(*args, beta=0.5, loss_type="ipo",
                                           chosen_lengths=torch.tensor([2, 4]),
                                           rejected_lengths=torch.tensor([5, 1]))
    assert loss.item() == pytest.approx((0.3025 + 5.0625) / 2)
    assert chosen_rewards.tolist() == pytest.approx([0.25, -0.5])  # the implicit reward: summed log-ratios
    # at the target margin the loss is 0, and past it positive again (IPO does not push margins to infinity)
    at_target = dpo.dpo_loss(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([0.0]),
                             beta=0.5, loss_type="ipo", chosen_lengths=torch.tensor([1]),
                             rejected_lengths=torch.tensor([1]))[0]
    assert at_target.item() == 0.0


def test_implicit_reward_accuracy_by_hand_ties_count_half():
    # chosen_logratios (0.5, -1, 0, 2), rejected_logratios (-1, 1, 0, 2): right, wrong, and two ties
    logps = [torch.tensor(v) for v in ([-3.0, -5.0, -2.0, -1.0], [-4.0, -2.0, -6.0, -1.0],
                                       [-3.5, -4.0, -2.0, -3.0], [-3.0, -3.0, -6.0, -3.0])]
    _, chosen_rewards, rejected_rewards = dpo.dpo_loss(*logps, beta=0.1, loss_type="sigmoid")
    assert dpo.comparison_correct(chosen_rewards, rejected_rewards).tolist() == [1.0, 0.0, 0.5, 0.5]
    correct = dpo.comparison_correct(torch.tensor([1.0, 0.0, 2.0, -1.0, 0.3]),
                                     torch.tensor([0.0, 0.0, 3.0, -1.0, 0.2]))
    assert correct.tolist() == [1.0, 0.5, 0.0, 0.5, 1.0]


def test_standard_error_over_prompts_by_hand():
    values = torch.tensor([1.0, 0.0, 1.0, 1.0])
    # mean 0.75; per-prompt sums of deviations: a: 0.25 - 0.75 = -0.5, b: 0.25, c: 0.25; squares sum 0.375;
    # sqrt(3 / 2 * 0.375) / 4 = 0.75 / 4
    assert dpo.prompt_stderr(values, ["a", "a", "b", "c"]) == pytest.approx(0.1875)
    # one comparison per prompt: the usual standard error of a mean
    values = [1.0, 0.0, 0.5, 1.0, 0.0]
    assert dpo.prompt_stderr(torch.tensor(values), list("abcde")) == pytest.approx(
        statistics.stdev(values) / math.sqrt(5))
    assert dpo.prompt_stderr(torch.tensor([1.0, 0.0]), ["a", "a"]) == 0.0  # one prompt: no spread to measure


def test_split_is_reward_model_gpt2_s():
    prompts = [p for p in rlhf.PROMPTS for _ in range(3)][:150]
    for fraction in (0.1, 0.25, 0.5):
        for seed in (1, 2, 7):
            assert dpo.split_comparisons(prompts, fraction, seed) == rm.split_comparisons(prompts, fraction, seed)
    train, held_out = dpo.split_comparisons(prompts, 0.25, 1)
    assert not {prompts[i] for i in train} & {prompts[i] for i in held_out}


# ---------------------------------------------------------------------------------------------- log-probs


def logps_by_hand(model, tokenizer, prompt: str, response: str, temperature: float, end: str = ""):
    """The text alone, without padding: the response's tokens are the full text's tokens after the longest
    prefix they share with the prompt's tokens; their log pi, summed. Returns (sum, number of tokens)."""
    full = tokenizer(prompt + response + end)["input_ids"]
    prompt_ids = tokenizer(prompt)["input_ids"]
    shared = 0
    while shared < min(len(full), len(prompt_ids)) and full[shared] == prompt_ids[shared]:
        shared += 1
    with torch.no_grad():
        logits = model(torch.tensor([full])).logits[0] / temperature
    logps = logits.log_softmax(-1)
    return sum(logps[i - 1, full[i]].item() for i in range(max(shared, 1), len(full))), len(full) - max(shared, 1)


@pytest.mark.parametrize("name", ["policy", "llama"])
@pytest.mark.parametrize("append_eos", [False, True])
def test_summed_logps_cover_exactly_the_response_tokens_whatever_the_padding(tiny, name, append_eos):
    tokenizer, _ = dpo.load_tokenizer(tiny[name], ".")
    model = dpo.load_policy(tiny[name], CPU)
    args = dpo.Args(temperature=0.7, append_eos=append_eos, max_length=128)
    comparisons = [
        {"prompt": "This movie was", "chosen": " great. I loved it.", "rejected": " bad."},
        # the boundary falls inside a word: "wa" + "s" is tokenized as "was", which is the response's
        {"prompt": "This movie wa", "chosen": "s great.", "rejected": "s awful, a bad movie and a bad plot."},
        {"prompt": "The acting in this one is", "chosen": "n't bad", "rejected": " the best of the year"},
    ]
    merged = tokenizer("This movie wa")["input_ids"]
    assert tokenizer("This movie was great.")["input_ids"][: len(merged)] != merged  # the case is exercised
    end = tokenizer.eos_token if append_eos else ""
    expected = [logps_by_hand(model, tokenizer, c["prompt"], c[key], 0.7, end)
                for key in ("chosen", "rejected") for c in comparisons]
    for side in ("left", "right"):
        tokenizer.padding_side = side
        chosen, rejected, chosen_lengths, rejected_lengths = dpo.response_logps(model, tokenizer, comparisons,
                                                                                args, CPU)
        assert torch.cat([chosen, rejected]).tolist() == pytest.approx([e[0] for e in expected], abs=1e-4)
        assert torch.cat([chosen_lengths, rejected_lengths]).tolist() == [e[1] for e in expected]
    # the appended EOS is one more scored token of every response
    no_eos = [logps_by_hand(model, tokenizer, c["prompt"], c[key], 0.7) for key in ("chosen", "rejected")
              for c in comparisons]
    assert [e[1] for e in expected] == [n[1] + append_eos for n in no_eos]


def test_logps_in_chunks_are_those_of_one_pass(tiny):
    tokenizer, _ = dpo.load_tokenizer(tiny["policy"], ".")
    model = dpo.load_policy(tiny["policy"], CPU)
    comparisons = comparisons_of(rlhf.PROMPTS[:5], per_prompt=1)
    whole = dpo.response_logps(model, tokenizer, comparisons, dpo.Args(), CPU)
    chunked = dpo.logps_in_chunks(model, tokenizer, comparisons, dpo.Args(forward_batch_size=4), CPU)
    assert chunked.shape == (4, 5)
    for row, value in zip(chunked, whole):
        assert row.tolist() == pytest.approx(value.float().tolist(), abs=1e-5)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_one_step_raises_the_chosen_log_ratio_against_the_rejected_one(tiny, loss_type):
    tokenizer, _ = dpo.load_tokenizer(tiny["policy"], ".")
    policy = dpo.load_policy(tiny["policy"], CPU)
    args = dpo.Args(loss_type=loss_type)
    batch = comparisons_of(rlhf.PROMPTS[:4], per_prompt=2)
    ref = dpo.logps_in_chunks(policy, tokenizer, batch, args, CPU)
    chosen, rejected, chosen_lengths, rejected_lengths = dpo.response_logps(policy, tokenizer, batch, args, CPU)
    loss, chosen_rewards, rejected_rewards = dpo.dpo_loss(chosen, rejected, ref[0], ref[1], 0.1, loss_type, 0.0,
                                                          chosen_lengths, rejected_lengths)
    assert (chosen_rewards - rejected_rewards).abs().max() < 1e-4  # the policy is the reference
    loss.backward()
    torch.optim.SGD(policy.parameters(), lr=0.05).step()
    after = dpo.logps_in_chunks(policy, tokenizer, batch, args, CPU)
    margins = (after[0] - ref[0]) - (after[1] - ref[1])
    assert margins.mean() > 0.01


# ---------------------------------------------------------------------------------------------- main


def test_bf16_runs_the_policy_in_bfloat16_with_first_margins_of_exactly_0(tiny, tmp_path, monkeypatch):
    """--bf16 (detail 53): the reference's log-probs are computed over the first epoch's micro-batches (the
    update's shapes), so at the first step, where the policy is the reference, the implicit rewards and margins
    are exactly 0 (every pair a tie), as at the step-0 evaluation; the policy (and the reference the sampled
    evaluation reloads) ran in bfloat16, the weights and Adam's state stayed fp32."""
    scalars, outputs, steps = bf16_run(dpo, tiny_args(tiny, tmp_path, bf16=True, eval_episodes=2), monkeypatch)
    assert outputs == {"policy": {torch.bfloat16}} and len(steps) == 4 and all(s == {torch.float32} for s in steps)
    for tag in ("rewards/chosen", "rewards/rejected", "rewards/margins", "eval/margins_mean"):
        assert scalars[tag][0] == 0.0 and scalars[tag][-1] != 0.0, tag
    assert scalars["rewards/accuracies"][0] == 0.5


def test_bf16_on_a_gpu_without_it_fails_before_any_work(tiny, tmp_path, monkeypatch):
    check_bf16_needs_a_gpu_that_has_it(dpo.main, tiny_args(tiny, tmp_path, bf16=True, cuda=True), tmp_path / "runs",
                                       monkeypatch)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])  # detail 53: --bf16 learns too
def test_main_logs_trl_s_names_and_scores_the_split_of_reward_model_gpt2(tiny, tmp_path, bf16):
    args = tiny_args(tiny, tmp_path, num_epochs=2, eval_every=2, eval_episodes=5, gold="length", bf16=bf16)
    result = dpo.main(args)
    scalars = read_scalars(result["run_dir"])
    num_steps = 2 * (18 // 4)  # 12 prompts, 3 held out: 18 training comparisons
    assert result["steps"] == num_steps
    for tag in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
                "logps/rejected", "losses/dpo_loss", "charts/learning_rate"):
        assert [s for s, _ in scalars[tag]] == list(range(1, num_steps + 1)), tag
    for (_, c), (_, r), (_, m) in zip(scalars["rewards/chosen"], scalars["rewards/rejected"],
                                      scalars["rewards/margins"]):
        assert m == pytest.approx(c - r, abs=1e-5)
    # detail 4: step s of 8 at (9 - s) / 8 of 1e-3, written out
    assert [v for _, v in scalars["charts/learning_rate"]] == pytest.approx(
        [1e-3, 8.75e-4, 7.5e-4, 6.25e-4, 5e-4, 3.75e-4, 2.5e-4, 1.25e-4])
    assert scalars["logps/chosen"][0][1] < 0 and scalars["logps/rejected"][0][1] < 0
    # held out: before training the policy is the reference: every margin 0 (ties: 1/2), the KL exactly 0
    assert [s for s, _ in scalars["eval/accuracy"]] == [0, 2, 4, 6, 8]
    assert scalars["eval/accuracy"][0][1] == 0.5 and scalars["eval/kl"][0][1] == 0.0
    assert scalars["eval/dpo_loss"][0][1] == pytest.approx(math.log(2))
    assert [s for s, _ in scalars["eval/gold_accuracy"]] == [0, 2, 4, 6, 8]
    assert {s for s, _ in scalars["eval/gold_scores"]} == {0, 2, 4, 6, 8}
    assert scalars["losses/dpo_loss"][-1][1] < scalars["losses/dpo_loss"][0][1]
    # the held-out comparisons are reward_model_gpt2.py's, and their margins give the accuracy
    comparisons = [json.loads(line) for line in Path(args.preferences).read_text().splitlines()]
    _, held_out = rm.split_comparisons([c["prompt"] for c in comparisons], 0.25, 1)
    scores = [json.loads(line) for line in Path(result["held_out_scores"]).read_text().splitlines()]
    assert [s["index"] for s in scores] == held_out
    margins = [s["margin"] for s in scores]
    assert result["eval_accuracy"] == pytest.approx(
        sum((m > 0) + 0.5 * (m == 0) for m in margins) / len(margins))
    assert result["eval_accuracy"] > 0.5
    # its standard error over the 3 held-out prompts (2 comparisons each), by hand
    correct = [(m > 0) + 0.5 * (m == 0) for m in margins]
    mean = sum(correct) / len(correct)
    sums = {}
    for i, c in zip(held_out, correct):
        sums[comparisons[i]["prompt"]] = sums.get(comparisons[i]["prompt"], 0.0) + c - mean
    assert len(sums) == 3
    assert result["eval_accuracy_stderr"] == pytest.approx(
        math.sqrt(3 / 2 * sum(v * v for v in sums.values())) / len(correct))
    assert result["gold_accuracy"] == 1.0
    assert math.isfinite(result["eval_kl_mean"]) and result["eval_kl_stderr"] >= 0
    assert result["eval_gold_scores_mean"] > 0  # length: every response has characters


def test_split_seed_keeps_one_split_while_the_seed_varies(tiny, tmp_path):
    args = tiny_args(tiny, tmp_path, seed=2, split_seed=1, batch_size=6, gradient_accumulation_steps=1)
    prompts = [json.loads(line)["prompt"] for line in Path(args.preferences).read_text().splitlines()]
    own, kept = rm.split_comparisons(prompts, 0.25, 2)[1], rm.split_comparisons(prompts, 0.25, 1)[1]
    assert own != kept  # seed 2 alone would hold out other prompts
    result = dpo.main(args)
    scores = [json.loads(line) for line in Path(result["held_out_scores"]).read_text().splitlines()]
    assert [s["index"] for s in scores] == kept


def test_the_reference_is_computed_once_and_training_does_not_change_it(tiny, tmp_path, monkeypatch):
    """The reference log-probs the loss receives at every step are those of the initial model, computed one
    text at a time by hand, also after the policy moved; and no second model is loaded (--eval-episodes 0)."""
    seen, real_response_logps, real_loss = [], dpo.response_logps, dpo.dpo_loss
    loads, real_load = [], dpo.load_policy

    def response_logps(model, tokenizer, comparisons, *a):
        if torch.is_grad_enabled():  # training: remember which comparisons the next loss is about
            seen.append({"comparisons": comparisons})
        return real_response_logps(model, tokenizer, comparisons, *a)

    def dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, *a):
        if torch.is_grad_enabled():
            seen[-1].update(ref=(ref_chosen_logps.tolist(), ref_rejected_logps.tolist()),
                            now=(chosen_logps.tolist(), rejected_logps.tolist()))
        return real_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, *a)

    monkeypatch.setattr(dpo, "response_logps", response_logps)
    monkeypatch.setattr(dpo, "dpo_loss", dpo_loss)
    monkeypatch.setattr(dpo, "load_policy", lambda *a: loads.append(a) or real_load(*a))
    dpo.main(tiny_args(tiny, tmp_path, num_epochs=2))
    assert len(loads) == 1 and len(seen) == 2 * 4 * 2  # 2 epochs of 4 steps of 2 micro-batches
    model = AutoModelForCausalLM.from_pretrained(tiny["policy"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny["policy"])
    for call in seen:
        for key, ref in zip(("chosen", "rejected"), call["ref"]):
            by_hand = [logps_by_hand(model, tokenizer, c["prompt"], c[key], 0.7)[0] for c in call["comparisons"]]
            assert ref == pytest.approx(by_hand, abs=1e-4)
    assert seen[-1]["now"][0] != pytest.approx(seen[-1]["ref"][0], abs=1e-3)  # the policy has moved


def test_held_out_margins_are_against_the_initial_model_whose_pass_is_the_step_0_evaluation(tiny, tmp_path,
                                                                                             monkeypatch):
    """The final held-out margins are beta * ((log pi - log pi_ref)(chosen) - (log pi - log pi_ref)(rejected)),
    pi the trained policy and pi_ref the initial model, one text at a time by hand; the held-out texts are read
    once per evaluation, the step-0 pass giving the reference's numbers."""
    passes, trained, real_chunks = [], [], dpo.logps_in_chunks
    monkeypatch.setattr(dpo, "logps_in_chunks", lambda model, tokenizer, comparisons, *a: passes.append(
        len(comparisons)) or real_chunks(model, tokenizer, comparisons, *a))
    monkeypatch.setattr(dpo, "save_policy", lambda policy, *a: trained.append(policy))
    args = tiny_args(tiny, tmp_path, save_model=True, eval_every=2, beta=0.3)
    result = dpo.main(args)
    assert passes == [18, 6, 6, 6]  # the 18 training comparisons, then the 6 held out at steps 0, 2 and 4
    comparisons = [json.loads(line) for line in Path(args.preferences).read_text().splitlines()]
    scores = [json.loads(line) for line in Path(result["held_out_scores"]).read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(tiny["policy"])
    initial = AutoModelForCausalLM.from_pretrained(tiny["policy"]).eval()
    for score in scores:
        c = comparisons[score["index"]]
        logratios = [logps_by_hand(trained[0], tokenizer, c["prompt"], c[key], args.temperature)[0]
                     - logps_by_hand(initial, tokenizer, c["prompt"], c[key], args.temperature)[0]
                     for key in ("chosen", "rejected")]
        assert score["margin"] == pytest.approx(0.3 * (logratios[0] - logratios[1]), abs=1e-4)
    assert max(abs(score["margin"]) for score in scores) > 1e-2  # the policy has moved


def test_accumulated_micro_batches_give_the_gradient_of_the_whole_batch(tiny, tmp_path, monkeypatch):
    first_grads, real_clip, run = {}, torch.nn.utils.clip_grad_norm_, None

    def clip(parameters, *a, **kw):  # called once a step, with the step's whole gradient
        parameters = list(parameters)
        first_grads.setdefault(run, [p.grad.clone() for p in parameters])
        return real_clip(parameters, *a, **kw)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    for run in (1, 4):  # the same first batch of 8 comparisons, in one pass or in four
        dpo.main(tiny_args(tiny, tmp_path / str(run), batch_size=8, gradient_accumulation_steps=run))
    for a, b in zip(first_grads[1], first_grads[4]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_kl_and_gold_of_the_held_out_samples_by_hand(tiny, monkeypatch):
    """evaluate_samples: the responses it samples (caught here) scored one at a time without padding: the
    gold (`length`) and the k1 KL summed over each response's real tokens (up to its stop token), both
    averaged per prompt, then over prompts."""
    tokenizer, stop_id = dpo.load_tokenizer(tiny["policy"], ".")
    policy = dpo.load_policy(tiny["policy"], CPU)
    reference = dpo.load_policy(tiny["llama"], CPU)  # another model, so that the KL is not 0
    args = dpo.Args(response_length=6, min_response_length=0, eval_episodes=5, forward_batch_size=4)
    caught, real_generate = [], dpo.generate

    def generate(model, queries, *a, **kw):
        responses, logprobs = real_generate(model, queries, *a, **kw)
        responses[0, 1] = stop_id  # one response that stops early
        caught.append((queries, responses))
        return responses, logprobs

    monkeypatch.setattr(dpo, "generate", generate)
    prompts = ["This movie was", "The acting in this one is"]
    gold_fn = lambda texts, responses: torch.tensor([len(r) / 6 for r in responses])  # noqa: E731
    result = dpo.evaluate_samples(policy, reference, prompts, tokenizer, stop_id, gold_fn, args, CPU)
    kls, golds = [], []
    for queries, responses in caught:
        for query, response in zip(queries.tolist(), responses.tolist()):
            query = [t for t in query if t != tokenizer.pad_token_id]
            end = response.index(stop_id) + 1 if stop_id in response else len(response)
            ids = torch.tensor([query + response[:end]])
            with torch.no_grad():
                logps = [(m(ids).logits[0] / 0.7).log_softmax(-1) for m in (policy, reference)]
            kls.append(sum(logps[0][i - 1, ids[0, i]] - logps[1][i - 1, ids[0, i]]
                           for i in range(len(query), ids.shape[1])).item())
            golds.append(len(tokenizer.decode(response[:end])) / 6)
    assert caught[0][1][0, 1] == stop_id and len(kls) == 5
    # prompts cycle: 0, 1, 0, 1, 0 -> prompt 0 has three responses, prompt 1 two; the mean of the two means
    for values, key in ((kls, "kl"), (golds, "gold_scores")):
        means = [statistics.mean(values[0::2]), statistics.mean(values[1::2])]
        assert result[f"{key}_mean"] == pytest.approx(statistics.mean(means), abs=1e-4)
        assert result[f"{key}_stderr"] == pytest.approx(statistics.stdev(means) / math.sqrt(2), abs=1e-4)
    same = dpo.evaluate_samples(policy, policy, prompts, tokenizer, stop_id, None, args, CPU)
    assert same["kl_mean"] == 0.0 and "gold_scores_mean" not in same


def test_saved_policy_loads_in_transformers_and_ppo_rlhf_gpt2_scores_it(tiny, tmp_path):
    result = dpo.main(tiny_args(tiny, tmp_path, save_model=True, temperature=0.9, response_length=6))
    path = result["model_path"]
    saved = AutoModelForCausalLM.from_pretrained(path)
    initial = AutoModelForCausalLM.from_pretrained(tiny["policy"])
    assert any(not torch.equal(p, q) for p, q in zip(saved.parameters(), initial.parameters()))
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id < saved.config.vocab_size
    sampling = json.loads(Path(path, "sampling.json").read_text())
    assert sampling == {"temperature": 0.9, "response_length": 6, "min_response_length": 0, "stop_token": ".",
                        "max_query_length": 32}
    eval_args = rlhf.Args(eval_checkpoint=path, reward_model="length", eval_episodes=4, cuda=False)
    final = rlhf.main(eval_args)["eval"]["final"]
    assert len(final["raw_scores"]) == 4 and math.isfinite(final["raw_score_mean"])
    assert (eval_args.temperature, eval_args.response_length) == (0.9, 6)  # sampled as the policy was trained


# ---------------------------------------------------------------------------------------------- bad input


BAD_FILES = {
    "empty_line": ('{"prompt": "a", "chosen": " b", "rejected": " c"}\n\n', "line 2 is empty"),
    "not_json": ('{"prompt": "a", "chosen": " b", "rejected": " c"}\n{"prompt": "a",\n', "line 2 is not JSON"),
    "missing": ('{"prompt": "a", "chosen": " b"}\n', "line 1 lacks the text field\\(s\\) rejected"),
    "same": ('{"prompt": "a", "chosen": " b", "rejected": " b"}\n', "line 1: chosen and rejected are the same"),
    "no_lines": ("", "contains no comparisons"),
    "too_few": ("".join(f'{{"prompt": "{p}", "chosen": " b", "rejected": " c"}}\n' for p in "abcd"),
                "--batch-size 4 is larger than the 3 training comparisons"),  # 1 of 4 prompts held out
    "latin1": ('{"prompt": "a", "chosen": " b", "rejected": " c"}\n{"prompt": "caf\xe9", "chosen": " b", '
               '"rejected": " c"}\n', "line 2 is not UTF-8 text"),
}


@pytest.mark.parametrize("overrides, message", [
    (dict(beta=0.0), "--beta must be positive"),
    (dict(beta=-0.1), "--beta must be positive"),
    (dict(label_smoothing=0.5), "--label-smoothing must be in \\[0, 0.5\\)"),
    (dict(label_smoothing=-0.1), "--label-smoothing must be in \\[0, 0.5\\)"),
    (dict(loss_type="ipo", label_smoothing=0.1), "--label-smoothing 0.1: it applies to --loss-type sigmoid"),
    (dict(loss_type="hinge"), "--loss-type must be `sigmoid` or `ipo`"),
    (dict(batch_size=20, gradient_accumulation_steps=1), "--batch-size 20 is larger than the 18 training"),
    (dict(batch_size=4, gradient_accumulation_steps=3), "--batch-size 4 is not divisible by"),
    (dict(model_name="./no/such/model"), "--model-name ./no/such/model: no such directory"),
    (dict(preferences="/no/such/file.jsonl"), "--preferences /no/such/file.jsonl: no such file"),
    (dict(learning_rate=float("nan")), "--learning-rate"),
    (dict(gold="sentiment"), "--gold sentiment: not `vader`, `length`"),
    (dict(eval_fraction=1.0), "--eval-fraction"),
    *[(dict(preferences=name), message) for name, (_, message) in BAD_FILES.items()],
])
def test_bad_input_fails_in_one_line_before_any_model_loads(tiny, tmp_path, fails_before_loading, overrides,
                                                            message):
    fails_before_loading(dpo, lambda **kw: dpo.main(tiny_args(tiny, tmp_path, **kw)), BAD_FILES, overrides, message)


def test_the_batch_check_reads_the_split_main_makes(tiny, tmp_path):
    """--split-seed, not --seed, makes the split main trains on; the check must read the same one. Prompt a has
    ten comparisons, b, c and d one each; a quarter of the prompts (one) is held out: with seed 1 that is a prompt
    with one comparison (12 train), with split seed 3 it is a (3 train): a batch of 8 must be refused."""
    path = tmp_path / "skewed.jsonl"
    path.write_text("".join(f'{{"prompt": "{p}", "chosen": " b{i}", "rejected": " c{i}"}}\n'
                            for p, n in (("a", 10), ("b", 1), ("c", 1), ("d", 1)) for i in range(n)))
    prompts = [json.loads(line)["prompt"] for line in path.read_text().splitlines()]
    assert len(dpo.split_comparisons(prompts, 0.25, 1)[0]) == 12
    assert len(dpo.split_comparisons(prompts, 0.25, 3)[0]) == 3
    args = tiny_args(tiny, tmp_path, preferences=str(path), eval_fraction=0.25, seed=1, batch_size=8,
                     gradient_accumulation_steps=1)
    dpo.read_preferences(args.preferences, args)  # the split of seed 1: 12 training comparisons
    args.split_seed = 3
    with pytest.raises(SystemExit, match="^error: --batch-size 8 is larger than the 3 training comparisons"):
        dpo.read_preferences(args.preferences, args)


def test_max_length_is_cut_to_the_model_s_positions_and_cut_texts_are_counted(tiny, tmp_path, capsys):
    args = tiny_args(tiny, tmp_path, max_length=129)
    tokenizer, _ = dpo.load_tokenizer(args.model_name, args.stop_token)
    dpo.check_max_length(args.model_name, tokenizer, ["a short text"], args)
    assert args.max_length == 128 and capsys.readouterr().out == (
        f"--max-length 129 is more than the 128 positions of --model-name {args.model_name}: texts are cut to "
        "128 tokens\n")
    args = tiny_args(tiny, tmp_path, max_length=6)
    tokenizer, _ = dpo.load_tokenizer(args.model_name, args.stop_token)
    texts = ["This movie was great.", "ok", "This movie was a long, long, long film."]
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    dpo.check_max_length(args.model_name, tokenizer, texts, args)
    cut = sum(n > 6 for n in lengths)
    assert 0 < cut < 3 and capsys.readouterr().out == (
        f"{cut} of 3 texts are longer than --max-length 6 tokens: they lose their first tokens\n")


def test_no_preference_file_and_unloadable_models_name_the_flag(tiny, tmp_path):
    args = tiny_args(tiny, tmp_path)
    args.preferences = None
    with pytest.raises(SystemExit, match="^error: --preferences: pass a JSONL file"):
        dpo.main(args)
    with pytest.raises(SystemExit, match="--model-name 'no-such-org/no-such-model'.*local directory"):
        dpo.main(tiny_args(tiny, tmp_path, model_name="no-such-org/no-such-model"))


# ---------------------------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_closes_the_logs_and_keeps_the_saved_policy(tiny, tmp_path, monkeypatch):
    real_loss, calls = dpo.dpo_loss, 0

    def dpo_loss(*a, **kw):
        nonlocal calls
        calls += 1
        if calls == 4:  # 1: the step-0 evaluation, 2-3: step 1's micro-batches, 4: step 2's first
            raise KeyboardInterrupt
        return real_loss(*a, **kw)

    monkeypatch.setattr(dpo, "dpo_loss", dpo_loss)
    try:
        result = dpo.main(tiny_args(tiny, tmp_path, save_model=True))
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C during training escaped main() instead of ending the run cleanly")
    assert result["steps"] == 2 and "eval_accuracy" not in result
    scalars = read_scalars(result["run_dir"])
    assert [s for s, _ in scalars["losses/dpo_loss"]] == [1]  # the closed file holds step 1
    assert [s for s, _ in scalars["eval/accuracy"]] == [0]
    AutoModelForCausalLM.from_pretrained(result["model_path"])


# ---------------------------------------------------------------------------------------------- reading


def test_house_style():
    source = Path(dpo.__file__).read_text()
    lines = source.splitlines()
    assert max(len(line) for line in lines) <= 110
    assert len(ast.get_docstring(ast.parse(source), clean=False).splitlines()) <= 60
    plumbing = [i for i, line in enumerate(lines) if line.startswith("# Plumbing")]
    assert len(plumbing) == 1 and lines.index("def main(args: Args) -> dict:") < plumbing[0] <= 400
    missing = [f.name for f in dataclasses.fields(dpo.Args) if not get_field_docstring(dpo.Args, f.name, ())]
    assert not missing
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(source))
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
    project = {p[:-3] for p in os.listdir(Path(dpo.__file__).parent) if p.endswith(".py")}
    assert not imported & project  # it shares no code with the other files


def test_held_out_samples_are_the_trained_policy_s_on_held_out_prompts_against_the_initial_one(tiny, tmp_path,
                                                                                                   monkeypatch):
    """What the sampled evaluation reads, by hand: at the end, the responses come from the trained policy (its
    weights those the run saved), to the held-out prompts only; eval/kl is the mean over prompts of the sum over
    each response's real tokens of log pi_trained - log pi_initial (plain forward passes of the saved and the
    initial model on the unpadded ids), eval/gold_scores the length gold of the same responses."""
    passes = []  # one dict a sampling pass: the model, the queries, the truncated responses and their mask
    real_generate, real_truncate = dpo.generate, dpo.truncate_after_stop_token

    def generate(policy, queries, *args, **kwargs):
        passes.append({"policy": policy, "queries": queries.clone(),
                       "weights": [p.detach().clone() for p in policy.parameters()]})
        return real_generate(policy, queries, *args, **kwargs)

    def truncate(responses, *args, **kwargs):
        out = real_truncate(responses, *args, **kwargs)
        passes[-1].update(responses=out[0].clone(), mask=out[1].clone())
        return out

    monkeypatch.setattr(dpo, "generate", generate)
    monkeypatch.setattr(dpo, "truncate_after_stop_token", truncate)
    args = tiny_args(tiny, tmp_path, eval_episodes=8, forward_batch_size=4, gold="length", save_model=True,
                     learning_rate=1e-2, temperature=0.9)
    result = dpo.main(args)
    assert len(passes) == 4  # 8 responses, 4 a pass: two at step 0, two at the end
    final = passes[2:]
    trained = AutoModelForCausalLM.from_pretrained(result["model_path"]).eval()
    initial = AutoModelForCausalLM.from_pretrained(tiny["policy"]).eval()
    for p in final:  # sampled by the trained policy, not the reference
        assert all(torch.equal(a, b) for a, b in zip(p["weights"], trained.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(final[0]["weights"], initial.parameters()))
    tokenizer, _ = dpo.load_tokenizer(args.model_name, args.stop_token)
    comparisons = [json.loads(line) for line in Path(args.preferences).read_text().splitlines()]
    train, held = dpo.split_comparisons([c["prompt"] for c in comparisons], args.eval_fraction, args.seed)
    held_prompts = list(dict.fromkeys(comparisons[i]["prompt"] for i in held))
    train_prompts = {comparisons[i]["prompt"] for i in train}
    kls, golds, prompts = [], [], []
    for p in final:
        for query, response, mask in zip(p["queries"], p["responses"], p["mask"]):
            prompt = tokenizer.decode(query[query != tokenizer.pad_token_id])
            assert prompt in held_prompts and prompt not in train_prompts
            ids = torch.cat([query[query != tokenizer.pad_token_id], response[mask]])[None]
            start = int((query != tokenizer.pad_token_id).sum())
            total = 0.0
            for model, sign in ((trained, 1.0), (initial, -1.0)):
                with torch.no_grad():
                    logp = torch.log_softmax(model(ids).logits[0, :-1].double() / args.temperature, dim=-1)
                total += sign * float(logp[torch.arange(start - 1, ids.shape[1] - 1), ids[0, start:]].sum())
            kls.append(total)
            golds.append(len(tokenizer.decode(response[mask], skip_special_tokens=True)) / args.response_length)
            prompts.append(prompt)
    assert sorted(set(prompts)) == sorted(held_prompts)  # every held-out prompt, cycled
    by_prompt = lambda values: statistics.mean(statistics.mean(v for v, q in zip(values, prompts) if q == p)
                                               for p in held_prompts)
    scalars = read_scalars(result["run_dir"])
    assert abs(by_prompt(kls)) > 0.01  # a policy that moved
    assert scalars["eval/kl"][-1][1] == pytest.approx(by_prompt(kls), rel=1e-4, abs=1e-5)
    assert scalars["eval/gold_scores"][-1][1] == pytest.approx(by_prompt(golds), rel=1e-5)


def test_with_bf16_each_epoch_after_the_first_draws_a_new_order(tiny, tmp_path, monkeypatch):
    """--bf16 draws the first epoch's order before the reference's pass (detail 53); every later epoch draws its
    own: three epochs of 16 of the 18 training comparisons, no two in one order (the fp32 path:
    tests/test_random_streams.py)."""
    seen, real = [], dpo.response_logps

    def response_logps(model, tokenizer, comparisons, *a):
        if torch.is_grad_enabled():
            seen.append([(c["prompt"], c["chosen"]) for c in comparisons])
        return real(model, tokenizer, comparisons, *a)

    monkeypatch.setattr(dpo, "response_logps", response_logps)
    dpo.main(tiny_args(tiny, tmp_path, num_epochs=3, bf16=True))
    epochs = [sum(seen[8 * i : 8 * (i + 1)], []) for i in range(3)]  # 4 steps x 2 micro-batches an epoch
    assert len(seen) == 24 and all(len(set(e)) == len(e) == 16 for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]


def test_the_gold_labeler_s_ceiling_is_over_the_held_out_comparisons_only(tiny, tmp_path):
    """Gold that disagrees with the labels on some prompts: the ceiling is the held-out comparisons' share where
    the gold agrees (by hand from the split), not the whole file's."""
    rows = comparisons_of(rlhf.PROMPTS[:12])
    for i, row in enumerate(rows):
        if i % 4 == 0:  # the gold prefers the rejected response on every second prompt's first comparison
            row["gold_chosen"], row["gold_rejected"] = -1.0, 1.0
    args = tiny_args(tiny, tmp_path, preferences=write_lines(tmp_path / "prefs.jsonl", rows), num_epochs=1)
    result = dpo.main(args)
    split_seed = args.seed if args.split_seed is None else args.split_seed
    _, held_out = dpo.split_comparisons([r["prompt"] for r in rows], args.eval_fraction, split_seed)
    expected = sum(rows[i]["gold_chosen"] > rows[i]["gold_rejected"] for i in held_out) / len(held_out)
    whole = sum(r["gold_chosen"] > r["gold_rejected"] for r in rows) / len(rows)
    assert result["gold_accuracy"] == pytest.approx(expected) and expected != pytest.approx(whole)
