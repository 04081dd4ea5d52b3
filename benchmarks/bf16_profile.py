"""Where a --bf16 pass spends its time on this CPU: torch.profiler over the two kinds of pass an RLHF iteration
is made of, in fp32 and under bfloat16 autocast (--bf16's way: a model's forward wrapped in autocast).

- `sample`: one forward of one new token for a batch, with the key-value cache of a prompt (a sampling step),
  each forward its own autocast region (its weights cast to bf16 at every call);
- `sample, one region`: the same inside one autocast region kept open over the steps, as the scripts' generate
  runs its loop, so that autocast's cache keeps each weight's bf16 copy (fp32: the same as `sample`);
- `train`: one forward and backward of a batch of whole sequences (an update's micro-batch).

The model has SmolLM2-135M's architecture with random weights (timing only), one torch thread. Per pass and
precision: the median seconds of --repeats timed passes (after one warm-up), then the profiler's top operators
by self CPU time, with the share of the weights' casts to bf16 (aten::_to_copy and aten::copy_).

With --cuda the model and batch sit on the GPU (autocast on "cuda"), and each pass also reports the GPU's busy
time: the sum of its kernels' times in the profiled pass, against the pass's wall time. Busy time far below the
wall time means the pass waits on the CPU that launches the kernels, not on the GPU's arithmetic.

Usage: python benchmarks/bf16_profile.py [--batch-size 16] [--tokens 30] [--repeats 5] [--cuda] [--out FILE]
"""

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, LlamaForCausalLM

# SmolLM2-135M's config.json (as in benchmarks/rlhf_cost.py)
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0, tie_word_embeddings=True,
                    head_dim=64, rms_norm_eps=1e-5)
CASTS = ("aten::_to_copy", "aten::copy_", "aten::to")


def passes(model, batch_size: int, tokens: int) -> dict:
    """{name: a function that runs one pass}."""
    ids = torch.randint(0, model.config.vocab_size, (batch_size, tokens), device=model.device)
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    step = ids[:, -1:]

    def sample():
        with torch.no_grad():
            logits = model(input_ids=step, past_key_values=cache, use_cache=True).logits
            cache.crop(-1)  # drop the new token: the same cache length at every timed step
        return logits

    def train():
        model(input_ids=ids).logits.float().log_softmax(-1).mean().backward()

    return {"sample": sample, "sample, one region": sample, "train": train}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=30, help="the sequence length (sample: the cached prefix)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=8, help="operators listed per pass and precision")
    parser.add_argument("--out", default=None, help="also write the report to this Markdown file")
    parser.add_argument("--cuda", action="store_true", help="profile on the GPU (default: the CPU)")
    cli = parser.parse_args()
    if cli.cuda and not torch.cuda.is_available():
        parser.error("--cuda: torch sees no CUDA GPU here; leave --cuda out to profile on the CPU")
    device = torch.device("cuda" if cli.cuda else "cpu")
    sync = torch.cuda.synchronize if cli.cuda else (lambda: None)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    where = torch.cuda.get_device_name(0) if cli.cuda else "this CPU"
    lines = [f"# --bf16 on {where}, profiled: SmolLM2-135M's architecture, batch {cli.batch_size}, "
             f"{cli.tokens} tokens", "", f"Command: `python benchmarks/bf16_profile.py --batch-size {cli.batch_size} "
             f"--tokens {cli.tokens} --repeats {cli.repeats}{' --cuda' if cli.cuda else ''}`; torch "
             f"{torch.__version__}, 1 thread, {time.strftime('%Y-%m-%d %H:%M')}.", ""]
    seconds = {}
    for precision in ("fp32", "bf16"):
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).to(device).eval()
        if precision == "bf16":
            model.forward = torch.autocast(device.type, dtype=torch.bfloat16)(model.forward)
        for name, run in passes(model, cli.batch_size, cli.tokens).items():
            with contextlib.ExitStack() as region:
                if name == "sample, one region":  # entered once: the warm-up fills autocast's cache
                    region.enter_context(torch.autocast(device.type, dtype=torch.bfloat16,
                                                        enabled=precision == "bf16"))
                run()  # warm-up
                sync()
                timed = []
                for _ in range(cli.repeats):
                    start = time.perf_counter()
                    run()
                    sync()
                    timed.append(time.perf_counter() - start)
                seconds[name, precision] = statistics.median(timed)
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cli.cuda else [])
                with profile(activities=activities) as prof:
                    run()
                    sync()
            events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
            total = sum(e.self_cpu_time_total for e in events)
            cast = sum(e.self_cpu_time_total for e in events if e.key in CASTS)
            busy = ""
            if cli.cuda:  # the kernels' own events (an operator's device time repeats its kernels')
                kernels = sum(e.device_time_total for e in prof.events() if e.device_type == DeviceType.CUDA) / 1e6
                busy = (f"; GPU busy {1e3 * kernels:.1f} ms of its {1e3 * seconds[name, precision]:.1f} ms "
                        f"({100 * kernels / seconds[name, precision]:.0f}%)")
            lines += [f"## {name}, {precision}: {seconds[name, precision]:.3f} s a pass (median of {cli.repeats}); "
                      f"casts {100 * cast / total:.0f}% of the profiled self CPU time{busy}", "",
                      "| operator | calls | self CPU ms | share |", "|---|---|---|---|"]
            lines += [f"| {e.key} | {e.count} | {e.self_cpu_time_total / 1e3:.1f} | "
                      f"{100 * e.self_cpu_time_total / total:.0f}% |" for e in events[: cli.top]]
            lines.append("")
    lines += [f"- {name}: fp32 {seconds[name, 'fp32']:.3f} s, bf16 {seconds[name, 'bf16']:.3f} s a pass: bf16 "
              f"{seconds[name, 'fp32'] / seconds[name, 'bf16']:.2f}x as fast"
              for name in ("sample", "sample, one region", "train")]
    report = "\n".join(lines) + "\n"
    print(report)
    if cli.out:
        Path(cli.out).write_text(report)


if __name__ == "__main__":
    main()
