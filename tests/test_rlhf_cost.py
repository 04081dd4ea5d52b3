"""Tests of benchmarks/rlhf_cost.py without timing anything: the command each script gets, the row it reports
(medians after the first iteration, worked out by hand), the tokenizer it builds, and its argument errors."""

import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_each_script_gets_the_task_the_sizes_and_its_own_flags():
    cost = load_benchmark("rlhf_cost")
    cli = SimpleNamespace(task="arithmetic", cuda=True, batch_size=64, response_length=8, iterations=5,
                          ppo_flags="--update-epochs 2", grpo_flags="--beta 0 --num-minibatches 4")
    models, runs = Path("/m"), Path("/r")
    ppo, grpo = (cost.command_of(script, models, runs, cli) for script in ("ppo", "grpo"))
    assert ppo[1].endswith("ppo_rlhf_gpt2.py") and grpo[1].endswith("grpo_gpt2.py")
    for command in (ppo, grpo):
        assert flag(command, "--model-name") == "/m/policy" and flag(command, "--reward-model") == "arithmetic"
        assert flag(command, "--arithmetic-digits") == "2" and flag(command, "--min-response-length") == "0"
        assert flag(command, "--batch-size") == "64" and flag(command, "--response-length") == "8"
        assert flag(command, "--total-episodes") == "320" and flag(command, "--eval-episodes") == "0"
        assert "--cuda" in command and "--no-cuda" not in command and flag(command, "--num-threads") == "1"
    # score normalization (extra batches before training) only exists in PPO; each script its own flags
    assert "--no-normalize-scores" in ppo and "--no-normalize-scores" not in grpo
    assert flag(ppo, "--update-epochs") == "2" and "--beta" not in ppo
    assert flag(grpo, "--beta") == "0" and flag(grpo, "--num-minibatches") == "4" and "--update-epochs" not in grpo
    cli.task, cli.cuda = "classifier", False
    assert flag(cost.command_of("ppo", models, runs, cli), "--reward-model") == "/m/reward"
    assert "--no-cuda" in cost.command_of("grpo", models, runs, cli)
    assert "--bf16" not in ppo and cost.command_of("grpo", models, runs, cli, "bf16")[-1] == "--bf16"
    cli.task = "vader"
    vader = cost.command_of("grpo", models, runs, cli)
    assert flag(vader, "--reward-model") == "vader" and "--min-response-length" not in vader


def test_the_preference_scripts_train_on_the_copied_comparisons_without_rollout_flags():
    cost = load_benchmark("rlhf_cost")
    cli = SimpleNamespace(task="vader", cuda=False, batch_size=64, response_length=8, iterations=5, ppo_flags="",
                          grpo_flags="--beta 0")
    dpo, rm = (cost.command_of(script, Path("/m"), Path("/r"), cli, "bf16") for script in ("dpo", "rm"))
    assert dpo[1].endswith("dpo_gpt2.py") and rm[1].endswith("reward_model_gpt2.py")
    for command in (dpo, rm):
        assert flag(command, "--preferences") == "/m/comparisons.jsonl" and flag(command, "--eval-every") == "0"
        assert flag(command, "--model-name") == "/m/policy" and "--no-cuda" in command and command[-1] == "--bf16"
        assert not {"--reward-model", "--batch-size", "--total-episodes", "--beta"} & set(command)
    assert flag(dpo, "--eval-episodes") == "0" and "--eval-episodes" not in rm  # the RM samples nothing


def test_the_comparisons_copied_fill_two_more_steps_than_timed(tmp_path):
    cost = load_benchmark("rlhf_cost")
    source = tmp_path / "all.jsonl"
    source.write_text("".join(f'{{"i": {i}}}\n' for i in range(1000)))
    cost.write_comparisons(str(source), tmp_path / "part.jsonl", iterations=4)
    # 32 x (4 + 2) = 192 to train on after a tenth held out: ceil(192 / 0.9) = 214, plus a step's 32 to spare
    assert (tmp_path / "part.jsonl").read_text().splitlines() == [f'{{"i": {i}}}' for i in range(246)]
    with pytest.raises(SystemExit, match="--preferences .* has 1000 comparisons; --iterations 40 needs 1526"):
        cost.write_comparisons(str(source), tmp_path / "part.jsonl", iterations=40)


