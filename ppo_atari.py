"""Proximal Policy Optimization (PPO) with a Categorical policy on Atari games, from pixels.

Papers: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (arXiv:1707.06347); GAE from
Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage Estimation"; the
network and preprocessing of Mnih et al. 2015 (Nature). Structure after CleanRL's `ppo_atari.py`; details
numbered after Huang et al. 2022, "The 37 Implementation Details of Proximal Policy Optimization".

Usage:
    python ppo_atari.py --seed 1 --save-model --checkpoint-every 100     # Breakout, CleanRL's settings
    python ppo_atari.py --seed 1 --save-model --resume runs/<run_name>/checkpoint.pt   # the run's flags
    python ppo_atari.py --eval-checkpoint runs/<run_name>/agent.pt [--eval-sample] [--capture-video]
    tensorboard --logdir runs

What the code computes, with the names it uses (t is a step, one rollout holds num_steps x num_envs):
    actions_t    ~ Categorical(softmax(logits(s_t)))
    logprobs_t   = log_softmax(logits(s_t))[actions_t]
    entropy      = -sum_a pi(a | s_t) log pi(a | s_t)
    delta_t      = rewards_t + gamma * (1 - terminations_t) * next_values_t - values_t
    advantages_t = delta_t + gamma * gae_lambda * (1 - dones_t) * advantages_{t+1}
    returns_t    = advantages_t + values_t
    ratio        = pi(a_t | s_t) / pi_old(a_t | s_t) = exp(newlogprob - logprobs)
    pg_loss      = mean(max(-A * ratio, -A * clip(ratio, 1 - clip_coef, 1 + clip_coef)))
    v_loss       = 0.5 * mean((V - R)^2)    (or the clipped form with --clip-vloss)
    loss         = pg_loss - ent_coef * entropy + vf_coef * v_loss
s_t is the last 4 preprocessed frames, rewards_t the clipped reward (A6), next_values_t the value of the
state the env reached after step t (the final observation if the episode ended at t). Two scores, kept
apart by the order of the wrappers (make_env): RecordEpisodeStatistics sits on the raw game, below the
wrappers that end the learner's episode at a lost life (A3) and clip its rewards (A6), so
charts/episodic_return and _length are a whole game's unclipped score and length in frames, at game over.

Implementation details, each marked "detail N" where it happens:
 1. Vectorized environments: num_envs games stepped in lockstep, one batched forward pass per step.
 2. Orthogonal weight init (gain sqrt(2) hidden, 0.01 policy head, 1 value head), constant (zero) bias.
 3. Adam with eps 1e-5.
 4. Learning rate annealed linearly to 0.
 5. Generalized Advantage Estimation (gamma, gae_lambda).
 6. Minibatch updates: update_epochs passes over the shuffled batch in num_minibatches pieces.
 7. Advantage normalization, per minibatch.
 8. Clipped surrogate objective.
 9. Value-loss clipping (--clip-vloss).
10. Overall loss pg_loss - ent_coef * entropy + vf_coef * v_loss.
11. Global gradient-norm clipping.
12. Debug variables: old_approx_kl, approx_kl (the k3 estimator), clipfrac, explained_var.
Atari (the Atari section of the 37 details), marked "detail AN"; A1-A7 are wrappers, innermost first:
A1. NoopReset: 1 to 30 random no-op frames after a reset.    A2. MaxAndSkip: an action lasts 4 frames;
    the observation is the pixelwise max of the last two (sprites drawn on every other frame).
A3. EpisodicLife: a lost life is a termination for the learner; the game goes on until it is over.
A4. FireReset: games with a FIRE action are started by pressing it, after a lost life too.
A5. WarpFrame: 84x84 grayscale.    A6. ClipReward: rewards clipped to their sign, for the learner only.
A7. FrameStack: the last 4 frames, oldest first.
A8. One Nature CNN for policy and value (not detail 13's two networks): conv 32 8x8 stride 4, 64 4x4
    stride 2, 64 3x3 stride 1, linear 3136->512, ReLU each.   A9. uint8 frames, scaled by 1/255 in the net.
Gymnasium 1.x correctness, marked "detail GN" (G4, normalization statistics, has no use here):
G1. SAME_STEP autoreset: the finished episode's last observation comes from infos["final_obs"].
G2. Truncation is not termination: a time-limit cut (ALE's 108,000 frames) is bootstrapped with
    V(final_obs); terminations zero the bootstrap, dones stop GAE at the episode boundary.
G3. Episode statistics from RecordEpisodeStatistics, on the raw rewards: per game, innermost (above).
"""

