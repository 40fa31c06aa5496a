"""Pattern patching: replace selected heads' attention rows by a chosen distribution (the causal upper bound of an
attention edit, Spiegel et al. 2025, Appendix F: reinforcement with renormalisation tends to it as C → ∞).

Two sources: the uniform distribution over each row's (shifted) references, or a pattern captured from another run
(`hooks.capture`). Per batch element, under padding and during KV-cached generation.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence, Unpack

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ._rows import Crop, check_gate, check_rows, edit_rows
from ._stream import pattern_name
from ._validate import Head, check_delta, check_heads, check_mask, check_model_heads, head_index
from .masks import shift_mask
from .options import EditOptions, EditSettings, merge
from .reinforce import by_layer

Source = Mapping[Head, Float[Tensor, "batch pos pos"]]  # a captured pattern per (layer, head), e.g. hooks.capture


def _check_source(source: Source | None, sel: list[Head]) -> dict[Head, Tensor] | None:
    """Captured patterns for every selected head: [batch, pos, pos] (or [pos, pos]) tensors."""
    if source is None:
        return None
    if not isinstance(source, Mapping):
        raise ValueError(f"source must map (layer, head) to a captured pattern [batch, pos, pos], got "
                         f"{type(source).__name__}")
    out = {}
    for head in sel:
        p = source.get(head)
        if p is None:
            raise ValueError(f"source has no pattern for head {head} (it has {sorted(source)})")
        if not isinstance(p, Tensor) or p.ndim not in (2, 3) or p.shape[-1] != p.shape[-2]:
            raise ValueError(f"source pattern of head {head} must be [batch, pos, pos], got "
                             f"{tuple(getattr(p, 'shape', ()))}")
        if not p.is_floating_point() or not torch.isfinite(p).all() or (p < 0).any():
            raise ValueError(f"source pattern of head {head} must hold finite attention weights >= 0 (a captured "
                             f"pattern), got {_bad_value(p)}")
        out[head] = p.detach()
    return out


def _bad_value(p: Tensor) -> str:
    """The first offending value of a source pattern, for the error message."""
    if not p.is_floating_point():
        return f"dtype {p.dtype}"
    bad = p[~torch.isfinite(p) | (p < 0)]
    return f"{bad[0].item()} ({bad.numel()} such values)"


def _target(source: dict[Head, Tensor] | None, refs: Tensor | None, layer: int, hs: list[int], pattern: Tensor):
    """The replacement rows [batch, n_heads, q, k] for a pattern block: captured rows, or uniform over the refs."""
    b, _, q, k = pattern.shape
    if source is None:
        m = refs.to(pattern.dtype)
        uni = m / m.sum(-1, keepdim=True).clamp_min(1)
        return uni[:, None].expand(b, len(hs), q, k)
    parts = []
    for h in hs:
        p = source[(layer, h)]
        if p.shape[-1] < k:
            raise ValueError(f"source pattern of head {(layer, h)} covers {p.shape[-1]} positions but the attention "
                             f"pattern has {k} keys")
        p = p.to(pattern.device, pattern.dtype)
        p = p.expand(b, *p.shape) if p.ndim == 2 else p
        if p.shape[0] != b:
            raise ValueError(f"source pattern has batch {p.shape[0]} but the forward has batch {b}")
        parts.append(p[:, k - q : k, :k])
    return torch.stack(parts, 1)


def patch_pattern(
    heads: Iterable[Sequence[int]],
    mask: Bool[Tensor, "batch pos pos"] | None = None,
    *,
    delta: int = 0,
    source: Source | None = None,
    model=None,
    options: EditOptions | None = None,
    **settings: Unpack[EditSettings],
) -> list[tuple[str, object]]:
    """Hooks replacing each selected head's pattern rows: uniform over the row's references shifted by `delta`, or,
    with `source`, the same rows of a captured pattern ({(layer, head): [batch, pos, pos]}, e.g. `hooks.capture`).

    With a `mask`, only rows with (shifted) references are patched and every other row is untouched; with `source` and
    no mask every row is. Failure gates: `rows` (bool [batch, pos], e.g. `rows_beyond`) restricts the patched rows;
    `gate_below` (needs `mask`) patches a head's row only where that head's own attention on the (shifted)
    references is below τ. Masks and sources cover the full length; under a KV cache the pattern [b, h, q_new, k]
    holds query rows k-q_new … k-1. Pass `model` to check heads up front. `rows` and `gate_below` are the fields of
    `hooks.EditOptions`: pass them as `options=` or as keywords.

    Shapes:
        mask: bool [batch, pos, pos] or None.
        rows: bool [batch, pos] or None.
        source: `{(layer, head): [batch, pos, pos]}` or None.
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
        >>> fwd = hooks.patch_pattern([(1, 0)], mask)
        >>> A = hooks.capture(model, tokens, [(1, 0)], fwd_hooks=fwd)[(1, 0)]
        >>> A[0, 5].tolist()  # row 5's one reference, column 2, now holds all the attention
        [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    """
    options = merge(options, settings, EditOptions, "patch_pattern")
    sel = check_model_heads(model, check_heads(heads))
    if mask is None and source is None:
        raise ValueError("patch_pattern needs a reference mask (uniform over the references) or a source pattern")
    gate_below = check_gate(options.gate_below)
    if gate_below is not None and mask is None:
        raise ValueError("gate_below needs a reference mask (the gate is the head's attention on the references)")
    refs = None if mask is None else shift_mask(check_mask(mask), check_delta(delta))
    crop = Crop(refs, check_rows(options.rows))
    captured = _check_source(source, sel)

    def make(layer: int, hs: list[int]):
        def hook(pattern: Tensor, hook) -> Tensor:
            b, _, q, k = pattern.shape
            idx = head_index(pattern, layer, hs)
            refs, allowed = crop(b, q, k, pattern.device)
            old = pattern[:, idx]
            keep = edit_rows(old, refs, allowed, gate_below)  # [b, n, q]
            new = torch.where(keep[..., None], _target(captured, refs, layer, hs, pattern), old)
            out = pattern.clone()
            out[:, idx] = new
            return out

        return hook

    return [(pattern_name(layer), make(layer, hs)) for layer, hs in sorted(by_layer(sel).items())]
