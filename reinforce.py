"""REINFORCE (Monte-Carlo policy gradient) with a Categorical policy on CartPole-v1.

Papers: Williams 1992, "Simple Statistical Gradient-Following Algorithms for Connectionist Reinforcement
Learning"; reward-to-go and the learned state-value baseline as in Sutton & Barto, "Reinforcement Learning:
An Introduction" (2nd ed.), section 13.4, and OpenAI Spinning Up's VPG. Same shape, names and TensorBoard tags
as ppo_cartpole.py: `diff reinforce.py a2c.py` shows what A2C adds (returns bootstrapped from the critic after
a few steps instead of at the end of each episode), `diff a2c.py ppo_cartpole.py` what PPO adds on top.

Usage:
    python reinforce.py --seed 1
    python reinforce.py --no-baseline
    python reinforce.py --save-model --eval-episodes 10
    python reinforce.py --eval-checkpoint runs/<run_name>/agent.pt
    tensorboard --logdir runs

What the code computes (t is a step of one episode; a batch holds `num_episodes` complete episodes):
    returns_t    = rewards_t + gamma * rewards_{t+1} + ... + gamma^(T-1-t) * rewards_{T-1}
                   (+ gamma^(T-t) * V(s_T) if the episode was truncated at T and --baseline is on)
    advantages_t = returns_t - values_t      (with --baseline; returns_t without)
    pg_loss      = -mean(advantages_t * log pi(a_t | s_t))
    v_loss       = 0.5 * mean((V(s_t) - returns_t)^2)   (with --baseline)
    loss         = pg_loss - ent_coef * entropy_loss + vf_coef * v_loss
Each action's log-probability is pushed up in proportion to the rewards that came after it (rewards before
an action cannot depend on it, so leaving them out only removes variance); a baseline that depends only on
the state keeps the estimate unbiased and lowers its variance further. Like Spinning Up's VPG, the code drops
Sutton & Barto's gamma^t weight of step t, so this is not exactly the gradient of the discounted return
(Nota & Thomas 2020, "Is the Policy Gradient a Gradient?"), but late steps are not weighted towards zero.
Without a baseline there is no critic to estimate the tail cut off by the time limit, so it is dropped: a
step near the limit gets a return of a few rewards although the pole is still up, a bias the policy cannot
resolve (the time left is not in the observation).

Implementation details, numbered as in "The 37 Implementation Details of PPO" and the other scripts (the
ones REINFORCE has), each marked "detail N" in the code:
 1. Vectorized envs. A batch is `num_episodes` complete episodes, `num_episodes / num_envs` from each env,
    all played by the current policy: every env is reset at the start of a batch, and an env that has
    played its share waits (still stepped, its steps thrown away but counted) until the others finish.
    Episodes that straddle an update would mix two policies; keeping the first to finish favours short ones.
 2. Orthogonal init (gain sqrt(2) hidden, 0.01 policy head, 1 value head), zero biases.
 3. The optimizer: RMSProp (alpha 0.99, eps 1e-5) as in a2c.py, not PPO's Adam (why:
    docs/results/reinforce.md#why-these-defaults).
 4. Learning rate annealed linearly to 0 over the env-step budget.
 5. In place of GAE: the discounted reward-to-go (Monte-Carlo returns, GAE with lambda 1 over whole
    episodes), computed backwards through each episode.
 6. In place of minibatch epochs: one gradient step per batch, on the whole batch.
 7. Normalization over the batch (`--norm-adv`): of the advantages with --baseline, of the returns without
    one (subtracting the batch mean of the returns is then a constant baseline).
10. One loss: the vanilla policy-gradient loss, the entropy bonus (`--ent-coef`) and, with --baseline,
    the critic's squared error.
12. Debug variable: explained_var, how much of the returns' variance the baseline explains.
13. Separate actor and critic networks (the critic is the baseline).
Gymnasium 1.x correctness, marked "detail G1".."G3":
G1. SAME_STEP autoreset: the observation after an episode's last step is the next episode's first; the
    finished episode's last observation is in infos["final_obs"].
G2. Truncation is not termination: with --baseline an episode cut by the time limit is bootstrapped with
    V(final_obs); a termination zeroes the bootstrap; a done stops the return's recursion.
G3. Episode statistics from the vector RecordEpisodeStatistics wrapper (only the batch's episodes logged).
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
    total_timesteps: int = 500_000  # total env steps over all envs, as a2c.py's (the last batch may pass it)
    num_envs: int = 16  # the number of parallel environments
    num_episodes: int = 16  # complete episodes per batch (a multiple of --num-envs)

    # algorithm
    learning_rate: float = 2e-3  # of RMSProp (why: docs/results/reinforce.md#why-these-defaults)
    anneal_lr: bool = True  # anneal the learning rate linearly to 0
    gamma: float = 0.99  # the discount factor
    baseline: bool = True  # subtract a learned state-value baseline from the returns
    norm_adv: bool = True  # normalize the advantages (the returns without --baseline) of each batch
    ent_coef: float = 0.0  # coefficient of the entropy bonus
    vf_coef: float = 0.5  # coefficient of the value loss (with --baseline)

    # computed in check_args
    episodes_per_env: int = 0  # computed: num_episodes // num_envs


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
        # detail 13: separate actor and critic networks (the critic is the baseline, unused without it)
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
    """Discounted reward-to-go for steps of shape (num_steps, num_envs) that hold complete episodes: the
    rewards from t to the end of t's episode, plus gamma^k * next_values there (the final observation's value,
    or 0 without a baseline). terminations[t] zeroes that bootstrap; dones[t] stops the recursion (step t+1
    belongs to a new episode). The code is a2c.py's n-step return: every episode ends inside the batch."""
    returns = torch.zeros_like(rewards)
    next_return = next_values[-1]
    for t in reversed(range(rewards.shape[0])):
        # detail G2: only a true termination zeroes the bootstrap; a truncation keeps next_values
        next_return = torch.where(dones[t].bool(), next_values[t], next_return)
        next_return = rewards[t] + gamma * (1.0 - terminations[t]) * next_return
        returns[t] = next_return
    return returns


