"""circuitsvis head views that work offline: JavaScript inlined (`local_src`), attention cropped and rounded.

circuitsvis' `str()`/`show_code()` load the JavaScript from a CDN (blank page offline), so views are always
written from `local_src`; its `_repr_html_` asks google.com whether the machine is online and then shows the CDN
version, so the views made here are `OfflineView`s, whose notebook display is `local_src` without asking.
`split_bundle` lets a page that shows several views carry the ~1.3 MB bundle once.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import numpy as np
from circuitsvis.attention import attention_heads
from circuitsvis.utils.render import RenderedHTML

from ..io import write_text
from .figures import _np

# local_src = <div id=ID .../> <script crossorigin type="module"> BUNDLE  CircuitsVis.render("ID", ...) </script>
_LOCAL = re.compile(
    r'<div id="(?P<id>circuits-vis-[^"]+)"[^>]*>\s*<script crossorigin type="module">\s*'
    r"(?P<bundle>.*?)\s*(?P<call>CircuitsVis\.render\(\s*\"(?P=id)\".*?)\s*</script>",
    re.S,
)


class OfflineView(RenderedHTML):
    """A circuitsvis view whose notebook display (JupyterLab, the docs build) is always its offline page, with the
    JavaScript inlined: no request to find out whether the machine is online, nothing loaded from a CDN."""

    def _repr_html_(self) -> str:
        return self.local_src

    def __html__(self) -> str:
        return self.local_src


def offline(view: RenderedHTML) -> OfflineView:
    """`view` as an `OfflineView` (the same pages)."""
    return OfflineView(view.local_src, view.cdn_src)


def head_view(
    patterns,
    tokens: Sequence[str],
    names: Sequence[str] | None = None,
    span: tuple[int, int] | None = None,
    decimals: int = 3,
) -> OfflineView:
    """circuitsvis `attention_heads` of `[heads, q, k]` patterns, cropped to positions `span` = (start, stop).

    The crop applies to queries and keys alike (circuitsvis labels both axes with `tokens`); values are rounded
    to `decimals` because the data is inlined as JSON.
    """
    a = _np(patterns)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3 or a.shape[1] != a.shape[2]:
        raise ValueError(f"patterns must be [heads, pos, pos], got shape {a.shape}")
    if len(tokens) != a.shape[1]:
        raise ValueError(f"{len(tokens)} tokens for patterns over {a.shape[1]} positions")
    if names is not None and len(names) != a.shape[0]:
        raise ValueError(f"{len(names)} head names for {a.shape[0]} heads")
    start, stop = span if span is not None else (0, a.shape[1])
    if not 0 <= start < stop <= a.shape[1]:
        raise ValueError(f"span {span} is not a non-empty range inside 0..{a.shape[1]}")
    a = np.round(a[:, start:stop, start:stop], decimals)
    return offline(attention_heads(
        attention=a.tolist(),
        tokens=[str(t) for t in tokens[start:stop]],
        attention_head_names=list(names) if names is not None else None,
        mask_upper_tri=True,
    ))


def save_view(view: RenderedHTML | str, path: str | Path) -> Path:
    """Write a view as a standalone offline HTML fragment (`local_src`, never the CDN version), atomically."""
    html = view.local_src if isinstance(view, RenderedHTML) else str(view)
    if "unpkg.com" in html:
        raise ValueError("view loads its JavaScript from a CDN; pass the RenderedHTML or its .local_src")
    return write_text(path, html)


def split_bundle(html: str) -> tuple[str | None, str]:
    """(circuitsvis JS bundle, the view without it) for a `local_src` page; (None, html) for anything else.

    The returned view is a `<div>` and a classic `<script>` calling the global `CircuitsVis.render`, so the page
    must load the bundle (as a classic script) before it.
    """
    m = _LOCAL.search(html)
    if m is None or "CircuitsVis" not in m["bundle"]:
        return None, html
    body = f'<div id="{m["id"]}" style="margin: 15px 0;"></div>\n<script>\n{m["call"]}\n</script>'
    return m["bundle"], html[: m.start()] + body + html[m.end() :]
