"""The "How to add a task / a model form / a backend / a study / a method" lists of docs/extending.md keep naming
every file that changes: each listed file exists for every existing task, form, backend, study and edit method and
names it (files with `<name>` exist per instance), and no module of the package enumerates all of them without
being listed."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from aspan import options, tasks
from aspan.applications.studies import STUDIES
from aspan.methods import RULES, resolve
from aspan.models.hfform import FORMS

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
BULLET = re.compile(r"^- `([^`]+)`( \(only)?", re.M)
INSTANCES = {
    "task": tuple(tasks.NAMES),
    "model form": tuple(sorted({form.__name__.rsplit(".", 1)[1] for form in FORMS.values()})),
    "backend": options.BACKENDS,
    "study": STUDIES,
    "method": tuple(RULES),
}
# Modules that name every instance without offering them all: the demo's causal search tries a fixed set of edit
# variants (its committed results are those), which a new method does not join.
STUDIED = {"method": {"aspan/applications/causal.py"}}


def listed(kind: str) -> list[tuple[str, bool]]:
    """(path, required) of each bullet of the section "How to add a {kind}"."""
    start = GUIDE.index(f"## How to add a {kind}\n")
    section = GUIDE[start:GUIDE.find("\n## ", start + 1)]
    return [(m[1], not m[2]) for m in BULLET.finditer(section)]


def enumerates_all(path: Path, names: tuple[str, ...]) -> bool:
    """Whether a module names every instance, as a string or as an imported module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    named = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    named |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    return set(names) <= named


@pytest.mark.parametrize("kind", INSTANCES)
def test_every_listed_file_exists_and_names_each_instance(kind):
    files = listed(kind)
    assert files and len(INSTANCES[kind]) >= 2, kind
    for path, required in files:
        for name in INSTANCES[kind]:
            file = ROOT / path.replace("<name>", name)
            assert file.is_file(), (
                f"docs/extending.md, how to add a {kind}: {file.relative_to(ROOT)} does not exist for {name}")
            if required and "<name>" not in path:
                assert name in file.read_text(encoding="utf-8"), f"{path} does not name the {kind} {name!r}"


@pytest.mark.parametrize("kind", INSTANCES)
def test_every_module_that_enumerates_them_is_listed(kind):
    paths = {path for path, _ in listed(kind)}
    enumerating = {str(p.relative_to(ROOT)) for p in sorted((ROOT / "aspan").rglob("*.py"))
                   if enumerates_all(p, INSTANCES[kind])}
    enumerating -= STUDIED.get(kind, set())
    assert enumerating <= paths, f"docs/extending.md, how to add a {kind}: also changes {sorted(enumerating - paths)}"


def test_a_method_is_its_kernel_module_and_its_rule():
    """An edit method is `hooks/<name>.py` (with its tests), whose factory its rule names without going through
    `hooks/__init__.py`, and its rule in `aspan/methods.py`: no other module of the engine, grid, search, profiling,
    figures, commands or `hooks` compares against a method's name or keys a table by it (applications may name the
    method they study: the paper's recipe is reinforcement, the upper bound patching)."""
    import torch

    from aspan.experiments.edit import Edit

    assert [path for path, _ in listed("method")] == ["hooks/<name>.py", "aspan/methods.py"]
    mask = torch.zeros(1, 4, 4, dtype=torch.bool)
    for method, rule in RULES.items():
        assert (ROOT / f"tests/hooks/test_{method}.py").is_file(), method
        assert rule.kernel.startswith(f"hooks.{method}:") and callable(resolve(rule.kernel)), method
        made = rule.hooks(Edit(method, heads=[(0, 0)]), mask, rows=None, gate_below=None)
        assert made and all(fn.__module__ == f"hooks.{method}" for _, fn in made), method
    named = set()
    for path in [*sorted((ROOT / "aspan").rglob("*.py")), *sorted((ROOT / "hooks").rglob("*.py"))]:
        if path == ROOT / "aspan/methods.py" or path.parent.name == "applications":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            values = [*node.comparators, node.left] if isinstance(node, ast.Compare) else \
                [k for k in node.keys if k is not None] if isinstance(node, ast.Dict) else []
            values += [e for v in values if isinstance(v, (ast.Tuple, ast.List, ast.Set)) for e in v.elts]
            if any(isinstance(v, ast.Constant) and v.value in RULES for v in values):
                named.add((str(path.relative_to(ROOT)), node.lineno))
    assert sorted(named) == []
