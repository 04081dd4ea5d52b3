import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

import reinforce
from conftest import (GREEDY_EPISODES, PPO_ONLY_TAGS, REFUSED_BY_A2C_AND_REINFORCE, SHARED_TAGS,
                      CartPoleScriptTests, args_maker, cartpole_args, check_categorical_agent_by_hand,
                      check_categorical_networks_start_orthogonal, check_entropy_bonus_gradient,
                      check_evaluate_plays_the_greedy_action, check_greedy_evaluation_draws_independent_episodes,
                      check_losses_reach_their_networks, check_same_step_autoreset, each_bad_value, leaning,
                      one_env_returns, peaked, softmax_policy_by_hand, standardized, value_of)

CRITIC_TAGS = ["losses/value_loss", "losses/explained_variance"]


# the runs' arguments: a short CartPole-v1 run, and the wiring tests' runs
small_args = cartpole_args(reinforce)
# Two batches on conftest.py's TinyDiscrete-v0 (time limit 4) of 2 episodes from each of 2 envs; episodes end at
# different steps, so that an env waits for the other.
tiny_args = args_maker(reinforce, env_id="TinyDiscrete-v0", num_envs=2, num_episodes=4, total_timesteps=20,
                       norm_adv=False, eval_episodes=0, cuda=False)


# ---------------------------------------------------------------------------- math


def random_episodes(rng, num_envs, episodes_per_env):
    """Complete episodes laid out as the rollout lays them out: back to back in each env's column,
    padded with junk steps (mask False) after an env has played its share."""
    columns = []
    for _ in range(num_envs):
        episodes = []
        for _ in range(episodes_per_env):
            length = int(rng.integers(1, 9))
            episodes.append(dict(rewards=rng.normal(size=length).tolist(), truncated=bool(rng.random() < 0.5),
                                 final_value=float(rng.normal())))
        columns.append(episodes)
    T = max(sum(len(e["rewards"]) for e in col) for col in columns) + 2  # at least 2 junk steps
    rewards = rng.normal(size=(T, num_envs))  # junk by default
    next_values = rng.normal(size=(T, num_envs)) * 100  # junk: must only be read at truncations
    terminations = rng.random((T, num_envs)) < 0.3
    dones = terminations | (rng.random((T, num_envs)) < 0.3)
    mask = np.zeros((T, num_envs), dtype=bool)
    for env, episodes in enumerate(columns):
        t = 0
        for e in episodes:
            n = len(e["rewards"])
            rewards[t : t + n, env] = e["rewards"]
            terminations[t : t + n, env] = False
            dones[t : t + n, env] = False
            dones[t + n - 1, env] = True
            terminations[t + n - 1, env] = not e["truncated"]
            next_values[t + n - 1, env] = e["final_value"]
            mask[t : t + n, env] = True
            t += n
    return columns, rewards, next_values, terminations, dones, mask


def reward_to_go_reference(episode, gamma):
    """G_t = sum_{k >= t} gamma^(k - t) r_k, plus gamma^(T - t) V(s_T) if the episode was truncated at T."""
    rewards, T = episode["rewards"], len(episode["rewards"])
    tail = episode["final_value"] if episode["truncated"] else 0.0
    return [sum(gamma ** (k - t) * rewards[k] for k in range(t, T)) + gamma ** (T - t) * tail for t in range(T)]


@pytest.mark.parametrize("seed", range(5))
def test_reward_to_go_matches_explicit_sums_per_episode(seed):
    rng = np.random.default_rng(seed)
    columns, rewards, next_values, terminations, dones, mask = random_episodes(rng, num_envs=3, episodes_per_env=3)
    gamma = 0.95
    t = lambda a: torch.as_tensor(a, dtype=torch.float64)
    returns = reinforce.compute_returns(t(rewards), t(next_values), t(terminations), t(dones), gamma).numpy()
    for env, episodes in enumerate(columns):
        expected = [g for e in episodes for g in reward_to_go_reference(e, gamma)]
        np.testing.assert_allclose(returns[mask[:, env], env], expected, rtol=1e-10, atol=1e-10)


