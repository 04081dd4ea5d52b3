"""One-line breakages of grpo_gpt2.py that tests/test_grpo_gpt2.py must catch (see mutation_check.py).

Each entry is (name, text found exactly once in the script, its replacement). Written before the tests that
were to catch them (issue 41), after the first tests of the file (issue 39)."""

TEST_FILE = "tests/test_grpo_gpt2.py"

MUTANTS = [
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
     "starts = torch.tensor([0 for t, r in zip(texts, responses)])"),
    ("RLOO's baseline the mean of the whole group (the response's own score in it)",
     "advantages = grouped - (grouped.sum(dim=1, keepdim=True) - grouped) / (num_generations - 1)",
     "advantages = grouped - grouped.sum(dim=1, keepdim=True) / num_generations"),
    ("the corrected k3 with the ratio detached (TRL keeps its gradient)",
     "return kl if ratio is None else kl * ratio",
     "return kl if ratio is None else kl * ratio.detach()"),
    ("--use-bias-correction-kl ignored",
     "ratio if args.use_bias_correction_kl else None)",
     "None)"),
    ("the validation problems also trained on",
     "prompts = [p for p in prompts if p not in set(eval_prompts)]  # never trained on",
     "prompts = prompts"),
]
