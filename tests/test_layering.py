"""The layers of README's "Layout", read from the source with `ast` (imports inside functions included): `hooks`
imports nothing from aspan, `aspan.tasks` only itself, `aspan.viz` nothing from experiments or applications,
`aspan.applications` neither argparse nor `aspan.commands`, nothing in aspan imports a private `hooks._*` module, and no
module imports itself through others."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
         for package in ("aspan", "hooks") for p in sorted((ROOT / package).rglob("*.py"))}


def imports(module: str) -> set[str]:
    """The modules `module` imports anywhere in its file, relative imports resolved; `from p import m` names the
    submodule `p.m` when there is one."""
    path, found = FILES[module], set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[: len(package.split(".")) + 1 - node.level] if node.level else [])
            base = ".".join(filter(None, (base, node.module)))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in FILES else base for a in node.names}
    return found - {module}


GRAPH = {module: imports(module) for module in FILES}


def _under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_hooks_imports_nothing_from_aspan():
    assert {m: sorted(d for d in deps if _under(d, "aspan")) for m, deps in GRAPH.items()
            if _under(m, "hooks") and any(_under(d, "aspan") for d in deps)} == {}


def test_tasks_import_only_tasks():
    assert sorted((m, d) for m, deps in GRAPH.items() if _under(m, "aspan.tasks")
                  for d in deps if _under(d, "aspan", "hooks") and not _under(d, "aspan.tasks")) == []


def test_viz_imports_nothing_from_experiments_or_applications():
    assert sorted((m, d) for m, deps in GRAPH.items() if _under(m, "aspan.viz")
                  for d in deps if _under(d, "aspan.experiments", "aspan.applications")) == []


def test_no_private_hooks_module_is_imported_outside_hooks():
    assert sorted((m, d) for m, deps in GRAPH.items() if not _under(m, "hooks")
                  for d in deps if _under(d, "hooks") and d.split(".")[1:2] and d.split(".")[1].startswith("_")) == []


def test_no_import_cycle():
    """Depth-first search of the module graph (aspan and hooks); a module met again on the current path is a cycle."""
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for dep in sorted(GRAPH[module] & FILES.keys()):
            if state.get(dep) == "open":
                return path[path.index(dep):] + [dep]
            found = None if dep in state else visit(dep, path + [dep])
            if found:
                return found
        state[module] = "done"
        return None

    cycle = None
    for module in sorted(FILES):
        cycle = cycle or (None if module in state else visit(module, [module]))
    assert cycle is None, " -> ".join(cycle)


def test_only_the_backend_seam_tells_the_backends_apart():
    """`is_bridge` is used in `aspan.models.backend` (and `loaded`, which boots bridges) only: everything else asks
    `backend_of(model)`."""
    users = {m for m, path in FILES.items() for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, (ast.Name, ast.alias, ast.Attribute))
             and "is_bridge" in (getattr(node, "id", None), getattr(node, "name", None), getattr(node, "attr", None))}
    assert users <= {"aspan.models.backend", "aspan.models.loaded"}, sorted(users)


def test_applications_parse_no_command_line():
    """Commands parse, applications run: nothing under `aspan.applications` imports argparse or `aspan.commands`
    (a notebook calls an application with a settings object, not with parsed arguments)."""
    assert sorted((m, d) for m, deps in GRAPH.items() if _under(m, "aspan.applications")
                  for d in deps if _under(d, "argparse", "aspan.commands")) == []
