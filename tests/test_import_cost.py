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


@pytest.mark.parametrize("argv", [["--help"], ["explain", "--help"], ["study", "--help"], ["study", "qk", "--help"],
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
# Project modules are imported at module top; an import inside a function is kept only for a module whose import
# loads one of HEAVY (itself or through what it imports), which the command line's start-up must not pay for.
SCANNED = ("aspan",)
COST = """
import importlib, json, sys
class Heavy(BaseException):  # outside Exception: a module's `except ImportError` / `except Exception` lets it through
    pass
class Refuse:  # first on the path: a heavy library is asked for, never loaded, so one interpreter tries every module
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in {heavy!r}:
            raise Heavy(name)
sys.meta_path.insert(0, Refuse)
asks = {{}}
for name in {modules!r}:
    try:
        importlib.import_module(name)
        asks[name] = None
    except Heavy as e:  # the module and what imported it are dropped from sys.modules; what loaded stays (light)
        asks[name] = str(e)
assert not [m for m in {heavy!r} if m in sys.modules]
print(json.dumps(asks), file=sys.__stderr__)
"""


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


def heavy_imports(root: Path, modules: list[str]) -> dict[str, str | None]:
    """{module: the heavy library its import asks for (e.g. "torch.nn"), or None}, for each of `modules`, all found in
    one fresh interpreter whose import path starts at `root` (a heavy import is refused, so nothing heavy loads)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-c", COST.format(heavy=HEAVY, modules=modules)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stderr.strip().splitlines()[-1])


def light_deferred_imports(root: Path, packages: tuple[str, ...] = SCANNED) -> list[str]:
    """"path:line imports X" for each import inside a function, in a module under `packages`, of a project module X
    whose import loads none of HEAVY (so it belongs at module top)."""
    from .test_layering import _under, source_files

    files = source_files(root)

    def own(name: str) -> str | None:  # the project module `name` is, or is an attribute of
        return name if name in files else name.rpartition(".")[0] if name.rpartition(".")[0] in files else None

    deferred = [(files[m].relative_to(root).as_posix(), line, own(dep)) for m in files if _under(m, *packages)
                for line, dep in _split_imports(m, files)[1] if own(dep)]
    asks = heavy_imports(root, sorted({dep for *_, dep in deferred}))
    return list(dict.fromkeys(f"{path}:{line} imports {dep}" for path, line, dep in sorted(deferred)
                              if asks[dep] is None))


def test_light_project_modules_are_imported_at_module_top():
    found = light_deferred_imports(ROOT)
    assert not found, f"{len(found)} imports of light project modules inside functions (move them to the module " \
                      f"top): " + "; ".join(found)


def test_a_deferred_light_import_is_reported(tmp_path):
    """The check can fail: a function importing a module that loads no heavy library is reported with its file and
    line; one importing a module that loads pandas (itself, through another project module, or behind an
    `except ImportError`) is not."""
    for rel, text in {
        "aspan/__init__.py": "", "aspan/light.py": "import json\n", "aspan/heavy.py": "import pandas\n",
        "aspan/through.py": "from .heavy import x\n",
        "aspan/guarded.py": "try:\n    import pandas\nexcept ImportError:\n    pandas = None\n",
        "aspan/uses.py": "import json\n\n\ndef f():\n    from . import light\n    from .heavy import x\n"
                         "    from . import through, guarded\n    from .light import a, b\n",
        "hooks/__init__.py": "",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    assert light_deferred_imports(tmp_path) == ["aspan/uses.py:5 imports aspan.light",
                                                "aspan/uses.py:8 imports aspan.light"]  # once per line
    assert heavy_imports(tmp_path, ["aspan.guarded", "aspan.through", "aspan.light"]) == {
        "aspan.guarded": "pandas", "aspan.through": "pandas", "aspan.light": None}