import os
import random
import sys
import time
from dataclasses import dataclass

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.utils.tensorboard import SummaryWriter

gym.register_envs(ale_py)


@dataclass
class Args:
    """Defaults are CleanRL's ppo_atari.py (Huang et al. 2022's Atari settings)."""

    # experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]  # part of the run directory name
    seed: int = 1  # seed of python, numpy, torch and the environments
    torch_deterministic: bool = True  # if toggled, `torch.backends.cudnn.deterministic=True`
    cuda: bool = True  # if toggled and a GPU is available, train on it
    num_threads: int = 1  # torch CPU threads; raise it to the free cores to train the CNN on a CPU
    runs_dir: str = "runs"  # TensorBoard logs and saved agents go to <runs_dir>/<run_name>/
    save_model: bool = False  # save the trained agent to <runs_dir>/<run_name>/agent.pt
    eval_episodes: int = 10  # whole games of the greedy policy evaluated after training (0: none)
    eval_checkpoint: str | None = None  # a saved agent.pt: evaluate it for --eval-episodes and exit
    eval_sample: bool = False  # evaluate with actions sampled as in training, not the greedy action
    capture_video: bool = False  # record evaluation games to videos/ in the run dir (needs moviepy)
    checkpoint_every: int = 0  # write <runs_dir>/<run_name>/checkpoint.pt every this many iterations (0: no)
    resume: str | None = None  # a checkpoint.pt: continue its run exactly, given the run's own flags

    # environment
    env_id: str = "ALE/Breakout-v5"  # any ALE game; made with frame skip 1 and no sticky actions (as CleanRL)
    total_timesteps: int = 10_000_000  # total agent steps (4 frames each), summed over all envs
    num_envs: int = 8  # parallel environments
    num_steps: int = 128  # steps per env per rollout

    # algorithm
    learning_rate: float = 2.5e-4  # the learning rate
    anneal_lr: bool = True  # anneal the learning rate linearly to 0
    gamma: float = 0.99  # discount
    gae_lambda: float = 0.95  # the lambda of generalized advantage estimation
    num_minibatches: int = 4  # per batch
    update_epochs: int = 4  # passes over each batch
    norm_adv: bool = True  # normalize the advantages of each minibatch
    clip_coef: float = 0.1  # the surrogate clipping coefficient
    clip_vloss: bool = True  # clipped value loss
    ent_coef: float = 0.01  # coefficient of the entropy bonus
    vf_coef: float = 0.5  # coefficient of the value loss
    max_grad_norm: float = 0.5  # the maximum norm of the global gradient
    target_kl: float | None = None  # stop an update's epochs once approx_kl exceeds this (None: never)

    # computed in check_args
    batch_size: int = 0  # computed: num_envs * num_steps
    minibatch_size: int = 0  # computed: batch_size // num_minibatches
    num_iterations: int = 0  # computed: total_timesteps // batch_size


class NoopReset(gym.Wrapper):
    """Detail A1: a reset is followed by 1 to 30 no-op frames, as many as the env's seeded generator draws."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.unwrapped.np_random.integers(1, 31)):
            obs, _, terminated, truncated, info = self.env.step(0)  # action 0 is NOOP in every game
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """Detail A2: an action lasts 4 frames; the observation is the pixelwise max of the last two."""

    def step(self, action):
        frames, total_reward = [], 0.0
        for _ in range(4):
            obs, reward, terminated, truncated, info = self.env.step(action)
            frames.append(obs)
            total_reward += float(reward)
            if terminated or truncated:
                break
        return np.max(frames[-2:], axis=0), total_reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """Detail A3: a lost life ends the learner's episode (terminated), not the game; a game over resets it."""
    lives, game_over = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.unwrapped.ale.lives()
        if 0 < lives < self.lives:  # at 0 lives the game itself says when it is over (terminated)
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if not self.game_over:  # a life lost: play on, one no-op step
            obs, _, terminated, truncated, info = self.env.step(0)
            self.game_over = terminated or truncated
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        self.lives = self.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Detail A4: after every reset, a lost life's (A3) too, FIRE and then action 2 (as OpenAI Baselines)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for action in (1, 2):  # action 1 is FIRE in every game that has it
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


