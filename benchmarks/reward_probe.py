"""Do a language model's frozen features carry a preference file's signal? A linear probe at each readout.

The backbone that reward_model_gpt2.py starts its reward model from (--model-name, frozen: no head, no
training) reads each response as the reward model does, prompt + response + EOS with the script's
tokenizer (truncated from the left to --max-length tokens), once. Its hidden states (--layers; the default -1
is the final, normalized state, the one the head reads) give three features of each response:
- last: the state at the text's last token (reward_model_gpt2.py --readout last; the appended EOS does not
  change it, as the model is causal)
- end: the state at the appended EOS (reward_model_gpt2.py --readout end, the default)
- mean: the mean state over the response's tokens (the prompt's tokens and the EOS left out)
Each feature is standardized per dimension over the training responses (the statistics of responses, not of
pair differences), and a linear score w.x is fitted by L2-regularized logistic regression on the symmetrized
pairs (x_chosen - x_rejected labeled 1, x_rejected - x_chosen labeled 0, no intercept:
preference_baselines.fit_bradley_terry), its L2 strength chosen among --l2 by cross-validation over the
training prompts. The split is reward_model_gpt2.py's (by prompt, the same --eval-fraction and --seed). For
each layer, readout and number of training comparisons (--sizes: the first ones of the training split, and
all of them) it prints the held-out accuracy at the chosen L2 with a 95% interval over the held-out prompts,
and each L2's cross-validated and held-out accuracy (the held-out ones are not used to choose).

A head fitted to these features is what reward_model_gpt2.py would reach by training its head alone, to
convergence; fine-tuning the backbone as well can do better or worse.

    python benchmarks/reward_probe.py runs/<run>/preferences.jsonl --model-name models/smollm2-135m
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]
import reward_model_gpt2 as rm  # noqa: E402
from preference_baselines import correct, cross_validated_l2, fit_bradley_terry, interval  # noqa: E402

READOUTS = ("last", "end", "mean")


@torch.inference_mode()
def response_features(model, tokenizer, prompts: list[str], responses: list[str], layers: list[int],
                      max_length: int, batch_size: int) -> dict:
    """{readout: (len(responses), len(layers), hidden) tensor}: the states of prompt + response + EOS at the
    last token of the text, at the EOS, and their mean over the response's tokens."""
    features = {readout: [] for readout in READOUTS}
    for start in range(0, len(responses), batch_size):
        batch_prompts = prompts[start : start + batch_size]
        batch_responses = responses[start : start + batch_size]
        texts = [p + r + tokenizer.eos_token for p, r in zip(batch_prompts, batch_responses)]
        batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt",
                          return_offsets_mapping=True)
        mask = batch["attention_mask"].bool()
        output = model(**rm.model_inputs(batch["input_ids"], mask), output_hidden_states=True)
        states = torch.stack([output.last_hidden_state if layer == -1 else output.hidden_states[layer]
                              for layer in layers], dim=2)  # (batch, tokens, layers, hidden)
        positions = torch.arange(mask.shape[1])
        end_index = (positions * mask).argmax(1)  # the EOS: the last position the mask keeps
        rows = torch.arange(len(texts))
        # the response's tokens: real tokens that cover a character after the prompt, the EOS aside
        prompt_ends = torch.tensor([len(p) for p in batch_prompts]).unsqueeze(1)
        in_response = (mask & (batch["offset_mapping"][..., 1] > prompt_ends)
                       & (positions != end_index.unsqueeze(1)))
        weights = in_response.float() / in_response.sum(1, keepdim=True).clamp(min=1)
        features["last"].append(states[rows, end_index - 1])
        features["end"].append(states[rows, end_index])
        features["mean"].append(torch.einsum("bt,btlh->blh", weights, states))
        print(f"features of {min(start + batch_size, len(responses))}/{len(responses)} responses", flush=True)
    return {readout: torch.cat(chunks).double() for readout, chunks in features.items()}


def standardized_differences(chosen: torch.Tensor, rejected: torch.Tensor, train: list[int]
                             ) -> torch.Tensor:
    """(chosen - rejected) of features standardized per dimension over the training responses (both sides)."""
    responses = torch.cat([chosen[train], rejected[train]])
    mean, std = responses.mean(0), responses.std(0).clamp_min(1e-12)
    return (chosen - mean) / std - (rejected - mean) / std


