"""Algorithm 1 of Duan & Shi (2023) (`calibrate`) against a slow loop written from the algorithm's text, on random
blocks (Hypothesis) and on hand-made patterns whose answer is known."""
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aspan.experiments.abc import calibrate
from aspan.experiments.calibration import LINE_DIRECTIONS


def slow_calibrate(attn: np.ndarray, shape: tuple[int, int], kappa: float, directions) -> np.ndarray:
    """Element by element, in exact arithmetic (so ties at the threshold are ties): each line's members inside
    [m, n], their mean, the threshold over that head's and direction's lines, the bias on the line's extension into
    [M, N]; max over directions; no kept line -> zeros."""
    H, m, n = attn.shape
    M, N = shape
    out = np.full((H, M, N), -np.inf)
    for h in range(H):
        for d in directions:
            def key(i, j, big, d=d):
                if d == "diagonal":
                    return j - i
                if d == "vertical":
                    return j
                return i + j - ((N - n) if big else 0)  # anti-diagonal: top-right corners aligned

            members: dict[int, list[float]] = {}
            for i in range(m):
                for j in range(n):
                    members.setdefault(key(i, j, False), []).append(float(attn[h, i, j]))
            # exact rational arithmetic: d > mu + kappa sigma  <=>  d - mu > 0 and (d - mu)^2 > kappa^2 sigma^2
            means = {k: sum(map(Fraction, v)) / len(v) for k, v in members.items()}
            values = list(means.values())
            mu = sum(values) / len(values)
            var = sum((v - mu) ** 2 for v in values) / len(values)
            kept = {k for k, d in means.items() if d > mu and (d - mu) ** 2 > Fraction(kappa) ** 2 * var}
            top = max(values)
            for i in range(M):
                for j in range(N):
                    k = key(i, j, True)
                    if k in kept:
                        out[h, i, j] = max(out[h, i, j], float(means[k] - top))
        if np.isinf(out[h]).all():
            out[h] = 0.0
    return out


@settings(max_examples=100, deadline=None)
@given(
    heads=st.integers(1, 3), m=st.integers(1, 6), n=st.integers(1, 7),
    grow=st.tuples(st.integers(0, 4), st.integers(0, 4)),
    kappa=st.sampled_from([0.0, 0.5, 0.87, 1.5, 4.5]), seed=st.integers(0, 10_000),
    directions=st.lists(st.sampled_from(LINE_DIRECTIONS), min_size=1, max_size=3, unique=True),
    quantised=st.booleans(),
)
@example(heads=2, m=4, n=6, grow=(0, 0), kappa=0.0, seed=1, directions=["diagonal"], quantised=True)  # a tie
def test_calibrate_equals_the_slow_loop(heads, m, n, grow, kappa, seed, directions, quantised):
    g = torch.Generator().manual_seed(seed)
    attn = torch.rand(heads, m, n, generator=g, dtype=torch.float64)
    if quantised:  # ties between line means, and heads of constant attention
        attn = (attn * 3).floor() / 3
    shape = (m + grow[0], n + grow[1])
    got = calibrate(attn, shape, kappa=kappa, directions=tuple(directions))
    want = slow_calibrate(attn.numpy(), shape, kappa, directions)
    assert got.shape == (heads, *shape)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-12)


def test_a_diagonal_head_keeps_its_line_and_extends_it():
    attn = torch.eye(4)[None] * 0.9 + 0.025  # head 0 attends along the main diagonal
    bias = calibrate(attn, (6, 6), kappa=0.87, directions=("diagonal", "vertical"))
    assert torch.equal(bias[0].diagonal(), torch.zeros(6))  # the top line, extended past the block, at 0
    assert torch.isinf(bias[0]).sum() == 36 - 6  # no other diagonal passes; all columns tie (sigma 0): none kept
    # anti-diagonally, the one-element corner lines (0, 0) and (3, 3) hold the largest means: Algorithm 1 keeps them
    anti = calibrate(attn, (4, 4), kappa=0.87, directions=("anti-diagonal",))[0]
    assert anti[0, 0] == 0 and anti[3, 3] == 0


def test_the_anti_diagonal_is_aligned_at_the_top_right_corner():
    attn = torch.full((1, 3, 3), 0.01)
    attn[0, [0, 1, 2], [2, 1, 0]] = 1.0  # the anti-diagonal i + j = 2 of the block
    bias = calibrate(attn, (3, 5), kappa=1.0, directions=("anti-diagonal",))
    kept = ~torch.isinf(bias[0])
    # input column j sits at output column j + 2: the line i + j = 2 runs through (0, 4), (1, 3), (2, 2)
    assert kept.nonzero().tolist() == [[0, 4], [1, 3], [2, 2]]


def test_a_head_with_no_kept_line_is_transparent_and_others_are_not():
    attn = torch.stack([torch.full((3, 3), 1 / 3), torch.eye(3)])
    bias = calibrate(attn, (5, 5), kappa=0.87)
    assert torch.equal(bias[0], torch.zeros(5, 5))  # constant attention: no line passes mu + kappa sigma
    assert torch.isinf(bias[1]).any() and (bias[1] == 0).any()


@pytest.mark.parametrize("bad", [
    dict(attn=torch.rand(2, 3), shape=(3, 3)),
    dict(attn=torch.rand(1, 3, 3), shape=(2, 3)),
    dict(attn=torch.rand(1, 3, 3), shape=(3, 3), directions=("horizontal",)),
    dict(attn=torch.full((1, 2, 2), float("nan")), shape=(2, 2)),
])
def test_bad_arguments_are_refused(bad):
    with pytest.raises(ValueError):
        calibrate(bad.pop("attn"), bad.pop("shape"), kappa=1.0, **bad)