def test_a_step_lasts_from_one_logged_loss_to_the_next_and_shows_no_rollout():
    cost = load_benchmark("rlhf_cost")
    assert cost.step_seconds([100.0, 103.5, 104.0, 110.0]) == [3.5, 0.5, 6.0]
    result = {"rollout": [0.0, 0.0, 0.0], "update": [3.5, 0.5, 6.0], "peak_rss_gb": 1.0, "gpu_mib": 0}
    # the first gap dropped: median of [0.5, 6.0] = 3.25
    assert cost.summary_row("dpo", result, "bf16") == "| dpo_gpt2.py | bf16 | - | 3.25 | 3.25 | 1.00 GB | - |"


def test_the_row_is_the_median_of_the_iterations_after_the_first():
    cost = load_benchmark("rlhf_cost")
    result = {"rollout": [9.0, 1.0, 3.0, 2.0], "update": [50.0, 4.0, 6.0, 8.0], "peak_rss_gb": 3.456,
              "gpu_mib": 2048}
    # medians of [1, 3, 2] and [4, 6, 8]: 2 and 6, total 8; 2048 MiB = 2.0 GiB
    assert cost.summary_row("grpo", result) == "| grpo_gpt2.py | fp32 | 2.00 | 6.00 | 8.00 | 3.46 GB | 2.0 GiB |"
    one = {"rollout": [5.0], "update": [7.0], "peak_rss_gb": 1.0, "gpu_mib": 0}  # one iteration: itself, no GPU
    assert cost.summary_row("ppo", one, "bf16") == "| ppo_rlhf_gpt2.py | bf16 | 5.00 | 7.00 | 12.00 | 1.00 GB | - |"


def test_the_speedup_is_fp32_s_median_over_bf16_s_per_script():
    cost = load_benchmark("rlhf_cost")

    def run(rollout, update):  # the first iteration warms up: never counted
        return {"rollout": [99.0, rollout], "update": [99.0, update], "peak_rss_gb": 1.0, "gpu_mib": 0}

    # PPO fp32 totals 10, 12, 30 (median 12), bf16 6, 8 (median 7): 12 / 7; GRPO only in fp32: no line
    results = [("ppo", "fp32", run(4, 6)), ("ppo", "bf16", run(2, 4)), ("grpo", "fp32", run(1, 1)),
               ("ppo", "fp32", run(5, 7)), ("ppo", "bf16", run(3, 5)), ("ppo", "fp32", run(10, 20))]
    assert cost.speedups(results) == ["- ppo_rlhf_gpt2.py: fp32 12.00 s, bf16 7.00 s per iteration (medians of 3 "
                                      "and 2 runs): bf16 1.71x as fast"]


def test_the_tokenizer_covers_the_vocabulary_and_ends_with_its_eos():
    cost = load_benchmark("rlhf_cost")
    tokenizer = cost.build_tokenizer(2000)
    assert len(tokenizer) == 2000 and tokenizer.eos_token_id == 1999
    text = "What is 27 + 30? The answer is 57."
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert all(isinstance(tokenizer.decode([i]), str) for i in range(2000))


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "12"], "--batch-size must be a multiple of 8"),
    (["--architecture", "smollm2-135m"], "--task classifier needs the GPT-2 tokenizer"),
    (["--scripts", "ppo", "dpo"], "--scripts dpo / rm need --preferences FILE"),
    (["--scripts", "rm", "--preferences", "/nonexistent.jsonl"], "--scripts dpo / rm need --preferences FILE"),
])
def test_bad_arguments_fail_before_any_model_is_built(argv, message):
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rlhf_cost.py"), *argv], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0 and message in result.stderr


