"""What a run found, in words: the question it asks, the answer written from its own numbers, the headline table
and one short paragraph per claim with the figures that show it. `aspan report` puts this at the top of the page
and keeps configuration, commands and raw numbers below, folded.

Each kind of run directory (`aspan demo`, `aspan pretrained`, the studies of `STUDY_FINDINGS`) is recognised by what its
summary.json holds; `finding(summary, settings)` returns None for anything else (the page then shows the summary
as tables).
"""
from __future__ import annotations

from typing import Any, Callable

from .words import Claim, Finding, pct, pp, sig

__all__ = ["Claim", "Finding", "STUDY_FINDINGS", "finding", "pct", "pp", "sig"]

Recognise = Callable[[dict, dict], bool]
Build = Callable[[dict, dict], Finding]

# Each study of `aspan.applications.studies.REGISTRY`, under the same name: how its summary.json is recognised and
# its finding written, as "function" names in `aspan.findings.studies` (read there on first use: the findings import
# nothing of the studies, which import these table names and write what they compute).
STUDY_FINDINGS: dict[str, tuple[str, str]] = {
    "qk": ("is_qk", "qk"),
    "abc": ("is_abc", "abc"),
    "abc-paper": ("is_abc_paper", "abc_paper"),
    "parity": ("is_parity", "parity"),
}


def finding(summary: Any, settings: Any) -> Finding | None:
    """The finding of a run directory's summary.json (and run.json), or None for a kind of run it does not know."""
    from . import intervention, studies

    kinds: list[tuple[Recognise, Build]] = [(intervention.is_demo, intervention.demo),
                                            (intervention.is_pretrained, intervention.pretrained)]
    kinds += [(getattr(studies, is_it), getattr(studies, build)) for is_it, build in STUDY_FINDINGS.values()]
    if not isinstance(summary, dict):
        return None
    settings = settings if isinstance(settings, dict) else {}
    for recognise, build in kinds:
        if recognise(summary, settings):
            return build(summary, settings)
    return None
