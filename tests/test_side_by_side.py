"""docs/side_by_side.md maps PPO on Walker2d onto PPO-RLHF on GPT-2, row by row, with line references.

Every reference in the table's two file columns has the form L<start>-L<end> `anchor`: the test checks that
lines start..end (1-based, inclusive) of that file still contain the anchor. If this test fails after you
moved code, update the range (or the anchor) in the named row of docs/side_by_side.md.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "side_by_side.md"
FILES = ("ppo_walker2d.py", "ppo_rlhf_gpt2.py")
REQUIRED_ROWS = [
    "state / observation",
    "action",
    "policy output",
    "sampling",
    "reward",
    "episode",
    "value function",
    "advantage",
    "reference model and KL",
    "what is clipped",
    "update loop",
    "what is logged",
]
REF = re.compile(r"L(\d+)-L(\d+) `([^`]+)`")
LINE_TOKEN = re.compile(r"\bL\d+\b")


def table_rows(text: str) -> list[dict]:
    """The body rows of the doc's table, as {column header: cell}."""
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    assert lines, f"{DOC} has no markdown table"
    split = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    header = split[0]
    assert header == ["concept", *FILES], f"table header is {header}, expected ['concept', *{list(FILES)}]"
    body = [cells for cells in split[1:] if not all(set(c) <= set("-: ") for c in cells)]
    for cells in body:
        assert len(cells) == len(header), f"row {cells[0]!r} has {len(cells)} cells, expected {len(header)}"
    return [dict(zip(header, cells)) for cells in body]


ROWS = table_rows(DOC.read_text())
SOURCES = {name: (ROOT / name).read_text().splitlines() for name in FILES}
CELLS = [(row["concept"], name, row[name]) for row in ROWS for name in FILES]


def test_doc_names_both_files():
    text = DOC.read_text()
    for name in FILES:
        assert name in text, f"{DOC.name} does not name {name}"


def test_required_rows_present():
    concepts = [row["concept"] for row in ROWS]
    missing = [name for name in REQUIRED_ROWS if name not in concepts]
    assert not missing, f"{DOC.name} lacks the rows {missing}; it has {concepts}"
    assert len(set(concepts)) == len(concepts), f"duplicate rows in {DOC.name}: {concepts}"


@pytest.mark.parametrize("concept,name,cell", CELLS, ids=[f"{c}|{n}" for c, n, _ in CELLS])
def test_references_hold_the_named_code(concept, name, cell):
    refs = REF.findall(cell)
    assert refs, f"row {concept!r}, {name}: no reference of the form L<start>-L<end> `anchor` in {cell!r}"
    # a malformed reference (e.g. a missing anchor) would otherwise be skipped silently
    assert len(LINE_TOKEN.findall(cell)) == 2 * len(refs), (
        f"row {concept!r}, {name}: a line reference is not of the form L<start>-L<end> `anchor`: {cell!r}")
    lines = SOURCES[name]
    for start, end, anchor in refs:
        start, end = int(start), int(end)
        where = f"row {concept!r}, {name} L{start}-L{end} `{anchor}`"
        assert 1 <= start <= end, f"{where}: the range is empty or starts before line 1"
        assert end <= len(lines), f"{where}: {name} has only {len(lines)} lines"
        if not any(anchor in line for line in lines[start - 1 : end]):
            found = [i + 1 for i, line in enumerate(lines) if anchor in line]
            hint = f"the anchor is now on line(s) {found}" if found else "the anchor occurs nowhere in the file"
            pytest.fail(f"{where}: the anchor is not in lines {start}-{end} ({hint}); "
                        f"update the range in {DOC.relative_to(ROOT)}")
