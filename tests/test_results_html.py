"""Raw HTML never reaches the documentation site from a results README.

The study pages include `results/<study>/README.md` as MyST, which passes raw HTML through verbatim. Every results
README holds none (CommonMark's rules, which MyST follows: HTML blocks and inline tags outside code), and the docs
build's `results_html` extension (docs/_ext/results_html.py, listed in docs/conf.py) shows any that an included file
holds as text and warns, so the strict build fails: checked on a tiny Sphinx project whose page includes a README
with a `<script>`. That build needs the docs environment (`make docs` makes `.venv-docs`; `ASPAN_DOCS_PYTHON` names
another); without it the test is skipped, except under CI, which builds the docs first and where it fails instead.
"""
from __future__ import annotations

import ast
import html
import os
import re
import subprocess
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent
READMES = sorted((ROOT / "results").rglob("README.md"))


def raw_html(text: str) -> list[tuple[int, str]]:
    """(line, HTML) of every raw HTML block and inline tag of Markdown `text` outside code spans and blocks."""
    found = []
    for token in MarkdownIt("commonmark").parse(text):
        line = token.map[0] + 1 if token.map else 0
        if token.type == "html_block":
            found.append((line, token.content.strip()))
        found += [(line, child.content) for child in token.children or [] if child.type == "html_inline"]
    return found


def test_the_check_finds_raw_html_outside_code():
    text = ("# A study\n\nText with <span onclick='x()'>a tag</span> and `<b>code</b>`.\n\n"
            "<script>alert(1)</script>\n\n```html\n<script>fenced</script>\n```\n\n    <i>indented code</i>\n\n"
            "An autolink <https://example.org> and a < b.\n")
    assert raw_html(text) == [(3, "<span onclick='x()'>"), (3, "</span>"), (5, "<script>alert(1)</script>")]


def test_no_results_readme_holds_raw_html():
    assert len(READMES) >= 10
    bad = {str(p.relative_to(ROOT)): raw_html(p.read_text(encoding="utf-8")) for p in READMES}
    assert {k: v for k, v in bad.items() if v} == {}


def test_every_included_file_of_the_docs_is_a_checked_results_readme():
    included = set()
    for page in (ROOT / "docs").rglob("*.md"):
        for target in re.findall(r"```\{include\}\s+(\S+)", page.read_text(encoding="utf-8")):
            included.add((page.parent / target).resolve())
    assert included and included <= {p.resolve() for p in READMES}, included


def test_the_docs_build_loads_the_extension():
    tree = ast.parse((ROOT / "docs" / "conf.py").read_text(encoding="utf-8"))
    lists = [ast.literal_eval(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
             and any(getattr(t, "id", None) == "extensions" for t in node.targets)]
    assert lists and "results_html" in lists[0]


def docs_python() -> str:
    """A Python with Sphinx and myst-parser: `ASPAN_DOCS_PYTHON`, else `.venv-docs` (skip without one, fail in CI)."""
    python = os.environ.get("ASPAN_DOCS_PYTHON") or str(ROOT / ".venv-docs" / "bin" / "python")
    ok = Path(python).is_file() and subprocess.run([python, "-c", "import sphinx, myst_parser"],
                                                   capture_output=True).returncode == 0
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"no docs environment at {python} (CI builds it with `make docs` before the tests)")
        pytest.skip("no docs environment (`make docs` makes .venv-docs; or set ASPAN_DOCS_PYTHON)")
    return python


def test_the_docs_build_shows_raw_html_from_a_readme_as_text(tmp_path):
    python = docs_python()
    (tmp_path / "results" / "x").mkdir(parents=True)
    (tmp_path / "results" / "x" / "README.md").write_text(
        "# X study\n\nA <span onclick=\"steal()\">tag</span> inline.\n\n<script>alert(\"owned\")</script>\n\n"
        "```{raw} html\n<iframe src=\"https://example.org\"></iframe>\n```\n\n`<b>code</b>` stays code.\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'docs' / '_ext')!r})\n"
        "extensions = ['myst_parser', 'results_html']\n")
    (tmp_path / "docs" / "index.md").write_text(
        "# Page\n\n<b id=\"own\">a page's own HTML is kept</b>\n\n```{include} ../results/x/README.md\n```\n")

    def build(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([python, "-m", "sphinx", "-b", "html", "-q", "-E", *flags, "docs", "_build"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)

    strict = build("-W", "--keep-going")
    assert strict.returncode != 0
    readme = str(tmp_path / "results" / "x" / "README.md")
    for line in (3, 5, 7):
        assert f"{readme}:{line}: WARNING: raw HTML from an included file is shown as text" in strict.stderr, \
            strict.stderr
    lenient = build()
    assert lenient.returncode == 0, lenient.stderr
    page = (tmp_path / "_build" / "index.html").read_text(encoding="utf-8")
    for raw in ("<script>alert", "<iframe", "<span onclick", "steal()\">"):
        assert raw not in page
    shown = html.unescape(re.sub(r"<[^>]+>", "", page))  # the page's text, as a reader sees it
    assert '<script>alert("owned")</script>' in shown and '<span onclick="steal()">' in shown
    assert '<b id="own">' in page  # the page's own HTML is not an included file's
