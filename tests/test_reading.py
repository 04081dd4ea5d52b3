"""The house style that keeps each script readable in one sitting: short lines, a module docstring of at most
about 60 lines, and a help text for every flag (tyro reads the comment beside each `Args` field)."""

import ast
import dataclasses
import importlib
import os
import re

import pytest
from tyro._docstrings import get_field_docstring

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ["reinforce", "a2c", "ppo_cartpole", "ppo_walker2d", "ppo_atari", "reward_model_gpt2", "dpo_gpt2",
           "ppo_rlhf_gpt2", "grpo_gpt2"]
MAX_LINE, MAX_DOCSTRING = 110, 60


def source(script):
    with open(os.path.join(ROOT, f"{script}.py")) as f:
        return f.read()


@pytest.mark.parametrize("script", SCRIPTS)
def test_lines_fit_the_width(script):
    long = [i for i, line in enumerate(source(script).splitlines(), 1) if len(line) > MAX_LINE]
    assert not long, f"{script}.py: lines over {MAX_LINE} characters: {long}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_module_docstring_is_short(script):
    docstring = ast.get_docstring(ast.parse(source(script)), clean=False)
    assert docstring, f"{script}.py has no module docstring"
    assert len(docstring.splitlines()) <= MAX_DOCSTRING


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_has_a_help_text(script):
    args = importlib.import_module(script).Args
    missing = [f.name for f in dataclasses.fields(args) if not get_field_docstring(args, f.name, ())]
    assert not missing, f"{script}.py: Args fields without a help text: {missing}"


def test_help_check_sees_a_field_without_a_comment():
    @dataclasses.dataclass
    class Args:
        seed: int = 1  # seed of the experiment
        gamma: float = 0.99

    assert get_field_docstring(Args, "seed", ()) == "seed of the experiment"
    assert not get_field_docstring(Args, "gamma", ())


def readme_line_counts(readme):
    """{script: (algorithm, plumbing)} from the README's table of files, whose rows end in `| 408 + 106 |`."""
    rows = re.findall(r"^\| \[`(\w+)\.py`\]\(\w+\.py\) \|.*\| (\d+) \+ (\d+) \|$", readme, flags=re.M)
    return {script: (int(algorithm), int(plumbing)) for script, algorithm, plumbing in rows}


def algorithm_and_plumbing(script):
    """(lines before the `# Plumbing ...` line that starts the skippable part, lines from it on)."""
    lines = source(script).splitlines()
    markers = [i for i, line in enumerate(lines) if line.startswith("# Plumbing")]
    assert len(markers) == 1, f"{script}.py needs exactly one `# Plumbing` line, has {len(markers)}"
    return markers[0], len(lines) - markers[0]


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_algorithm_comes_first_and_the_plumbing_after_main(script):
    marker, plumbing = algorithm_and_plumbing(script)
    defined_at = {node.name: node.lineno - 1 for node in ast.parse(source(script)).body
                  if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert defined_at["main"] < marker, f"{script}.py: main() must come before the plumbing"
    early = [name for name in ("check_args", "save_agent", "load_agent", "load_policy", "evaluate_checkpoint")
             if name in defined_at and defined_at[name] < marker]
    assert not early, f"{script}.py: plumbing above the `# Plumbing` line: {early}"


# Functions below the marker that still cite a numbered detail: code a detail describes belongs above it. The
# list only shrinks: a new citation below the marker fails, and so does a name here that no longer cites one.
CITING_BELOW_THE_MARKER = {
    "ppo_walker2d": {"evaluate", "save_agent"},
    "reward_model_gpt2": {"end_token_of", "split_comparisons", "readout_features", "cross_validated_l2",
                          "check_split", "load_tokenizer", "load_policy", "load_reward_model",
                          "save_reward_model", "scale_logits", "generate", "truncate_after_stop_token"},
    "dpo_gpt2": {"split_comparisons", "generate", "truncate_after_stop_token", "evaluate_samples",
                 "load_tokenizer", "load_policy"},
    "ppo_rlhf_gpt2": {"load_tokenizer", "load_policy", "load_value_model", "load_reward_fn"},
    "grpo_gpt2": {"debug_variables", "load_tokenizer", "load_policy", "load_reward_fn"},
}


def citing_below_the_marker(text: str) -> set[str]:
    """The top-level functions and classes after the `# Plumbing` line whose source cites `detail N`."""
    lines = text.splitlines()
    marker = next(i for i, line in enumerate(lines) if line.startswith("# Plumbing"))
    return {node.name for node in ast.parse(text).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            and node.lineno - 1 > marker and re.search(r"\bdetails? \w+", "\n".join(
                lines[node.lineno - 1 : node.end_lineno]))}


@pytest.mark.parametrize("script", SCRIPTS)
def test_below_the_marker_nothing_new_cites_a_numbered_detail(script):
    assert citing_below_the_marker(source(script)) == CITING_BELOW_THE_MARKER.get(script, set())


def test_the_marker_check_sees_a_citation_below_the_marker():
    text = ("def a():\n    # detail 3: above\n    pass\n\n# Plumbing\n\ndef b():\n    pass\n\n"
            "def c():\n    \"\"\"detail 12: below.\"\"\"\n")
    assert citing_below_the_marker(text) == {"c"}


def test_readme_states_each_script_s_length():
    with open(os.path.join(ROOT, "README.md")) as f:
        stated = readme_line_counts(f.read())
    actual = {script: algorithm_and_plumbing(script) for script in SCRIPTS}
    assert stated == actual, "update the line counts in README.md's table of files"


def test_readme_line_count_parser_reads_the_table_row():
    rows = ("| [`a2c.py`](a2c.py) | synchronous advantage actor-critic, on CartPole-v1 | 348 + 86 |\n"
            "| other | 3 |\n| [`ppo_cartpole.py`](ppo_cartpole.py) | PPO, on CartPole-v1 | 408 + 106 |")
    assert readme_line_counts(rows) == {"a2c": (348, 86), "ppo_cartpole": (408, 106)}
