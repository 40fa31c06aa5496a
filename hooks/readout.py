"""Per-row readout of every head's attention: the mass on the row's (shifted) references, the key the row attends to
most, and that key's offset from the nearest reference; computed inside the forward, layer by layer, without keeping
a pattern (one forward reads every head).

The failure anatomy of one sample or of many lengths (`aspan.anatomy`) is built on it."""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ._stream import pattern_name
from ._validate import Head, check_delta, check_mask
from .capture import _heads
from .masks import query_rows, shift_mask

Readout = dict[str, Tensor]  # "mass" [.., q] float, "top" [.., q] long, "offset" [.., q] float


def row_readout(
    pattern: Float[Tensor, "batch head q k"],
    mask: Bool[Tensor, "batch pos pos"],
    delta: int = 0,
    columns: Bool[Tensor, "batch k"] | None = None,
) -> Readout:
    """Per head and row: `mass` on the references shifted by `delta` (over the mass on `columns`, or the whole row
    with None), `top` (the key with the most attention; the first on a tie) and `offset` (`top` minus the nearest
    unshifted reference; on a tie the reference left of `top`, a positive offset).

    Rows without references get NaN `mass` and `offset` (they are not scored); `top` is defined on every row. A row
    whose references the shift moves out of the causal part (all of them) has NaN `mass` too: there is nothing to
    read there. The pattern may hold the last `q` of `k`
    positions (as under a KV cache); `mask` is built for the full length.

    Shapes:
        pattern: [batch, head, q, k], one layer's post-softmax attention.
        mask: bool [batch, pos, pos] (or [pos, pos]), row = query position.
        columns: bool [batch, k] or None.
        returns: {"mass": float [batch, head, q], "top": long [batch, head, q], "offset": float [batch, head, q]}.

    Example:
        >>> import torch
        >>> import hooks
        >>> mask = torch.zeros(1, 8, 8, dtype=torch.bool)  # references [batch, pos, pos], row = query
        >>> mask[0, [4, 5, 6], [3, 2, 1]] = True  # rows 4, 5, 6 read columns 3, 2, 1 (a reversal)
        >>> A = torch.full((1, 2, 8, 8), 0.1).tril()  # [batch, head, q, k]
        >>> A[0, 0, 5, 4] = 0.5  # head 0, row 5: most attention on key 4; row 5's reference is key 2
        >>> out = hooks.row_readout(A, mask, delta=2)
        >>> out["top"][0, 0, 5].item(), out["offset"][0, 0, 5].item(), round(out["mass"][0, 0, 5].item(), 2)
        (4, 2.0, 0.5)
    """
    b, _, q, k = pattern.shape
    mask = check_mask(mask)
    m = mask.to(pattern.device)
    m = query_rows(m.expand(b, *m.shape) if m.ndim == 2 else m, q, k)
    a = pattern.float()
    shifted = shift_mask(m, check_delta(delta)) if delta else m  # shift_mask clips to the causal part of q rows
    mass = torch.einsum("bhqk,bqk->bhq", a, shifted.float())
    if columns is not None:
        denom = torch.einsum("bhqk,bk->bhq", a, columns.to(a.device).float())
        ok = denom > 0
        mass = torch.where(ok, mass / torch.where(ok, denom, torch.ones_like(denom)), torch.zeros_like(mass))
    has = m.any(-1)[:, None, :]  # [b, 1, q]: rows with references
    top = a.argmax(-1)  # [b, h, q]
    keys = torch.arange(k, device=a.device)
    dist = (keys - top[..., None]).abs().float()  # [b, h, q, k]
    dist = torch.where(m[:, None], dist, torch.full_like(dist, float("inf")))
    nearest = dist.argmin(-1)  # the first minimum: the reference left of `top` on a tie
    nan = torch.full_like(mass, float("nan"))
    return {"mass": torch.where(shifted.any(-1)[:, None, :], mass, nan), "top": top,
            "offset": torch.where(has, (top - nearest).float(), nan)}


def readout_hooks(
    heads: Iterable[Sequence[int]] | int | Sequence[int],
    store: dict,
    mask: Bool[Tensor, "batch pos pos"],
    *,
    delta: int = 0,
    columns: Bool[Tensor, "batch pos"] | None = None,
    model=None,
) -> list[tuple[str, object]]:
    """Hooks that put each selected head's `row_readout` into `store[(layer, head)]` at every forward (the pattern
    itself is not kept). `heads`: (layer, head) pairs, or layers meaning all their heads (then `model` is needed).
    Hooks run in the order given, so edits listed before these are read through.

    Shapes:
        mask: bool [batch, pos, pos] for the full length.
        columns: bool [batch, pos] or None.
        store: filled with `{(layer, head): {"mass": [batch, q], "top": [batch, q], "offset": [batch, q]}}`.
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
        >>> store = {}
        >>> _ = model.run_with_hooks(tokens, fwd_hooks=hooks.readout_hooks([(1, 0)], store, mask))
        >>> sorted(store[(1, 0)]), tuple(store[(1, 0)]["top"].shape)
        (['mass', 'offset', 'top'], (1, 8))
    """
    cfg = getattr(model, "cfg", None)
    sel: list[Head] = _heads(heads, getattr(cfg, "n_layers", None), getattr(cfg, "n_heads", None))
    mask, delta = check_mask(mask), check_delta(delta)
    by_layer: dict[int, list[int]] = {}
    for layer, head in sel:
        by_layer.setdefault(layer, []).append(head)

    def make(layer: int, hs: list[int]):
        def hook(pattern: Tensor, hook) -> None:
            if max(hs) >= pattern.shape[1]:
                raise ValueError(f"head {(layer, max(hs))} out of range: layer {layer} has {pattern.shape[1]} heads")
            idx = torch.tensor(hs, device=pattern.device)
            out = row_readout(pattern.detach().index_select(1, idx), mask, delta, columns)
            for i, h in enumerate(hs):
                store[(layer, h)] = {name: value[:, i] for name, value in out.items()}

        return hook

    return [(pattern_name(layer), make(layer, hs)) for layer, hs in sorted(by_layer.items())]

