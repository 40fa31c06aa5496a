"""What every loader returns (aspan checkpoints, Hugging Face directories, GGUF files, SmolLM2), and the bridge
they share; the bottom of `aspan.models` (the loaders import it, it imports none of them)."""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Iterator, NamedTuple

from ..tokenization import Tokenizer


def is_bridge(model) -> bool:
    """Whether `model` is a TransformerBridge (it wraps a Hugging Face model, and trains that model's own tensors)
    rather than a HookedTransformer."""
    return getattr(model, "original_model", None) is not None


class Where(NamedTuple):
    """Where a model is built: what a backend's constructors read (the loaders' Placement has these fields too)."""

    device: str | None  # the device (None: the CPU)
    dtype: Any  # a torch.dtype
    device_map: Any = None  # None (one device), or Hugging Face's placement over several (bridge only)


class LoadedModel(NamedTuple):
    """A loaded model: the HookedTransformer or TransformerBridge, its tokenizer and the free metadata saved with it."""

    model: Any  # transformer_lens.HookedTransformer | transformer_lens.model_bridge.TransformerBridge
    tokenizer: Tokenizer
    meta: dict[str, Any]


# What TransformerLens and the libraries it loads change in a process, found by comparing the process before and
# after (tests/test_host_process.py fails if anything else changes): torch's inductor sets this variable when
# TransformerLens imports it.
_ENVIRONMENT_SET_BY_LOADING = ("TORCHINDUCTOR_CACHE_DIR",)


@contextlib.contextmanager
def process_kept() -> Iterator[None]:
    """What runs inside leaves the process as it was in the things TransformerLens changes: importing it, torch's
    inductor sets `TORCHINDUCTOR_CACHE_DIR`, it silences the `transformers` logger and adds warning filters; its
    config conversion logs through the root logger, which gives that logger a handler (`logging.basicConfig`). Only
    those are put back (the named variable removed when loading added it, the handlers added to the root logger, the
    two loggers' levels, the warning filters): nothing is written into `os.environ`, and what the host's other
    threads change meanwhile is left alone."""
    import logging
    import warnings

    env = {name: os.environ.get(name) for name in _ENVIRONMENT_SET_BY_LOADING}
    hf_logger, root = logging.getLogger("transformers"), logging.getLogger()
    hf_level, root_level, root_handlers = hf_logger.level, root.level, list(root.handlers)
    try:
        with warnings.catch_warnings():
            yield
    finally:
        for name in [name for name, value in env.items() if value is None]:
            os.environ.pop(name, None)  # set by loading; a host's own value torch only makes absolute is left as is
        for handler in [h for h in root.handlers if h not in root_handlers]:
            root.removeHandler(handler)
        if root.level != root_level:
            root.setLevel(root_level)
        if hf_logger.level != hf_level:
            hf_logger.setLevel(hf_level)


def import_transformer_lens() -> None:
    """`import transformer_lens` the first time, under `process_kept`; the entry points of `aspan.models` call it
    before anything else of TransformerLens is imported."""
    import sys

    if "transformer_lens" not in sys.modules:
        with process_kept():
            import transformer_lens  # noqa: F401


@contextlib.contextmanager
def quiet_hf():
    """Hugging Face's progress bars off while loading (its weight loading, and the GGUF dequantisation's own tqdm
    bar, which ignores that switch), and its logger's warnings (e.g. on the generation flags TransformerLens sets),
    all restored afterwards."""
    import logging

    from transformers.utils import logging as hf_logging

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - transformers without its GGUF support
        gguf_utils = None
    was, bar = hf_logging.is_progress_bar_enabled(), getattr(gguf_utils, "tqdm", None)
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(max(level, logging.ERROR))
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
        logger.setLevel(level)


def bridge(source: str | os.PathLike | Any, device: str | None, tokenizer: Any = None, *, dtype: Any = None,
           device_map: Any = None):
    """`TransformerBridge.boot_transformers` in compatibility mode (TransformerLens hook names), quietly: over a
    checkpoint directory, or over an in-memory Hugging Face model (e.g. dequantised from a GGUF file) with its
    tokenizer (the bridge gets a copy: it configures padding on the one it holds). `dtype`: a `torch.dtype` (None:
    float32); `device_map` (a directory only; an in-memory model keeps the placement it was loaded with): spread
    over several devices by Hugging Face's placement (`"auto"`, a dict), instead of `device`."""
    import copy

    import torch

    import_transformer_lens()
    from transformer_lens.model_bridge import TransformerBridge

    dtype = dtype or torch.float32
    if isinstance(source, (str, os.PathLike)):
        boot = {"model_name": str(source), "dtype": dtype}
        if device_map is not None:
            boot, device = {**boot, "device_map": device_map}, None
    else:  # eager attention, so the pattern and score hooks fire (TransformerLens 3.9 keeps the model as given)
        source.set_attn_implementation("eager")
        placed = getattr(source, "hf_device_map", None) is not None
        source = source if placed else source.to(device)
        device = None if placed else device
        boot = {"model_name": "in-memory", "hf_model": source.eval(), "tokenizer": copy.deepcopy(tokenizer),
                "dtype": dtype}
    with quiet_hf():
        model = TransformerBridge.boot_transformers(device=device, **boot)
        # no weight processing: the weights HookedTransformer gets, so the same edits act the same (folding value
        # biases into the output bias assumes pattern rows sum to 1, which a reinforcement edit breaks)
        model.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    forward_cache_to_attention(model)
    return model.eval()


def cache_keyword(model) -> str:
    """The keyword the bridge's Hugging Face model takes its key-value cache under: `cache` in the transformers
    releases that renamed it (they warn that `past_key_values` is deprecated), `past_key_values` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.original_model.forward).parameters else "past_key_values"


def _cache_as_past_key_values(module, args, kwargs):
    if kwargs.get("cache") is not None and kwargs.get("past_key_values") is None:
        kwargs["past_key_values"] = kwargs["cache"]
    return args, kwargs


def forward_cache_to_attention(model) -> None:
    """Make every attention component of a TransformerBridge see the key-value cache, whatever transformers calls it.

    transformers releases that renamed `past_key_values` to `cache` pass the cache to each layer's attention as
    `cache=`, but TransformerLens's bridge attention (3.9 and 4.3) reads only `past_key_values` (or `layer_past`):
    it then attends to the new tokens alone, and KV-cached generation silently diverges from uncached generation.
    A forward pre-hook on each such component copies `cache` to `past_key_values`. Idempotent; no-op on a
    HookedTransformer and on releases without the rename."""
    if not is_bridge(model) or getattr(model, "_aspan_cache_forwarded", False):
        return
    for module in model.modules():
        if hasattr(type(module), "_update_kv_cache"):  # TransformerLens's attention bridge components
            module.register_forward_pre_hook(_cache_as_past_key_values, with_kwargs=True)
    model._aspan_cache_forwarded = True
