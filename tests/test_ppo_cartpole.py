import numpy as np
import pytest
import torch

import ppo_cartpole
from conftest import (PPO_ONLY_TAGS, SHARED_TAGS, CartPoleScriptTests, GymPPOScriptTests, args_maker,
                      bootstrap_values, cartpole_args, check_categorical_agent_by_hand,
                      check_categorical_networks_start_orthogonal, check_every_quantity_where_it_belongs,
                      check_gae_against_the_explicit_sum, check_greedy_evaluation_draws_independent_episodes,
                      check_one_step_gae, check_ppo_steps_apply_the_clipped_gradient, check_same_step_autoreset,
                      check_the_budget_is_said, each_bad_value, leaning, minibatches_of, peaked, random_rollout,
                      rollout_rows_from, softmax_policy_by_hand, unusable_checkpoint, value_of, walker_agent_pt)

# the runs' arguments: a short CartPole-v1 run, and the wiring tests' runs
small_args = cartpole_args(ppo_cartpole)
# Two updates on conftest.py's TinyDiscrete-v0 (time limit 4): 2 envs x 8 steps, so that the rollouts hold
# terminations, truncations and episodes cut by the end of the rollout.
tiny_args = args_maker(ppo_cartpole, env_id="TinyDiscrete-v0", num_envs=2, num_steps=8, total_timesteps=32,
                       num_minibatches=2, update_epochs=2, eval_episodes=0, cuda=False)


# ---------------------------------------------------------------------------- math


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_explicit_sum_of_td_residuals(seed):
    t = lambda a: np.asarray(a, dtype=np.float64)
    check_gae_against_the_explicit_sum(ppo_cartpole.compute_gae, t, random_rollout(seed), 0.97, 0.9)


def test_gae_truncation_bootstraps_and_termination_does_not():
    # one env, lambda 0: the advantage is the one-step TD residual
    rewards = np.array([[1.0], [1.0], [1.0]])
    values = np.array([[5.0], [5.0], [5.0]])
    next_values = np.array([[7.0], [7.0], [7.0]])
    terminations = np.array([[0.0], [1.0], [0.0]])
    dones = np.array([[1.0], [1.0], [0.0]])  # step 0 truncated, step 1 terminated
    advantages, returns = ppo_cartpole.compute_gae(rewards, values, next_values, terminations, dones, 0.5, 0.0)
    assert returns[:, 0].tolist() == [1.0 + 0.5 * 7.0, 1.0, 1.0 + 0.5 * 7.0]


def surrogate(ratio, advantage, clip_coef=0.2):
    newlogprob = torch.tensor([float(np.log(ratio))], dtype=torch.float64, requires_grad=True)
    logprobs = torch.zeros(1, dtype=torch.float64)
    pg_loss, _, _ = ppo_cartpole.policy_loss(newlogprob, logprobs, torch.tensor([advantage], dtype=torch.float64), clip_coef)
    pg_loss.backward()
    return pg_loss.item(), newlogprob.grad.item()


@pytest.mark.parametrize(
    "ratio, advantage, loss, clipped",
    [
        (1.1, 2.0, -2.2, False),  # A > 0, inside the clip range
        (1.5, 2.0, -2.4, True),  # A > 0, above 1 + eps: the objective is flat, no incentive to go further
        (0.5, 2.0, -1.0, False),  # A > 0, below 1 - eps: the pessimistic (unclipped) term is kept
        (0.9, -2.0, 1.8, False),  # A < 0, inside
        (0.5, -2.0, 1.6, True),  # A < 0, below 1 - eps: flat
        (1.5, -2.0, 3.0, False),  # A < 0, above 1 + eps: the unclipped term is kept
    ],
)
def test_clipped_surrogate_value_and_gradient(ratio, advantage, loss, clipped):
    value, grad = surrogate(ratio, advantage)
    assert value == pytest.approx(loss, abs=1e-12)
    # d(-A * ratio)/d(logprob) = -A * ratio where unclipped; exactly zero where clipped
    if clipped:
        assert grad == 0.0
    else:
        assert grad == pytest.approx(-advantage * ratio, abs=1e-12)


