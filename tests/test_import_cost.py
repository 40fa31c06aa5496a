"""Imports that say what they cost: `import aspan`, `aspan --help` and the studies' `--help` load none of the heavy
libraries (torch, TransformerLens, transformers, pandas, plotly); each is checked in a fresh interpreter, which reports
what its `sys.modules` holds once the command is done."""
from __future__ import annotations

import ast
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


# ------------------------------------------------------------------------------------------------ deferred imports
# Packages whose modules import at module top every project module that loads only the standard library (a deferred
# import is kept for what is heavy: torch, TransformerLens, transformers, pandas, plotly and what imports them).
IMPORTED_AT_TOP = ("aspan.applications.studies", "aspan.findings", "aspan.commands.study", "aspan.commands.studies",
                   "aspan.checks", "aspan.intervals")


def _split_imports(module: str, files: dict[str, Path]) -> tuple[set[str], list[tuple[int, str]]]:
    """(what `module` imports at module top, outside `if TYPE_CHECKING:`; (line, module) of each import inside a
    function), relative imports resolved as `tests/test_layering.py` does."""
    path = files[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top: set[str] = set()
    deferred: list[tuple[int, str]] = []

    def names(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = ".".join(package.split(".")[: len(package.split(".")) + 1 - node.level] if node.level else [])
        base = ".".join(filter(None, (base, node.module)))
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]

    def walk(node: ast.AST, in_function: bool, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if in_function:
                    deferred.extend((child.lineno, n) for n in names(child))
                elif not typing_only:
                    top.update(names(child))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)),
                 typing_only or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)))

    walk(ast.parse(path.read_text(encoding="utf-8")), False, False)
    return top, deferred


def light_deferred_imports(root: Path, packages: tuple[str, ...]) -> list[str]:
    """"module:line imports X" for each import inside a function, in a module under `packages`, of a project module
    whose import (its module-top imports, followed through the project) loads only the standard library."""
    from .test_layering import _under, source_files

    files = source_files(root)
    split = {m: _split_imports(m, files) for m in files}
    ours = {name.split(".")[0] for name in files}

    def own(name: str) -> str | None:  # the project module `name` is, or is an attribute of
        return name if name in files else name.rpartition(".")[0] if name.rpartition(".")[0] in files else None

    def light(module: str, seen: set[str]) -> bool:
        seen.add(module)
        parents = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        for dep in split[module][0] | (parents & files.keys()):
            if dep.split(".")[0] in ours:
                if own(dep) and own(dep) not in seen and not light(own(dep), seen):
                    return False
            elif dep.split(".")[0] not in sys.stdlib_module_names and dep != "__future__":
                return False
        return True

    return sorted(f"{m}:{line} imports {dep}" for m in files if _under(m, *packages)
                  for line, dep in split[m][1] if own(dep) and light(own(dep), set()))


def test_light_project_modules_are_imported_at_module_top():
    assert light_deferred_imports(ROOT, IMPORTED_AT_TOP) == []


def test_a_deferred_light_import_is_reported(tmp_path):
    """The check can fail: a function importing a module that loads only the standard library is reported, one that
    imports a module loading a third-party library is not."""
    for rel, text in {"aspan/__init__.py": "", "aspan/light.py": "import json\n", "aspan/heavy.py": "import pandas\n",
                      "aspan/uses.py": "def f():\n    from . import light\n    from .heavy import x\n",
                      "hooks/__init__.py": ""}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    assert light_deferred_imports(tmp_path, ("aspan.uses",)) == ["aspan.uses:2 imports aspan.light"]
