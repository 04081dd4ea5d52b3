"""A Ctrl-C at any phase of every script, as a user's shell sees it: the script run as a program (its
`__main__` block), a KeyboardInterrupt raised while it loads or while it trains, and then one line about it, no
traceback, exit status 130 (the shell's code for an interrupt, so that a pipeline does not read success) and,
where the run saved its agent or model, a record of the step it was stopped at. The in-process tests of each script check the rest of an
interrupted run (its logs closed, no evaluation)."""

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def flags_of(script: str, tiny: dict, preferences: str) -> list[str]:
    gym = ["--total-timesteps", "2048", "--eval-episodes", "1"]
    lm = ["--model-name", tiny["policy"], "--response-length", "8", "--min-response-length", "0"]
    rl = [*lm, "--reward-model", tiny["reward"], "--batch-size", "8", "--num-minibatches", "2",
          "--total-episodes", "32", "--eval-episodes", "4"]
    pairs = [*lm, "--preferences", preferences, "--batch-size", "4", "--eval-fraction", "0.25"]
    return {"reinforce.py": [*gym, "--num-envs", "2"], "a2c.py": gym, "ppo_cartpole.py": gym,
            "ppo_walker2d.py": [*gym, "--num-envs", "1", "--num-steps", "256"],
            "ppo_atari.py": [*gym, "--num-envs", "2", "--num-steps", "32", "--env-id", "ALE/Pong-v5"],
            "ppo_rlhf_gpt2.py": [*rl, "--norm-batches", "1"], "grpo_gpt2.py": [*rl, "--num-generations", "4"],
            "dpo_gpt2.py": [*pairs, "--gradient-accumulation-steps", "1", "--eval-episodes", "0"],
            "reward_model_gpt2.py": [*pairs, "--no-probe"]}[script]


@pytest.fixture(scope="module")
def preferences(tmp_path_factory):
    import ppo_rlhf_gpt2 as rlhf

    path = tmp_path_factory.mktemp("prefs") / "preferences.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "chosen": f" great, the best {k}.", "rejected": f" bad {k}."})
                            + "\n" for p in rlhf.PROMPTS[:8] for k in range(3)))
    return str(path)


def run(script: str, phase: str, flags: list[str], runs: Path, monkeypatch, capsys) -> tuple[int, str]:
    """The script run as its own program (its `__main__` block, in this process), with a KeyboardInterrupt raised
    at the phase named: `loading`, the first model or environment the script makes; `training`, the first
    optimizer step. Returns the exit status and what it printed."""
    import gymnasium
    import transformers

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if phase == "loading":
        monkeypatch.setattr(gymnasium.vector.SyncVectorEnv, "__init__", interrupt)
        monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", interrupt)
        monkeypatch.setattr(transformers.AutoModelForSequenceClassification, "from_pretrained", interrupt)
    elif phase == "training":
        for optimizer in (torch.optim.Adam, torch.optim.RMSprop):  # the scripts' optimizers
            monkeypatch.setattr(optimizer, "step", interrupt)
    elif phase == "saving":  # the agent's or the model's file, once training has ended
        monkeypatch.setattr(torch, "save", interrupt)
        monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", interrupt)
    monkeypatch.setattr(sys, "argv", [script, *flags, "--runs-dir", str(runs), "--save-model", "--no-cuda"])
    monkeypatch.setenv("MUJOCO_GL", "egl")
    capsys.readouterr()
    try:
        runpy.run_path(str(ROOT / script), run_name="__main__")
        status = 0
    except SystemExit as e:
        status = e.code
    except KeyboardInterrupt:  # escaped the script: the user would see a traceback and status 130 from Python
        pytest.fail(f"a Ctrl-C while {phase} escaped {script}'s __main__ block")
    return status, capsys.readouterr().out


SCRIPTS = ["reinforce.py", "a2c.py", "ppo_cartpole.py", "ppo_walker2d.py", "ppo_atari.py", "ppo_rlhf_gpt2.py",
           "grpo_gpt2.py", "dpo_gpt2.py", "reward_model_gpt2.py"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_ctrl_c_while_loading_ends_in_one_line_and_status_130(script, tiny, preferences, tmp_path, monkeypatch,
                                                                 capsys):
    status, out = run(script, "loading", flags_of(script, tiny, preferences), tmp_path / "runs", monkeypatch, capsys)
    assert status == 130, out[-2000:]  # not a KeyboardInterrupt escaping as a traceback
    assert out.splitlines()[-1] == "interrupted before training began"


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_ctrl_c_while_training_saves_what_it_has_marked_with_its_step(script, tiny, preferences, tmp_path,
                                                                        monkeypatch, capsys):
    status, out = run(script, "training", flags_of(script, tiny, preferences), tmp_path / "runs", monkeypatch,
                      capsys)
    assert status == 130, out[-2000:]
    lines = [line for line in out.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1 and ("step" in lines[0] or "iteration" in lines[0]), out[-2000:]
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    if script in ("reinforce.py", "a2c.py", "ppo_cartpole.py", "ppo_walker2d.py", "ppo_atari.py"):
        checkpoint = torch.load(run_dir / "agent.pt", weights_only=False)
        # the first update's step: one rollout of environment steps (or whole episodes) done
        assert checkpoint["interrupted_at"] is not None and checkpoint["interrupted_at"] > 0
    else:
        config = json.loads((run_dir / "model" / "config.json").read_text())
        assert config["interrupted_at"] == 1, config  # the step or iteration whose update was cut: the first


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_finished_run_exits_0_and_its_saved_model_says_it_finished(script, tiny, preferences, tmp_path,
                                                                      monkeypatch, capsys):
    status, out = run(script, "none", flags_of(script, tiny, preferences), tmp_path / "runs", monkeypatch, capsys)
    assert status == 0, out[-2000:]
    assert not [line for line in out.splitlines() if line.startswith("interrupted")]
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    if script in ("reinforce.py", "a2c.py", "ppo_cartpole.py", "ppo_walker2d.py", "ppo_atari.py"):
        assert torch.load(run_dir / "agent.pt", weights_only=False)["interrupted_at"] is None
    else:
        assert json.loads((run_dir / "model" / "config.json").read_text())["interrupted_at"] is None


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_ctrl_c_while_saving_ends_in_one_line_and_status_130(script, tiny, preferences, tmp_path, monkeypatch,
                                                               capsys):
    status, out = run(script, "saving", flags_of(script, tiny, preferences), tmp_path / "runs", monkeypatch, capsys)
    assert status == 130, out[-2000:]  # not 0: the saved result is not whole
    assert out.splitlines()[-1].startswith("interrupted"), out[-2000:]
