"""Mutation score of a script's pure functions with mutmut 3.x (pip install mutmut==3.8.1; not in CI).

mutmut changes one operator, constant, argument or call at a time in a function ("x + 1" to "x - 1", "<" to
"<=", "max" to "min", an argument to None, ...) and runs the tests that call that function; a mutant the tests
do not fail on survives. This tool applies it to one script at a time, to the functions the fast unit tests
are for:
  - mutated: every function and method defined above the script's "# Plumbing" line, except main() (its glue
    is what the hand-written mutants of mutation/mutants/ and mutation_check.py cover) and the decorated
    functions, which mutmut never mutates (generate and evaluate in the RLHF file: listed as skipped);
  - not mutated: main(), and below the "# Plumbing" line the argument checks, loading, saving and evaluation
    of a saved agent (tested by the bad-argument and round-trip tests, which run main());
  - tests run: the tests of tests/test_<script>.py that neither run main(), nor start a subprocess, nor read
    the script's text (found by reading the test file: a test is left out if it, a fixture it takes or a
    helper it calls, transitively, refers to <script>.main, <script>.__file__ or subprocess), each mutant
    against only those of them that call its function.

mutmut writes a mutants/ folder and caches beside the code, so everything runs in a private copy of the
repository (--workdir, default /tmp/mutmut_score/<script>, made afresh each run); the [mutmut] section of the
repository's setup.cfg holds the shared settings, this tool adds source_paths and the test selection to the
copy's. Prints, per function and for the file, killed / total, and each survivor's diff (mutmut show).

Usage (from the repository root; about 2-4 mutants a second on a free core, so minutes to tens of minutes):
    python mutation/mutmut_score.py ppo_rlhf_gpt2
    python mutation/mutmut_score.py a2c reinforce --max-children 2
    python mutation/mutmut_score.py ppo_rlhf_gpt2 --only 'x_compute_gae__mutmut_*'   # rerun some mutants
    python mutation/mutmut_score.py ppo_cartpole --list      # only show the functions and tests selected
"""

import argparse
import ast
import configparser
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_DIRS = {".git", ".venv", ".venv-ci", "runs", "models", "mutants", "videos", "__pycache__",
                ".pytest_cache", "venv-trl"}
SEPARATOR = "ǁ"  # mutmut's separator of class and method in a mutant's name
KILLED = {1, 3}  # mutmut's exit codes that mean "killed" (3: pytest's internal error, e.g. an exception)
TIMEOUTS = {-24, 24, 152, 255, 36}  # a mutant whose tests ran past mutmut's CPU-time limit: counted as killed


def plumbing_line(source: str) -> int:
    """The line number of the "# Plumbing" comment (the end of the reading path), or past the end."""
    for number, line in enumerate(source.splitlines(), 1):
        if line.startswith("# Plumbing"):
            return number
    return len(source.splitlines()) + 1


def selected_functions(script: Path) -> tuple[list[str], list[str]]:
    """mutmut's mangled names (x_f, xǁClassǁmethod) of the functions above the # Plumbing line except main,
    and the names of the decorated ones there, which mutmut leaves alone."""
    source = script.read_text()
    end = plumbing_line(source)
    names, decorated = [], []

    def plain(node):
        return not node.decorator_list or all(
            isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod") for d in node.decorator_list)

    for node in ast.parse(source).body:
        if node.lineno > end:
            break
        if isinstance(node, ast.FunctionDef) and node.name != "main":
            (names if plain(node) else decorated).append(node.name)
            if plain(node):
                names[-1] = f"x_{node.name}"
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    if plain(item):
                        names.append(f"x{SEPARATOR}{node.name}{SEPARATOR}{item.name}")
                    else:
                        decorated.append(f"{node.name}.{item.name}")
    return names, decorated


def unit_tests(test_file: Path, module: str) -> tuple[list[str], list[str]]:
    """The test functions of test_file that never run <module>.main() nor a subprocess nor read the script's
    text (<module>.__file__), through the fixtures they take and the module-level helpers they call
    (transitively); and the ones left out."""
    tree = ast.parse(test_file.read_text())
    aliases = {module}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == module}
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}

    def heavy_itself(node) -> bool:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and sub.attr == "main" and isinstance(sub.value, ast.Name) \
                    and sub.value.id in aliases:
                return True
            if isinstance(sub, ast.Name) and sub.id == "subprocess":
                return True
            # <module>.__file__: the test reads the script's text, which mutmut rewrites (house style checks)
            if isinstance(sub, ast.Attribute) and sub.attr == "__file__" and isinstance(sub.value, ast.Name) \
                    and sub.value.id in aliases:
                return True
        return False

    def uses(node) -> set[str]:
        names = {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name)}
        names |= {a.arg for a in node.args.args}  # fixtures are taken as arguments
        return names & set(functions)

    heavy = {name for name, node in functions.items() if heavy_itself(node)}
    changed = True
    while changed:
        changed = False
        for name, node in functions.items():
            if name not in heavy and uses(node) & heavy:
                heavy.add(name)
                changed = True
    tests = [name for name in functions if name.startswith("test_")]
    return [t for t in tests if t not in heavy], [t for t in tests if t in heavy]


