"""What a run found, in words: the question it asks, the answer written from its own numbers, the headline table
and one short paragraph per claim with the figures that show it. `aspan report` puts this at the top of the page
and keeps configuration, commands and raw numbers below, folded.

Each kind of run directory (`aspan demo`, `aspan pretrained`, the three studies) is recognised by what its
summary.json holds; `finding(summary, settings)` returns None for anything else (the page then shows the summary
as tables).
"""
from __future__ import annotations

from typing import Any, Callable

from .words import Claim, Finding, pct, pp, sig

__all__ = ["Claim", "Finding", "finding", "pct", "pp", "sig"]


def finding(summary: Any, settings: Any) -> Finding | None:
    """The finding of a run directory's summary.json (and run.json), or None for a kind of run it does not know."""
    from . import intervention, studies

    kinds: list[tuple[Callable[[dict, dict], bool], Callable[[dict, dict], Finding]]] = [
        (intervention.is_demo, intervention.demo),
        (intervention.is_pretrained, intervention.pretrained),
        (studies.is_qk, studies.qk),
        (studies.is_abc, studies.abc),
        (studies.is_abc_paper, studies.abc_paper),
        (studies.is_parity, studies.parity),
    ]
    if not isinstance(summary, dict):
        return None
    settings = settings if isinstance(settings, dict) else {}
    for recognise, build in kinds:
        if recognise(summary, settings):
            return build(summary, settings)
    return None
