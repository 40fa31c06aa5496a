"""Rooms of one job each, read from the source with `ast`: no module under `aspan/` or `hooks/` is longer than
600 lines, and no function takes more than 6 parameters (`self` and `cls` left out; `*args` counts, `**kwargs`
does not, keyword-only parameters do). A function with more settings takes its settings object instead.
Dataclass constructors are generated, so they are not in the source the walk reads.

The checks are functions of a source text, so `test_*_fails_on_*` run them on a small module written here."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("aspan", "hooks")
MAX_LINES = 600
MAX_PARAMETERS = 6


def modules(root: Path = ROOT) -> list[Path]:
    """Every Python file of the packages."""
    return [p for package in PACKAGES for p in sorted((root / package).rglob("*.py"))]


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The parameters that count: positional-only, positional, keyword-only and `*args` (not `**kwargs`), without
    a method's leading `self` or `cls`."""
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)] + ([a.vararg.arg] if a.vararg else [])
    return names[1:] if names and names[0] in ("self", "cls") else names


def long_functions(source: str, where: str) -> list[str]:
    """`where:line name (n parameters)` for each function of `source` with more than MAX_PARAMETERS parameters."""
    return [f"{where}:{node.lineno} {node.name} ({len(parameters(node))} parameters)"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(parameters(node)) > MAX_PARAMETERS]


def too_long(source: str) -> bool:
    """Whether `source` has more than MAX_LINES lines."""
    return len(source.splitlines()) > MAX_LINES


def test_the_walk_sees_the_packages():
    files = modules()
    assert len(files) > 50 and any(p.parts[-2:] == ("aspan", "evaluation.py") for p in files)
    assert any(p.parts[-2] == "hooks" for p in files)


def test_no_module_is_over_600_lines():
    long = [f"{p.relative_to(ROOT)} ({len(p.read_text(encoding='utf-8').splitlines())} lines)"
            for p in modules() if too_long(p.read_text(encoding="utf-8"))]
    assert not long, "modules over 600 lines: " + "; ".join(long)


def test_no_function_takes_more_than_6_parameters():
    found = [f for p in modules() for f in long_functions(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert not found, "functions over 6 parameters (take a settings object instead): " + "; ".join(found)


def test_the_parameter_count_fails_on_a_seventh_parameter():
    six = "def f(a, b, c=1, *args, d, **kw):\n    pass\n"
    assert long_functions(six, "m.py") == []
    assert long_functions("class C:\n    def m(self, a, b, c, d, e, f):\n        pass\n", "m.py") == []
    seven = "def f(a, b, /, c, *args, d, e, g, **kw):\n    pass\n"
    assert long_functions(seven, "m.py") == ["m.py:1 f (7 parameters)"]
    nested = "def outer():\n    async def inner(a, b, c, d, e, f, g):\n        pass\n"
    assert long_functions(nested, "m.py") == ["m.py:2 inner (7 parameters)"]


def test_the_line_count_fails_on_line_601():
    assert not too_long("x = 1\n" * MAX_LINES)
    assert too_long("x = 1\n" * (MAX_LINES + 1))