def test_reward_to_go_truncation_bootstraps_and_termination_does_not():
    # one env: an episode of 3 steps cut by the time limit (final-observation value 10), then one of
    # 2 steps where the pole fell; the next values are 99 where they must not be used
    terminations, dones = [0.0, 0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0, 1.0]
    returns = one_env_returns(reinforce.compute_returns, [99.0, 99.0, 10.0, 99.0, 99.0], terminations, dones, 0.5)
    assert returns == [3.0, 4.0, 6.0, 1.5, 1.0]
    # without a baseline the rollout passes 0 as the truncated episode's tail: the plain discounted sum
    returns = one_env_returns(reinforce.compute_returns, [0.0] * 5, terminations, dones, 0.5)
    assert returns == [1.75, 1.5, 1.0, 1.5, 1.0]


def test_policy_loss_gradient_is_the_reinforce_estimator():
    # d/dlogits of -A * log softmax(logits)[a] = -A * (onehot(a) - softmax(logits)), averaged over the batch
    logits = torch.tensor([[0.2, -0.4], [1.0, 0.3], [-0.5, 0.5]], dtype=torch.float64, requires_grad=True)
    actions = torch.tensor([0, 1, 1])
    advantages = torch.tensor([1.5, -2.0, 0.5], dtype=torch.float64)
    newlogprob = torch.distributions.Categorical(logits=logits).log_prob(actions)
    reinforce.policy_loss(newlogprob, advantages).backward()
    onehot = torch.nn.functional.one_hot(actions, 2).double()
    expected = -advantages[:, None] * (onehot - logits.detach().softmax(-1)) / 3
    np.testing.assert_allclose(logits.grad.numpy(), expected.numpy(), rtol=1e-10, atol=1e-12)


def test_value_loss_by_hand():
    newvalue = torch.tensor([3.0, 1.0, -1.0], dtype=torch.float64, requires_grad=True)
    returns = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    loss = reinforce.value_loss(newvalue, returns)
    loss.backward()
    assert loss.item() == pytest.approx(0.5 * (4.0 + 0.0 + 4.0) / 3)
    np.testing.assert_allclose(newvalue.grad.numpy(), [2.0 / 3, 0.0, -2.0 / 3])  # (V - G) / n


def test_networks_start_orthogonal_with_the_gains_of_detail_2():
    check_categorical_networks_start_orthogonal(reinforce)


@pytest.mark.parametrize("action, episode_return", GREEDY_EPISODES)
def test_evaluate_plays_the_greedy_action_to_the_end_of_each_episode(action, episode_return):
    check_evaluate_plays_the_greedy_action(reinforce, action, episode_return)


def test_vector_env_resets_in_the_step_that_ends_an_episode_and_records_it():
    check_same_step_autoreset(reinforce.make_vector_env, "TinyDiscrete-v0", [1, 0])


def test_agent_is_two_tanh_layers_and_a_softmax_policy_worked_out_by_hand():
    check_categorical_agent_by_hand(reinforce)


# ---------------------------------------------------------------------------- runs


class TestRuns(CartPoleScriptTests):
    """conftest.CartPoleScriptTests for reinforce.py (its logged episodes: each env's first 2 of a batch), and the
    tests of its short run: its logs and the unusable checkpoints --eval-checkpoint refuses."""

    script, tiny_args, per_env_and_reset = reinforce, staticmethod(tiny_args), 2

    def test_short_run_logs_every_tag(self, short_run, cartpole_run_logs):
        acc = cartpole_run_logs(short_run, SHARED_TAGS, absent=PPO_ONLY_TAGS)
        logged = [e.value for e in acc.Scalars("charts/episodic_return")]
        # a batch is num_episodes complete episodes, all logged, one gradient step each, and the
        # budget of env steps is spent
        num_updates = len(acc.Scalars("losses/policy_loss"))
        assert len(logged) == num_updates * reinforce.Args().num_episodes
        assert acc.Scalars("charts/SPS")[-1].step >= 3000
        # detail 4: each batch runs at (1 - env steps before it / total_timesteps) of the initial rate; a batch's
        # rate is logged at the env step count after it, so the steps before it are the previous entry's
        lr = acc.Scalars("charts/learning_rate")
        steps_before = [0] + [e.step for e in lr[:-1]]
        expected = [reinforce.Args().learning_rate * (1 - step / 3000) for step in steps_before]
        assert [e.value for e in lr] == pytest.approx(expected, rel=1e-6)
        assert len(lr) > 2

    @pytest.mark.parametrize("kind", ["truncated", "corrupt", "foreign", "another network", "a directory"])
    def test_a_checkpoint_this_script_did_not_save_fails_fast(self, short_run, refuses_foreign_checkpoint, kind):
        refuses_foreign_checkpoint(reinforce, small_args, short_run, kind)


