"""Library modules report through `logging` and return their results; only the command-line layer (`aspan.cli`,
`aspan.commands`) prints. Checked on the syntax tree of every module under aspan/, so a docstring's example does not
count, and a `print(` a library module gains makes this test fail."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aspan"
CLI_LAYER = (PACKAGE / "cli.py", PACKAGE / "commands")


def in_cli_layer(path: Path) -> bool:
    return any(path == p or p in path.parents for p in CLI_LAYER)


def print_calls(source: str) -> list[int]:
    """The line of every call of the builtin `print` (a name `print` called, not a method such as `obj.print`)."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"]


def library_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if not in_cli_layer(p))


def test_the_walk_sees_the_library_and_leaves_the_cli_layer_out():
    names = {p.relative_to(PACKAGE).as_posix() for p in library_modules()}
    assert {"training/loop.py", "applications/eval.py", "experiments/sweep.py"} <= names
    assert not any(n.startswith("commands/") or n == "cli.py" for n in names)
    assert print_calls((PACKAGE / "cli.py").read_text())  # the CLI layer does print: the check can see it


@pytest.mark.parametrize("source,lines", [("print('x')\n", [1]), ("def f():\n    print(1, file=None)\n", [2]),
                                          ('"""print(x)"""\nlog.print(1)\n', [])])
def test_print_calls_are_found_and_only_they(source, lines):
    assert print_calls(source) == lines


def test_no_library_module_prints():
    found = [f"{p.relative_to(PACKAGE.parent)}:{line}" for p in library_modules()
             for line in print_calls(p.read_text(encoding="utf-8"))]
    assert found == [], "print( in library modules (report through logging, or return the result): " + ", ".join(found)


def module_loggers(source: str) -> list[str]:
    """The value of every module-level `logger = ...`, as source text."""
    return [ast.unparse(node.value) for node in ast.parse(source).body if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "logger" for t in node.targets)]


def test_each_module_logs_under_aspan_through_its_own_logger():
    """A module that logs has one `logger = logging.getLogger(__name__)`: every message is under the `aspan` logger
    that the command line configures (and a host application can)."""
    found = {p.relative_to(PACKAGE).as_posix(): module_loggers(p.read_text(encoding="utf-8"))
             for p in library_modules()}
    assert all(v == ["logging.getLogger(__name__)"] for v in found.values() if v), found
    logs = {k for k, v in found.items() if v}
    assert {"training/loop.py", "training/run.py", "applications/eval.py", "applications/rank.py",
            "applications/sweep.py", "applications/abc.py", "applications/campaign.py"} <= logs
