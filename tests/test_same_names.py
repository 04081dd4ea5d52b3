"""One name, one body, in the four language-model files: a function or class defined in two or more of them has
the same source in each, unless REASONS below says why it differs. A difference nobody wrote down fails, and so
does a reason for a name whose bodies have become the same (the list only shrinks)."""

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
    "generate": "the RL files also decode greedily and return the log-probs; the others sample only",
    "model_inputs": "two contracts: (ids, pad id) in the RL files, (ids, attention mask) in the others, which "
                    "pad on the right too; to be made one",
    "load_tokenizer": "the RL files' also return the pad id (the reward model's and DPO's are one body)",
    "load_policy": "the RL files check the config first and name --eval-checkpoint in errors",
    "save_policy": "DPO's always writes sampling.json; to be made the RL files'",
    "load_gold_fn": "a reward-model folder as gold: the reward model reads it with its own score_texts, DPO "
                    "as the RL files' reward function does",
    "print_held_out_summary": "each script prints its own held-out numbers",
    "check_split": "the reward model also checks the probe's folds and --gold's expected counts; DPO splits "
                   "with --split-seed",
    "samples_table": "GRPO shows two whole groups with each response's advantage",
    "score_normalization": "PPO normalizes the reward model's scores on the policy's samples, the reward model "
                           "its own, saved in its folder (detail 31 either way)",
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
