"""How learnable is a preference file? Held-out accuracies of models that need no language model.

Reads a JSONL file of comparisons ({"prompt", "chosen", "rejected"}, and "gold_chosen", "gold_rejected" where
reward_model_gpt2.py --gold wrote them), splits it by prompt as reward_model_gpt2.py does (its
split_comparisons, same --eval-fraction and --seed: the same held-out prompts and comparisons), and prints the
held-out accuracy (ties 1/2) of each model below with a 95% interval over the held-out prompts (a bootstrap
that resamples prompts with all their comparisons, as one prompt's comparisons are not independent draws):
- the gold labeler: gold_chosen > gold_rejected. The labels are noisy draws, so this is the ceiling.
- a bag-of-words Bradley-Terry model, at several numbers of training comparisons (the first ones of the
  training split, and all of them): a response's score is the sum of one learned weight per word, fitted by
  L2-regularized logistic regression on the chosen minus rejected word counts, the L2 strength chosen among
  --l2 by cross-validation over the training prompts (each fold holds out whole prompts). It starts knowing
  no word, so its learning curve says how much the labels alone teach.
- with --vader, vader's compound score of the response alone: a model that already knows the lexicon.
- with --scores, reward_model_gpt2.py runs on the same file and split (their <run dir>/held_out_scores.jsonl),
  and each one's difference from the bag-of-words model trained on all training comparisons and from the
  first run, with a 95% interval from the same resampled prompts for both (a paired bootstrap).

    python benchmarks/preference_baselines.py runs/<run>/preferences.jsonl --vader
"""

import argparse
import json
import os
import random
import re
import sys

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from reward_model_gpt2 import Args, split_comparisons  # noqa: E402


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def correct(margins: np.ndarray) -> np.ndarray:
    """1 where the chosen response scores higher, 1/2 for a tie, 0 otherwise."""
    margins = np.asarray(margins, dtype=np.float64)
    return (margins > 0) + 0.5 * (margins == 0)


def accuracy(margins: np.ndarray) -> float:
    """Share of comparisons whose chosen response scores higher; a tie counts 1/2."""
    return float(np.mean(correct(margins)))


def prompt_bootstrap(values: np.ndarray, prompts: list[str], num_resamples: int = 4000, seed: int = 0
                     ) -> tuple[float, float]:
    """95% percentile interval of the mean of per-comparison values (correctness, or a difference of two
    models' correctness) when the prompts are resampled with replacement, each with all its comparisons."""
    values, groups = np.asarray(values, dtype=np.float64), sorted(set(prompts))
    index = {p: g for g, p in enumerate(groups)}
    group_of = np.array([index[p] for p in prompts])
    sums, counts = np.bincount(group_of, values, len(groups)), np.bincount(group_of, None, len(groups))
    picks = np.random.default_rng(seed).integers(0, len(groups), (num_resamples, len(groups)))
    means = sums[picks].sum(1) / counts[picks].sum(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def fit_bradley_terry(differences: torch.Tensor, l2: float) -> torch.Tensor:
    """Weights w minimizing mean(-log sigma(differences @ w)) + l2 |w|^2 / len(differences): a linear score
    w.x fitted to pairs (x_chosen - x_rejected). The same fit as logistic regression without an intercept on
    the symmetrized pairs (the difference labeled 1, its negative labeled 0)."""
    x = differences.double()
    weights = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weights], max_iter=500, tolerance_grad=1e-9, tolerance_change=1e-12,
                                  line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = -F.logsigmoid(x @ weights).mean() + l2 * weights.square().sum() / len(x)
        loss.backward()
        return loss

    optimizer.step(closure)
    return weights.detach()


def prompt_folds(prompts: list[str], folds: int, seed: int) -> list[list[int]]:
    """Row indices of `folds` folds that each hold whole prompts (the distinct prompts shuffled by the seed,
    dealt out in turn)."""
    distinct = sorted(set(prompts))
    random.Random(seed).shuffle(distinct)
    fold_of = {p: k % folds for k, p in enumerate(distinct)}
    return [[i for i, p in enumerate(prompts) if fold_of[p] == k] for k in range(folds)]


def cross_validated_l2(differences: torch.Tensor, prompts: list[str], l2s: list[float], folds: int, seed: int
                       ) -> tuple[float, dict]:
    """The L2 strength among l2s with the best accuracy on held-out folds of whole training prompts, and each
    one's cross-validated accuracy (pooled over the folds; the first of equals wins)."""
    fold_rows = prompt_folds(prompts, min(folds, len(set(prompts))), seed)
    scores = {}
    for l2 in l2s:
        margins = torch.zeros(len(differences), dtype=torch.float64)
        for rows in fold_rows:
            fit_rows = sorted(set(range(len(differences))) - set(rows))
            margins[rows] = differences[rows].double() @ fit_bradley_terry(differences[fit_rows], l2)
        scores[l2] = accuracy(margins.numpy())
    return max(l2s, key=lambda l2: scores[l2]), scores


def bag_of_words_differences(comparisons: list[dict], train: list[int]) -> torch.Tensor:
    """chosen minus rejected word counts of every comparison, over the training responses' vocabulary."""
    vocabulary = {w: j for j, w in enumerate(sorted({w for i in train for key in ("chosen", "rejected")
                                                     for w in words(comparisons[i][key])}))}

    def counts(text: str) -> torch.Tensor:
        vector = torch.zeros(len(vocabulary), dtype=torch.float64)
        for w in words(text):
            if w in vocabulary:
                vector[vocabulary[w]] += 1
        return vector

    return torch.stack([counts(c["chosen"]) - counts(c["rejected"]) for c in comparisons])


