"""How fast `ppo_walker2d.py` trains against the physics it steps, on one core, and where its time goes.

    python benchmarks/walker_speed.py                     # 2 rounds of 20,480 env steps (10 iterations) a side
    python benchmarks/walker_speed.py --against HEAD      # the committed file beside the working tree's
    python benchmarks/walker_speed.py --steps 102400 --rounds 3

One process, one torch thread (as the script runs), CPU seconds of the process (time.process_time): other
processes on the machine slow it less than the wall clock, not at all only on idle cores. Each side's loop is
`main()` at its defaults with `--total-timesteps STEPS --eval-episodes 0`, timed from the envs' reset to their
close (the setup and the imports it triggers are left out; a one-iteration run warms up first). The physics it
is compared with: the script's own vector env (`make_vector_env`: 8 Walker2d-v5 envs in a SyncVectorEnv,
SAME_STEP autoreset, DropInfo, RecordEpisodeStatistics), a second one, stepped with seeded uniform random actions
and nothing else, 2,048 steps after each of the loop's rollouts, its seconds left out of the loop's: the two
share the machine's speed of the moment, which on a loaded machine drifts by tens of percent within minutes.
The ratio is the loop's env steps a CPU second over the physics' (1.0: a loop that costs nothing beside the
physics). --against REV times `git show REV:ppo_walker2d.py` too, the two files' loops taking turns going first.

Then one more run of each side, with timers around its parts, gives the split in CPU seconds per 1,000 env
steps. The env steps (physics alone, and inside the loop) split into MuJoCo's C functions (mj_step,
mj_rnePostConstraint, mj_forward), Walker2d-v5's own Python (reward, observation, reset) and the vector env with
its wrappers. The loop's rollout: policy forward (`Agent.get_action`), observation normalizer
(`RunningMeanStd.update` and `normalize_obs`), reward scaling (`RewardScaler`, its own statistics included),
episode logging (`add_scalar` in the rollout) and the rest (buffer writes, numpy/torch conversions, action
clipping). The update: the batch's values (`get_value`), `compute_gae`, forward (`get_action_and_value`),
backward, gradient clipping, Adam, and the rest (minibatch indexing, losses, statistics). Then the logging
section. A timed call inside another timed part counts for the outer one; the script's own rollout and update
timers read CPU time in that run. Each timer costs about a microsecond a call, so the ratio is not taken from
it. The second table divides each run's parts by its own MuJoCo time, which cancels the drift between runs; the
last lines give, on that scale, the ratio of the loop as timed, of the loop less its update, and of its env steps
alone: how close to the physics the loop could come if the update, or everything but the env, cost nothing.
"""

import argparse
import contextlib
import functools
import importlib.util
import os
import subprocess
import tempfile
import time
import types

import mujoco
import numpy as np
import torch
from gymnasium.envs.mujoco import walker2d_v5

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_ENVS = 8
ENV_PARTS = ["MuJoCo's C functions", "Walker2d-v5's Python", "vector env and wrappers"]
ROLLOUT = ["policy forward", "observation normalizer", "reward scaling", "episode logging"]
UPDATE = ["values of the batch", "compute_gae", "update forward", "backward", "gradient clipping", "Adam step"]


def load_script(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Timers:
    """CPU seconds per name of the calls wrapped by `wrap`; a wrapped call inside another counts for the outer.
    Separate instances time nested layers (the env step, the Walker2d env inside it, MuJoCo inside that)."""

    def __init__(self):
        self.seconds, self.active = {}, False

    def wrap(self, name, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if self.active:
                return fn(*args, **kwargs)
            self.active = True
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.process_time() - start
                self.active = False

        return timed

    def get(self, name) -> float:
        return self.seconds.get(name, 0.0)


@contextlib.contextmanager
def patched(*replacements):
    """Sets each (owner, attribute, value) for the duration of the block, then puts the originals back."""
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in replacements]
    try:
        for owner, attr, value in replacements:
            setattr(owner, attr, value)
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)


@contextlib.contextmanager
def env_timers():
    """Timers of the Walker2d envs (step and reset) and, inside them, of MuJoCo's C functions."""
    walker, physics = Timers(), Timers()
    with patched(*[(mujoco, f, physics.wrap("mujoco", getattr(mujoco, f)))
                   for f in ("mj_step", "mj_rnePostConstraint", "mj_forward")],
                 *[(walker2d_v5.Walker2dEnv, f, walker.wrap("walker", getattr(walker2d_v5.Walker2dEnv, f)))
                   for f in ("step", "reset")]):
        yield lambda: (physics.get("mujoco"), walker.get("walker") - physics.get("mujoco"))


