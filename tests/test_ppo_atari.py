import ast
import contextlib
import dataclasses
import inspect
import json
import os
import shutil
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import ppo_atari
import ppo_cartpole
from conftest import cartpole_agent_pt, check_one_step_gae, each_bad_value, load_benchmark, unusable_checkpoint

BREAKOUT, ASTERIX = "ALE/Breakout-v5", "ALE/Asterix-v5"  # Asterix: no FIRE action, rewards of 50 and more


# ---------------------------------------------------------------------------- watching the real games


class RawGame(gym.Wrapper):
    """Directly on the emulator (below every wrapper of make_env): each reset and each raw frame stepped, with its
    action, reward, lives and end."""

    def __init__(self, env):
        super().__init__(env)
        self.log = []

    def reset(self, **kwargs):
        self.log.append(("reset",))
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.log.append(("step", int(action), float(reward), self.unwrapped.ale.lives(), terminated or truncated))
        return obs, reward, terminated, truncated, info

    def actions_since_reset(self):
        last = max(i for i, event in enumerate(self.log) if event[0] == "reset")
        return [event[1] for event in self.log[last + 1 :]]

    def games(self):
        """(score, frames) of each game that ended, from the raw rewards."""
        games, score, frames = [], 0.0, 0
        for event in self.log:
            if event[0] == "reset":
                score, frames = 0.0, 0
            else:
                score, frames = score + event[2], frames + 1
                if event[4]:
                    games.append((score, frames))
        return games


class RecordingWarp(ppo_atari.WarpFrame):
    """WarpFrame, recording each frame it makes and what it passes up from each agent step: the reward below the
    clipping, which sits just above it."""

    def __init__(self, env, *args):
        super().__init__(env, *args)
        self.frames, self.steps = [], []

    def observation(self, frame):
        self.frames.append(super().observation(frame))
        return self.frames[-1]

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.steps.append(reward)
        return obs, reward, terminated, truncated, info


@pytest.fixture
def watched(monkeypatch):
    """make_env's stack with RawGame on the emulator and RecordingWarp for WarpFrame; the RawGame of every env
    made is in the returned list."""
    raw_games, real_make = [], gym.make

    def make(*args, **kwargs):
        raw_games.append(RawGame(real_make(*args, **kwargs)))
        return raw_games[-1]

    monkeypatch.setattr(gym, "make", make)
    monkeypatch.setattr(ppo_atari, "WarpFrame", RecordingWarp)
    return raw_games


def raw_env(env_id=BREAKOUT):
    return gym.make(env_id, frameskip=1, repeat_action_probability=0.0, full_action_space=False)


# ---------------------------------------------------------------------------- the wrappers, one by one


def test_the_game_is_made_as_cleanrls_v4_noframeskip():
    env = ppo_atari.make_env(BREAKOUT)()
    ale = env.unwrapped.ale
    assert env.unwrapped._frameskip == 1 and ale.getFloat("repeat_action_probability") == 0.0
    assert ale.getInt("max_num_frames_per_episode") == 108_000  # the time limit that truncates (detail G2)
    assert env.unwrapped.get_action_meanings() == ["NOOP", "FIRE", "RIGHT", "LEFT"]  # the minimal action set
    assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
    names = [type(w).__name__ for w in wrappers(env)][::-1]  # innermost first
    assert names[names.index("RecordEpisodeStatistics"):] == [
        "RecordEpisodeStatistics", "NoopReset", "MaxAndSkip", "EpisodicLife", "FireReset", "WarpFrame",
        "TransformReward", "FrameStackObservation"]


def test_noop_reset_takes_1_to_30_noops_drawn_from_the_seed():
    env = ppo_atari.NoopReset(RawGame(raw_env()))
    counts = []
    for seed in [*range(12), 3]:
        env.reset(seed=seed)
        noops = env.env.actions_since_reset()
        assert set(noops) == {0} and env.unwrapped.ale.getEpisodeFrameNumber() == len(noops)
        counts.append(len(noops))
    assert all(1 <= n <= 30 for n in counts) and len(set(counts)) > 3
    assert counts[-1] == counts[3]  # the same seed, the same start


def test_max_and_skip_repeats_the_action_4_frames_and_takes_the_max_of_the_last_two():
    env, twin = ppo_atari.MaxAndSkip(raw_env()), raw_env()
    env.reset(seed=0), twin.reset(seed=0)
    rng = np.random.default_rng(0)
    flicker = first_two = 0
    for action in [1, *rng.integers(0, 4, 60)]:  # FIRE serves the ball: frames that differ
        obs, reward, *_ = env.step(action)
        frames, rewards = zip(*[twin.step(action)[:2] for _ in range(4)])
        np.testing.assert_array_equal(obs, np.maximum(frames[2], frames[3]))
        assert reward == sum(rewards)
        flicker += (obs != frames[3]).any() and (obs != frames[2]).any()
        first_two += (obs != np.maximum(frames[0], frames[1])).any()
    assert flicker > 10 and first_two > 10  # the checks tell the last two frames from one or the first two
    assert twin.unwrapped.ale.getEpisodeFrameNumber() == env.unwrapped.ale.getEpisodeFrameNumber()


def area_by_integration(image, j, k, size=84):
    """Pixel (j, k) of `image` shrunk to size x size by area: the integral of the image over the output pixel's
    rectangle, divided by its area, worked out pixel by pixel."""
    sy, sx = image.shape[0] / size, image.shape[1] / size
    total = 0.0
    for y in range(image.shape[0]):
        dy = max(0.0, min(y + 1, (j + 1) * sy) - max(y, j * sy))
        for x in range(image.shape[1]) if dy else ():
            total += dy * max(0.0, min(x + 1, (k + 1) * sx) - max(x, k * sx)) * image[y, x]
    return total / (sy * sx)


def test_warp_frame_is_luma_then_area_averaging_to_84x84():
    warp = ppo_atari.WarpFrame(raw_env())
    assert warp.observation_space.shape == (84, 84) and warp.observation_space.dtype == np.uint8
    # pure red, green, blue, white: the ITU-R 601 weights
    for color, gray in (((255, 0, 0), 76), ((0, 255, 0), 150), ((0, 0, 255), 29), ((255, 255, 255), 255)):
        out = warp.observation(np.broadcast_to(np.array(color, np.uint8), (210, 160, 3)))
        assert out.dtype == np.uint8 and out.shape == (84, 84) and (out == gray).all()
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (210, 160, 3)).astype(np.uint8)
    out = warp.observation(frame)
    luma = frame.astype(np.float64) @ [0.299, 0.587, 0.114]
    for j, k in [(0, 0), (83, 83), (1, 1), (40, 17), *rng.integers(0, 84, (6, 2))]:
        assert abs(out[j, k] - area_by_integration(luma, j, k)) <= 0.5 + 1e-3, (j, k)