def test_the_profiled_sampling_step_sees_the_same_cache_each_time_and_training_reaches_every_weight():
    profile = load_benchmark("bf16_profile")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8)).eval()
    runs = profile.passes(model, batch_size=3, tokens=5)
    first, second = runs["sample"](), runs["sample"]()
    assert first.shape == (3, 1, 50) and torch.equal(first, second)  # a cache that grew would change the logits
    runs["train"]()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_trl_side_by_side_gives_our_scripts_flags_they_accept_at_the_sizes_it_states(tmp_path, tiny):
    import tyro

    import dpo_gpt2
    import grpo_gpt2

    side = load_benchmark("trl_grpo_dpo")
    prefs = tmp_path / "p.jsonl"
    prefs.write_text("".join(f'{{"prompt": "p{i % 20}", "chosen": " a", "rejected": " b"}}\n' for i in range(300)))
    args = tyro.cli(grpo_gpt2.Args, args=side.ours_flags("grpo", tiny["policy"], str(prefs), str(tmp_path), "bf16"))
    grpo_gpt2.check_args(args)  # fails on flags the script refuses
    assert (args.batch_size, args.num_generations, args.micro_batch_size, args.num_minibatches, args.beta,
            args.bf16, args.reward_model) == (64, 8, 16, 1, 0.0, True, "length")
    assert args.response_length == 24 and args.min_response_length == 23  # a stop token cannot end one earlier
    args = tyro.cli(dpo_gpt2.Args, args=side.ours_flags("dpo", tiny["policy"], str(prefs), str(tmp_path), "fp32"))
    dpo_gpt2.check_args(args)
    assert (args.batch_size, args.micro_batch_size, args.max_length, args.bf16) == (32, 8, 128, False)
    assert side.comparisons_needed() * 0.9 >= 32 * (side.STEPS + 1)  # the training share fills every step
    # a real DPO run on the tiny model: its step ends, and its reference pass over every training comparison
    prefs.write_text("".join(f'{{"prompt": "p{i % 20}", "chosen": " a", "rejected": " b"}}\n'
                             for i in range(side.comparisons_needed())))
    result = side.run_ours("dpo", tiny["policy"], str(prefs), "fp32")
    training = max(n for n, _ in result["passes"])
    assert len(result["ends"]) == side.STEPS and training >= 32 * side.STEPS
    assert training in range(int(0.8 * side.comparisons_needed()), side.comparisons_needed())  # 10% held out
    assert all(seconds > 0 for _, seconds in result["passes"])
    assert side.reference_share(result) == pytest.approx(max(result["passes"])[1] * 32 / training)
    assert dpo_gpt2.logps_in_chunks.__name__ == "logps_in_chunks"  # the script's own again, not the timer
    # the reward model: DPO's sizes, the same held-out share; a real run gives one end per optimizer step
    import reward_model_gpt2
    args = tyro.cli(reward_model_gpt2.Args, args=side.ours_flags("rm", tiny["policy"], str(prefs), "r", "bf16"))
    reward_model_gpt2.check_args(args)
    assert (args.batch_size, args.micro_batch_size, args.max_length, args.bf16, args.eval_fraction) == (
        32, 8, 128, True, 0.1)
    result = side.run_ours("rm", tiny["policy"], str(prefs), "fp32")
    assert len(result["ends"]) == side.STEPS and result["ends"] == sorted(result["ends"]) and not result["passes"]


