"""Per-head attention mass on reference sets, computed layer by layer inside the forward.

The head ranking of Spiegel et al. 2025, §5.2."""
from __future__ import annotations

from typing import Iterable, Sequence, Unpack

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ._stream import chunk_size, map_chunks, prepare, stream
from ._validate import as_batch, check_attention_mask, check_columns, check_delta, check_heads, check_mask
from .masks import shift_mask, target_rows
from .options import OffsetOptions, OffsetSettings, Reduce, ScoreOptions, ScoreSettings, merge


def _row_mass(
    model, tokens: Tensor, masks: list[Tensor], layers: list[int], attention_mask: Tensor | None,
    columns: Tensor | None = None,
) -> Float[Tensor, "n_masks layer batch q head"]:
    """Mass of every head's rows on each mask's references, gathered at the mask's non-zeros only (O(refs·heads));
    divided by each row's mass on `columns` when given (0 where that mass is 0)."""
    tokens, attention_mask = prepare(model, tokens, attention_mask)
    b, pos = tokens.shape
    device = tokens.device
    idx = [m.to(device).nonzero(as_tuple=True) for m in masks]  # (batch, q, k) per mask
    out = torch.zeros(len(masks), len(layers), b, pos, model.cfg.n_heads, device=device)
    denom = None if columns is None else torch.zeros(len(layers), b, pos, model.cfg.n_heads, device=device)
    cols = None if columns is None else columns.to(device)
    slot = {layer: i for i, layer in enumerate(layers)}

    def fold(layer: int, pattern: Tensor) -> None:
        for j, (bi, qi, ki) in enumerate(idx):
            vals = pattern[bi, :, qi, ki].float()  # [refs, head]
            out[j, slot[layer]].index_put_((bi, qi), vals, accumulate=True)
        if denom is not None:
            denom[slot[layer]] = torch.einsum("bhqk,bk->bqh", pattern.float(), cols.float())

    stream(model, tokens, fold, layers, attention_mask)
    if denom is not None:
        ok = denom > 0
        out = torch.where(ok, out / torch.where(ok, denom, torch.ones_like(denom)), torch.zeros_like(out))
    if attention_mask is not None:  # pad rows score nothing
        out *= attention_mask.bool()[None, None, :, :, None]
    return out


def head_row_scores(
    model,
    tokens: Tensor,
    mask: Bool[Tensor, "batch pos pos"],
    heads: Iterable[Sequence[int]] | None = None,
    attention_mask: Tensor | None = None,
    *,
    options: ScoreOptions | None = None,
    **settings: Unpack[ScoreSettings],
) -> Tensor:
    """Per row and head, AttnScore on the row's references: [batch, q, n_selected], or [batch, q, layer, head].

    The mass on the references over the mass on `columns` (True on the denominator's columns, e.g.
    `Batch.sample_columns` for the paper's `sample` convention), or over the whole row (`raw`) with None.
    `batch_size` samples go through each forward (None: chosen to bound the pattern-sized temporaries). Both are the
    fields of `hooks.ScoreOptions`: pass them as `options=` or as keywords.

    Shapes:
        tokens: [batch, pos].
        mask: bool [batch, pos, pos].
        columns: bool [batch, pos] or None.
        returns: [batch, q, layer, head], or [batch, q, n_selected] with `heads`; NaN on rows without references.

    Example:
        >>> import torch
        >>> import hooks
        >>> from transformer_lens import HookedTransformer
        >>> model = HookedTransformer(dict(n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=16, d_vocab=10,
        ...                                act_fn="relu", seed=0))  # a tiny random model, 2 layers x 2 heads
        >>> tokens = torch.tensor([[0, 3, 4, 5, 2, 5, 4, 3]])  # one sequence of 8 tokens [batch, pos]
        >>> mask = torch.zeros(1, 8, 8, dtype=torch.bool)  # references [batch, pos, pos], row = query
        >>> mask[0, [4, 5, 6], [3, 2, 1]] = True  # rows 4, 5, 6 read columns 3, 2, 1 (a reversal)
        >>> tuple(hooks.head_row_scores(model, tokens, mask).shape)
        (1, 8, 2, 2)
    """
    options = merge(options, settings, ScoreOptions, "head_row_scores")
    tokens = as_batch(tokens)
    mask = check_mask(mask, tokens)
    check_attention_mask(attention_mask, tokens)
    columns = check_columns(options.columns, tokens)
    size = chunk_size(model, tokens, options.batch_size)
    cfg = model.cfg
    sel = None if heads is None else check_heads(heads, cfg.n_layers, cfg.n_heads)
    layers = list(range(cfg.n_layers)) if sel is None else sorted({layer for layer, _ in sel})
    parts = map_chunks(lambda t, m, am, c: _row_mass(model, t, [m], layers, am, c)[0],
                       size, tokens, mask, attention_mask, columns)
    out = torch.cat(parts, dim=1)  # [layer, batch, q, head]
    if sel is None:
        return out.permute(1, 2, 0, 3)  # [batch, q, layer, head]
    slot = {layer: i for i, layer in enumerate(layers)}
    return torch.stack([out[slot[layer], :, :, head] for layer, head in sel], dim=-1)


def _check_reduce(reduce: str) -> None:
    if reduce not in ("sum", "row"):
        raise ValueError(f"reduce must be 'sum' (paper's score) or 'row' (mean fraction per target row), "
                         f"got {reduce!r}")