def test_categorical_logprob_entropy_and_sampling():
    torch.manual_seed(0)
    agent = ppo_cartpole.Agent(4, 3)
    with torch.no_grad():  # a policy far from uniform, so that a wrong formula shows
        agent.actor[-1].weight.mul_(300.0)
    x = torch.randn(64, 4, dtype=torch.float64)
    agent = agent.double()
    action = torch.randint(0, 3, (64,))
    _, logprob, entropy, value = agent.get_action_and_value(x, action)
    logits = agent.actor(x)
    reference = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(logprob, reference.log_prob(action))
    torch.testing.assert_close(entropy, reference.entropy())
    # by hand: softmax probabilities
    probs = logits.exp() / logits.exp().sum(-1, keepdim=True)
    torch.testing.assert_close(logprob, probs.gather(-1, action[:, None]).squeeze(-1).log())
    torch.testing.assert_close(entropy, -(probs * probs.log()).sum(-1))
    assert value.shape == (64,) and entropy.min() < 0.5 < entropy.max()
    # the rollout's get_action scores its own sample the same way the update does
    rollout_action, rollout_logprob = agent.get_action(x)
    torch.testing.assert_close(rollout_logprob, agent.get_action_and_value(x, rollout_action)[1])
    # sampling follows the probabilities: empirical frequencies of 20k draws from one state
    one = x[:1].expand(20_000, 4)
    frequencies = torch.bincount(agent.get_action(one)[0], minlength=3).double() / 20_000
    torch.testing.assert_close(frequencies, probs[0], atol=0.015, rtol=0)


def test_final_observations_replaces_autoreset_observations():
    next_obs = np.zeros((3, 2), dtype=np.float32)
    infos = {"final_obs": np.array([None, np.array([7.0, 8.0]), None], dtype=object),
             "_final_obs": np.array([False, True, False])}
    np.testing.assert_array_equal(ppo_cartpole.final_observations(next_obs, infos), [[0, 0], [7, 8], [0, 0]])
    assert not next_obs.any()  # the observations the next step acts on are left alone
    assert ppo_cartpole.final_observations(next_obs, {}) is next_obs


def test_networks_start_orthogonal_with_the_gains_of_detail_2():
    check_categorical_networks_start_orthogonal(ppo_cartpole)


def test_vector_env_resets_in_the_step_that_ends_an_episode_and_records_it():
    check_same_step_autoreset(ppo_cartpole.make_vector_env, "TinyDiscrete-v0", [1, 0])


def test_agent_is_two_tanh_layers_and_a_softmax_policy_worked_out_by_hand():
    agent, x, log_probs = check_categorical_agent_by_hand(ppo_cartpole)
    # the rollout's pass: its sampled actions, each scored by hand
    sampled, sampled_logprob = agent.get_action(x)
    assert sampled.shape == (64,)
    np.testing.assert_allclose(sampled_logprob.detach().numpy(), log_probs[range(64), sampled], rtol=1e-4,
                               atol=1e-5)


def test_gae_of_a_one_step_rollout_is_the_td_residual():
    check_one_step_gae(ppo_cartpole.compute_gae, np.array)


def test_value_loss_clipping():
    newvalue = torch.tensor([3.0], requires_grad=True)
    values, returns = torch.tensor([1.0]), torch.tensor([0.0])
    unclipped = ppo_cartpole.value_loss(newvalue, values, returns, 0.5, clip_vloss=False)
    assert unclipped.item() == pytest.approx(0.5 * 9.0)
    # clipped prediction 1.5 -> error 2.25; the max keeps the larger (unclipped) 9
    assert ppo_cartpole.value_loss(newvalue, values, returns, 0.5, clip_vloss=True).item() == pytest.approx(4.5)
    # a prediction moved past the clip towards a return far away: the clipped error is larger, so no gradient
    newvalue = torch.tensor([3.0], requires_grad=True)
    loss = ppo_cartpole.value_loss(newvalue, torch.tensor([1.0]), torch.tensor([10.0]), 0.5, clip_vloss=True)
    assert loss.item() == pytest.approx(0.5 * (10.0 - 1.5) ** 2)
    loss.backward()
    assert newvalue.grad.item() == 0.0


