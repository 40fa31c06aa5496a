"""Every example the `--help` texts end with runs, in order, in one directory, as a chain (each reads what an earlier
one wrote: `aspan eval runs/tiny` the model `aspan train` made, `aspan report runs/rank` the ranking), at the small
sizes scripts/help_examples.py gives where an example allows; those that need a GPU, a cluster or SmolLM2 parse. The
same plan runs from the installed wheel, outside the source tree, in scripts/check_wheel.sh."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from aspan import cli

from .cli import ENV, ROOT, aspan

spec = importlib.util.spec_from_file_location("help_examples", ROOT / "scripts" / "help_examples.py")
examples_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(examples_script)


def run(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """`aspan ARGV` as tests/cli.py runs it (forked from a warm interpreter unless the example sets a variable)."""
    own = {k: v for k, v in env.items() if k not in examples_script.ENV}  # the test environment has its own limits
    done = aspan(*argv, cwd=cwd, env={**ENV, **own})
    return done.returncode, done.stdout + done.stderr


def parse(argv: list[str]) -> None:
    try:
        cli.build_parser(argv).parse_args(argv)
    except SystemExit as e:
        raise ValueError(f"aspan {' '.join(argv)} does not parse") from e


def test_every_help_example_runs_in_order(tmp_path):
    log: list[str] = []
    failed = examples_script.run_all(run, parse, tmp_path, log=log.append)
    assert failed == 0, "\n".join(log)
    ran = [line for line in log if line.startswith("ran ")]
    parsed = [line for line in log if line.startswith("parsed ")]
    assert len(ran) >= 30 and len(parsed) == len(examples_script.PARSED)
    # what the chain handed on: the model `aspan train` made and resumed, the heads `aspan eval` scored on it
    state = json.loads((tmp_path / "runs" / "tiny" / "log.jsonl").read_text().splitlines()[-1])
    assert state["step"] == 80
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert records and any(r["attn_heads_sample"] is not None for r in records)  # heads 1.1 and 1.3 exist
    assert len((tmp_path / "addition_ood.jsonl").read_text().splitlines()) == 100
    assert (tmp_path / "rank.html").stat().st_size > 1000 and (tmp_path / "runs" / "demo" / "report.html").is_file()
    assert sorted(p.name for p in (tmp_path / "my-tutorials").glob("*.ipynb")) == \
        sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_the_examples_are_read_from_the_help_texts(tmp_path):
    shown = examples_script.examples(run, tmp_path)
    assert shown[0] == "aspan data --list" and "aspan study qk --quick --protocol curves --out runs/qk-curves" in shown
    assert len(shown) == len(set(shown)) > 35
    words = [e.split()[e.split().index("aspan") + 1] for e in shown]
    assert [w for i, w in enumerate(words) if w not in words[:i]] == list(cli.COMMANDS)  # in `aspan --help`'s order
    assert set(examples_script.SMALLER) | set(examples_script.PARSED) <= set(shown)


@pytest.mark.parametrize("argv,flags,want", [
    (["train", "--steps", "50", "--out", "o"], ["--steps", "4"], ["train", "--steps", "4", "--out", "o"]),
    (["demo", "--samples", "200"], ["--quick", "--samples", "24"], ["demo", "--samples", "24", "--quick"]),
    (["sweep", "--quiet"], ["--limit", "1"], ["sweep", "--quiet", "--limit", "1"]),
])
def test_smaller_replaces_or_adds_each_flag(argv, flags, want):
    assert examples_script.smaller(argv, flags) == want


def test_a_failing_example_is_reported_with_its_output(tmp_path):
    """The check can fail: an example that exits non-zero is counted and shown with what it printed."""
    def failing(argv, env, cwd):  # reads the helps; every example "runs", the two of `aspan show` fail
        return run(argv, env, cwd) if argv[-1] == "--help" else (3, "boom") if argv[0] == "show" else (0, "")

    log: list[str] = []
    assert examples_script.run_all(failing, parse, tmp_path, log=log.append) == 2  # the two `aspan show` examples
    assert sum(line.startswith("FAILED  aspan show") and "boom" in line for line in log) == 2