def test_batch_is_complete_episodes_from_every_env(tmp_path, monkeypatch):
    # record what the envs returned; every env must contribute exactly its share of episodes per batch
    real_make = reinforce.make_vector_env
    ended = []

    class Record(gym.vector.VectorWrapper):
        def reset(self, **kw):
            ended.append(np.zeros(self.num_envs, dtype=int))
            return self.env.reset(**kw)

        def step(self, actions):
            out = self.env.step(actions)
            ended[-1] += out[2] | out[3]
            return out

    monkeypatch.setattr(reinforce, "make_vector_env", lambda *a: Record(real_make(*a)))
    result = reinforce.main(small_args(tmp_path, num_envs=4, num_episodes=8, eval_episodes=0, save_model=False))
    # each env ends at least its 2 episodes in a batch (more if it waited for the others), and
    # exactly 8 per batch are logged
    assert len(ended) >= 2
    for per_env in ended:
        assert (per_env >= 2).all()
    assert len(result["episodic_returns"]) == 8 * len(ended)


def test_no_baseline_has_no_critic_losses(tmp_path, read_events):
    result = reinforce.main(small_args(tmp_path, baseline=False, eval_episodes=0, save_model=False))
    tags = read_events(result["run_dir"]).Tags()["scalars"]
    for tag in CRITIC_TAGS:
        assert tag not in tags, tag
    assert "losses/policy_loss" in tags


def test_learns_within_60k_steps(tmp_path):
    result = reinforce.main(small_args(tmp_path, total_timesteps=60_000, eval_episodes=0, save_model=False))
    # random play averages ~22; a broken gradient, return or baseline does not get here in 60k steps, while seeds
    # 1-20 end at 255-418 (mean of the last 16 episodes)
    assert np.mean(result["episodic_returns"][-16:]) >= 100


# ---------------------------------------------------------------------------- wiring: what reaches the math




def batch_steps(env, episodes_per_env):
    """The steps that belong to the batch: each env's, up to the end of its episodes_per_env-th episode."""
    ended_before = np.cumsum(env.dones, axis=0) - env.dones
    return ended_before < episodes_per_env


def reward_to_go(env, in_batch, final_values, gamma):
    """G_t = sum_{k >= t} gamma^(k - t) r_k to the end of t's episode, plus gamma^(T - t) final_values[T] if the
    episode was truncated after step T, at every step of the batch (0 elsewhere)."""
    returns = np.zeros(env.rewards.shape)
    for t, i in zip(*np.nonzero(in_batch)):
        end = t + np.argmax(env.dones[t:, i])  # the last step of t's episode
        returns[t, i] = sum(gamma ** (k - t) * env.rewards[k, i] for k in range(t, end + 1))
        if env.truncated[end, i]:
            returns[t, i] += gamma ** (end + 1 - t) * final_values[end, i]
    return returns


def played_batches(watch, args):
    """Per batch: the env's record of it, its steps that belong to the batch, and the returns the agent of
    the batch's compute_returns call should get (V bootstraps a truncation only with --baseline)."""
    batches = []
    for segment, call in enumerate(watch.updates(first="compute_returns")):
        env = watch.rollout(0, len(watch.segments[segment]["rewards"]), segment)
        in_batch = batch_steps(env, args.episodes_per_env)
        final_values = value_of(call[0]["agent"], env.final_obs) if args.baseline else np.zeros(env.rewards.shape)
        batches.append((env, in_batch, reward_to_go(env, in_batch, final_values, args.gamma), call))
    return batches