def test_ratio_is_the_new_probability_over_the_old_one():
    # old log-probabilities that are not 0 (a rollout's are not): a wrong sign in the log-ratio shows
    newlogprob = torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)).requires_grad_()
    logprobs = torch.log(torch.tensor([0.4, 0.6, 0.2], dtype=torch.float64))
    advantages = torch.tensor([1.0, 1.0, -2.0], dtype=torch.float64)
    pg_loss, ratio, logratio = ppo_cartpole.policy_loss(newlogprob, logprobs, advantages, 0.2)
    np.testing.assert_allclose(ratio.detach().numpy(), [1.25, 0.5, 1.0], rtol=1e-12)
    np.testing.assert_allclose(logratio.detach().numpy(), np.log([1.25, 0.5, 1.0]), rtol=1e-12, atol=1e-15)
    # max(-1.25, -1.2) = -1.2 (clipped), max(-0.5, -0.8) = -0.5, max(2, 2) = 2
    assert pg_loss.item() == pytest.approx((-1.2 - 0.5 + 2.0) / 3)
    pg_loss.backward()
    np.testing.assert_allclose(newlogprob.grad.numpy(), [0.0, -0.5 / 3, 2.0 / 3], rtol=1e-12)


def test_value_loss_clipping_on_both_sides_by_hand():
    # the rollout's values are 1 and clip_coef 0.5: a prediction above 1.5, one below 0.5, one inside, and
    # one below whose unclipped error is the larger
    newvalue = torch.tensor([3.0, -1.0, 1.2, 0.2], dtype=torch.float64)
    values = torch.ones(4, dtype=torch.float64)
    returns = torch.tensor([0.0, -3.0, 5.0, 3.0], dtype=torch.float64)
    # unclipped errors 9, 4, 14.44, 7.84; clipped predictions 1.5, 0.5, 1.2, 0.5: errors 2.25, 12.25, 14.44, 6.25
    loss = ppo_cartpole.value_loss(newvalue, values, returns, 0.5, clip_vloss=True)
    assert loss.item() == pytest.approx(0.5 * (9.0 + 12.25 + 14.44 + 7.84) / 4)


# ---------------------------------------------------------------------------- runs


class TestRuns(CartPoleScriptTests):
    """conftest.CartPoleScriptTests for ppo_cartpole.py, and the test of its short run's logs."""

    script, tiny_args = ppo_cartpole, staticmethod(tiny_args)

    def test_short_run_logs_every_tag(self, short_run, cartpole_run_logs):
        acc = cartpole_run_logs(short_run, SHARED_TAGS + PPO_ONLY_TAGS)
        # detail 4: iteration i of n runs at (1 - (i - 1) / n) of the initial rate; n rounded down, as in
        # ppo_walker2d.py
        n, lr = 3000 // (8 * 32), ppo_cartpole.Args().learning_rate
        logged = [e.value for e in acc.Scalars("charts/learning_rate")]
        assert logged == pytest.approx([lr * (1 - i / n) for i in range(n)], rel=1e-6)


def test_learns_within_50k_steps(tmp_path):
    result = ppo_cartpole.main(small_args(tmp_path, total_timesteps=50_000, eval_episodes=0, save_model=False))
    # The mean of the last 30 episodes after 50k steps, seeds 1-20: 100-500 (median 268). Without learning (random
    # play) it is 21-26, with negated advantages 9. A run is reproducible only on one machine (the CPU changes
    # the floating-point path), so the bound leaves room for an unlucky draw on another one.
    assert np.mean(result["episodic_returns"][-30:]) >= 60


# ---------------------------------------------------------------------------- wiring: what reaches the math