def probe(differences: torch.Tensor, prompts: list[str], train: list[int], held_out: list[int],
          l2s: list[float], folds: int, seed: int) -> dict:
    """The L2 strength chosen by cross-validation over the training prompts, each one's cross-validated and
    held-out accuracy, and the held-out margins at the chosen one."""
    l2, cross_validated = cross_validated_l2(differences[train], [prompts[i] for i in train], l2s, folds,
                                             seed)
    margins = {k: (differences[held_out] @ fit_bradley_terry(differences[train], k)).numpy() for k in l2s}
    return {"l2": l2, "cross_validated": cross_validated, "margins": margins[l2],
            "held_out": {k: float(np.mean(correct(m))) for k, m in margins.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preferences", help="a JSONL file of comparisons")
    parser.add_argument("--model-name", required=True, help="reward_model_gpt2.py's --model-name (a folder)")
    parser.add_argument("--eval-fraction", type=float, default=rm.Args.eval_fraction,
                        help="as reward_model_gpt2.py's: the share of the prompts held out")
    parser.add_argument("--seed", type=int, default=rm.Args.seed, help="as reward_model_gpt2.py's")
    parser.add_argument("--layers", type=int, nargs="+", default=[-1],
                        help="hidden states probed: -1 the final normalized one (the head's input), k the "
                             "one after k blocks (0: the embeddings; the last one normalized)")
    parser.add_argument("--l2", type=float, nargs="+", default=[1.0, 10.0, 100.0, 1000.0],
                        help="L2 strengths, one chosen by cross-validation over the training prompts")
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds of the training prompts")
    parser.add_argument("--sizes", type=int, nargs="+", default=[],
                        help="also fit on the first this many training comparisons")
    parser.add_argument("--max-length", type=int, default=rm.Args.max_length,
                        help="as reward_model_gpt2.py's")
    parser.add_argument("--batch-size", type=int, default=32, help="texts per forward pass")
    parser.add_argument("--num-threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    if not 0 < args.eval_fraction < 1:
        raise SystemExit(f"error: --eval-fraction must be between 0 and 1 (got {args.eval_fraction})")
    if args.folds < 2:
        raise SystemExit(f"error: --folds must be at least 2 (got {args.folds})")
    if not os.path.isfile(args.preferences):
        raise SystemExit(f"error: {args.preferences}: no such file")
    if not os.path.isdir(os.path.expanduser(args.model_name)):
        raise SystemExit(f"error: --model-name {args.model_name}: no such directory")
    with open(args.preferences) as f:
        comparisons = [json.loads(line) for line in f if line.strip()]
    prompts = [c["prompt"] for c in comparisons]
    train, held_out = rm.split_comparisons(prompts, args.eval_fraction, args.seed)
    if len({prompts[i] for i in train}) < 2:
        raise SystemExit(f"error: {args.preferences}: fewer than 2 training prompts after --eval-fraction "
                         f"{args.eval_fraction}; cross-validation needs more")
    torch.set_num_threads(args.num_threads)
    tokenizer, _ = rm.load_tokenizer(args.model_name, ".")
    rm.check_end_token(tokenizer, rm.Args(model_name=args.model_name, readout="end"))
    model = rm.from_pretrained(AutoModel, args.model_name, "--model-name", dtype=torch.float32).eval()
    if not all(-1 <= layer <= model.config.num_hidden_layers for layer in args.layers):
        raise SystemExit(f"error: --layers {args.layers}: each must be -1, or 0 to "
                         f"{model.config.num_hidden_layers}")
    texts = {key: [c[key] for c in comparisons] for key in ("chosen", "rejected")}
    features = {key: response_features(model, tokenizer, prompts, texts[key], args.layers, args.max_length,
                                       args.batch_size) for key in texts}
    held_out_prompts = [prompts[i] for i in held_out]
    print(f"{args.preferences}: {len(train)} training comparisons, {len(held_out)} held-out comparisons of "
          f"{len(set(held_out_prompts))} prompts; accuracies with 95% intervals over the held-out prompts")
    for size in sorted({min(s, len(train)) for s in args.sizes} | {len(train)}):
        for j, layer in enumerate(args.layers):
            for readout in READOUTS:
                differences = standardized_differences(features["chosen"][readout][:, j],
                                                       features["rejected"][readout][:, j], train[:size])
                result = probe(differences, prompts, train[:size], held_out, args.l2, args.folds, args.seed)
                swept = ", ".join(f"l2 {k:g}: {result['cross_validated'][k]:.3f} / "
                                  f"{result['held_out'][k]:.3f}" for k in args.l2)
                print(f"{readout}, layer {layer}, {size} training comparisons: held-out "
                      f"{interval(correct(result['margins']), held_out_prompts)} at l2 {result['l2']:g} "
                      f"(cross-validated / held-out: {swept})")


if __name__ == "__main__":
    main()