def make_env(env_id: str, video_dir: str | None = None, sticky: float = 0.0):
    def thunk():  # sticky: the chance the emulator repeats the last action (training's 0: v4-NoFrameskip)
        env = gym.make(env_id, frameskip=1, repeat_action_probability=sticky, full_action_space=False,
                       render_mode="rgb_array" if video_dir else None)  # A2 skips frames
        env = gym.wrappers.RecordVideo(env, video_dir, fps=60, disable_logger=True) if video_dir else env
        env = gym.wrappers.RecordEpisodeStatistics(env)  # detail G3: the raw score and length of a game
        env = NoopReset(env)  # detail A1
        env = MaxAndSkip(env)  # detail A2
        env = EpisodicLife(env)  # detail A3
        env = FireReset(env) if "FIRE" in env.unwrapped.get_action_meanings() else env  # detail A4
        env = WarpFrame(env)  # detail A5
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(r)))  # detail A6: ClipReward
        return gym.wrappers.FrameStackObservation(env, 4)  # detail A7: oldest first

    return thunk


def make_vector_env(env_id: str, num_envs: int):
    # details 1 and G1: lockstep envs that reset inside the step that ends an episode (SAME_STEP)
    return gym.vector.SyncVectorEnv(
        [make_env(env_id) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def final_observations(next_obs: np.ndarray, infos: dict) -> np.ndarray:
    """Detail G1: the observations the envs really reached: `next_obs`, except where an episode ended and
    the SAME_STEP autoreset replaced it by the next episode's first one; there, `infos["final_obs"]`."""
    if "_final_obs" not in infos:
        return next_obs
    real_next_obs = next_obs.copy()
    for i in np.flatnonzero(infos["_final_obs"]):
        real_next_obs[i] = infos["final_obs"][i]
    return real_next_obs


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    # detail 2: orthogonal init
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def categorical_logprob(log_probs, action):
    """log pi(action | s), read off the log-probabilities of all actions (batch, n_actions)."""
    return log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)


def categorical_entropy(log_probs):
    """-sum_a pi(a | s) log pi(a | s)."""
    return -(log_probs.exp() * log_probs).sum(-1)


class Agent(nn.Module):
    def __init__(self, n_actions: int):
        super().__init__()
        # detail A8: Mnih et al.'s Nature CNN, 4 stacked 84x84 frames to 512 features, shared by both heads
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
        )
        self.critic = layer_init(nn.Linear(512, 1), std=1.0)
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)

    def get_value(self, x):
        return self.critic(self.network(x / 255.0)).squeeze(-1)  # detail A9: uint8 pixels to [0, 1]

    def get_action(self, x):
        """The rollout's forward pass: a sampled action and its log-probability, without the critic."""
        log_probs = self.actor(self.network(x / 255.0)).log_softmax(-1)  # log pi(a | s) of every action a
        action = torch.multinomial(log_probs.exp(), 1).squeeze(-1)
        return action, categorical_logprob(log_probs, action)

    def get_action_and_value(self, x, action):
        """The update's forward pass: the stored action, its new log-probability, the entropy, the value."""
        hidden = self.network(x / 255.0)
        log_probs = self.actor(hidden).log_softmax(-1)
        logprob, entropy = categorical_logprob(log_probs, action), categorical_entropy(log_probs)
        return action, logprob, entropy, self.critic(hidden).squeeze(-1)

    def greedy_action(self, x):
        return self.actor(self.network(x / 255.0)).argmax(dim=-1)


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
    torch.set_num_threads(args.num_threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.eval_checkpoint is not None:
        return evaluate_checkpoint(args, device)

    run_name = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.dirname(args.resume) if args.resume else os.path.join(args.runs_dir, run_name)
    writer = SummaryWriter(run_dir)
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n"
                    + "\n".join(f"|{key}|{value}|" for key, value in vars(args).items()))

    envs = make_vector_env(args.env_id, args.num_envs)
    obs_shape = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)
    agent = Agent(n_actions).to(device)
    # detail 3; fused: one kernel for all parameters instead of a dozen small ops each
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)

    # rollout storage in numpy (cheaper per-step writes than torch); the batch moves to torch once per rollout
    obs = np.zeros((args.num_steps, args.num_envs, *obs_shape), dtype=np.uint8)  # detail A9
    actions = np.zeros((args.num_steps, args.num_envs), dtype=np.int64)
    logprobs = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    terminations = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    # final observations of the episodes cut by the time limit, kept for the bootstrap (detail G2)
    final_obs = np.zeros((args.num_steps, args.num_envs, *obs_shape), dtype=np.uint8)

    def to_torch(x):
        return torch.as_tensor(x, device=device)

    episodic_returns, eval_returns = [], []
    global_step, interrupted = 0, False
    rollout_time = update_time = 0.0
    next_obs, _ = envs.reset(seed=args.seed)
    envs.action_space.seed(args.seed)
    if args.resume:  # the weights, optimizer, RNGs and games as the checkpoint left them
        global_step, next_obs, episodic_returns = load_checkpoint(args, agent, optimizer, envs)
    start_time, start_cpu, start_step = time.time(), time.process_time(), global_step
    try:
        for iteration in range(start_step // args.batch_size + 1, args.num_iterations + 1):
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

                next_obs, reward, terminated, truncated, infos = envs.step(actions[step])
                done = np.logical_or(terminated, truncated)
                rewards[step] = reward
                terminations[step], dones[step] = terminated, done
                cut = truncated & ~terminated
                if cut.any():  # details G1 and G2: the final observation, for the bootstrap
                    real_next_obs = final_observations(next_obs, infos)
                    final_obs[step, cut] = real_next_obs[cut]
                games = infos.get("final_info", {})  # detail G3: the step info of the episodes that ended
                if "_episode" in games:  # a game over, not a lost life (detail A3)
                    for i in np.flatnonzero(games["_episode"]):
                        episodic_return = float(games["episode"]["r"][i])
                        episodic_returns.append(episodic_return)
                        writer.add_scalar("charts/episodic_return", episodic_return, global_step)
                        writer.add_scalar("charts/episodic_length", games["episode"]["l"][i], global_step)
            rollout_time += time.perf_counter() - rollout_start

            # 3. advantages
            update_start = time.perf_counter()
            # the critic is fixed during the rollout: one batched pass gives the values of all its states
            cut = (dones == 1) & (terminations == 0)
            with torch.inference_mode():
                states = np.concatenate([obs.reshape(-1, *obs_shape), next_obs, final_obs[cut]])
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

            b_obs = to_torch(obs.reshape((-1, *obs_shape)))
            b_actions = to_torch(actions.reshape(-1))
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
            sps = int((global_step - start_step) / (time.time() - start_time))
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
            writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
            writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
            writer.add_scalar("losses/clipfrac", torch.stack(clipfracs).mean().item(), global_step)
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("charts/rollout_time", rollout_time, global_step)
            writer.add_scalar("charts/update_time", update_time, global_step)
            if iteration % 20 == 0 or iteration == args.num_iterations:
                print(f"global_step={global_step} SPS={sps} "
                      f"mean return (last 100 episodes)={np.mean(episodic_returns[-100:] or [np.nan]):.1f}")
            if args.checkpoint_every and iteration % args.checkpoint_every == 0:
                save_checkpoint(args, run_dir, agent, optimizer, envs, global_step, episodic_returns)
    except KeyboardInterrupt:
        interrupted = True
        print(f"interrupted at global_step={global_step}: keeping the logs, skipping evaluation")
    finally:
        envs.close()
    elapsed, steps = time.time() - start_time, global_step - start_step
    # CPU seconds of this process: the speed it would have alone on a core, when others share the machine
    print(f"{steps} steps in {elapsed:.1f} s ({steps / elapsed:.0f} steps/s, "
          f"{steps / (time.process_time() - start_cpu):.0f} per CPU second; "
          f"rollout {rollout_time:.1f} s, update {update_time:.1f} s); "
          f"mean return of the last 100 episodes: {np.mean(episodic_returns[-100:] or [np.nan]):.1f}")

    # 6. save / evaluate
    try:
        if args.save_model:
            save_agent(agent, args, n_actions, run_dir, global_step if interrupted else None)
        if args.eval_episodes > 0 and not interrupted:
            eval_returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed + 100_000, device,
                                    args.capture_video and os.path.join(run_dir, "videos"), args.eval_sample)
            for i, eval_return in enumerate(eval_returns):
                writer.add_scalar("eval/episodic_return", eval_return, i)
            print(f"eval ({eval_mode(args)}): {np.mean(eval_returns):.2f} +- {np.std(eval_returns):.2f} "
                  f"over {len(eval_returns)} games")
    except KeyboardInterrupt:  # a Ctrl-C while saving or evaluating
        print("interrupted while saving or evaluating: keeping the logs, skipping the rest")
        interrupted = True
    finally:
        writer.close()
    return {"run_dir": run_dir, "episodic_returns": episodic_returns, "eval_returns": eval_returns,
            "rollout_time": rollout_time, "update_time": update_time, "interrupted": interrupted}


