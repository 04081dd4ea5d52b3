"""Where a rollout step of ppo_walker2d.py spends its time, on this machine, right now.

Usage (from the repository root, on quiet cores):
    python benchmarks/profile_rollout.py --vector-steps 1500

Times the three parts of the rollout loop of `ppo_walker2d.py` with its own functions and a freshly
initialized agent: the policy's forward pass (sampling and log-probability), `envs.step` on the vector env
of `num_envs` Walker2d envs, and the per-step numpy work after it (reward scaling, observation statistics
and normalization). Then, for scale, the same number of env steps on plain `gym.make` envs with random
actions, and bare `mujoco.mj_step` (the env's `frame_skip` physics steps per env step). An untrained walker
falls often, so the env resets more than in a trained run; treat the numbers as a profile, not a run's speed.
"""

import os
import sys
import time
from dataclasses import dataclass

import gymnasium as gym
import mujoco
import numpy as np
import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_walker2d as P  # noqa: E402


@dataclass
class Args:
    vector_steps: int = 1500
    """steps of the vector env to time (each is num_envs env steps)"""
    num_envs: int = 8
    """envs in the vector env (the script's default)"""
    seed: int = 1
    """seed of the envs, the agent and the random actions"""


def main(args: Args) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    n, steps = args.num_envs, args.vector_steps
    envs = P.make_vector_env("Walker2d-v5", n)
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    defaults = P.Args()  # the script's init, gamma and clipping, so the work is the same as in a run
    agent = P.Agent(obs_dim, act_dim, defaults.init_log_std)
    obs_rms, reward_scaler = P.RunningMeanStd(obs_dim), P.RewardScaler(n, defaults.gamma, defaults.reward_clip)
    low, high = envs.single_action_space.low, envs.single_action_space.high
    obs_raw, _ = envs.reset(seed=args.seed)
    obs_rms.update(obs_raw)
    obs = P.normalize_obs(obs_raw, obs_rms, defaults.obs_clip)
    policy = env = post = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        with torch.inference_mode():
            action, logprob = agent.get_action(torch.as_tensor(obs))
        action, logprob = action.numpy(), logprob.numpy()
        t1 = time.perf_counter()
        obs_raw, reward, terminated, truncated, _ = envs.step(np.clip(action, low, high))
        t2 = time.perf_counter()
        reward_scaler(reward, np.logical_or(terminated, truncated))
        obs_rms.update(obs_raw)
        obs = P.normalize_obs(obs_raw, obs_rms, defaults.obs_clip)
        policy += t1 - t0
        env += t2 - t1
        post += time.perf_counter() - t2
    envs.close()
    total = policy + env + post
    print(f"rollout loop, per vector step of {n} envs: policy {policy / steps * 1e6:.0f} us ({policy / total:.0%}), "
          f"envs.step {env / steps * 1e6:.0f} us ({env / total:.0%}), after the step {post / steps * 1e6:.0f} us "
          f"({post / total:.0%}); {n * steps / total:.0f} env steps/s")

    rng = np.random.default_rng(args.seed)
    plain = [gym.make("Walker2d-v5", disable_env_checker=True) for _ in range(n)]
    for i, e in enumerate(plain):
        e.reset(seed=args.seed + i)
    actions = rng.uniform(-1, 1, (steps, n, act_dim))
    t0 = time.perf_counter()
    for k in range(steps):
        for i, e in enumerate(plain):
            _, _, terminated, truncated, _ = e.step(actions[k, i])
            if terminated or truncated:
                e.reset()
    print(f"plain gym.make envs, random actions: {n * steps / (time.perf_counter() - t0):.0f} env steps/s")

    mujoco_env = plain[0].unwrapped
    t0 = time.perf_counter()
    for _ in range(n * steps):
        mujoco.mj_step(mujoco_env.model, mujoco_env.data, nstep=mujoco_env.frame_skip)
    print(f"bare mujoco.mj_step ({mujoco_env.frame_skip} physics steps per env step): "
          f"{n * steps / (time.perf_counter() - t0):.0f} env steps/s")
    for e in plain:
        e.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
