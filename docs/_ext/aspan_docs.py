"""The site's own Sphinx extension: the API pages, the CLI reference, the tutorials and offline plotly.

- API pages (`docs/api/generated/`, written at every build): one page per public module of `aspan` and `hooks`,
  each documenting the functions and classes defined there (autodoc), and names a package re-exports from a private
  module (`hooks.rows_beyond`) on that package's page. Every object is documented once, where it is defined.
- CLI reference: the `aspan-cli` directive prints `--help` of `aspan` and of every subcommand, taken from the parser
  itself (`aspan.cli.build_parser`) at a fixed width, so the page cannot drift from `--help`.
- Tutorials: `notebooks/*.ipynb` are linked into `docs/tutorials/` at every build and executed there by myst-nb.
- Search from disk: the search page loads `_static/search_offline.js`, which, opened from a `file:` URL, turns off
  the page excerpts Sphinx would fetch (browsers refuse that there) and names `make docs-serve`.
- plotly offline: the notebooks' kernel starts with an IPython profile (quiet_build.py) whose start-up file makes
  plotly's default renderer emit a `<div>` and a `Plotly.newPlot` call without any `<script src>` (plotly's own
  notebook renderers link MathJax or plotly.js from a CDN); the page loads `_static/plotly.min.js`, copied from the
  installed plotly.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import pkgutil
import shutil
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

DOCS = Path(__file__).resolve().parent.parent
ROOT = DOCS.parent
PACKAGES = ("aspan", "hooks")
CLI_WIDTH = 86  # the terminal width the CLI reference is formatted for (what fits furo's text column)


# ---------------------------------------------------------------------------------------------------- the API pages

def public_modules() -> list[str]:
    """Every module of `aspan` and `hooks` without a leading underscore in its dotted name, sorted."""
    names = []
    for package in PACKAGES:
        names.append(package)
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, f"{package}."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                names.append(info.name)
    return sorted(names)


def _reexported(module) -> list[tuple[str, str]]:
    """(name, autodoc directive) for the functions and classes in `module.__all__` defined in a private module."""
    out = []
    for name in getattr(module, "__all__", ()):
        obj = getattr(module, name, None)
        home = getattr(obj, "__module__", "") or ""
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and any(p.startswith("_") for p in home.split(".")):
            out.append((name, "autoclass" if inspect.isclass(obj) else "autofunction"))
    return out


def module_page(name: str) -> str:
    """The reStructuredText page of one module: its docstring, its own members, its submodules."""
    module = importlib.import_module(name)
    lines = [name, "=" * len(name), "", f".. automodule:: {name}", "   :members:", "   :ignore-module-all:",
             "   :show-inheritance:",
             "   :member-order: bysource", ""]
    for attr, directive in _reexported(module):
        lines += [f".. {directive}:: {name}.{attr}", ""]
    if name == "aspan":
        lines += [".. rubric:: Entry points", "", "The names `import aspan` provides (imported on first use):", ""]
        for attr in module.__all__:
            mod, obj = module._EXPORTS[attr]
            target = mod if obj is None else f"{mod}.{obj}"
            lines.append(f"- ``aspan.{attr}``: :py:obj:`{target}`")
        lines.append("")
    return "\n".join(lines)


def write_api_pages(app: Sphinx) -> None:
    """(Re)write `api/generated/*.rst`, touching only pages whose text changed (keeps rebuilds incremental)."""
    out = DOCS / "api" / "generated"
    out.mkdir(parents=True, exist_ok=True)
    wanted = {f"{name}.rst": module_page(name) for name in public_modules()}
    for stale in set(p.name for p in out.glob("*.rst")) - set(wanted):
        (out / stale).unlink()
    for file, text in wanted.items():
        path = out / file
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


def indented_blocks_are_code(app: Sphinx, what: str, name: str, obj, options, lines: list[str]) -> None:
    """Docstrings follow Markdown here: a block indented 4 or more spaces below a prose paragraph is code. In
    reStructuredText it would be a block quote (parsed as markup), so such blocks become literal blocks (`::`)."""
    i = 1
    while i < len(lines):
        block = lines[i].strip() and not lines[i - 1].strip() and len(lines[i]) - len(lines[i].lstrip()) >= 4
        start = i - 1
        while start > 0 and lines[start - 1].strip():
            start -= 1
        prose = i >= 2 and lines[start].strip() and not lines[start].startswith((" ", "..", ":", ">>>"))
        last = lines[i - 2] if i >= 2 else ""
        if block and prose and not last.rstrip().endswith("::"):
            if last.rstrip().endswith(":"):
                lines[i - 2] = last.rstrip() + ":"
            else:
                lines[i - 1:i - 1] = ["", "::"]
                i += 2
        i += 1


# ------------------------------------------------------------------------------------------------ the CLI reference

@contextlib.contextmanager
def _columns(width: int):
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def cli_commands(parser=None, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """(command words, its `--help` text) for `aspan` and every subcommand, depth first, formatted `CLI_WIDTH` wide."""
    import argparse

    from aspan.cli import build_parser

    with _columns(CLI_WIDTH):
        parser = parser or build_parser()
        out = [(prefix, parser.format_help())]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for word, sub in action.choices.items():
                    out += cli_commands(sub, (*prefix, word))
    return out


class AspanCli(SphinxDirective):
    """`aspan-cli`: one section per command, headed `aspan WORD...`, holding that command's `--help` verbatim."""

    def run(self) -> list[nodes.Node]:
        text = []
        for words, help_text in cli_commands():
            title = " ".join(("aspan", *words))
            if words:
                text += [f".. _cli-{'-'.join(words)}:", "", title, "-" * len(title), ""]
            text += [".. code-block:: text", ""] + [f"   {line}".rstrip() for line in help_text.splitlines()] + [""]
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(text, source="aspan.cli.build_parser"), container)
        return container.children


