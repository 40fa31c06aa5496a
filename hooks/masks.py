"""Pure functions on reference masks and patterns: attention mass, shifted references, KV-cache row cropping."""
from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor


def attn_mass(attn: Float[Tensor, "batch q k"], mask: Bool[Tensor, "batch q k"]) -> Float[Tensor, "batch q"]:
    """Attention mass of each row on its reference set (AttnScore per row, Spiegel et al. 2025, Eq. 3).

    0 on rows without references.

    Shapes:
        attn: [batch, q, k], one head's pattern.
        mask: bool [batch, q, k], the references of each row.
        returns: [batch, q].

    Example:
        >>> import torch
        >>> import hooks
        >>> mask = torch.zeros(1, 8, 8, dtype=torch.bool)  # references [batch, pos, pos], row = query
        >>> mask[0, [4, 5, 6], [3, 2, 1]] = True  # rows 4, 5, 6 read columns 3, 2, 1 (a reversal)
        >>> A = torch.full((1, 8, 8), 1 / 8)
        >>> hooks.attn_mass(A, mask)[0].tolist()
        [0.0, 0.0, 0.0, 0.0, 0.125, 0.125, 0.125, 0.0]
    """
    if attn.shape[-2:] != mask.shape[-2:]:
        raise ValueError(f"attention {tuple(attn.shape)} and mask {tuple(mask.shape)} differ in their last two dims")
    return torch.where(mask.to(attn.device), attn, torch.zeros((), dtype=attn.dtype, device=attn.device)).sum(-1)


def share(
    attn: Float[Tensor, "batch q k"], mask: Bool[Tensor, "batch q k"], columns: Bool[Tensor, "batch k"] | None = None
) -> Float[Tensor, "batch q"]:
    """AttnScore per row in a convention: mass on the references over the mass on `columns` (None: the whole row).

    `columns` is True on the denominator's columns, e.g. the sample's own tokens (the `sample` convention of
    Spiegel et al. 2025, Appendix B, whose public code leaves the BOS, instruction and few-shot columns out); 0 where
    that mass is 0.

    Shapes:
        attn: [batch, q, k].
        mask: bool [batch, q, k].
        columns: bool [batch, k] or None.
        returns: [batch, q].

    Example:
        >>> import torch
        >>> import hooks
        >>> mask = torch.zeros(1, 8, 8, dtype=torch.bool)  # references [batch, pos, pos], row = query
        >>> mask[0, [4, 5, 6], [3, 2, 1]] = True  # rows 4, 5, 6 read columns 3, 2, 1 (a reversal)
        >>> A = torch.full((1, 8, 8), 1 / 8)
        >>> own = torch.tensor([[False, True, True, True, True, True, True, True]])  # BOS left out
        >>> round(hooks.share(A, mask, own)[0, 4].item(), 4)
        0.1429
    """
    mass = attn_mass(attn, mask)
    if columns is None:
        return mass
    denom = (attn * columns.to(attn.device, attn.dtype)[..., None, :]).sum(-1)
    return torch.where(denom > 0, mass / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(mass))


def shift_mask(mask: Bool[Tensor, "... q k"], delta: int) -> Bool[Tensor, "... q k"]:
    """Move every reference `k` to column `k + delta`, dropping those outside `0..q` (causal part).

    Shapes:
        mask: bool [..., q, k].
        returns: bool [..., q, k].

    Example:
        >>> import torch
        >>> import hooks
        >>> mask = torch.zeros(1, 8, 8, dtype=torch.bool)  # references [batch, pos, pos], row = query
        >>> mask[0, [4, 5, 6], [3, 2, 1]] = True  # rows 4, 5, 6 read columns 3, 2, 1 (a reversal)
        >>> hooks.shift_mask(mask, 1)[0, 4].nonzero().flatten().tolist()  # row 4: column 3 -> 4
        [4]
    """
    if delta == 0:
        return mask
    q, k = mask.shape[-2:]
    out = torch.zeros_like(mask)
    if abs(delta) < k:
        if delta > 0:
            out[..., delta:] = mask[..., : k - delta]
        else:
            out[..., : k + delta] = mask[..., -delta:]
    causal = torch.ones(q, k, dtype=torch.bool, device=mask.device).tril(k - q)
    return out & causal


def query_rows(mask: Bool[Tensor, "batch pos pos"], q_len: int, k_len: int) -> Bool[Tensor, "batch q_len k_len"]:
    """Rows of `mask` for a pattern [.., q_len, k_len]: query positions k_len-q_len … k_len-1 (KV cache), keys 0 …
    k_len-1."""
    if mask.shape[-1] < k_len:
        raise ValueError(f"mask covers {mask.shape[-1]} positions but the attention pattern has {k_len} keys: "
                         f"build the mask for the full (final) length")
    return mask[..., k_len - q_len : k_len, :k_len]


