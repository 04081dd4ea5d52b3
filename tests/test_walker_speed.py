"""Tests of benchmarks/walker_speed.py without judging any speed: its timers count a nested call once, a timed
run of the loop splits into parts that add up and leaves torch, MuJoCo, gymnasium and the script as it found them,
the physics it compares with runs beside the loop and out of its time, and its argument errors."""

from pathlib import Path

import pytest
import torch

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


speed = load_benchmark("walker_speed")


def test_a_timed_call_inside_another_counts_for_the_outer_one_and_a_raise_still_counts():
    timers, calls = speed.Timers(), []
    inner = timers.wrap("inner", lambda: calls.append("inner"))
    outer = timers.wrap("outer", lambda: (inner(), calls.append("outer")))
    outer()
    inner()
    assert calls == ["inner", "outer", "inner"] and set(timers.seconds) == {"outer", "inner"}

    def fails():
        raise ValueError

    with pytest.raises(ValueError):
        timers.wrap("fails", fails)()
    assert "fails" in timers.seconds and not timers.active  # the next call is timed again
    inner()


def test_the_split_adds_up_and_puts_everything_back(tmp_path):
    script = speed.load_script(str(ROOT / "ppo_walker2d.py"), "walker_speed_test")
    torch.set_num_threads(1)
    originals = [(torch.Tensor, "backward"), (torch.optim.Adam, "step"), (torch.nn.utils, "clip_grad_norm_"),
                 (speed.mujoco, "mj_step"), (speed.walker2d_v5.Walker2dEnv, "step"), (script, "make_vector_env"),
                 (script, "time"), (script, "SummaryWriter"), (script, "normalize_obs"), (script.Agent, "get_action"),
                 (script.RunningMeanStd, "update"), (script.RewardScaler, "__call__")]
    before = [getattr(owner, attr) for owner, attr in originals]
    parts = speed.split(script, 2048, str(tmp_path))
    assert [getattr(owner, attr) for owner, attr in originals] == before
    env = parts["env steps"]
    assert sum(parts[name] for name in speed.ENV_PARTS) == pytest.approx(env, abs=1e-9)
    rollout = [*speed.ENV_PARTS, *speed.ROLLOUT, "rest of the rollout"]
    update = [*speed.UPDATE, "rest of the update"]
    assert sum(parts[n] for n in rollout + update + ["logging section and the rest"]) == pytest.approx(
        parts["loop"], abs=1e-9)
    # each part was reached, and the parts left over are not negative: nothing was counted twice
    assert all(parts[name] > 0 for name in [*speed.ENV_PARTS, *speed.ROLLOUT[:3], *speed.UPDATE])
    assert min(parts["rest of the rollout"], parts["rest of the update"]) > 0
    physics = speed.Physics(script, seed=0, timed=True)
    physics.run(1024)
    assert physics.steps == 1024 and sum(physics.parts.values()) == pytest.approx(physics.seconds, abs=1e-9)
    assert speed.mujoco.mj_step is before[3]


def test_the_physics_runs_after_each_rollout_and_its_time_is_left_out_of_the_loop_s(tmp_path):
    script = speed.load_script(str(ROOT / "ppo_walker2d.py"), "walker_speed_test")
    torch.set_num_threads(1)
    class Counted(speed.Physics):
        def run(self, steps):  # as if each batch of physics took 100 s more: the loop's time must lose them
            super().run(steps)
            self.seconds += 100.0

    physics, compute_gae = Counted(script, seed=0), script.compute_gae
    seconds, result = speed.loop_seconds(script, 4096, str(tmp_path), physics=physics)
    assert physics.steps == 4096 and script.compute_gae is compute_gae and len(result["episodic_returns"]) > 0
    assert -200 < seconds < -150  # two rollouts, each followed by 2048 physics steps


@pytest.mark.parametrize("argv", [["--steps", "1000"], ["--steps", "0"], ["--rounds", "0"]])
def test_bad_arguments_fail_fast(argv, capsys):
    with pytest.raises(SystemExit):
        speed.main(argv)
    assert "--steps must be a positive multiple of 2048" in capsys.readouterr().err


def test_the_bounds_take_each_run_over_its_own_mujoco_time_by_hand():
    """Physics alone: 3 s of env steps, 2 of them MuJoCo's. A loop of 10 s, MuJoCo 4 s, its env steps 7 s, its
    update 2 s (six parts of 0.25 s and 0.5 s the rest): per MuJoCo second the physics takes 1.5 s, the loop 2.5,
    the loop less its update 2.0, its env steps 1.75."""
    physics = {"env steps": 3.0, speed.ENV_PARTS[0]: 2.0}
    loop = {"loop": 10.0, "env steps": 7.0, speed.ENV_PARTS[0]: 4.0, "rest of the update": 0.5,
            **{name: 0.25 for name in speed.UPDATE}}
    assert speed.bounds(physics, loop) == pytest.approx({"the loop as timed": 1.5 / 2.5,
                                                          "without the update": 1.5 / 2.0,
                                                          "its env steps alone": 1.5 / 1.75})