def test_trl_side_by_side_report_by_hand():
    side = load_benchmark("trl_grpo_dpo")

    def run(s, precision, seconds, method="grpo", **extra):  # the first gap is the warm-up
        return {"side": s, "method": method, "precision": precision, "seconds": [9.0, *seconds], "peak_gb": 1.0,
                "torch": "t", "transformers": "x", **extra}

    runs = [run("ours", "fp32", [2.0, 4.0]), run("ours", "bf16", [1.0, 1.0]),  # medians 3.0 and 1.0
            run("trl", "fp32", [6.0, 6.0], trl="1.16.0", gradient_checkpointing=True),
            run("trl", "bf16", [4.0, 4.0], trl="1.16.0", gradient_checkpointing=True),
            run("ours", "fp32", [5.0, 5.0])]  # a second round: the median of 3.0 and 5.0 is 4.0
    text = side.report(runs, "python x", "a model")
    assert "| grpo_gpt2.py | fp32 | 4.00 | 3.00, 5.00 | 1.00 |" in text
    assert "| TRL 1.16.0 GRPOTrainer | bf16 (TRL's default), gradient checkpointing | 4.00 | 4.00 | 1.00 |" in text
    assert "- ours in bf16 against TRL at its defaults: 4.00x as fast" in text
    assert "- ours against TRL, both fp32: 1.50x as fast" in text
    assert "- ours, bf16 against fp32: 4.00x as fast" in text and "- TRL, bf16 against fp32: 1.50x as fast" in text
    assert "## DPO" not in text
    # DPO: ours' reference pass (its largest logps_in_chunks call) counted a step's share of 32 comparisons
    dpo = [run("ours", "bf16", [2.0, 2.0], "dpo", passes=[(10, 1.0), (320, 4.0)]),  # 0.4 s per 32
           run("trl", "bf16", [4.8, 4.8], "dpo", trl="1.16.0", gradient_checkpointing=True)]
    text = side.report(dpo, "python x", "a model")
    assert "- ours in bf16 with its reference pass counted a step's share (0.40 s): 2.40 s a step, 2.00x as fast" \
        " as TRL in bf16" in text
    assert "ours in fp32 with" not in text  # no fp32 runs of either side
    rm = [run("ours", "bf16", [1.0, 3.0], "rm"), run("trl", "bf16", [4.0, 4.0], "rm", trl="1.16.0")]
    text = side.report(rm, "python x", "a model")
    assert "## Reward model" in text and "## DPO" not in text and "| reward_model_gpt2.py | bf16 | 2.00 |" in text
    assert "| TRL 1.16.0 RewardTrainer | bf16 (TRL's default) | 4.00 |" in text
    assert "- ours in bf16 against TRL at its defaults: 2.00x as fast" in text


def test_ppo_against_trl_runs_ours_in_bf16_and_reports_what_each_side_computed_in(tmp_path, tiny):
    side = load_benchmark("trl_side_by_side")
    policy = tmp_path / "policy"
    shutil.copytree(tiny["policy"], policy)
    ours = side.run_ours(str(policy), bf16=True)  # a real run: one end per iteration, its reward model made once
    assert ours["bf16"] and len(ours["ends"]) == side.ITERATIONS and (tmp_path / "policy-rm").is_dir()

    def run(s, seconds, **extra):
        return {"side": s, "seconds": seconds, "peak_gb": 1.0, "torch": "t", "transformers": "x", "python": "3",
                "rollout": [1.0], "update": [2.0], **extra}

    trl = dict(trl="1.12.0", config_bf16=True, gradient_checkpointing=False)
    side.report([run("ours", [2.0, 4.0], bf16=True), run("trl", [5.0], logits_dtypes=["torch.float32"], **trl),
                 run("ours", [3.0], bf16=True), run("trl", [7.0], logits_dtypes=["torch.float32"], **trl)],
                tmp_path / "page", "python x")
    page = (tmp_path / "page.md").read_text()
    assert "| ppo_rlhf_gpt2.py, bf16 (--bf16) | 3.0 | 2.0-4.0 | 3.0, 3.0 |" in page
    assert "| TRL 1.12.0 PPOTrainer, fp32 (config bf16=True) | 6.0 | 5.0-7.0 | 5.0, 7.0 |" in page
    # TRL's logits in bf16 mean autocast was on; a run from before these fields existed says so
    assert side.precision(run("trl", [1.0], logits_dtypes=["torch.bfloat16", "torch.float32"], trl="1",
                              config_bf16=True, gradient_checkpointing=True)) == \
        "bf16 autocast, gradient checkpointing (config bf16=True)"
    assert side.precision(run("trl", [1.0], trl="1")) == "its defaults, not recorded"
    assert side.precision(run("ours", [1.0])) == "fp32"
