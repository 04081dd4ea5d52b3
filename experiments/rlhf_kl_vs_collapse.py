"""KL penalty against mode collapse: PPO-RLHF on a small character-level LM whose reward is string length.

The course exercise: "use PPO to fine-tune a small character-level LM where the reward model is just string
length; observe mode collapse vs KL penalty." Everything runs offline on a CPU, in three steps:

1. Pretrain a character-level GPT-2 (4 layers, 128 wide, about 0.8M parameters) on real English prose: the
   Python Language Reference text that ships with CPython itself (`pydoc_data.topics`, the source of
   `help()`), its prose lines only. Tokenizer: one token per character, built with `tokenizers`. Saved with
   `save_pretrained`, so `ppo_rlhf_gpt2.py --model-name` loads it like any model.
2. Run `ppo_rlhf_gpt2.py` unchanged on it, `--reward-model length` (the response's length in characters
   / 48, not normalized), with a fixed KL coefficient in {0, 0.01, 0.05, 0.2, 1.0} and 3 seeds each. A
   response ends at its first "." from its 16th character on; with the EOS trick a response without one
   scores -1, so the best response ends with a "." at exactly the last of its 48 characters.
3. Read each run's TensorBoard log (reward, KL, entropy, diversity per iteration), sample 256 responses of
   each final policy on held-out prompts, and write docs/results/rlhf_kl_vs_collapse.md (table and samples)
   and docs/results/rlhf_kl_vs_collapse.png (curves, mean over seeds and min-max band).

Usage (from the repository root): python experiments/rlhf_kl_vs_collapse.py
    --kl-coefs 0 1.0 --seeds 1 --iterations 20   # a quicker look
"""

import collections
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tokenizers import Tokenizer, decoders, models
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import ppo_rlhf_gpt2 as rlhf  # noqa: E402

EOS = "<|endoftext|>"


@dataclass
class Args:
    kl_coefs: list[float] = field(default_factory=lambda: [0.0, 0.01, 0.05, 0.2, 1.0])
    """the fixed KL coefficients compared"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """seeds of the RLHF runs (one pretrained model for all)"""
    iterations: int = 80
    """PPO iterations per run (batch 32)"""
    learning_rate: float = 3e-4
    """learning rate of the RLHF runs"""
    pretrain_steps: int = 1800
    """optimizer steps of the character-level pretraining"""
    work_dir: str = "experiments/runs/rlhf_kl_vs_collapse"
    """the pretrained model, the prompts and the runs' logs (not committed)"""
    out: str = "docs/results/rlhf_kl_vs_collapse"
    """prefix of the written .md and .png"""
    eval_samples: int = 256
    """responses sampled from each final policy on held-out prompts"""
    report_only: bool = False
    """only write the report from the runs already in --work-dir (e.g. after running coefficients in parallel)"""


def english_prose() -> str:
    """The prose lines of the Python Language Reference shipped with CPython (code and tables left out)."""
    import pydoc_data.topics

    lines = []
    for text in pydoc_data.topics.topics.values():
        for line in text.splitlines():
            indent = len(line) - len(line.lstrip(" "))
            if line.strip() and indent <= 2 and not line.strip().startswith(("*", "+", "-", "=", ">>>", "|")):
                lines.append(line.strip())
    text = re.sub(r"\s+", " ", " ".join(lines))
    counts = collections.Counter(text)
    return "".join(c for c in text if counts[c] >= 50)  # drop rare characters (a smaller vocabulary)


