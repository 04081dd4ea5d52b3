"""One name, one body, in the four language-model files: a function or class defined in two or more of them has
the same source in each, unless REASONS below says why it differs. A difference nobody wrote down fails, and so
does a reason for a name whose bodies have become the same (the list only shrinks). One name, one contract: a
function defined in two or more of them takes the same parameters (names, order) in each, unless the algorithm
needs its own (DIFFERENT_PARAMETERS, at most four, each named in docs/side_by_side.md)."""

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = ["ppo_rlhf_gpt2", "grpo_gpt2", "reward_model_gpt2", "dpo_gpt2"]
REASONS = {  # name: why its bodies differ (to be made the same, or renamed, where the reason is only history)
    "Args": "each script's own flags",
    "main": "each script's own algorithm",
    "check_args": "each script checks its own flags",
    "evaluate_comparisons": "the reward model's scores, DPO's implicit rewards against its stored reference",
    "debug_variables": "GRPO's clip fractions read its upper clip (detail 50)",
    "policy_loss": "GRPO: one advantage per response and an upper clip of its own (details 47, 50)",
    "query_batches": "GRPO: whole groups, num_generations copies of each prompt (detail 46)",
    "load_tokenizer": "the RL files' also return the pad id (the reward model's and DPO's are one body)",
    "load_policy": "the RL files' swap GPT-2's gelu_new for torch's fused tanh GELU first (load_config)",
    "save_policy": "DPO's always writes sampling.json; to be made the RL files'",
    "load_gold_fn": "a reward-model folder as gold: the reward model reads it with its own score_texts, DPO "
                    "as the RL files' reward function does",
    "print_held_out_summary": "each script prints its own held-out numbers (the reward model and DPO: eval_stats "
                              "with the gold labeler's accuracy; they need nothing of args)",
    "check_split": "the reward model also checks the probe's folds and --gold's expected counts; DPO splits "
                   "with --split-seed",
    "samples_table": "GRPO shows two whole groups with each response's advantage",
    "score_normalization": "PPO normalizes the reward model's scores on the policy's samples, the reward model "
                           "its own, saved in its folder (detail 31 either way)",
}
DIFFERENT_PARAMETERS = {  # name: why its parameters differ: the algorithm's own (at most four; docs/side_by_side.md)
    "policy_loss": "GRPO: one advantage per response, no mask (its aggregate weighs the tokens), an upper clip of "
                   "its own (details 47, 48, 50)",
    "debug_variables": "GRPO: its clip fractions read the advantages' signs and its upper clip (detail 50)",
    "samples_table": "GRPO: two whole groups of args.num_generations responses, each with its advantage",
    "evaluate_comparisons": "the reward model scores each text; DPO's implicit reward needs the reference's "
                            "stored log-probs (ref_logps) and returns the policy's",
}


@functools.cache
def definitions() -> dict[str, dict[str, str]]:
    found = {}
    for name in FILES:
        source = (ROOT / f"{name}.py").read_text()
        for node in ast.parse(source).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                found.setdefault(node.name, {})[name] = ast.get_source_segment(source, node)
    return {k: v for k, v in found.items() if len(v) > 1}


@pytest.mark.parametrize("name", sorted(definitions()))
def test_a_shared_name_has_one_body_or_a_written_reason(name):
    bodies = definitions()[name]
    if len(set(bodies.values())) == 1:
        assert name not in REASONS, f"{name} is the same in {sorted(bodies)} now: drop its reason"
    else:
        assert name in REASONS, f"{name} differs between {sorted(bodies)}: make it the same, or write why"


def test_every_reason_names_a_shared_definition():
    assert set(REASONS) <= set(definitions())


def parameters(node: ast.FunctionDef) -> tuple[str, ...]:
    """The parameter names of a def, in order (*args and **kwargs marked), without annotations and defaults."""
    a = node.args
    return tuple([x.arg for x in a.posonlyargs + a.args] + (["*" + a.vararg.arg] if a.vararg else ["*"] * bool(
        a.kwonlyargs)) + [x.arg for x in a.kwonlyargs] + (["**" + a.kwarg.arg] if a.kwarg else []))


def differing_parameters(sources: dict[str, str]) -> dict[str, dict[str, tuple]]:
    """{name: {file: parameters}} for each function defined at the top level of two or more of the sources whose
    parameter lists are not all the same."""
    found = {}
    for name, source in sources.items():
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef):
                found.setdefault(node.name, {})[name] = parameters(node)
    return {k: v for k, v in found.items() if len(v) > 1 and len(set(v.values())) > 1}


@functools.cache
def differing_in_the_files() -> dict[str, dict[str, tuple]]:
    return differing_parameters({name: (ROOT / f"{name}.py").read_text() for name in FILES})


def test_a_shared_name_takes_the_same_parameters_in_every_file():
    drift = {k: v for k, v in differing_in_the_files().items() if k not in DIFFERENT_PARAMETERS}
    assert not drift, f"make these parameter lists one (names and order), or write why the algorithm needs two: {drift}"


def test_the_allowed_differences_are_few_and_still_there():
    assert len(DIFFERENT_PARAMETERS) <= 4 and all(DIFFERENT_PARAMETERS.values())
    same_now = set(DIFFERENT_PARAMETERS) - set(differing_in_the_files())
    assert not same_now, f"{same_now} take the same parameters in every file now: drop them from DIFFERENT_PARAMETERS"


def test_each_allowed_difference_is_named_in_the_side_by_side_page():
    page = (ROOT / "docs" / "side_by_side.md").read_text()
    section = page.split("\n## One name, one contract\n")[1].split("\n## ")[0]
    assert all(f"- `{name}`: " in section for name in DIFFERENT_PARAMETERS)


def test_the_parameter_check_sees_a_planted_difference():
    a = "def f(x, y, z=1):\n    pass\n\n\ndef g(*models, seed=0):\n    pass\n\n\nclass C:\n    pass\n"
    assert differing_parameters({"a": a, "b": a.replace("z=1", "z=2")}) == {}  # defaults may differ
    assert differing_parameters({"a": a, "b": a.replace("x, y", "y, x")}) == {"f": {"a": ("x", "y", "z"),
                                                                               "b": ("y", "x", "z")}}
    assert set(differing_parameters({"a": a, "b": a.replace("z=1", "z=1, flag=''")})) == {"f"}
    assert set(differing_parameters({"a": a, "b": a.replace("*models, seed", "*models, jitter=True, seed")})) == {"g"}
    assert differing_parameters({"a": a, "b": a.replace("*models, seed", "models, seed")})["g"]["a"] == (
        "*models", "seed")
