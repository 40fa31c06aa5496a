"""Run a forward that folds each layer's attention pattern into a running result, then lets the pattern go."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ._validate import as_batch, check_attention_mask

Fold = Callable[[int, Tensor], None]  # (layer, pattern [batch, head, q, k]) -> None


def pattern_name(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_pattern"


def scores_name(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_attn_scores"


def prepare(model, tokens: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Tokens as [batch, pos] on the model's device, with a checked attention mask."""
    tokens = as_batch(tokens)
    attention_mask = check_attention_mask(attention_mask, tokens)
    device = model.cfg.device
    tokens = tokens.to(device)
    return tokens, (None if attention_mask is None else attention_mask.to(device))


def stream(model, tokens: Tensor, fold: Fold, layers: list[int], attention_mask: Tensor | None = None) -> None:
    """Forward `tokens` without gradients, calling `fold(layer, pattern)` on `layers`; stop after the last one needed."""
    def hook(pattern: Tensor, hook) -> None:
        fold(int(hook.name.split(".")[1]), pattern)

    fwd = [(pattern_name(layer), hook) for layer in layers]
    with torch.no_grad(), model.hooks(fwd_hooks=fwd):
        model(tokens, attention_mask=attention_mask, stop_at_layer=max(layers) + 1)
