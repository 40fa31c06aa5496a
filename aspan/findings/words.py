"""The pieces every finding is written with: a claim, a finding, and numbers as words (significant figures,
percentage points, percentages)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # tables are built by the findings that have them; these pieces load no pandas
    import pandas as pd


@dataclass
class Claim:
    """One claim of a run: a heading, a paragraph from the run's numbers, its figures (stems of `figures/*.json`)."""

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
