"""Pre-softmax attention biases on `hook_attn_scores` (Duan & Shi 2023): any bias, and per-offset biases.

ABS windows and ABC lines are built by `aspan.experiments.abc` and added through `attn_bias`.
"""
from __future__ import annotations

import numbers
from typing import Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from ._stream import scores_name
from ._validate import check_heads, check_layers

BiasFn = Callable[..., Tensor]  # (q_len, k_len, device=...) -> [q, k] | [head, q, k] | [batch, head, q, k]


def _query_positions(n_q: int, n_k: int, device) -> Tensor:
    """Absolute positions of the last n_q queries among n_k keys (KV-cache convention)."""
    if n_q > n_k:
        raise ValueError(f"more queries ({n_q}) than keys ({n_k})")
    return torch.arange(n_k - n_q, n_k, device=device)


def offset_bias(per_offset: Tensor | Mapping[int, float | Tensor], fill: float = 0.0) -> BiasFn:
    """A per-head bias that depends only on q − k: `per_offset[h, d]` (tensor) or `{d: value or [head]}`; `fill`
    elsewhere.

    Returns `fn(q_len, k_len, device=None) -> [head, q, k]` (or [q, k] for scalar dict values) for any length.

    Shapes:
        per_offset: [head, n_offsets] (offsets 0, 1, ...) or `{offset: value or [head]}`.
        returns: a function `(q_len, k_len, device=None)` -> [head, q, k], or [q, k] for scalar values.

    Example:
        >>> fn = hooks.offset_bias({0: 1.0})  # +1 where q - k = 0
        >>> fn(3, 3).tolist()
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    if isinstance(per_offset, Mapping):
        if not per_offset:
            raise ValueError("per_offset is empty")
        bad = [d for d in per_offset if not isinstance(d, numbers.Integral) or isinstance(d, bool)]
        if bad:  # int() would truncate 0.5 to offset 0, or parse "3"
            raise ValueError(f"per_offset keys must be integer offsets q - k, got {bad[0]!r}")
        items = sorted((int(d), torch.as_tensor(v, dtype=torch.float32)) for d, v in per_offset.items())
        if any(d < 0 for d, _ in items):
            raise ValueError("offsets q - k must be >= 0 (keys after the query are masked anyway)")
        n = items[-1][0] + 1
        shape = torch.broadcast_shapes(*(v.shape for _, v in items))
        table = torch.full((*shape, n), float(fill))
        valid = torch.zeros(n, dtype=torch.bool)
        for d, v in items:
            table[..., d] = v
            valid[d] = True
    else:
        table = torch.as_tensor(per_offset, dtype=torch.float32)
        if table.ndim not in (1, 2):
            raise ValueError(f"per_offset tensor must be [head, n_offsets] or [n_offsets], got {tuple(table.shape)}")
        valid = torch.ones(table.shape[-1], dtype=torch.bool)

    def fn(q_len: int, k_len: int, device=None) -> Tensor:
        d = _query_positions(q_len, k_len, device)[:, None] - torch.arange(k_len, device=device)[None, :]
        ok = (d >= 0) & (d < table.shape[-1])
        dc = d.clamp(0, table.shape[-1] - 1)
        ok = ok & valid.to(d.device)[dc]
        vals = table.to(d.device)[..., dc]  # [..., q, k]
        return torch.where(ok, vals, torch.full((), float(fill), device=d.device))

    return fn


def _crop_bias(bias: Tensor | BiasFn, q: int, k: int, device) -> Tensor:
    """The bias for a score block [.., q, k] whose queries are the last q positions."""
    if callable(bias):
        out = torch.as_tensor(bias(q, k, device=device), device=device)
        if tuple(out.shape[-2:]) != (q, k):
            raise ValueError(f"bias function returned shape {tuple(out.shape)}, expected [..., {q}, {k}]")
        return out
    if bias.shape[-2] < k or bias.shape[-1] < k:
        raise ValueError(f"bias {tuple(bias.shape)} covers fewer than the {k} positions of this forward: "
                         f"use a larger bias or a function of (q_len, k_len, device)")
    return bias[..., k - q : k, :k].to(device)


def attn_bias(
    bias: Tensor | BiasFn,
    layers: int | Iterable[int] | None = None,
    heads: Iterable[int] | Iterable[Sequence[int]] | None = None,
    model=None,
) -> list[tuple[str, object]]:
    """Hooks adding `bias` to the pre-softmax scores of `layers` × `heads` (all when None; or heads as (layer, head)).

    `bias` is [q, k], [head, q, k] (head = the selected heads in order) or [batch, head, q, k] indexed by absolute
    position, or a function (q_len, k_len, device=...) -> bias for the last q_len queries (any length, KV cache).

    Shapes:
        bias: [q, k], [head, q, k] or [batch, head, q, k] over absolute positions, or a function
            `(q_len, k_len, device=...)` returning such a tensor for the last `q_len` queries.
        returns: a list of `(hook name, function)` on `hook_attn_scores`.

    Example:
        >>> fwd = hooks.attn_bias(torch.zeros(8, 8), layers=0)  # a zero bias changes nothing
        >>> torch.allclose(model.run_with_hooks(tokens, fwd_hooks=fwd), model(tokens))
        True
    """
    cfg = getattr(model, "cfg", None)
    n_layers, n_heads = getattr(cfg, "n_layers", None), getattr(cfg, "n_heads", None)
    if not callable(bias) and (not isinstance(bias, Tensor) or bias.ndim not in (2, 3, 4)):
        raise ValueError(
            "bias must be a [q,k], [head,q,k] or [batch,head,q,k] tensor, or a function (q_len, k_len, device)"
        )
    heads = None if heads is None else list(heads)
    if heads and isinstance(heads[0], (tuple, list)):
        if layers is not None:
            raise ValueError("give heads as (layer, head) pairs or as head indices with layers=..., not both")
        by_layer: dict[int, list[int] | None] = {}
        for layer, head in check_heads(heads, n_layers, n_heads):
            by_layer.setdefault(layer, []).append(head)
    else:
        for h in heads or []:
            if isinstance(h, bool) or not isinstance(h, int) or h < 0 or (n_heads is not None and h >= n_heads):
                raise ValueError(f"head {h!r} out of range 0..{(n_heads or 1) - 1}")
        if heads is not None and not heads:
            raise ValueError("heads is empty")
        by_layer = {layer: heads for layer in check_layers(layers, n_layers)}

    return [(scores_name(layer), BiasHook(bias, layer, hs)) for layer, hs in sorted(by_layer.items())]


class BiasHook:
    """The hook `attn_bias` puts on one layer's `hook_attn_scores`: `scores + bias` on `heads` (None: all heads).

    Called as a TransformerLens hook, `(scores, hook) -> scores`. Its fields say what it adds, so that code running
    the same function without hook points (a fused forward) can add the same bias to its own attention mask.

    Shapes:
        block(batch, n_heads, q, k): the bias as added, [1 | batch, 1 | heads, q, k] (heads: the selected ones).
    """

    def __init__(self, bias: Tensor | BiasFn, layer: int, heads: list[int] | None):
        self.bias, self.layer, self.heads = bias, layer, heads

    def __repr__(self) -> str:  # TransformerLens names the hook by its repr: never print the bias tensor
        return f"BiasHook(layer={self.layer}, heads={self.heads})"

    def block(self, b: int, n_h: int, q: int, k: int, device, dtype: torch.dtype) -> Tensor:
        """The bias for scores of shape [b, n_h, q, k] (queries = the last q positions), as [1 | b, 1 | heads, q,
        k]; ValueError when a head or the bias does not fit."""
        hs = self.heads
        if hs is not None and max(hs) >= n_h:
            raise ValueError(f"head {max(hs)} out of range: layer {self.layer} has {n_h} heads")
        add = _crop_bias(self.bias, q, k, device).to(dtype)
        if add.ndim == 2:
            add = add[None, None]
        elif add.ndim == 3:
            add = add[None]
        want = n_h if hs is None else len(hs)
        if add.shape[1] not in (1, want) or add.shape[0] not in (1, b):
            raise ValueError(f"bias {tuple(add.shape)} does not fit scores {(b, want, q, k)} of layer {self.layer}")
        return add

    def __call__(self, scores: Tensor, hook=None) -> Tensor:
        add = self.block(*scores.shape, scores.device, scores.dtype)
        if self.heads is None:
            return scores + add
        idx = torch.tensor(self.heads, device=scores.device)
        scores = scores.clone()
        scores[:, idx] += add
        return scores