class Physics:
    """The script's vector env under seeded uniform random actions, stepped in chunks: CPU seconds and steps,
    summed over the chunks (`timed`: and the parts of ENV_PARTS)."""

    def __init__(self, script, seed: int, timed: bool = False):
        self.envs = script.make_vector_env("Walker2d-v5", NUM_ENVS)
        self.envs.reset(seed=seed)
        self.rng, self.timed = np.random.default_rng(seed), timed
        self.seconds, self.steps, self.parts = 0.0, 0, dict.fromkeys(ENV_PARTS, 0.0)

    def run(self, steps: int) -> None:
        low, high = self.envs.single_action_space.low, self.envs.single_action_space.high
        actions = self.rng.uniform(low, high, size=(steps // NUM_ENVS, NUM_ENVS, len(low))).astype(np.float32)
        with env_timers() if self.timed else contextlib.nullcontext() as inner:
            start = time.process_time()
            for action in actions:
                self.envs.step(action)
            seconds = time.process_time() - start
            if self.timed:
                mujoco_c, walker_python = inner()
                for name, value in zip(ENV_PARTS, (mujoco_c, walker_python, seconds - mujoco_c - walker_python)):
                    self.parts[name] += value
        self.seconds, self.steps = self.seconds + seconds, self.steps + steps


def loop_seconds(script, steps: int, runs_dir: str, step_timers: Timers | None = None,
                 physics: Physics | None = None) -> tuple[float, dict]:
    """CPU seconds of `main()`'s loop (the envs' reset to their close) for `steps` env steps, and main's result.
    `physics`: a batch of its steps after each rollout, their seconds left out of the loop's."""
    marks, make_vector_env, compute_gae = {}, script.make_vector_env, script.compute_gae

    def gae_after_physics(rewards, *args):
        physics.run(rewards.size)
        return compute_gae(rewards, *args)

    def timed_vector_env(env_id, num_envs):
        envs = make_vector_env(env_id, num_envs)
        reset, close = envs.reset, envs.close

        def timed_reset(**kwargs):
            marks["start"] = time.process_time()
            return reset(**kwargs)

        def timed_close():
            marks["end"] = time.process_time()
            return close()

        envs.reset, envs.close = timed_reset, timed_close
        if step_timers is not None:
            envs.step = step_timers.wrap("env steps", envs.step)
        return envs

    physics_before = physics.seconds if physics else 0.0
    with patched((script, "make_vector_env", timed_vector_env),
                 *[(script, "compute_gae", gae_after_physics)] if physics else []):
        result = script.main(script.Args(total_timesteps=steps, eval_episodes=0, runs_dir=runs_dir))
    return marks["end"] - marks["start"] - (physics.seconds - physics_before if physics else 0.0), result


def split(script, steps: int, runs_dir: str) -> dict:
    """{part: CPU seconds} of one run of the loop with timers around its parts."""
    timers, steps_timer, in_rollout = Timers(), Timers(), [True]
    Agent, RewardScaler = script.Agent, script.RewardScaler
    get_value, scale = Agent.get_value, RewardScaler.__call__

    class Writer(script.SummaryWriter):
        def add_scalar(self, *args, **kwargs):
            name = "episode logging" if in_rollout[0] else "logging section"
            return timers.wrap(name, super().add_scalar)(*args, **kwargs)

    def values(agent, x):  # outside the update's forward, only the batch's values call it
        in_rollout[0] = False
        return get_value(agent, x)

    def reward_scaling(self, rewards, dones):  # called once per rollout step, the next rollout's first included
        in_rollout[0] = True
        return scale(self, rewards, dones)

    # the script's rollout and update timers read CPU time in this run
    clock = types.SimpleNamespace(time=time.time, perf_counter=time.process_time, process_time=time.process_time)
    with patched((script, "SummaryWriter", Writer), (script, "time", clock),
                 (Agent, "get_action", timers.wrap("policy forward", Agent.get_action)),
                 (Agent, "get_value", timers.wrap("values of the batch", values)),
                 (Agent, "get_action_and_value", timers.wrap("update forward", Agent.get_action_and_value)),
                 (script.RunningMeanStd, "update", timers.wrap("observation normalizer", script.RunningMeanStd.update)),
                 (script, "normalize_obs", timers.wrap("observation normalizer", script.normalize_obs)),
                 (RewardScaler, "__call__", timers.wrap("reward scaling", reward_scaling)),
                 (script, "compute_gae", timers.wrap("compute_gae", script.compute_gae)),
                 (torch.Tensor, "backward", timers.wrap("backward", torch.Tensor.backward)),
                 (torch.nn.utils, "clip_grad_norm_", timers.wrap("gradient clipping", torch.nn.utils.clip_grad_norm_)),
                 (torch.optim.Adam, "step", timers.wrap("Adam step", torch.optim.Adam.step))), env_timers() as env:
        total, result = loop_seconds(script, steps, runs_dir, steps_timer)
        mujoco_c, walker_python = env()
    env_steps = steps_timer.get("env steps")
    parts = {"env steps": env_steps, ENV_PARTS[0]: mujoco_c, ENV_PARTS[1]: walker_python,
             ENV_PARTS[2]: env_steps - mujoco_c - walker_python}
    parts.update({name: timers.get(name) for name in ROLLOUT})
    parts["rest of the rollout"] = result["rollout_time"] - env_steps - sum(timers.get(n) for n in ROLLOUT)
    parts.update({name: timers.get(name) for name in UPDATE})
    parts["rest of the update"] = result["update_time"] - sum(timers.get(name) for name in UPDATE)
    parts["logging section and the rest"] = total - result["rollout_time"] - result["update_time"]
    parts["loop"] = total
    return parts


def bounds(physics: dict, loop: dict) -> dict:
    """What the split says of the ratio to the physics: the loop as timed, the loop less its update (the batch's
    values, compute_gae, the minibatch steps), and its env steps alone; each run's seconds over its own MuJoCo
    time (physics, loop: split()'s parts of the physics alone and of a loop)."""
    per_mujoco = physics["env steps"] / physics[ENV_PARTS[0]]
    update = sum(loop[name] for name in UPDATE) + loop["rest of the update"]
    return {name: per_mujoco / (seconds / loop[ENV_PARTS[0]]) for name, seconds in [
        ("the loop as timed", loop["loop"]), ("without the update", loop["loop"] - update),
        ("its env steps alone", loop["env steps"])]}


def committed(rev: str, folder: str) -> str:
    """The path of a copy of ppo_walker2d.py as of git revision `rev`, written to `folder`."""
    text = subprocess.run(["git", "show", f"{rev}:ppo_walker2d.py"], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout
    path = os.path.join(folder, "ppo_walker2d_against.py")
    with open(path, "w") as f:
        f.write(text)
    return path


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20480, help="env steps a side and round (whole batches of "
                        "2048)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds: each side's loop once, in turns")
    parser.add_argument("--against", default=None, help="a git revision whose ppo_walker2d.py is timed too")
    parser.add_argument("--no-split", action="store_true", help="skip the timed runs of the split")
    args = parser.parse_args(argv)
    if args.steps < 2048 or args.steps % 2048 or args.rounds < 1:
        parser.error("--steps must be a positive multiple of 2048 and --rounds at least 1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        files = {"working tree": os.path.join(ROOT, "ppo_walker2d.py")}
        if args.against:
            files[args.against] = committed(args.against, tmp)
        scripts = {label: load_script(path, f"walker_speed_{i}") for i, (label, path) in enumerate(files.items())}
        here, runs_dir = scripts["working tree"], os.path.join(tmp, "runs")
        for script in scripts.values():  # warm-up: lazy imports, first calls
            loop_seconds(script, 2048, runs_dir)
        ratios = {label: [] for label in scripts}
        for r in range(args.rounds):
            line = f"round {r + 1}:"
            for label, script in list(scripts.items())[:: -1 if r % 2 else 1]:  # A B, then B A: none always first
                physics = Physics(here, seed=r)
                seconds, _ = loop_seconds(script, args.steps, runs_dir, physics=physics)
                physics.envs.close()
                ratios[label].append(physics.seconds / physics.steps / (seconds / args.steps))
                line += (f" loop ({label}) {args.steps / seconds:.0f} env steps per CPU second, physics "
                         f"{physics.steps / physics.seconds:.0f}, ratio {ratios[label][-1]:.3f};")
            print(line[:-1], flush=True)
        for label, values in ratios.items():
            print(f"loop / physics ({label}): median {np.median(values):.3f}, mean {np.mean(values):.3f} over "
                  f"{len(values)} rounds")
        splits = {}
        if not args.no_split:
            physics = Physics(here, seed=args.rounds, timed=True)
            physics.run(args.steps)
            physics.envs.close()
            splits["physics alone"] = {"env steps": physics.seconds, **physics.parts}
            splits.update({f"loop ({label})": split(script, args.steps, runs_dir) for label, script in scripts.items()})
            for title, unit in ((f"CPU seconds per 1,000 env steps, one timed run of {args.steps} steps each",
                                 lambda parts: args.steps / 1000),
                                ("the same over each run's own MuJoCo time (a drift of the machine's speed between "
                                 "the runs cancels)", lambda parts: parts[ENV_PARTS[0]])):
                print(f"\n{title}\n{'part':<32}" + "".join(f"{label:>24}" for label in splits))
                for name in splits[list(splits)[-1]]:
                    print(f"{name:<32}" + "".join(f"{parts[name] / unit(parts):>24.4f}" if name in parts else
                                                  f"{'':>24}" for parts in splits.values()))
            print("\nthe ratio to the physics the split leaves room for (each run over its own MuJoCo time; the "
                  "timers' cost included)")
            for label in [k for k in splits if k != "physics alone"]:
                print(f"{label}: " + ", ".join(f"{name} {ratio:.3f}" for name, ratio in
                                              bounds(splits["physics alone"], splits[label]).items()))
    return {"ratios": ratios, "splits": splits}


if __name__ == "__main__":
    main()
