"""Breakages of ppo_atari.py that tests/test_ppo_atari.py must catch (run by mutation/mutation_check.py).

Each entry is (name, text found exactly once in the script, its replacement, pytest -k selector of the tests
expected to catch it): the main loop's wiring over lost lives, game overs and time-limit cuts, the evaluation's
games, a resume's schedule."""

TEST_FILE = "tests/test_ppo_atari.py"
CUT = "time_limit_cut"

MUTANTS = [
    ("a time-limit cut bootstrapped from the next game's first frames",
     "final_obs[step, cut] = real_next_obs[cut]", "final_obs[step, cut] = next_obs[cut]", CUT),
    ("a time-limit cut treated as the game's end",
     "terminations[step], dones[step] = terminated, done", "terminations[step], dones[step] = done, done", CUT),
    ("the cut's bootstrap value put on the step after the cut",
     "next_values[cut] = cut_values  # detail G2",
     "next_values[np.roll(cut, 1, axis=0)] = cut_values  # detail G2", CUT),
    ("evaluation without sticky actions: greedy games fixed by their no-op count",
     "env = make_env(env_id, video_dir, EVAL_STICKY)()", "env = make_env(env_id, video_dir)()", "no_op_counts_agree"),
    ("the greedy evaluation's pixels not scaled by 1/255 (that path alone)",
     "return self.actor(self.network(x / 255.0)).argmax(dim=-1)", "return self.actor(self.network(x)).argmax(dim=-1)",
     "greedy or evaluat"),
    ("the evaluation reads the frame before the action's (a stale observation)",
     "            obs, _, terminated, truncated, info = env.step(action.item())\n",
     "            _, _, terminated, truncated, info = env.step(action.item())\n", "greedy or evaluat"),
    ("a resume that moves the end says nothing",
     "if args.anneal_lr and before != args.total_timesteps:", "if args.anneal_lr and before == 0:", "moves_the_end"),
    ("a finished run's saved agent marked interrupted",
     "save_agent(agent, args, n_actions, run_dir, global_step if interrupted else None)",
     "save_agent(agent, args, n_actions, run_dir, global_step)", "finished", "tests/test_interrupts.py"),
    ("a Ctrl-C while saving ends with exit status 0",
     'print("interrupted while saving or evaluating: keeping the logs, skipping the rest")\n        interrupted = True',
     'print("interrupted while saving or evaluating: keeping the logs, skipping the rest")\n        interrupted = False',
     "while_saving", "tests/test_interrupts.py"),
    ("a resume that restores the emulators but not the no-op draws' random stream",
     '    env.unwrapped.np_random.bit_generator.state = state["np_random"]\n', "",
     "bit_for_bit or restored_env_draws"),
    ("a resume that restores every stream but the wrappers' frame stacks",
     '    env.obs_queue.extend(state["frames"].numpy())  # the deque keeps the last 4: these\n', "", "bit_for_bit"),
]
