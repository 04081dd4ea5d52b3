"""Proximal Policy Optimization (PPO) with a diagonal Gaussian policy on MuJoCo Walker2d-v5.

Papers: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (arXiv:1707.06347); GAE from
Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage Estimation".
Structure after CleanRL's `ppo_continuous_action.py`; details numbered after Huang et al. 2022, "The 37
Implementation Details of Proximal Policy Optimization". Any env with a Box action space works.
Results, and why the defaults differ from CleanRL's: docs/results/ppo_walker2d.md.

Usage:
    python ppo_walker2d.py --seed 1
    python ppo_walker2d.py --save-model --capture-video      # agent.pt and evaluation videos in the run dir
    python ppo_walker2d.py --eval-checkpoint runs/<run_name>/agent.pt [--eval-sample]
    python ppo_walker2d.py --env-id Hopper-v5 --gamma 0.99
    tensorboard --logdir runs

What the code computes, with the names it uses (t is a step, one rollout holds num_steps x num_envs):
    actions_t    ~ Normal(mu(s_t), exp(actor_logstd))    (one independent Normal per action dimension)
    logprobs_t   = sum_i [-(a_i - mu_i)^2 / (2 sigma_i^2) - log sigma_i - log(2 pi) / 2]
    entropy      = sum_i [1/2 + log(2 pi) / 2 + log sigma_i]
    delta_t      = rewards_t + gamma * (1 - terminations_t) * next_values_t - values_t
    advantages_t = delta_t + gamma * gae_lambda * (1 - dones_t) * advantages_{t+1}
    returns_t    = advantages_t + values_t
    ratio        = pi(a_t | s_t) / pi_old(a_t | s_t) = exp(newlogprob - logprobs)
    pg_loss      = mean(max(-A * ratio, -A * clip(ratio, 1 - clip_coef, 1 + clip_coef)))
    v_loss       = 0.5 * mean((V - R)^2)    (or the clipped form with --clip-vloss)
    loss         = pg_loss - ent_coef * entropy + vf_coef * v_loss
s_t is the normalized observation, rewards_t the scaled reward (details 19-22), next_values_t the value of
the state the env reached after step t (the final observation if the episode ended at t).

Implementation details, each marked "detail N" where it happens:
 1. Vectorized environments: num_envs walkers stepped in lockstep, one batched forward pass per step.
 2. Orthogonal weight init (gain sqrt(2) hidden, 0.01 policy head, 1 value head), constant (zero) bias.
 3. Adam with eps 1e-5.
 4. Learning rate annealed linearly to 0.
 5. Generalized Advantage Estimation (gamma, gae_lambda).
 6. Minibatch updates: update_epochs passes over the shuffled batch in num_minibatches pieces.
 7. Advantage normalization, per minibatch.
 8. Clipped surrogate objective.
 9. Value-loss clipping (--clip-vloss).
10. Overall loss pg_loss - ent_coef * entropy + vf_coef * v_loss; the entropy bonus is off by default.
11. Global gradient-norm clipping.
12. Debug variables: old_approx_kl, approx_kl (the k3 estimator), clipfrac, explained_var.
13. Separate policy and value networks.
14. Actions drawn from a Normal distribution whose mean is the actor's output.
15. State-independent log standard deviation: one learned parameter per action dimension.
16. Independent action components: the log-probability is summed over the dimensions.
17. Separate MLPs for policy and value, 64x64 tanh each.
18. Actions clipped to the bounds only when sent to the env; the unclipped sample is stored and scored.
19. Observation normalization by a running mean and variance,
20. then clipping to [-obs_clip, obs_clip].
21. Reward scaling: rewards divided by the running std of the discounted return,
22. then clipped to [-reward_clip, reward_clip].
Gymnasium 1.x correctness, marked "detail GN":
G1. SAME_STEP autoreset: the finished episode's last observation comes from infos["final_obs"].
G2. Truncation is not termination: a time-limit cut is bootstrapped with V(final_obs); terminations
    zero the bootstrap, dones (termination or truncation) stop GAE at the episode boundary.
G3. Episode statistics from the vector RecordEpisodeStatistics wrapper, on the raw rewards.
G4. One set of normalization statistics, kept in this script rather than in per-env wrappers, applied
    to final_obs too and saved with the weights; evaluation freezes them.
"""

