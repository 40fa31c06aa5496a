"""Additive reinforcement of reference attention on the post-softmax pattern, per batch element, KV-cache aware.

Spiegel et al. 2025, Appendix F."""
from __future__ import annotations

from typing import Iterable, Sequence, Unpack

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ._rows import Crop, check_gate, check_rows, edit_rows
from ._stream import pattern_name
from ._validate import (
    check_delta,
    check_fits,
    check_heads,
    check_mask,
    check_model_heads,
    check_strength,
    check_threshold,
    head_index,
    model_dtype,
)
from .masks import shift_mask
from .options import ReinforceOptions, ReinforceSettings, merge


def _edit_(
    pattern: Float[Tensor, "batch head q k"],
    heads: Tensor,
    mask: Bool[Tensor, "batch q k"],
    strength: float,
    options: ReinforceOptions,
    keep: Bool[Tensor, "batch n_heads q"] | None = None,
) -> Tensor:
    """Edit `pattern` in place on `heads`, touching only rows that have references (and, per head, `keep`), with
    `options`' threshold and renormalisation (checked already)."""
    threshold, renormalize = options.threshold, options.renormalize
    rb, rq = mask.any(-1).nonzero(as_tuple=True)  # rows with references: [r]
    if rb.numel() == 0:
        return pattern
    at = (rb[:, None], heads[None, :], rq[:, None])  # broadcast to [r, n_heads]
    rows = pattern[at]  # [r, n_heads, k] (a copy)
    add = mask[rb, rq][:, None, :].expand_as(rows)  # [r, n_heads, k]
    if keep is not None:
        add = add & keep[rb, :, rq][..., None]
    if threshold is not None:
        add = add & (rows > threshold)  # gate on the original value
    new = rows + add.to(rows.dtype) * strength
    if renormalize and strength != 0:  # with C = 0 nothing is edited, nothing renormalized
        total = new.sum(-1, keepdim=True)
        fix = add.any(-1, keepdim=True) & (total != 0)  # only edited rows; zero rows stay zero
        new = torch.where(fix, new / torch.where(fix, total, torch.ones_like(total)), new)
    pattern[at] = new
    return pattern


def edit_pattern(
    pattern: Float[Tensor, "batch head q k"],
    mask: Bool[Tensor, "batch q k"],
    strength: float,
    threshold: float | None = None,
    renormalize: bool = False,
) -> Float[Tensor, "batch head q k"]:
    """Pure reinforcement edit of every head: A' = A + C·M (where A > τ), rows optionally renormalized; a copy."""
    strength = check_strength(strength, pattern.dtype, pattern.shape[-1])
    threshold, mask = check_threshold(threshold), check_mask(mask)
    heads = torch.arange(pattern.shape[1], device=pattern.device)
    return _edit_(pattern.clone(), heads, mask.to(pattern.device).expand(pattern.shape[0], *mask.shape[-2:]),
                  strength, ReinforceOptions(threshold=threshold, renormalize=renormalize))


def reinforce(
    heads: Iterable[Sequence[int]],
    mask: Bool[Tensor, "batch pos pos"],
    strength: float,
    *,
    delta: int = 0,
    model=None,
    options: ReinforceOptions | None = None,
    **settings: Unpack[ReinforceSettings],
) -> list[tuple[str, object]]:
    """Hooks adding `strength` to each selected head's attention on its references (shifted by `delta`).

    Additive reinforcement of Spiegel et al. 2025 (Appendix F): A' = A + C·M (where A > `threshold`), rows optionally
    renormalised. `mask` is [batch, pos, pos] (or [pos, pos] for every element) for the full length; under a KV
    cache the pattern [b, h, q_new, k_total] is edited on query rows k_total-q_new … k_total-1. Failure gates:
    `rows` (bool [batch, pos], e.g. `rows_beyond`) restricts the edited rows; `gate_below` edits a head's row only
    where that head's attention on the (shifted) references is below τ. Pass `model` to check heads up front.
    `threshold`, `renormalize`, `rows` and `gate_below` are the fields of `hooks.ReinforceOptions`: pass them as
    `options=` or as keywords.

    Shapes:
        mask: bool [batch, pos, pos] or [pos, pos].
        rows: bool [batch, pos] or None.
        returns: a list of `(hook name, function)` on `hook_pattern`.

    Example:
        >>> import torch
        >>> import hooks
        >>> from transformer_lens import HookedTransformer
        >>> model = HookedTransformer(dict(n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=16, d_vocab=10,
        ...                                act_fn="relu", seed=0))  # a tiny random model, 2 layers x 2 heads
        >>> tokens = torch.tensor([[0, 3, 4, 5, 2, 5, 4, 3]])  # one sequence of 8 tokens [batch, pos]
        >>> mask = torch.zeros(1, 8, 8, dtype=torch.bool)  # references [batch, pos, pos], row = query
        >>> mask[0, [4, 5, 6], [3, 2, 1]] = True  # rows 4, 5, 6 read columns 3, 2, 1 (a reversal)
        >>> fwd = hooks.reinforce([(1, 0)], mask, strength=0.3)
        >>> before = hooks.capture(model, tokens, [(1, 0)])[(1, 0)]
        >>> after = hooks.capture(model, tokens, [(1, 0)], fwd_hooks=fwd)[(1, 0)]
        >>> round(float(after[0, 5, 2] - before[0, 5, 2]), 4)
        0.3
    """
    options = merge(options, settings, ReinforceOptions, "reinforce")
    sel = check_model_heads(model, check_heads(heads))
    strength = check_strength(strength, model_dtype(model))
    edit = ReinforceOptions(threshold=check_threshold(options.threshold), renormalize=options.renormalize)
    gate_below = check_gate(options.gate_below)
    crop = Crop(shift_mask(check_mask(mask), check_delta(delta)), check_rows(options.rows))

    def make(layer: int, hs: list[int]):
        def hook(pattern: Tensor, hook) -> Tensor:
            b, _, q, k = pattern.shape
            check_fits(strength, pattern.dtype, k)  # the pattern's own dtype and row length (a scalar check)
            idx = head_index(pattern, layer, hs)
            refs, allowed = crop(b, q, k, pattern.device)
            keep = None
            if allowed is not None or gate_below is not None:
                keep = edit_rows(pattern[:, idx], refs, allowed, gate_below)
            return _edit_(pattern, idx, refs, strength, edit, keep)

        return hook

    return [(pattern_name(layer), make(layer, hs)) for layer, hs in sorted(by_layer(sel).items())]


def by_layer(sel: list[tuple[int, int]]) -> dict[int, list[int]]:
    """(layer, head) pairs grouped as {layer: [head, ...]}."""
    out: dict[int, list[int]] = {}
    for layer, head in sel:
        out.setdefault(layer, []).append(head)
    return out
