"""Shared test helpers. Also makes the top-level scripts importable as modules (`import ppo_cartpole`)."""
import copy
import glob
import importlib.util
import inspect
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

# Before any test module imports transformers (huggingface_hub reads it at import): never wait on the network.
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load_benchmark(name: str):
    """benchmarks/NAME.py as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read_events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (event_file,) = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    acc = EventAccumulator(event_file, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def read_scalars(run_dir):
    """Every scalar series of the TensorBoard events in run_dir: {tag: [value, ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


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
def interrupted_save(monkeypatch):
    """`interrupted_save(model_class, main, args)`: main(args) with a Ctrl-C (KeyboardInterrupt) raised as
    --save-model writes a model_class; the run must return normally. Returns its result and the number of saves
    tried."""

    def run(model_class, main, args):
        tries = 0

        def save_pretrained(self, *a, **kw):
            nonlocal tries
            tries += 1
            raise KeyboardInterrupt

        monkeypatch.setattr(model_class, "save_pretrained", save_pretrained)
        try:
            return main(args), tries
        except KeyboardInterrupt:  # would otherwise stop the whole pytest session
            pytest.fail("a Ctrl-C while saving escaped main() instead of ending the run cleanly")

    return run


@pytest.fixture
def interrupted_generation(monkeypatch):
    """`interrupted_generation(module, main, args, calls)`: an RL file's main(args) with a Ctrl-C
    (KeyboardInterrupt) raised from module.generate's call number `calls`, the second iteration's: the run
    returns normally, having generated `calls` times, with its first iteration in the closed TensorBoard file,
    and --save-model still saves the policy as trained so far (it differs from args.model_name's)."""
    from transformers import AutoModelForCausalLM

    def run(module, main, args, calls):
        real_generate, made = module.generate, 0

        def generate(*a, **kw):
            nonlocal made
            made += 1
            if made == calls:
                raise KeyboardInterrupt
            return real_generate(*a, **kw)

        monkeypatch.setattr(module, "generate", generate)
        stats = main(args)
        assert made == calls
        scores = [e.value for e in _read_events(stats["run_dir"]).Scalars("objective/scores")]
        assert scores == [pytest.approx(stats["objective/scores"])]
        saved = AutoModelForCausalLM.from_pretrained(Path(stats["run_dir"]) / "model")
        initial = AutoModelForCausalLM.from_pretrained(args.model_name)
        assert any(not torch.equal(a, b) for a, b in zip(saved.parameters(), initial.parameters()))

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
def refuses_foreign_checkpoint(tmp_path, fails_fast):
    """`check(module, small_args, short_run, kind)`: --eval-checkpoint of a file the script did not save (an
    unusable_checkpoint of `kind` made from the short run's agent.pt, or ppo_walker2d.py's) fails fast naming the
    flag."""

    def check(module, small_args, short_run, kind):
        saved = os.path.join(short_run["run_dir"], "agent.pt")
        path = unusable_checkpoint(kind, saved, walker_agent_pt(tmp_path / "walker"), tmp_path / "bad.pt")
        fails_fast(module, small_args, dict(eval_checkpoint=str(path)), "--eval-checkpoint")

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
    (and equal the episode lengths, as every CartPole step pays 1), and the hyperparameters were written.
    Returns the loaded events for the script's own checks (each checks its exact learning-rate schedule)."""

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


@pytest.fixture
def fails_before_loading(tmp_path, monkeypatch):
    """`check(module, run, bad_files, overrides, message)`: a language-model script's main() run with bad input
    (run(**overrides)) stops with a one-line `error: ...` matching `message`, before a model or tokenizer is
    loaded (module.from_pretrained fails the test) and before the run directory tmp_path/runs exists. The
    `bad_files` ({name: (text, message)}) are written to tmp_path first, and --preferences naming one reads it."""

    def check(module, run, bad_files, overrides, message):
        for name, (text, _) in bad_files.items():
            (tmp_path / name).write_bytes(text.encode("latin-1" if name == "latin1" else "utf-8"))
        if overrides.get("preferences") in bad_files:
            overrides["preferences"] = str(tmp_path / overrides["preferences"])

        def no_loading(*a, **kw):
            raise AssertionError("a model or tokenizer was loaded before the error")

        monkeypatch.setattr(module, "from_pretrained", no_loading)
        with pytest.raises(SystemExit, match=f"^error: .*{message}") as error:
            run(**overrides)
        assert "\n" not in str(error.value)
        assert not (tmp_path / "runs").exists()

    return check


def each_bad_value(**values):
    """Cases (kw, flag) of a test_bad_input_fails_fast_naming_the_flag: each value of each field alone (a tuple
    holds several), to be refused naming the field's flag (gae_lambda: --gae-lambda)."""
    return [({field: value}, "--" + field.replace("_", "-"))
            for field, given in values.items() for value in (given if isinstance(given, tuple) else (given,))]


# Bad input a2c.py and reinforce.py both refuse naming the flag: envs their networks cannot play (FrozenLake-v1's
# observations are Discrete, where the MLP needs a flat Box), no steps, a negative number of evaluation episodes, a
# checkpoint that does not exist.
REFUSED_BY_A2C_AND_REINFORCE = each_bad_value(env_id=("Pendulum-v1", "NoSuchEnv-v0", "FrozenLake-v1"),
                                              total_timesteps=0, eval_episodes=-1,
                                              eval_checkpoint="/no/such/agent.pt")


def unusable_checkpoint(kind, saved, foreign, path):
    """Write to `path` a file that `--eval-checkpoint` must refuse, and return `path`: the script's own agent.pt
    `saved` cut short ("truncated"), bytes that are no checkpoint ("corrupt"), another script's agent.pt
    `foreign` ("foreign"), `saved` with its obs_dim raised by one, so the weights have the wrong shape
    ("another network"), or a folder, as ppo_rlhf_gpt2.py saves ("a directory")."""
    if kind == "truncated":  # e.g. a copy or download cut short
        data = Path(saved).read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "corrupt":
        path.write_bytes(b"not a checkpoint\n" * 100)
    elif kind == "foreign":
        path.write_bytes(Path(foreign).read_bytes())
    elif kind == "a directory":
        path.mkdir()
    else:
        assert kind == "another network", kind
        checkpoint = torch.load(saved, weights_only=True)
        checkpoint["obs_dim"] += 1
        torch.save(checkpoint, path)
    return path


def walker_agent_pt(directory):
    """An agent.pt of ppo_walker2d.py (a Gaussian policy, act_dim, normalization statistics) in `directory`."""
    import ppo_walker2d as W

    os.makedirs(directory, exist_ok=True)
    return W.save_agent(W.Agent(17, 6), W.RunningMeanStd(17), W.RewardScaler(1, 0.99, 10.0), W.Args(), 17, 6,
                        str(directory))


def cartpole_agent_pt(directory):
    """An agent.pt of ppo_cartpole.py (a Categorical policy, n_actions, no statistics) in `directory`."""
    import ppo_cartpole as C

    os.makedirs(directory, exist_ok=True)
    return C.save_agent(C.Agent(4, 2), C.Args(), 4, 2, str(directory))


# ---------------------------------------------------------------------------- watching a real run (wiring tests)


class TinyEnv(gym.Env):
    """A deterministic env small enough to work a rollout out by hand, for the wiring tests.

    The observation is [t], the number of steps taken in the episode; step t pays 1 + t. Action 1 (in the Box
    variant: a positive action) taken at t = 2 terminates the episode; otherwise the time limit truncates it after
    4 steps, with final observation [4], a state the agent never acts on. A random policy meets both endings.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def __init__(self, box=False):
        self.box = box
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if box else gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action):
        stop = action[0] > 0 if self.box else action == 1
        reward, terminated = 1.0 + self.t, self.t == 2 and bool(stop)
        self.t += 1
        return np.array([float(self.t)], dtype=np.float32), reward, terminated, False, {}


gym.register("TinyDiscrete-v0", entry_point=TinyEnv, max_episode_steps=4, kwargs={"box": False})
gym.register("TinyBox-v0", entry_point=TinyEnv, max_episode_steps=4, kwargs={"box": True})


def check_same_step_autoreset(make_vector_env, env_id, actions):
    """A script's make_vector_env, stepped by hand on TinyDiscrete-v0 or TinyBox-v0 with env 0 always ending its
    episode at t = 2 (actions[0]) and env 1 never (actions[1]), so that it is truncated after 4 steps: each
    episode's end is reported in the step that ends it, with the final observation in infos and the next
    episode's first observation returned (SAME_STEP; the default NEXT_STEP would return the final one), and
    the vector env records the raw episode returns (1 + 2 + 3 and 1 + 2 + 3 + 4) and lengths."""
    envs = make_vector_env(env_id, 2)
    obs, _ = envs.reset(seed=0)
    assert obs[:, 0].tolist() == [0.0, 0.0]
    seen = []
    for _ in range(4):
        obs, rewards, terminations, truncations, infos = envs.step(np.array(actions))
        final = [infos["final_obs"][i][0] if infos.get("_final_obs", [False, False])[i] else None for i in (0, 1)]
        ended = [(float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i]))
                 if infos.get("_episode", [False, False])[i] else None for i in (0, 1)]
        seen.append((obs[:, 0].tolist(), rewards.tolist(), terminations.tolist(), truncations.tolist(), final, ended))
    envs.close()
    assert seen == [
        ([1.0, 1.0], [1.0, 1.0], [False, False], [False, False], [None, None], [None, None]),
        ([2.0, 2.0], [2.0, 2.0], [False, False], [False, False], [None, None], [None, None]),
        # env 0's pole falls at t = 2: its final observation [3] in infos, the new episode's [0] returned
        ([0.0, 3.0], [3.0, 3.0], [True, False], [False, False], [3.0, None], [(6.0, 3), None]),
        # env 1 is cut by the time limit after 4 steps (final observation [4]); env 0 is one step in
        ([1.0, 0.0], [1.0, 4.0], [False, False], [False, True], [None, 4.0], [None, (10.0, 4)]),
    ]


def mlp_by_hand(net, x):
    """What a network of two tanh hidden layers and a linear output computes, worked out in float64 numpy from
    its three Linear layers' weights, not by calling it: tanh(x W1' + b1), then tanh(. W2' + b2), then
    . W3' + b3. Gives every bias random values first (they start at 0), so that a lost bias shows."""
    layers = [m for m in net if isinstance(m, torch.nn.Linear)]
    assert len(layers) == 3
    h = np.asarray(x, dtype=np.float64)
    for i, layer in enumerate(layers):
        with torch.no_grad():
            layer.bias.copy_(torch.randn_like(layer.bias) * 0.1)
        w, b = layer.weight.detach().double().numpy(), layer.bias.detach().double().numpy()
        h = h @ w.T + b
        h = np.tanh(h) if i < 2 else h
    return h


def check_categorical_agent_by_hand(module):
    """A discrete script's Agent against what its networks compute worked out by hand (mlp_by_hand), with
    a policy far from uniform so that a wrong formula shows: the values, the log-probabilities of given
    actions, the entropies and the greedy actions. Returns the agent, the observations and the log-softmax
    by hand, for checks of a script's own extra paths."""
    torch.manual_seed(0)
    agent = module.Agent(4, 3)
    with torch.no_grad():
        agent.actor[-1].weight.mul_(300.0)
    x = torch.randn(64, 4)
    value, logits = mlp_by_hand(agent.critic, x)[:, 0], mlp_by_hand(agent.actor, x)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    action = torch.arange(64) % 3
    _, logprob, entropy, new_value = agent.get_action_and_value(x, action)
    np.testing.assert_allclose(new_value.detach().numpy(), value, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logprob.detach().numpy(), log_probs[range(64), action], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(entropy.detach().numpy(), -(np.exp(log_probs) * log_probs).sum(-1), rtol=1e-4,
                               atol=1e-5)
    assert entropy.min() < 0.5  # states where the policy is far from uniform
    # evaluation plays each row's most probable action
    assert agent.greedy_action(x).tolist() == logits.argmax(-1).tolist() and len(set(logits.argmax(-1))) > 1
    return agent, x, log_probs


def check_one_step_gae(compute_gae, array):
    """A rollout of num_steps 1 (arrays made by `array`: torch.tensor or np.array): nothing flows in from later
    steps; the truncated env 1 bootstraps from its final observation's value, the terminated env 2 does not."""
    rewards, values = array([[1.0, 2.0, 3.0]]), array([[0.5, 1.0, 1.5]])
    next_values, terminations = array([[2.0, 4.0, 100.0]]), array([[0.0, 0.0, 1.0]])
    advantages, returns = compute_gae(rewards, values, next_values, terminations, array([[0.0, 1.0, 1.0]]), 0.5, 0.9)
    assert advantages.tolist() == [[1.0 + 1.0 - 0.5, 2.0 + 2.0 - 1.0, 3.0 - 1.5]]
    assert returns.tolist() == [[2.0, 4.0, 3.0]]


def as_numpy(x):
    """A float64 (or bool) numpy copy of a tensor or array; anything else as it is."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x.copy() if x.dtype == bool else x.astype(np.float64)
    return x


class RunSpy:
    """What reaches the math during a real `module.main(args)` run, watched from outside: the scripts have no test
    hooks, so the watched pure functions, the `Agent` class and `make_vector_env` are replaced in the module by
    recording wrappers of the real ones (undone after the test).

    calls:          every call of the watched functions, in order: {"name", "args" (by parameter name, numpy
                    copies), "result", "agent" (a copy of the agent at that moment)}
    acted:          each rollout forward pass that sampled actions: (observations, actions, log-probabilities)
    agent:          the agent main() built; initial_agent: a copy of it as it was built
    segments:       the vector env's own record, one per reset: the observations it returned ("obs", one more
                    than steps), and per step "actions", "rewards", "terminated", "truncated" and "final_obs"
                    (NaN where no episode ended)
    """

    def __init__(self, monkeypatch, module, functions):
        self.calls, self.acted, self.segments = [], [], []
        self.agent = self.initial_agent = None
        for name in functions:
            self._watch_function(monkeypatch, module, name)
        self._watch_agent(monkeypatch, module)
        self._watch_envs(monkeypatch, module)

    def _watch_function(self, monkeypatch, module, name):
        real = getattr(module, name)
        signature = inspect.signature(real)

        def watched(*args, **kwargs):
            arguments = {k: as_numpy(v) for k, v in signature.bind(*args, **kwargs).arguments.items()}
            result = real(*args, **kwargs)
            recorded = tuple(map(as_numpy, result)) if isinstance(result, tuple) else as_numpy(result)
            self.calls.append({"name": name, "args": arguments, "result": recorded, "agent": copy.deepcopy(self.agent)})
            return result

        monkeypatch.setattr(module, name, watched)

    def _watch_agent(self, monkeypatch, module):
        spy = self

        class WatchedAgent(module.Agent):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                spy.agent, spy.initial_agent = self, copy.deepcopy(self)

            def get_action(self, x):  # the rollout's forward pass in the PPO scripts
                action, logprob = super().get_action(x)
                spy.acted.append((as_numpy(x), as_numpy(action), as_numpy(logprob)))
                return action, logprob

            def get_action_and_value(self, x, action=None):  # samples in a2c.py's and reinforce.py's rollouts
                out = super().get_action_and_value(x, action)
                if action is None:
                    spy.acted.append((as_numpy(x), as_numpy(out[0]), as_numpy(out[1])))
                return out

        monkeypatch.setattr(module, "Agent", WatchedAgent)

    def _watch_envs(self, monkeypatch, module):
        segments, make_vector_env = self.segments, module.make_vector_env

        class Recorder(gym.vector.VectorWrapper):
            def reset(self, **kwargs):
                obs, infos = self.env.reset(**kwargs)
                segments.append({"obs": [as_numpy(obs)], "actions": [], "rewards": [], "terminated": [],
                                 "truncated": [], "final_obs": []})
                return obs, infos

            def step(self, actions):
                obs, rewards, terminated, truncated, infos = self.env.step(actions)
                final_obs = np.full(obs.shape, np.nan)
                for i in np.flatnonzero(infos.get("_final_obs", [])):
                    final_obs[i] = infos["final_obs"][i]
                for key, value in (("obs", obs), ("actions", actions), ("rewards", rewards),
                                   ("terminated", terminated), ("truncated", truncated), ("final_obs", final_obs)):
                    segments[-1][key].append(as_numpy(np.asarray(value)))
                return obs, rewards, terminated, truncated, infos

        monkeypatch.setattr(module, "make_vector_env", lambda *a, **kw: Recorder(make_vector_env(*a, **kw)))

    def rollout(self, start, length, segment=0):
        """Steps start .. start+length-1 after a reset, as the env played them: `obs` (the observations acted on),
        `next_obs` (the one after the last step), `rewards`, `terminated`, `truncated`, `dones`, `final_obs`,
        each with a leading time axis."""
        record = self.segments[segment]
        assert start + length <= len(record["rewards"]), "the run played fewer steps than asked for"
        steps = {key: np.stack(record[key][start : start + length])
                 for key in ("actions", "rewards", "terminated", "truncated", "final_obs")}
        return SimpleNamespace(obs=np.stack(record["obs"][start : start + length]),
                               next_obs=record["obs"][start + length],
                               dones=steps["terminated"] | steps["truncated"], **steps)

    def updates(self, first):
        """The calls grouped by update: each group starts with a call of `first` (the advantage computation)."""
        groups = []
        for call in self.calls:
            if call["name"] == first:
                groups.append([])
            if groups:
                groups[-1].append(call)
        return groups


@pytest.fixture
def spy(monkeypatch):
    """`spy(module, ["compute_gae", "policy_loss"])` before `module.main(args)`: a RunSpy of that run."""
    return lambda module, functions=(): RunSpy(monkeypatch, module, functions)


@pytest.fixture
def optimizer_steps():
    """Every optimizer step taken during the test, as it is about to be applied: `grads` (a copy of each
    parameter's gradient, zeros where it has none, in the optimizer's order) and `norm` (their global norm)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    steps = []

    def record(optimizer, args, kwargs):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()
        steps.append(SimpleNamespace(grads=grads, norm=norm))

    handle = register_optimizer_step_pre_hook(record)
    yield steps
    handle.remove()


def value_of(agent, obs):
    """The critic's values of observations, as float64 numpy."""
    with torch.no_grad():
        return agent.get_value(torch.as_tensor(obs, dtype=torch.float32)).double().numpy()


def check_ppo_update_wiring(watch, args, norm_adv, logprob_atol):
    """For a PPO run watched by `spy(module, ["compute_gae", "policy_loss", "value_loss"])`: each update starts
    from the policy that acted (ratio 1 on the first minibatch), every epoch passes over each rollout sample once
    with its stored log-prob, return and (unnormalized or per-minibatch standardized) advantage, and the update
    lowers the critic's loss on the batch."""
    updates = watch.updates(first="compute_gae")
    assert len(updates) == args.num_iterations
    for iteration, (gae, *losses) in enumerate(updates):
        advantages, returns = gae["result"]
        acted = watch.acted[iteration * args.num_steps : (iteration + 1) * args.num_steps]
        pg = [call["args"] for call in losses if call["name"] == "policy_loss"]
        vf = [call for call in losses if call["name"] == "value_loss"]
        assert len(pg) == len(vf) == args.update_epochs * args.num_minibatches
        # the first minibatch is scored by the policy that acted, on the stored states and actions: ratio 1
        np.testing.assert_allclose(pg[0]["newlogprob"], pg[0]["logprobs"], rtol=0, atol=logprob_atol)
        for epoch in range(args.update_epochs):
            minibatches = range(epoch * args.num_minibatches, (epoch + 1) * args.num_minibatches)
            # every epoch passes over each sample of the rollout once
            seen = lambda key, calls: np.sort(np.concatenate([calls[i][key] for i in minibatches]))
            np.testing.assert_array_equal(seen("logprobs", pg), np.sort(np.concatenate([lp for _, _, lp in acted])))
            np.testing.assert_allclose(seen("returns", [c["args"] for c in vf]), np.sort(returns.ravel()), rtol=1e-6)
            if not norm_adv:
                np.testing.assert_allclose(seen("advantages", pg), np.sort(advantages.ravel()), rtol=1e-6)
        for call in pg:
            if norm_adv:  # detail 7: each minibatch's advantages standardized
                assert call["advantages"].mean() == pytest.approx(0.0, abs=1e-6)
                assert call["advantages"].std(ddof=1) == pytest.approx(1.0, rel=1e-5)
        # the critic is fitted to the returns: the update lowers its loss on the batch
        obs = np.concatenate([x for x, _, _ in acted])
        after = updates[iteration + 1][0]["agent"] if iteration + 1 < len(updates) else watch.agent
        losses = [np.mean((value_of(critic, obs) - returns.ravel()) ** 2) for critic in (gae["agent"], after)]
        assert losses[1] < losses[0]


EOS = "<|endoftext|>"
# reviews the tiny tokenizers also learn from, beside the prompts
REVIEWS = ["It was great. I loved it. The best film of the year.", "Terrible acting, an awful plot. A bad movie.",
           "Some scenes work. Others do not."]


def byte_level_bpe(texts, vocab_size):
    """A byte-level BPE tokenizer (GPT-2's kind) of vocab_size tokens trained on `texts`, EOS its one special
    token: the tokenizers.Tokenizer, and it wrapped for transformers with EOS as its bos, eos and unk token (and no
    pad token, like GPT-2's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return tokenizer, PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=EOS, eos_token=EOS,
                                              unk_token=EOS)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """For the RLHF files' tests: a tiny GPT-2 policy (with dropout in its config, sdpa attention, no pad token,
    like GPT-2), and a tiny sequence-classification reward model, saved to a temporary directory."""
    from tokenizers import Tokenizer
    from transformers import (GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel, LlamaConfig,
                              LlamaForCausalLM, PreTrainedTokenizerFast)

    import ppo_rlhf_gpt2 as rlhf

    root = tmp_path_factory.mktemp("tiny_models")
    tokenizer, hf_tokenizer = byte_level_bpe(rlhf.PROMPTS + REVIEWS, 400)
    assert hf_tokenizer.pad_token is None
    eos_id = hf_tokenizer.eos_token_id

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(hf_tokenizer), n_positions=128, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=eos_id, eos_token_id=eos_id)
    assert config.resid_pdrop > 0 and config.attn_pdrop > 0  # dropout must be switched off by the script
    GPT2LMHeadModel(config).save_pretrained(root / "policy")
    hf_tokenizer.save_pretrained(root / "policy")
    reward_config = GPT2Config(vocab_size=len(hf_tokenizer), n_positions=128, n_embd=32, n_layer=1, n_head=2,
                               num_labels=2, bos_token_id=eos_id, eos_token_id=eos_id)
    GPT2ForSequenceClassification(reward_config).save_pretrained(root / "reward")
    hf_tokenizer.save_pretrained(root / "reward")
    # a Llama-architecture policy (SmolLM2's) with the same tokenizer
    LlamaForCausalLM(LlamaConfig(vocab_size=len(hf_tokenizer), hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                 max_position_embeddings=128, bos_token_id=eos_id, eos_token_id=eos_id)
                     ).save_pretrained(root / "llama")
    hf_tokenizer.save_pretrained(root / "llama")
    # a model that reads other tokens (a larger vocabulary): not a valid value model for the policy
    GPT2LMHeadModel(GPT2Config(vocab_size=len(hf_tokenizer) + 10, n_positions=128, n_embd=32, n_layer=1,
                               n_head=2)).save_pretrained(root / "other_vocab")
    # a policy whose tokenizer has its own pad token inside the vocabulary
    padded = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer.to_str()), bos_token=EOS,
                                     eos_token=EOS, unk_token=EOS, pad_token="<pad>")
    assert padded.pad_token_id < len(padded)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(padded), n_positions=128, n_embd=32, n_layer=2, n_head=2,
                               bos_token_id=eos_id, eos_token_id=eos_id)).save_pretrained(root / "padded")
    padded.save_pretrained(root / "padded")
    return {"policy": str(root / "policy"), "reward": str(root / "reward"), "llama": str(root / "llama"),
            "padded": str(root / "padded"), "root": root}


# ---------------------------------------------------------------- values where they can be wrong (issue 41)


class TinyRenderModeEnv(TinyEnv):
    """TinyEnv that takes the render_mode gym.make may pass (ppo_walker2d.py's evaluation does), so that a
    TinyBox agent's checkpoint can be evaluated."""

    def __init__(self, box=False, render_mode=None):
        super().__init__(box)
        self.render_mode = render_mode


gym.register("TinyBoxRenderMode-v0", entry_point=TinyRenderModeEnv, max_episode_steps=4, kwargs={"box": True})



def played_by_hand(env_id, seeds, act):
    """The return of one episode per seed, played here with gym.make(env_id) reset with that seed and `act`
    (observation -> action) until it terminates or is truncated: what an evaluation of independent episodes
    must give."""
    env = gym.make(env_id)
    returns = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        done, total = False, 0.0
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def tanh_mlp(net, x):
    """A network of Linear and Tanh layers applied in float64 numpy from its weights (mlp_by_hand without
    changing the biases), to one observation or a batch."""
    h = np.asarray(x, dtype=np.float64)
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            h = h @ layer.weight.detach().double().numpy().T + layer.bias.detach().double().numpy()
        else:
            assert isinstance(layer, torch.nn.Tanh)
            h = np.tanh(h)
    return h


def check_greedy_evaluation_draws_independent_episodes(module):
    """A discrete script's `evaluate` on CartPole-v1 (each seed its own start state) with a fixed agent:
    episode i is the greedy policy's episode from seed `seed + i`, argmax worked out in numpy, so the returns
    are independent draws, not one episode repeated."""
    torch.manual_seed(0)
    agent = module.Agent(4, 2)
    with torch.no_grad():  # a policy whose greedy action depends on the state, so that episodes differ more
        agent.actor[-1].weight.mul_(100.0)
    returns = module.evaluate(agent, "CartPole-v1", 5, 1000, torch.device("cpu"))
    expected = played_by_hand("CartPole-v1", range(1000, 1005),
                              lambda obs: int(np.argmax(tanh_mlp(agent.actor, obs))))
    assert returns == expected
    assert len(set(expected)) > 1


def finished_episodes(watch, per_env_and_reset=None):
    """Every episode the watched run's envs finished, from their own record, in the order a vector env reports
    them (step by step, env by env): (env steps taken when it ended, its return as the sum of the raw rewards,
    its length). `per_env_and_reset`: only each env's first this-many episodes after each reset (REINFORCE's
    batches)."""
    episodes, steps = [], 0
    for segment in watch.segments:
        num_envs = len(segment["obs"][0])
        totals, lengths, ended = np.zeros(num_envs), np.zeros(num_envs, dtype=int), np.zeros(num_envs, int)
        steps_record = zip(segment["rewards"], segment["terminated"], segment["truncated"])
        for rewards, terminated, truncated in steps_record:
            steps += num_envs
            totals, lengths = totals + rewards, lengths + 1
            for i in np.flatnonzero(terminated | truncated):
                if per_env_and_reset is None or ended[i] < per_env_and_reset:
                    episodes.append((steps, float(totals[i]), int(lengths[i])))
                ended[i] += 1
                totals[i], lengths[i] = 0.0, 0
    return episodes


def check_logged_episodes(watch, events, result, per_env_and_reset=None):
    """The episodic returns and lengths a run logged and returned are the watched envs' own
    (finished_episodes), each at the env step it ended, on an env where a return is not a length (TinyDiscrete
    and TinyBox pay 1 + t)."""
    expected = finished_episodes(watch, per_env_and_reset)
    returns, lengths = events.Scalars("charts/episodic_return"), events.Scalars("charts/episodic_length")
    assert [(e.step, e.value, f.value) for e, f in zip(returns, lengths)] == expected
    assert len(returns) == len(lengths) == len(expected)
    assert result["episodic_returns"] == [r for _, r, _ in expected]
    assert any(r != n for _, r, n in expected)


def check_checkpoint_plays_its_own_env(module, watch, run, tmp_path):
    """A discrete script's agent.pt saved by a watched TinyDiscrete-v0 run (`run`, default --seed 1, 2
    evaluation episodes), evaluated with --eval-checkpoint and the evaluating command's default --env-id
    (CartPole-v1): it plays the saved env with the saved weights (the greedy action worked out in numpy), as
    the run's own evaluation did."""
    trained = copy.deepcopy(watch.agent)  # before --eval-checkpoint builds another agent

    def greedy(obs):
        return int(np.argmax(tanh_mlp(trained.actor, obs)))

    assert run["eval_returns"] == played_by_hand("TinyDiscrete-v0", range(100_001, 100_003), greedy)
    args = module.Args(eval_checkpoint=os.path.join(run["run_dir"], "agent.pt"), eval_episodes=3, seed=5,
                       runs_dir=str(tmp_path / "eval"), cuda=False)
    assert args.env_id == "CartPole-v1"
    evaluated = module.main(args)
    assert evaluated["eval_returns"] == played_by_hand("TinyDiscrete-v0", range(100_005, 100_008), greedy)


def run_torchrun(root: Path, name: str, flags: list, processes: int):
    """root/driver.py with the flags, under torchrun with `processes` processes (plain python for one), its runs
    in root/name/runs; a run that hangs is stopped, all its processes with it, after 10 minutes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                str(processes)] if processes > 1 else [sys.executable]
    (root / name).mkdir()
    # a session of its own, so that a run that hangs is stopped with all its processes
    process = subprocess.Popen(launcher + [str(root / "driver.py"), *flags, "--runs-dir", str(root / name / "runs")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def check_evaluation_samples_as_saved(module, make_args, tmp_path, capsys, **train_flags):
    """An RL file's policy trained (module.main(make_args(folder, **flags)), with train_flags) to sample 5 tokens
    at temperature 1.3, ending at EOS from token 2 on, then evaluated by a command with other sampling flags: the
    evaluation samples as the policy was trained to (the same responses and scores as the training run's own
    final evaluation), and says which flags it overrode. Returns the evaluation's result, what it printed, the
    policy's folder and the sampling flags, for the script's own checks."""
    trained = dict(response_length=5, min_response_length=2, temperature=1.3, stop_token="eos",
                   max_query_length=12)
    stats = module.main(make_args(tmp_path / "train", save_model=True, eval_episodes=6, **train_flags, **trained))
    model_dir = Path(stats["run_dir"]) / "model"
    policy = make_args(tmp_path).model_name
    assert json.loads((model_dir / "sampling.json").read_text()) == {**trained, "model_name": policy}
    capsys.readouterr()
    again = module.main(make_args(tmp_path / "eval", eval_checkpoint=str(model_dir), eval_episodes=6))
    final = stats["eval"]["final"]
    assert again["eval"]["final"]["samples"] == final["samples"]
    assert again["eval"]["final"]["raw_scores"] == final["raw_scores"]
    printed = capsys.readouterr().out
    for flag, value in [("--response-length", 5), ("--temperature", 1.3), ("--stop-token", "eos"),
                        ("--min-response-length", 2), ("--max-query-length", 12)]:
        assert f"{flag} {value}, as saved with the policy" in printed
    return again, printed, model_dir, trained


def bf16_run(module, args, monkeypatch):
    """A language-model script's main(args), watched: the dtypes of the outputs of its models' matrix-multiplying
    layers (those with a 2-D weight, embeddings aside), hooked on what load_policy and load_value_model return (so
    also on the RL files' reference, the policy's copy), on the backbone of load_reward_model's, and ("reward") on
    a sequence classifier an RL file's from_pretrained loads, its reward model; and after each Adam step those of
    the trained parameters and of Adam's state. Returns the logged scalars (none for --eval-checkpoint), {model:
    dtypes} of the models that ran, and a set of dtypes per step."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    outputs = {}

    def hooked(model, name):
        seen = outputs.setdefault(name, set())
        for layer in model.modules():
            weight = getattr(layer, "weight", None)
            if torch.is_tensor(weight) and weight.dim() == 2 and not isinstance(layer, torch.nn.Embedding):
                layer.register_forward_hook(lambda m, a, output: seen.add(output.dtype))
        return model

    real_from_pretrained = module.from_pretrained
    monkeypatch.setattr(module, "from_pretrained", lambda auto_class, *a, **kw: hooked(
        real_from_pretrained(auto_class, *a, **kw), "reward") if auto_class is module.AutoModelForSequenceClassification
        and not hasattr(module, "load_reward_model") else real_from_pretrained(auto_class, *a, **kw))
    for loader in ("load_policy", "load_value_model", "load_reward_model"):
        if hasattr(module, loader):
            def load(*a, real=getattr(module, loader), name=loader[5:]):
                model = real(*a)
                hooked(model.base_model if name == "reward_model" else model, name)
                return model
            monkeypatch.setattr(module, loader, load)
    steps = []  # Adam's (not the reward model's L-BFGS probe, fitted in float64)
    handle = register_optimizer_step_post_hook(lambda optimizer, a, kw: isinstance(optimizer, torch.optim.Adam)
                                               and steps.append({t.dtype for group in optimizer.param_groups
                                                                 for p in group["params"]
                                                                 for t in [p, *optimizer.state[p].values()]
                                                                 if torch.is_tensor(t)}))
    try:
        stats = module.main(args)
    finally:
        handle.remove()
    return (read_scalars(stats["run_dir"]) if "run_dir" in stats else {}, {k: v for k, v in outputs.items() if v},
            steps)


def run_one_and_two_processes(root, flags):
    """run_torchrun with the flags in one process (in root/one) and in two (root/two); each must succeed."""
    for name, processes in (("one", 1), ("two", 2)):
        result = run_torchrun(root, name, flags, processes)
        assert result.returncode == 0, result.stderr[-3000:]


# The driver scripts of the RL files' torchrun tests (DRIVER in test_ppo_rlhf_gpt2.py and test_grpo_gpt2.py) import
# their script as `script` and share these lines (filled in by torchrun_folder): the end of their stand-in for
# generate, its responses scored by the policy (their log-probs recomputed), and the gradient norm of each
# optimizer step, before clipping, recorded in `norms` by record_norm; recording_destroy, main()'s
# destroy_process_group followed by the count, in `left`, of gloo's threads still running in the process (Linux):
# a thread left there can outlive the interpreter and abort the finished process as it exits.
DRIVER_LINES = {
    "scored_responses": """    responses = torch.stack(rows).to(queries.device)
    logits = script.response_logits(policy, torch.cat([queries, responses], 1), queries.shape[1], temperature,
                                    pad_token_id)
    return responses, script.gather_logprobs(logits, responses)""",
    "recorded_norms": """norms, clip = [], script.nn.utils.clip_grad_norm_
def record_norm(parameters, max_norm):
    norms.append(clip(parameters, max_norm).item())
    return norms[-1]""",
    "recorded_exit": """left, real_destroy = [], torch.distributed.destroy_process_group
def recording_destroy():
    real_destroy()
    left.append(sum("gloo" in open(f"/proc/self/task/{t}/comm").read() for t in os.listdir("/proc/self/task")))""",
}


def torchrun_folder(tmp_path_factory, repo, prompts, driver, policy, count):
    """A folder for a torchrun test of an RL file: prompts.txt with the first `count` of its `prompts` of the most
    common token length under the policy's tokenizer (so that one process's queries are padded as in the batch
    of all), and driver.py, the `driver` template filled with the repository `repo`, the tokenizer's size, the
    id of "." after "x" (a stop token) and DRIVER_LINES. Returns the folder and the prompts."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("torchrun")
    tokenizer = AutoTokenizer.from_pretrained(policy)
    lengths = {p: len(tokenizer.encode(p)) for p in prompts}
    common_length = max(set(lengths.values()), key=list(lengths.values()).count)
    prompts = [p for p in prompts if lengths[p] == common_length][:count]
    (root / "prompts.txt").write_text("\n".join(prompts))
    stop_id = tokenizer.encode("x.")[-1]
    (root / "driver.py").write_text(driver.format(repo=str(repo), stop_id=stop_id, vocab_size=len(tokenizer),
                                                  **DRIVER_LINES))
    return root, prompts


def check_every_quantity_where_it_belongs(events, watch, args, updates_of, by_hand_policy, logprob_atol):
    """The gym PPO scripts' main() wiring, for a run watched by spy(module, ["compute_gae", "policy_loss",
    "value_loss"]) and its TensorBoard events: each minibatch's rows, returns, standardized advantages, new
    log-probs and values against numbers worked out here (updates_of(watch, args): the rollout's rows and each
    minibatch's calls; by_hand_policy(agent, obs, actions): log-probs and entropies), and every logged loss and
    statistic. The run must hold what tells right from wrong: terminations, truncations, a rollout end inside an
    episode, ratios outside the clip range on both sides."""
    logged = {tag: [e.value for e in events.Scalars(tag)] for tag in LOGGED}
    updates = updates_of(watch, args)
    assert len(updates) == args.num_iterations == 3
    ratios = []
    for iteration, (rows, minibatches) in enumerate(updates):
        assert len(minibatches) == args.update_epochs * args.num_minibatches
        partitions = []
        for epoch in range(args.update_epochs):
            in_epoch = minibatches[epoch * args.num_minibatches : (epoch + 1) * args.num_minibatches]
            # each epoch passes over every sample of the rollout once, in minibatches of minibatch_size (a
            # row stands for all rows identical to it, which the minibatches cannot tell apart)
            assert all(len(mb["rows"]) == args.minibatch_size for mb in in_epoch)
            seen = np.concatenate([mb["rows"] for mb in in_epoch])
            assert sorted(seen) == sorted(which_rows(rows, rows["logprobs"], rows["values"], rows["returns"]))
            partitions.append(sorted(tuple(sorted(mb["rows"])) for mb in in_epoch))
        # detail 6: the batch is shuffled again for every epoch
        assert partitions[0] != partitions[1] != partitions[2]
        for mb in minibatches:
            r, pg, vf = mb["rows"], mb["pg"]["args"], mb["vf"]["args"]
            # each sample's own return; its advantage standardized within the minibatch (detail 7)
            np.testing.assert_allclose(vf["returns"], rows["returns"][r], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(pg["advantages"], standardized(rows["advantages"][r]), atol=1e-4)
            # the new log-probability and value: the current agent on the sample's observation and (sampled,
            # unclipped) action
            with torch.no_grad():
                newlogprob, _ = by_hand_policy(mb["agent"], rows["obs"][r], rows["actions"][r])
            np.testing.assert_allclose(pg["newlogprob"], newlogprob.numpy(), atol=logprob_atol)
            np.testing.assert_allclose(vf["newvalue"], value_of(mb["agent"], rows["obs"][r]), atol=1e-5)
            ratios.append(np.exp(pg["newlogprob"] - pg["logprobs"]))
        # the logs: the last minibatch's losses and statistics, the clip fraction of all minibatches, the
        # explained variance of the rollout's values as predictions of its returns, this iteration's rate
        last = minibatches[-1]
        logratio = last["pg"]["args"]["newlogprob"] - last["pg"]["args"]["logprobs"]
        with torch.no_grad():
            _, entropy = by_hand_policy(last["agent"], rows["obs"][last["rows"]],
                                        rows["actions"][last["rows"]])
        clipped = [np.abs(np.exp(mb["pg"]["args"]["newlogprob"] - mb["pg"]["args"]["logprobs"]) - 1)
                   > args.clip_coef for mb in minibatches]
        expected = {
            "charts/learning_rate": args.learning_rate * (1 - iteration / args.num_iterations),
            "losses/value_loss": last["vf"]["result"],
            "losses/policy_loss": last["pg"]["result"][0],
            "losses/entropy": entropy.mean().item(),
            "losses/old_approx_kl": np.mean(-logratio),
            "losses/approx_kl": np.mean(np.expm1(logratio) - logratio),
            "losses/clipfrac": np.mean([c.mean() for c in clipped]),
            "losses/explained_variance": 1 - np.var(rows["returns"] - rows["values"])
                                         / np.var(rows["returns"]),
        }
        for tag, value in expected.items():
            assert logged[tag][iteration] == pytest.approx(value, rel=1e-4, abs=1e-6), tag
    # the run holds what the checks above need to tell right from wrong
    env = watch.rollout(0, args.num_iterations * args.num_steps)
    assert env.terminated.any() and env.truncated.any() and not env.dones[args.num_steps - 1].all()
    ratios = np.concatenate(ratios)
    assert (ratios < 1 - args.clip_coef).any() and (ratios > 1 + args.clip_coef).any()
    assert all(abs(logged["losses/explained_variance"][i]) > 1e-3 for i in range(1, args.num_iterations))


def which_rows(rows, logprobs, values, returns):
    """The rollout row each sample of a minibatch is, found by its stored log-probability, value and return
    (identical rows are interchangeable: the first is taken); fails for a sample that is no row."""
    found = []
    for logprob, value, ret in zip(logprobs, values, returns):
        same = ((np.abs(rows["logprobs"] - logprob) <= 1e-6) & (np.abs(rows["values"] - value) <= 1e-5)
                & np.isclose(rows["returns"], ret, rtol=1e-5, atol=1e-5))
        assert same.any(), f"a minibatch sample (log-prob {logprob}, value {value}, return {ret}) is no row"
        found.append(np.flatnonzero(same)[0])
    return np.array(found)


def standardized(x):
    return (x - x.mean()) / (x.std(ddof=1) + 1e-8)


LOGGED = ("charts/learning_rate", "losses/value_loss", "losses/policy_loss", "losses/entropy",
          "losses/old_approx_kl", "losses/approx_kl", "losses/clipfrac", "losses/explained_variance")


# ------------------------------------------------------------------------ the gym scripts' shared pieces, once

# the TensorBoard tags every gym script logs, and those only the PPO scripts log (a ratio, something to clip)
SHARED_TAGS = ["charts/episodic_return", "charts/episodic_length", "charts/learning_rate", "charts/SPS",
               "losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/explained_variance",
               "eval/episodic_return"]
PPO_ONLY_TAGS = ["losses/old_approx_kl", "losses/approx_kl", "losses/clipfrac"]


def args_maker(module, **defaults):
    """`make(tmp_path, **kw)`: module.Args with its runs in tmp_path, `defaults` and then kw."""
    return lambda tmp_path, **kw: module.Args(**{"runs_dir": str(tmp_path), **defaults, **kw})


def cartpole_args(module):
    """small_args of a discrete script: a 3000-step CartPole-v1 run on the CPU with 2 evaluation episodes and the
    agent saved."""
    return args_maker(module, total_timesteps=3000, eval_episodes=2, save_model=True, cuda=False)


def check_the_budget_is_said(check_args, main, capsys, whole, partial, batch, runs):
    """A gym script's check_args says nothing before a run, in whole batches or not; a run of `partial`
    (main(partial)), whose --total-timesteps is not a multiple of the batch size `batch`, trains `runs` batches,
    and its last line says so."""
    check_args(whole)
    check_args(copy.deepcopy(partial))
    assert capsys.readouterr().out == ""
    main(partial)
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith(f"{runs * batch} steps in ")  # the run says what it did


def check_orthogonal(layer, gain):
    """Detail 2 for one layer: its weight (flattened past the first axis) has orthonormal columns or rows times
    `gain`, and its bias is 0."""
    w = layer.weight.detach().double().flatten(1)
    small = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
    torch.testing.assert_close(small, gain**2 * torch.eye(min(w.shape), dtype=torch.float64), rtol=0,
                               atol=gain**2 * 1e-5)
    assert not layer.bias.any()


def check_orthogonal_mlp(net, in_dim, out_dim, out_gain):
    """A network of Linear layers in_dim -> 64 -> 64 -> out_dim, orthogonal with gains sqrt(2), sqrt(2), out_gain."""
    layers = [layer for layer in net if isinstance(layer, torch.nn.Linear)]
    assert [(layer.in_features, layer.out_features) for layer in layers] == [(in_dim, 64), (64, 64), (64, out_dim)]
    for layer, gain in zip(layers, (2**0.5, 2**0.5, out_gain)):
        check_orthogonal(layer, gain)


def check_categorical_networks_start_orthogonal(module):
    """A discrete script's Agent(4, 3): critic and actor as check_orthogonal_mlp, output gains 1 and 0.01."""
    torch.manual_seed(0)
    agent = module.Agent(4, 3)
    check_orthogonal_mlp(agent.critic, 4, 1, 1.0)
    check_orthogonal_mlp(agent.actor, 4, 3, 0.01)


# (the greedy action, the return of its TinyDiscrete episode): 1 + 2 + 3 + 4 to the time limit, or 1 + 2 + 3
GREEDY_EPISODES = [(0, 1.0 + 2.0 + 3.0 + 4.0), (1, 1.0 + 2.0 + 3.0)]


def check_evaluate_plays_the_greedy_action(module, action, episode_return):
    """TinyDiscrete pays 1 + t at step t; action 1 at t = 2 ends the episode, else the time limit does after 4:
    three evaluation episodes of an agent whose greedy action is `action` each return `episode_return`."""
    agent = module.Agent(1, 2)
    with torch.no_grad():
        agent.actor[-1].weight.zero_()
        agent.actor[-1].bias.copy_(torch.tensor([1.0, -1.0]) * (1 if action == 0 else -1))
    assert module.evaluate(agent, "TinyDiscrete-v0", 3, 0, torch.device("cpu")) == [episode_return] * 3


def softmax_policy_by_hand(agent, obs, actions):
    """log pi(a | s) of the given actions and the entropy of pi(. | s), from the actor's logits by the softmax
    formula (none of the script's helpers), with the graph kept for gradients."""
    logits = agent.actor(torch.as_tensor(obs, dtype=torch.float32))
    log_probs = logits - logits.exp().sum(-1, keepdim=True).log()
    logprob = log_probs[torch.arange(len(obs)), torch.as_tensor(actions, dtype=torch.long)]
    return logprob, -(log_probs.exp() * log_probs).sum(-1)


def leaning(agent_class):
    """agent_class with a policy that is not uniform at any state (the initial one is, at TinyDiscrete's first
    observation [0]), so that a log-probability tells the actions apart, while both are still taken."""

    class LeaningAgent(agent_class):
        def __init__(self, *args):
            super().__init__(*args)
            with torch.no_grad():
                self.actor[-1].bias.copy_(torch.tensor([0.5, -0.5]))

    return LeaningAgent


def peaked(agent_class):
    """agent_class with a policy far from uniform, where the entropy has a sizeable gradient to follow."""

    class PeakedAgent(agent_class):
        def __init__(self, *args):
            super().__init__(*args)
            with torch.no_grad():
                self.actor[-1].bias.copy_(torch.linspace(2.0, -2.0, self.actor[-1].bias.numel()))

    return PeakedAgent


def gae_reference(rewards, values, next_values, terminations, dones, gamma, lam):
    """A_t as the explicit sum  sum_k (gamma * lam)^k * delta_{t+k}, up to the end of t's episode or of the
    rollout (nested lists or arrays, indexed [step][env])."""
    T, N = len(rewards), len(rewards[0])
    advantages = np.zeros((T, N))
    for env in range(N):
        for t in range(T):
            for k in range(T - t):
                s = t + k
                bootstrap = 0.0 if terminations[s][env] else gamma * next_values[s][env]
                advantages[t, env] += (gamma * lam) ** k * (rewards[s][env] + bootstrap - values[s][env])
                if dones[s][env]:
                    break
    return advantages


def random_rollout(seed, T=23, N=4, p=0.1):
    """Random rewards, values and bootstrap values (final-observation values at truncations) of T steps of N envs,
    each step terminated or else truncated with probability p: (rewards, values, next_values, terminations,
    dones)."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(T, N))
    values = rng.normal(size=(T, N))
    next_values = rng.normal(size=(T, N))
    terminations = rng.random((T, N)) < p
    truncations = (rng.random((T, N)) < p) & ~terminations
    assert terminations.any() and truncations.any()
    return rewards, values, next_values, terminations, terminations | truncations


def one_env_returns(compute_returns, next_values, terminations, dones, gamma):
    """A script's compute_returns on one env's steps, each paying reward 1, with the given next values,
    terminations and dones (one number a step): the returns, a number a step."""
    column = lambda x: torch.tensor(x, dtype=torch.float32)[:, None]
    rewards = torch.ones(len(dones), 1)
    return compute_returns(rewards, column(next_values), column(terminations), column(dones), gamma)[:, 0].tolist()


def check_gae_against_the_explicit_sum(compute_gae, array, rollout, gamma, lam):
    """A script's compute_gae on a random_rollout (passed as `array`s: float64 tensors or arrays) against
    gae_reference: the advantages, and the returns as advantages + values."""
    rewards, values, next_values, terminations, dones = rollout
    advantages, returns = compute_gae(*map(array, rollout), gamma, lam)
    expected = gae_reference(rewards, values, next_values, terminations, dones, gamma, lam)
    np.testing.assert_allclose(as_numpy(advantages), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(as_numpy(returns), expected + values, rtol=1e-10, atol=1e-10)


def bootstrap_values(critic, env, next_obs=None, final_obs=None):
    """V of the state each step of a watched rollout `env` (RunSpy.rollout) reached: the next observation inside
    an episode and at the end of the rollout, the final observation at a truncation (after a termination it is
    zeroed, so it may be anything). `next_obs` and `final_obs`: the observations as the agent saw them, where they
    are not the env's own (normalized)."""
    next_obs = np.concatenate([env.obs[1:], env.next_obs[None]]) if next_obs is None else next_obs
    final_obs = env.final_obs if final_obs is None else final_obs
    next_values = value_of(critic, next_obs)
    next_values[env.truncated] = value_of(critic, final_obs[env.truncated])
    return next_values


def check_each_loss_reaches(agent, losses):
    """Each (loss, prefixes) of `losses` sends a nonzero gradient to exactly those of the agent's parameters whose
    names start with `prefixes` (which loss reaches which network, through the script's own forward pass)."""
    names, params = zip(*agent.named_parameters())
    for loss, reaches in losses:
        for name, grad in zip(names, torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)):
            assert (grad is not None and grad.abs().max() > 0) == name.startswith(reaches), (name, reaches)


