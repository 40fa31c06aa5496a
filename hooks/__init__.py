"""TransformerLens hook functions that read and edit attention (capture, rollout, head scores, reinforcement,
pattern patching, PASTA steering, biases, rotary pairs re-aimed) and read each row's top key (readout).

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

Every function's docstring ends with an example that runs as written in a fresh Python session (each sets up
what it uses: a tiny random 2-layer model, one sequence of 8 tokens and its reference mask, whose rows 4, 5, 6 read
columns 3, 2, 1, the anti-diagonal of a reversal); a test runs each one alone and compares what it prints.
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
from .readout import readout_hooks, row_readout
from .reinforce import reinforce
from .rollout import rollout, rollout_scores
from .rotary import rotary_pairs
from .scores import head_row_scores, head_scores, offset_scores
from .steer import check_alpha as check_alpha
from .steer import steer

# What a user calls. The checks, the hook name and `BiasHook` (what an `attn_bias` hook adds) above are exported for
# aspan's own use (the layer above imports nothing from `hooks._*`) and stay out of `__all__`; other internals stay
# in their modules.
__all__ = [
    "CaptureOptions", "EditOptions", "OffsetOptions", "ReinforceOptions", "ScoreOptions", "SteerOptions", "attn_bias",
    "attn_mass", "capture", "capture_hooks", "extrapolate_mask", "head_row_scores", "head_scores",
    "offset_bias", "offset_scores", "patch_pattern", "readout_hooks", "reinforce", "rollout", "rollout_scores",
    "rotary_pairs", "row_readout", "rows_beyond", "share", "shift_mask", "steer", "target_rows",
]