def test_the_stack_holds_the_last_4_warped_frames_oldest_first(watched):
    env = ppo_atari.make_env(BREAKOUT)()
    obs, _ = env.reset(seed=0)
    warp = ppo_atari.wrapper_of(env, RecordingWarp)
    assert obs.shape == (4, 84, 84) and all((frame == warp.frames[-1]).all() for frame in obs)  # padded at reset
    for action in (1, 2, 3, 2, 3, 0):
        obs, *_ = env.step(action)
        np.testing.assert_array_equal(obs, np.stack(([warp.frames[0]] * 3 + warp.frames)[-4:]))
    assert len({frame.tobytes() for frame in warp.frames[-4:]}) == 4  # the order shows


def test_fire_reset_presses_fire_at_the_start_and_after_a_lost_life(watched):
    env = ppo_atari.make_env(BREAKOUT)()
    env.reset(seed=0)
    raw = watched[-1]
    actions = raw.actions_since_reset()
    noops = len(actions) - 8
    assert 1 <= noops <= 30 and actions == [0] * noops + [1] * 4 + [2] * 4  # FIRE, then action 2, 4 frames each
    for _ in range(200):  # the ball, served, falls past a paddle that does not move
        _, _, terminated, truncated, _ = env.step(0)
        if terminated:
            break
    assert terminated and not truncated and raw.unwrapped.ale.lives() == 4
    steps_before = len(raw.log)
    env.reset()
    # no reset of the game: one no-op step (detail A3), then FIRE and action 2 again
    assert [event[1] for event in raw.log[steps_before:]] == [0] * 4 + [1] * 4 + [2] * 4
    # a game without FIRE gets no-ops only
    env = ppo_atari.make_env(ASTERIX)()
    env.reset(seed=0)
    assert set(watched[-1].actions_since_reset()) == {0}
    assert not any(isinstance(w, ppo_atari.FireReset) for w in wrappers(env))


def wrappers(env):
    while isinstance(env, gym.Wrapper):
        yield env
        env = env.env


def test_a_lost_life_ends_the_learners_episode_the_game_goes_on_and_its_raw_score_is_reported(watched):
    """A whole game of Asterix (3 lives, rewards of 50 and more) through the vector env, random actions: the
    learner's episode ends at each lost life, the emulator is reset only after the game is over, the learner's
    rewards are clipped, and the game's score and length come from the raw frames, at the end of the game."""
    envs = ppo_atari.make_vector_env(ASTERIX, 1)
    envs.reset(seed=1)
    raw, rng = watched[-1], np.random.default_rng(1)
    warp = ppo_atari.wrapper_of(envs.unwrapped.envs[0], RecordingWarp)
    learner, reported, frame_numbers = [], [], []
    while not reported:
        _, reward, terminated, truncated, infos = envs.step(rng.integers(0, envs.single_action_space.n, 1))
        learner.append((float(reward[0]), bool(terminated[0]), bool(truncated[0])))
        frame_numbers.append(raw.unwrapped.ale.getEpisodeFrameNumber())
        assert "episode" not in infos  # a score is reported with the step that ends the game, nowhere else
        if "_episode" in infos.get("final_info", {}) and infos["final_info"]["_episode"][0]:
            reported.append(infos["final_info"]["episode"])
    envs.close()
    ends = [i for i, (_, terminated, _) in enumerate(learner) if terminated]
    assert len(ends) == 3 and not any(truncated for *_, truncated in learner)  # 2 lives lost, then game over
    # the emulator: one reset before the game, one after it; its frame counter runs on over the lost lives
    resets = [i for i, event in enumerate(raw.log) if event[0] == "reset"]
    assert len(resets) == 2 and resets[0] == 0 and raw.log[resets[1] - 1][4]  # [4]: the game's own end
    assert np.all(np.diff(frame_numbers[: ends[-1]]) > 0)
    # the learner's rewards: each agent step's raw reward, clipped to its sign
    assert len(warp.steps) == len(learner)
    assert [reward for reward, *_ in learner] == [float(np.sign(r)) for r in warp.steps]
    assert max(warp.steps) > 1
    # the score: the raw rewards of all 3 lives, and the number of frames the game took
    (score, frames), = raw.games()
    assert float(reported[0]["r"][0]) == score > sum(reward for reward, *_ in learner)
    assert int(reported[0]["l"][0]) == frames


# ---------------------------------------------------------------------------- the network


def test_nature_cnn_shapes_and_the_scaling_of_the_pixels():
    torch.manual_seed(0)
    agent = ppo_atari.Agent(6)
    shapes = []
    x = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    h = x / 255.0
    for layer in agent.network:
        h = layer(h)
        if isinstance(layer, (torch.nn.Conv2d, torch.nn.Linear)):
            shapes.append(tuple(h.shape))
    assert shapes == [(5, 32, 20, 20), (5, 64, 9, 9), (5, 64, 7, 7), (5, 512)]
    with torch.no_grad():
        action, logprob = agent.get_action(x)
        _, newlogprob, entropy, value = agent.get_action_and_value(x, action)
        features = agent.network(x.float() / 255.0)  # the pixels reach the network scaled to [0, 1]
        torch.testing.assert_close(value, agent.critic(features).squeeze(-1))
        torch.testing.assert_close(agent.get_value(x), value)
        logits = agent.actor(features)
    assert action.shape == logprob.shape == entropy.shape == value.shape == (5,)
    torch.testing.assert_close(newlogprob, logprob)
    reference = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(logprob, reference.log_prob(action))
    torch.testing.assert_close(entropy, reference.entropy())
    assert agent.greedy_action(x).tolist() == logits.argmax(-1).tolist()


