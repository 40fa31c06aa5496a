"""Every fenced code block of README.md and of the documentation pages (`tests/docs.py`: the pages, in order) runs:
```python blocks in a subprocess, ```bash blocks as `bash -e` scripts with the venv's bin first on PATH; all in one
temp dir, in document order (later blocks reuse earlier outputs). ```bibtex blocks (the citing section) are checked
for whole, distinct entries; MyST directives (```{include}) are not code and are skipped.

The own-model page's blocks are run by tests/test_own_model_page.py instead (`tests.docs.ON_EITHER_STACK`), on
whichever TransformerLens is installed.

Three commands are not run as written: `pip install` (the README's install block, checked to name the checkout
and the wheel of this version) would change the environment; `make test` is what runs this suite (running it here
would recurse), and `make demo` would rebuild the venv and run the full-size demo (minutes). `make demo` is checked
instead by `make -n demo` from the repo root (the target exists and calls `aspan demo`), and the getting-started page's
`aspan demo --quick` command (asserted present) exercises the same code path at small sizes.

The commands name the shipped model `reversal` (a checkpoint inside the package), so they run from any directory,
here a fresh temp dir. Python blocks run with `python -P` (no cwd on sys.path).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs import DOCS, ON_EITHER_STACK, PAGES, ROOT, STUDY_PAGES, blocks, fenced, text

MAKE = re.compile(r"^\s*make\s+(\w+)\s*(#.*)?$")
PIP = re.compile(r"^\s*pip install (\S+)\s*(#.*)?$")
BLOCK_TIMEOUT = 300
RUNNABLE = {"bash", "python", "bibtex"}
BLOCKS = [b for b in blocks() if b[1] in RUNNABLE and b[0] not in ON_EITHER_STACK]  # those: their own test


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
    langs = [lang for _, lang, _, _ in blocks(("README.md",))]
    assert set(langs) <= RUNNABLE, f"README blocks must be bash, python or bibtex, got {langs}"
    first = fenced(text("README.md"))[0][1].splitlines()
    assert [MAKE.match(line)[1] for line in first] == ["demo", "test"], (
        "the README must open with make demo / make test"
    )
    assert "docs/_static/overview.png" in text("README.md") and (DOCS / "_static" / "overview.png").is_file()
    commands = "\n".join(code for _, lang, code, _ in BLOCKS if lang == "bash")
    for name in ("data", "show", "train", "eval", "rank", "sweep", "abc", "report", "demo"):
        assert re.search(rf"^aspan {name}\b", commands, re.M), f"no example of `aspan {name}` in the documentation"
    assert re.search(r"^aspan demo --quick\b", commands, re.M), (
        "the documentation must run `aspan demo --quick` (see the module doc)"
    )
    assert text("docs/benchmarks.md").startswith("# Benchmarks\n") and "<!-- benchmarks -->" in text(
        "docs/benchmarks.md")
    assert "## How to add a task" in text("docs/extending.md")
    assert sum(lang == "python" for _, lang, _, _ in BLOCKS) >= 2


def test_every_page_with_code_is_run():
    """A page of docs/ with a bash or python block is one of the pages whose blocks run (no block goes untested),
    and the pages hold no other kind of block than runnable ones and MyST directives."""
    for path in sorted(DOCS.rglob("*.md")):
        page = str(path.relative_to(ROOT))
        langs = [lang for lang, _, _ in fenced(path.read_text(encoding="utf-8"))]
        if page in PAGES or page in STUDY_PAGES:
            assert all(lang in RUNNABLE or lang.startswith("{") for lang in langs), (page, langs)
        if any(lang in {"bash", "python"} for lang in langs):
            assert page in PAGES, f"{page} has code blocks but is not in tests/docs.py PAGES"


def test_every_results_readme_has_its_page():
    """Each study's results README is shown on its own page of docs/studies/, included from where it lies, first;
    a README of one of the study's runs (results/<study>/<run>/README.md) may follow it on the same page, and every
    such README is shown."""
    shown = set()
    for page in STUDY_PAGES:
        study = Path(page).stem
        assert (ROOT / page).is_file(), f"{page} is missing for results/{study}/README.md"
        includes = re.findall(r"^```\{include\}\s+(\S+)", text(page), re.M)
        assert includes[:1] == [f"../../results/{study}/README.md"], page
        assert all(re.fullmatch(rf"\.\./\.\./results/{study}/[\w-]+/README\.md", i) for i in includes[1:]), page
        shown |= {(ROOT / "docs" / "studies" / i).resolve() for i in includes}
    assert {p.resolve() for p in (ROOT / "results").glob("*/*/README.md")} <= shown


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"{page}:L{line}-{lang}" for page, lang, _, line in BLOCKS])
def test_readme_block_runs(index, workdir):
    page, lang, code, line = BLOCKS[index]
    if lang == "bibtex":  # the citing section: whole entries, braces balanced, each key once
        entries = re.findall(r"^@(\w+)\{([\w:-]+),$", code, re.M)
        assert entries and code.count("{") == code.count("}") and code.count("\n@") == len(entries) - 1, code
        assert len({key for _, key in entries}) == len(entries)
        assert all(re.search(r"^\s+(title|author|year)\s*=", entry, re.M) for entry in code.split("\n@"))
        return
    if lang == "python":
        _run([sys.executable, "-P", "-c", code], workdir, f"{page} python block at line {line}")
        return
    lines = [l for l in code.splitlines() if l.strip() and not l.strip().startswith("#")]
    makes = [MAKE.match(l) for l in lines]
    if all(makes):  # the set-up block: see the module docstring
        for m in makes:
            if m[1] == "demo":
                out = _run(["make", "-n", "demo"], ROOT, "make -n demo")
                assert re.search(r"(^|/)aspan demo\b", out, re.M), f"`make demo` does not call `aspan demo`:\n{out}"
            else:
                assert m[1] == "test", f"unexpected make target {m[1]!r} in {page}"
        return
    assert not any(makes), f"{page} bash block at line {line} mixes make with other commands"
    pips = [PIP.match(l) for l in lines]
    if all(pips):  # the install block: from the checkout, or the wheel of this version (not run: it would install)
        from aspan import __version__

        assert [m[1] for m in pips] == [".", f"aspan-{__version__}-py3-none-any.whl"], (page, line, code)
        return
    assert not any(pips), f"{page} bash block at line {line} mixes pip install with other commands"
    _run(["bash", "-euo", "pipefail", "-c", code], workdir, f"{page} bash block at line {line}")


def test_task_table_examples_match_the_solvers():
    """Every row of the task table (docs/tasks.md): `prompt` → `target` is what that task's solver computes."""
    from aspan import tasks

    rows = re.findall(r"^\| `(\w+)` \| `([^`]+)` → `([^`]+)`", text("docs/tasks.md"), re.M)
    assert sorted(name for name, _, _ in rows) == sorted(tasks.NAMES)
    for name, prompt, target in rows:
        assert tasks.get(name).solve_like(prompt, target) == target, f"docs/tasks.md example of {name} is wrong"


def test_parity_format_examples_match_the_solver():
    """The parity formats (docs/tasks.md): each `prompt` → `target` example is what that format's solver computes."""
    from aspan.tasks.parity import FORMATS, Parity

    rows = re.findall(r"^`([\w-]+)`[^`\n]*`([^`]+)` → `([^`]+)`", text("docs/tasks.md"), re.M)
    rows = [r for r in rows if r[0] in FORMATS]
    assert sorted(name for name, _, _ in rows) == sorted(FORMATS)
    for fmt, prompt, target in rows:
        assert Parity(format=fmt).solve(prompt) == target, f"docs/tasks.md example of parity format {fmt} is wrong"
