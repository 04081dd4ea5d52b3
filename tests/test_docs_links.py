"""The README and the docs link to result tables, plots and each other: every relative link must resolve,
so that moving or renaming a result file cannot silently leave a dead link behind."""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(
    os.path.relpath(p, ROOT) for pattern in ("docs/*.md", "docs/results/*.md", "benchmarks/results/*.md")
    for p in glob.glob(os.path.join(ROOT, pattern))
)
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def relative_links(text):
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # web addresses and anchors within the same page
        yield target.split("#")[0]


def test_link_pattern_finds_links_and_skips_web_addresses():
    text = "see [a](x/y.md) and ![plot](p.png#top), [web](https://e.org/a) and [here](#section)"
    assert list(relative_links(text)) == ["x/y.md", "p.png"]


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_resolve(doc):
    with open(os.path.join(ROOT, doc)) as f:
        text = f.read()
    base = os.path.dirname(os.path.join(ROOT, doc))
    dead = [t for t in relative_links(text) if not os.path.exists(os.path.normpath(os.path.join(base, t)))]
    assert not dead, f"{doc} links to missing files: {dead}"
