"""The tutorial notebooks: committed without outputs, in sync with scripts/make_notebooks.py, and each one runs
top to bottom (nbclient, the venv's python3 kernel) in a temp dir with a per-cell timeout."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPECTED = ["01_tasks_and_references", "02_attention_and_rollout", "03_reinforcement", "04_your_own_model"]
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
            assert cell.outputs == [], f"{path.name}: a code cell has outputs; regenerate with scripts/make_notebooks.py"
            assert cell.execution_count is None, f"{path.name}: a code cell has an execution count"
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_committed_notebooks_match_the_generator():
    gen = _generator()
    assert sorted(gen.BUILDERS) == [p.name for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        assert path.read_text(encoding="utf-8") == gen.render(path.name), (
            f"{path.name} differs from scripts/make_notebooks.py; run it to regenerate"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    # jupyter_client runs the "python3" kernelspec's `python` as sys.executable: the venv's interpreter.
    # Its bin dir goes first on PATH as well, so shell-outs from a notebook find the venv's `aspan`.
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    shown = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type in ("display_data", "execute_result")]
    assert shown, f"{path.name} displayed nothing"
