"""The layers of README's "Layout", read from the source with `ast` (every `import` and `from ... import`, those
inside functions included).

Package level (`aspan.<package or module>` and `hooks` are the units): no cycle between units; `hooks` imports
nothing from aspan; `aspan.commands` (the command line: the commands and their entry point `aspan.cli`) does not
import `aspan.experiments` (commands parse, applications run); `aspan.viz`, `aspan.report` and `aspan.findings`
(which draw and write what the runs computed) import nothing from `aspan.applications`.

Module level: `aspan.tasks` imports only itself, `aspan.viz` nothing from experiments, `aspan.applications` neither
argparse nor `aspan.commands`, nothing in aspan imports a private `hooks._*` module, and no module imports itself
through others.

The checks are functions of a module graph, so `test_*_fails_when_*` run them on a small package written to a
temporary directory with one forbidden import in it.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("aspan", "hooks")


def source_files(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Module name -> file of every module under `root`'s `packages` (a package is its `__init__`)."""
    return {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
            for package in packages for p in sorted((root / package).rglob("*.py"))}


def lazy_names(package: str, files: dict[str, Path]) -> dict[str, str]:
    """{name: the submodule defining it} of a package whose `__init__` imports its names on first access: its
    `_LAZY` dict literal (submodule -> names); {} for any other package."""
    path = files.get(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "_LAZY" and node.value:
            return {name: f"{package}.{sub}" for sub, names in ast.literal_eval(node.value).items() for name in names}
    return {}


def imports(module: str, files: dict[str, Path]) -> set[str]:
    """The modules `module` imports anywhere in its file (every Import and ImportFrom node of its syntax tree, at
    module top, in functions, under `if`), relative imports resolved; `from p import m` names the submodule `p.m`
    when there is one, or the submodule a lazy package `p` imports the name `m` from (`lazy_names`)."""
    path, found = files[module], set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[: len(package.split(".")) + 1 - node.level] if node.level else [])
            base = ".".join(filter(None, (base, node.module)))
            lazy = lazy_names(base, files)
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else lazy.get(a.name, base)
                      for a in node.names}
    return found - {module}


def module_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules it imports (any, the standard library's and third parties' included)."""
    files = source_files(root, packages)
    return {module: imports(module, files) for module in files}


FILES = source_files(ROOT)
GRAPH = module_graph(ROOT)


def _under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


# ------------------------------------------------------------------------------------------------ packages
LAYER_OF = {"aspan.cli": "aspan.commands"}  # the command line's entry point belongs to the commands' layer
FORBIDDEN = (  # (unit, what it must not import)
    ("hooks", "aspan"),  # hook functions stand alone
    ("aspan.commands", "aspan.experiments"),  # commands parse, applications run
    ("aspan.viz", "aspan.applications"),  # figures, pages and findings draw and write what the runs computed
    ("aspan.report", "aspan.applications"),
    ("aspan.findings", "aspan.applications"),
)


def unit(module: str) -> str | None:
    """The package-level unit a module of ours belongs to: `hooks`, `aspan` (its `__init__`) or `aspan.<name>` (a
    subpackage or a top-level module; see LAYER_OF); None for a module not ours."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return None
    name = ".".join(parts[:2]) if parts[0] == "aspan" else parts[0]
    return LAYER_OF.get(name, name)


def package_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """Unit -> unit it imports -> the module imports behind that edge, e.g. {"aspan.checks": {"aspan.models":
    [("aspan.checks", "aspan.models.safety")]}}; imports within a unit are left out."""
    edges: dict[str, dict[str, list[tuple[str, str]]]] = {u: {} for u in map(unit, graph) if u}
    for module, deps in sorted(graph.items()):
        for dep in sorted(deps):
            a, b = unit(module), unit(dep)
            if a and b and a != b:
                edges[a].setdefault(b, []).append((module, dep))
    return edges


def package_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle between units as the path that closes it, each step with the import behind it, e.g.
    ["aspan.checks", "aspan.models (aspan.checks -> aspan.models.safety)", "aspan.checks (...)"]; None when the
    packages depend one way."""
    edges = package_graph(graph)
    state: dict[str, str] = {}

    def visit(u: str, path: list[str]) -> list[str] | None:
        state[u] = "open"
        for v in sorted(edges.get(u, {})):
            if state.get(v) == "open":
                cycle = path[path.index(v):] + [v]
                return [cycle[0]] + [f"{b} ({' -> '.join(edges[a][b][0])})" for a, b in zip(cycle, cycle[1:])]
            found = None if v in state else visit(v, path + [v])
            if found:
                return found
        state[u] = "done"
        return None

    for u in sorted(edges):
        found = None if u in state else visit(u, [u])
        if found:
            return found
    return None


def forbidden_imports(graph: dict[str, set[str]], allowed: frozenset = frozenset()) -> list[tuple[str, str]]:
    """Every (module, module it imports) that FORBIDDEN rules out, less the `allowed` pairs."""
    return sorted((m, d) for m, deps in graph.items() for d in deps for a, b in FORBIDDEN
                  if unit(m) and _under(unit(m), a) and _under(d, b) and (m, d) not in allowed)


def test_packages_depend_one_way():
    cycle = package_cycle(GRAPH)
    assert cycle is None, " -> ".join(cycle)


def test_forbidden_imports_between_packages():
    assert forbidden_imports(GRAPH, frozenset()) == []


def _write_package(root: Path, files: dict[str, str]) -> dict[str, set[str]]:
    """The module graph of a package tree written under `root`: `files` maps a path ("aspan/x/y.py") to its source;
    every directory on the way gets an empty `__init__.py`."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in {"aspan/__init__.py": "", "hooks/__init__.py": "", **files}.items():
        path = root / rel
        for parent in path.relative_to(root).parents:
            if parent.parts:
                (root / parent).mkdir(exist_ok=True)
                (root / parent / "__init__.py").touch()
        path.write_text(text, encoding="utf-8")
    return module_graph(root)