def make_copy(dest: Path) -> None:
    """A fresh copy of the repository without the virtual environments, runs and models."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ROOT, dest, ignore=lambda d, names: [n for n in names if n in SKIPPED_DIRS])


def exclude_main_and_plumbing(copy: Path, script: str) -> None:
    """In the copy only: a "# pragma: no mutate block" line before `def main(`, which mutmut reads as "no
    mutant in this statement nor in the ones after it": main() and, as main() is the last function above
    the # Plumbing line in every script, the plumbing. Without it mutmut would also generate main()'s
    mutants (a 15 MB module for the RLHF file), only to leave them unrun."""
    path = copy / f"{script}.py"
    source = path.read_text()
    if source.count("\ndef main(") != 1:
        sys.exit(f"error: {script}.py: no single top-level `def main(`")
    main_line = source[: source.index("\ndef main(") + 1].count("\n") + 1
    functions_after_main = [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)
                            and not n.decorator_list and main_line < n.lineno < plumbing_line(source)]
    if functions_after_main:
        print(f"   warning: {', '.join(functions_after_main)} (after main(), above # Plumbing) not mutated")
    path.write_text(source.replace("\ndef main(", "\n# pragma: no mutate block\ndef main(", 1))


def write_config(copy: Path, script: str, tests: list[str]) -> None:
    """The repository's [mutmut] settings plus this script's source path and test selection."""
    config = configparser.ConfigParser()
    config.read(copy / "setup.cfg")
    if not config.has_section("mutmut"):
        config.add_section("mutmut")
    config["mutmut"]["source_paths"] = f"{script}.py"
    config["mutmut"]["pytest_add_cli_args_test_selection"] = "\n" + "\n".join(
        f"tests/test_{script}.py::{t}" for t in tests)
    # the other scripts and the pytest settings, for tests that import or read them
    others = sorted(p.name for p in copy.iterdir() if p.is_file() and p.name != f"{script}.py")
    config["mutmut"]["also_copy"] = "\n" + "\n".join(others + ["docs/", "benchmarks/"])
    with open(copy / "setup.cfg", "w") as f:
        config.write(f)


def score(copy: Path, script: str, functions: list[str], only: list[str] | None) -> dict:
    """Per selected function: the mutants and their mutmut exit codes, read from mutants/<script>.py.meta."""
    meta = json.loads((copy / "mutants" / f"{script}.py.meta").read_text())
    by_function = {f: {} for f in functions}
    for key, code in meta["exit_code_by_key"].items():
        function = key.partition("__mutmut_")[0].split(".", 1)[1]
        if function in by_function and (not only or any(fnmatch.fnmatch(key, f"{script}.{o}") for o in only)):
            by_function[function][key] = code
    return by_function


def run_script(script: str, args) -> int:
    path = ROOT / f"{script}.py"
    test_file = ROOT / "tests" / f"test_{script}.py"
    if not path.is_file() or not test_file.is_file():
        sys.exit(f"error: {script}: need {script}.py and tests/test_{script}.py in {ROOT}")
    functions, decorated = selected_functions(path)
    tests, left_out = unit_tests(test_file, script)
    print(f"== {script}.py: {len(functions)} functions above '# Plumbing' except main(); decorated, not "
          f"mutated by mutmut: {', '.join(decorated) or 'none'}")
    print(f"   functions: {', '.join(f.replace(SEPARATOR, '.') for f in functions)}")
    print(f"   tests/test_{script}.py: {len(tests)} unit tests run; left out (run main() or a subprocess): "
          f"{', '.join(left_out) or 'none'}")
    if args.list:
        return 0
    if not tests:
        print("error: no unit test selected")
        return 1
    copy = Path(args.workdir or f"/tmp/mutmut_score/{script}")
    make_copy(copy)
    exclude_main_and_plumbing(copy, script)
    write_config(copy, script, tests)
    patterns = [f"{script}.{f}__mutmut_*" for f in functions]
    if args.only:
        patterns = [f"{script}.{o}" for o in args.only]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), HF_HUB_OFFLINE="1")
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.max_children), *patterns]
    start = time.time()
    print(f"   in {copy}: {' '.join(command[1:4])} ... ({len(patterns)} patterns)", flush=True)
    done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True)
    seconds = time.time() - start
    if not (copy / "mutants" / f"{script}.py.meta").exists() or done.returncode != 0:
        print(done.stdout[-4000:] + done.stderr[-4000:])
        print(f"error: mutmut run exited with status {done.returncode}")
        return 1
    results = score(copy, script, functions, args.only)
    total = killed = timeouts = 0
    survivors = []
    print(f"   {'function':<28} killed / mutants   survivors")
    for function, codes in results.items():
        if not codes:
            continue
        k = sum(code in KILLED | TIMEOUTS for code in codes.values())
        total, killed = total + len(codes), killed + k
        timeouts += sum(code in TIMEOUTS for code in codes.values())
        bad = [key for key, code in codes.items() if code not in KILLED | TIMEOUTS]
        survivors += [(key, codes[key]) for key in bad]
        print(f"   {function.replace(SEPARATOR, '.'):<28} {k:>6} / {len(codes):<7}   "
              f"{', '.join(key.rpartition('__mutmut_')[2] for key in bad)}")
    percent = 100 * killed / total if total else float("nan")
    print(f"   {script}.py: {killed} / {total} killed ({percent:.1f}%; {timeouts} of them by a timeout), "
          f"{len(survivors)} not killed, "
          f"{seconds / 60:.1f} min, {time.strftime('%Y-%m-%d')}")
    status = {0: "survived", 33: "no tests", 5: "no tests", 36: "timeout", None: "not checked"}
    for key, code in survivors:
        diff = subprocess.run([sys.executable, "-m", "mutmut", "show", key], cwd=copy, env=env,
                              capture_output=True, text=True).stdout
        lines = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
        print(f"   {status.get(code, f'exit code {code}')}: {key}")
        for line in lines:
            print(f"       {line.strip()[:140]}")
    return 0 if not survivors else 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("scripts", nargs="+", help="script stems, e.g. ppo_rlhf_gpt2 a2c")
    parser.add_argument("--max-children", type=int, default=1, help="mutants tested at the same time")
    parser.add_argument("--workdir", help="the private copy (one script; default /tmp/mutmut_score/<script>)")
    parser.add_argument("--only", nargs="+", help="only these mutant names (globs without the module, e.g. "
                                                  "'x_compute_gae__mutmut_*' or x_policy_loss__mutmut_3)")
    parser.add_argument("--list", action="store_true", help="list the functions and tests, run nothing")
    args = parser.parse_args()
    if args.workdir and len(args.scripts) > 1:
        sys.exit("error: --workdir takes one script")
    if args.max_children < 1:
        sys.exit(f"error: --max-children must be positive, got {args.max_children}")
    statuses = [run_script(script, args) for script in args.scripts]
    return max(statuses)


if __name__ == "__main__":
    sys.exit(main())
