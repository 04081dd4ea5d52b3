"""One numbering of the implementation details for the whole house (docs/details.md): each script cites exactly
the numbers the catalog gives it, so a number cannot mean one idea in one file and another elsewhere, and a file
cannot cite a number the catalog lacks. A script "cites" a number where its docstring lists it (`37. ...`, or a
range `23-30: ...`) or its text names it (`detail 37`, `details 1, 46`, `details 14-22`)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["reinforce", "a2c", "ppo_cartpole", "ppo_walker2d", "ppo_atari", "reward_model_gpt2", "dpo_gpt2",
           "ppo_rlhf_gpt2", "grpo_gpt2"]


def expand(numbers: str) -> set[str]:
    """'1, 46' -> {1, 46}; '14-22' -> {14, ..., 22}; 'A1-A3' -> {A1, A2, A3}."""
    found = set()
    for part in re.split(r", | and ", numbers):
        span = re.fullmatch(r"([GA]?)(\d+)-\1?(\d+)", part)
        if span:
            found |= {f"{span[1]}{i}" for i in range(int(span[2]), int(span[3]) + 1)}
        elif re.fullmatch(r"[GA]?\d+", part):
            found.add(part)
    return found


def cited(text: str) -> set[str]:
    numbers = set()
    for match in re.finditer(r"\bdetails? ([GA]?\d+(?:(?:, |-| and )[GA]?\d+)*)", text):
        numbers |= expand(match[1])
    for line in (ast.get_docstring(ast.parse(text), clean=False) or "").splitlines():
        entry = re.match(r"^\s*([GA]?\d+)\.\s", line) or re.match(r"^([GA]?\d+-[GA]?\d+):", line)
        if entry:
            numbers |= expand(entry[1])
        numbers |= {m[1] for m in re.finditer(r"(?:^|\s)([GA]?\d+)\.\s+[A-Z]", line)}  # entries side by side
    return numbers


def catalog() -> dict[str, set[str]]:
    """{number: the scripts that cite it} from docs/details.md's table."""
    rows = re.findall(r"^\| ([GA]?\d+) \| .+ \| ([\w, ]+) \|$", (ROOT / "docs" / "details.md").read_text(), re.M)
    return {number: {f.strip() for f in files.split(",")} for number, files in rows}


def test_the_citation_reader_by_hand():
    text = '"""Doc.\n\n 3. Adam.   4. The rate.\n23-25: pads.\nA1. No-ops.\n"""\n# detail 37: x; details 1, 46 and 8\n'
    assert cited(text) == {"3", "4", "23", "24", "25", "A1", "37", "1", "46", "8"}
    assert expand("14-22") == {str(i) for i in range(14, 23)} and expand("A1-A3") == {"A1", "A2", "A3"}


def test_the_catalog_numbers_each_idea_once():
    rows = re.findall(r"^\| ([GA]?\d+) \|", (ROOT / "docs" / "details.md").read_text(), re.M)
    assert len(rows) == len(set(rows)) and set(catalog()) == set(rows)
    assert all(files <= set(SCRIPTS) for files in catalog().values())


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_cites_the_numbers_the_catalog_gives_it(script):
    ours = cited((ROOT / f"{script}.py").read_text())
    given = {number for number, files in catalog().items() if script in files}
    assert not ours - given, f"{script}.py cites {sorted(ours - given)}, which docs/details.md gives other files"
    assert not given - ours, f"docs/details.md gives {script}.py {sorted(given - ours)}, which it does not cite"