def check_losses_reach_their_networks(module, agent, batch):
    """Detail 13 (separate networks) in a2c.py and reinforce.py, through the script's own forward pass and losses on
    a batch (its obs, actions, advantages and returns): the policy loss and the entropy reach the actor only,
    the value loss the critic only."""
    obs, actions = torch.as_tensor(batch["obs"], dtype=torch.float32), torch.as_tensor(batch["actions"])
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions.long())
    pg_loss = module.policy_loss(newlogprob, torch.as_tensor(batch["advantages"]).float())
    v_loss = module.value_loss(newvalue, torch.as_tensor(batch["returns"]).float())
    check_each_loss_reaches(agent, ((pg_loss, "actor."), (entropy.mean(), "actor."), (v_loss, "critic.")))


def check_entropy_bonus_gradient(main, watch, optimizer_steps, args_with, batch_obs, ent_coef=0.5):
    """Two runs (main(args_with(name, ent_coef))) of one update from the same seed, so the same agent and batch,
    without and with the bonus: their gradients differ by the bonus's alone, -ent_coef * grad(mean entropy over
    the batch's observations, batch_obs(args)), worked out with torch's Categorical."""
    for name, coef in (("without", 0.0), ("with", ent_coef)):
        args = args_with(name, coef)
        main(args)
    assert len(optimizer_steps) == 2
    obs = torch.as_tensor(batch_obs(args), dtype=torch.float32)
    agent = watch.initial_agent
    entropy = torch.distributions.Categorical(logits=agent.actor(obs)).entropy().mean()
    expected = torch.autograd.grad(-ent_coef * entropy, list(agent.parameters()), allow_unused=True)
    assert max(g.abs().max() for g in expected if g is not None) > 0.01
    for without, with_bonus, bonus, param in zip(*(step.grads for step in optimizer_steps), expected,
                                                 agent.parameters()):
        bonus = torch.zeros_like(param) if bonus is None else bonus  # the critic's parameters
        torch.testing.assert_close(with_bonus - without, bonus, rtol=1e-4, atol=1e-6)


