"""The random streams of the language-model files: an evaluation leaves training's draws alone (a run evaluated
at every step trains exactly as one evaluated only at its start and end, or never), and DPO reads its training
comparisons shuffled, again in each epoch, not in the file's order (a `--gold` file writes a prompt's comparisons
together)."""

import importlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import test_dpo_gpt2


def run_args(script: str, tiny: dict, tmp_path, evaluated: bool):
    module = importlib.import_module(script)
    lm = dict(model_name=tiny["policy"], response_length=8, min_response_length=0, cuda=False,
              runs_dir=str(tmp_path / "runs"), save_model=True)
    if script in ("ppo_rlhf_gpt2", "grpo_gpt2"):
        # GRPO: the length reward, which varies within a group (the tiny reward model's scores may not)
        extra = (dict(norm_batches=1, reward_model=tiny["reward"]) if script == "ppo_rlhf_gpt2" else
                 dict(num_generations=4, reward_model="length", missing_eos_penalty=None))
        return module, module.Args(batch_size=8, num_minibatches=2, total_episodes=24,
                                   eval_episodes=4 if evaluated else 0, eval_every=1 if evaluated else 0,
                                   **extra, **lm)
    if script == "dpo_gpt2":
        return module, test_dpo_gpt2.tiny_args(tiny, tmp_path, save_model=True, num_epochs=2, gold="length",
                                               eval_every=1 if evaluated else 0, eval_episodes=4 if evaluated else 0)
    return module, module.Args(gold="length", num_comparisons=32, eval_fraction=0.25, batch_size=8,
                               forward_batch_size=16, eval_every=1 if evaluated else 0, **lm)


@pytest.mark.parametrize("script", ["ppo_rlhf_gpt2", "grpo_gpt2", "dpo_gpt2", "reward_model_gpt2"])
def test_evaluating_at_every_step_leaves_training_unchanged(script, tiny, tmp_path):
    weights = []
    for evaluated in (False, True):
        module, args = run_args(script, tiny, tmp_path / str(evaluated), evaluated)
        result = module.main(args)
        weights.append(load_file(Path(result["run_dir"]) / "model" / "model.safetensors"))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0]), script
    initial = load_file(Path(tiny["policy"]) / "model.safetensors")
    assert any(not torch.equal(weights[0][k], initial[k]) for k in initial if k in weights[0])  # it trained


def test_dpo_reads_its_comparisons_shuffled_and_again_each_epoch(tiny, tmp_path, monkeypatch):
    import dpo_gpt2 as dpo

    seen = []  # the training micro-batches' comparisons, in the order trained on
    real = dpo.response_logps

    def response_logps(model, tokenizer, comparisons, *args, **kwargs):
        if torch.is_grad_enabled():  # training, not the reference's or the evaluation's passes
            seen.extend((c["prompt"], c["chosen"]) for c in comparisons)
        return real(model, tokenizer, comparisons, *args, **kwargs)

    monkeypatch.setattr(dpo, "response_logps", response_logps)
    args = test_dpo_gpt2.tiny_args(tiny, tmp_path, num_epochs=2, batch_size=6, gradient_accumulation_steps=2)
    dpo.main(args)
    comparisons = [json.loads(line) for line in Path(args.preferences).read_text().splitlines()]
    train, _ = dpo.split_comparisons([c["prompt"] for c in comparisons], args.eval_fraction, args.seed)
    file_order = [(comparisons[i]["prompt"], comparisons[i]["chosen"]) for i in train]
    assert len(file_order) == 18 and len(seen) == 36  # 18 training comparisons, 3 steps of 6, 2 epochs
    first, second = seen[:18], seen[18:]
    assert sorted(first) == sorted(file_order) == sorted(second)  # each epoch reads every comparison once
    assert first != file_order and second != first
