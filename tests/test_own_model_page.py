"""The own-model page (docs/howto/own-model.md) runs on the TransformerLens installed, as a reader would run it: its
```python blocks in a subprocess (`python -P`), its ```bash blocks with the venv's bin first on PATH, in page order,
in one temp dir (later blocks read what earlier ones wrote). A block that opens with `# TransformerLens 3.9 only`
(HookedTransformer) runs where TransformerLens has HookedTransformer; every other block runs on both, so CI runs
this file on TransformerLens 3.9 (every block) and on 4.3 (the bridge blocks). PYTHONPATH is passed on as it is:
it is how CI puts TransformerLens 4.3 in front of the installed packages.

What the page prints is checked too: `check_model`'s line for a model that fits, its one-line refusals for the
vocabulary and the context, the class each block builds and the backend `aspan doctor` reports."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aspan.models import has_hooked
from tests.docs import ON_EITHER_STACK, TRANSFORMER_LENS_3, fenced, text

PAGE = "docs/howto/own-model.md"
ALL = [(lang, code, line) for lang, code, line in fenced(text(PAGE)) if lang in ("python", "bash")]
HOOKED = has_hooked()
BLOCKS = [b for b in ALL if HOOKED or not b[1].startswith(TRANSFORMER_LENS_3)]
TIMEOUT = 600
OUTPUTS: dict[int, str] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("own-model")


def test_this_file_runs_the_page():
    assert ON_EITHER_STACK[PAGE] == f"tests/{Path(__file__).name}"
    marked = [b for b in ALL if b[1].startswith(TRANSFORMER_LENS_3)]
    assert len(marked) == 1 and len(ALL) >= 5  # one HookedTransformer block; the rest runs on either
    assert [b for b in ALL if b not in BLOCKS] == ([] if HOOKED else marked)


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"L{line}-{lang}" for lang, _, line in BLOCKS])
def test_block_runs(index, workdir):
    lang, code, line = BLOCKS[index]
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
           "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    args = [sys.executable, "-P", "-c", code] if lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
    proc = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{PAGE} {lang} block at line {line} failed (exit {proc.returncode}):\n{out[-4000:]}"
    assert "Traceback" not in out and "Warning" not in proc.stderr, out[-4000:]
    OUTPUTS[line] = proc.stdout


def test_the_page_prints_what_it_says():
    """Run after the blocks (same module, in order): each printed what the page says it prints."""
    if len(OUTPUTS) != len(BLOCKS):
        pytest.fail("a block did not run (see the failures above)")
    printed = "\n".join(OUTPUTS.values())
    assert re.search(rf"^backend: {'hooked' if HOOKED else 'bridge'}$", printed, re.M)
    fits = re.findall(r"^.*(HookedTransformer|TransformerBridge) 2 layers x 4 heads: d_vocab 70 covers the "
                      r"tokenizer's ids \(up to 65\); n_ctx (\d+) >= the 23 tokens of the longest reversal sample",
                      printed, re.M)
    assert [kind for kind, _ in fits] == (["HookedTransformer"] if HOOKED else []) + ["TransformerBridge"] * 2 + \
        ["HookedTransformer" if HOOKED else "TransformerBridge"]  # the last: `aspan doctor --model`, the default
    assert ("vocabulary too small: d_vocab=50 but the tokenizer gives ids up to 65" in printed) == HOOKED
    assert "context too short: n_ctx=16 but the longest reversal sample needs 23 tokens" in printed
    assert re.search(r"^ID exact (0\.\d+|1\.0)$", printed, re.M) and re.search(r"^\s*0\s+top:2\s", printed, re.M)