@pytest.mark.parametrize("kw", [dict(), dict(baseline=False), dict(norm_adv=True)], ids=["baseline", "no-baseline", "norm-adv"])
def test_update_sees_exactly_the_batch_s_complete_episodes(tmp_path, spy, kw):
    watch = spy(reinforce, ["compute_returns", "policy_loss", "value_loss"])
    args = tiny_args(tmp_path, **kw)
    reinforce.main(args)
    batches = played_batches(watch, args)
    assert len(batches) == len(watch.segments) == 2
    for env, in_batch, returns, (returns_call, pg, *vf) in batches:
        got, critic = returns_call["args"], returns_call["agent"]
        np.testing.assert_array_equal(got["rewards"], env.rewards)
        np.testing.assert_array_equal(got["terminations"], env.terminated)  # a truncation is not a termination
        np.testing.assert_array_equal(got["dones"], env.dones)
        cut = env.truncated & in_batch  # bootstrapped with the final observation's value, with a baseline
        expected = value_of(critic, env.final_obs[cut]) if args.baseline else np.zeros(cut.sum())
        np.testing.assert_allclose(got["next_values"][cut], expected, rtol=1e-6, atol=1e-6)
        # the losses see the batch's steps only, in rollout order: reward-to-go minus the baseline's values
        advantages = returns - value_of(critic, env.obs) if args.baseline else returns
        advantages = advantages[in_batch]
        if args.norm_adv:  # detail 7
            advantages = standardized(advantages)
        np.testing.assert_allclose(pg["args"]["advantages"], advantages, rtol=1e-5, atol=1e-5)
        if args.baseline:
            np.testing.assert_allclose(vf[0]["args"]["returns"], returns[in_batch], rtol=1e-5, atol=1e-5)
        else:
            assert vf == []
    # the batches hold every case checked above: a termination, a truncation, an env that waited for the other
    assert any(env.terminated[in_batch].any() for env, in_batch, _, _ in batches)
    assert any(env.truncated[in_batch].any() for env, in_batch, _, _ in batches)
    assert any(not in_batch.all() for _, in_batch, _, _ in batches)


@pytest.mark.parametrize("baseline", [True, False])
def test_update_fits_the_critic_only_as_a_baseline(tmp_path, spy, baseline):
    watch = spy(reinforce, ["compute_returns"])
    args = tiny_args(tmp_path, baseline=baseline)
    reinforce.main(args)
    batches = played_batches(watch, args)
    for batch, (env, in_batch, returns, (call,)) in enumerate(batches):
        after = batches[batch + 1][3][0]["agent"] if batch + 1 < len(batches) else watch.agent
        losses = [np.mean((value_of(agent, env.obs[in_batch]) - returns[in_batch]) ** 2)
                  for agent in (call["agent"], after)]
        if baseline:  # the gradient step lowers the critic's loss on its batch
            assert losses[1] < losses[0]
        else:  # no critic in the loss, so it does not change
            assert losses[1] == losses[0]


def test_entropy_bonus_adds_minus_ent_coef_times_the_entropy_gradient(tmp_path, spy, optimizer_steps, monkeypatch):
    # one batch each, from one seed: the entropy is the mean over the batch's steps
    monkeypatch.setattr(reinforce, "Agent", peaked(reinforce.Agent))
    watch = spy(reinforce, ["compute_returns"])

    def first_batch_obs(args):
        env = watch.rollout(0, len(watch.segments[0]["rewards"]), segment=0)
        return env.obs[batch_steps(env, args.episodes_per_env)]

    check_entropy_bonus_gradient(reinforce.main, watch, optimizer_steps,
                                 lambda name, coef: tiny_args(tmp_path / name, total_timesteps=1, ent_coef=coef),
                                 first_batch_obs)


# ------------------------------------------------------------------ main()'s glue, worked out independently