def test_rollout_reaches_gae_with_the_right_masks_and_bootstraps(tmp_path, spy):
    watch = spy(ppo_cartpole, ["compute_gae"])
    args = tiny_args(tmp_path)
    ppo_cartpole.main(args)
    assert len(watch.calls) == args.num_iterations
    for iteration, call in enumerate(watch.calls):
        env, got, critic = watch.rollout(iteration * args.num_steps, args.num_steps), call["args"], call["agent"]
        np.testing.assert_array_equal(got["rewards"], env.rewards)
        np.testing.assert_array_equal(got["terminations"], env.terminated)  # a truncation is not a termination
        np.testing.assert_array_equal(got["dones"], env.dones)  # both end the episode for the advantage
        np.testing.assert_allclose(got["values"], value_of(critic, env.obs), rtol=1e-6, atol=1e-6)
        # the value of the state each step reached: the next observation inside an episode and at the end of the
        # rollout, the final observation at a truncation; after a termination it is zeroed, so it may be anything
        expected = bootstrap_values(critic, env)
        np.testing.assert_allclose(got["next_values"][~env.terminated], expected[~env.terminated], rtol=1e-6, atol=1e-6)
    # the rollouts hold every case checked above
    env = watch.rollout(0, args.num_iterations * args.num_steps)
    assert env.terminated.any() and env.truncated.any() and not env.dones[args.num_steps - 1].all()


def test_entropy_bonus_raises_the_entropy(tmp_path, spy, monkeypatch):
    monkeypatch.setattr(ppo_cartpole, "Agent", peaked(ppo_cartpole.Agent))
    watch = spy(ppo_cartpole)
    # one update, with a bonus large enough to outweigh the policy gradient
    ppo_cartpole.main(tiny_args(tmp_path, total_timesteps=16, ent_coef=10.0, learning_rate=1e-2))
    obs = np.concatenate([x for x, _, _ in watch.acted])
    with torch.no_grad():  # by the softmax formula, not the script's categorical_entropy
        entropy = [softmax_policy_by_hand(agent, obs, np.zeros(len(obs)))[1].mean().item()
                   for agent in (watch.initial_agent, watch.agent)]
    assert entropy[1] > entropy[0] + 0.1


def test_learning_rate_is_constant_without_anneal_lr(tmp_path, read_events):
    result = ppo_cartpole.main(tiny_args(tmp_path, anneal_lr=False, learning_rate=3e-3))
    assert [e.value for e in read_events(result["run_dir"]).Scalars("charts/learning_rate")] == pytest.approx([3e-3] * 2)


# ------------------------------------------------------------------ main()'s glue, worked out independently


def rollout_rows(watch, args, iteration, critic):
    """Rollout `iteration` of a watched run, one row per (step, env), worked out by the test from the env's
    own record: the observation and action the agent acted on, the log-probability it stored, V(s) by the
    critic that computed the advantages, the advantage as the explicit sum of discounted TD residuals (the
    bootstrap: V(next observation), V(final observation) at a truncation, nothing after a termination) and
    the return."""
    T = args.num_steps
    env, acted = watch.rollout(iteration * T, T), watch.acted[iteration * T : (iteration + 1) * T]
    obs = np.stack([x for x, _, _ in acted])
    np.testing.assert_array_equal(obs, env.obs)
    values, next_values = value_of(critic, obs), bootstrap_values(critic, env)
    return rollout_rows_from(args, env, acted, obs, values, next_values, env.rewards)


def watched_minibatches(watch, args):
    """minibatches_of a run watched by spy(module, ["compute_gae", "policy_loss", "value_loss"])."""
    return minibatches_of(watch, lambda iteration, critic: rollout_rows(watch, args, iteration, critic))


def test_main_passes_each_quantity_where_it_belongs(tmp_path, spy, read_events, monkeypatch):
    """Every value main() hands from the rollout to the losses and the logs, checked against numbers the test
    works out itself, in a run where the wrong wirings differ: 3 epochs of 4 minibatches (a reused or
    unshuffled minibatch, a value recomputed or not, shows), episodes of 3 and 4 steps with lambda 0.8 (GAE
    is not TD(0)), truncations, terminations and a rollout end inside an episode, 3 updates (the critic has
    learned: values differ from returns), a budget that is not whole batches, and a clip_coef small enough
    that ratios leave the clip range on both sides."""
    monkeypatch.setattr(ppo_cartpole, "Agent", leaning(ppo_cartpole.Agent))
    watch = spy(ppo_cartpole, ["compute_gae", "policy_loss", "value_loss"])
    args = tiny_args(tmp_path, total_timesteps=50, update_epochs=3, num_minibatches=4, clip_coef=0.02,
                     learning_rate=1e-2, gae_lambda=0.8)
    events = read_events(ppo_cartpole.main(args)["run_dir"])
    check_every_quantity_where_it_belongs(events, watch, args, watched_minibatches, softmax_policy_by_hand,
                                          1e-5)


