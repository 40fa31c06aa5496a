"""Per-head attention mass on reference sets, computed layer by layer inside the forward (SPEC 5-6 head ranking)."""
from __future__ import annotations

from typing import Iterable, Literal, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ._stream import prepare, stream
from ._validate import check_heads, check_mask
from .masks import shift_mask, target_rows


def _row_mass(
    model, tokens: Tensor, masks: list[Tensor], layers: list[int], attention_mask: Tensor | None
) -> Float[Tensor, "n_masks layer batch q head"]:
    """Mass of every head's rows on each mask's references, gathered at the mask's non-zeros only (O(refs·heads))."""
    tokens, attention_mask = prepare(model, tokens, attention_mask)
    b, pos = tokens.shape
    device = tokens.device
    idx = [m.to(device).nonzero(as_tuple=True) for m in masks]  # (batch, q, k) per mask
    out = torch.zeros(len(masks), len(layers), b, pos, model.cfg.n_heads, device=device)
    slot = {layer: i for i, layer in enumerate(layers)}

    def fold(layer: int, pattern: Tensor) -> None:
        for j, (bi, qi, ki) in enumerate(idx):
            vals = pattern[bi, :, qi, ki].float()  # [refs, head]
            out[j, slot[layer]].index_put_((bi, qi), vals, accumulate=True)

    stream(model, tokens, fold, layers, attention_mask)
    if attention_mask is not None:  # pad rows score nothing
        out *= attention_mask.bool()[None, None, :, :, None]
    return out


def head_row_scores(
    model,
    tokens: Tensor,
    mask: Bool[Tensor, "batch pos pos"],
    heads: Iterable[Sequence[int]] | None = None,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """Per row and head, attention mass on the row's references: [batch, q, n_selected], or [batch, q, layer, head]."""
    mask = check_mask(mask, tokens)
    cfg = model.cfg
    if heads is None:
        out = _row_mass(model, tokens, [mask], list(range(cfg.n_layers)), attention_mask)[0]
        return out.permute(1, 2, 0, 3)  # [batch, q, layer, head]
    sel = check_heads(heads, cfg.n_layers, cfg.n_heads)
    layers = sorted({layer for layer, _ in sel})
    out = _row_mass(model, tokens, [mask], layers, attention_mask)[0]
    slot = {layer: i for i, layer in enumerate(layers)}
    return torch.stack([out[slot[layer], :, :, head] for layer, head in sel], dim=-1)


def _reduce(row: Float[Tensor, "batch q layer head"], rows: Bool[Tensor, "batch q"], reduce: str) -> Tensor:
    picked = row[rows.to(row.device)]  # [n_rows, layer, head]
    return picked.sum(0) if reduce == "sum" else picked.mean(0)


def _check_reduce(reduce: str) -> None:
    if reduce not in ("sum", "row"):
        raise ValueError(f"reduce must be 'sum' (paper's score) or 'row' (mean fraction per target row), got {reduce!r}")


def _rows_or_fail(mask: Tensor, attention_mask: Tensor | None) -> Tensor:
    rows = target_rows(mask, attention_mask)
    if not bool(rows.any()):
        raise ValueError("mask selects no reference on any (real) row: nothing to score")
    return rows


def head_scores(
    model,
    tokens: Tensor,
    mask: Bool[Tensor, "batch pos pos"],
    reduce: Literal["sum", "row"] = "sum",
    attention_mask: Tensor | None = None,
) -> Float[Tensor, "layer head"]:
    """Head ranking score: mass on references summed over target rows and batch ("sum"), or mean per target row ("row")."""
    _check_reduce(reduce)
    mask = check_mask(mask, tokens)
    rows = _rows_or_fail(mask, attention_mask)
    row = head_row_scores(model, tokens, mask, attention_mask=attention_mask)
    return _reduce(row, rows, reduce)


def offset_scores(
    model,
    tokens: Tensor,
    mask: Bool[Tensor, "batch pos pos"],
    deltas: Iterable[int] = range(-2, 4),
    attention_mask: Tensor | None = None,
    reduce: Literal["sum", "row"] = "row",
) -> Float[Tensor, "delta layer head"]:
    """Head scores for references shifted by each δ (column k+δ, SPEC 6), in one forward; rows are the unshifted target rows."""
    _check_reduce(reduce)
    deltas = [int(d) for d in deltas]
    if not deltas:
        raise ValueError("deltas is empty")
    mask = check_mask(mask, tokens)
    if mask.ndim == 2:
        mask = mask.expand(tokens.shape[0] if tokens.ndim == 2 else 1, *mask.shape)
    rows = _rows_or_fail(mask, attention_mask)
    masks = [shift_mask(mask, d) for d in deltas]
    out = _row_mass(model, tokens, masks, list(range(model.cfg.n_layers)), attention_mask)
    return torch.stack([_reduce(o.permute(1, 2, 0, 3), rows, reduce) for o in out])