class CartPoleScriptTests:
    """Runs of main() that each discrete gym script (a2c.py, reinforce.py, ppo_cartpole.py) is tested with alike,
    written once. A test file runs them for its script with a subclass, `class TestRuns(CartPoleScriptTests)`,
    that sets `script` (the module) and `tiny_args` (its wiring runs' Args on TinyDiscrete-v0), and holds the
    script's own tests of the short run (`short_run`). The tests that run no main() stay functions of the test
    file, where mutation/mutmut_score.py finds them."""

    script = None
    per_env_and_reset = None  # check_logged_episodes': REINFORCE logs each env's first episodes of a batch only

    @classmethod
    def small_args(cls, tmp_path, **kw):
        return cartpole_args(cls.script)(tmp_path, **kw)

    @pytest.fixture(scope="class")
    @classmethod
    def short_run(cls, tmp_path_factory):
        """One saved cartpole_args run of the script, for the tests that read one."""
        return cls.script.main(cls.small_args(tmp_path_factory.mktemp("runs")))

    def test_saved_agent_evaluates_without_training(self, short_run, checkpoint_reevaluates):
        checkpoint_reevaluates(self.script, short_run)

    def test_same_seed_same_run(self, seeded_runs):
        seeded_runs(self.script, self.small_args)

    def test_ctrl_c_keeps_logs_and_saves(self, tmp_path, interrupted_run):
        interrupted_run(self.script, self.small_args(tmp_path, total_timesteps=50_000))

    def test_ctrl_c_during_evaluation_keeps_logs_and_saves(self, tmp_path, interrupted_evaluation):
        interrupted_evaluation(self.script, self.small_args(tmp_path))

    def test_a_saved_agent_is_evaluated_on_its_own_env_and_the_run_logs_its_episodes(self, tmp_path, spy,
                                                                                     read_events):
        """On TinyDiscrete-v0 an episode's return (6 or 10) is not its length (3 or 4), and a saved agent cannot
        be played on the default CartPole-v1."""
        watch = spy(self.script)
        run = self.script.main(self.tiny_args(tmp_path, save_model=True, eval_episodes=2))
        check_logged_episodes(watch, read_events(run["run_dir"]), run, self.per_env_and_reset)
        check_checkpoint_plays_its_own_env(self.script, watch, run, tmp_path)


