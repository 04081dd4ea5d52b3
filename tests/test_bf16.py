"""--bf16's starting weights (detail 53), the same function in the four language-model files: each fp32 weight
of a matrix product moved to a random point of the fp32 values that round to its bfloat16 value, so that under
autocast (fp32 weights, bf16 copies for the matrix products) a step smaller than a bf16 rounding step still
reaches the forward pass, in expectation as a whole step; what autocast reads in fp32 (norms, embeddings, a
weight tied to one) is left exactly as it was. The expectations are written by hand from the bf16 format (8
significant bits: between 1 and 2 the bf16 values are 2^-7 apart), not computed by the code under test."""

import copy
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import dpo_gpt2
import grpo_gpt2
import ppo_rlhf_gpt2
import reward_model_gpt2

MODULES = [ppo_rlhf_gpt2, grpo_gpt2, reward_model_gpt2, dpo_gpt2]
CPU = torch.device("cpu")
ULP = 2.0**-7  # the spacing of bf16 values in [1, 2)


def layer_with(weights: torch.Tensor) -> torch.nn.Linear:
    layer = torch.nn.Linear(weights.shape[1], weights.shape[0], bias=False)
    with torch.no_grad():
        layer.weight.copy_(weights)
    return layer


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_each_weight_moves_within_its_bf16_rounding_cell_uniformly(module):
    # 40,000 weights on the bf16 grid strictly between 1 and 2 (the rounding cell: +- ULP / 2), signs mixed
    generator = torch.Generator().manual_seed(0)
    grid = (1 + torch.randint(1, 128, (200, 200), generator=generator) * ULP)
    grid = grid * torch.where(torch.rand(200, 200, generator=generator) < 0.5, -1.0, 1.0)
    layer = layer_with(grid)
    module.autocast_bf16(True, CPU, layer)
    moved = layer.weight.detach()
    assert moved.dtype == torch.float32
    assert torch.equal(moved.bfloat16().float(), grid)  # what a bf16 product reads: unchanged
    offsets = ((moved - grid) / ULP).flatten()  # uniform on (-1/2, 1/2): mean 0, std 1 / sqrt(12)
    assert offsets.abs().max() < 0.5 and offsets.min() < -0.49 and offsets.max() > 0.49
    assert abs(offsets.mean().item()) < 0.005 and offsets.std().item() == pytest.approx(12**-0.5, abs=0.005)
    # off the grid: halfway between two bf16 values (as 8% of a Q4_1 file's weights are) and at a power of 2
    special = torch.tensor([[1 + 1.5 * ULP, 1 + 2.5 * ULP, 1.0, -2.0, 0.0, 1 + 0.3 * ULP]]).repeat(2000, 1)
    layer = layer_with(special)
    module.autocast_bf16(True, CPU, layer)
    moved = layer.weight.detach()
    # ties to even: 1 + 1.5 ULP rounds to 1 + 2 ULP, 1 + 2.5 ULP to 1 + 2 ULP; 1 + 0.3 ULP to 1
    rounded = torch.tensor([1 + 2 * ULP, 1 + 2 * ULP, 1.0, -2.0, 0.0, 1.0])
    assert torch.equal(moved.bfloat16().float(), rounded.repeat(2000, 1))
    # below a power of 2 the bf16 values are twice as close: 1's cell is [1 - ULP / 4, 1 + ULP / 2]
    ones = moved[:, 2]
    assert ones.min() >= 1 - ULP / 4 and ones.max() <= 1 + ULP / 2 and (ones < 1).any() and (ones > 1).any()
    assert (moved[:, 0] < 1 + 2 * ULP).float().mean().item() == pytest.approx(0.5, abs=0.05)  # both sides
    assert moved[:, 4].abs().max() < 1e-38  # zero's cell is the smallest there is


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_copy_of_a_model_moves_to_the_same_weights(module):
    """The policy and its reference (a deep copy, or the same file loaded again) must stay identical, or the
    first KL is not exactly 0; without --bf16 nothing moves."""
    weights = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    policy = layer_with(weights)
    reference = copy.deepcopy(policy)
    loaded_again = layer_with(weights)
    untouched = layer_with(weights)
    module.autocast_bf16(True, CPU, policy, reference, None)
    module.autocast_bf16(True, CPU, loaded_again)
    module.autocast_bf16(False, CPU, untouched)
    assert not torch.equal(policy.weight, weights)
    assert torch.equal(policy.weight, reference.weight) and torch.equal(policy.weight, loaded_again.weight)
    assert torch.equal(untouched.weight, weights) and untouched.forward.__func__ is torch.nn.Linear.forward


