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
SCRIPTS = ["reinforce", "a2c", "ppo_cartpole", "ppo_walker2d", "ppo_rlhf_gpt2"]
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
    """{script: lines} from the README's table of files (`| [`x.py`](x.py) | what it is | lines |`)."""
    rows = re.findall(r"^\| \[`(\w+)\.py`\]\(\w+\.py\) \|.*\| (\d+) \|$", readme, flags=re.M)
    return {script: int(lines) for script, lines in rows}


def test_readme_states_each_script_s_length():
    with open(os.path.join(ROOT, "README.md")) as f:
        stated = readme_line_counts(f.read())
    actual = {script: len(source(script).splitlines()) for script in SCRIPTS}
    assert stated == actual, "update the line counts in README.md's table of files"


def test_readme_line_count_parser_reads_the_table_row():
    row = "| [`a2c.py`](a2c.py) | synchronous advantage actor-critic, on CartPole-v1 | 429 |\n| other | 3 |"
    assert readme_line_counts(row) == {"a2c": 429}
