"""The CLI reference of the docs site (docs/cli.md, built by `make docs`) is `aspan --help` and every subcommand's
`--help`, verbatim, at 86 columns (the width docs/_ext/aspan_docs.py formats them for): one block per command,
nothing missing, nothing extra."""
from __future__ import annotations

import argparse
import contextlib
import html
import io
import re
from pathlib import Path

import pytest

from aspan.cli import build_parser, main

PAGE = Path(__file__).resolve().parent.parent / "docs" / "_build" / "html" / "cli.html"


def commands(parser: argparse.ArgumentParser | None = None, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The words of `aspan` and of every subcommand, found by walking the parser."""
    parser = parser or build_parser()
    out = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word, sub in action.choices.items():
                out += commands(sub, (*prefix, word))
    return out


def help_text(words: tuple[str, ...], monkeypatch) -> str:
    """What `aspan WORDS --help` prints in a terminal 86 columns wide."""
    monkeypatch.setenv("COLUMNS", "86")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*words, "--help"])
    assert code == 0, f"aspan {' '.join(words)} --help exited {code}"
    return out.getvalue()


def test_every_command_is_found():
    found = commands()
    assert () in found and ("train",) in found and ("study", "parity") in found and ("gpu", "slice") in found
    assert len(found) == len(set(found)) > 15


@pytest.mark.skipif(not PAGE.is_file(), reason="the docs site is not built (docs/_build/html): run `make docs`")
def test_the_cli_reference_is_every_help_verbatim(monkeypatch):
    page = PAGE.read_text(encoding="utf-8")
    blocks = [html.unescape(re.sub(r"<[^>]+>", "", b)).rstrip("\n")
              for b in re.findall(r'<div class="highlight-text notranslate"><div class="highlight"><pre>(.*?)</pre>',
                                  page, re.S)]
    expected = [help_text(words, monkeypatch).rstrip("\n") for words in commands()]
    assert len(blocks) == len(expected), f"{len(blocks)} help blocks on the page, {len(expected)} commands"
    for words, want, got in zip(commands(), expected, blocks):
        want = "\n".join(line.rstrip() for line in want.splitlines())
        assert got == want, f"the page's block for `aspan {' '.join(words)}` differs from its --help"
