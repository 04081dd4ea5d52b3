"""The `--cuda` path of every script, run on a GPU. CI has none, so there these tests are skipped; on a machine
with a CUDA GPU, `python -m pytest tests/test_cuda.py` runs them (docs/testing.md says when they last ran)."""

import os

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import a2c
import dpo_gpt2 as dpo
import grpo_gpt2 as grpo
import ppo_cartpole
import ppo_rlhf_gpt2 as rlhf
import ppo_walker2d
import reinforce
import reward_model_gpt2 as rm
from test_dpo_gpt2 import comparisons_of, write_lines
from test_dpo_gpt2 import read_scalars as dpo_read_scalars
from test_dpo_gpt2 import tiny_args as dpo_tiny_args
from test_grpo_gpt2 import tiny_args as grpo_tiny_args
from test_ppo_rlhf_gpt2 import tiny_args

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SHORT_RUNS = {
    ppo_cartpole: dict(total_timesteps=3000),
    reinforce: dict(total_timesteps=3000),
    a2c: dict(total_timesteps=3000),
    ppo_walker2d: dict(total_timesteps=4096, num_envs=4, num_steps=256, num_minibatches=16, update_epochs=2),
}


def on_the_gpu(run):
    """`run()`, checking that it put tensors on the GPU (and so did not fall back to the CPU)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    result = run()
    assert torch.cuda.max_memory_allocated() > 0
    return result


@pytest.mark.parametrize("module", SHORT_RUNS, ids=lambda m: m.__name__)
def test_trains_on_the_gpu_and_its_checkpoint_evaluates_the_same_on_either_device(module, tmp_path):
    args = module.Args(runs_dir=str(tmp_path), eval_episodes=3, save_model=True, cuda=True, **SHORT_RUNS[module])
    result = on_the_gpu(lambda: module.main(args))
    assert len(result["episodic_returns"]) > 0 and len(result["eval_returns"]) == 3
    checkpoint = os.path.join(result["run_dir"], "agent.pt")
    for cuda in (True, False):  # a GPU-trained agent must load and act the same on a CPU-only machine
        evaluated = module.main(module.Args(eval_checkpoint=checkpoint, eval_episodes=3, cuda=cuda))
        np.testing.assert_allclose(evaluated["eval_returns"], result["eval_returns"], rtol=1e-3)


@pytest.mark.parametrize("module", SHORT_RUNS, ids=lambda m: m.__name__)
def test_a_seed_gives_the_same_run_twice_on_the_gpu(module, tmp_path):
    a, b = (module.main(module.Args(runs_dir=str(tmp_path / name), eval_episodes=0, cuda=True, **SHORT_RUNS[module]))
            for name in ("a", "b"))
    assert a["episodic_returns"] == b["episodic_returns"]


@pytest.mark.parametrize("reward", ["model", "vader"])
def test_rlhf_trains_on_the_gpu_and_its_saved_policy_loads_on_the_cpu(tiny, tmp_path, reward):
    overrides = dict(reward_model="vader") if reward == "vader" else {}
    result = on_the_gpu(lambda: rlhf.main(tiny_args(tiny, tmp_path, cuda=True, save_model=True, **overrides)))
    for tag in ("objective/scores", "objective/kl", "losses/policy_loss", "losses/value_loss"):
        assert np.isfinite(result[tag]), tag
    saved = AutoModelForCausalLM.from_pretrained(os.path.join(result["run_dir"], "model"))
    initial = AutoModelForCausalLM.from_pretrained(tiny["policy"])
    assert next(saved.parameters()).device.type == "cpu"
    changed = [not torch.equal(p, q) for p, q in zip(saved.parameters(), initial.parameters())]
    assert any(changed)  # the saved policy is the trained one


@pytest.mark.parametrize("overrides", [dict(beta=0.04), dict(beta=0.0),
                                       dict(beta=0.04, advantage="rloo", use_bias_correction_kl=True, update_epochs=2,
                                            num_minibatches=2)],
                         ids=["beta0.04", "beta0", "rloo-corrected-k3"])
def test_grpo_trains_on_the_gpu_and_its_saved_policy_loads_on_the_cpu(tiny, tmp_path, overrides):
    """The "length" reward (characters of the response; no stop token is required, and the tiny model's tokens
    have different lengths): it varies within groups, so the advantages are not all 0 and the policy moves.
    (vader scores every response of the tiny random model alike: every advantage 0, and at the reference the
    k3 term has gradient 0 too, so nothing could move.)"""
    result = on_the_gpu(lambda: grpo.main(grpo_tiny_args(tiny, tmp_path, cuda=True, save_model=True,
                                                         reward_model="length", missing_eos_penalty=None,
                                                         **overrides)))
    for tag in ("objective/scores", "losses/policy_loss", "losses/approx_kl"):
        assert np.isfinite(result[tag]), tag
    assert ("objective/kl" in result) == (overrides["beta"] > 0)
    assert result["val/zero_advantage_groups"] < 1  # some group had a signal
    saved = AutoModelForCausalLM.from_pretrained(os.path.join(result["run_dir"], "model"))
    initial = AutoModelForCausalLM.from_pretrained(tiny["policy"])
    assert next(saved.parameters()).device.type == "cpu"
    assert any(not torch.equal(p, q) for p, q in zip(saved.parameters(), initial.parameters()))


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_trains_on_the_gpu_and_its_saved_policy_loads_on_the_cpu(tiny, tmp_path, loss_type):
    args = dpo_tiny_args(tiny, tmp_path, cuda=True, save_model=True, loss_type=loss_type, eval_episodes=6,
                         gold="vader")
    result = on_the_gpu(lambda: dpo.main(args))
    scalars = dpo_read_scalars(result["run_dir"])
    # before the first step the policy is the reference, on the GPU too: every margin 0, the KL exactly 0
    assert scalars["eval/accuracy"][0][1] == 0.5 and scalars["eval/kl"][0][1] == 0.0
    for key in ("eval_accuracy", "eval_accuracy_stderr", "eval_kl_mean", "eval_gold_scores_mean"):
        assert np.isfinite(result[key]), key
    assert result["eval_margins_mean"] > 0  # the held-out chosen responses gained on the rejected ones
    saved = AutoModelForCausalLM.from_pretrained(result["model_path"])
    initial = AutoModelForCausalLM.from_pretrained(tiny["policy"])
    assert next(saved.parameters()).device.type == "cpu"
    assert any(not torch.equal(p, q) for p, q in zip(saved.parameters(), initial.parameters()))
    # the reference's log-probs on the GPU are the CPU's, and the saved policy is scored on either device
    tokenizer, _ = dpo.load_tokenizer(tiny["policy"], ".")
    comparisons = comparisons_of(rlhf.PROMPTS[:3])
    on = {device: dpo.logps_in_chunks(dpo.load_policy(tiny["policy"], torch.device(device)), tokenizer,
                                      comparisons, args, torch.device(device)).cpu() for device in ("cpu", "cuda")}
    torch.testing.assert_close(on["cuda"], on["cpu"], atol=1e-4, rtol=1e-4)
    for cuda in (True, False):
        evaluated = rlhf.main(rlhf.Args(eval_checkpoint=result["model_path"], reward_model="vader",
                                        eval_episodes=4, cuda=cuda))
        assert np.isfinite(evaluated["eval"]["final"]["raw_score_mean"])


@pytest.mark.parametrize("module", [rlhf, grpo, dpo], ids=lambda m: m.__name__)
def test_bf16_s_first_step_is_exact_on_the_gpu(tiny, tmp_path, module):
    """--bf16 (detail 53) on the GPU, where cuBLAS may compute a row differently in a matrix of another shape: the
    old log-probs and the reference's, from passes of the update's micro-batch shape, give a first ratio of exactly
    1 and a KL of exactly 0 (DPO: the first step's margins exactly 0), one minibatch of 4 micro-batches."""
    if module is dpo:
        scalars = dpo_read_scalars(on_the_gpu(lambda: dpo.main(dpo_tiny_args(tiny, tmp_path, cuda=True, bf16=True)))
                                   ["run_dir"])
        assert all(scalars[tag][0][1] == 0.0 for tag in ("rewards/chosen", "rewards/rejected", "rewards/margins"))
        return
    make_args = tiny_args if module is rlhf else grpo_tiny_args
    args = make_args(tiny, tmp_path, cuda=True, bf16=True, num_minibatches=1, gradient_accumulation_steps=4,
                     update_epochs=1, total_episodes=8, response_length=16)
    result = on_the_gpu(lambda: module.main(args))
    assert result["val/ratio"] == 1.0 and result["objective/kl"] == 0.0
    assert result["losses/approx_kl"] == result["losses/old_approx_kl"] == result["losses/clipfrac"] == 0.0


def test_reward_model_probes_and_trains_on_the_gpu_as_on_the_cpu_and_loads_on_the_cpu(tiny, tmp_path):
    """The default run: the head fitted on the frozen features with a cross-validated L2 (detail 45), then the whole
    model trained. The same comparisons on either device: the same L2 chosen and, at step 0, the same held-out loss
    of the probed head; the GPU-trained model saved, loaded on the CPU and scoring there as it did on the GPU."""
    comparisons = comparisons_of(rlhf.PROMPTS[:12], per_prompt=3)
    preferences = write_lines(tmp_path / "prefs.jsonl", comparisons)
    runs = {}
    for cuda in (True, False):
        args = rm.Args(model_name=tiny["policy"], preferences=preferences, eval_fraction=0.25, batch_size=8,
                       forward_batch_size=16, learning_rate=1e-3, runs_dir=str(tmp_path / f"cuda_{cuda}"),
                       cuda=cuda, save_model=cuda)
        runs[cuda] = on_the_gpu(lambda: rm.main(args)) if cuda else rm.main(args)
    on = {cuda: dpo_read_scalars(runs[cuda]["run_dir"]) for cuda in runs}
    assert on[True]["probe/l2"] == on[False]["probe/l2"]
    np.testing.assert_allclose(on[True]["eval/reward_loss"][0][1], on[False]["eval/reward_loss"][0][1], rtol=1e-4)
    # the saved model read by the RL files on either device: the same scores, normalized on the GPU to mean 0 and
    # std 1 over the file's responses (detail 31)
    responses = [c[key] for key in ("chosen", "rejected") for c in comparisons]
    texts = [c["prompt"] + c[key] for key in ("chosen", "rejected") for c in comparisons]
    scores = {device: rlhf.load_reward_fn(rlhf.Args(reward_model=runs[True]["model_path"]),
                                          torch.device(device))(texts, responses).cpu() for device in ("cpu", "cuda")}
    torch.testing.assert_close(scores["cuda"], scores["cpu"], atol=1e-4, rtol=1e-4)
    assert abs(scores["cpu"].mean().item()) < 1e-3 and abs(scores["cpu"].std().item() - 1) < 1e-3
