"""Attention Bias Calibration as the paper states it: Duan & Shi 2023, "From Interpolation to Extrapolation: Complete
Length Generalization for Arithmetic Transformers" (arXiv 2310.11984, v3), Section 5 and Algorithm 1.

`calibrate` is a pure function of an averaged attention block: per head and direction it takes the mean `d_l` of
every line `l` of the block, keeps the lines whose mean passes `mu + kappa * sigma` (over that head's and direction's
line means), and writes `d_l - max_l d_l` along the extension of each kept line into a larger `[M, N]` bias,
`-inf` elsewhere; directions merge by element-wise maximum, and a head with no kept line is left transparent (zeros).
The paper uses kappa = 4.5 for the cross-attention (input) block and 0.87 for the self-attention (output) block;
in a decoder-only model with the padded layout these are the target rows x prompt columns and the target rows x
target columns of one attention map (`padded_blocks`).

Line keys: diagonal `j - i` and vertical `j`, aligned at the top-left corner; anti-diagonal `i + j`, aligned at the
top-right corner (Algorithm 1's footnote: the block is translated so the two top-right corners meet, so input
column `j` sits at output column `j + N - n`).
"""
from __future__ import annotations

from typing import Literal, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

LineDirection = Literal["diagonal", "anti-diagonal", "vertical"]
LINE_DIRECTIONS: tuple[LineDirection, ...] = ("diagonal", "anti-diagonal", "vertical")
CROSS_KAPPA = 4.5  # the paper's threshold for the input (cross-attention) block
SELF_KAPPA = 0.87  # the paper's threshold for the output (self-attention) block


def line_keys(direction: LineDirection, rows: int, cols: int, shift: int = 0) -> Tensor:
    """`[rows, cols]` integer key of the line through each element; `shift` moves the columns left by that many
    (the bias's column `J` is the block's column `J - shift` for the anti-diagonal's top-right alignment)."""
    i = torch.arange(rows)[:, None]
    j = torch.arange(cols)[None, :]
    if direction == "diagonal":
        return (j - i).expand(rows, cols)
    if direction == "vertical":
        return j.expand(rows, cols)
    if direction == "anti-diagonal":
        return i + j - shift
    raise ValueError(f"direction must be one of {LINE_DIRECTIONS}, got {direction!r}")


def line_means(attn: Float[Tensor, "head m n"], keys: Tensor) -> tuple[Float[Tensor, "head line"], int]:
    """Mean of `attn` along every line (keys are consecutive integers); returns (means, smallest key)."""
    low = int(keys.min())
    index = (keys - low).flatten()
    width = int(index.max()) + 1
    sums = torch.zeros(attn.shape[0], width, dtype=attn.dtype).index_add_(1, index, attn.flatten(1))
    return sums / torch.bincount(index, minlength=width).to(attn.dtype), low


def _direction_bias(attn: Tensor, shape: tuple[int, int], kappa: float, direction: LineDirection) -> Tensor:
    """One direction's `[head, M, N]` bias: `d_l - max d` on the extension of kept lines, -inf elsewhere."""
    (M, N), (m, n) = shape, attn.shape[1:]
    shift = N - n if direction == "anti-diagonal" else 0
    means, low = line_means(attn, line_keys(direction, m, n))
    top = means.amax(-1, keepdim=True)
    threshold = means.mean(-1, keepdim=True) + kappa * means.std(-1, unbiased=False, keepdim=True)
    # `d_l > mu + kappa sigma` as exact arithmetic decides it: a line that ties the threshold (a line at the mean
    # for kappa 0, or every line of a constant head) can land a few ulps either side of it in floating point, so a
    # line must pass it by more than that rounding to count
    rounding = 64 * torch.finfo(means.dtype).eps * top.abs().clamp(min=1.0)
    value = torch.where(means > threshold + rounding, means - top, -torch.inf)
    big = line_keys(direction, M, N, shift) - low
    on_a_line = (big >= 0) & (big < means.shape[1])
    picked = value[:, big.clamp(0, means.shape[1] - 1)]
    return torch.where(on_a_line, picked, -torch.inf)


def calibrate(
    attn: Float[Tensor, "head m n"],
    shape: tuple[int, int],
    *,
    kappa: float,
    directions: Sequence[LineDirection] = LINE_DIRECTIONS,
) -> Float[Tensor, "head M N"]:
    """Algorithm 1 of Duan & Shi (2023): the `[head, M, N]` bias calibrated from an averaged attention block.

    `attn`: `[head, m, n]` float, e.g. the last layer's attention averaged over correctly answered samples;
    `shape`: `(M, N)` of the bias, at least `(m, n)`; `kappa`: the threshold in standard deviations; `directions`:
    any of "diagonal", "anti-diagonal", "vertical". Per head and direction, `d_l` is the mean of `attn` over the
    elements of line `l` inside `[m, n]`, `mu` and `sigma` the mean and population standard deviation of those
    `d_l`; line `l` is kept when `d_l > mu + kappa * sigma`, and every `(i, j)` of `[M, N]` on it gets
    `d_l - max_l d_l`. Directions merge by maximum; -inf marks elements on no kept line; a head with no kept line
    at all gets zeros (no bias)."""
    if attn.ndim != 3 or not attn.is_floating_point():
        raise ValueError(f"attn must be a float tensor [head, m, n], got {tuple(attn.shape)} {attn.dtype}")
    M, N = (int(x) for x in shape)
    m, n = attn.shape[1:]
    if M < m or N < n or m < 1 or n < 1:
        raise ValueError(f"shape {(M, N)} must be at least the attention block's {(m, n)}")
    if not directions or any(d not in LINE_DIRECTIONS for d in directions):
        raise ValueError(f"directions must be a non-empty subset of {LINE_DIRECTIONS}, got {tuple(directions)}")
    if not torch.isfinite(attn).all():
        raise ValueError("attn must be finite")
    bias = torch.stack([_direction_bias(attn, (M, N), kappa, d) for d in dict.fromkeys(directions)]).amax(0)
    transparent = torch.isinf(bias).all(-1).all(-1)
    bias[transparent] = 0.0
    return bias


def padded_blocks(batch) -> tuple[Tensor, Tensor, Tensor]:
    """(target rows, prompt columns, target columns) of a batch in one padded layout, as position indices.

    The decoder-only form of the paper's two attention blocks: the rows that predict a target token (the last prompt
    position, every target character but the last, and the last one's row when EOS is a target, i.e. not for an
    open-ended task such as successor: the rows the model is trained on); the "cross-attention" block
    is those rows x the prompt's characters before its final separator (the operands, the encoder's input), the
    "self-attention" block those rows x the same positions (the separator in the role of the decoder's start token,
    then the target characters, as a decoder reads its own inputs). ValueError unless every sample has the same
    prompt length and text length (the padded layout's point: positions never move)."""
    shapes = {(s.prompt_len, len(s.text)) for s in batch.samples}
    if len(shapes) != 1:
        raise ValueError(f"the samples must share one padded layout (prompt and text length), got {sorted(shapes)}")
    from ..batching import scores_eos

    sample = batch.samples[0]
    sep = batch.offset + sample.prompt_len - 1
    eos = batch.tokens.shape[1] > batch.offset + len(sample.text) and scores_eos(sample)
    rows = torch.arange(sep, sep + len(sample.target) + int(eos))
    return rows, torch.arange(batch.offset, sep), rows.clone()
