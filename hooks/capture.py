"""Capture per-head attention patterns of chosen heads, cropped to chosen rows and columns (circuitsvis, notebooks)."""
from __future__ import annotations

from typing import Iterable, Sequence, Unpack

import torch
from jaxtyping import Float
from torch import Tensor

from ._stream import pattern_name, prepare
from ._validate import Head, check_heads, check_index, check_index_fits, check_layers
from .options import CaptureOptions, CaptureSettings, Index, merge


def _heads(spec, n_layers: int | None, n_heads: int | None) -> list[Head]:
    """(layer, head) pairs from a list of pairs, or every head of a layer / list of layers."""
    if isinstance(spec, int) or (isinstance(spec, (list, tuple)) and spec and all(isinstance(x, int) for x in spec)):
        if n_heads is None:
            raise ValueError("selecting whole layers needs a model (to know n_heads)")
        return [(layer, h) for layer in check_layers(spec, n_layers) for h in range(n_heads)]
    return check_heads(spec, n_layers, n_heads)


def _crop(x: Tensor, rows: Index, cols: Index) -> Tensor:
    """`x` [..., q, k] cropped to `rows` and `cols` (checked by `check_index`)."""
    for dim, index in ((-2, rows), (-1, cols)):
        if isinstance(index, slice):
            x = x[..., index, :] if dim == -2 else x[..., index]
        elif index is not None:  # positions (an empty list too: long, not float)
            x = x.index_select(dim, torch.as_tensor(index, dtype=torch.long, device=x.device))
    return x


def capture_hooks(
    heads: Iterable[Sequence[int]] | int | Sequence[int],
    store: dict,
    rows: Index = None,
    cols: Index = None,
    model=None,
) -> list[tuple[str, object]]:
    """Hooks that copy each selected head's pattern [batch, q, k] (cropped) into `store[(layer, head)]` per call.

    Shapes:
        store: filled with `{(layer, head): [batch, q, k]}` at every forward.
        returns: a list of `(hook name, function)` on `hook_pattern`.

    Example:
        >>> store = {}
        >>> _ = model.run_with_hooks(tokens, fwd_hooks=hooks.capture_hooks([(0, 1)], store))
        >>> tuple(store[(0, 1)].shape)
        (1, 8, 8)
    """
    cfg = getattr(model, "cfg", None)
    sel = _heads(heads, getattr(cfg, "n_layers", None), getattr(cfg, "n_heads", None))
    (rows, top_row), (cols, top_col) = check_index("rows", rows), check_index("cols", cols)
    by_layer: dict[int, list[int]] = {}
    for layer, head in sel:
        by_layer.setdefault(layer, []).append(head)

    def make(layer: int, hs: list[int]):
        def hook(pattern: Tensor, hook) -> None:
            check_index_fits("rows", top_row, pattern.shape[-2])
            check_index_fits("cols", top_col, pattern.shape[-1])
            for h in hs:
                if h >= pattern.shape[1]:
                    raise ValueError(f"head {(layer, h)} out of range: layer {layer} has {pattern.shape[1]} heads")
                store[(layer, h)] = _crop(pattern[:, h].detach(), rows, cols).clone()

        return hook

    return [(pattern_name(layer), make(layer, hs)) for layer, hs in sorted(by_layer.items())]


def capture(
    model,
    tokens: Tensor,
    heads: Iterable[Sequence[int]] | int | Sequence[int],
    *,
    attention_mask: Tensor | None = None,
    fwd_hooks: list | None = None,
    options: CaptureOptions | None = None,
    **settings: Unpack[CaptureSettings],
) -> dict[Head, Float[Tensor, "batch q k"]]:
    """Patterns of `heads` (pairs, or layers meaning all their heads), cropped to the rows and columns of `options`
    (`hooks.CaptureOptions`, or its fields as keywords: `rows`, `cols`; None keeps every position); `fwd_hooks`
    (e.g. edits) run before.

    Shapes:
        tokens: [batch, pos] token ids.
        attention_mask: [batch, pos] or None.
        returns: `{(layer, head): [batch, q, k]}`, `q` and `k` cropped to `rows` and `cols`.

    Example:
        >>> patterns = hooks.capture(model, tokens, [(0, 1), (1, 0)])
        >>> sorted(patterns), tuple(patterns[(1, 0)].shape)
        ([(0, 1), (1, 0)], (1, 8, 8))
    """
    crop = merge(options, settings, CaptureOptions, "capture")
    tokens, attention_mask = prepare(model, tokens, attention_mask)
    store: dict[Head, Tensor] = {}
    fwd = list(fwd_hooks or []) + capture_hooks(heads, store, crop.rows, crop.cols, model)
    last = max(int(name.split(".")[1]) for name, _ in fwd if isinstance(name, str) and name.startswith("blocks."))
    with torch.no_grad(), model.hooks(fwd_hooks=fwd):
        model(tokens, attention_mask=attention_mask, stop_at_layer=last + 1)
    return {k: store[k] for k in sorted(store)}