def test_one_trunk_feeds_both_heads_with_orthogonal_init():
    torch.manual_seed(0)
    agent = ppo_atari.Agent(4)
    layers = [m for m in agent.network if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    for layer, gain in [*((layer, 2**0.5) for layer in layers), (agent.actor, 0.01), (agent.critic, 1.0)]:
        w = layer.weight.detach().double().flatten(1)
        small = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
        torch.testing.assert_close(small, gain**2 * torch.eye(min(w.shape), dtype=torch.float64), rtol=0,
                                   atol=gain**2 * 1e-5)
        assert not layer.bias.any()
    # the value loss trains the trunk and the critic, the policy loss the trunk and the actor
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    _, logprob, _, value = agent.get_action_and_value(x, torch.tensor([0, 1, 2]))
    names, params = zip(*agent.named_parameters())
    for loss, head in ((value.sum(), "critic."), (logprob.sum(), "actor.")):
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        reached = {name for name, grad in zip(names, grads) if grad is not None and grad.abs().max() > 0}
        assert reached == {name for name in names if name.startswith(("network.", head))}


# ---------------------------------------------------------------------------- the math, shared with ppo_cartpole


def gae_reference(rewards, values, next_values, terminations, dones, gamma, lam):
    """A_t as the explicit sum  sum_k (gamma * lam)^k * delta_{t+k}, stopping at the end of t's episode."""
    T, N = rewards.shape
    advantages = np.zeros((T, N))
    for env in range(N):
        for t in range(T):
            for k in range(T - t):
                s = t + k
                bootstrap = 0.0 if terminations[s, env] else gamma * next_values[s, env]
                advantages[t, env] += (gamma * lam) ** k * (rewards[s, env] + bootstrap - values[s, env])
                if dones[s, env]:
                    break
    return advantages


@pytest.mark.parametrize("seed", range(3))
def test_gae_matches_explicit_sum_of_td_residuals(seed):
    rng = np.random.default_rng(seed)
    rewards, values, next_values = rng.normal(size=(3, 19, 3))
    terminations = rng.random((19, 3)) < 0.1
    dones = terminations | ((rng.random((19, 3)) < 0.1) & ~terminations)  # with truncations
    assert terminations.any() and (dones & ~terminations).any()
    advantages, returns = ppo_atari.compute_gae(rewards, values, next_values, terminations.astype(float),
                                                dones.astype(float), 0.99, 0.95)
    expected = gae_reference(rewards, values, next_values, terminations, dones, 0.99, 0.95)
    np.testing.assert_allclose(advantages, expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(returns, expected + values, rtol=1e-10, atol=1e-10)


def test_gae_of_a_one_step_rollout_is_the_td_residual():
    check_one_step_gae(ppo_atari.compute_gae, np.array)


def test_losses_by_hand():
    # clip_coef 0.1 (the Atari default): ratios 1.25 (clipped for A > 0), 0.5 (kept for A > 0), 1.0
    newlogprob = torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)).requires_grad_()
    logprobs = torch.log(torch.tensor([0.4, 0.6, 0.2], dtype=torch.float64))
    pg_loss, ratio, _ = ppo_atari.policy_loss(newlogprob, logprobs, torch.tensor([1.0, 1.0, -2.0]).double(), 0.1)
    np.testing.assert_allclose(ratio.detach().numpy(), [1.25, 0.5, 1.0], rtol=1e-12)
    assert pg_loss.item() == pytest.approx((-1.1 - 0.5 + 2.0) / 3)
    pg_loss.backward()
    np.testing.assert_allclose(newlogprob.grad.numpy(), [0.0, -0.5 / 3, 2.0 / 3], rtol=1e-12)
    # the value loss clipped around the rollout's values 1 with clip_coef 0.5: predictions 1.5, 0.5, 1.2, 0.5
    newvalue = torch.tensor([3.0, -1.0, 1.2, 0.2], dtype=torch.float64)
    returns = torch.tensor([0.0, -3.0, 5.0, 3.0], dtype=torch.float64)
    loss = ppo_atari.value_loss(newvalue, torch.ones(4, dtype=torch.float64), returns, 0.5, clip_vloss=True)
    assert loss.item() == pytest.approx(0.5 * (9.0 + 12.25 + 14.44 + 7.84) / 4)
    loss = ppo_atari.value_loss(newvalue, torch.ones(4, dtype=torch.float64), returns, 0.5, clip_vloss=False)
    assert loss.item() == pytest.approx(0.5 * (9.0 + 4.0 + 14.44 + 7.84) / 4)


@pytest.mark.parametrize("name", ["compute_gae", "policy_loss", "value_loss", "final_observations", "layer_init",
                                  "categorical_logprob", "categorical_entropy"])
def test_the_shared_functions_are_ppo_cartpoles_verbatim(name):
    assert inspect.getsource(getattr(ppo_atari, name)) == inspect.getsource(getattr(ppo_cartpole, name))


# ---------------------------------------------------------------------------- runs


def tiny_args(runs_dir, **kw):
    defaults = dict(num_envs=2, num_steps=16, num_minibatches=2, update_epochs=1, total_timesteps=64,
                    eval_episodes=0, runs_dir=str(runs_dir), cuda=False)
    defaults.update(kw)
    return ppo_atari.Args(**defaults)


def resume_args(runs_dir, **kw):
    """Two iterations of 2 envs x 32 steps: on Breakout, seed 1, a life is lost in the second."""
    return tiny_args(runs_dir, **{"num_steps": 32, "total_timesteps": 128, **kw})


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """Two iterations in one run, and the same two as one iteration, a checkpoint, and a resumed iteration."""
    root = tmp_path_factory.mktemp("resume")
    whole = ppo_atari.main(resume_args(root / "whole", checkpoint_every=2, save_model=True, eval_episodes=1))
    first = ppo_atari.main(resume_args(root / "split", total_timesteps=64, checkpoint_every=1))
    checkpoint = os.path.join(first["run_dir"], "checkpoint.pt")
    halfway = torch.load(checkpoint, weights_only=True)
    second = ppo_atari.main(resume_args(root / "unused", resume=checkpoint, checkpoint_every=1, save_model=True))
    return dict(whole=whole, second=second, halfway=halfway, checkpoint=checkpoint)


def load(run, name):
    return torch.load(os.path.join(run["run_dir"], name), weights_only=True)


def assert_same(a, b, where=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}/{i}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def test_a_resumed_run_continues_bit_for_bit(resumed):
    whole, second = resumed["whole"], resumed["second"]
    assert second["run_dir"] == os.path.dirname(resumed["checkpoint"])  # the resumed run logs where it began
    assert_same(load(whole, "agent.pt")["model"], load(second, "agent.pt")["model"])
    # everything the next iteration would read: weights, optimizer, RNGs, emulators, wrappers, frame stacks
    a, b = load(whole, "checkpoint.pt"), load(second, "checkpoint.pt")
    assert a["iteration"] == b["iteration"] == 2 and a["global_step"] == b["global_step"] == 128
    assert_same({k: v for k, v in a.items() if k != "args"}, {k: v for k, v in b.items() if k != "args"})
    # the games moved on from the checkpoint, through a lost life (detail A3's reset): the comparison is not
    # of two untouched states
    halfway = resumed["halfway"]
    assert halfway["iteration"] == 1 and halfway["global_step"] == 64
    assert all(x["ale"] != y["ale"] and x["length"] < y["length"] for x, y in zip(halfway["envs"], b["envs"]))
    assert any(x["lives"] > y["lives"] for x, y in zip(halfway["envs"], b["envs"]))


def test_a_saved_agent_evaluates_as_after_training(resumed, tmp_path):
    whole = resumed["whole"]
    args = ppo_atari.Args(eval_checkpoint=os.path.join(whole["run_dir"], "agent.pt"), eval_episodes=1,
                          runs_dir=str(tmp_path), cuda=False)
    assert ppo_atari.main(args)["eval_returns"] == whole["eval_returns"]
    assert not os.listdir(tmp_path)