def batch_rows(watch, args, batches):
    """Per batch of a watched run, its steps that belong to the batch, in the rollout's (step, env) order,
    worked out by the test from the env's own record: the observation and action the agent acted on, the
    log-probability it stored, V(s) by the critic before the update, the reward-to-go, and the advantage
    (return minus V with --baseline, the return without; standardized with --norm-adv); and the number of
    env steps (all envs', waiting ones included) taken before the batch and after it."""
    rows, start = [], 0
    for env, in_batch, returns, (call, *_) in batches:
        T = len(env.rewards)
        acted = watch.acted[start : start + T]
        np.testing.assert_array_equal(np.stack([x for x, _, _ in acted]), env.obs)
        values = value_of(call["agent"], env.obs)
        advantages = (returns - values if args.baseline else returns)[in_batch]
        if args.norm_adv:
            advantages = standardized(advantages)
        rows.append(dict(obs=env.obs[in_batch], actions=np.stack([a for _, a, _ in acted])[in_batch],
                         logprobs=np.stack([lp for _, _, lp in acted])[in_batch], values=values[in_batch],
                         returns=returns[in_batch], advantages=advantages, agent=call["agent"],
                         steps_before=start * args.num_envs, steps_after=(start + T) * args.num_envs))
        start += T
    return rows


@pytest.mark.parametrize("baseline", [True, False], ids=["baseline", "no-baseline"])
def test_main_passes_each_quantity_where_it_belongs(tmp_path, spy, read_events, monkeypatch, baseline):
    """Every value main() hands from the episodes to the losses and the logs, checked against numbers the test
    works out itself, with --norm-adv (of the advantages, or of the returns without a baseline), in a run
    where the wrong wirings differ: 3 batches (the critic has learned, and the learning rate has moved by the
    env steps, waiting ones included), episodes of 3 and 4 steps with gamma 0.8, truncations, terminations
    and envs that wait for the other."""
    monkeypatch.setattr(reinforce, "Agent", leaning(reinforce.Agent))
    watch = spy(reinforce, ["compute_returns", "policy_loss", "value_loss"])
    args = tiny_args(tmp_path, total_timesteps=40, gamma=0.8, learning_rate=1e-2, norm_adv=True,
                     baseline=baseline)
    events = read_events(reinforce.main(args)["run_dir"])
    batches = played_batches(watch, args)
    rows = batch_rows(watch, args, batches)
    # detail 4: the batches run until the env-step budget is spent, and no further
    assert len(rows) == 3
    assert rows[-2]["steps_after"] < args.total_timesteps <= rows[-1]["steps_after"]
    assert any(not in_batch.all() for _, in_batch, _, _ in batches)  # an env waited: its steps count too
    tags = ["charts/learning_rate", "losses/policy_loss", "losses/entropy"]
    tags += ["losses/value_loss", "losses/explained_variance"] if baseline else []
    logged = {tag: events.Scalars(tag) for tag in tags}
    for i, (batch, (_, _, _, (_, pg, *vf))) in enumerate(zip(rows, batches)):
        with torch.no_grad():
            logprob, entropy = softmax_policy_by_hand(batch["agent"], batch["obs"], batch["actions"])
        # the update scores the batch's own states and actions with the parameters that played them
        np.testing.assert_allclose(pg["args"]["newlogprob"], logprob.numpy(), atol=1e-5)
        np.testing.assert_allclose(pg["args"]["newlogprob"], batch["logprobs"], atol=1e-5)
        np.testing.assert_allclose(pg["args"]["advantages"], batch["advantages"], rtol=1e-5, atol=1e-5)
        if baseline:
            np.testing.assert_allclose(vf[0]["args"]["newvalue"], batch["values"], atol=1e-5)
            np.testing.assert_allclose(vf[0]["args"]["returns"], batch["returns"], rtol=1e-5, atol=1e-5)
        # the logs, at the env steps taken so far: the batch's rate, its losses, the entropy, and how much of
        # the returns' variance the baseline explains (detail 12)
        expected = {
            "charts/learning_rate": args.learning_rate * (1 - batch["steps_before"] / args.total_timesteps),
            "losses/policy_loss": -np.mean(batch["advantages"] * logprob.numpy()),
            "losses/entropy": entropy.mean().item(),
            "losses/value_loss": 0.5 * np.mean((batch["values"] - batch["returns"]) ** 2),
            "losses/explained_variance": 1 - np.var(batch["returns"] - batch["values"])
                                         / np.var(batch["returns"]),
        }
        for tag in tags:
            assert logged[tag][i].value == pytest.approx(expected[tag], rel=1e-4, abs=1e-6), tag
            assert logged[tag][i].step == batch["steps_after"], tag
    assert any((batch["obs"][:, 0] == 2).any() for batch in rows)  # where a wrong action's log-prob shows


