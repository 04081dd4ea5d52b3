"""Mutation check: does each script's test file fail when the script is broken on purpose?

mutation/mutants/<script>.py holds the breakages of <script>.py ("mutants"), as
    TEST_FILE = "tests/test_<script>.py"
    MUTANTS = [(name, old_text, new_text), ...]    # or (name, old_text, new_text, pytest -k selector[, test file])
For each mutant the runner copies the repository's top-level files and its tests/ and docs/ folders into a
temporary folder, replaces old_text by new_text in the copy of the script, and runs
    python -m pytest -x -q TEST_FILE [-k selector]
there. The mutant is killed if the tests fail, survives if they pass, and does not apply if old_text is not in
the script exactly once (the script was changed: update the mutant, it is never skipped silently). A selector
only narrows the tests that may kill the mutant, so a mutant killed with one is killed by the whole file too.
First each test file (narrowed to its mutants' selectors, if all have one) must pass on the unchanged scripts.

Usage (from the repository root; slow, a test-file run per mutant, so not part of CI):
    python mutation/mutation_check.py                              # every script's mutants
    python mutation/mutation_check.py --scripts a2c reinforce --jobs 2
    python mutation/mutation_check.py --mutants bootstrap          # the mutants whose name contains "bootstrap"
    python mutation/mutation_check.py --list                       # only check that every mutant applies

Prints a table and the survivors; exits with status 0 only if every mutant applied and was killed.
"""

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS_DIR = ROOT / "mutation" / "mutants"
COPIED_DIRS = ("tests", "docs")  # besides the top-level files: what the test files read


@dataclass
class Mutant:
    script: str  # the script's stem, e.g. "a2c"
    test_file: str
    name: str
    old: str
    new: str
    selector: str | None = None
    status: str = ""  # killed, SURVIVED, does not apply, broken, error, baseline failed
    detail: str = ""  # what killed it, or why it could not run
    reason: str = ""  # the first error line of the failing test
    seconds: float = 0.0


def load_mutants(scripts: list[str] | None) -> list[Mutant]:
    """The mutants of mutation/mutants/<script>.py for the given scripts (all lists if None)."""
    files = {path.stem: path for path in sorted(MUTANTS_DIR.glob("*.py")) if not path.stem.startswith("_")}
    unknown = sorted(set(scripts or ()) - set(files))
    if unknown:
        sys.exit(f"error: no mutant list mutation/mutants/<script>.py for {unknown}; there are {sorted(files)}")
    mutants = []
    for stem in scripts or files:
        spec = importlib.util.spec_from_file_location(f"mutants_{stem}", files[stem])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        names = [entry[0] for entry in module.MUTANTS]
        if len(set(names)) != len(names):
            sys.exit(f"error: mutation/mutants/{stem}.py names a mutant twice")
        for entry in module.MUTANTS:
            if len(entry) not in (3, 4, 5):
                sys.exit(f"error: mutation/mutants/{stem}.py: {entry[0]!r} is not (name, old, new[, selector[, "
                         "test file]])")
            test_file = entry[4] if len(entry) == 5 else module.TEST_FILE  # a test of several scripts' own file
            mutants.append(Mutant(stem, test_file, *entry[:4]))
    return mutants


def mutated_source(mutant: Mutant) -> str | None:
    """The script with the mutant applied, or None (with the status set) if it does not apply or is broken."""
    source = (ROOT / f"{mutant.script}.py").read_text()
    count = source.count(mutant.old)
    if count != 1:
        mutant.status = "does not apply"
        mutant.detail = f"old text found {count} times in {mutant.script}.py (must be once)"
        return None
    mutated = source.replace(mutant.old, mutant.new)
    try:
        compile(mutated, f"{mutant.script}.py", "exec")
    except SyntaxError as e:
        mutant.status, mutant.detail = "broken", f"the mutated script does not compile: {e}"
        return None
    return mutated


def copy_repository(dest: Path) -> None:
    for entry in ROOT.iterdir():
        if entry.is_file():
            shutil.copy2(entry, dest / entry.name)
        elif entry.name in COPIED_DIRS:
            shutil.copytree(entry, dest / entry.name, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))


def run_tests(test_file: str, selector: str | None, script: str | None = None, source: str | None = None,
              timeout: float = 1800) -> tuple[int | None, str, float]:
    """Run the test file in a fresh copy of the repository (with `script` replaced by `source`, if given).
    Returns pytest's exit status (None on timeout), its output and the seconds it took."""
    with tempfile.TemporaryDirectory(prefix="mutation_check_") as tmp:
        tmp = Path(tmp)
        copy_repository(tmp)
        if script is not None:
            (tmp / f"{script}.py").write_text(source)
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                   "--basetemp", str(tmp / ".pytest_tmp"), test_file]
        if selector:
            command += ["-k", selector]
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        start = time.time()
        try:
            done = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            output = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            return None, output, time.time() - start
        return done.returncode, done.stdout + done.stderr, time.time() - start