def test_charts_log_whole_games_unclipped_not_lives(tmp_path, watched, read_events, monkeypatch):
    """A short run on Asterix: the logged episodes are the games the emulators played to the end, with their raw
    scores (multiples of 50) and lengths in frames, while the learner was trained on clipped rewards that ended
    at each lost life."""
    seen = []
    real_gae = ppo_atari.compute_gae
    monkeypatch.setattr(ppo_atari, "compute_gae", lambda *a: seen.append((a[0].copy(), a[3].copy())) or real_gae(*a))
    run = ppo_atari.main(tiny_args(tmp_path, env_id=ASTERIX, num_steps=256, total_timesteps=1024))
    events = read_events(run["run_dir"])
    logged = sorted(zip([e.value for e in events.Scalars("charts/episodic_return")],
                        [e.value for e in events.Scalars("charts/episodic_length")]))
    games = sorted(game for raw in watched for game in raw.games())
    assert len(games) >= 2 and logged == games
    assert run["episodic_returns"] == [e.value for e in events.Scalars("charts/episodic_return")]
    assert all(score % 50 == 0 for score, _ in games) and max(score for score, _ in games) > 50
    rewards, terminations = np.concatenate([r for r, _ in seen]), np.concatenate([t for _, t in seen])
    assert set(np.unique(rewards)) <= {0.0, 1.0} and rewards.sum() > 0
    assert terminations.sum() > len(games)  # lost lives end the learner's episodes too


# ---------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def a_checkpoint(resumed):
    return resumed["checkpoint"]


@pytest.mark.parametrize(
    "kw, flag",
    [
        *each_bad_value(env_id=("CartPole-v1", "NoSuchEnv-v0", "ALE/NoSuchGame-v5"), num_envs=0, num_minibatches=3,
                        total_timesteps=10, gamma=1.5, clip_coef=0.0, checkpoint_every=-1),
        (dict(eval_checkpoint="/no/such/agent.pt", eval_episodes=1), "--eval-checkpoint /no/such/agent.pt is not"),
        (dict(resume="/no/such/checkpoint.pt"), "--resume"),
    ],
)
def test_bad_input_fails_fast_naming_the_flag(fails_fast, kw, flag):
    fails_fast(ppo_atari, tiny_args, kw, flag)


@pytest.mark.parametrize("kw, flag", [(dict(learning_rate=1e-3), "--learning-rate 0.001 is not the checkpoint's"),
                                      (dict(num_steps=16), "--num-steps 16 is not the checkpoint's 32"),
                                      (dict(env_id="ALE/Pong-v5"), "--env-id ALE/Pong-v5 is not"),
                                      (dict(total_timesteps=128), "--total-timesteps 128: .* at step 128")])
def test_a_resume_with_other_flags_fails_fast(fails_fast, a_checkpoint, kw, flag):
    # the checkpoint, at step 128, with flags it does not hold; --total-timesteps must take the run further
    fails_fast(ppo_atari, resume_args, {"resume": a_checkpoint, "total_timesteps": 256, **kw}, flag)


def test_files_this_script_did_not_write_fail_fast(tmp_path, fails_fast, a_checkpoint):
    cartpole = cartpole_agent_pt(tmp_path / "cartpole")
    for path in (cartpole, a_checkpoint):
        fails_fast(ppo_atari, tiny_args, dict(eval_checkpoint=path, eval_episodes=1), "--eval-checkpoint .* ppo_atari")
    fails_fast(ppo_atari, tiny_args, dict(resume=cartpole), "--resume .* ppo_atari.py")
    corrupt = unusable_checkpoint("truncated", a_checkpoint, cartpole, tmp_path / "cut.pt")
    fails_fast(ppo_atari, tiny_args, dict(resume=str(corrupt)), "--resume .* ppo_atari.py")


def test_capture_video_without_moviepy_fails_fast(fails_fast):
    try:
        import moviepy  # noqa: F401
        pytest.skip("moviepy is installed")
    except ImportError:
        fails_fast(ppo_atari, tiny_args, dict(capture_video=True), "--capture-video .* pip install moviepy")


# ---------------------------------------------------------------------------- house style


def test_reading_path_width_docstring_and_help_texts():
    with open(ppo_atari.__file__) as f:
        text = f.read()
    lines = text.splitlines()
    marker = [i for i, line in enumerate(lines) if line.startswith("# Plumbing")]
    assert len(marker) == 1 and marker[0] <= 500
    assert max(map(len, lines)) <= 110
    assert len(ast.get_docstring(ast.parse(text), clean=False).splitlines()) <= 60
    from tyro._docstrings import get_field_docstring

    fields = dataclasses.fields(ppo_atari.Args)
    assert all(get_field_docstring(ppo_atari.Args, f.name, ()) for f in fields)
    # every numbered detail the docstring lists is marked in the code above the marker, and only there
    code = lines[len(ast.get_docstring(ast.parse(text), clean=False).splitlines()) + 1 :]
    cited = set(re.findall(r"\bdetails? ([AG]?\d+)(?: and ([AG]?\d+))?", "\n".join(code[: marker[0]])))
    cited = {number for pair in cited for number in pair if number}
    assert cited == {*map(str, range(1, 13)), *(f"A{i}" for i in range(1, 10)), "G1", "G2", "G3"}
    assert "detail" not in "\n".join(lines[marker[0] + 1 :]).lower()


def test_env_speed_benchmark_times_the_file_s_envs_and_ale_s_vector_env():
    speed = load_benchmark("atari_env_speed")
    assert [speed.ale_game_name(e) for e in ("ALE/SpaceInvaders-v5", "ALE/Pong-v5", "ALE/Breakout-v5")] == [
        "space_invaders", "pong", "breakout"]
    lines = speed.main(["--num-envs", "2", "--steps", "3", "--threads", "1", "2"])
    assert [line.split(":")[0] for line in lines] == ["ppo_atari.make_vector_env (SyncVectorEnv, Python wrappers)",
                                                      "ale_py AtariVectorEnv, 1 thread",
                                                      "ale_py AtariVectorEnv, 2 threads"]
    assert all(float(line.split(": ")[1].split()[0]) > 0 for line in lines)
    with pytest.raises(SystemExit):
        speed.main(["--steps", "0"])