def target_rows(mask: Bool[Tensor, "batch q k"], attention_mask: Tensor | None = None) -> Bool[Tensor, "batch q"]:
    """Rows that have at least one reference (and are real tokens when an attention_mask is given).

    Shapes:
        mask: bool [batch, q, k].
        attention_mask: [batch, q] or None.
        returns: bool [batch, q].

    Example:
        >>> import torch
        >>> import hooks
        >>> mask = torch.zeros(1, 8, 8, dtype=torch.bool)  # references [batch, pos, pos], row = query
        >>> mask[0, [4, 5, 6], [3, 2, 1]] = True  # rows 4, 5, 6 read columns 3, 2, 1 (a reversal)
        >>> hooks.target_rows(mask)[0].tolist()
        [False, False, False, False, True, True, True, False]
    """
    rows = mask.any(-1)
    return rows if attention_mask is None else rows & attention_mask.to(rows.device).bool()


def extrapolate_mask(
    mask: Bool[Tensor, "batch pos pos"], last: int = 3, attention_mask: Tensor | None = None
) -> Bool[Tensor, "batch pos pos"]:
    """The mask with one more row: the row after each sample's last row with references (in the toolkit's layout the
    end-of-sequence row, whose reference set is empty) gets the last row's references moved by the step between
    the last two rows' references, continuing the reference map one row (a copy; `mask` is not changed).

    Per sample, only where the map is regular there: the `last` rows ending at the last row with references all have
    references, each row's set is the previous one's moved by the same step (same size, nothing dropped), and the
    moved set fits the causal part of the new row (keys 0 … row); with `attention_mask` the new row must also be a
    real token. Elsewhere the sample is unchanged. Reversal's anti-diagonal (step -1) continues to the column before
    the first character; any other task's map is continued the same way, or not at all.

    Shapes:
        mask: bool [batch, pos, pos], row = query position.
        attention_mask: [batch, pos] (1 on real tokens) or None.
        returns: bool [batch, pos, pos].

    Example:
        >>> import torch
        >>> import hooks
        >>> mask = torch.zeros(1, 8, 8, dtype=torch.bool)  # references [batch, pos, pos], row = query
        >>> mask[0, [4, 5, 6], [3, 2, 1]] = True  # rows 4, 5, 6 read columns 3, 2, 1 (a reversal)
        >>> hooks.extrapolate_mask(mask)[0, 7].nonzero().flatten().tolist()  # row 7 continues the anti-diagonal
        [0]
    """
    if last < 2:
        raise ValueError(f"last must be >= 2 (at least one step between two rows), got {last!r}")
    m = mask[None] if mask.ndim == 2 else mask
    b, q, k = m.shape
    if q != k:
        raise ValueError(f"extrapolate_mask needs the full square mask [batch, pos, pos], got {tuple(m.shape)}")
    has = m.any(-1)  # [b, q]
    pos = torch.arange(q, device=m.device)
    end = torch.where(has, pos, -1).amax(-1)  # [b]: the last row with references (-1: none)
    rows = end[:, None] - torch.arange(last, device=m.device)  # [b, last]: end, end-1, ...
    ok = (rows[:, -1] >= 0) & (end + 1 < q)
    sets = m[torch.arange(b, device=m.device)[:, None], rows.clamp(min=0)]  # [b, last, k]
    ok &= has.gather(1, rows.clamp(min=0)).all(1)
    first = torch.where(sets, pos, k).amin(-1)  # [b, last]: the first column of each set
    step = first[:, 0] - first[:, 1]  # [b]
    for j in range(1, last):  # set j-1 is set j moved by the step
        ok &= (_moved(sets[:, j], step) == sets[:, j - 1]).all(-1) & (sets[:, j].sum(-1) == sets[:, j - 1].sum(-1))
    new = _moved(sets[:, 0], step)  # [b, k]
    eos = (end + 1).clamp(max=q - 1)
    ok &= (new.sum(-1) == sets[:, 0].sum(-1)) & ~(new & (pos[None] > eos[:, None])).any(-1)
    if attention_mask is not None:
        am = attention_mask.to(m.device).bool()
        ok &= am.gather(1, eos[:, None])[:, 0]
    out = m.clone()
    idx = ok.nonzero()[:, 0]
    out[idx, eos[idx]] = new[idx]
    return out if mask.ndim == 3 else out[0]


def _moved(cols: Bool[Tensor, "batch k"], step: Tensor) -> Bool[Tensor, "batch k"]:
    """Each sample's columns moved by its own step (columns moved outside 0 … k-1 are dropped)."""
    k = cols.shape[-1]
    src = torch.arange(k, device=cols.device)[None] - step[:, None]  # column c comes from c - step
    inside = (src >= 0) & (src < k)
    return cols.gather(-1, src.clamp(0, k - 1)) & inside