def first_failure(output: str) -> tuple[str, str]:
    """The first failing or erroring test in pytest's short summary (pytest.ini asks for -ra), and the first
    error line of the report ("E   assert ...")."""
    test = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    reason = [line.strip() for line in re.findall(r"^E +(.*)$", output, re.MULTILINE) if line.strip()]
    return (test.group(1).split("::", 1)[-1] if test else "(see the pytest output)", " / ".join(reason[:3])[:200])


def check(mutant: Mutant, timeout: float) -> Mutant:
    source = mutated_source(mutant)
    if source is None:
        return mutant
    returncode, output, mutant.seconds = run_tests(mutant.test_file, mutant.selector, mutant.script, source, timeout)
    if returncode is None:
        mutant.status, mutant.detail = "killed", f"the tests hung past {timeout:.0f} s"
    elif returncode == 0:
        mutant.status = "SURVIVED"
    elif returncode in (1, 2):  # tests failed; or collection failed (the mutated script does not import)
        mutant.status = "killed"
        mutant.detail, mutant.reason = first_failure(output)
    else:  # 5: no test selected; 3, 4: pytest itself failed
        mutant.status = "error"
        mutant.detail = f"pytest exit status {returncode}: " + " | ".join(output.strip().splitlines()[-3:])
    return mutant


def baseline_selector(mutants: list[Mutant]) -> str | None:
    """The union of the mutants' selectors, or None (the whole file) if any mutant has none."""
    selectors = [m.selector for m in mutants]
    if any(s is None for s in selectors):
        return None
    return " or ".join(f"({s})" for s in dict.fromkeys(selectors))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scripts", nargs="+", help="script stems, e.g. a2c ppo_cartpole (default: all lists)")
    parser.add_argument("--mutants", help="only the mutants whose name contains this text")
    parser.add_argument("--jobs", type=int, default=1, help="mutants checked at the same time")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before a test run counts as hung")
    parser.add_argument("--list", action="store_true", help="only check that every mutant applies, run nothing")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of each test file unmutated")
    args = parser.parse_args()
    if args.jobs < 1:
        sys.exit(f"error: --jobs must be positive, got {args.jobs}")

    mutants = load_mutants(args.scripts)
    if args.mutants:
        mutants = [m for m in mutants if args.mutants in m.name]
    if not mutants:
        sys.exit("error: no mutant selected")

    if args.list:
        for m in mutants:
            if mutated_source(m) is not None:
                m.status = "applies"
    else:
        scripts = list(dict.fromkeys(m.script for m in mutants))
        if not args.no_baseline:
            print(f"baseline: the unchanged scripts must pass their tests ({len(scripts)} test files)", flush=True)
            with ThreadPoolExecutor(args.jobs) as pool:
                groups = {s: [m for m in mutants if m.script == s] for s in scripts}
                runs = {s: pool.submit(run_tests, g[0].test_file, baseline_selector(g), timeout=args.timeout)
                        for s, g in groups.items()}
                for script, run in runs.items():
                    returncode, output, seconds = run.result()
                    print(f"  {groups[script][0].test_file}: exit status {returncode} ({seconds:.0f} s)", flush=True)
                    if returncode != 0:
                        print(output[-3000:])
                        for m in groups[script]:
                            m.status, m.detail = "baseline failed", "the test file fails without any mutant"
        todo = [m for m in mutants if not m.status]
        print(f"checking {len(todo)} mutants, {args.jobs} at a time", flush=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            for i, m in enumerate(pool.map(lambda m: check(m, args.timeout), todo), 1):
                print(f"  [{i}/{len(todo)}] {m.script}: {m.name}: {m.status} ({m.seconds:.0f} s) {m.detail}",
                      flush=True)
                if m.reason:
                    print(f"      {m.reason}", flush=True)

    width = max(len(m.name) for m in mutants)
    print()
    print(f"{'script':<14} {'mutant':<{width}}  {'result':<15} killed by / why")
    for m in mutants:
        print(f"{m.script:<14} {m.name:<{width}}  {m.status:<15} {m.detail}")
    counts = {s: sum(m.status == s for m in mutants) for s in dict.fromkeys(m.status for m in mutants)}
    print()
    print(f"{len(mutants)} mutants: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    bad = [m for m in mutants if m.status not in ("killed", "applies")]
    survivors = [m for m in mutants if m.status == "SURVIVED"]
    print("survivors: " + (", ".join(f"{m.script}: {m.name}" for m in survivors) if survivors else "none"))
    for m in bad:
        if m.status != "SURVIVED":
            print(f"{m.status}: {m.script}: {m.name}: {m.detail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
