"""One-line breakages of grpo_gpt2.py that tests/test_grpo_gpt2.py must catch (see mutation_check.py).

Each entry is (name, text found exactly once in the script, its replacement). Written before the tests that
were to catch them (issue 41), after the first tests of the file (issue 39)."""

TEST_FILE = "tests/test_grpo_gpt2.py"

MUTANTS = [
    ("issue48: the KL term subtracted from the loss (pushes the policy away from the reference)",
     'loss = losses["policy_loss"] + args.beta * losses.get("kl", 0.0)',
     'loss = losses["policy_loss"] - args.beta * losses.get("kl", 0.0)'),
    ("issue48: the KL term weighted by --clip-coef, not --beta",
     'loss = losses["policy_loss"] + args.beta * losses.get("kl", 0.0)',
     'loss = losses["policy_loss"] + args.clip_coef * losses.get("kl", 0.0)'),
    ("issue41: the ratio taken against the new log-probs, detached (ratio 1 in every pass and minibatch)",
     "token_pg_loss, ratio, logratio = policy_loss(newlogprob, logprobs[micro_inds],",
     "token_pg_loss, ratio, logratio = policy_loss(newlogprob, newlogprob.detach(),"),
    ("issue41: the DAPO normalizer counted per micro-batch, not over the minibatch",
     "sizes = (args.loss_type, args.minibatch_size, minibatch_tokens, args.response_length)",
     "sizes = (args.loss_type, args.minibatch_size, micro_mask.sum(), args.response_length)"),
    ("issue41: the group advantages of the raw scores (the EOS trick lost)",
     "advantages, all_equal = group_advantages(scores, args.num_generations, args.scale_rewards,",
     "advantages, all_equal = group_advantages(raw_scores, args.num_generations, args.scale_rewards,"),
    ("issue41: the group's variance where its std is meant",
     "advantages = advantages / (grouped.std(dim=1, keepdim=True) + 1e-4)",
     "advantages = advantages / (grouped.var(dim=1, keepdim=True) + 1e-4)"),
    ("issue41: the k3 term against the sampling log-probs (no gradient from the KL)",
     "kl = k3_kl(newlogprob, ref_logprobs[micro_inds],",
     "kl = k3_kl(logprobs[micro_inds], ref_logprobs[micro_inds],"),
    ("issue41: held-out standard error over responses, repeats of a prompt counted as independent",
     'result["raw_score_mean"], result["raw_score_stderr"] = mean_and_stderr(prompt_means)',
     'result["raw_score_mean"], result["raw_score_stderr"] = mean_and_stderr(raw_scores)'),
    ("issue41: --eval-checkpoint samples with the command's flags, not the policy's saved settings",
     "    use_saved_sampling(args)  # the sampling settings saved with the policy, not the command's\n",
     "\n"),
    ("issue41: the reward model's mean readout over the whole text (the query's tokens averaged in)",
     "starts = torch.tensor([len(t) - len(r) for t, r in zip(texts, responses)])",
     "starts = torch.tensor([0 for t, r in zip(texts, responses)])",
     "reward_model_folder and grpo", "tests/test_ppo_rlhf_gpt2.py"),  # the test of both RL files' reader
    ("RLOO's baseline the mean of the whole group (the response's own score in it)",
     "advantages = grouped - (grouped.sum(dim=1, keepdim=True) - grouped) / (num_generations - 1)",
     "advantages = grouped - grouped.sum(dim=1, keepdim=True) / num_generations", "rloo"),
    ("the corrected k3 with the ratio detached (TRL keeps its gradient)",
     "return kl if ratio is None else kl * ratio",
     "return kl if ratio is None else kl * ratio.detach()", "bias_corrected"),
    ("--use-bias-correction-kl ignored",
     "ratio if args.use_bias_correction_kl else None)",
     "None)", "glue"),
    ("the validation problems also trained on",
     "prompts = [p for p in prompts if p not in set(eval_prompts)]  # never trained on",
     "prompts = prompts", "validation"),
    ("torchrun: the minibatch's tokens of this process only",
     "minibatch_tokens = all_sum(response_mask[mb_inds].sum()) / args.world_size",
     "minibatch_tokens = response_mask[mb_inds].sum()", "torchrun"),
    ("torchrun: the tokens summed over the processes, not their mean (the gradient halved on 2)",
     "minibatch_tokens = all_sum(response_mask[mb_inds].sum()) / args.world_size",
     "minibatch_tokens = all_sum(response_mask[mb_inds].sum())", "torchrun"),
    ("torchrun: every process takes all the groups",
     "chosen = chosen[args.rank * local : (args.rank + 1) * local]",
     "chosen = chosen", "torchrun"),
    ("torchrun: the statistics of process 0 alone",
     "stats = mean_over_processes(stats, device)  # torchrun: each statistic's mean over the processes",
     "pass", "torchrun"),
    # the order inside an update: written before tests/test_update_order.py, survived every test of this file
    ("the gradient clipped after the optimizer's step",
     "                    nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)  # detail 11\n"
     "                    optimizer.step()",
     "                    optimizer.step()\n"
     "                    nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)  # detail 11",
     "grpo", "tests/test_update_order.py"),
    # the random streams: tests/test_random_streams.py (each survived every test of this file)
    ("the held-out evaluation draws from training's stream",
     '    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):',
     '    with torch.no_grad():',
     'grpo',
     'tests/test_random_streams.py'),
    # a flag through main(): survived every test of this file before
    ("--clip-coef-high left out of the logged clip fractions",
     "micro_mask, args.clip_coef, args.clip_coef_high)", "micro_mask, args.clip_coef, args.clip_coef)"),
    # several processes: each must draw from its own stream (the torchrun test records each one's draws)
    ("torchrun: every process seeded alike, its draws a copy of the others'",
     "    torch.manual_seed(args.seed + args.rank)  # torchrun: each process samples its own responses",
     "    torch.manual_seed(args.seed)  # torchrun: each process samples its own responses", "torchrun_two"),
]
