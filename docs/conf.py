"""Sphinx configuration of aspan's documentation site (`make docs` builds it into docs/_build/html).

Why Sphinx: it is the generator of the interpretability libraries aspan sits beside (TransformerLens, pyvene), it is
maintained for the long term (Material for MkDocs announces its end of life for 2027-05-05), it renders notebooks
with their outputs (myst-nb, which also executes them at every build) and it builds its search index locally. furo:
a clean theme that loads no web font and nothing from a CDN.

Why autodoc (plus a small generator of one page per module, `_ext/aspan_docs.py`) rather than autosummary's
recursion or sphinx-autoapi: autodoc imports the code, so lazily exported names, re-exports from private modules
and inherited docstrings come out as Python sees them, and the generator decides in one place that each object is
documented once, where it is defined. The CLI reference is printed from the argparse parser itself (the
`aspan-cli` directive) rather than re-rendered by sphinx-argparse, so the page is the `--help` text, verbatim.

The build is strict (`-W --keep-going`, see the Makefile): a warning, a broken cross-reference or a notebook that
raises fails it. It needs no network.
"""
from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))  # the aspan and hooks packages of this checkout

import aspan  # noqa: E402

project = "aspan"
author = "The aspan developers"
copyright = "the aspan developers (MIT licence)"
release = version = aspan.__version__

extensions = [
    "myst_nb",  # Markdown (MyST) pages and notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # Google-style sections (Args, Returns, Shapes, Example) in docstrings
    "sphinx.ext.viewcode",
    "aspan_docs",
    "results_html",  # raw HTML in an included results README is shown as text and fails the build
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "_ext"]
templates_path = ["_templates"]

# Docstrings are written with Markdown-style `code` spans: render single backticks as inline code.
default_role = "code"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_inherit_docstrings = True
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_custom_sections = [("Shapes", "params_style")]

# No dollarmath: Sphinx would load MathJax from a CDN on every page with math.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Notebooks: executed at every build, in their own directory; an exception in a cell fails the build.
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_timeout = 600
nb_execution_show_tb = True
nb_merge_streams = True

html_theme = "furo"
html_title = f"aspan {version}"
html_static_path = ["_static"] if (DOCS / "_static").is_dir() else []  # the site's own pictures, when there are any
html_theme_options = {"navigation_with_keys": True}
html_show_sourcelink = False
