"""The project's written documentation as the tests read it: README.md and the pages of docs/ that hold runnable
code blocks, in the order their blocks run (later blocks reuse what earlier ones wrote), and a fence parser that
knows MyST directives (```{include} ...), so a directive never passes for a code block."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# README first (its set-up block opens the run), then the pages in reading order; the command-line examples of
# getting-started.md and cli-examples.md run in this order (`aspan report runs/rank` reads what `aspan rank` wrote).
PAGES = (
    "README.md",
    "docs/getting-started.md",
    "docs/cli-examples.md",
    "docs/concepts.md",
    "docs/tasks.md",
    "docs/howto/own-model.md",
    "docs/howto/cluster.md",
    "docs/howto/gpu.md",
    "docs/extending.md",
    "docs/versions.md",
    "docs/benchmarks.md",
    "docs/contributing.md",
)
# Pages whose blocks another test runs, on whichever TransformerLens is installed (CI runs it on 3.9 and on 4.3):
# a block whose first line is TRANSFORMER_LENS_3 runs only where TransformerLens has HookedTransformer.
ON_EITHER_STACK = {"docs/howto/own-model.md": "tests/test_own_model_page.py"}
TRANSFORMER_LENS_3 = "# TransformerLens 3.9 only"
STUDY_PAGES = tuple(f"docs/studies/{p.parent.name}.md" for p in sorted((ROOT / "results").glob("*/README.md")))
FENCE = re.compile(r"^(`{3,}|~{3,})\s*(\{[\w-]+\}|[\w+-]*)(.*)$")


def text(page: str) -> str:
    """The page's Markdown (a path relative to the repository root)."""
    return (ROOT / page).read_text(encoding="utf-8")


def flat(page: str) -> str:
    """The page with line breaks as spaces (prose wraps anywhere)."""
    return re.sub(r"\s+", " ", text(page))


def fenced(markdown: str) -> list[tuple[str, str, int]]:
    """(language, code, line number of the opening fence) of every fenced block; a MyST directive's language is its
    name in braces (`{include}`). A fence closes on a line of the same character, at least as long, and nothing
    else; an unclosed fence raises, as it would swallow the rest of the page."""
    out, lines, i = [], markdown.splitlines(keepends=True), 0
    while i < len(lines):
        m = FENCE.match(lines[i].rstrip("\n"))
        if not m:
            i += 1
            continue
        fence, lang, start = m[1], m[2], i
        close = re.compile(rf"^{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        i += 1
        while i < len(lines) and not close.match(lines[i].rstrip("\n")):
            i += 1
        if i == len(lines):
            raise ValueError(f"unclosed ``` fence at line {start + 1}")
        out.append((lang, "".join(lines[start + 1:i]), start + 1))
        i += 1
    return out


def blocks(pages: tuple[str, ...] = PAGES) -> list[tuple[str, str, str, int]]:
    """(page, language, code, line) of every fenced block of the pages, in order."""
    return [(page, lang, code, line) for page in pages for lang, code, line in fenced(text(page))]