# ----------------------------------------------------------------------------------- tutorials and offline plotly

def link_notebooks(app: Sphinx) -> None:
    """`docs/tutorials/NAME.ipynb` -> `notebooks/NAME.ipynb` for every notebook; links to notebooks gone removed."""
    here = DOCS / "tutorials"
    here.mkdir(exist_ok=True)  # holds nothing but these links, so a fresh clone has no such folder
    wanted = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    for link in here.glob("*.ipynb"):
        if link.is_symlink() and link.name not in wanted:
            link.unlink()
    for name in wanted:
        link = here / name
        if not link.is_symlink():
            link.symlink_to(Path("..") / ".." / "notebooks" / name)


def copy_plotly_js(app: Sphinx, exception) -> None:
    """Ship the installed plotly's `plotly.min.js` as `_static/plotly.min.js`."""
    if exception is None and app.builder.format == "html":
        import plotly

        source = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
        shutil.copyfile(source, Path(app.outdir) / "_static" / "plotly.min.js")


def plotly_on_pages_that_draw(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Load `plotly.min.js` (in the head, before the figures' inline scripts run) only where a page draws one."""
    if "Plotly.newPlot" in context.get("body", ""):
        app.add_js_file("plotly.min.js", priority=100)


def search_offline_note(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """On the search page only: `_static/search_offline.js` (from disk, titles without excerpts and a note naming
    `make docs-serve`; served, nothing changes)."""
    if pagename == "search":
        app.add_js_file("search_offline.js")


# --------------------------------------------------------------------------------------------- the navigation tree

def navigation_current_branch(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """furo draws the navigation on every page from `toctree(collapse=False, titles_only=True, maxdepth=-1)`:
    Sphinx copies the table of contents of every page, each API page's every function and method included, and then
    keeps the titles. Done for each of the site's ~330 pages, that was most of the time spent writing them. With
    `collapse=True`, a branch's pages are listed only on the pages of that branch: every page still lists every
    top-level page, and the API module pages are listed on the API pages (elsewhere, "API reference" leads to
    them); each page's own "On this page" is unchanged. tests/test_docs_site.py checks both."""
    toctree = context.get("toctree")
    if toctree is None:
        return

    def collapsed(**kwargs):
        if kwargs.get("titles_only"):
            kwargs["collapse"] = True
        return toctree(**kwargs)

    context["toctree"] = collapsed


def setup(app: Sphinx) -> dict:
    app.add_directive("aspan-cli", AspanCli)
    app.connect("builder-inited", write_api_pages)
    app.connect("autodoc-process-docstring", indented_blocks_are_code)
    app.connect("builder-inited", link_notebooks)
    app.connect("html-page-context", plotly_on_pages_that_draw)
    app.connect("html-page-context", search_offline_note)
    app.connect("html-page-context", navigation_current_branch, priority=400)  # before furo's handler (500)
    app.connect("build-finished", copy_plotly_js)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