def test_cleanrl_speed_benchmark_patches_only_its_lines_and_reads_each_run(tmp_path):
    speed = load_benchmark("cleanrl_atari_speed")
    # a stand-in checkout: the lines the patches name, around lines they must leave alone
    (tmp_path / "cleanrl").mkdir()
    (tmp_path / "cleanrl_utils").mkdir()
    script = ("import os\nimport gymnasium as gym\nimport numpy as np\n"
              "env = gym.wrappers.GrayScaleObservation(env)\nenv = gym.wrappers.FrameStack(env, 4)\n# end\n")
    (tmp_path / "cleanrl" / "ppo_atari.py").write_text(script)
    (tmp_path / "cleanrl_utils" / "atari_wrappers.py").write_text("class NoopResetEnv: pass\n")
    target = speed.copy_cleanrl(tmp_path, tmp_path / "copy")
    assert target.read_text() == (
        "import os\nimport gymnasium as gym\nimport ale_py\ngym.register_envs(ale_py)\nimport numpy as np\n"
        "env = gym.wrappers.GrayscaleObservation(env)\nenv = gym.wrappers.FrameStackObservation(env, 4)\n# end\n")
    assert (tmp_path / "copy" / "cleanrl_utils" / "atari_wrappers.py").read_text() == "class NoopResetEnv: pass\n"
    assert (tmp_path / "copy" / "cleanrl_utils" / "__init__.py").exists()
    # a version whose lines moved on is refused, not half patched
    (tmp_path / "cleanrl" / "ppo_atari.py").write_text(script.replace("FrameStack(env, 4)", "FrameStack(env, 8)"))
    with pytest.raises(SystemExit, match="0 copies of 'gym.wrappers.FrameStack"):
        speed.copy_cleanrl(tmp_path, tmp_path / "again")
    with pytest.raises(SystemExit, match="no cleanrl/ppo_atari.py"):
        speed.copy_cleanrl(tmp_path / "nowhere", tmp_path / "third")
    assert [speed.cleanrl_env_id(e) for e in ("ALE/Pong-v5", "ALE/SpaceInvaders-v5")] == [
        "PongNoFrameskip-v4", "SpaceInvadersNoFrameskip-v4"]
    with pytest.raises(SystemExit, match="--env-id PongNoFrameskip-v4"):
        speed.cleanrl_env_id("PongNoFrameskip-v4")
    # both sides run one thread, on the CPU, for the same budget, on the same game
    ours = speed.commands("ours", Path("p.py"), "ALE/Pong-v5", 2048, Path("r"))
    theirs = speed.commands("cleanrl", Path("c.py"), "ALE/Pong-v5", 2048, Path("r"))
    assert ours[ours.index("--num-threads") + 1] == "1" and "--no-cuda" in ours and "--no-cuda" in theirs
    assert ours[ours.index("--total-timesteps") + 1] == theirs[theirs.index("--total-timesteps") + 1] == "2048"
    assert theirs[theirs.index("--env-id") + 1] == "PongNoFrameskip-v4"
    on_gpu = [speed.commands(s, Path("x.py"), "ALE/Pong-v5", 2048, Path("r"), cuda=True) for s in ("ours", "cleanrl")]
    assert all("--cuda" in c and "--no-cuda" not in c for c in on_gpu)
    # a run's last SPS and its count of episodic returns, read back from a real TensorBoard file
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(str(tmp_path / "runs" / "one"))
    for step, sps in ((1024, 300), (2048, 250)):
        writer.add_scalar("charts/SPS", sps, step)
    writer.add_scalar("charts/episodic_return", -21, 1500)
    writer.close()
    assert speed.read_run(tmp_path / "runs") == (250.0, 1)
    # the report: each run's SPS in order, medians, and the ratio of the medians
    rows = [dict(side="ours", sps=200, cpu_per_1k=5.0, returns=3), dict(side="cleanrl", sps=100, cpu_per_1k=9.0,
            returns=0), dict(side="ours", sps=240, cpu_per_1k=4.0, returns=3), dict(side="cleanrl", sps=120,
            cpu_per_1k=8.0, returns=0)]
    lines = speed.report(rows, "ALE/Pong-v5", 2048)
    assert "| ppo_atari.py | 200, 240 | 220 | 4.50 | 3, 3 |" in lines
    assert "| CleanRL's ppo_atari.py, patched | 100, 120 | 110 | 8.50 | 0, 0 |" in lines
    assert lines[-1].endswith(": 2.00x")
    with pytest.raises(SystemExit):
        speed.main(["--cleanrl", str(tmp_path), "--steps", "1000"])


