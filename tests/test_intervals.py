"""`aspan.intervals`: the studies' statistics, checked against their textbook formulas."""
from __future__ import annotations

import math

import pytest

from aspan.intervals import mean_sd, pooled_wilson, t_interval, wilson


def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@pytest.mark.parametrize("k,n", [(0, 6), (3, 6), (6, 6), (17, 500), (1499, 1500)])
def test_wilson_is_the_score_interval(k, n):
    assert wilson(k, n) == pytest.approx(_wilson(k, n), abs=1e-12)
    assert wilson(k, n, z=2.576) == pytest.approx(_wilson(k, n, 2.576), abs=1e-12)  # 99 %
    lo, hi = wilson(k, n)
    assert 0 <= lo <= k / n <= hi <= 1


def test_no_samples_no_interval_and_pooling_counts_every_answer():
    assert all(math.isnan(x) for x in wilson(0, 0))
    assert pooled_wilson([0.5, 0.25], 4) == wilson(3, 8)


def test_mean_sd_and_t_interval():
    assert mean_sd([1.0, 0.0]) == (0.5, pytest.approx(math.sqrt(0.5)))
    assert mean_sd([0.25])[0] == 0.25 and math.isnan(mean_sd([0.25])[1])
    lo, hi = t_interval([0.2, 0.4, 0.6], bounds=None)
    assert (lo + hi) / 2 == pytest.approx(0.4) and hi - lo == pytest.approx(2 * 4.302652729911275 * 0.2 / math.sqrt(3))