def bag_of_words_margins(comparisons: list[dict], train: list[int], held_out: list[int], l2: float
                         ) -> np.ndarray:
    """Fit the bag-of-words Bradley-Terry model on `train` and return its held-out margins."""
    differences = bag_of_words_differences(comparisons, train)
    return (differences[held_out] @ fit_bradley_terry(differences[train], l2)).numpy()


def bag_of_words_accuracy(comparisons: list[dict], train: list[int], held_out: list[int], l2: float) -> float:
    return accuracy(bag_of_words_margins(comparisons, train, held_out, l2))


def read_held_out_scores(path: str, held_out: list[int]) -> np.ndarray:
    """The margins of a reward_model_gpt2.py run's held_out_scores.jsonl, in the order of `held_out`; stops if
    the run held out other comparisons (another file, --eval-fraction or --seed)."""
    with open(path) as f:
        margins = {line["index"]: line["margin"] for line in map(json.loads, f)}
    if sorted(margins) != sorted(held_out):
        raise SystemExit(f"error: --scores {path}: its held-out comparisons are not this split's (the run's "
                         f"file, --eval-fraction and --seed must be these)")
    return np.array([margins[i] for i in held_out])


def interval(values: np.ndarray, prompts: list[str]) -> str:
    low, high = prompt_bootstrap(values, prompts)
    return f"{np.mean(values):.3f} [{low:.3f}, {high:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preferences", help="a JSONL file of comparisons")
    parser.add_argument("--eval-fraction", type=float, default=Args.eval_fraction,
                        help="as reward_model_gpt2.py's: the share of the prompts held out")
    parser.add_argument("--seed", type=int, default=Args.seed, help="as reward_model_gpt2.py's")
    parser.add_argument("--sizes", type=int, nargs="+", default=[250, 500, 1000, 2000, 4000],
                        help="training comparisons for the bag-of-words curve (capped at all of them)")
    parser.add_argument("--l2", type=float, nargs="+", default=[0.1, 1.0, 10.0],
                        help="L2 strengths, one chosen by cross-validation over the training prompts")
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds of training prompts")
    parser.add_argument("--vader", action="store_true", help="also vader's score of the response alone")
    parser.add_argument("--scores", nargs="+", default=[],
                        help="held_out_scores.jsonl of reward_model_gpt2.py runs on this file and split")
    args = parser.parse_args()
    if not 0 < args.eval_fraction < 1:
        raise SystemExit(f"error: --eval-fraction must be between 0 and 1 (got {args.eval_fraction})")
    if args.folds < 2:
        raise SystemExit(f"error: --folds must be at least 2 (got {args.folds})")
    for path in [args.preferences, *args.scores]:
        if not os.path.isfile(path):
            raise SystemExit(f"error: {path}: no such file")
    with open(args.preferences) as f:
        comparisons = [json.loads(line) for line in f if line.strip()]
    prompts = [c["prompt"] for c in comparisons]
    train, held_out = split_comparisons(prompts, args.eval_fraction, args.seed)
    held_out_prompts = [prompts[i] for i in held_out]
    if len(set(prompts[i] for i in train)) < 2:
        raise SystemExit(f"error: {args.preferences}: fewer than 2 training prompts after --eval-fraction "
                         f"{args.eval_fraction}; cross-validation needs more")
    print(f"{args.preferences}: {len(train)} training comparisons of {len(set(prompts[i] for i in train))} "
          f"prompts, {len(held_out)} held-out comparisons of {len(set(held_out_prompts))} prompts; "
          f"accuracies with 95% intervals over the held-out prompts")
    if all("gold_chosen" in comparisons[i] for i in held_out):
        gold = np.array([comparisons[i]["gold_chosen"] - comparisons[i]["gold_rejected"] for i in held_out])
        print(f"gold labeler: {interval(correct(gold), held_out_prompts)}")
    if args.vader:
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

        analyzer = SentimentIntensityAnalyzer()
        compound = lambda text: analyzer.polarity_scores(text)["compound"]  # noqa: E731
        margins = np.array([compound(comparisons[i]["chosen"]) - compound(comparisons[i]["rejected"])
                            for i in held_out])
        print(f"vader on the response alone: {interval(correct(margins), held_out_prompts)}")
    for size in sorted({min(s, len(train)) for s in args.sizes} | {len(train)}):  # the last: all of them
        subset = train[:size]
        differences = bag_of_words_differences(comparisons, subset)
        l2, cv = cross_validated_l2(differences[subset], [prompts[i] for i in subset], args.l2, args.folds,
                                    args.seed)
        bag = correct(bag_of_words_margins(comparisons, subset, held_out, l2))
        swept = ", ".join(f"l2 {k:g}: {v:.3f}" for k, v in cv.items())
        print(f"bag of words, {size} training comparisons: {interval(bag, held_out_prompts)} at l2 {l2:g} "
              f"(cross-validated: {swept})")
    models = [correct(read_held_out_scores(path, held_out)) for path in args.scores]
    for path, model in zip(args.scores, models):
        print(f"reward model {path}: {interval(model, held_out_prompts)}; minus bag of words "
              f"({len(train)} comparisons): {interval(model - bag, held_out_prompts)}")
        if len(models) > 1 and model is not models[0]:
            print(f"  minus the first reward model: {interval(model - models[0], held_out_prompts)}")


if __name__ == "__main__":
    main()
