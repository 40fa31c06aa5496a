"""Raw HTML never reaches the site from an included file such as a study's results README.

The study pages include each study's `results/<study>/README.md` (MyST's `include`). MyST passes raw HTML through
to the page verbatim, so a `<script>` or an inline tag written in a README (or in a run's output pasted there) would
run in every reader's browser. After each page is read, this extension replaces every raw HTML node that came from
another file than the page itself, or from any file under `results/`, by its text shown as code (escaped, inert),
and warns at that file and line: the strict build (`-W`, as `make docs` runs) fails, and a lenient one shows the
HTML as text. A page's own raw HTML (a notebook's outputs, the figures) is left alone.
"""
from __future__ import annotations

from pathlib import Path

from docutils import nodes
from sphinx.util import logging

logger = logging.getLogger(__name__)


def _guarded(source: str | None, page: Path, results: Path) -> bool:
    """Whether raw HTML from `source` may not reach page `page`: an included file, or one under `results`."""
    if not source or not Path(source).is_file():  # none, or not a file ("x.py:docstring of f", a notebook cell)
        return False
    path = Path(source).resolve()
    return path != page or path.is_relative_to(results)


def escape_included_html(app, doctree: nodes.document) -> None:
    """`doctree-read`: every guarded raw HTML node becomes a literal (inline) or a literal block, with a warning."""
    page = Path(doctree["source"]).resolve()
    results = Path(app.config.results_html_root or Path(app.srcdir).parent / "results").resolve()
    for node in list(doctree.findall(nodes.raw)):
        if "html" not in node.get("format", "").split() or not _guarded(node.source, page, results):
            continue
        text = node.astext()
        inline = isinstance(node.parent, nodes.TextElement)
        node.replace_self(nodes.literal(text, text) if inline else nodes.literal_block(text, text, language="html"))
        logger.warning("raw HTML from an included file is shown as text, not rendered (a results README may hold "
                       "no raw HTML: write it as Markdown): %s", " ".join(text.split())[:80],
                       location=node, type="aspan", subtype="raw_html")


def setup(app):
    app.add_config_value("results_html_root", None, "env")  # default: `results/` beside the docs source directory
    app.connect("doctree-read", escape_included_html)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