def test_cleanrl_learning_run_resets_in_the_same_step_and_logs_every_game_s_score(tmp_path):
    speed = load_benchmark("cleanrl_atari_speed")
    # a stand-in whose vector env and logging are CleanRL's lines verbatim, on CartPole under gymnasium 1.x
    (tmp_path / "cleanrl").mkdir()
    (tmp_path / "cleanrl_utils").mkdir()
    (tmp_path / "cleanrl_utils" / "atari_wrappers.py").write_text("")
    (envs_lines, _), (logging_lines, _) = speed.LEARN_PATCHES
    script = ("import json, sys\nimport gymnasium as gym\nimport numpy as np\n"
              "from torch.utils.tensorboard import SummaryWriter\n"
              "def unused(env):  # the speed patches' lines\n"
              "    env = gym.wrappers.GrayScaleObservation(env)\n    return gym.wrappers.FrameStack(env, 4)\n"
              "def make_env(env_id, idx, capture_video, run_name):\n"
              "    halved = lambda: gym.wrappers.TransformReward(gym.make(env_id), lambda r: r / 2)\n"
              "    return lambda: gym.wrappers.RecordEpisodeStatistics(halved())  # a score is not a length\n"
              "def main(args, run_name, writer):\n"
              "    envs = gym.vector.SyncVectorEnv(\n" + envs_lines + "\n"
              "    envs.reset(seed=0)\n    sums, games = np.zeros(args.num_envs), []\n"
              "    for iteration, global_step in enumerate(range(0, 600, args.num_envs)):\n"
              "        for step in range(1):\n"
              "            next_obs, reward, terminations, truncations, infos = envs.step(envs.action_space.sample())\n"
              "            sums += reward\n"
              "            for i in np.flatnonzero(terminations | truncations):\n"
              "                games.append([global_step, sums[i]])\n"
              "                sums[i] = 0\n" + logging_lines +
              "    writer.close()\n    print(json.dumps(games))\n"
              "class Args:\n    env_id, capture_video, num_envs = 'CartPole-v1', False, 3\n"
              "main(Args, 'r', SummaryWriter(sys.argv[1]))\n")
    (tmp_path / "cleanrl" / "ppo_atari.py").write_text(script.replace("FrameStack(", "Stack("))
    with pytest.raises(SystemExit, match="0 copies of 'gym.wrappers.FrameStack"):
        speed.copy_cleanrl(tmp_path, tmp_path / "copy", learn=True)  # the speed patches are still required
    (tmp_path / "cleanrl" / "ppo_atari.py").write_text(script)
    assert speed.copy_cleanrl(tmp_path, tmp_path / "plain").read_text().count("AutoresetMode") == 0
    patched = speed.copy_cleanrl(tmp_path, tmp_path / "copy", learn=True)
    assert "autoreset_mode=gym.vector.AutoresetMode.SAME_STEP" in patched.read_text()
    done = subprocess.run([sys.executable, str(patched), str(tmp_path / "tb")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    # every game the stand-in counted itself, reward by reward, is logged once, at its step, with its score
    games = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(games) >= 10 and {score for _, score in games} != {games[0][1]}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    logged = sorted((e.step, e.value) for e in events.Scalars("charts/episodic_return"))
    assert logged == sorted((step, score) for step, score in games)
    # the run: CleanRL's flags for the game and budget, one thread, in the folder given, its output logged there
    echo = tmp_path / "echo.py"
    echo.write_text("import json, os, sys\nprint(json.dumps([sys.argv[1:], os.getcwd(), os.environ['OMP_NUM_THREADS']]))\n")
    assert speed.learning_run(echo, "ALE/Pong-v5", 3000, tmp_path / "learn") == 0
    assert json.loads((tmp_path / "learn" / "stdout.log").read_text()) == [
        ["--env-id", "PongNoFrameskip-v4", "--total-timesteps", "3000", "--no-cuda", "--seed", "1"],
        str(tmp_path / "learn"), "1"]
    assert speed.learning_run(echo, "ALE/Pong-v5", 3000, tmp_path / "seeded", seed=7) == 0
    assert json.loads((tmp_path / "seeded" / "stdout.log").read_text())[0][-2:] == ["--seed", "7"]
    # --learn: CleanRL's own schedule (any --steps), its runs in the folder given; not on the GPU
    for bad in (["--steps", "512"], ["--steps", "1024", "--cuda"], ["--compare-envs", "0"]):
        with pytest.raises(SystemExit):
            speed.main(["--cleanrl", str(tmp_path), "--learn", str(tmp_path / "l"), *bad])


def test_compare_envs_reports_each_step_s_reward_and_frame_difference(tmp_path):
    speed = load_benchmark("cleanrl_atari_speed")
    # stand-ins for CleanRL's file: its make_env, here ppo_atari's own env with known changes, then its networks
    stand_in = ("import gymnasium as gym\nimport numpy as np\nimport ppo_atari\n"
                "def make_env(env_id, idx, capture_video, run_name):\n"
                "    assert env_id.endswith('NoFrameskip-v4'), env_id\n"
                "    def thunk():\n"
                "        env = ppo_atari.make_env('ALE/' + env_id[: -len('NoFrameskip-v4')] + '-v5')()\n"
                "        CHANGES\n"
                "    return thunk\n"
                "def layer_init(layer):\n    raise AssertionError('the training part is not run')\n")
    same = tmp_path / "same.py"
    same.write_text(stand_in.replace("CHANGES", "return env"))
    changed = tmp_path / "changed.py"
    changed.write_text(stand_in.replace("CHANGES", "env = gym.wrappers.TransformReward(env, lambda r: r + 1)\n"
                                        "        return gym.wrappers.TransformObservation(env, lambda o: "
                                        "np.minimum(o, 250) + 5, env.observation_space)"))
    path = list(sys.path)
    assert speed.compare_envs(same, "ALE/Pong-v5", 150) == dict(
        steps=150, ends=0, differ=0, median=0.0, max=0, over_40=0, over_40_at_ends=0)
    assert speed.compare_envs(changed, "ALE/Pong-v5", 150) == dict(
        steps=150, ends=0, differ=150, median=5.0, max=5, over_40=0, over_40_at_ends=0)
    # Breakout's lost lives end learning episodes: both envs are reset there and stay in step
    breakout = speed.compare_envs(same, "ALE/Breakout-v5", 200)
    assert breakout["ends"] >= 2 and breakout["differ"] == breakout["max"] == 0
    assert sys.path == path


def test_a_resume_that_moves_the_end_says_in_one_line_where_the_learning_rate_now_reaches_0(a_checkpoint, tmp_path,
                                                                                           capsys):
    shutil.copy(a_checkpoint, tmp_path / "checkpoint.pt")  # at step 128, of a run of --total-timesteps 128
    ppo_atari.main(resume_args(tmp_path / "runs", resume=str(tmp_path / "checkpoint.pt"), total_timesteps=200))
    said = [line for line in capsys.readouterr().out.splitlines() if "--total-timesteps" in line]
    # 200 steps are 3 whole iterations of 2 x 32: the schedule now ends at 192
    assert said == ["--total-timesteps 200 is not the checkpoint's 128: the learning rate anneals to 0 at step 192 "
                    "from here on"]


def test_atari_scores_counts_each_game_once_across_a_resume(tmp_path):
    scores = load_benchmark("atari_scores")
    from torch.utils.tensorboard import SummaryWriter
    # a run of 1,024-step iterations, stopped after its third; its checkpoint was at 2,048, where it resumed
    first = SummaryWriter(str(tmp_path))
    for step in (1024, 2048, 3072):
        first.add_scalar("charts/SPS", 200, step)
    for step, score in ((500, -21), (1500, -20), (2500, -19), (3000, -18)):
        first.add_scalar("charts/episodic_return", score, step)
    first.close()
    resumed = SummaryWriter(str(tmp_path))  # a second events file in the same folder, as --resume writes
    for step in (3072, 4096):
        resumed.add_scalar("charts/SPS", 200, step)
    for step, score in ((2600, -17), (3500, -16), (4000, -14)):
        resumed.add_scalar("charts/episodic_return", score, step)
    resumed.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    points = scores.scores(tmp_path)
    assert points == [(500, -21), (1500, -20), (2600, -17), (3500, -16), (4000, -14)]
    # the same two files written in the same second by one process, the ninth and tenth writer of it: the order
    # of the numbers, not of the names' characters ("9" > "10")
    for path, count in zip(sorted(tmp_path.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime), (9, 10)):
        path.rename(tmp_path / f"events.out.tfevents.1796000000.vm.4242.{count}")
    assert scores.scores(tmp_path) == points
    lines = scores.table(points, 2000)
    # 0-2k: -21, -20 (mean -20.5, sd 0.707, t(1) 12.71: ± 6.4); 2k-4k: -17, -16 (± 6.4); 4k: one game, no interval
    assert lines[2:] == ["| 0k-2k | 2 | -20.5 ± 6.4 |", "| 2k-4k | 2 | -16.5 ± 6.4 |", "| 4k-4k | 1 | -14.0 ± 0.0 |"]
    printed = scores.main([str(tmp_path), "--bin", "2000", "--plot", str(tmp_path / "curve.png")])
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert printed[-1] == "5 games to step 4000; the first 5: -17.6, the last 5: -17.6"
    with pytest.raises(SystemExit, match="no TensorBoard events file"):
        scores.scores(tmp_path / "empty")


def test_atari_scores_reach_finds_the_first_100_games_in_a_row_at_a_level():
    scores = load_benchmark("atari_scores")
    # 100 games of -21, then 50 of 21 (game k at step 10k): the 100 games ending at game 100 + j average
    # -21 + 0.42 j, which is -19.74 at j = 3 (the first at or above -20) and 0 at j = 50, the highest
    points = [(10 * k, -21.0 if k <= 100 else 21.0) for k in range(1, 151)]
    assert scores.reach(points, -20) == ("the mean of 100 games in a row: first at or above -20 at step 1030 "
                                         "(game 103); highest 0.00")
    assert scores.reach(points, 0) == ("the mean of 100 games in a row: first at or above 0 at step 1500 "
                                       "(game 150); highest 0.00")
    assert scores.reach(points, 0.5) == "the mean of 100 games in a row: never at or above 0.5; highest 0.00"
    assert scores.reach(points[:99], -21).startswith("fewer than 100 games")
    # the first window counts game 1: one win there (21) puts games 1-100 at -20.58, reached at game 100 already
    early = [(10, 21.0)] + points[1:]
    assert scores.reach(early, -20.58) == ("the mean of 100 games in a row: first at or above -20.58 at step 1000 "
                                           "(game 100); highest 0.00")


def test_atari_scores_puts_two_runs_and_their_training_scalars_side_by_side(tmp_path):
    scores = load_benchmark("atari_scores")
    from torch.utils.tensorboard import SummaryWriter
    for name, games, entropies in (
            ("ours", ((500, -21), (1500, -19), (2500, -10), (3500, -8)), (1.8, 1.6, 1.4, 1.2)),
            ("theirs", ((700, -20), (1200, -20), (2100, -15)), (1.7, 1.5, 1.5))):
        writer = SummaryWriter(str(tmp_path / name))
        for step, score in games:
            writer.add_scalar("charts/episodic_return", score, step)
        for i, entropy in enumerate(entropies):
            writer.add_scalar("losses/entropy", entropy, 1024 * (i + 1))
        writer.close()
    printed = scores.main([str(tmp_path / "ours"), "--against", str(tmp_path / "theirs"), "--labels", "A", "B",
                           "--bin", "2000", "--scalars", "losses/entropy", "--plot", str(tmp_path / "two.png")])
    # up to the shorter run's last game (2,100): 0-2k A -21, -19 (sd 1.414, t(1) 12.71: ± 12.7), B -20, -20
    assert printed[2:4] == ["| 0k-2k | -20.0 ± 12.7 (2) | -20.0 ± 0.0 (2) |", "| 2k-2.1k | - | -15.0 ± 0.0 (1) |"]
    assert printed[5] == "A: 4 games to step 3500; the first 4: -14.5, the last 4: -14.5"
    assert printed[7] == "B: 3 games to step 2100; the first 3: -18.3, the last 3: -18.3"
    # entropy up to step 3,072: 0-2k one iteration each; 2k-3.072k A 1.6, 1.4 (± 12.71 x 0.1 = 1.3), B 1.5, 1.5
    assert printed[9].startswith("| steps | A: losses/entropy, mean ± 95% t (iterations) | B: losses/entropy")
    assert printed[11:] == ["| 0k-2k | 1.8 ± 0 (1) | 1.7 ± 0 (1) |", "| 2k-3.072k | 1.5 ± 1.3 (2) | 1.5 ± 0 (2) |"]
    assert (tmp_path / "two.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="--scalars losses/clipfrac: not logged by every run"):
        scores.main([str(tmp_path / "ours"), "--against", str(tmp_path / "theirs"), "--scalars", "losses/clipfrac"])
    # without --labels, each run is named by its folder
    named = scores.main([str(tmp_path / "ours"), "--against", str(tmp_path / "theirs"), "--bin", "2000"])
    assert named[0] == "| steps | ours: mean game score ± 95% t (games) | theirs: mean game score ± 95% t (games) |"


def test_atari_scores_compares_files_over_seeds_with_a_welch_interval(tmp_path):
    scores = load_benchmark("atari_scores")
    from torch.utils.tensorboard import SummaryWriter
    runs = {"a1": ((100, 1), (200, 3), (1500, 10), (1950, 20)), "a2": ((300, 4), (1200, 12), (1900, 14)),
            "b1": ((100, 0), (1100, 5), (1990, 9)), "b2": ((400, 2), (1900, 7)), "b3": ((500, 1), (1600, 3), (1900, -1))}
    for name, games in runs.items():
        writer = SummaryWriter(str(tmp_path / name))
        for step, score in games:
            writer.add_scalar("charts/episodic_return", score, step)
        writer.close()
    a, b = ",".join(str(tmp_path / n) for n in ("a1", "a2")), ",".join(str(tmp_path / n) for n in ("b1", "b2", "b3"))
    printed = scores.main(["--seeds", f"A={a}", f"B={b}", "--bin", "1000", "--plot", str(tmp_path / "seeds.png")])
    # up to the shortest run's last game (1,900). 0-1k: A's runs 2 and 4 (sd 1.414, t(1) 12.71: ± 12.7); B's 0, 2, 1
    # (sd 1, t(2) 4.30 / sqrt 3: ± 2.5); Welch: se sqrt(1 + 1/3) = 1.155, df 1.68 -> t(1): ± 14.7.
    # 1k-1.9k: A 10 and mean(12, 14) = 13 (sd 2.121: ± 19.1); B 5 (its 1,990 game is past 1,900), 7 and
    # mean(3, -1) = 1 (sd 3.055: ± 7.6); Welch: se sqrt(2.25 + 3.111) = 2.315, df 2.90 -> t(2) 4.30: ± 10.0
    assert printed[:4] == [
        "| steps | A: mean ± 95% t over runs (runs) | B: mean ± 95% t over runs (runs) | A - B ± Welch 95% |",
        "|---|---|---|---|", "| 0k-1k | 3.0 ± 12.7 (2) | 1.0 ± 2.5 (3) | +2.0 ± 14.7 |",
        "| 1k-1.9k | 11.5 ± 19.1 (2) | 4.3 ± 7.6 (3) | +7.2 ± 10.0 |"]
    assert printed[4:] == ["A: a1 4 games to step 1950; a2 3 games to step 1900",
                           "B: b1 3 games to step 1990; b2 2 games to step 1900; b3 3 games to step 1900"]
    assert (tmp_path / "seeds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one run on a side: its mean, no interval and no difference
    single = scores.main(["--seeds", f"A={a}", f"B={tmp_path / 'b1'}", "--bin", "1000"])
    assert single[2] == "| 0k-1k | 3.0 ± 12.7 (2) | 0.0 ± - (1) | - |"
    assert scores.welch([1.0, 1.0], [0.0, 0.0]) == (1.0, 0.0)
    for bad in ([str(tmp_path / "a1"), "--seeds", f"A={a}"], ["--seeds", a], []):
        with pytest.raises(SystemExit):
            scores.main(bad)


def test_greedy_evaluation_games_differ_where_their_no_op_counts_agree(monkeypatch):
    """Seeds 1 and 8 draw the same number of no-ops on Breakout (13 frames before the first action): without
    sticky actions the greedy policy plays one game from both; evaluation's sticky actions make them two, and
    training's envs stay without them."""
    for seed in (1, 8):
        env = ppo_atari.make_env(BREAKOUT)()
        env.reset(seed=seed)
        assert ppo_atari.wrapper_of(env, gym.wrappers.RecordEpisodeStatistics).episode_lengths == 13
        assert env.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
        env.close()
    torch.manual_seed(0)
    agent, steps = ppo_atari.Agent(4), []
    real = agent.greedy_action
    monkeypatch.setattr(agent, "greedy_action", lambda x: steps.append(1) or real(x))

    def game(seed):
        steps.clear()
        return ppo_atari.evaluate(agent, BREAKOUT, 1, seed, torch.device("cpu"))[0], len(steps)

    assert ppo_atari.EVAL_STICKY == 0.25
    assert game(1) != game(8)  # score and length of two games
    monkeypatch.setattr(ppo_atari, "EVAL_STICKY", 0.0)
    assert game(1) == game(8)  # the same game twice


def test_the_loop_bootstraps_a_time_limit_cut_from_the_frames_the_cut_game_reached(tmp_path, monkeypatch):
    """The main loop over lost lives, game overs and time-limit cuts (a TimeLimit of 7 agent steps on top of each
    env): at every cut the rollout is marked done but not terminated, and the value it bootstraps is the critic's
    on the frames the env returned when cut (recorded inside the env, before the vector env's reset), not on
    the next game's first frames; at a lost life the bootstrap is zeroed. Checked against the agent's weights as
    they were when the rollout's values were computed."""
    cuts, lives, agents, checked, iterations = [], [], [], [], []
    real_make_env, real_agent, real_gae = ppo_atari.make_env, ppo_atari.Agent, ppo_atari.compute_gae

    class Recorder(gym.Wrapper):  # inside one env: each step's index, and the frames of a cut
        def __init__(self, env, index):
            super().__init__(gym.wrappers.TimeLimit(env, max_episode_steps=7))
            self.index, self.steps = index, 0

        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if truncated and not terminated:
                cuts.append((self.steps, self.index, np.array(obs)))
            elif terminated:
                lives.append((self.steps, self.index))
            self.steps += 1
            return obs, reward, terminated, truncated, info

    made = []

    def make_env(env_id, video_dir=None, sticky=0.0):
        def thunk():
            made.append(None)
            return Recorder(real_make_env(env_id, video_dir, sticky)(), len(made) - 1)
        return thunk

    def compute_gae(rewards, values, next_values, terminations, dones, *rest):
        iteration, (num_steps, num_envs), agent = len(iterations), rewards.shape, agents[0]
        for step, env, frames in cuts:
            if step // num_steps == iteration:
                t = step % num_steps
                assert dones[t, env] == 1 and terminations[t, env] == 0
                with torch.inference_mode():
                    expected = agent.get_value(torch.as_tensor(frames)[None]).item()
                assert next_values[t, env] == pytest.approx(expected, abs=1e-5)
                checked.append((iteration, t, env))
        for step, env in lives:
            if step // num_steps == iteration:
                assert terminations[step % num_steps, env] == 1
        iterations.append(iteration)
        return real_gae(rewards, values, next_values, terminations, dones, *rest)

    monkeypatch.setattr(ppo_atari, "make_env", make_env)
    monkeypatch.setattr(ppo_atari, "Agent", lambda *a: agents.append(real_agent(*a)) or agents[-1])
    monkeypatch.setattr(ppo_atari, "compute_gae", compute_gae)
    ppo_atari.main(tiny_args(tmp_path, env_id=BREAKOUT, num_steps=16, total_timesteps=96))
    # 3 iterations of 2 envs x 16 steps, a cut every 7 steps unless a life ends sooner, in every iteration
    assert iterations == [0, 1, 2] and {i for i, _, _ in checked} == {0, 1, 2} and len(checked) >= 6
    assert lives, "no life was lost: the test would not tell a cut from an end"


def test_a_restored_env_draws_the_next_game_s_no_ops_as_the_saved_one_would():
    """env_state and restore_env_state carry every random stream of a game: after a restore into an env seeded
    otherwise, the next game starts after as many no-ops as the saved env's next game, and plays the same."""
    saved, restored = ppo_atari.make_env(BREAKOUT)(), ppo_atari.make_env(BREAKOUT)()
    saved.reset(seed=3)
    restored.reset(seed=4)
    for _ in range(20):
        saved.step(1)
    ppo_atari.restore_env_state(restored, ppo_atari.env_state(saved))
    starts = []
    for env in (saved, restored):
        lives = ppo_atari.wrapper_of(env, ppo_atari.EpisodicLife)
        lives.game_over = True  # as at a game over: the next reset starts a new game, with its no-ops
        obs, _ = env.reset()
        starts.append((ppo_atari.wrapper_of(env, gym.wrappers.RecordEpisodeStatistics).episode_lengths,
                       env.unwrapped.np_random.integers(1 << 30), np.asarray(obs).copy()))
    assert starts[0][0] == starts[1][0] and starts[0][1] == starts[1][1] and np.array_equal(starts[0][2], starts[1][2])


def test_evaluation_chooses_each_action_on_the_frames_the_env_returned_last(monkeypatch):
    """evaluate()'s greedy and sampled games: each action is chosen on the stacked frames the env returned last
    (the reset's, a step's, a lost life's reset), as stored (uint8, scaled inside the network), recorded by a
    wrapper outside the training's wrappers. Each game stops at its end or after `actions` actions (a random
    policy loses its first life within them)."""
    returned, seen, resets = [], [], []
    real_make_env = ppo_atari.make_env

    class Enough(Exception):
        pass

    class Recorder(gym.Wrapper):
        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            returned.append(np.array(obs))
            resets.append(len(returned))
            return obs, info

        def step(self, action):
            out = self.env.step(action)
            returned.append(np.array(out[0]))
            return out

    def watch(x, real, actions):
        if len(seen) == actions:
            raise Enough
        seen.append((len(returned), x.dtype, x[0].numpy().copy()))
        return real(x)

    monkeypatch.setattr(ppo_atari, "make_env", lambda *a, **kw: lambda: Recorder(real_make_env(*a, **kw)()))
    torch.manual_seed(0)
    agent = ppo_atari.Agent(4)
    for sample, name, actions in [(False, "greedy_action", 60), (True, "get_action", 300)]:
        returned.clear(), seen.clear(), resets.clear()
        monkeypatch.setattr(agent, name, lambda x, real=getattr(agent, name), n=actions: watch(x, real, n))
        with contextlib.suppress(Enough):  # the game's end, or `actions` actions, whichever comes first
            ppo_atari.evaluate(agent, BREAKOUT, 1, 3, torch.device("cpu"), sample=sample)
        assert len(seen) >= 50 and (len(resets) >= 2 or not sample)  # sampled: a lost life's reset too
        for count, dtype, x in seen:
            assert dtype == torch.uint8 and np.array_equal(x, returned[count - 1])