import os
import random
import sys
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    """Defaults that differ from CleanRL's, and why: docs/results/ppo_walker2d.md#why-these-defaults"""

    # experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]  # part of the run directory name
    seed: int = 1  # seed of python, numpy, torch and the environments
    torch_deterministic: bool = True  # if toggled, `torch.backends.cudnn.deterministic=True`
    cuda: bool = True  # if toggled and a GPU is available, train on it
    num_threads: int = 1  # torch CPU threads; 1 is fastest for a small MLP, busy machine or not
    runs_dir: str = "runs"  # TensorBoard logs and saved agents go to <runs_dir>/<run_name>/
    save_model: bool = False  # save the agent and its normalization statistics to <run dir>/agent.pt
    eval_episodes: int = 10  # episodes evaluated after training, mean action unless --eval-sample (0: none)
    eval_sample: bool = False  # evaluate with actions sampled as in training, not the mean action
    eval_checkpoint: str | None = None  # a saved agent.pt: evaluate it for --eval-episodes and exit
    capture_video: bool = False  # record the evaluation episodes to videos/ (needs moviepy, EGL or OSMesa)

    # environment
    env_id: str = "Walker2d-v5"  # the id of the environment (its action space must be a Box)
    total_timesteps: int = 1_000_000  # total environment steps, summed over all envs
    num_envs: int = 8  # parallel environments (CleanRL: 1; 8 episodes in flight decorrelate the batch)
    num_steps: int = 256  # steps per env per rollout (CleanRL: 2048; 8 x 256 is the same batch size)
    obs_clip: float = 10.0  # normalized observations are clipped to [-obs_clip, obs_clip]
    reward_clip: float = 10.0  # scaled rewards are clipped to [-reward_clip, reward_clip]

    # algorithm
    learning_rate: float = 6e-4  # the learning rate (CleanRL: 3e-4; restores the step fewer minibatches lose)
    anneal_lr: bool = True  # anneal the learning rate linearly to 0
    gamma: float = 0.995  # discount (CleanRL: 0.99; a longer horizon makes falls cost more; Hopper: 0.99)
    gae_lambda: float = 0.95  # the lambda of generalized advantage estimation
    num_minibatches: int = 8  # per batch (CleanRL: 32; larger ones cost the same per step on a CPU)
    update_epochs: int = 10  # the number of passes over each batch
    norm_adv: bool = True  # normalize the advantages of each minibatch
    clip_coef: float = 0.2  # the surrogate clipping coefficient
    clip_vloss: bool = False  # clipped value loss (CleanRL: on; no help, it slows the critic)
    ent_coef: float = 0.0  # coefficient of the entropy bonus
    vf_coef: float = 0.25  # coefficient of the value loss (CleanRL: 0.5; Tianshou's MuJoCo PPO: 0.25)
    max_grad_norm: float = 0.5  # the maximum norm of the global gradient
    target_kl: float | None = None  # stop an update's epochs once approx_kl exceeds this (None: never)
    init_log_std: float = -0.5  # initial log std (CleanRL: 0; less flailing, the walker stays up sooner)

    # computed in check_args
    batch_size: int = 0  # computed: num_envs * num_steps
    minibatch_size: int = 0  # computed: batch_size // num_minibatches
    num_iterations: int = 0  # computed: total_timesteps // batch_size


def make_env(env_id: str):
    def thunk():
        # speed: no env checker wrapper (it only inspects the first steps), no info dict (DropInfo, below)
        return DropInfo(gym.make(env_id, disable_env_checker=True))

    return thunk