def policy_loss(newlogprob, advantages):
    """Vanilla policy-gradient loss: its gradient is -mean(A * grad log pi)."""
    return -(advantages * newlogprob).mean()


def value_loss(newvalue, returns):
    """Squared-error value loss of the baseline."""
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

    episodic_returns, eval_returns = [], []
    global_step, interrupted = 0, False
    start_time = time.time()
    try:
        iteration = 0
        while global_step < args.total_timesteps:
            iteration += 1
            if args.anneal_lr:  # detail 4
                lrnow = (1.0 - global_step / args.total_timesteps) * args.learning_rate
                optimizer.param_groups[0]["lr"] = lrnow

            # 2. rollout: every env plays episodes_per_env complete episodes with this policy (detail 1)
            next_obs, _ = envs.reset(seed=args.seed if iteration == 1 else None)
            next_obs = torch.as_tensor(next_obs, dtype=torch.float32, device=device)
            episodes_left = np.full(args.num_envs, args.episodes_per_env)
            obs, actions, rewards, values, final_obs, masks = [], [], [], [], [], []
            terminations, dones = [], []
            while episodes_left.any():
                global_step += args.num_envs
                # the steps of an env that has played its share are thrown away (detail 1)
                masks.append(torch.as_tensor(episodes_left > 0, device=device))
                obs.append(next_obs)
                with torch.inference_mode():
                    action, _, _, value = agent.get_action_and_value(next_obs)
                actions.append(action)
                values.append(value)

                next_obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                rewards.append(torch.as_tensor(reward, dtype=torch.float32, device=device))
                terminations.append(torch.as_tensor(terminated, dtype=torch.float32, device=device))
                dones.append(torch.as_tensor(terminated | truncated, dtype=torch.float32, device=device))
                next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)
                # detail G1, G2: the last observation of an episode cut by the time limit, for its bootstrap
                final_obs.append(torch.zeros((args.num_envs, obs_dim), device=device))
                for i in np.flatnonzero(truncated & ~terminated):
                    final_obs[-1][i] = torch.as_tensor(infos["final_obs"][i], device=device)
                if "_episode" in infos:  # detail G3
                    for i in np.flatnonzero(infos["_episode"] & (episodes_left > 0)):
                        episodic_return = float(infos["episode"]["r"][i])
                        episodic_returns.append(episodic_return)
                        writer.add_scalar("charts/episodic_return", episodic_return, global_step)
                        episodic_length = int(infos["episode"]["l"][i])
                        writer.add_scalar("charts/episodic_length", episodic_length, global_step)
                episodes_left -= (terminated | truncated) & (episodes_left > 0)

            # 3. advantages (no_grad, not inference_mode: the advantages are used in the loss below)
            with torch.no_grad():
                obs, actions, rewards, values, final_obs, masks = (
                    torch.stack(x) for x in (obs, actions, rewards, values, final_obs, masks)
                )
                terminations, dones = torch.stack(terminations), torch.stack(dones)
                # detail G2: the bootstrap at the end of an episode is 0, or with a baseline the critic's
                # value of a truncated episode's final observation
                next_values = torch.zeros_like(rewards)
                cut = (dones * (1.0 - terminations)).bool() & masks
                if args.baseline and cut.any():
                    next_values[cut] = agent.get_value(final_obs[cut])
                returns = compute_returns(rewards, next_values, terminations, dones, args.gamma)  # detail 5
                advantages = returns - values if args.baseline else returns.clone()

            # only the steps of the episodes in the batch (detail 1)
            b_obs = obs[masks]
            b_actions = actions[masks]
            b_advantages = advantages[masks]
            b_returns = returns[masks]
            b_values = values[masks]

            # 4. update: one gradient step on the whole batch (detail 6)
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs, b_actions)
            if args.norm_adv:  # detail 7
                b_advantages = (b_advantages - b_advantages.mean()) / (b_advantages.std() + 1e-8)
            pg_loss = policy_loss(newlogprob, b_advantages)
            entropy_loss = entropy.mean()
            loss = pg_loss - args.ent_coef * entropy_loss  # detail 10
            if args.baseline:
                v_loss = value_loss(newvalue, b_returns)
                loss = loss + v_loss * args.vf_coef

            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            # 5. logging
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
            if args.baseline:
                y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()  # detail 12
                var_y = np.var(y_true)
                explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
                writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
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
    """Fill in the derived sizes and reject bad input with a one-line message, before any training."""

    def fail(msg):
        raise SystemExit(f"error: {msg}")

    for flag in ("total_timesteps", "num_envs", "num_episodes", "num_threads", "learning_rate"):
        if not getattr(args, flag) > 0:
            fail(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma must be in (0, 1], got {args.gamma}")
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
    if args.num_episodes % args.num_envs != 0:
        fail(f"--num-episodes {args.num_episodes} is not a multiple of --num-envs {args.num_envs}; "
             "every env plays the same number of episodes per batch")
    args.episodes_per_env = args.num_episodes // args.num_envs



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
