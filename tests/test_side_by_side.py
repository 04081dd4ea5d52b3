"""docs/side_by_side.md pairs code excerpts of ppo_walker2d.py and ppo_rlhf_gpt2.py, concept by concept.

Each excerpt is a ```python block right after a line naming its file and the function or class it comes from:

    `ppo_walker2d.py`, in `main`:

The test checks that the excerpt still appears in that function (or class), line after line, compared without
the leading whitespace; a line `...` in an excerpt skips any number of lines. The doc has no line numbers, so
moving code never breaks it; changing the quoted code does, and then the excerpt must be updated.
"""
import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "side_by_side.md"
FILES = ("ppo_walker2d.py", "ppo_rlhf_gpt2.py", "grpo_gpt2.py", "reward_model_gpt2.py", "dpo_gpt2.py")
REQUIRED_CONCEPTS = ["state", "action", "policy output and log-prob", "sampling", "reward", "episode end", "value",
                     "advantage", "reference model and KL", "the loss", "the update loop", "logging"]
ANCHOR = re.compile(r"^`(?P<file>[\w.]+\.py)`, in `(?P<name>\w+)`:\s*$")
EXCERPT = re.compile(r"^`(?P<file>[\w.]+\.py)`, in `(?P<name>\w+)`:\s*\n+```python\n(?P<code>.*?)\n```", re.M | re.S)


def excerpts(text):
    """(concept, file, function or class, code) for each excerpt; the concept is the last `## ` heading above."""
    found = []
    for m in EXCERPT.finditer(text):
        headings = re.findall(r"^## (.+)$", text[: m.start()], re.M)
        found.append((headings[-1].strip() if headings else "", m["file"], m["name"], m["code"]))
    return found


def definition_lines(path: Path, name: str) -> list[str]:
    """The source lines of the top-level function or class `name` in `path` (None if there is none)."""
    source = path.read_text()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return source.splitlines()[node.lineno - 1 : node.end_lineno]
    return None


def appears_in(code: str, lines: list[str]) -> bool:
    """Whether the excerpt's lines occur in order in `lines`, each run of them consecutively; `...` skips lines."""
    chunks, chunk = [], []
    for line in code.splitlines():
        if line.strip() == "...":
            chunks.append(chunk)
            chunk = []
        elif line.strip():
            chunk.append(line.strip())
    chunks.append(chunk)
    stripped = [line.strip() for line in lines]
    start = 0
    for chunk in (c for c in chunks if c):
        at = next((i for i in range(start, len(stripped) - len(chunk) + 1)
                   if stripped[i : i + len(chunk)] == chunk), None)
        if at is None:
            return False
        start = at + len(chunk)
    return True


TEXT = DOC.read_text()
EXCERPTS = excerpts(TEXT)


def test_checker_finds_and_rejects_excerpts():
    lines = ["def f(x):", "    y = x + 1", "    z = y * 2", "    w = z - 3", "    return w"]
    assert appears_in("y = x + 1\nz = y * 2", lines)
    assert appears_in("def f(x):\n    ...\n    return w", lines)
    assert not appears_in("z = y * 2\ny = x + 1", lines)  # wrong order
    assert not appears_in("y = x + 1\nw = z - 3", lines)  # not consecutive without a `...`
    assert not appears_in("y = x + 2", lines)
    doc = "## state\n\n`a.py`, in `f`:\n\n```python\ny = x + 1\n```\n"
    assert excerpts(doc) == [("state", "a.py", "f", "y = x + 1")]


def test_every_concept_has_an_excerpt_from_each_file():
    have = {(concept, name) for concept, name, _, _ in EXCERPTS}
    missing = [(c, f) for c in REQUIRED_CONCEPTS for f in FILES[:2] if (c, f) not in have]
    missing += [("PPO against GRPO", f) for f in FILES[1:3] if ("PPO against GRPO", f) not in have]
    missing += [("Reward model and RL against DPO", f) for f in FILES[3:]
                if ("Reward model and RL against DPO", f) not in have]
    assert not missing, f"{DOC.name} lacks excerpts for {missing}"


def test_every_anchor_line_opens_an_excerpt():
    # an anchor line whose code block is malformed would otherwise be skipped silently
    anchors = [line for line in TEXT.splitlines() if ANCHOR.match(line)]
    assert len(anchors) == len(EXCERPTS), "an anchor line is not followed by a ```python block"


def test_no_line_numbers():
    assert not re.search(r"\bL\d+(-L?\d+)?\b", TEXT), f"{DOC.name} refers to line numbers; anchor by name"


@pytest.mark.parametrize("concept,file,name,code", EXCERPTS,
                         ids=[f"{c}|{f}|{n}|{i}" for i, (c, f, n, _) in enumerate(EXCERPTS)])
def test_excerpt_appears_verbatim(concept, file, name, code):
    assert file in FILES, f"excerpt under {concept!r} names {file}, expected one of {FILES}"
    lines = definition_lines(ROOT / file, name)
    assert lines is not None, f"{file} has no top-level function or class {name!r} (excerpt under {concept!r})"
    assert appears_in(code, lines), (
        f"the excerpt under {concept!r} is no longer in {file}:{name}; update it in {DOC.relative_to(ROOT)}:\n{code}")


def stated_diff_sizes(text):
    """{(a, b): n} for each "`diff a b` (n lines)" in a text."""
    return {(a, b): int(n) for a, b, n in re.findall(r"`diff ([\w.]+\.py) ([\w.]+\.py)` \((\d+) lines\)", text)}


def test_stated_diff_sizes_parser():
    text = "What `diff a.py b.py` (12 lines) shows; `diff c.py d.py` shows more"
    assert stated_diff_sizes(text) == {("a.py", "b.py"): 12}


@pytest.mark.parametrize("page", ["docs/side_by_side.md", "README.md"])
def test_the_diff_sizes_a_page_states_are_today_s(page):
    stated = stated_diff_sizes((ROOT / page).read_text())
    actual = {pair: len(subprocess.run(["diff", *pair], cwd=ROOT, capture_output=True, text=True).stdout
                         .splitlines()) for pair in stated}
    assert stated == actual, f"{page}: update the sizes of the diffs it states"
