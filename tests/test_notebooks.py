"""The tutorial notebooks: committed without outputs, in sync with scripts/make_notebooks.py, and each one runs
top to bottom (nbclient, the venv's python3 kernel) in a temp dir with a per-cell timeout."""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPECTED = ["01_tasks_and_references", "02_attention_and_rollout", "03_reinforcement", "04_your_own_model",
            "05_your_own_transformer"]
CELL_TIMEOUT = 180  # seconds per cell; a whole notebook should take well under 2 minutes on CPU


def _generator():
    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "scripts" / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_planned_notebook_is_committed():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_is_stripped(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], (
                f"{path.name}: a code cell has outputs; regenerate with scripts/make_notebooks.py"
            )
            assert cell.execution_count is None, f"{path.name}: a code cell has an execution count"
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_committed_notebooks_match_the_generator():
    gen = _generator()
    assert sorted(gen.BUILDERS) == [p.name for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        assert path.read_text(encoding="utf-8") == gen.render(path.name), (
            f"{path.name} differs from scripts/make_notebooks.py; run it to regenerate"
        )


# What each notebook must print (regexes over its text outputs): the key values of its story.
KEY_LINES = {
    "01_tasks_and_references": [
        *(rf"== {name} ==" for name in ("reversal", "addition", "multiplication", "flipflop", "assign", "successor")),
        r"tokens \(3, \d+\) ref_mask \(3, \d+, \d+\) offset 1",
        r"target 0 '.': query row \d+ \(token '.'\) -> key columns \[\d+\]",
    ],
    "02_attention_and_rollout": [
        r"loaded the shipped checkpoint reversal: 2 layers x 8 heads",
        r"partial accuracy: ID 1-10 (?P<id>[\d.]+), OOD 11-20 (?P<ood>[\d.]+)",
        r"top heads \[\(\d, \d\)",
    ],
    "03_reinforcement": [
        r"best: heads \[\(\d, \d\), \(\d, \d\)\], delta \d, C=[\d.]+",
        r"OOD partial accuracy: baseline (?P<baseline>[\d.]+), reinforced (?P<reinforced>[\d.]+)",
    ],
    "04_your_own_model": [
        r"HookedTransformer 2 layers x 4 heads; offset \d+",
        r"target 0 '.': query row \d+, reference columns \[\d+\] = text positions \[\d+\] \+ offset \d+",
    ],
    "05_your_own_transformer": [  # the class built is the one this TransformerLens has (see test_notebook_runs)
        r"d_vocab >= 70, n_ctx >= 23",
        r"(?P<kind>HookedTransformer|TransformerBridge) - \w+ 2 layers x 4 heads: d_vocab 70 covers the tokenizer",
        r"vocabulary of 50: check_model: model: vocabulary too small: d_vocab=50 but the tokenizer gives ids up to 65",
        r"context of 16: check_model: model: context too short: n_ctx=16 but the longest reversal sample needs 23",
        r"ID exact (?P<id>[\d.]+), OOD exact (?P<ood>[\d.]+)",
        r"sweep rows named in-memory:[0-9a-f]{16}",
        r"OOD partial (?P<partial>[\d.]+), reloaded (?P<reloaded>[\d.]+)",
    ],
}


def _text(nb) -> str:
    """Everything the executed notebook printed or displayed as text (stdout and text/plain results)."""
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.output_type == "stream" and o.name == "stdout":
                parts.append(o.text)  # a print may arrive in several chunks: join them as they are
            elif o.output_type in ("display_data", "execute_result"):
                parts.append("\n" + o.data.get("text/plain", "") + "\n")
    return "".join(parts)


def test_key_lines_cover_every_notebook():
    assert sorted(KEY_LINES) == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    # jupyter_client runs the "python3" kernelspec's `python` as sys.executable: the venv's interpreter.
    # Its bin dir goes first on PATH as well, so shell-outs from a notebook find the venv's `aspan`.
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError naming the failing cell
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code_cells] == list(range(1, len(code_cells) + 1))  # every cell ran, in order
    stderr = "".join(o.text for c in code_cells for o in c.outputs if o.output_type == "stream" and o.name == "stderr")
    assert "Warning" not in stderr and "Traceback" not in stderr, f"{path.name} wrote to stderr:\n{stderr[:2000]}"
    shown = [o for c in code_cells for o in c.outputs if o.output_type in ("display_data", "execute_result")]
    assert shown, f"{path.name} displayed nothing"
    text = _text(nb)
    found = {}
    for pattern in KEY_LINES[path.stem]:
        m = re.search(pattern, text)
        assert m, f"{path.name} did not print a line matching {pattern!r}"
        found.update({k: v if k == "kind" else float(v) for k, v in m.groupdict().items()})
    if path.stem == "02_attention_and_rollout":  # the shipped model: perfect ID, failing OOD
        assert found["id"] == 1.0 and found["ood"] < 0.6
    if path.stem == "03_reinforcement":  # the chosen reinforcement helps OOD
        assert found["reinforced"] > found["baseline"] + 0.1
    if path.stem == "05_your_own_transformer":  # its own class; learns ID, fails OOD; saved and reloaded the same
        from aspan.models import has_hooked

        assert found["kind"] == ("HookedTransformer" if has_hooked() else "TransformerBridge")
        assert found["id"] >= 0.5 and found["ood"] < 0.2
        assert abs(found["reloaded"] - found["partial"]) <= 0.02  # its Hugging Face checkpoint: the same predictions
