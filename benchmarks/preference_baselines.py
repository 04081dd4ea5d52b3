"""How learnable is a preference file? Held-out accuracies of models that need no language model.

Reads a JSONL file of comparisons ({"prompt", "chosen", "rejected"}, and "gold_chosen", "gold_rejected" where
reward_model_gpt2.py --gold wrote them), splits it as reward_model_gpt2.py does (its split_comparisons, same
--eval-fraction and --seed: the same held-out comparisons), and prints the held-out accuracy (ties 1/2) of:
- the gold labeler: gold_chosen > gold_rejected. The labels are noisy draws, so this is the ceiling.
- a bag-of-words Bradley-Terry model, at several numbers of training comparisons: a response's score is
  the sum of one learned weight per word, fitted by L2-regularized logistic regression on the chosen minus
  rejected word counts. It starts knowing no word, so its learning curve says how much the labels alone teach.
- with --vader, vader's compound score of the response alone: a model that already knows the lexicon.

    python benchmarks/preference_baselines.py runs/<run>/preferences.jsonl --vader
"""

import argparse
import json
import os
import re
import sys

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from reward_model_gpt2 import split_comparisons  # noqa: E402


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def accuracy(margins: np.ndarray) -> float:
    """Share of comparisons whose chosen response scores higher; a tie counts 1/2."""
    return float(np.mean((margins > 0) + 0.5 * (margins == 0)))


def bag_of_words_accuracy(comparisons: list[dict], train: list[int], held_out: list[int], l2: float) -> float:
    """Fit the bag-of-words Bradley-Terry model on `train` (its vocabulary: the training responses' words)
    and return its held-out accuracy."""
    vocabulary = {w: j for j, w in enumerate(sorted({w for i in train for key in ("chosen", "rejected")
                                                     for w in words(comparisons[i][key])}))}

    def counts(text: str) -> torch.Tensor:
        vector = torch.zeros(len(vocabulary), dtype=torch.float64)
        for w in words(text):
            if w in vocabulary:
                vector[vocabulary[w]] += 1
        return vector

    differences = torch.stack([counts(c["chosen"]) - counts(c["rejected"]) for c in comparisons])
    weights = torch.zeros(len(vocabulary), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weights], max_iter=500, line_search_fn="strong_wolfe")
    x = differences[train]

    def closure():
        optimizer.zero_grad()
        loss = -F.logsigmoid(x @ weights).mean() + l2 * weights.square().sum() / len(train)
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return accuracy((differences[held_out] @ weights).numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preferences", help="a JSONL file of comparisons")
    parser.add_argument("--eval-fraction", type=float, default=0.15, help="as reward_model_gpt2.py's")
    parser.add_argument("--seed", type=int, default=1, help="as reward_model_gpt2.py's")
    parser.add_argument("--sizes", type=int, nargs="+", default=[250, 500, 1000, 2000, 4000],
                        help="training comparisons for the bag-of-words curve (capped at all of them)")
    parser.add_argument("--l2", type=float, nargs="+", default=[0.1, 1.0, 10.0], help="L2 strengths")
    parser.add_argument("--vader", action="store_true", help="also vader's score of the response alone")
    args = parser.parse_args()
    if not os.path.isfile(args.preferences):
        raise SystemExit(f"error: {args.preferences}: no such file")
    with open(args.preferences) as f:
        comparisons = [json.loads(line) for line in f if line.strip()]
    train, held_out = split_comparisons(len(comparisons), args.eval_fraction, args.seed)
    print(f"{args.preferences}: {len(train)} training and {len(held_out)} held-out comparisons")
    if all("gold_chosen" in comparisons[i] for i in held_out):
        gold = np.array([comparisons[i]["gold_chosen"] - comparisons[i]["gold_rejected"] for i in held_out])
        print(f"gold labeler: {accuracy(gold):.3f}")
    if args.vader:
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

        analyzer = SentimentIntensityAnalyzer()
        compound = lambda text: analyzer.polarity_scores(text)["compound"]  # noqa: E731
        margins = np.array([compound(comparisons[i]["chosen"]) - compound(comparisons[i]["rejected"])
                            for i in held_out])
        print(f"vader on the response alone: {accuracy(margins):.3f}")
    for size in sorted({min(s, len(train)) for s in args.sizes}):
        results = [f"l2 {l2:g}: {bag_of_words_accuracy(comparisons, train[:size], held_out, l2):.3f}"
                   for l2 in args.l2]
        print(f"bag of words, {size} training comparisons: " + ", ".join(results))


if __name__ == "__main__":
    main()