def test_each_step_applies_the_clipped_gradient_of_the_loss_to_every_parameter(tmp_path, spy, optimizer_steps,
                                                                              monkeypatch):
    """check_ppo_steps_apply_the_clipped_gradient on a run of 2 updates x 2 epochs x 2 minibatches with an
    entropy bonus; the policy loss and the entropy reach the actor only, the value loss the critic only (detail
    13: separate networks)."""
    monkeypatch.setattr(ppo_cartpole, "Agent", leaning(ppo_cartpole.Agent))
    watch = spy(ppo_cartpole, ["compute_gae", "policy_loss", "value_loss"])
    args = tiny_args(tmp_path, ent_coef=0.1, clip_coef=0.1, learning_rate=1e-2)
    ppo_cartpole.main(args)
    minibatches = [(rows, mb) for rows, update in watched_minibatches(watch, args) for mb in update]
    check_ppo_steps_apply_the_clipped_gradient(ppo_cartpole, args, optimizer_steps, minibatches,
                                               softmax_policy_by_hand, torch.long, ("actor.", "actor.", "critic."))


# ---------------------------------------------------------------------------- bad input


# FrozenLake-v1's observations are Discrete, where the MLP needs a flat Box; a max_grad_norm of 0 would zero every
# gradient, a negative one flip it; 100 steps are less than one batch of 8 x 32
@pytest.mark.parametrize("kw, flag", each_bad_value(
    num_minibatches=3, env_id=("Pendulum-v1", "NoSuchEnv-v0", "FrozenLake-v1"), gamma=(1.5, 0.0),
    gae_lambda=(-0.1, 0.0, 1.5), learning_rate=(0.0, -1e-3), clip_coef=(0.0, -0.2), max_grad_norm=(0.0, -1.0),
    total_timesteps=(0, -5, 100), eval_checkpoint="/no/such/agent.pt"))
def test_bad_input_fails_fast_naming_the_flag(fails_fast, kw, flag):
    fails_fast(ppo_cartpole, small_args, kw, flag)


def test_a_budget_that_is_not_whole_batches_says_how_many_steps_run(tmp_path, capsys):
    # 512: 2 whole batches of 8 x 32; 600 is rounded down
    whole, partial = (small_args(tmp_path, total_timesteps=512),
                      small_args(tmp_path, total_timesteps=600, eval_episodes=0, save_model=False))
    check_the_budget_is_said(ppo_cartpole.check_args, ppo_cartpole.main, capsys, whole, partial, 256, 2)



@pytest.mark.parametrize("kind", ["truncated", "corrupt", "foreign", "another network"])
def test_a_checkpoint_this_script_did_not_save_fails_fast(tmp_path, fails_fast, kind):
    saved = ppo_cartpole.save_agent(ppo_cartpole.Agent(4, 2), ppo_cartpole.Args(), 4, 2, str(tmp_path))
    path = unusable_checkpoint(kind, saved, walker_agent_pt(tmp_path / "walker"), tmp_path / "bad.pt")
    fails_fast(ppo_cartpole, small_args, dict(eval_checkpoint=str(path)),
               "--eval-checkpoint .* pass an agent.pt saved by ppo_cartpole.py --save-model")


# ----------------------------------------------------------------------- issue 41: where a value can be wrong


def test_evaluation_episodes_are_independent_draws_from_their_own_seeds():
    check_greedy_evaluation_draws_independent_episodes(ppo_cartpole)


# --------------------------------------------------------- what both gym PPO scripts must pass (conftest.py)


class TestAsEveryGymPPOScript(GymPPOScriptTests):
    """Each update scored by the policy that acted, gradient clipping, --clip-vloss and --target-kl."""

    script, tiny_args, logprob_atol = ppo_cartpole, staticmethod(tiny_args), 1e-6