def pretrain(args: Args, model_dir: Path, text: str) -> list[float]:
    """Train a character-level GPT-2 on the text with next-character prediction; returns the loss curve."""
    chars = sorted(set(text))
    vocab = {c: i for i, c in enumerate(chars)}
    vocab[EOS] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per character
    tokenizer.decoder = decoders.Fuse()
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, bos_token=EOS, unk_token=EOS)
    assert hf_tokenizer.decode(hf_tokenizer.encode("The value. It is")) == "The value. It is"
    data = torch.tensor([vocab[c] for c in text])
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(vocab), n_positions=128, n_embd=128, n_layer=4, n_head=4,
                        bos_token_id=vocab[EOS], eos_token_id=vocab[EOS])
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=args.pretrain_steps)
    losses, block, batch = [], 64, 24
    for step in range(args.pretrain_steps):
        starts = torch.randint(0, len(data) - block - 1, (batch,))
        x = torch.stack([data[s : s + block] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % 200 == 0 or step == args.pretrain_steps - 1:
            print(f"pretrain step {step} loss {loss.item():.3f} nats/char", flush=True)
    model.save_pretrained(model_dir)
    hf_tokenizer.save_pretrained(model_dir)
    return losses


def write_prompts(text: str, work_dir: Path) -> tuple[Path, list[str]]:
    """Openings of the text's sentences (their first two to four words): most for training, 32 held out."""
    rng = np.random.default_rng(0)
    openings = []
    for sentence in re.split(r"(?<=\.) ", text):
        words = sentence.split(" ")
        if len(words) > 6 and sentence[0].isupper():
            openings.append(" ".join(words[: rng.integers(2, 5)]))
    openings = sorted(set(o for o in openings if len(o) <= 30))
    rng.shuffle(openings)
    held_out, train = openings[:32], openings[32:]
    path = work_dir / "prompts.txt"
    path.write_text("\n".join(train) + "\n")
    return path, held_out


def read_scalars(run_dir: str) -> dict:
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: np.array([e.value for e in events.Scalars(tag)]) for tag in events.Tags()["scalars"]}


@torch.no_grad()
def sample_final_policy(model_dir: str, ref_dir: str, prompts: list[str], n: int) -> dict:
    """Sample n responses of a saved policy as in training (temperature 1, truncation, min length) and
    measure them: the training reward (EOS trick included), share ending in ".", diversity (distinct responses;
    distinct word bigrams / word bigrams), and how likely the pretrained LM finds them (its negative
    log-likelihood in bits per character)."""
    tokenizer, pad_token_id, stop_token_id = rlhf.load_tokenizer(model_dir, ".")
    policy = rlhf.load_policy(model_dir, torch.device("cpu"))
    reference = rlhf.load_policy(ref_dir, torch.device("cpu"))
    torch.manual_seed(12345)
    batch_prompts = [prompts[i % len(prompts)] for i in range(n)]
    queries = tokenizer(batch_prompts, padding=True, return_tensors="pt")["input_ids"]
    responses, _ = rlhf.generate(policy, queries, 48, 1.0, pad_token_id)
    responses, mask, contain_stop = rlhf.truncate_after_stop_token(responses, stop_token_id, pad_token_id, 16)
    ref_logits = rlhf.response_logits(reference, torch.cat([queries, responses], 1), queries.shape[1], 1.0,
                                      pad_token_id)
    ref_logprobs = rlhf.gather_logprobs(ref_logits, responses.masked_fill(~mask, 0))
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    distinct, _ = rlhf.diversity(responses, mask)
    words = [text.split() for text in texts]
    word_bigrams = [pair for w in words for pair in zip(w, w[1:])]
    scores = [len(t) / 48 if stop else -1.0 for t, stop in zip(texts, contain_stop.tolist())]  # as in training
    return {"reward": float(np.mean(scores)), "ends_with_stop": contain_stop.float().mean().item(),
            "distinct_responses": distinct, "distinct_2_words": len(set(word_bigrams)) / max(len(word_bigrams), 1),
            "ref_bits_per_char": (-ref_logprobs[mask].mean() / np.log(2)).item(),
            "samples": list(zip(batch_prompts, texts))}


def plot(curves: dict, out: Path) -> None:
    panels = [("objective/scores", "reward: length / 48, or -1 without \".\""),
              ("objective/kl", "KL to the reference (nats per response)"),
              ("losses/entropy", "policy entropy (nats per token)"),
              ("val/distinct_2", "distinct-2 (character bigrams)"),
              ("val/distinct_responses", "share of distinct responses in a batch")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (tag, title) in zip(axes, panels):
        for kl_coef, runs in curves.items():
            values = np.stack([run[tag] for run in runs])
            x = np.arange(1, values.shape[1] + 1)
            line, = ax.plot(x, values.mean(0), label=f"kl_coef {kl_coef:g}")
            ax.fill_between(x, values.min(0), values.max(0), color=line.get_color(), alpha=0.15)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("iteration (32 responses each)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(args: Args) -> None:
    torch.set_num_threads(1)
    work_dir = ROOT / args.work_dir
    work_dir.mkdir(parents=True, exist_ok=True)
    model_dir = work_dir / "char_lm"
    text = english_prose()
    start = time.time()
    if not (model_dir / "config.json").exists():
        losses = pretrain(args, model_dir, text)
        (work_dir / "pretrain_loss.txt").write_text(f"{np.mean(losses[-100:]):.4f} {time.time() - start:.0f}\n")
    pretrain_loss, pretrain_seconds = (work_dir / "pretrain_loss.txt").read_text().split()
    prompts_file, held_out = write_prompts(text, work_dir)

    for kl_coef in [] if args.report_only else args.kl_coefs:
        for seed in args.seeds:
            run_start = time.time()
            run_args = rlhf.Args(
                model_name=str(model_dir), reward_model="length", prompts_file=str(prompts_file), stop_token=".",
                response_length=48, min_response_length=16, max_query_length=32, temperature=1.0,
                batch_size=32, num_minibatches=2, total_episodes=32 * args.iterations,
                learning_rate=args.learning_rate, kl_coef=kl_coef, kl_target=None, normalize_scores=False,
                eval_episodes=0, seed=seed, save_model=True, cuda=False, runs_dir=str(run_dir_of(work_dir, kl_coef, seed)))
            stats = rlhf.main(run_args)
            final = sample_final_policy(os.path.join(stats["run_dir"], "model"), str(model_dir), held_out,
                                        args.eval_samples)
            final["minutes"] = (time.time() - run_start) / 60
            (Path(stats["run_dir"]) / "final.json").write_text(json.dumps(final))

    curves, finals = {}, {}
    for kl_coef in args.kl_coefs:
        for seed in args.seeds:
            (run_dir,) = run_dir_of(work_dir, kl_coef, seed).glob("ppo_rlhf_gpt2__*")
            curves.setdefault(kl_coef, []).append(read_scalars(str(run_dir)))
            finals.setdefault(kl_coef, []).append(json.loads((run_dir / "final.json").read_text()))
    initial = sample_final_policy(str(model_dir), str(model_dir), held_out, args.eval_samples)
    plot(curves, ROOT / f"{args.out}.png")
    write_report(args, curves, finals, initial, float(pretrain_loss), float(pretrain_seconds), len(text))


def run_dir_of(work_dir: Path, kl_coef: float, seed: int) -> Path:
    return work_dir / f"kl{kl_coef:g}_seed{seed}"


def write_report(args, curves, finals, initial, pretrain_loss, pretrain_seconds, n_chars) -> None:
    def mean_std(values):
        return f"{np.mean(values):.3f} ± {np.std(values):.3f}"

    lines = [
        "# KL penalty against mode collapse: a character-level LM rewarded for length",
        "",
        f"Command: `python experiments/rlhf_kl_vs_collapse.py --kl-coefs {' '.join(f'{c:g}' for c in args.kl_coefs)} "
        f"--seeds {' '.join(map(str, args.seeds))} --iterations {args.iterations} --learning-rate {args.learning_rate:g} "
        f"--pretrain-steps {args.pretrain_steps}` (2 CPU cores, one torch thread).",
        "",
        f"Pretrained model: a character-level GPT-2 (4 layers, 128 wide) trained for {args.pretrain_steps} steps "
        f"({pretrain_seconds:.0f} s) on {n_chars:,} characters of English prose from CPython's own "
        f"`pydoc_data.topics`; final training loss {pretrain_loss:.3f} nats/char "
        f"({pretrain_loss / np.log(2):.2f} bits/char). RLHF: `ppo_rlhf_gpt2.py --reward-model length`, "
        "responses of 48 characters that end at their first \".\" from the 16th on, score = characters / 48 "
        "(not normalized; EOS trick: no \".\", score -1), "
        f"temperature 1, batch 32 in 2 minibatches, {args.iterations} iterations, learning rate "
        f"{args.learning_rate:g}, fixed KL coefficient, everything else default.",
        "",
        "![curves](rlhf_kl_vs_collapse.png)",
        "",
        f"Final values, mean ± std over seeds {', '.join(map(str, args.seeds))}: the training columns are the mean of "
        f"the last 5 iterations; the held-out columns come from {args.eval_samples} responses of each final policy "
        "to 32 held-out prompts (temperature 1). Distinct-2 is over word bigrams (character bigrams, the curve's, "
        "say little for a character-level LM). \"Reference NLL\" is how many bits per character the pretrained "
        "model needs for the responses: how much they still look like its text.",
        "",
        "| kl_coef | reward (last 5) | KL (nats) | entropy (nats/token) | held-out reward | ends with \".\" "
        "| distinct responses | distinct-2 (words) | reference NLL (bits/char) | minutes per run |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| pretrained model | | | | {initial['reward']:.3f} | {initial['ends_with_stop']:.3f} | "
        f"{initial['distinct_responses']:.3f} | {initial['distinct_2_words']:.3f} | "
        f"{initial['ref_bits_per_char']:.3f} | |",
    ]
    for kl_coef, runs in curves.items():
        last = {tag: [run[tag][-5:].mean() for run in runs] for tag in
                ("objective/scores", "objective/kl", "losses/entropy")}
        f = finals[kl_coef]
        lines.append(
            f"| {kl_coef:g} | {mean_std(last['objective/scores'])} | {mean_std(last['objective/kl'])} | "
            f"{mean_std(last['losses/entropy'])} | {mean_std([x['reward'] for x in f])} | "
            f"{mean_std([x['ends_with_stop'] for x in f])} | {mean_std([x['distinct_responses'] for x in f])} | "
            f"{mean_std([x['distinct_2_words'] for x in f])} | {mean_std([x['ref_bits_per_char'] for x in f])} | "
            f"{np.mean([x['minutes'] for x in f]):.1f} |")
    lines += ["", "## Samples (seed 1, first six held-out prompts; the prompt is in brackets)", ""]
    for name, result in [("pretrained model", initial)] + [(f"kl_coef {c:g}", finals[c][0]) for c in finals]:
        lines.append(f"**{name}**")
        lines.append("")
        for prompt, response in result["samples"][:6]:
            lines.append(f"- [{prompt}]{response}".replace("|", "\\|"))
        lines.append("")
    (ROOT / f"{args.out}.md").write_text("\n".join(lines))
    print("\n".join(lines[:20 + len(curves)]))


if __name__ == "__main__":
    main(tyro.cli(Args))
