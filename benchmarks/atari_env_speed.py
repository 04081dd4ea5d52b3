"""Steps per second of ALE games with the standard Atari preprocessing, no learning: `ppo_atari.py`'s own
environments (gymnasium's SyncVectorEnv over the file's Python wrappers, one thread) against ale-py's C++
`AtariVectorEnv` (the same preprocessing inside the emulator's library, `--threads` worker threads).

    python benchmarks/atari_env_speed.py --env-id ALE/Breakout-v5 --num-envs 8 --steps 500 --threads 1 2

Each environment steps uniformly random actions (seeded) for --steps lockstep steps after a reset; the line
gives agent steps (of 4 frames) a second of wall time and of this process's CPU time. The two are not the same
environments to the bit (AtariVectorEnv resets on the next step, ppo_atari.py's in the same step), so this
measures speed only.
"""

import argparse
import os
import sys
import time

import ale_py.vector_env
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_atari  # noqa: E402


def steps_per_second(env, num_envs: int, steps: int, seed: int) -> tuple[float, float]:
    """(agent steps a wall second, agent steps a CPU second of this process) over `steps` random steps."""
    env.reset(seed=seed)
    actions = np.random.default_rng(seed).integers(0, env.single_action_space.n, size=(steps, num_envs))
    wall, cpu = time.perf_counter(), time.process_time()
    for a in actions:
        env.step(a)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    env.close()
    return num_envs * steps / wall, num_envs * steps / max(cpu, 1e-9)


def ale_game_name(env_id: str) -> str:
    """gymnasium's id to AtariVectorEnv's game name: ALE/SpaceInvaders-v5 -> space_invaders."""
    name = env_id.split("/")[-1].split("-")[0]
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="ALE/Breakout-v5", help="an ALE game id, as ppo_atari.py takes it")
    parser.add_argument("--num-envs", type=int, default=8, help="environments stepped in lockstep")
    parser.add_argument("--steps", type=int, default=500, help="lockstep steps timed, after a reset")
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="AtariVectorEnv's thread counts")
    parser.add_argument("--seed", type=int, default=1, help="seed of the resets and the random actions")
    args = parser.parse_args(argv)
    if args.num_envs < 1 or args.steps < 1 or min(args.threads) < 1:
        parser.error("--num-envs, --steps and --threads must be at least 1")
    game = ale_game_name(args.env_id)
    rows = [("ppo_atari.make_vector_env (SyncVectorEnv, Python wrappers)",
             ppo_atari.make_vector_env(args.env_id, args.num_envs))]
    rows += [(f"ale_py AtariVectorEnv, {n} thread{'s' if n > 1 else ''}",
              ale_py.vector_env.AtariVectorEnv(game, args.num_envs, num_threads=n, episodic_life=True))
             for n in args.threads]
    lines = []
    for name, env in rows:
        wall, cpu = steps_per_second(env, args.num_envs, args.steps, args.seed)
        lines.append(f"{name}: {wall:.0f} steps/s wall, {cpu:.0f} per CPU second "
                     f"({args.num_envs} x {args.steps} steps of {args.env_id})")
        print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    main()
