"""Shared test helpers. Also makes the top-level scripts importable as modules (`import ppo_cartpole`)."""
import glob
import os
import sys
from pathlib import Path

import pytest

# Before any test module imports transformers (huggingface_hub reads it at import): never wait on the network.
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _read_events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (event_file,) = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    acc = EventAccumulator(event_file, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


@pytest.fixture
def read_events():
    """The TensorBoard event file of a run directory, loaded: `read_events(run_dir).Scalars(tag)`."""
    return _read_events


@pytest.fixture
def interrupted_run(monkeypatch):
    """Run `module.main(args)` with a Ctrl-C (KeyboardInterrupt) raised from the vector env's step number
    `calls`, and check what an interrupted run must leave: the saved agent, no evaluation, and a closed
    TensorBoard file holding every episode the run saw."""
    import gymnasium as gym

    def run(module, args, calls=300):
        real_make = module.make_vector_env
        steps = 0

        class Interrupt(gym.vector.VectorWrapper):
            def step(self, actions):
                nonlocal steps
                steps += 1
                if steps == calls:
                    raise KeyboardInterrupt
                return self.env.step(actions)

        monkeypatch.setattr(module, "make_vector_env", lambda *a: Interrupt(real_make(*a)))
        try:
            result = module.main(args)
        except KeyboardInterrupt:  # would otherwise stop the whole pytest session
            pytest.fail("a Ctrl-C during training escaped main() instead of ending the run cleanly")
        assert steps == calls
        assert os.path.isfile(os.path.join(result["run_dir"], "agent.pt"))
        assert result["eval_returns"] == []
        acc = _read_events(result["run_dir"])
        assert len(acc.Scalars("charts/episodic_return")) == len(result["episodic_returns"]) > 0
        return result

    return run


@pytest.fixture
def interrupted_evaluation(monkeypatch):
    """Run `module.main(args)` with a Ctrl-C (KeyboardInterrupt) raised as the evaluation after training starts,
    and check that the run returns normally: the agent saved before it, no evaluation logged, and a closed
    TensorBoard file holding every training episode (the writer flushes only every 120 s unless closed)."""

    def run(module, args):
        calls = 0

        def evaluate(*a, **kw):
            nonlocal calls
            calls += 1
            raise KeyboardInterrupt

        monkeypatch.setattr(module, "evaluate", evaluate)
        try:
            result = module.main(args)
        except KeyboardInterrupt:  # would otherwise stop the whole pytest session
            pytest.fail("a Ctrl-C during the evaluation escaped main() instead of ending the run cleanly")
        assert calls == 1
        assert os.path.isfile(os.path.join(result["run_dir"], "agent.pt"))
        assert result["eval_returns"] == []
        acc = _read_events(result["run_dir"])
        assert "eval/episodic_return" not in acc.Tags()["scalars"]
        assert len(acc.Scalars("charts/episodic_return")) == len(result["episodic_returns"]) > 0
        return result

    return run


@pytest.fixture
def checkpoint_reevaluates(tmp_path):
    """Evaluate a short run's saved agent.pt with `--eval-checkpoint`: same weights, same evaluation seeds
    and the deterministic policy must give the returns measured right after training, and nothing is
    trained or logged."""

    def check(module, short_run):
        checkpoint = os.path.join(short_run["run_dir"], "agent.pt")
        assert os.path.isfile(checkpoint)
        args = module.Args(eval_checkpoint=checkpoint, eval_episodes=2, runs_dir=str(tmp_path), cuda=False)
        result = module.main(args)
        assert result["eval_returns"] == short_run["eval_returns"]
        assert not os.listdir(tmp_path)

    return check


@pytest.fixture
def seeded_runs(tmp_path):
    """Two runs with one seed give identical episodic returns; a third with another seed does not."""

    def check(module, small_args):
        a, b, c = (
            module.main(small_args(tmp_path / name, eval_episodes=0, save_model=False, seed=seed))
            for name, seed in (("a", 1), ("b", 1), ("c", 2))
        )
        assert len(a["episodic_returns"]) > 10
        assert a["episodic_returns"] == b["episodic_returns"]
        assert a["episodic_returns"] != c["episodic_returns"]

    return check


@pytest.fixture
def cartpole_run_logs():
    """Check the TensorBoard log of a short CartPole run (2 evaluation episodes): the `present` scalar tags
    are there and the `absent` ones are not, the logged episodic returns are the ones the run returned
    (and equal the episode lengths, as every CartPole step pays 1), the learning rate decayed, and the
    hyperparameters were written. Returns the loaded events for the script's own checks."""

    def check(short_run, present, absent=()):
        acc = _read_events(short_run["run_dir"])
        tags = acc.Tags()
        for tag in present:
            assert tag in tags["scalars"], tag
        for tag in absent:
            assert tag not in tags["scalars"], tag
        logged = [e.value for e in acc.Scalars("charts/episodic_return")]
        assert len(logged) >= 1
        assert logged == pytest.approx(short_run["episodic_returns"])
        assert logged == pytest.approx([e.value for e in acc.Scalars("charts/episodic_length")])
        assert len(acc.Scalars("eval/episodic_return")) == 2
        assert any(tag.startswith("hyperparameters") for tag in tags["tensors"])
        assert acc.Scalars("charts/learning_rate")[-1].value < acc.Scalars("charts/learning_rate")[0].value
        return acc

    return check


@pytest.fixture
def fails_fast(tmp_path):
    """`module.main(small_args(...))` with bad input stops with a one-line message naming `flag`, before any
    run directory exists (so before any training)."""

    def check(module, small_args, kw, flag):
        runs_dir = tmp_path / "runs"
        with pytest.raises(SystemExit, match=flag) as excinfo:
            module.main(small_args(runs_dir, **kw))
        assert "\n" not in str(excinfo.value)
        assert not runs_dir.exists()

    return check