# ----------------------------------------------- the gym PPO scripts' shared checks (ppo_cartpole, ppo_walker2d)


class GymPPOScriptTests:
    """The tests ppo_cartpole.py and ppo_walker2d.py pass alike, written once: a test file runs them for its script
    with `class TestAsEveryGymPPOScript(GymPPOScriptTests)`, setting `script` (the module), `tiny_args` (its wiring
    runs' Args on a tiny env) and `logprob_atol` (how closely a recomputed log-probability matches)."""

    script, logprob_atol = None, None

    @pytest.mark.parametrize("norm_adv", [True, False])
    def test_update_sees_the_rollout_scored_by_the_policy_that_acted(self, tmp_path, spy, norm_adv):
        watch = spy(self.script, ["compute_gae", "policy_loss", "value_loss"])
        args = self.tiny_args(tmp_path, norm_adv=norm_adv)
        self.script.main(args)
        check_ppo_update_wiring(watch, args, norm_adv, logprob_atol=self.logprob_atol)

    def test_gradient_norm_is_clipped_to_max_grad_norm(self, tmp_path, optimizer_steps):
        args = self.tiny_args(tmp_path, max_grad_norm=1e-3)  # far below the raw gradient norms here
        self.script.main(args)
        assert len(optimizer_steps) == args.num_iterations * args.update_epochs * args.num_minibatches
        np.testing.assert_allclose([step.norm for step in optimizer_steps], 1e-3, rtol=1e-4)

    @pytest.mark.parametrize("clip_vloss", [True, False])
    def test_clip_vloss_switches_to_the_clipped_value_loss(self, tmp_path, spy, clip_vloss):
        watch = spy(self.script, ["value_loss"])
        clip_coef = 0.01  # small, so that the critic soon moves past it
        self.script.main(self.tiny_args(tmp_path, clip_vloss=clip_vloss, clip_coef=clip_coef, update_epochs=4))
        differ = 0
        for call in watch.calls:
            newvalue, values, returns = call["args"]["newvalue"], call["args"]["values"], call["args"]["returns"]
            unclipped = (newvalue - returns) ** 2
            moved = values + np.clip(newvalue - values, -clip_coef, clip_coef)
            clipped = np.maximum(unclipped, (moved - returns) ** 2)
            assert call["result"] == pytest.approx(0.5 * (clipped if clip_vloss else unclipped).mean(), rel=1e-5)
            differ += not np.isclose(clipped.mean(), unclipped.mean())
        assert differ > 0

    def test_target_kl_stops_the_epochs_of_an_update(self, tmp_path, spy):
        watch = spy(self.script, ["compute_gae", "policy_loss"])
        args = self.tiny_args(tmp_path, update_epochs=4, target_kl=1e-4)
        self.script.main(args)
        epochs_run, differ = [], 0
        for gae, *pg in watch.updates(first="compute_gae"):
            assert len(pg) % args.num_minibatches == 0
            # approx_kl of each epoch's last minibatch, from the log-probabilities that minibatch's loss saw
            kl, k1 = [], []
            for call in pg[args.num_minibatches - 1 :: args.num_minibatches]:
                logratio = call["args"]["newlogprob"] - call["args"]["logprobs"]
                kl.append(np.mean(np.expm1(logratio) - logratio))
                k1.append(np.mean(-logratio))
            # the epochs go on while approx_kl stays at or below the target, and stop after the first one above it
            assert all(k <= args.target_kl for k in kl[:-1])
            assert len(kl) == args.update_epochs or kl[-1] > args.target_kl
            epochs_run.append(len(kl))
            differ += sum((a > args.target_kl) != (b > args.target_kl) for a, b in zip(kl, k1))
        assert min(epochs_run) < args.update_epochs  # the target was reached
        assert differ > 0  # and somewhere old_approx_kl (the k1 estimator) would have decided otherwise