def tiny_models() -> dict:
    """A GPT-2 (Conv1D products, LayerNorms, biases; its output layer tied to the token embedding) and two Llamas
    (Linear products without biases, RMSNorms), one tied, one with an output layer of its own; every weight set
    to a random fp32 value off the bf16 grid, so that a weight the jitter moved differs almost surely."""
    torch.manual_seed(0)
    models = {"gpt2": GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                                  bos_token_id=0, eos_token_id=0))}
    for tied in (True, False):
        models[f"llama, tied: {tied}"] = LlamaForCausalLM(LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2, tie_word_embeddings=tied, bos_token_id=0, eos_token_id=0, pad_token_id=None))
    with torch.no_grad():
        for model in models.values():
            for p in model.parameters():
                p.copy_(torch.randn_like(p))
    assert models["gpt2"].lm_head.weight is models["gpt2"].transformer.wte.weight
    assert models["llama, tied: True"].lm_head.weight is models["llama, tied: True"].model.embed_tokens.weight
    assert models["llama, tied: False"].lm_head.weight is not models["llama, tied: False"].model.embed_tokens.weight
    return models


def read_in_bf16(name: str, model_name: str) -> bool:
    """Written from the architectures: the weights and biases of GPT-2's Conv1D products (attention and MLP)
    and of the Llamas' Linear ones, and an output layer that is not tied to the embedding."""
    if model_name == "gpt2":
        return any(f".{product}." in name for product in ("c_attn", "c_proj", "c_fc"))
    return name.endswith("_proj.weight") or (name == "lm_head.weight" and "False" in model_name)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_only_what_a_product_reads_in_bf16_moves(module):
    """The weights autocast reads in bf16 move within their rounding cells: nearly every entry differs in fp32,
    every one rounds to the bf16 value it had. Norm weights, their biases, the position and token embeddings and
    the output layer tied to the token embedding (its lookup reads it in fp32) keep their bits. The seed
    decides where each moves: the same seed, the same weights; another seed, other ones."""
    for model_name, model in tiny_models().items():
        before = {name: p.detach().clone() for name, p in model.named_parameters(remove_duplicate=False)}
        again, other = copy.deepcopy(model), copy.deepcopy(model)
        module.autocast_bf16(True, CPU, model, seed=1)
        module.autocast_bf16(True, CPU, again, seed=1)
        module.autocast_bf16(True, CPU, other, seed=2)
        moved = dict(model.named_parameters(remove_duplicate=False))
        assert sum(read_in_bf16(name, model_name) for name in moved) >= 8, model_name
        for name, p in moved.items():
            if read_in_bf16(name, model_name):
                assert (p != before[name]).float().mean() > 0.9, (model_name, name)
                assert torch.equal(p.bfloat16(), before[name].bfloat16()), (model_name, name)
                assert (p != other.get_parameter(name)).float().mean() > 0.9, (model_name, name)
            else:
                assert torch.equal(p, before[name]), (model_name, name)  # bit for bit
                assert torch.equal(other.get_parameter(name), before[name]), (model_name, name)
            assert torch.equal(p, again.get_parameter(name)), (model_name, name)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_a_step_smaller_than_a_bf16_rounding_step_reaches_the_forward_pass(module):
    """A GPT-2 whose weights all sit on the bf16 grid (as a bf16 or 4-bit checkpoint's do); every weight of its
    blocks' matrix products stepped by a quarter of the gap to the next bf16 value up. Autocast alone: no bf16
    weight changes, and the logits are bit for bit those before the step. From the moved weights: about a
    quarter of them change (a step / cell chance each), and so do the logits."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    on_grid = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in on_grid.parameters():
            p.copy_(p.bfloat16().float())
    ids = torch.randint(0, 64, (3, 12))
    moved, plain = copy.deepcopy(on_grid), copy.deepcopy(on_grid)
    module.autocast_bf16(True, CPU, moved)
    plain.forward = torch.autocast("cpu", dtype=torch.bfloat16)(plain.forward)  # autocast, no move

    def logits(model):
        with torch.no_grad():
            return model(ids).logits.float()

    before = {name: logits(model) for name, model in (("moved", moved), ("plain", plain))}
    changed = []
    for model in (moved, plain):
        flips = total = 0
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.startswith("transformer.h.") and p.dim() == 2:  # the blocks' Conv1D weights
                    bf16 = p.bfloat16()
                    gap = torch.nextafter(bf16, torch.full_like(bf16, float("inf"))).float() - bf16.float()
                    p.add_(gap / 4)
                    flips += (p.bfloat16() != bf16).sum().item()
                    total += p.numel()
        changed.append(flips / total)
    assert changed[0] == pytest.approx(0.25, abs=0.02) and changed[1] == 0.0
    assert torch.equal(logits(plain), before["plain"])
    assert (logits(moved) - before["moved"]).abs().max() > 1e-3


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_sampling_casts_each_weight_to_bf16_once_not_once_a_token(module):
    """generate's loop under --bf16 is one autocast region: autocast's cache keeps a weight's bf16 copy from
    the first token to the last (on a CPU the casts were 40% of a sampling step's time), and the tokens are
    those of a twin whose every forward casts its weights anew (autocast's cache off). Counted: the casts of
    the tied output layer's weight, the only tensor of its shape."""
    from torch.profiler import ProfilerActivity, profile

    def twin():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_layer=2, n_head=2)).eval()
        module.autocast_bf16(True, CPU, model)
        return model

    cached, uncached = twin(), twin()
    uncached.forward = torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)(
        GPT2LMHeadModel.forward.__get__(uncached))
    queries = torch.randint(1, 50, (3, 5))
    tokens, casts = {}, {}
    for name, model in (("cached", cached), ("uncached", uncached)):
        torch.manual_seed(1)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            out = module.generate(model, queries, 6, 0.7, 0, bf16=True)
        tokens[name] = out[0] if isinstance(out, tuple) else out
        casts[name] = sum(e.count for e in prof.key_averages(group_by_input_shape=True)
                          if e.key == "aten::_to_copy" and e.input_shapes and e.input_shapes[0] == [50, 16])
    assert casts == {"cached": 1, "uncached": 6}
    assert torch.equal(tokens["cached"], tokens["uncached"])


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_the_starting_weights_move_by_the_seed_and_a_saved_policy_s_not_at_all(module):
    weights = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    one, again, two, saved = (layer_with(weights) for _ in range(4))
    module.autocast_bf16(True, CPU, one, seed=1)
    module.autocast_bf16(True, CPU, again, seed=1)
    module.autocast_bf16(True, CPU, two, seed=2)
    module.autocast_bf16(True, CPU, saved, seed=1, jitter=False)
    assert torch.equal(one.weight, again.weight) and not torch.equal(one.weight, two.weight)
    assert torch.equal(two.weight.bfloat16(), one.weight.bfloat16())  # both in the same bf16 cells
    assert torch.equal(saved.weight, weights) and "forward" in vars(saved)  # autocast wraps it all the same


def test_ppo_moves_its_models_by_its_seed_and_evaluates_a_saved_policy_as_saved(tiny, tmp_path, monkeypatch):
    calls, real = [], ppo_rlhf_gpt2.autocast_bf16
    monkeypatch.setattr(ppo_rlhf_gpt2, "autocast_bf16", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    from test_ppo_rlhf_gpt2 import tiny_args

    ppo_rlhf_gpt2.main(tiny_args(tiny, tmp_path, bf16=True, seed=7, total_episodes=8, eval_episodes=0,
                                 save_model=True))
    saved = next(Path(tmp_path).rglob("model"))
    ppo_rlhf_gpt2.main(tiny_args(tiny, tmp_path, bf16=True, seed=7, eval_checkpoint=str(saved), eval_episodes=2))
    assert calls == [{"seed": 7}, {"jitter": False}]