def make_vector_env(env_id: str, num_envs: int):
    # details 1, G1 and G3: lockstep envs that reset inside the step that ends an episode (SAME_STEP),
    # with raw episode returns and lengths recorded on the vector env
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def final_observations(next_obs: np.ndarray, infos: dict) -> np.ndarray:
    """Detail G1: the observations the envs really reached: `next_obs`, except where an episode ended and
    the SAME_STEP autoreset replaced it by the next episode's first one; there, `infos["final_obs"]`."""
    if "_final_obs" not in infos:
        return next_obs
    real_next_obs = next_obs.copy()
    for i in np.flatnonzero(infos["_final_obs"]):
        real_next_obs[i] = infos["final_obs"][i]
    return real_next_obs


class RunningMeanStd:
    """Running mean and variance of a stream of batches (Chan et al.'s parallel update), in float64."""

    def __init__(self, shape=()):
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = 1e-4

    def update(self, x: np.ndarray) -> None:
        batch_count = x.shape[0]
        batch_mean = x.sum(axis=0) / batch_count
        # x.mean(axis=0) and x.var(axis=0) to the bit, the mean computed once (np.var computes it again): this
        # runs twice a rollout step, for the observations and the discounted returns
        batch_var = ((x - batch_mean) ** 2).sum(axis=0) / batch_count
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.var = m2 / total
        self.count = total