# Plumbing below: argument checks, frame resizing, evaluation, checkpoints. Skippable on a first reading.

class WarpFrame(gym.ObservationWrapper):
    """A 210x160 RGB frame to 84x84 grayscale: luma (ITU-R 601 weights, as cv2), then area averaging (as cv2's
    INTER_AREA), one axis at a time. No matrix products: numpy's BLAS threads crawl on a busy machine."""

    def __init__(self, env, size=84):
        super().__init__(env)
        height, width, _ = env.observation_space.shape
        self.rows, self.cols = area_weights(height, size), area_weights(width, size)
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)

    def observation(self, frame):
        r, g, b = (frame[..., i].astype(np.float32) for i in range(3))
        gray = 0.299 * r + 0.587 * g + 0.114 * b
        (row_pixels, row_weights), (col_pixels, col_weights) = self.rows, self.cols
        gray = (gray[row_pixels] * row_weights[..., None]).sum(1)
        gray = (gray[:, col_pixels] * col_weights).sum(-1)
        return np.round(gray).astype(np.uint8)


def area_weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Area interpolation along one axis: output pixel j = sum_k weights[j, k] * input[pixels[j, k]], the mean
    of the input pixels it covers, each weighed by the share of it covered. Both arrays are (n_out, k)."""
    edges = np.arange(n_out + 1) * n_in / n_out
    pixels = np.arange(n_in)
    overlap = np.clip(np.minimum(edges[1:, None], pixels + 1) - np.maximum(edges[:-1, None], pixels), 0, None)
    covered = np.argsort(overlap == 0, axis=1, kind="stable")[:, : (overlap > 0).sum(1).max()]  # first k
    return covered, (np.take_along_axis(overlap, covered, 1) * n_out / n_in).astype(np.float32)


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
    for flag in ("eval_episodes", "checkpoint_every"):
        if getattr(args, flag) < 0:
            fail(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    if args.capture_video:
        try:
            import moviepy  # noqa: F401  (gymnasium's RecordVideo writes the mp4 files with it)
        except ImportError:
            fail("--capture-video needs the Python package moviepy: pip install moviepy")
    if args.eval_checkpoint is not None:
        if args.eval_episodes == 0:
            fail("--eval-checkpoint needs --eval-episodes of at least 1")
        if not os.path.isfile(args.eval_checkpoint):
            fail(f"--eval-checkpoint {args.eval_checkpoint} is not a file; pass the path of a saved agent.pt")
        return
    try:
        entry_point = gym.spec(args.env_id).entry_point
    except gym.error.Error as e:
        fail(f"--env-id {args.env_id} is not a registered id ({e.__class__.__name__}); pass an ALE game "
             "such as ALE/Pong-v5")
    if entry_point != "ale_py.env:AtariEnv":
        fail(f"--env-id {args.env_id} is not an ALE game; pass one such as ALE/Pong-v5 (other envs: "
             "ppo_cartpole.py)")
    args.batch_size = args.num_envs * args.num_steps
    if args.batch_size % args.num_minibatches != 0:
        fail(f"--num-minibatches {args.num_minibatches} does not divide the batch size {args.batch_size} "
             "(--num-envs x --num-steps); choose a divisor")
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations == 0:
        fail(f"--total-timesteps {args.total_timesteps} is less than one batch ({args.batch_size}); raise it")
    if args.resume is not None:
        check_resume(args, fail)


EVAL_STICKY = 0.25


def eval_mode(args: Args) -> str:
    return f"{'sampled actions' if args.eval_sample else 'greedy action'}, sticky actions {EVAL_STICKY}"


def evaluate(agent, env_id, episodes, seed, device, video_dir=None, sample=False):
    """Scores of `episodes` whole games (all lives, raw rewards) of the greedy policy (`sample`: of sampled
    actions) on fresh, separately seeded envs, through the training's wrappers. A lost life ends the
    learner's episode there: the env is reset, which plays on (and presses FIRE where the game needs it).
    The emulator repeats the last action with probability EVAL_STICKY (Machado et al. 2018, ALE v5's default):
    without it a greedy game is fixed by its no-op count, and 30 games would be at most 30 distinct ones."""
    env = make_env(env_id, video_dir, EVAL_STICKY)()
    episodic_returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        info = {}
        while "episode" not in info:  # RecordEpisodeStatistics reports the game's score when it is over
            with torch.inference_mode():
                x = torch.as_tensor(obs, device=device)[None]
                action = agent.get_action(x)[0] if sample else agent.greedy_action(x)
            obs, _, terminated, truncated, info = env.step(action.item())
            if (terminated or truncated) and "episode" not in info:  # a life lost: the game goes on
                obs, _ = env.reset()
        episodic_returns.append(float(info["episode"]["r"]))
    env.close()
    return episodic_returns


def save_agent(agent, args, n_actions, run_dir, interrupted_at=None):
    path = os.path.join(run_dir, "agent.pt")
    checkpoint = {
        "model": agent.state_dict(),
        "n_actions": n_actions,
        "env_id": args.env_id,
        "interrupted_at": interrupted_at,  # the step of a Ctrl-C, or None
    }
    torch.save(checkpoint, path)
    print(f"agent saved to {path}")
    return path


def load_agent(path, device):
    """The agent and checkpoint that save_agent wrote to `path`; a one-line error for any other file."""
    fix = "pass an agent.pt saved by ppo_atari.py --save-model"
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or corrupt file fails in the zip reader or the unpickler
        raise SystemExit(f"error: --eval-checkpoint {path} cannot be read ({e.__class__.__name__}); {fix}")
    try:  # e.g. ppo_cartpole.py's agent.pt holds two MLPs, not a CNN
        agent = Agent(checkpoint["n_actions"])
        agent.load_state_dict(checkpoint["model"])  # raises on missing, unexpected or mis-shaped weights
        gym.spec(checkpoint["env_id"])
    except Exception as e:
        what = f"no {e}" if isinstance(e, KeyError) else e.__class__.__name__
        raise SystemExit(f"error: --eval-checkpoint {path} is not an agent.pt of ppo_atari.py ({what}); "
                         f"{fix}")
    return agent.to(device), checkpoint


def evaluate_checkpoint(args: Args, device) -> dict:
    """--eval-checkpoint: evaluate a saved agent on its own game; no training."""
    agent, checkpoint = load_agent(args.eval_checkpoint, device)
    # beside the checkpoint, in a new folder: the videos of the training run's own evaluation stay
    video_dir = os.path.join(os.path.dirname(args.eval_checkpoint), f"videos_eval_{int(time.time())}")
    eval_returns = evaluate(agent, checkpoint["env_id"], args.eval_episodes, args.seed + 100_000, device,
                            args.capture_video and video_dir, args.eval_sample)
    print(f"eval ({eval_mode(args)}) of {args.eval_checkpoint}: {np.mean(eval_returns):.2f} "
          f"+- {np.std(eval_returns):.2f} over {len(eval_returns)} games")
    return {"eval_returns": eval_returns}


# A checkpoint.pt holds everything the next iteration reads, so that a resumed run continues bit for bit
# on the same machine: the weights, the optimizer, the RNGs, and per game the emulator (ALE's cloneState
# with its RNG: the whole console, frame counters included), the no-op generator, and the wrappers' own
# state (the game's running score and length, the lives, the frame stack); the other wrappers keep nothing
# from one step to the next. Flags that change what the run computes must be the run's own; only these,
# --total-timesteps among them (it may grow), may differ from the checkpoint's:
RESUME_FREE = ("exp_name", "torch_deterministic", "cuda", "num_threads", "runs_dir", "save_model",
               "eval_episodes", "eval_checkpoint", "eval_sample", "capture_video", "checkpoint_every",
               "resume", "total_timesteps", "batch_size", "minibatch_size", "num_iterations")


def wrapper_of(env, cls):
    while not isinstance(env, cls):
        env = env.env
    return env


def env_state(env) -> dict:
    stats = wrapper_of(env, gym.wrappers.RecordEpisodeStatistics)
    lives = wrapper_of(env, EpisodicLife)
    return {"ale": env.unwrapped.ale.cloneState(include_rng=True).serialize(),
            "np_random": env.unwrapped.np_random.bit_generator.state,
            "score": stats.episode_returns, "length": stats.episode_lengths,
            "lives": lives.lives, "game_over": lives.game_over,
            "frames": torch.as_tensor(np.stack(env.obs_queue))}


def restore_env_state(env, state: dict) -> None:
    env.unwrapped.ale.restoreState(ale_py.ALEState(state["ale"]))
    env.unwrapped.np_random.bit_generator.state = state["np_random"]
    stats = wrapper_of(env, gym.wrappers.RecordEpisodeStatistics)
    stats.episode_returns, stats.episode_lengths = state["score"], state["length"]
    lives = wrapper_of(env, EpisodicLife)
    lives.lives, lives.game_over = state["lives"], state["game_over"]
    env.obs_queue.extend(state["frames"].numpy())  # the deque keeps the last 4: these


def save_checkpoint(args, run_dir, agent, optimizer, envs, global_step, episodic_returns):
    np_state = np.random.get_state()
    checkpoint = {
        "model": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "iteration": global_step // args.batch_size,
        "global_step": global_step,
        "episodic_returns": episodic_returns,
        "envs": [env_state(env) for env in envs.unwrapped.envs],
        "rng": {"python": random.getstate(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "numpy": (np_state[0], torch.as_tensor(np_state[1].astype(np.int64)), *np_state[2:])},
        "args": vars(args),
    }
    path = os.path.join(run_dir, "checkpoint.pt")
    torch.save(checkpoint, path + ".tmp")  # a Ctrl-C while writing leaves the previous checkpoint whole
    os.replace(path + ".tmp", path)
    return path


def read_checkpoint(path: str) -> dict:
    fix = "pass a checkpoint.pt written by ppo_atari.py --checkpoint-every"
    if not os.path.isfile(path):
        raise SystemExit(f"error: --resume {path} is not a file; {fix}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        checkpoint["args"], checkpoint["envs"], checkpoint["rng"]
    except Exception as e:
        what = f"no {e}" if isinstance(e, KeyError) else e.__class__.__name__
        raise SystemExit(f"error: --resume {path} is not a checkpoint.pt of ppo_atari.py ({what}); {fix}")
    return checkpoint


def check_resume(args: Args, fail) -> None:
    checkpoint = read_checkpoint(args.resume)
    for flag, saved in checkpoint["args"].items():
        if flag not in RESUME_FREE and getattr(args, flag, None) != saved:
            fail(f"--{flag.replace('_', '-')} {getattr(args, flag, None)} is not the checkpoint's {saved}; "
                 "resume with the run's own flags")
    if checkpoint["global_step"] >= args.num_iterations * args.batch_size:
        fail(f"--total-timesteps {args.total_timesteps}: the checkpoint is at step "
             f"{checkpoint['global_step']} already; raise it to train on")


def load_checkpoint(args: Args, agent, optimizer, envs):
    """Restore what save_checkpoint saved; returns the step, the next observations, the scores so far."""
    checkpoint = read_checkpoint(args.resume)
    agent.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    for env, state in zip(envs.unwrapped.envs, checkpoint["envs"], strict=True):
        restore_env_state(env, state)
    rng = checkpoint["rng"]
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    np.random.set_state((rng["numpy"][0], rng["numpy"][1].numpy().astype(np.uint32), *rng["numpy"][2:]))
    print(f"resumed {args.resume} at global_step={checkpoint['global_step']}")
    before = checkpoint["args"]["total_timesteps"]
    if args.anneal_lr and before != args.total_timesteps:  # the learning rate's schedule ends elsewhere
        print(f"--total-timesteps {args.total_timesteps} is not the checkpoint's {before}: the learning rate "
              f"anneals to 0 at step {args.num_iterations * args.batch_size} from here on")
    next_obs = np.stack([np.stack(env.obs_queue) for env in envs.unwrapped.envs])  # each env's frame stack
    return checkpoint["global_step"], next_obs, checkpoint["episodic_returns"]


if __name__ == "__main__":
    try:
        result = main(tyro.cli(Args))
    except KeyboardInterrupt:  # a Ctrl-C before training began (loading, setup): nothing to keep yet
        print("interrupted before training began")
        sys.exit(130)
    sys.exit(130 if result.get("interrupted") else 0)  # 130: the shell's status for a Ctrl-C
