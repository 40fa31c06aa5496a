"""Which rows an attention edit touches: rows with references, optionally restricted by position or by a gate.

Shared by every editing hook (reinforce, patch_pattern, steer). Masks are built for the full length; a pattern
block [batch, head, q_len, k_len] holds query rows k_len-q_len … k_len-1 (KV cache), keys 0 … k_len-1.
"""
from __future__ import annotations

import math
import numbers

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from .masks import query_rows


def check_rows(rows: Tensor | None) -> Tensor | None:
    """Rows an edit may touch: None (all) or bool [batch, pos] (or [pos] for every batch element)."""
    if rows is None:
        return None
    if not isinstance(rows, Tensor) or rows.dtype != torch.bool or rows.ndim not in (1, 2):
        raise ValueError(f"rows must be a bool tensor [batch, pos] (True: the row may be edited), got "
                         f"{getattr(rows, 'dtype', type(rows).__name__)} {tuple(getattr(rows, 'shape', ()))}")
    return rows


def check_gate(gate_below: float | None) -> float | None:
    """The failure gate τ: edit a head's row only while its attention on the references is below τ (None: always)."""
    if gate_below is None:
        return None
    ok = isinstance(gate_below, numbers.Real) and not isinstance(gate_below, bool) and math.isfinite(gate_below)
    if not ok or not 0 < gate_below <= 1:
        raise ValueError(f"gate_below must be a number in (0, 1] (an attention share) or None, got {gate_below!r}")
    return float(gate_below)


def rows_beyond(tokens: Tensor, position: int) -> Bool[Tensor, "batch pos"]:
    """Rows whose query position is >= `position` (e.g. past the longest training sample), for an edit's `rows`.

    Shapes:
        tokens: [batch, pos].
        returns: bool [batch, pos].

    Example:
        >>> import torch
        >>> import hooks
        >>> tokens = torch.tensor([[0, 3, 4, 5, 2, 5, 4, 3]])  # one sequence of 8 tokens [batch, pos]
        >>> hooks.rows_beyond(tokens, 6)[0].tolist()
        [False, False, False, False, False, False, True, True]
    """
    if not isinstance(position, numbers.Integral) or isinstance(position, bool) or position < 0:
        raise ValueError(f"position must be an int >= 0, got {position!r}")
    t = tokens[None] if tokens.ndim == 1 else tokens
    b, pos = t.shape
    return (torch.arange(pos, device=t.device) >= int(position)).expand(b, pos).clone()


class Crop:
    """A full-length reference mask [batch, pos, pos] and optional rows [batch, pos], cropped per pattern block.

    One cropped copy is kept per (device, batch, q, k): shared by the layers of one forward.
    """

    def __init__(self, mask: Tensor | None, rows: Tensor | None):
        self.mask, self.rows = mask, rows
        self.cache: dict[tuple, tuple[Tensor | None, Tensor | None]] = {}

    def __call__(self, b: int, q: int, k: int, device) -> tuple[Tensor | None, Tensor | None]:
        key = (device, b, q, k)
        if key not in self.cache:
            self.cache.clear()
            self.cache[key] = (self._mask(b, q, k, device), self._rows(b, q, k, device))
        return self.cache[key]

    def _mask(self, b: int, q: int, k: int, device) -> Tensor | None:
        if self.mask is None:
            return None
        m = self.mask.to(device)
        if m.ndim == 2:
            m = m.expand(b, *m.shape)
        elif m.shape[0] != b:
            raise ValueError(f"mask has batch {m.shape[0]} but the forward has batch {b}")
        return query_rows(m, q, k)

    def _rows(self, b: int, q: int, k: int, device) -> Tensor | None:
        if self.rows is None:
            return None
        r = self.rows.to(device)
        if r.ndim == 1:
            r = r.expand(b, *r.shape)
        elif r.shape[0] != b:
            raise ValueError(f"rows has batch {r.shape[0]} but the forward has batch {b}")
        if r.shape[-1] < k:
            raise ValueError(f"rows covers {r.shape[-1]} positions but the attention pattern has {k} keys: "
                             f"build rows for the full (final) length")
        return r[:, k - q : k]


def edit_rows(
    attn: Float[Tensor, "batch head q k"],
    refs: Bool[Tensor, "batch q k"] | None,
    rows: Bool[Tensor, "batch q"] | None,
    gate_below: float | None,
) -> Bool[Tensor, "batch head q"]:
    """Per head, the rows to edit: rows with references (every row without a mask), within `rows`, and (with a
    gate) where the head's own attention `attn` on the references is below `gate_below`."""
    b, n, q, _ = attn.shape
    keep = torch.ones(b, q, dtype=torch.bool, device=attn.device) if refs is None else refs.any(-1)
    if rows is not None:
        keep = keep & rows
    keep = keep[:, None, :].expand(b, n, q)
    if gate_below is not None and refs is not None:
        mass = (attn * refs[:, None].to(attn.dtype)).sum(-1)
        keep = keep & (mass < gate_below)
    return keep
