"""TransformerLens hook functions that read and edit attention (capture, rollout, head scores, reinforcement,
pattern patching, PASTA steering, biases).

Depends on torch, einops, jaxtyping and transformer_lens only, never on aspan. Masks are bool [batch, pos, pos] with row
= query position. Scores take `columns` (bool [batch, pos], the AttnScore denominator: None for the whole row, the `raw`
convention; the sample's own columns for the paper's `sample` convention). Score and rollout readers stream: each
layer's pattern is folded into the result inside its hook and then freed, and the batch goes through in chunks
(`batch_size`; by default one pattern stays under 128 MiB). Edits (reinforce, patch_pattern, steer) take failure gates:
`rows` (bool [batch, pos], e.g. `rows_beyond`) and `gate_below` (the head's own attention on the references below τ);
`extrapolate_mask` continues a reference map one row past its last row (an extra edit target, e.g. the end-of-sequence
row). Factories return `list[(hook_name, fn)]` for `model.hooks(fwd_hooks=...)` / `model.run_with_hooks`. The less
common options of the readers and edits are small frozen dataclasses (`ScoreOptions`, `OffsetOptions`, `CaptureOptions`,
`EditOptions`, `ReinforceOptions`, `SteerOptions`), passed as `options=` or field by field as keywords
(`hooks.reinforce(heads, mask, 1.0, renormalize=True)`).

The examples in the functions' docstrings run on this tiny model (2 layers x 2 heads), one sequence of 8 tokens and
its reference mask (rows 4, 5, 6 read columns 3, 2, 1: the anti-diagonal of a reversal), as a test checks:

    >>> import torch
    >>> import hooks
    >>> from transformer_lens import HookedTransformer, HookedTransformerConfig
    >>> cfg = HookedTransformerConfig(n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=16, d_vocab=10,
    ...                               act_fn="relu", seed=0)
    >>> model = HookedTransformer(cfg)
    >>> tokens = torch.tensor([[0, 3, 4, 5, 2, 5, 4, 3]])  # [batch, pos]
    >>> mask = torch.zeros(1, 8, 8, dtype=torch.bool)  # [batch, pos, pos], row = query position
    >>> for j in range(3):
    ...     mask[0, 4 + j, 3 - j] = True
"""
from ._rows import rows_beyond
from ._stream import pattern_name as pattern_name
from ._validate import check_delta as check_delta
from ._validate import check_fits as check_fits
from ._validate import check_heads as check_heads
from ._validate import check_hook_points as check_hook_points
from ._validate import check_mask as check_mask
from ._validate import check_strength as check_strength
from ._validate import check_threshold as check_threshold
from .bias import BiasHook as BiasHook
from .bias import attn_bias, offset_bias
from .capture import capture, capture_hooks
from .masks import attn_mass, extrapolate_mask, share, shift_mask, target_rows
from .options import CaptureOptions, EditOptions, OffsetOptions, ReinforceOptions, ScoreOptions, SteerOptions
from .patch import patch_pattern
from .reinforce import reinforce
from .rollout import rollout, rollout_scores
from .scores import head_row_scores, head_scores, offset_scores
from .steer import check_alpha as check_alpha
from .steer import steer

# What a user calls. The checks, the hook name and `BiasHook` (what an `attn_bias` hook adds) above are exported for
# aspan's own use (the layer above imports nothing from `hooks._*`) and stay out of `__all__`; other internals stay
# in their modules.
__all__ = [
    "CaptureOptions", "EditOptions", "OffsetOptions", "ReinforceOptions", "ScoreOptions", "SteerOptions", "attn_bias",
    "attn_mass", "capture", "capture_hooks", "extrapolate_mask", "head_row_scores", "head_scores",
    "offset_bias", "offset_scores", "patch_pattern", "reinforce", "rollout", "rollout_scores", "rows_beyond", "share",
    "shift_mask", "steer", "target_rows",
]
