"""The API reference: every public function, class and method of `aspan` and `hooks` has a docstring, and, once the
site is built (`make docs`), a rendered entry with that docstring on its module's page.

Public: a module with no leading underscore in its dotted name; in it, a function or class without a leading
underscore that the module itself defines (a package's re-export from a private module, such as `hooks.rows_beyond`,
counts for the package); in such a class, the methods and properties it defines (a docstring inherited from a base
class counts, as autodoc shows it).
"""
from __future__ import annotations

import html
import importlib
import importlib.util
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "docs" / "_build" / "html"
PACKAGES = ("aspan", "hooks")

def _private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def public_modules() -> list:
    found = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        found.append(module)
        for info in pkgutil.walk_packages(module.__path__, f"{package}."):
            if not _private(info.name):
                found.append(importlib.import_module(info.name))
    return found


def _members(cls) -> dict[str, object]:
    """Public methods and properties `cls` defines itself."""
    out = {}
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            out[name] = value
    return out


def _doc(owner, name: str, value) -> str | None:
    """The docstring autodoc shows: the object's own, else the one of the same member in a base class."""
    if owner is None and inspect.isclass(value):
        doc = value.__doc__ and inspect.cleandoc(value.__doc__)
        generated = doc and doc.startswith(f"{value.__name__}(")  # what dataclasses and namedtuples write themselves
        return None if generated else doc
    if owner is None:
        return inspect.getdoc(value)
    doc = inspect.getdoc(value.fget if isinstance(value, property) else value)
    for base in owner.__mro__[1:]:
        if doc:
            break
        doc = inspect.getdoc(getattr(base, name, None)) if name in dir(base) else None
    return doc


def public_names() -> dict[str, str | None]:
    """{dotted name of the rendered entry: its docstring or None} for every public function, class and method."""
    names: dict[str, str | None] = {}
    for module in public_modules():
        for name, obj in vars(module).items():
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            home = getattr(obj, "__module__", "") or ""
            reexport = name in getattr(module, "__all__", ()) and _private(home)
            if (home != module.__name__ or obj.__name__ != name) and not reexport:
                continue  # documented where it is defined, under its own name (`TASK = Parity` is an alias)
            names[f"{module.__name__}.{name}"] = _doc(None, name, obj)
            if inspect.isclass(obj):
                for attr, value in _members(obj).items():
                    names[f"{module.__name__}.{name}.{attr}"] = _doc(obj, attr, value)
    return names


def test_there_are_public_names_in_both_packages():
    names = public_names()
    assert len(names) > 500
    assert "hooks.rows_beyond" in names and "hooks.reinforce.reinforce" in names and "aspan.tasks.base.Task" in names
    assert not any(_private(n.rsplit(".", 1)[0]) for n in names if n != "hooks.rows_beyond")


def test_every_public_name_has_a_docstring():
    missing = sorted(name for name, doc in public_names().items() if not doc)
    assert not missing, f"{len(missing)} public names without a docstring: {missing}"


HOOKS_FUNCTIONS = sorted(__import__("hooks").__all__)


@pytest.mark.parametrize("name", HOOKS_FUNCTIONS)
def test_every_hooks_function_documents_shapes_and_an_example(name):
    import hooks

    doc = inspect.getdoc(getattr(hooks, name)) or ""
    assert re.search(r"^Shapes:$", doc, re.M), f"hooks.{name}: no `Shapes:` section"
    assert re.search(r"^Example:$", doc, re.M) and ">>> " in doc, f"hooks.{name}: no `Example:` with a >>> line"


def _entries(page: str) -> dict[str, str]:
    """{id: text of its description up to the first nested entry} for every object entry of a built page."""
    out = {}
    for m in re.finditer(r'<dt class="sig sig-object py[^"]*" id="([^"]+)">.*?</dt>\s*<dd>(.*?)(?=<dl|</dd>)',
                         page, re.S):
        out[m[1]] = html.unescape(re.sub(r"<[^>]+>", "", m[2])).strip()
    return out


@pytest.mark.skipif(not SITE.is_dir(), reason="the docs site is not built (docs/_build/html): run `make docs`")
def test_every_documented_name_has_a_rendered_entry_with_its_docstring():
    rendered: dict[str, str] = {}
    for page in (SITE / "api" / "generated").glob("*.html"):
        rendered.update(_entries(page.read_text(encoding="utf-8")))
    assert rendered, "no API entries in the built site"
    absent, empty = [], []
    for name in public_names():
        if name not in rendered:
            absent.append(name)
        elif not rendered[name]:
            empty.append(name)
    assert not absent, f"{len(absent)} public names have no entry in the API reference: {absent[:20]}"
    assert not empty, f"{len(empty)} API entries render no docstring: {empty[:20]}"


def all_modules() -> list:
    """Every module of `aspan` and `hooks`, private ones included (an example anywhere must run)."""
    found = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        found.append(module)
        found += [importlib.import_module(info.name) for info in pkgutil.walk_packages(module.__path__, f"{package}.")]
    return found


def docstring_examples() -> list:
    """Every docstring with a `>>>` example in `aspan` and `hooks` (modules, functions, classes, methods), each as a
    doctest with an empty namespace: an example runs as written, from its own imports, in a fresh session."""
    import doctest

    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = {}
    for module in all_modules():
        for test in finder.find(module, globs={}):
            if test.examples:
                tests[test.name] = test
    return [tests[name] for name in sorted(tests)]


EXAMPLES = docstring_examples()


def test_every_hooks_function_s_example_is_collected():
    names = {t.name for t in EXAMPLES}
    import hooks

    for name in HOOKS_FUNCTIONS:
        obj = getattr(hooks, name)
        assert f"{obj.__module__}.{obj.__qualname__}" in names, name


@pytest.mark.parametrize("test", EXAMPLES, ids=lambda t: t.name)
def test_a_docstring_example_runs_as_written_and_prints_what_it_shows(test):
    """The example alone, in an empty namespace (nothing from its module or another example), prints what it shows."""
    import doctest

    assert set(test.globs) <= {"__name__"}  # what doctest sets itself
    failures: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    result = runner.run(test, out=failures.append)
    assert result.failed == 0, "".join(failures)


def test_an_example_that_uses_a_name_it_never_defines_fails(tmp_path):
    """The check above fails on an example that relies on its module's names or on another example's set-up."""
    import doctest

    source = 'import torch\n\ndef f():\n    """Example:\n\n    >>> torch.zeros(2).tolist()\n    [0.0, 0.0]\n    """\n'
    (tmp_path / "uses_module_names.py").write_text(source)
    spec = importlib.util.spec_from_file_location("uses_module_names", tmp_path / "uses_module_names.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (test,) = [t for t in doctest.DocTestFinder().find(module, globs={}) if t.examples]
    with pytest.raises(AssertionError, match="NameError: name 'torch' is not defined"):
        test_a_docstring_example_runs_as_written_and_prints_what_it_shows(test)