def normalize_obs(obs: np.ndarray, obs_rms: RunningMeanStd, clip: float) -> np.ndarray:
    """Details 19-20: standardize with the running statistics, then clip. float32 out, for the networks."""
    return np.clip((obs - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -clip, clip).astype(np.float32)


class RewardScaler:
    """Details 21-22: divide rewards by the running std of each env's discounted return, then clip.

    One `RunningMeanStd` over all envs' discounted returns (detail G4); each env keeps its own return,
    reset to 0 when its episode ends. The mean is not subtracted: that would change the optimal policy.
    """

    def __init__(self, num_envs: int, gamma: float, clip: float):
        self.return_rms = RunningMeanStd(())
        self.discounted_return = np.zeros(num_envs)
        self.gamma, self.clip = gamma, clip

    def __call__(self, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        self.discounted_return = self.discounted_return * self.gamma + rewards
        self.return_rms.update(self.discounted_return)
        self.discounted_return[dones] = 0.0
        return np.clip(rewards / np.sqrt(self.return_rms.var + 1e-8), -self.clip, self.clip)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    # detail 2: orthogonal init
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, out_dim: int, out_std: float) -> nn.Sequential:
    """Two hidden layers of 64 tanh units; the output layer initialized with gain `out_std` (detail 2)."""
    return nn.Sequential(
        layer_init(nn.Linear(in_dim, 64)), nn.Tanh(),
        layer_init(nn.Linear(64, 64)), nn.Tanh(),
        layer_init(nn.Linear(64, out_dim), std=out_std),
    )


def gaussian_logprob(mean, logstd, action):
    """Detail 16: log-density of independent Normals, summed over the action dimensions."""
    return (-0.5 * ((action - mean) / logstd.exp()) ** 2 - logstd - 0.5 * np.log(2 * np.pi)).sum(-1)


def gaussian_entropy(logstd):
    """Entropy of independent Normals, summed over the action dimensions."""
    return (0.5 + 0.5 * np.log(2 * np.pi) + logstd).sum(-1)


class Agent(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, init_log_std: float = 0.0):
        super().__init__()
        # details 13 and 17: separate actor and critic MLPs
        self.critic = mlp(obs_dim, 1, out_std=1.0)
        self.actor_mean = mlp(obs_dim, act_dim, out_std=0.01)
        # detail 15: the log-std is a parameter, not an output: the same for every state
        self.actor_logstd = nn.Parameter(torch.full((1, act_dim), float(init_log_std)))

    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def get_action(self, x):
        """The rollout's forward pass: a sampled action and its log-probability, without the critic."""
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action = action_mean + action_logstd.exp() * torch.randn_like(action_mean)  # detail 14
        return action, gaussian_logprob(action_mean, action_logstd, action)

    def get_action_and_value(self, x, action):
        """The update's forward pass: the stored action, its new log-probability, the entropy, the value."""
        action_mean = self.actor_mean(x)
        logprob = gaussian_logprob(action_mean, self.actor_logstd.expand_as(action_mean), action)
        # the entropy does not depend on the state: computed once, broadcast to the batch
        entropy = gaussian_entropy(self.actor_logstd).expand(action_mean.shape[0])
        return action, logprob, entropy, self.get_value(x)

    def mean_action(self, x):
        return self.actor_mean(x)


def compute_gae(rewards, values, next_values, terminations, dones, gamma, gae_lambda):
    """Generalized advantage estimates (detail 5) for a rollout of shape (num_steps, num_envs), in numpy.

    next_values[t] is the value of the state reached after step t (the final observation's value
    if the episode ended at t). terminations[t] zeroes that bootstrap (the episode really ended);
    dones[t] (termination or truncation) stops the recursion: step t+1 belongs to a new episode.
    The last step of the rollout is bootstrapped with next_values and nothing flows in after it.
    """
    advantages = np.zeros_like(rewards)
    lastgaelam = np.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        # detail G2: only a true termination zeroes the bootstrap; a truncation keeps next_values
        delta = rewards[t] + gamma * (1.0 - terminations[t]) * next_values[t] - values[t]
        lastgaelam = delta + gamma * gae_lambda * (1.0 - dones[t]) * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def policy_loss(newlogprob, logprobs, advantages, clip_coef):
    """Clipped surrogate objective (detail 8), as a loss to minimize. Returns (pg_loss, ratio, logratio)."""
    logratio = newlogprob - logprobs
    ratio = logratio.exp()
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    return torch.max(pg_loss1, pg_loss2).mean(), ratio, logratio


def value_loss(newvalue, values, returns, clip_coef, clip_vloss):
    """Squared-error value loss, optionally clipped around the rollout's values (detail 9)."""
    v_loss_unclipped = (newvalue - returns) ** 2
    if not clip_vloss:
        return 0.5 * v_loss_unclipped.mean()
    v_clipped = values + torch.clamp(newvalue - values, -clip_coef, clip_coef)
    v_loss_clipped = (v_clipped - returns) ** 2
    return 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()


def main(args: Args) -> dict:
    # 1. setup
    check_args(args)
    torch.set_num_threads(args.num_threads)  # a small MLP runs fastest on one thread, busy machine or not
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate_checkpoint(args, device)

    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join(args.runs_dir, run_name)
    writer = SummaryWriter(run_dir)
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n"
                    + "\n".join(f"|{key}|{value}|" for key, value in vars(args).items()))

    video_dir = video_dir_or_none(args.capture_video, args.env_id, os.path.join(run_dir, "videos"))
    envs = make_vector_env(args.env_id, args.num_envs)
    obs_dim = envs.single_observation_space.shape[0]
    act_dim = envs.single_action_space.shape[0]
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high
    agent = Agent(obs_dim, act_dim, args.init_log_std).to(device)
    # detail 3; fused: one kernel for all parameters instead of a dozen small ops each
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    obs_rms = RunningMeanStd(obs_dim)  # detail G4: one set of statistics for all envs
    reward_scaler = RewardScaler(args.num_envs, args.gamma, args.reward_clip)

    # rollout storage in numpy (cheaper per-step writes than torch); the batch moves to torch once per rollout
    obs = np.zeros((args.num_steps, args.num_envs, obs_dim), dtype=np.float32)
    actions = np.zeros((args.num_steps, args.num_envs, act_dim), dtype=np.float32)
    logprobs = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    terminations = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    # final observations of the episodes cut by the time limit, kept for the bootstrap (detail G2)
    final_obs = np.zeros((args.num_steps, args.num_envs, obs_dim), dtype=np.float32)

    def to_torch(x):
        return torch.as_tensor(x, device=device)

    episodic_returns, eval_returns = [], []
    global_step, interrupted = 0, False
    rollout_time = update_time = 0.0
    start_time, start_cpu = time.time(), time.process_time()
    next_obs_raw, _ = envs.reset(seed=args.seed)
    envs.action_space.seed(args.seed)
    obs_rms.update(next_obs_raw)
    next_obs = normalize_obs(next_obs_raw, obs_rms, args.obs_clip)
    try:
        for iteration in range(1, args.num_iterations + 1):
            if args.anneal_lr:  # detail 4
                lrnow = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate
                optimizer.param_groups[0]["lr"] = lrnow

            # 2. rollout
            rollout_start = time.perf_counter()
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                with torch.inference_mode():  # the actor only: the critic's values come after the rollout
                    action, logprob = agent.get_action(to_torch(next_obs))
                actions[step], logprobs[step] = action.cpu().numpy(), logprob.cpu().numpy()

                # detail 18: the env gets the clipped action, the buffer keeps the sampled one
                next_obs_raw, reward, terminated, truncated, infos = envs.step(
                    np.clip(actions[step], action_low, action_high)
                )
                done = np.logical_or(terminated, truncated)
                rewards[step] = reward_scaler(reward, done)
                terminations[step], dones[step] = terminated, done
                cut = truncated & ~terminated
                if cut.any():  # details G1, G2 and G4: the final observation, normalized like the others
                    real_next_obs = final_observations(next_obs_raw, infos)
                    final_obs[step, cut] = normalize_obs(real_next_obs, obs_rms, args.obs_clip)[cut]
                obs_rms.update(next_obs_raw)
                next_obs = normalize_obs(next_obs_raw, obs_rms, args.obs_clip)
                if "_episode" in infos:  # detail G3
                    for i in np.flatnonzero(infos["_episode"]):
                        episodic_return = float(infos["episode"]["r"][i])
                        episodic_returns.append(episodic_return)
                        writer.add_scalar("charts/episodic_return", episodic_return, global_step)
                        writer.add_scalar("charts/episodic_length", infos["episode"]["l"][i], global_step)
            rollout_time += time.perf_counter() - rollout_start

            # 3. advantages
            update_start = time.perf_counter()
            # the critic is fixed during the rollout: one batched pass gives the values of all its states
            cut = (dones == 1) & (terminations == 0)
            with torch.inference_mode():
                states = np.concatenate([obs.reshape(-1, obs_dim), next_obs, final_obs[cut]])
                all_values = agent.get_value(to_torch(states)).cpu().numpy()
            values, last_values, cut_values = np.split(
                all_values, [args.batch_size, args.batch_size + args.num_envs]
            )
            values = values.reshape(args.num_steps, args.num_envs)
            # the state after step t is obs[t + 1] unless the episode ended at t (detail G1)
            next_values = np.concatenate([values[1:], last_values[None]])
            next_values[cut] = cut_values  # detail G2
            advantages, returns = compute_gae(  # detail 5
                rewards, values, next_values, terminations, dones, args.gamma, args.gae_lambda
            )

            b_obs = to_torch(obs.reshape((-1, obs_dim)))
            b_actions = to_torch(actions.reshape((-1, act_dim)))
            b_logprobs = to_torch(logprobs.reshape(-1))
            b_advantages = to_torch(advantages.reshape(-1))
            b_returns = to_torch(returns.reshape(-1))
            b_values = to_torch(values.reshape(-1))

            # 4. update
            clipfracs = []
            for epoch in range(args.update_epochs):
                b_inds = torch.randperm(args.batch_size, device=device)
                for start in range(0, args.batch_size, args.minibatch_size):  # detail 6
                    mb_inds = b_inds[start : start + args.minibatch_size]
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                        b_obs[mb_inds], b_actions[mb_inds]
                    )
                    mb_advantages = b_advantages[mb_inds]
                    if args.norm_adv:  # detail 7
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                    pg_loss, ratio, logratio = policy_loss(
                        newlogprob, b_logprobs[mb_inds], mb_advantages, args.clip_coef
                    )
                    v_loss = value_loss(
                        newvalue, b_values[mb_inds], b_returns[mb_inds], args.clip_coef, args.clip_vloss
                    )
                    entropy_loss = entropy.mean()
                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef  # detail 10

                    with torch.no_grad():  # detail 12
                        old_approx_kl = (-logratio).mean()
                        approx_kl = ((ratio - 1) - logratio).mean()
                        clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean())

                    optimizer.zero_grad()
                    loss.backward()
                    # detail 11: the gradient of all parameters together clipped to norm max_grad_norm
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
                    optimizer.step()

                if args.target_kl is not None and approx_kl > args.target_kl:
                    break

            y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
            var_y = np.var(y_true)
            explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y  # detail 12
            update_time += time.perf_counter() - update_start

            # 5. logging
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
            writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
            writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
            writer.add_scalar("losses/clipfrac", torch.stack(clipfracs).mean().item(), global_step)
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            writer.add_scalar("charts/SPS", int(global_step / (time.time() - start_time)), global_step)
            writer.add_scalar("charts/rollout_time", rollout_time, global_step)
            writer.add_scalar("charts/update_time", update_time, global_step)
            if iteration % 20 == 0 or iteration == args.num_iterations:
                print(f"global_step={global_step} SPS={int(global_step / (time.time() - start_time))} "
                      f"mean return (last 100 episodes)={np.mean(episodic_returns[-100:] or [np.nan]):.1f}")
    except KeyboardInterrupt:
        interrupted = True
        print(f"interrupted at global_step={global_step}: keeping the logs, skipping evaluation")
    finally:
        envs.close()
    elapsed = time.time() - start_time
    # CPU seconds of this process: the speed it would have alone on a core, when others share the machine
    print(f"{global_step} steps in {elapsed:.1f} s ({global_step / elapsed:.0f} steps/s, "
          f"{global_step / (time.process_time() - start_cpu):.0f} per CPU second; "
          f"rollout {rollout_time:.1f} s, update {update_time:.1f} s); "
          f"mean return of the last 100 episodes: {np.mean(episodic_returns[-100:] or [np.nan]):.1f}")

    # 6. save / evaluate
    try:
        if args.save_model:
            save_agent(agent, obs_rms, reward_scaler, args, obs_dim, act_dim, run_dir,
                       global_step if interrupted else None)
        if args.eval_episodes > 0 and not interrupted:
            eval_returns = evaluate(agent, obs_rms, args.obs_clip, args.env_id, args.eval_episodes,
                                    args.seed + 100_000, device, video_dir, args.eval_sample)
            for i, eval_return in enumerate(eval_returns):
                writer.add_scalar("eval/episodic_return", eval_return, i)
            print(f"eval ({eval_mode(args)}): {np.mean(eval_returns):.2f} +- {np.std(eval_returns):.2f} "
                  f"over {len(eval_returns)} episodes")
    except KeyboardInterrupt:  # a Ctrl-C while saving or evaluating
        print("interrupted while saving or evaluating: keeping the logs, skipping the rest")
        interrupted = True
    finally:
        writer.close()
    return {"run_dir": run_dir, "episodic_returns": episodic_returns, "eval_returns": eval_returns,
            "rollout_time": rollout_time, "update_time": update_time, "interrupted": interrupted}