LAYERED = {  # a small tree that keeps every rule: tasks <- models <- experiments <- applications <- commands, viz
    "aspan/tasks/words.py": "import math\n",
    "aspan/checks.py": "from .tasks import words\n",
    "aspan/models/tiny.py": "from ..checks import words\n",
    "aspan/experiments/engine.py": "from ..models import tiny\n",
    "aspan/applications/study.py": "def run():\n    from ..experiments.engine import go\n",
    "aspan/findings/studies.py": "from ..tasks.words import x\n",
    "aspan/report.py": "from .findings import studies\nfrom .viz import plots\n",
    "aspan/viz/plots.py": "import json\n",
    "aspan/commands/study.py": "from ..applications import study\nfrom .. import report\n",
    "aspan/cli.py": "from .commands import study\n",
    "hooks/edit.py": "import torch\n",
}


def test_the_checks_pass_a_layered_tree(tmp_path):
    graph = _write_package(tmp_path, LAYERED)
    assert package_cycle(graph) is None and forbidden_imports(graph) == []


def test_the_checks_fail_when_one_forbidden_import_is_injected(tmp_path):
    """Each rule of FORBIDDEN, broken by one import inside a function, is reported as exactly that import."""
    injected = {  # importer's file -> (its new source, the import the check must report)
        "hooks/edit.py": ("def f():\n    from aspan.tasks import words\n", ("hooks.edit", "aspan.tasks.words")),
        "aspan/commands/study.py": ("def run():\n    from ..experiments.engine import Edit\n",
                                    ("aspan.commands.study", "aspan.experiments.engine")),
        "aspan/cli.py": ("def main():\n    import aspan.experiments.engine\n",
                         ("aspan.cli", "aspan.experiments.engine")),
        "aspan/viz/plots.py": ("def draw():\n    from ..applications import study\n",
                               ("aspan.viz.plots", "aspan.applications.study")),
        "aspan/report.py": ("def page():\n    from .applications.study import run\n",
                            ("aspan.report", "aspan.applications.study")),
        "aspan/findings/studies.py": ("def find():\n    from ..applications.study import TABLE\n",
                                      ("aspan.findings.studies", "aspan.applications.study")),
    }
    for i, (path, (text, expected)) in enumerate(injected.items()):
        graph = _write_package(tmp_path / str(i), {**LAYERED, path: text})
        assert forbidden_imports(graph) == [expected], path
        assert forbidden_imports(graph, frozenset({expected})) == []


def test_the_checks_fail_on_a_cycle_through_a_function_level_import(tmp_path):
    """`checks` imports `models` inside a function while `models` imports `checks` at the top: a cycle between the
    two packages, though neither module imports itself."""
    graph = _write_package(tmp_path, {**LAYERED, "aspan/checks.py": "def f():\n    from .models import safety\n",
                                      "aspan/models/safety.py": "import os\n"})
    cycle = package_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1].split()[0] and len(cycle) == 3
    assert {"aspan.models (aspan.checks -> aspan.models.safety)", "aspan.checks (aspan.models.tiny -> aspan.checks)"
            } <= set(cycle)
    fixed = _write_package(tmp_path / "fixed", {**LAYERED, "aspan/models/safety.py": "import os\n"})
    assert package_cycle(fixed) is None


# ------------------------------------------------------------------------------------------------ modules
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


def commands_importing_the_dispatcher(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, aspan.cli) for each module under `aspan.commands` that imports the command line's entry point, other
    than `PROCESS_ENTRY_POINTS`."""
    return sorted((m, d) for m, deps in graph.items() if _under(m, "aspan.commands") and m not in PROCESS_ENTRY_POINTS
                  for d in deps if d == "aspan.cli")


# the main module of a process of its own, which `aspan.cli` never loads: `python -m aspan.commands.gpu_worker` runs
# `aspan.cli.main` on one study unit in a worker process (`aspan gpu slice` with units at once), so it closes no cycle
PROCESS_ENTRY_POINTS = frozenset({"aspan.commands.gpu_worker"})


def test_commands_do_not_import_the_dispatcher():
    """`aspan.cli` loads each command by name (`importlib`), an edge the module graph cannot see: a command importing
    `aspan.cli` back is a cycle `test_no_import_cycle` misses. A command that runs commands (`aspan gpu slice`) gets
    the dispatcher's `main` with its arguments instead."""
    assert commands_importing_the_dispatcher(GRAPH) == []


def test_the_dispatcher_check_fails_on_a_command_importing_it(tmp_path):
    graph = _write_package(tmp_path, {**LAYERED, "aspan/commands/gpu.py": "def run():\n    from ..cli import main\n"})
    assert commands_importing_the_dispatcher(graph) == [("aspan.commands.gpu", "aspan.cli")]
    assert commands_importing_the_dispatcher(_write_package(tmp_path / "ok", LAYERED)) == []