def _scores(
    model, tokens: Tensor, mask: Tensor, deltas: list[int], attention_mask: Tensor | None, options: OffsetOptions
) -> Float[Tensor, "delta layer head"]:
    """Mass on references shifted by each δ, summed over the (unshifted) target rows chunk by chunk; "row" divides
    the total by the number of target rows (a mean over all rows, not a mean of chunk means)."""
    reduce = options.reduce
    _check_reduce(reduce)
    tokens = as_batch(tokens)
    mask = check_mask(mask, tokens)
    check_attention_mask(attention_mask, tokens)
    columns = check_columns(options.columns, tokens)
    size = chunk_size(model, tokens, options.batch_size)
    rows = target_rows(mask, attention_mask)
    if not bool(rows.any()):
        raise ValueError("mask selects no reference on any (real) row: nothing to score")

    def part(t: Tensor, m: Tensor, r: Tensor, am: Tensor | None, c: Tensor | None) -> Tensor:
        out = _row_mass(model, t, [shift_mask(m, d) for d in deltas], list(range(model.cfg.n_layers)), am, c)
        return out.permute(0, 2, 3, 1, 4)[:, r.to(out.device)].sum(1)  # [delta, n_rows, layer, head] -> sum of rows

    total = sum(map_chunks(part, size, tokens, mask, rows, attention_mask, columns))
    return total if reduce == "sum" else total / rows.sum().to(total.device)


def head_scores(
    model,
    tokens: Tensor,
    mask: Bool[Tensor, "batch pos pos"],
    reduce: Reduce = "sum",
    attention_mask: Tensor | None = None,
    *,
    options: ScoreOptions | None = None,
    **settings: Unpack[ScoreSettings],
) -> Float[Tensor, "layer head"]:
    """Head ranking score: mass on references summed over target rows and batch ("sum"), or mean per target row ("row").

    Each row's mass is divided by its mass on `columns` when given (the `sample` convention; None: `raw`). `batch_size`
    samples go through each forward (None: chosen to bound the pattern-sized temporaries). Both are the fields of
    `hooks.ScoreOptions`: pass them as `options=` or as keywords.

    Shapes:
        tokens: [batch, pos].
        mask: bool [batch, pos, pos].
        columns: bool [batch, pos] or None.
        returns: [layer, head].

    Example:
        >>> import torch
        >>> import hooks
        >>> from transformer_lens import HookedTransformer
        >>> model = HookedTransformer(dict(n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=16, d_vocab=10,
        ...                                act_fn="relu", seed=0))  # a tiny random model, 2 layers x 2 heads
        >>> tokens = torch.tensor([[0, 3, 4, 5, 2, 5, 4, 3]])  # one sequence of 8 tokens [batch, pos]
        >>> mask = torch.zeros(1, 8, 8, dtype=torch.bool)  # references [batch, pos, pos], row = query
        >>> mask[0, [4, 5, 6], [3, 2, 1]] = True  # rows 4, 5, 6 read columns 3, 2, 1 (a reversal)
        >>> tuple(hooks.head_scores(model, tokens, mask, reduce="row").shape)
        (2, 2)
    """
    options = merge(options, settings, ScoreOptions, "head_scores")
    offset = OffsetOptions(reduce=reduce, columns=options.columns, batch_size=options.batch_size)
    return _scores(model, tokens, mask, [0], attention_mask, offset)[0]


def offset_scores(
    model,
    tokens: Tensor,
    mask: Bool[Tensor, "batch pos pos"],
    deltas: Iterable[int] = range(-2, 4),
    attention_mask: Tensor | None = None,
    *,
    options: OffsetOptions | None = None,
    **settings: Unpack[OffsetSettings],
) -> Float[Tensor, "delta layer head"]:
    """Head scores for references shifted by each δ (column k+δ), in one pass; rows are the unshifted target rows.

    `columns`: the AttnScore denominator as in `head_row_scores` (None: the whole row). `reduce` ("row": the mean per
    target row; "sum"), `columns` and `batch_size` are the fields of `hooks.OffsetOptions`: pass them as `options=`
    or as keywords.

    Shapes:
        tokens: [batch, pos].
        mask: bool [batch, pos, pos].
        columns: bool [batch, pos] or None.
        returns: [delta, layer, head], in the order of `deltas`.

    Example:
        >>> import torch
        >>> import hooks
        >>> from transformer_lens import HookedTransformer
        >>> model = HookedTransformer(dict(n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=16, d_vocab=10,
        ...                                act_fn="relu", seed=0))  # a tiny random model, 2 layers x 2 heads
        >>> tokens = torch.tensor([[0, 3, 4, 5, 2, 5, 4, 3]])  # one sequence of 8 tokens [batch, pos]
        >>> mask = torch.zeros(1, 8, 8, dtype=torch.bool)  # references [batch, pos, pos], row = query
        >>> mask[0, [4, 5, 6], [3, 2, 1]] = True  # rows 4, 5, 6 read columns 3, 2, 1 (a reversal)
        >>> tuple(hooks.offset_scores(model, tokens, mask, deltas=[-1, 0, 1]).shape)
        (3, 2, 2)
    """
    options = merge(options, settings, OffsetOptions, "offset_scores")
    deltas = [check_delta(d) for d in deltas]
    if not deltas:
        raise ValueError("deltas is empty")
    return _scores(model, tokens, mask, deltas, attention_mask, options)