# Plumbing below: argument checks, evaluation, checkpoints, videos, DropInfo. Skippable on a first reading.

def check_args(args: Args) -> None:
    """Fill in the derived sizes, reject bad input with a one-line message, say what will run."""

    def fail(msg):
        raise SystemExit(f"error: {msg}")

    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "num_threads",
                "learning_rate", "clip_coef", "max_grad_norm")
    for flag in positive:
        if not getattr(args, flag) > 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    for flag in ("gamma", "gae_lambda"):
        if not 0.0 < getattr(args, flag) <= 1.0:
            fail(f"--{flag.replace('_', '-')} must be in (0, 1], got {getattr(args, flag)}")
    if args.eval_episodes < 0:
        fail(f"--eval-episodes must be >= 0, got {args.eval_episodes}")
    if args.eval_checkpoint is not None:
        if args.eval_episodes == 0:
            fail("--eval-checkpoint needs --eval-episodes of at least 1")
        if not os.path.isfile(args.eval_checkpoint):
            fail(f"--eval-checkpoint {args.eval_checkpoint} is not a file; pass the path of a saved agent.pt")
        return
    try:
        env = gym.make(args.env_id)
    except gym.error.Error as e:
        fail(f"--env-id {args.env_id} cannot be made ({e.__class__.__name__}); pass a registered gym id")
    action_space, observation_space = env.action_space, env.observation_space
    env.close()
    if not isinstance(action_space, gym.spaces.Box):
        fail(f"--env-id {args.env_id} has a {type(action_space).__name__} action space; this script needs "
             "a Box one (use ppo_cartpole.py for discrete actions)")
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        fail(f"--env-id {args.env_id} has {observation_space} observations; this script's MLP needs flat "
             "(1-d) Box observations")
    args.batch_size = args.num_envs * args.num_steps
    if args.batch_size % args.num_minibatches != 0:
        fail(f"--num-minibatches {args.num_minibatches} does not divide the batch size {args.batch_size} "
             "(--num-envs x --num-steps); choose a divisor")
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations == 0:
        fail(f"--total-timesteps {args.total_timesteps} is less than one batch ({args.batch_size}); raise it")


