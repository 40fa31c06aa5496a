"""TransformerLens hook functions that read and edit attention (capture, rollout, head scores, reinforcement, biases).

Depends on torch, einops, jaxtyping and transformer_lens only, never on aspan. Masks are bool [batch, pos, pos] with
row = query position. Score and rollout readers stream: each layer's pattern is folded into the result inside its
hook and then freed, and the batch goes through in chunks (`batch_size`; by default one pattern stays under 128 MiB).
Factories return `list[(hook_name, fn)]` for `model.hooks(fwd_hooks=...)` / `model.run_with_hooks`.
"""
from ._stream import pattern_name, scores_name
from ._validate import check_attention_mask, check_heads, check_layers, check_mask, check_threshold
from .bias import attn_bias, offset_bias, window_bias
from .capture import capture, capture_hooks
from .masks import attn_mass, query_rows, shift_mask, target_rows
from .reinforce import edit_pattern, reinforce
from .rollout import rollout, rollout_scores, rollout_step
from .scores import head_row_scores, head_scores, offset_scores

__all__ = [
    "attn_bias", "attn_mass", "capture", "capture_hooks", "check_attention_mask", "check_heads", "check_layers",
    "check_mask", "check_threshold", "edit_pattern", "head_row_scores", "head_scores", "offset_bias",
    "offset_scores", "pattern_name", "query_rows", "reinforce", "rollout", "rollout_scores", "rollout_step",
    "scores_name", "shift_mask", "target_rows", "window_bias",
]