def rollout_rows_from(args, env, acted, obs, values, next_values, rewards):
    """A PPO rollout as one row per (step, env), from a watched rollout `env`, what the agent did (`acted`), the
    observations and rewards as the agent saw them, V(s) and the bootstrap values: the observation, action and
    stored log-probability, the value, the advantage as the explicit sum of discounted TD residuals
    (gae_reference) and the return."""
    advantages = gae_reference(rewards, values, next_values, env.terminated, env.dones, args.gamma, args.gae_lambda)
    flat = lambda x: x.reshape(-1, *x.shape[2:])
    return dict(obs=flat(obs), actions=flat(np.stack([a for _, a, _ in acted])),
                logprobs=flat(np.stack([lp for _, _, lp in acted])), values=flat(values),
                advantages=flat(advantages), returns=flat(advantages + values))


def minibatches_of(watch, rows_of):
    """For each update of a run watched by spy(module, ["compute_gae", "policy_loss", "value_loss"]): the
    rollout's rows (rows_of(iteration, the critic that computed the advantages)), and per minibatch its rows, its
    policy_loss and value_loss calls and the agent they saw."""
    updates = []
    for iteration, (gae, *calls) in enumerate(watch.updates(first="compute_gae")):
        rows = rows_of(iteration, gae["agent"])
        pg = [c for c in calls if c["name"] == "policy_loss"]
        vf = [c for c in calls if c["name"] == "value_loss"]
        assert len(pg) == len(vf)
        found = [which_rows(rows, p["args"]["logprobs"], v["args"]["values"], v["args"]["returns"])
                 for p, v in zip(pg, vf)]
        updates.append((rows, [dict(pg=p, vf=v, agent=p["agent"], rows=f) for p, v, f in zip(pg, vf, found)]))
    return updates


