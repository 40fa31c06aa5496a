"""What every loader returns (aspan checkpoints, Hugging Face directories, GGUF files, SmolLM2), and the bridge
they share; the bottom of `aspan.models` (the loaders import it, it imports none of them)."""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, NamedTuple

from ..tokenization import Tokenizer


def is_bridge(model) -> bool:
    """Whether `model` is a TransformerBridge (it wraps a Hugging Face model, and trains that model's own tensors)
    rather than a HookedTransformer."""
    return getattr(model, "original_model", None) is not None


class LoadedModel(NamedTuple):
    """A loaded model: the HookedTransformer or TransformerBridge, its tokenizer and the free metadata saved with it."""

    model: Any  # transformer_lens.HookedTransformer | transformer_lens.model_bridge.TransformerBridge
    tokenizer: Tokenizer
    meta: dict[str, Any]


@contextlib.contextmanager
def quiet_hf():
    """Hugging Face's progress bars off while loading (its weight loading, and the GGUF dequantisation's own tqdm
    bar, which ignores that switch), restored afterwards."""
    from transformers.utils import logging as hf_logging

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - transformers without its GGUF support
        gguf_utils = None
    was, bar = hf_logging.is_progress_bar_enabled(), getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        if was:
            hf_logging.enable_progress_bar()


def bridge(source: str | os.PathLike | Any, device: str, tokenizer: Any = None):
    """`TransformerBridge.boot_transformers` in compatibility mode (TransformerLens hook names), quietly: over a
    checkpoint directory, or over an in-memory Hugging Face model (e.g. dequantised from a GGUF file) with its
    tokenizer (the bridge gets a copy: it configures padding on the one it holds)."""
    import copy

    from transformer_lens.model_bridge import TransformerBridge

    if isinstance(source, (str, os.PathLike)):
        boot = {"model_name": str(source)}
    else:  # eager attention, so the pattern and score hooks fire (TransformerLens 3.9 keeps the model as given)
        source.set_attn_implementation("eager")
        boot = {"model_name": "in-memory", "hf_model": source.to(device).eval(), "tokenizer": copy.deepcopy(tokenizer)}
    with quiet_hf():
        model = TransformerBridge.boot_transformers(device=device, **boot)
        # no weight processing: the weights HookedTransformer gets, so the same edits act the same (folding value
        # biases into the output bias assumes pattern rows sum to 1, which a reinforcement edit breaks)
        model.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return model.eval()
