"""`ppo_atari.py` against CleanRL's `ppo_atari.py`: agent steps per second of PPO on one CPU thread, the same game,
settings and budget, run alternately in fresh processes.

    git clone https://github.com/vwxyzjn/cleanrl ../cleanrl   # tested at fe8d8a03
    pip install opencv-python-headless        # CleanRL's ResizeObservation needs cv2; ppo_atari.py does not
    python benchmarks/cleanrl_atari_speed.py --cleanrl ../cleanrl --env-id ALE/Pong-v5 --steps 8192 --rounds 2
    python benchmarks/cleanrl_atari_speed.py --cleanrl ../cleanrl --env-id ALE/Pong-v5 --steps 10000000 \
        --learn runs_cleanrl     # one learning run of CleanRL's file alone (stop it with Ctrl-C); --seed N
    python benchmarks/cleanrl_atari_speed.py --cleanrl ../cleanrl --env-id ALE/Pong-v5 --compare-envs 3000

CleanRL's file is written for gymnasium 0.29. It is copied, with its `cleanrl_utils/atari_wrappers.py`, into a
temporary folder and changed in the fewest lines that make it run on this project's gymnasium 1.x and ale-py
(PATCHES: ALE's games registered; two wrappers under their 1.x names); nothing else is touched. Its game is the
same game without frame skip or sticky actions (`PongNoFrameskip-v4` for `ALE/Pong-v5`), as ppo_atari.py makes
its own. Both run at their defaults (8 envs x 128 steps, 4 epochs of 4 minibatches) for --steps agent steps
with one torch thread (OMP_NUM_THREADS=1; ppo_atari.py also --num-threads 1), on the CPU, or with --cuda both on
the GPU (each file's own `--cuda`).

Measures, per run: charts/SPS at its last iteration (both files log it as steps since training started over the
wall seconds since then), and the process's CPU seconds per 1,000 agent steps (start-up included).

Under gymnasium 1.x CleanRL's file also differs in what it does, not only in speed: the vector environments
reset on the step after an episode ends (1.x's default), so it takes that step's ignored action and zero reward
as a transition, and it reads `final_info` as 0.29's list of dicts, which 1.x does not give, so it logs no
episodic return. The report says whether its runs logged any.

--learn DIR runs CleanRL's file once, for its learning curve: --steps is its --total-timesteps (so 10000000 is
its own learning-rate schedule), its runs and printed output go to DIR, on one CPU thread. For that, two more
changes (LEARN_PATCHES) make it learn and log as under gymnasium 0.29: the vector environment resets in the step
that ends an episode (0.29's autoreset), and the game scores are read from 1.x's `final_info` (a dict of arrays).
Read its scores with `python benchmarks/atari_scores.py DIR/runs/<run>`.

--compare-envs N steps ppo_atari.py's environment and CleanRL's (its make_env, from the patched file), one each,
seeded alike, with the same N random actions, and reports the steps whose learning reward or episode end differ,
and how far the frames the agents see differ (the largest pixel difference of each step, 0-255).
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (the line as CleanRL writes it, the line here): each must occur exactly once in its file
PATCHES = {
    "cleanrl/ppo_atari.py": [
        ("import gymnasium as gym\n", "import gymnasium as gym\nimport ale_py\ngym.register_envs(ale_py)\n"),
        ("gym.wrappers.GrayScaleObservation(env)", "gym.wrappers.GrayscaleObservation(env)"),
        ("gym.wrappers.FrameStack(env, 4)", "gym.wrappers.FrameStackObservation(env, 4)"),
    ],
    "cleanrl_utils/atari_wrappers.py": [],
}
LEARN_PATCHES = [  # --learn only: 0.29's autoreset, and the scores read where 1.x puts them
    ("        [make_env(args.env_id, i, args.capture_video, run_name) for i in range(args.num_envs)],\n    )",
     "        [make_env(args.env_id, i, args.capture_video, run_name) for i in range(args.num_envs)],\n"
     "        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,\n    )"),
    ("""            if "final_info" in infos:
                for info in infos["final_info"]:
                    if info and "episode" in info:
                        print(f"global_step={global_step}, episodic_return={info['episode']['r']}")
                        writer.add_scalar("charts/episodic_return", info["episode"]["r"], global_step)
                        writer.add_scalar("charts/episodic_length", info["episode"]["l"], global_step)
