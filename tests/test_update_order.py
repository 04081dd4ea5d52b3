"""The order inside an update, in every script that clips its gradient (detail 11; reinforce.py does not): the
clip acts on the step that is taken. Watched from outside: each optimizer step records the global norm of the
gradient it is about to apply, each clip call the norm it found. With --max-grad-norm far below the gradients'
norm, every step must apply a gradient of norm at most max_grad_norm, and there must be exactly one clip per
step: a clip after the step, one that misses some trained parameters, or one inside the micro-batch loop (before
the last backward) each break one of these."""

import importlib

import pytest
import torch

MAX_NORM = 1e-4


def norm_of(parameters) -> float:
    grads = [p.grad.detach().double() for p in parameters if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def args_of(script: str, tiny: dict, tmp_path):
    module = importlib.import_module(script)
    common = dict(runs_dir=str(tmp_path / "runs"), cuda=False, max_grad_norm=MAX_NORM)
    lm = dict(model_name=tiny["policy"], response_length=8, min_response_length=0, **common)
    if script == "ppo_atari":
        return module, module.Args(total_timesteps=128, num_envs=2, num_steps=32, eval_episodes=0, **common)
    if script in ("a2c", "ppo_cartpole", "ppo_walker2d"):
        steps = {"a2c": 1000, "ppo_cartpole": 1024, "ppo_walker2d": 4096}[script]
        return module, module.Args(total_timesteps=steps, eval_episodes=0, **common)
    if script in ("ppo_rlhf_gpt2", "grpo_gpt2"):
        # GRPO: the length reward, which varies within a group (the tiny reward model's scores may not)
        extra = (dict(norm_batches=1, reward_model=tiny["reward"]) if script == "ppo_rlhf_gpt2" else
                 dict(num_generations=4, reward_model="length", missing_eos_penalty=None))
        return module, module.Args(batch_size=8, num_minibatches=2, total_episodes=16,
                                   update_epochs=2, gradient_accumulation_steps=2, eval_episodes=0, **extra, **lm)
    if script == "dpo_gpt2":
        import test_dpo_gpt2

        return module, test_dpo_gpt2.tiny_args(tiny, tmp_path, max_grad_norm=MAX_NORM, gradient_accumulation_steps=2)
    return module, module.Args(gold="length", num_comparisons=32, eval_fraction=0.25, batch_size=8,
                               gradient_accumulation_steps=2, forward_batch_size=16, eval_every=0, probe=False, **lm)


@pytest.mark.parametrize("script", ["a2c", "ppo_cartpole", "ppo_walker2d", "ppo_atari", "ppo_rlhf_gpt2", "grpo_gpt2",
                                    "dpo_gpt2", "reward_model_gpt2"])
def test_every_step_applies_the_clipped_gradient_once(script, tiny, tmp_path, monkeypatch):
    applied, found = [], []
    for optimizer in (torch.optim.Adam, torch.optim.RMSprop):
        real_step = optimizer.step

        def step(self, *args, _real=real_step, **kwargs):
            applied.append(norm_of(p for group in self.param_groups for p in group["params"]))
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(optimizer, "step", step)
    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(parameters, max_norm, *args, **kwargs):
        total = real_clip(parameters, max_norm, *args, **kwargs)
        found.append(float(total))
        return total

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    module, args = args_of(script, tiny, tmp_path)
    module.main(args)
    assert len(applied) >= 2 and len(found) == len(applied), (len(found), len(applied))
    assert max(found) > 10 * MAX_NORM  # the clip had work to do
    assert max(applied) <= MAX_NORM * (1 + 1e-3), max(applied)
