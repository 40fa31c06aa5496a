"""PASTA attention steering before the softmax (Zhang et al. 2023, "Tell your model where to attend", Sec. 3).

On selected heads, rows with references get `log α` added to the scores of every column outside the row's
references ("exclude", PASTA's form) or `−log α` added to the references ("include"). Both equal scaling the
post-softmax pattern (references ×1, the rest ×α) and renormalising each row; they differ only numerically.
Works unchanged in KV-cached generation (query rows k_len-q_len … k_len-1 of a [.., q_len, k_len] block).
"""
from __future__ import annotations

import math
import numbers
from typing import Iterable, Sequence, Unpack, get_args

from jaxtyping import Bool
from torch import Tensor

from ._rows import Crop, check_gate, check_rows, edit_rows
from ._stream import scores_name
from ._validate import check_delta, check_heads, check_mask, check_model_heads, head_index
from .masks import shift_mask
from .options import SteerMode, SteerOptions, SteerSettings, merge
from .reinforce import by_layer


def check_alpha(alpha: float) -> float:
    """PASTA's scaling coefficient α: a number in (0, 1] (1 changes nothing)."""
    ok = isinstance(alpha, numbers.Real) and not isinstance(alpha, bool) and math.isfinite(alpha)
    if not ok or not 0 < alpha <= 1:
        raise ValueError(f"alpha must be a number in (0, 1] (PASTA's default is 0.01), got {alpha!r}")
    return float(alpha)


def steer(
    heads: Iterable[Sequence[int]],
    mask: Bool[Tensor, "batch pos pos"],
    *,
    alpha: float = 0.01,
    delta: int = 0,
    model=None,
    options: SteerOptions | None = None,
    **settings: Unpack[SteerSettings],
) -> list[tuple[str, object]]:
    """Hooks on `hook_attn_scores` steering each selected head towards its references (shifted by `delta`).

    `mode` "exclude" adds log α to the columns outside a row's references, "include" adds −log α to the references; rows
    without references are untouched. Failure gates: `rows` (bool [batch, pos], e.g. `rows_beyond`) restricts the
    steered rows; `gate_below` steers a head's row only where that head's unsteered attention on the references is
    below τ. `mask` is [batch, pos, pos] (or [pos, pos]) for the full length. Pass `model` to check heads. `mode`,
    `rows` and `gate_below` are the fields of `hooks.SteerOptions`: pass them as `options=` or as keywords.

    Shapes:
        mask: bool [batch, pos, pos] or [pos, pos].
        rows: bool [batch, pos] or None.
        returns: a list of `(hook name, function)` on `hook_attn_scores`.

    Example:
        >>> import torch
        >>> import hooks
        >>> from transformer_lens import HookedTransformer
        >>> model = HookedTransformer(dict(n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=16, d_vocab=10,
        ...                                act_fn="relu", seed=0))  # a tiny random model, 2 layers x 2 heads
        >>> tokens = torch.tensor([[0, 3, 4, 5, 2, 5, 4, 3]])  # one sequence of 8 tokens [batch, pos]
        >>> mask = torch.zeros(1, 8, 8, dtype=torch.bool)  # references [batch, pos, pos], row = query
        >>> mask[0, [4, 5, 6], [3, 2, 1]] = True  # rows 4, 5, 6 read columns 3, 2, 1 (a reversal)
        >>> fwd = hooks.steer([(1, 0)], mask, alpha=0.01)
        >>> A = hooks.capture(model, tokens, [(1, 0)], fwd_hooks=fwd)[(1, 0)]
        >>> bool(A[0, 5, 2] > 0.9)  # row 5 now attends almost only to its reference
        True
    """
    options = merge(options, settings, SteerOptions, "steer")
    sel = check_model_heads(model, check_heads(heads))
    alpha, mode = check_alpha(alpha), options.mode
    if mode not in get_args(SteerMode):
        raise ValueError(f"mode must be one of {', '.join(get_args(SteerMode))}, got {mode!r}")
    gate_below = check_gate(options.gate_below)
    crop = Crop(shift_mask(check_mask(mask), check_delta(delta)), check_rows(options.rows))
    log_a = math.log(alpha)

    def make(layer: int, hs: list[int]):
        def hook(scores: Tensor, hook) -> Tensor:
            b, _, q, k = scores.shape
            idx = head_index(scores, layer, hs)
            refs, allowed = crop(b, q, k, scores.device)
            old = scores[:, idx]
            attn = old.softmax(-1) if gate_below is not None else old
            keep = edit_rows(attn, refs, allowed, gate_below)[..., None]  # [b, n, q, 1]
            cols = ~refs[:, None] if mode == "exclude" else refs[:, None]  # [b, 1, q, k]
            add = (keep & cols).to(scores.dtype) * (log_a if mode == "exclude" else -log_a)
            out = scores.clone()
            out[:, idx] = old + add
            return out

        return hook

    return [(scores_name(layer), make(layer, hs)) for layer, hs in sorted(by_layer(sel).items())]
