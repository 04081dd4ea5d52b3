"""Advantage Actor-Critic (A2C, the synchronous A3C) with a Categorical policy on CartPole-v1.

Papers: Mnih et al. 2016, "Asynchronous Methods for Deep Reinforcement Learning" (arXiv:1602.01783), in its
synchronous variant (OpenAI Baselines' A2C): `num_envs` envs stepped in lockstep instead of asynchronous
workers, one gradient step per rollout. Optional GAE from Schulman et al. 2016, "High-Dimensional Continuous
Control Using Generalized Advantage Estimation". Same shape, names and TensorBoard tags as ppo_cartpole.py:
`diff reinforce.py a2c.py` shows what A2C adds to REINFORCE (bootstrapping from a learned value),
`diff a2c.py ppo_cartpole.py` what PPO adds (a clipped probability ratio, epochs of minibatches).

Usage:
    python a2c.py --seed 1
    python a2c.py --gae --gae-lambda 0.95
    python a2c.py --save-model --eval-episodes 10
    python a2c.py --eval-checkpoint runs/<run_name>/agent.pt
    tensorboard --logdir runs

What the code computes (t is a step; a rollout holds num_steps x num_envs steps):
    returns_t    = rewards_t + gamma * (1 - terminations_t) * (next_values_t if dones_t else returns_{t+1})
                 = the n-step return: rewards to the end of the rollout or of t's episode, then V bootstrap
    advantages_t = returns_t - values_t            (or GAE(gamma, gae_lambda) with --gae)
    pg_loss      = -mean(advantages_t * log pi(a_t | s_t))
    v_loss       = 0.5 * mean((V(s_t) - returns_t)^2)
    loss         = pg_loss - ent_coef * entropy_loss + vf_coef * v_loss
`next_values_t` is the value of the state the env really reached after step t: the next observation, or
the final observation of an episode that ended at t; the last step of a rollout is bootstrapped with the
value of the observation the next rollout starts from. The data was collected by the very parameters that
are updated, and only one gradient step is taken, so the gradient needs no importance ratio and nothing to
keep it close to the old policy. Defaults are rl-baselines3-zoo's tuned CartPole A2C ("rl-zoo" below)
except where an Args field says otherwise.

Implementation details, numbered as in "The 37 Implementation Details of PPO" and the other scripts (the
ones A2C has), each marked "detail N" in the code:
 1. Vectorized envs: `num_envs` CartPoles stepped in lockstep, one batched forward per step.
 2. Orthogonal init (gain sqrt(2) hidden, 0.01 policy head, 1 value head), zero biases.
 3. The optimizer: RMSProp (alpha 0.99, eps 1e-5) as in the paper, Baselines and Stable-Baselines3, not
    PPO's Adam (why: docs/results/a2c.md#why-these-defaults).
 4. Learning rate annealed linearly to 0 over training.
 5. n-step returns to the end of the rollout (at most `num_steps`), bootstrapped with the critic;
    `--gae` uses GAE(gamma, gae_lambda) instead (gae_lambda=1 gives exactly the n-step returns).
 6. In place of minibatch epochs: one gradient step per rollout, on the whole batch.
 7. Advantage normalization over the batch: optional (`--norm-adv`), off as in Stable-Baselines3.
10. One loss: the vanilla policy-gradient loss, the entropy bonus and the critic's squared error.
11. Global gradient-norm clipping.
12. Debug variable: explained_var, how much of the returns' variance the critic explains.
13. Separate actor and critic networks.
Gymnasium 1.x correctness, marked "detail G1".."G3":
G1. SAME_STEP autoreset: the observation after an episode's last step is the next episode's first; the
    finished episode's last observation is in infos["final_obs"], so no transition spans two episodes.
G2. Truncation is not termination: an episode cut by the time limit is bootstrapped with V(final_obs); a
    termination zeroes the bootstrap; a done stops the return (and GAE) recursion.
G3. Episode statistics from the vector RecordEpisodeStatistics wrapper.
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
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    # experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]  # part of the run directory name
    seed: int = 1  # seed of python, numpy, torch and the environments
    torch_deterministic: bool = True  # if toggled, `torch.backends.cudnn.deterministic=True`
    cuda: bool = True  # if toggled and a GPU is available, train on it
    num_threads: int = 1  # torch CPU threads; 1 is fastest for a small MLP, busy machine or not
    runs_dir: str = "runs"  # TensorBoard logs and saved agents go to <runs_dir>/<run_name>/
    save_model: bool = False  # save the trained agent to <runs_dir>/<run_name>/agent.pt
    eval_episodes: int = 10  # episodes of the greedy policy evaluated after training (0: none)
    eval_checkpoint: str | None = None  # a saved agent.pt: evaluate it for --eval-episodes and exit

    # environment
    env_id: str = "CartPole-v1"  # the id of the environment (its action space must be Discrete)
    total_timesteps: int = 500_000  # total environment steps, summed over all envs
    num_envs: int = 32  # parallel environments (rl-zoo: 8; more envs share the per-step Python cost)
    num_steps: int = 8  # steps per env per rollout, n of the n-step returns (rl-zoo: 5; fewer updates)

    # algorithm
    learning_rate: float = 2e-3  # of RMSProp (rl-zoo: 7e-4; larger for the fewer, larger batches here)
    anneal_lr: bool = True  # anneal the learning rate linearly to 0 (rl-zoo: constant)
    gamma: float = 0.98  # the discount factor (rl-zoo: 0.99; why: docs/results/a2c.md#why-these-defaults)
    gae: bool = False  # use generalized advantage estimation (gamma, gae_lambda), not n-step returns
    gae_lambda: float = 0.95  # the lambda of generalized advantage estimation (only with --gae)
    norm_adv: bool = False  # normalize the advantages of each batch
    ent_coef: float = 0.0  # coefficient of the entropy bonus
    vf_coef: float = 0.5  # coefficient of the value loss 0.5 * MSE (SB3's MSE: twice the gradient)
    max_grad_norm: float = 0.5  # the maximum norm of the global gradient

    # computed in check_args
    batch_size: int = 0  # computed: num_envs * num_steps
    num_iterations: int = 0  # computed: total_timesteps / batch_size, rounded up


def make_env(env_id: str):
    def thunk():
        return gym.make(env_id)

    return thunk


def make_vector_env(env_id: str, num_envs: int):
    # detail 1, G1, G3: lockstep envs that reset inside the step that ends an episode (SAME_STEP),
    # with episode returns and lengths recorded on the vector env
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    # detail 2: orthogonal init
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        # detail 13: separate actor and critic networks
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def get_action_and_value(self, x, action=None):
        # speed: validate_args=False skips per-call argument checks, a sizeable share of a small update
        probs = Categorical(logits=self.actor(x), validate_args=False)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.get_value(x)

    def greedy_action(self, x):
        return self.actor(x).argmax(dim=-1)


def compute_returns(rewards, next_values, terminations, dones, gamma):
    """n-step returns for a rollout of shape (num_steps, num_envs): the discounted rewards from t to the end
    of t's episode or of the rollout, plus gamma^k * next_values there (the value of the state reached, the
    final observation's if the episode ended). terminations[t] zeroes that bootstrap (the episode really
    ended); dones[t] (termination or truncation) stops the recursion: step t+1 belongs to a new episode."""
    returns = torch.zeros_like(rewards)
    next_return = next_values[-1]
    for t in reversed(range(rewards.shape[0])):
        # detail G2: only a true termination zeroes the bootstrap; a truncation keeps next_values
        next_return = torch.where(dones[t].bool(), next_values[t], next_return)
        next_return = rewards[t] + gamma * (1.0 - terminations[t]) * next_return
        returns[t] = next_return
    return returns


def compute_gae(rewards, values, next_values, terminations, dones, gamma, gae_lambda):
    """Generalized advantage estimates (detail 5) for a rollout of shape (num_steps, num_envs), as in PPO.

    With gae_lambda=1 the returns are exactly compute_returns' (the rollout sets next_values[t] =
    values[t+1] inside an episode, so the TD residuals telescope); with gae_lambda=0 they are one-step.
    """
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        # detail G2: only a true termination zeroes the bootstrap; a truncation keeps next_values
        delta = rewards[t] + gamma * (1.0 - terminations[t]) * next_values[t] - values[t]
        lastgaelam = delta + gamma * gae_lambda * (1.0 - dones[t]) * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def policy_loss(newlogprob, advantages):
    """Vanilla policy-gradient loss: its gradient is -mean(A * grad log pi)."""
    return -(advantages * newlogprob).mean()


def value_loss(newvalue, returns):
    """Squared-error value loss of the critic."""
    return 0.5 * ((newvalue - returns) ** 2).mean()


def main(args: Args) -> dict:
    # 1. setup
    check_args(args)
    torch.set_num_threads(args.num_threads)  # speed: one thread is fastest for a small MLP on a busy machine
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    if args.eval_checkpoint is not None:
        agent, checkpoint = load_agent(args.eval_checkpoint, device)
        eval_returns = evaluate(agent, checkpoint["env_id"], args.eval_episodes, args.seed + 100_000, device)
        print(f"eval of {args.eval_checkpoint}: {np.mean(eval_returns):.2f} +- {np.std(eval_returns):.2f} "
              f"over {len(eval_returns)} episodes")
        return {"eval_returns": eval_returns}

    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join(args.runs_dir, run_name)
    writer = SummaryWriter(run_dir)
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in vars(args).items()),
    )

    envs = make_vector_env(args.env_id, args.num_envs)
    obs_dim = envs.single_observation_space.shape[0]
    n_actions = int(envs.single_action_space.n)
    agent = Agent(obs_dim, n_actions).to(device)
    # detail 3: RMSProp, eps 1e-5 (speed: foreach=True updates all parameters in one batched call)
    optimizer = optim.RMSprop(agent.parameters(), lr=args.learning_rate, alpha=0.99, eps=1e-5, foreach=True)

    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    terminations = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    # detail G1, G2: the last observation of an episode cut by the time limit, for its bootstrap
    final_obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)

    episodic_returns, eval_returns = [], []
    global_step, interrupted = 0, False
    start_time = time.time()
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs, dtype=torch.float32, device=device)
    try:
        for iteration in range(1, args.num_iterations + 1):
            if args.anneal_lr:  # detail 4
                lrnow = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate
                optimizer.param_groups[0]["lr"] = lrnow

            # 2. rollout (detail 1)
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                with torch.inference_mode():
                    action, _, _, value = agent.get_action_and_value(next_obs)
                actions[step], values[step] = action, value

                next_obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                rewards[step] = torch.as_tensor(reward, device=device)
                terminations[step] = torch.as_tensor(terminated, device=device)
                dones[step] = torch.as_tensor(np.logical_or(terminated, truncated), device=device)
                next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)
                for i in np.flatnonzero(truncated & ~terminated):
                    final_obs[step, i] = torch.as_tensor(infos["final_obs"][i], device=device)
                if "_episode" in infos:  # detail G3
                    for i in np.flatnonzero(infos["_episode"]):
                        episodic_return = float(infos["episode"]["r"][i])
                        episodic_returns.append(episodic_return)
                        writer.add_scalar("charts/episodic_return", episodic_return, global_step)
                        episodic_length = int(infos["episode"]["l"][i])
                        writer.add_scalar("charts/episodic_length", episodic_length, global_step)

            # 3. advantages (no_grad, not inference_mode: the advantages are used in the loss below)
            with torch.no_grad():
                # detail G1, G2: the state after step t is obs[t + 1] unless the episode ended at t
                next_values = torch.cat([values[1:], agent.get_value(next_obs).unsqueeze(0)])
                cut = (dones * (1.0 - terminations)).bool()
                if cut.any():
                    next_values[cut] = agent.get_value(final_obs[cut])
                if args.gae:
                    advantages, returns = compute_gae(
                        rewards, values, next_values, terminations, dones, args.gamma, args.gae_lambda
                    )
                else:  # detail 5
                    returns = compute_returns(rewards, next_values, terminations, dones, args.gamma)
                    advantages = returns - values

            b_obs = obs.reshape((-1, obs_dim))
            b_actions = actions.reshape(-1)
            b_advantages = advantages.reshape(-1)
            b_returns = returns.reshape(-1)
            b_values = values.reshape(-1)

            # 4. update: one gradient step on the whole batch (detail 6)
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs, b_actions)
            if args.norm_adv:  # detail 7
                b_advantages = (b_advantages - b_advantages.mean()) / (b_advantages.std() + 1e-8)
            pg_loss = policy_loss(newlogprob, b_advantages)
            v_loss = value_loss(newvalue, b_returns)
            entropy_loss = entropy.mean()
            loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef  # detail 10

            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)  # detail 11
            optimizer.step()

            y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()  # detail 12
            var_y = np.var(y_true)
            explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

            # 5. logging
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            writer.add_scalar("charts/SPS", int(global_step / (time.time() - start_time)), global_step)
    except KeyboardInterrupt:
        interrupted = True
        print(f"interrupted at global_step={global_step}: keeping the logs, skipping evaluation")
    finally:
        envs.close()
    print(f"{global_step} steps in {time.time() - start_time:.1f} s; "
          f"mean return of the last 100 episodes: {np.mean(episodic_returns[-100:] or [np.nan]):.1f}")

    # 6. save / evaluate
    try:
        if args.save_model:
            save_agent(agent, args, obs_dim, n_actions, run_dir, global_step if interrupted else None)
        if args.eval_episodes > 0 and not interrupted:
            eval_returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed + 100_000, device)
            for i, eval_return in enumerate(eval_returns):
                writer.add_scalar("eval/episodic_return", eval_return, i)
            print(f"eval: {np.mean(eval_returns):.2f} +- {np.std(eval_returns):.2f} "
                  f"over {len(eval_returns)} episodes")
    except KeyboardInterrupt:  # a Ctrl-C while saving or evaluating
        print("interrupted while saving or evaluating: keeping the logs, skipping the rest")
        interrupted = True
    finally:
        writer.close()
    return {"run_dir": run_dir, "episodic_returns": episodic_returns, "eval_returns": eval_returns,
            "interrupted": interrupted}


# Plumbing below: argument checks, evaluation and checkpoints. Not needed to follow the algorithm.

def check_args(args: Args) -> None:
    """Fill in the derived sizes, reject bad input with a one-line message, say what will run."""

    def fail(msg):
        raise SystemExit(f"error: {msg}")

    for flag in ("total_timesteps", "num_envs", "num_steps", "num_threads", "learning_rate", "max_grad_norm"):
        if not getattr(args, flag) > 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma must be in (0, 1], got {args.gamma}")
    if not 0.0 < args.gae_lambda <= 1.0:
        fail(f"--gae-lambda must be in (0, 1], got {args.gae_lambda}")
    if args.eval_episodes < 0:
        fail(f"--eval-episodes must be >= 0, got {args.eval_episodes}")
    if args.eval_checkpoint is not None and not os.path.isfile(args.eval_checkpoint):
        fail(f"--eval-checkpoint {args.eval_checkpoint} is not a file; pass the path of a saved agent.pt")
    try:
        env = gym.make(args.env_id)
    except gym.error.Error as e:
        fail(f"--env-id {args.env_id} cannot be made ({e.__class__.__name__}); "
             "pass a registered gymnasium id")
    action_space, observation_space = env.action_space, env.observation_space
    env.close()
    if not isinstance(action_space, gym.spaces.Discrete):
        fail(f"--env-id {args.env_id} has a {type(action_space).__name__} action space; this script needs "
             "a Discrete one (use ppo_walker2d.py for continuous actions)")
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        fail(f"--env-id {args.env_id} has {observation_space} observations; "
             "this script's MLP needs flat (1-d) Box observations")
    args.batch_size = args.num_envs * args.num_steps
    # round up, so that a run takes at least --total-timesteps steps
    args.num_iterations = -(-args.total_timesteps // args.batch_size)



def evaluate(agent, env_id, episodes, seed, device):
    """Returns of `episodes` episodes of the greedy (argmax) policy on fresh, separately seeded envs."""
    env = gym.make(env_id)
    episodic_returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, total = False, 0.0
        while not done:
            with torch.inference_mode():
                action = agent.greedy_action(torch.as_tensor(obs, dtype=torch.float32, device=device))
            obs, reward, terminated, truncated, _ = env.step(action.item())
            total += float(reward)
            done = terminated or truncated
        episodic_returns.append(total)
    env.close()
    return episodic_returns



def save_agent(agent, args, obs_dim, n_actions, run_dir, interrupted_at=None):
    path = os.path.join(run_dir, "agent.pt")
    checkpoint = {"model": agent.state_dict(), "obs_dim": obs_dim, "n_actions": n_actions,
                  "env_id": args.env_id, "interrupted_at": interrupted_at}  # the step of a Ctrl-C, or None
    torch.save(checkpoint, path)
    print(f"agent saved to {path}")



def load_agent(path, device):
    """The agent and checkpoint that save_agent wrote to `path`; a one-line error for any other file."""
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # truncated, corrupt, or not written by torch.save
        raise SystemExit(f"error: --eval-checkpoint {path} cannot be read ({e.__class__.__name__}); "
                         "the file is truncated or corrupt: pass an agent.pt saved by --save-model")
    try:  # e.g. ppo_walker2d.py's agent.pt holds a Gaussian policy and act_dim, not n_actions
        agent = Agent(checkpoint["obs_dim"], checkpoint["n_actions"]).to(device)
        agent.load_state_dict(checkpoint["model"])  # raises on missing, unexpected or mis-shaped weights
        gym.spec(checkpoint["env_id"])
    except Exception as e:
        script = os.path.basename(__file__)
        raise SystemExit(f"error: --eval-checkpoint {path} is not an agent.pt of {script} "
                         f"({e.__class__.__name__}); pass one saved by {script} --save-model")
    return agent, checkpoint


if __name__ == "__main__":
    try:
        result = main(tyro.cli(Args))
    except KeyboardInterrupt:  # a Ctrl-C before training began (loading, setup): nothing to keep yet
        print("interrupted before training began")
        sys.exit(130)
    sys.exit(130 if result.get("interrupted") else 0)  # 130: the shell's status for a Ctrl-C
