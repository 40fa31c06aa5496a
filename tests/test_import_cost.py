"""Imports that say what they cost: `import aspan`, `aspan --help` and the studies' `--help` load none of the heavy
libraries (torch, TransformerLens, transformers, pandas, plotly); each is checked in a fresh interpreter, which reports
what its `sys.modules` holds once the command is done."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformer_lens", "transformers", "pandas", "plotly")
PROBE = """
import contextlib, io, json, sys
{code}
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)), file=sys.__stderr__)
"""
HELP = """
from aspan.cli import main
with contextlib.redirect_stdout(io.StringIO()) as shown, contextlib.suppress(SystemExit):
    main({argv!r})
assert "usage: aspan" in shown.getvalue(), shown.getvalue()[-2000:]
"""


def loaded(code: str) -> list[str]:
    """The heavy libraries in `sys.modules` after a fresh interpreter runs `code` (in the repository root)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-c", PROBE.format(code=code, heavy=HEAVY)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stderr.strip().splitlines()[-1])


def test_import_aspan_loads_no_heavy_library():
    assert loaded("import aspan") == []


@pytest.mark.parametrize("argv", [["--help"], ["study", "--help"], ["study", "qk", "--help"],
                                  ["study", "parity", "--help"], ["study", "abc", "--help"]])
def test_help_loads_no_heavy_library(argv):
    assert loaded(HELP.format(argv=argv)) == []


def test_the_probe_sees_a_heavy_import():
    """The check can fail: a command that imports pandas is reported as loading it."""
    assert loaded("import aspan\nimport pandas") == ["pandas"]


def test_python_m_aspan_cli_help_loads_no_heavy_library():
    """`python -m aspan.cli --help`, as the console script's module runs it."""
    code = ("import runpy\nsys.argv = ['aspan', '--help']\n"
            "with contextlib.redirect_stdout(io.StringIO()) as shown, contextlib.suppress(SystemExit):\n"
            "    runpy.run_module('aspan.cli', run_name='__main__', alter_sys=True)\n"
            "assert 'usage: aspan' in shown.getvalue()")
    assert loaded(code) == []