""", """            if "final_info" in infos and "episode" in infos["final_info"]:
                final = infos["final_info"]
                for i in np.flatnonzero(final["_episode"]):
                    print(f"global_step={global_step}, episodic_return={final['episode']['r'][i]}")
                    writer.add_scalar("charts/episodic_return", final["episode"]["r"][i], global_step)
                    writer.add_scalar("charts/episodic_length", final["episode"]["l"][i], global_step)
"""),
]


def patched(text: str, patches: list[tuple[str, str]], name: str) -> str:
    """text with each (old, new) replaced; a line not found exactly once stops with the file's name."""
    for old, new in patches:
        if text.count(old) != 1:
            raise SystemExit(f"error: {name} has {text.count(old)} copies of {old.strip()!r}, not 1: this "
                             f"CleanRL version differs from the one this script patches (fe8d8a03)")
        text = text.replace(old, new)
    return text


def copy_cleanrl(cleanrl: Path, folder: Path, learn: bool = False) -> Path:
    """CleanRL's ppo_atari.py and its wrappers, patched (learn: LEARN_PATCHES too), in folder; returns the
    script's path."""
    for name, patches in PATCHES.items():
        patches = patches + LEARN_PATCHES if learn and name == "cleanrl/ppo_atari.py" else patches
        source = cleanrl / name
        if not source.is_file():
            raise SystemExit(f"error: --cleanrl {cleanrl} has no {name}: give the root of a CleanRL checkout")
        target = folder / Path(name).name if name.startswith("cleanrl/") else folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(patched(source.read_text(), patches, name))
    (folder / "cleanrl_utils" / "__init__.py").touch()
    return folder / "ppo_atari.py"


def cleanrl_env_id(env_id: str) -> str:
    """ALE/Pong-v5 -> PongNoFrameskip-v4, the id CleanRL's file takes for the same game."""
    if not env_id.startswith("ALE/") or not env_id.endswith("-v5"):
        raise SystemExit(f"error: --env-id {env_id} is not of the form ALE/<Game>-v5")
    return env_id[len("ALE/"):-len("-v5")] + "NoFrameskip-v4"


def commands(side: str, script: Path, env_id: str, steps: int, runs: Path, cuda: bool = False,
             seed: int = 1) -> list[str]:
    """The command line of one run of either side."""
    device = "--cuda" if cuda else "--no-cuda"
    if side == "ours":
        return [sys.executable, str(script), "--env-id", env_id, "--total-timesteps", str(steps), device,
                "--num-threads", "1", "--eval-episodes", "0", "--runs-dir", str(runs), "--seed", str(seed)]
    return [sys.executable, str(script), "--env-id", cleanrl_env_id(env_id), "--total-timesteps", str(steps),
            device, "--seed", str(seed)]


def read_run(runs: Path) -> tuple[float, int]:
    """(the last charts/SPS, how many charts/episodic_return points) of the one run under runs."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    folders = [p for p in runs.iterdir() if p.is_dir()]
    if len(folders) != 1:
        raise RuntimeError(f"{runs} holds {len(folders)} run folders, not 1")
    events = EventAccumulator(str(folders[0]), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    returns = len(events.Scalars("charts/episodic_return")) if "charts/episodic_return" in tags else 0
    return float(events.Scalars("charts/SPS")[-1].value), returns


def time_run(side: str, script: Path, env_id: str, steps: int, folder: Path, cuda: bool = False) -> dict:
    """One run in a fresh process, its runs in folder: SPS, CPU seconds per 1,000 steps, episodic returns."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    folder.mkdir(parents=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    done = subprocess.run(commands(side, script, env_id, steps, folder / "runs", cuda), cwd=folder, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"error: the {side} run failed:\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    sps, returns = read_run(folder / "runs")
    return dict(side=side, sps=sps, cpu_per_1k=1000 * cpu / steps, wall=wall, returns=returns)


