"""Attention rollout, folded layer by layer inside the forward: O(batch·pos²) extra memory.

Spiegel et al. 2025, Eq. 2, after Abnar & Zuidema 2020."""
from __future__ import annotations

from typing import Unpack

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ._stream import chunk_size, map_chunks, prepare, stream
from ._validate import as_batch, check_attention_mask, check_columns, check_flag, check_mask
from .masks import share
from .options import ScoreOptions, ScoreSettings, merge

BLOCK = 256  # row block of the triangular product


def rollout_step(
    R: Float[Tensor, "batch q q"] | None, A: Float[Tensor, "batch q q"], normalize: bool = True, causal: bool = True
) -> Float[Tensor, "batch q q"]:
    """R ← Â·R with Â = A + I (rows divided by their sum when `normalize`); in place on R; R=None starts at Â."""
    check_flag("normalize", normalize)
    check_flag("causal", causal)
    s = A.sum(-1, keepdim=True) + 1 if normalize else None  # row sums of Â, >= 1
    if R is None:
        A.diagonal(dim1=-2, dim2=-1).add_(1)
        return A.div_(s) if normalize else A
    q = A.shape[-1]
    if not causal:
        new = torch.baddbmm(R, A, R)
        return R.copy_(new.div_(s) if normalize else new)
    # Lower-triangular A and R: row block [a:b) of A·R only needs A[a:b, :b] and R[:b, :b]; going bottom-up
    # keeps the rows still needed intact, so R is updated in place with ~1/3 of a dense product's work.
    for start in reversed(range(0, q, BLOCK)):
        stop = min(start + BLOCK, q)
        new = torch.baddbmm(R[:, start:stop, :stop], A[:, start:stop, :stop], R[:, :stop, :stop])
        R[:, start:stop, :stop] = new.div_(s[:, start:stop]) if normalize else new
    return R


def _rollout(model, tokens: Tensor, normalize: bool, attention_mask: Tensor | None) -> Float[Tensor, "batch pos pos"]:
    """One forward's rollout, folded layer by layer."""
    tokens, attention_mask = prepare(model, tokens, attention_mask)
    causal = getattr(model.cfg, "attention_dir", "causal") == "causal"
    state: dict[str, Tensor | None] = {"R": None}

    def fold(layer: int, pattern: Tensor) -> None:
        dtype = torch.float64 if pattern.dtype == torch.float64 else torch.float32
        A = pattern.mean(1, dtype=dtype)  # [batch, q, k]
        state["R"] = rollout_step(state["R"], A, normalize, causal)

    stream(model, tokens, fold, list(range(model.cfg.n_layers)), attention_mask)
    R = state["R"]
    if attention_mask is not None:
        R *= attention_mask.bool()[:, :, None]
    return R


def rollout(
    model,
    tokens: Tensor,
    normalize: bool = True,
    attention_mask: Tensor | None = None,
    *,
    batch_size: int | None = None,
) -> Float[Tensor, "batch pos pos"]:
    """Attention rollout R_L = Â_L ⋯ Â_1 with Â_l = mean_h A_{l,h} + I (rows normalized by default); pad rows are 0.

    `batch_size` samples go through each forward (None: chosen to bound the pattern-sized temporaries).

    Shapes:
        tokens: [batch, pos].
        attention_mask: [batch, pos] or None.
        returns: [batch, pos, pos], row = query position.

    Example:
        >>> R = hooks.rollout(model, tokens)
        >>> tuple(R.shape), bool(torch.allclose(R.sum(-1), torch.ones(1, 8)))
        ((1, 8, 8), True)
    """
    check_flag("normalize", normalize)
    tokens = as_batch(tokens)
    check_attention_mask(attention_mask, tokens)
    size = chunk_size(model, tokens, batch_size)
    return torch.cat(map_chunks(lambda t, am: _rollout(model, t, normalize, am), size, tokens, attention_mask))


def rollout_scores(
    model,
    tokens: Tensor,
    mask: Bool[Tensor, "batch pos pos"],
    attention_mask: Tensor | None = None,
    *,
    normalize: bool = True,
    options: ScoreOptions | None = None,
    **settings: Unpack[ScoreSettings],
) -> Float[Tensor, "batch q"]:
    """Per-row AttnScore of the rollout (0 on rows without references), chunk by chunk.

    The mass of R on each row's references, divided by its mass on `columns` (True on the denominator's columns, e.g.
    `Batch.sample_columns` for the paper's `sample` convention) or, with None, by the whole row (`raw`). `columns`
    and `batch_size` (samples per forward) are the fields of `hooks.ScoreOptions`: pass them as `options=` or as
    keywords.

    Shapes:
        tokens: [batch, pos].
        mask: bool [batch, pos, pos].
        columns: bool [batch, pos] or None.
        returns: [batch, q].

    Example:
        >>> tuple(hooks.rollout_scores(model, tokens, mask).shape)
        (1, 8)
    """
    options = merge(options, settings, ScoreOptions, "rollout_scores")
    check_flag("normalize", normalize)
    tokens = as_batch(tokens)
    mask = check_mask(mask, tokens)
    check_attention_mask(attention_mask, tokens)
    columns = check_columns(options.columns, tokens)
    size = chunk_size(model, tokens, options.batch_size)

    def part(t: Tensor, m: Tensor, am: Tensor | None, cols: Tensor | None) -> Tensor:
        R = _rollout(model, t, normalize, am)
        return share(R, m.to(R.device), cols)

    return torch.cat(map_chunks(part, size, tokens, mask, attention_mask, columns))