def check_ppo_steps_apply_the_clipped_gradient(module, args, optimizer_steps, minibatches, by_hand_policy,
                                               action_dtype, reaches):
    """Details 10 and 11 on every optimizer step of a run of 2 minibatches an epoch with an entropy bonus
    (`minibatches`: (rows, minibatch) of minibatches_of, in order): the gradient applied is that of pg_loss -
    ent_coef * entropy + vf_coef * v_loss on the minibatch, worked out here from the agent as the step found it
    (by_hand_policy), scaled to norm max_grad_norm; every parameter gets a nonzero one. Then, through the
    script's own forward pass on the first minibatch (its actions as action_dtype), the parameters the policy
    loss, the entropy and the value loss reach: check_each_loss_reaches with `reaches`, their three prefixes."""
    assert len(optimizer_steps) == len(minibatches) == args.num_iterations * args.update_epochs * 2
    for step, (rows, mb) in zip(optimizer_steps, minibatches):
        agent, r = copy.deepcopy(mb["agent"]), mb["rows"]
        newlogprob, entropy = by_hand_policy(agent, rows["obs"][r], rows["actions"][r])
        ratio = (newlogprob.double() - torch.as_tensor(rows["logprobs"][r])).exp()
        advantages = torch.as_tensor(standardized(rows["advantages"][r]))
        clipped_ratio = ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio).mean()
        newvalue = agent.critic(torch.as_tensor(rows["obs"][r], dtype=torch.float32)).squeeze(-1)
        v_loss = 0.5 * ((newvalue.double() - torch.as_tensor(rows["returns"][r])) ** 2).mean()
        loss = pg_loss - args.ent_coef * entropy.double().mean() + args.vf_coef * v_loss
        grads = torch.autograd.grad(loss, list(agent.parameters()))
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
        assert norm > args.max_grad_norm  # so that the clipping shows
        for applied, grad in zip(step.grads, grads):
            expected = grad * args.max_grad_norm / (norm + 1e-6)
            torch.testing.assert_close(applied, expected, rtol=1e-3, atol=1e-6)
            assert applied.abs().max() > 0  # every parameter learns
    rows, first = minibatches[0]
    agent, r, pg = copy.deepcopy(first["agent"]), first["rows"], first["pg"]["args"]
    obs, actions = torch.as_tensor(rows["obs"][r], dtype=torch.float32), torch.as_tensor(rows["actions"][r])
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions.to(action_dtype))
    pg_loss, _, _ = module.policy_loss(newlogprob, torch.as_tensor(pg["logprobs"]).float(),
                                       torch.as_tensor(pg["advantages"]).float(), args.clip_coef)
    returns = torch.as_tensor(rows["returns"][r]).float()
    v_loss = module.value_loss(newvalue, newvalue.detach(), returns, args.clip_coef, False)
    check_each_loss_reaches(agent, zip((pg_loss, entropy.mean(), v_loss), reaches))


def check_bf16_needs_a_gpu_that_has_it(main, args, runs_dir, monkeypatch):
    """--bf16 on a GPU without bfloat16 (mocked): one line naming the flag and the fix, before any work."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **kw: False)
    with pytest.raises(SystemExit) as error:
        main(args)
    assert str(error.value) == ("error: --bf16: this GPU cannot compute in bfloat16 "
                                "(torch.cuda.is_bf16_supported() is False); run without --bf16")
    assert not runs_dir.exists()
