"""What a run found, in words: the question it asks, the answer written from its own numbers, the headline table
and one short paragraph per claim with the figures that show it. `aspan report` puts this at the top of the page
and keeps configuration, commands and raw numbers below, folded.

Each kind of run directory (`aspan demo`, `aspan pretrained`, the three studies) is recognised by what its
summary.json holds; `finding(summary, settings)` returns None for anything else (the page then shows the summary
as tables).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd


@dataclass
class Claim:
    """One claim of a run: a heading, a paragraph from the run's numbers, its figures (stems of figures/*.json)."""

    title: str
    text: str
    figures: list[str] = field(default_factory=list)
    table: pd.DataFrame | None = None  # a small table of strings shown under the paragraph


@dataclass
class Finding:
    """The top of a report: the question, the answer, the headline table (strings) and the rule under it."""

    question: str
    answer: str
    headline: pd.DataFrame
    rule: str
    claims: list[Claim] = field(default_factory=list)


def sig(x: Any, digits: int = 3) -> str:
    """`x` to `digits` significant figures, trailing zeros kept (0.5 -> '0.500', 1 -> '1.00'); '–' for missing."""
    if x is None or isinstance(x, str):
        return "–" if x is None else x
    x = float(x)
    if math.isnan(x):
        return "–"
    if x == 0:
        return "0.00"
    text = f"{x:#.{digits}g}"
    return text[:-1] if text.endswith(".") else text


def pp(x: Any) -> str:
    """A fraction as percentage points to 3 significant figures ('–' for missing)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return "0" if float(x) == 0 else sig(100 * float(x))


def pct(x: Any) -> str:
    """A fraction as a percentage to 3 significant figures."""
    return pp(x) + ("" if pp(x) == "–" else " %")


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