def test_each_batch_starts_from_new_states_and_only_the_first_reset_is_seeded(tmp_path, spy):
    # CartPole starts each episode at a random state: a reset seeded again for every batch would replay the
    # first batch's start states, while a run stays reproducible from --seed (test_same_seed_same_run)
    watch = spy(reinforce)
    args = small_args(tmp_path, num_envs=2, num_episodes=2, total_timesteps=300, eval_episodes=0,
                      save_model=False)
    reinforce.main(args)
    starts = [segment["obs"][0] for segment in watch.segments]
    assert len(starts) >= 3
    envs = reinforce.make_vector_env(args.env_id, args.num_envs)
    np.testing.assert_array_equal(starts[0], envs.reset(seed=args.seed)[0])
    envs.close()
    for i in range(len(starts)):
        for j in range(i):
            assert not np.isclose(starts[i], starts[j]).any(), (i, j)


@pytest.mark.parametrize("baseline", [True, False], ids=["baseline", "no-baseline"])
def test_each_update_applies_the_gradient_of_the_loss_to_every_parameter(tmp_path, spy, optimizer_steps,
                                                                       monkeypatch, baseline):
    """Details 10 and 13 on every update of a 3-batch run with an entropy bonus and vf_coef 0.7: the gradient
    applied is that of pg_loss - ent_coef * entropy (+ vf_coef * v_loss with --baseline) on the batch's
    steps, worked out in the test from the agent as the update found it (so gradients left over from the
    previous update show); every actor parameter gets a nonzero one, every critic parameter too with a
    baseline and none without; the policy loss and the entropy reach the actor only, the value loss the critic
    only (a baseline that is not detached would)."""
    monkeypatch.setattr(reinforce, "Agent", leaning(reinforce.Agent))
    watch = spy(reinforce, ["compute_returns"])
    args = tiny_args(tmp_path, total_timesteps=40, gamma=0.8, ent_coef=0.1, vf_coef=0.7, learning_rate=1e-2,
                     norm_adv=True, baseline=baseline)
    reinforce.main(args)
    rows = batch_rows(watch, args, played_batches(watch, args))
    assert len(optimizer_steps) == len(rows) == 3
    for step, batch in zip(optimizer_steps, rows):
        agent = copy.deepcopy(batch["agent"])
        logprob, entropy = softmax_policy_by_hand(agent, batch["obs"], batch["actions"])
        loss = -(torch.as_tensor(batch["advantages"]) * logprob.double()).mean()
        loss = loss - args.ent_coef * entropy.double().mean()
        if baseline:
            newvalue = agent.critic(torch.as_tensor(batch["obs"], dtype=torch.float32)).squeeze(-1)
            v_loss = 0.5 * ((newvalue.double() - torch.as_tensor(batch["returns"])) ** 2).mean()
            loss = loss + args.vf_coef * v_loss
        names, params = zip(*agent.named_parameters())
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for name, applied, grad in zip(names, step.grads, grads):
            torch.testing.assert_close(applied, torch.zeros_like(applied) if grad is None else grad,
                                       rtol=1e-3, atol=1e-7)
            # every parameter meant to learn does: the actor's, and the critic's only as a baseline
            assert (applied.abs().max() > 0) == (baseline or name.startswith("actor.")), name
    # which loss reaches which parameters (detail 13: separate networks), through the script's own forward
    agent, batch = copy.deepcopy(rows[0]["agent"]), rows[0]
    check_losses_reach_their_networks(reinforce, agent, batch)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kw, flag", [
    (dict(num_episodes=12, num_envs=8), "--num-episodes"),
    *each_bad_value(num_episodes=0, num_envs=0, gamma=(-0.5, 0.0, 1.5), learning_rate=(0.0, -1e-3)),
    *REFUSED_BY_A2C_AND_REINFORCE,
])
def test_bad_input_fails_fast_naming_the_flag(fails_fast, kw, flag):
    fails_fast(reinforce, small_args, kw, flag)


# ----------------------------------------------------------------------- issue 41: where a value can be wrong


def test_evaluation_episodes_are_independent_draws_from_their_own_seeds():
    check_greedy_evaluation_draws_independent_episodes(reinforce)