def eval_mode(args: Args) -> str:
    return "sampled actions" if args.eval_sample else "mean action"


def evaluate(agent, obs_rms, obs_clip, env_id, episodes, seed, device, video_dir=None, sample=False):
    """Returns of `episodes` episodes of the mean action (`sample`: of sampled actions) on fresh, seeded envs.

    The normalization statistics are frozen (read, never updated), as they were saved (detail G4).
    """
    env = gym.make(env_id, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        env = gym.wrappers.RecordVideo(env, video_dir, disable_logger=True)
    low, high = env.action_space.low, env.action_space.high
    episodic_returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, total = False, 0.0
        while not done:
            with torch.inference_mode():
                x = torch.as_tensor(normalize_obs(obs, obs_rms, obs_clip), device=device)
                action = (agent.get_action(x[None])[0][0] if sample else agent.mean_action(x)).cpu().numpy()
            obs, reward, terminated, truncated, _ = env.step(np.clip(action, low, high))
            total += float(reward)
            done = terminated or truncated
        episodic_returns.append(total)
    env.close()
    return episodic_returns


def rms_state(rms: RunningMeanStd) -> dict:
    # tensors, so that torch.load(weights_only=True) can read the checkpoint back
    return {"mean": torch.tensor(rms.mean), "var": torch.tensor(rms.var), "count": rms.count}


def save_agent(agent, obs_rms, reward_scaler, args, obs_dim, act_dim, run_dir, interrupted_at=None):
    path = os.path.join(run_dir, "agent.pt")
    checkpoint = {
        "model": agent.state_dict(),
        "obs_rms": rms_state(obs_rms),  # detail G4: without these the saved agent sees other inputs
        "return_rms": rms_state(reward_scaler.return_rms),
        "obs_dim": obs_dim,
        "act_dim": act_dim,
        "env_id": args.env_id,
        "obs_clip": args.obs_clip,
        "args": vars(args),
        "interrupted_at": interrupted_at,  # the step of a Ctrl-C, or None
    }
    torch.save(checkpoint, path)
    print(f"agent saved to {path}")
    return path


def load_agent(path, device):
    """The agent, statistics and checkpoint save_agent wrote to `path`; a one-line error for other files."""
    fix = "pass an agent.pt saved by ppo_walker2d.py --save-model"
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or corrupt file fails in the zip reader or the unpickler
        raise SystemExit(f"error: --eval-checkpoint {path} cannot be read ({e.__class__.__name__}); {fix}")
    try:  # e.g. ppo_cartpole.py's agent.pt holds a Categorical policy: n_actions, no act_dim or statistics
        agent = Agent(checkpoint["obs_dim"], checkpoint["act_dim"])
        agent.load_state_dict(checkpoint["model"])  # raises on missing, unexpected or mis-shaped weights
        obs_rms, saved_rms = RunningMeanStd(checkpoint["obs_dim"]), checkpoint["obs_rms"]
        obs_rms.mean, obs_rms.var = saved_rms["mean"].numpy(), saved_rms["var"].numpy()
        obs_rms.count = float(saved_rms["count"])
        gym.spec(checkpoint["env_id"]), float(checkpoint["obs_clip"])
    except Exception as e:
        what = f"no {e}" if isinstance(e, KeyError) else e.__class__.__name__
        raise SystemExit(f"error: --eval-checkpoint {path} is not an agent.pt of ppo_walker2d.py ({what}); "
                         f"{fix}")
    return agent.to(device), obs_rms, checkpoint


def evaluate_checkpoint(args: Args, device) -> dict:
    """--eval-checkpoint: evaluate a saved agent on its own env with its own statistics; no training."""
    agent, obs_rms, checkpoint = load_agent(args.eval_checkpoint, device)
    # beside the checkpoint, in a new folder: the videos of the training run's own evaluation stay
    video_dir = video_dir_or_none(args.capture_video, checkpoint["env_id"], os.path.join(
        os.path.dirname(args.eval_checkpoint), f"videos_eval_checkpoint_{int(time.time())}"))
    eval_returns = evaluate(agent, obs_rms, checkpoint["obs_clip"], checkpoint["env_id"], args.eval_episodes,
                            args.seed + 100_000, device, video_dir, args.eval_sample)
    print(f"eval ({eval_mode(args)}) of {args.eval_checkpoint}: {np.mean(eval_returns):.2f} "
          f"+- {np.std(eval_returns):.2f} over {len(eval_returns)} episodes")
    return {"eval_returns": eval_returns}


def video_problem(env_id: str) -> str | None:
    """None if evaluation episodes can be recorded headless here, else what to install."""
    try:
        import moviepy  # noqa: F401  (gymnasium's RecordVideo writes the mp4 files with it)
    except ImportError as e:
        return f"the Python package moviepy cannot be imported ({e}): pip install moviepy"
    try:
        env = gym.make(env_id, render_mode="rgb_array")
        env.reset(seed=0)
        env.render()
        env.close()
    except Exception as e:  # each backend fails in its own way (ImportError, AttributeError, RuntimeError)
        return (f"headless rendering with MUJOCO_GL={os.environ.get('MUJOCO_GL')} failed "
                f"({e.__class__.__name__}: {e}); install EGL (apt-get install libegl1) or OSMesa "
                "(apt-get install libosmesa6) and set MUJOCO_GL=egl or MUJOCO_GL=osmesa")
    return None


def video_dir_or_none(capture_video: bool, env_id: str, video_dir: str) -> str | None:
    """`video_dir` if evaluation videos can be recorded, else None (with a message saying what is missing)."""
    if not capture_video:
        return None
    os.environ.setdefault("MUJOCO_GL", "egl")  # headless MuJoCo rendering; read when a renderer is made
    problem = video_problem(env_id)
    if problem is not None:
        print(f"--capture-video: recording no video: {problem}")
        return None
    return video_dir


class DropInfo(gym.Wrapper):
    """Drops the per-step info dict (reward terms, positions), unused here: merging it into arrays
    costs the vector env a noticeable share of the physics' time."""

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return obs, reward, terminated, truncated, {}


if __name__ == "__main__":
    try:
        result = main(tyro.cli(Args))
    except KeyboardInterrupt:  # a Ctrl-C before training began (loading, setup): nothing to keep yet
        print("interrupted before training began")
        sys.exit(130)
    sys.exit(130 if result.get("interrupted") else 0)  # 130: the shell's status for a Ctrl-C