def learning_run(script: Path, env_id: str, steps: int, folder: Path, seed: int = 1) -> int:
    """--learn: one run of CleanRL's patched file in folder (runs/ and stdout.log), in the foreground."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    folder.mkdir(parents=True, exist_ok=True)
    command = commands("cleanrl", script, env_id, steps, folder / "runs", seed=seed)
    print(f"CleanRL's file learning in {folder} (output in stdout.log):", " ".join(command[1:]), flush=True)
    with open(folder / "stdout.log", "a") as log:
        try:
            return subprocess.run(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        except KeyboardInterrupt:  # the run got the Ctrl-C too; its TensorBoard file has what it flushed
            print(f"interrupted: the run's scores so far are in {folder / 'runs'}", file=sys.stderr)
            raise SystemExit(130) from None


def compare_envs(script: Path, env_id: str, steps: int, seed: int = 3) -> dict:
    """--compare-envs: ppo_atari.py's env against the make_env of CleanRL's file at `script` (its text up to
    its first network function: imports, Args, make_env; its training is not run), stepped together."""
    sys.path[:0] = [str(ROOT), str(script.parent)]  # ppo_atari; CleanRL's cleanrl_utils
    try:
        import ppo_atari
        scope = {"__name__": "cleanrl_ppo_atari", "__file__": str(script)}
        exec(script.read_text().split("\ndef layer_init")[0], scope)
    finally:
        del sys.path[:2]
    import numpy as np
    ours, theirs = ppo_atari.make_env(env_id)(), scope["make_env"](cleanrl_env_id(env_id), 0, False, "compare")()
    actions = np.random.default_rng(seed).integers(ours.action_space.n, size=steps)
    ours.reset(seed=seed)
    theirs.reset(seed=seed)
    differ, frame_diffs, ends, far_at_ends = 0, [], 0, 0
    for action in actions:
        *mine, _ = ours.step(int(action))
        *other, _ = theirs.step(int(action))
        frame_diffs.append(int(np.abs(np.asarray(mine[0], int) - np.asarray(other[0], int)).max()))
        differ += tuple(mine[1:]) != tuple(other[1:])  # (reward, terminated, truncated)
        if mine[2] or mine[3]:
            ends += 1
            far_at_ends += frame_diffs[-1] > 40
            ours.reset()
            theirs.reset()
    ours.close()
    theirs.close()
    return dict(steps=steps, ends=ends, differ=differ, median=float(np.median(frame_diffs)), max=max(frame_diffs),
                over_40=sum(d > 40 for d in frame_diffs), over_40_at_ends=far_at_ends)


def report(rows: list[dict], env_id: str, steps: int, device: str = "the CPU") -> list[str]:
    """The markdown table: each side's runs, their median SPS and CPU seconds per 1,000 steps."""
    lines = [f"{env_id}, {steps} agent steps a run, one torch thread, on {device}, alternating runs:", "",
             "| file | SPS, each run | median SPS | CPU s per 1,000 steps, median | episodic returns logged |",
             "|---|---|---|---|---|"]
    medians = {}
    for side, name in (("ours", "ppo_atari.py"), ("cleanrl", "CleanRL's ppo_atari.py, patched")):
        mine = [r for r in rows if r["side"] == side]
        medians[side] = statistics.median(r["sps"] for r in mine)
        lines.append("| {} | {} | {:.0f} | {:.2f} | {} |".format(
            name, ", ".join(f"{r['sps']:.0f}" for r in mine), medians[side],
            statistics.median(r["cpu_per_1k"] for r in mine), ", ".join(str(r["returns"]) for r in mine)))
    lines += ["", f"ppo_atari.py's median SPS over CleanRL's: {medians['ours'] / medians['cleanrl']:.2f}x"]
    return lines


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cleanrl", required=True, help="the root of a CleanRL checkout (git clone)")
    parser.add_argument("--env-id", default="ALE/Pong-v5", help="an ALE game id, as ppo_atari.py takes it")
    parser.add_argument("--steps", type=int, default=8192, help="agent steps a run (whole iterations of 1,024)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each file, alternating")
    parser.add_argument("--cuda", action="store_true", help="train both on the GPU (default: the CPU)")
    parser.add_argument("--learn", metavar="DIR", help="instead: one learning run of CleanRL's file, in DIR")
    parser.add_argument("--seed", type=int, default=1, help="--learn: the seed of that run")
    parser.add_argument("--compare-envs", type=int, metavar="N", help="instead: both files' envs for N steps")
    args = parser.parse_args(argv)
    if args.compare_envs is not None and args.compare_envs < 1:
        parser.error("--compare-envs N: N is the steps to compare, at least 1")
    if args.learn and (args.steps < 1024 or args.cuda):
        parser.error("--learn runs CleanRL's file on the CPU for --steps (its --total-timesteps, at least 1024)")
    if not args.learn and (args.steps < 1024 or args.steps % 1024 or args.rounds < 1):
        parser.error("--steps must be a positive multiple of 1024 (8 envs x 128 steps) and --rounds at least 1")
    cleanrl_env_id(args.env_id)
    check = subprocess.run([sys.executable, "-c", "import cv2"], capture_output=True)
    if check.returncode != 0:
        raise SystemExit("error: CleanRL's file needs cv2 (its ResizeObservation): pip install "
                         "opencv-python-headless, then run this again")
    if args.cuda and subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                                    capture_output=True).returncode != 0:
        raise SystemExit("error: --cuda: torch sees no CUDA GPU here; leave --cuda out to time both on the CPU")
    if args.compare_envs:
        with tempfile.TemporaryDirectory() as tmp:
            c = compare_envs(copy_cleanrl(Path(args.cleanrl), Path(tmp)), args.env_id, args.compare_envs)
        lines = [f"{args.env_id}, {c['steps']} steps of the same random actions, {c['ends']} learning episodes "
                 f"ended: {c['differ']} steps with a different reward or episode end; the largest pixel "
                 f"difference of a step's frames: median {c['median']:.0f}, most {c['max']}, over 40 in "
                 f"{c['over_40']} steps ({c['over_40_at_ends']} of them an episode's last)"]
        print(lines[0])
        return lines
    if args.learn:
        folder = Path(args.learn).resolve()
        script = copy_cleanrl(Path(args.cleanrl), folder / "cleanrl", learn=True)
        returncode = learning_run(script, args.env_id, args.steps, folder, args.seed)
        if returncode != 0:
            raise SystemExit(f"error: CleanRL's run failed (exit status {returncode}); see {folder / 'stdout.log'}")
        lines = [f"CleanRL's run ended; its scores: python benchmarks/atari_scores.py {folder / 'runs'}/<run>"]
        print(lines[0])
        return lines
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        scripts = {"ours": ROOT / "ppo_atari.py", "cleanrl": copy_cleanrl(Path(args.cleanrl), tmp / "cleanrl")}
        rows = []
        for i in range(args.rounds):
            for side in ("ours", "cleanrl"):
                rows.append(time_run(side, scripts[side], args.env_id, args.steps, tmp / f"{side}_{i}", args.cuda))
                print(f"{side} round {i + 1}: {rows[-1]['sps']:.0f} SPS, {rows[-1]['cpu_per_1k']:.2f} CPU s "
                      f"per 1,000 steps", flush=True)
    device = "the CPU"
    if args.cuda:
        import torch
        device = f"one {torch.cuda.get_device_name(0)}"
    lines = report(rows, args.env_id, args.steps, device)
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
