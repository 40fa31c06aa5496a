"""Every fenced code block of README.md runs: ```python blocks in a subprocess, ```bash blocks as `bash -e` scripts
with the venv's bin first on PATH; all in one temp dir, in document order (later blocks reuse earlier outputs).
```bibtex blocks (the citing section) are checked for whole, distinct entries.

Two commands are not run as written: `make test` is what runs this suite (running it here would recurse), and
`make demo` would rebuild the venv and run the full-size demo (minutes). `make demo` is checked instead by
`make -n demo` from the repo root (the target exists and calls `aspan demo`), and the README's own
`aspan demo --quick` command (asserted present) exercises the same code path at small sizes.

The README's commands name the shipped model `reversal` (a checkpoint inside the package), so they run from
any directory, here a fresh temp dir. Python blocks run with `python -P` (no cwd on sys.path).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.S | re.M)
MAKE = re.compile(r"^\s*make\s+(\w+)\s*(#.*)?$")
BLOCK_TIMEOUT = 300


def blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, code, line number) of every fenced block."""
    return [(m[1], m[2], text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


BLOCKS = blocks(README.read_text(encoding="utf-8"))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ""  # the installed (editable) package, not whatever the cwd holds
    env["OMP_NUM_THREADS"] = "1"
    env["TQDM_DISABLE"] = "1"
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    return env


def _run(args: list[str], cwd: Path, what: str) -> str:
    proc = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{what} failed (exit {proc.returncode}):\n{out[-4000:]}"
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("readme")


def test_readme_structure():
    text = README.read_text(encoding="utf-8")
    langs = [lang for lang, _, _ in BLOCKS]
    assert set(langs) <= {"bash", "python", "bibtex"}, f"README blocks must be bash, python or bibtex, got {langs}"
    first = BLOCKS[0][1].splitlines()
    assert [MAKE.match(line)[1] for line in first] == ["demo", "test"], (
        "the README must open with make demo / make test"
    )
    commands = "\n".join(code for lang, code, _ in BLOCKS if lang == "bash")
    for name in ("data", "show", "train", "eval", "rank", "sweep", "abc", "report", "demo"):
        assert re.search(rf"^aspan {name}\b", commands, re.M), f"no example of `aspan {name}` in the README"
    assert re.search(r"^aspan demo --quick\b", commands, re.M), (
        "the README must run `aspan demo --quick` (see the module doc)"
    )
    assert "## Benchmarks" in text and "<!-- benchmarks -->" in text
    assert "## How to add a task" in text
    assert sum(lang == "python" for lang in langs) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"L{line}-{lang}" for lang, _, line in BLOCKS])
def test_readme_block_runs(index, workdir):
    lang, code, line = BLOCKS[index]
    if lang == "bibtex":  # the citing section: whole entries, braces balanced, each key once
        entries = re.findall(r"^@(\w+)\{([\w:-]+),$", code, re.M)
        assert entries and code.count("{") == code.count("}") and code.count("\n@") == len(entries) - 1, code
        assert len({key for _, key in entries}) == len(entries)
        assert all(re.search(r"^\s+(title|author|year)\s*=", entry, re.M) for entry in code.split("\n@"))
        return
    if lang == "python":
        _run([sys.executable, "-P", "-c", code], workdir, f"README python block at line {line}")
        return
    lines = [l for l in code.splitlines() if l.strip() and not l.strip().startswith("#")]
    makes = [MAKE.match(l) for l in lines]
    if all(makes):  # the set-up block: see the module docstring
        for m in makes:
            if m[1] == "demo":
                out = _run(["make", "-n", "demo"], ROOT, "make -n demo")
                assert re.search(r"(^|/)aspan demo\b", out, re.M), f"`make demo` does not call `aspan demo`:\n{out}"
            else:
                assert m[1] == "test", f"unexpected make target {m[1]!r} in the README"
        return
    assert not any(makes), f"README bash block at line {line} mixes make with other commands"
    _run(["bash", "-euo", "pipefail", "-c", code], workdir, f"README bash block at line {line}")


def test_task_table_examples_match_the_solvers():
    """Every row of the README's task table: `prompt` → `target` is what that task's solver computes."""
    from aspan import tasks

    rows = re.findall(r"^\| `(\w+)` \| `([^`]+)` → `([^`]+)`", README.read_text(encoding="utf-8"), re.M)
    assert sorted(name for name, _, _ in rows) == sorted(tasks.NAMES)
    for name, prompt, target in rows:
        assert tasks.get(name).solve_like(prompt, target) == target, f"README example of {name} is wrong"


def test_parity_format_examples_match_the_solver():
    """The README's parity formats: each `prompt` → `target` example is what that format's solver computes."""
    from aspan.tasks.parity import FORMATS, Parity

    text = README.read_text(encoding="utf-8")
    rows = re.findall(r"^`([\w-]+)`[^`\n]*`([^`]+)` → `([^`]+)`", text, re.M)
    rows = [r for r in rows if r[0] in FORMATS]
    assert sorted(name for name, _, _ in rows) == sorted(FORMATS)
    for fmt, prompt, target in rows:
        assert Parity(format=fmt).solve(prompt) == target, f"README example of parity format {fmt} is wrong"
