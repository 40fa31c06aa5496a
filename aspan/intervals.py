"""The statistics the studies report, in one place: mean and sd over seeds, and 95 % intervals: Wilson for a
proportion of correct samples, Student's t over seeds for a mean of per-seed values (both from scipy). Pure functions
of their inputs (no state, no randomness); scipy and numpy are imported on first use."""
from __future__ import annotations

import math
from collections.abc import Sequence


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion `correct / n` at `z` standard errors (1.96: 95 %), from
    `scipy.stats.binomtest(...).proportion_ci(method="wilson")`; (nan, nan) for n = 0."""
    from scipy.stats import binomtest, norm

    if n == 0:
        return math.nan, math.nan
    ci = binomtest(correct, n).proportion_ci(confidence_level=float(2 * norm.cdf(z) - 1), method="wilson")
    return max(0.0, float(ci.low)), min(1.0, float(ci.high))


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (sd is NaN for a single value)."""
    import numpy as np

    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else math.nan


def pooled_wilson(rates: Sequence[float], n_each: int) -> tuple[float, float]:
    """Wilson interval of the samples of several runs pooled: each rate is a share of `n_each` samples (rounded back
    to a count), so 3 seeds of 500 report samples give an interval over 1,500 answers. It bounds the pooled rate,
    not the spread between seeds (`t_interval` is that)."""
    correct = sum(round(r * n_each) for r in rates)
    return wilson(correct, n_each * len(rates))


def t_interval(values: Sequence[float], level: float = 0.95, bounds: tuple[float, float] | None = (0.0, 1.0)
               ) -> tuple[float, float]:
    """Student's t interval of the mean of `values` (e.g. one per seed), clipped to `bounds` (accuracies: [0, 1];
    None: unclipped); a single value gives (nan, nan)."""
    from scipy.stats import t

    n = len(values)
    if n < 2:
        return math.nan, math.nan
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    lo, hi = mean - half, mean + half
    return (lo, hi) if bounds is None else (max(bounds[0], lo), min(bounds[1], hi))


def seed_interval(rates: Sequence[float], n_each: int) -> tuple[float, float]:
    """The 95 % interval the study tables give for an accuracy averaged over seeds: the union of the t-interval over
    seeds (the spread between seeds) and the pooled Wilson interval (the samples' own noise, which is all there is
    when every seed scores the same, e.g. 0). One seed: its Wilson interval."""
    wlo, whi = pooled_wilson(rates, n_each)
    tlo, thi = t_interval(rates)
    if tlo != tlo:
        return wlo, whi
    return min(wlo, tlo), max(whi, thi)
