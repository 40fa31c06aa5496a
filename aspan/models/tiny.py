"""A small from-scratch HookedTransformer (LayerNorm, gelu; rotary, learned, ALiBi or no positions) and the context
check.

Rotary tables stop at `cfg.n_ctx`: the context must cover the longest sample (plus prompt), checked up front.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, TypedDict, Unpack

import torch

from .. import tasks
from ..options import Backend
from ..tasks.base import Task
from ..tokenization import Tokenizer
from .backend import backend_named, backend_of, default_backend
from .build import _DEPRECATED, POSITIONAL, Positional, build, positional_cfg  # noqa: F401 (kept importable here)
from .hfbase import positional_of_cfg
from .loaded import import_transformer_lens

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer
    from transformer_lens.model_bridge import TransformerBridge


def positional_of(model_or_cfg) -> str:
    """The `Positional` name of a model (or its config): rotary, learned, alibi or none."""
    config = backend_of(model_or_cfg).hf_config(model_or_cfg) if hasattr(model_or_cfg, "cfg") else None
    if config is not None:  # a model wrapping a Hugging Face one: its form says
        from .hfform import positional_of_config

        found = positional_of_config(config)
        if found is not None:
            return found
    return positional_of_cfg(getattr(model_or_cfg, "cfg", model_or_cfg))


def _as_task(task: Task | str) -> Task:
    """A Task, or a task name meaning its OOD preset (the longest samples the model must fit)."""
    if isinstance(task, str):
        return tasks.preset(task, "ood")
    return task


def check_context(model_or_n_ctx: HookedTransformer | TransformerBridge | int, task: Task | str | int, offset: int = 1,
                  eos: bool = True) -> int:
    """Tokens the longest sample of `task` needs (prefix `offset` + text + EOS); ValueError if the context is shorter.

    `task` may also be the longest text length itself (a dataset). The one context-length check of the package:
    rotary tables stop at `cfg.n_ctx`, so a longer sample would fail mid-run (or be silently cut).
    """
    n_ctx = model_or_n_ctx if isinstance(model_or_n_ctx, int) else model_or_n_ctx.cfg.n_ctx
    if isinstance(task, int):
        longest, what = task, "longest"
    else:
        task = _as_task(task)
        longest, what = task.max_text_len(), f"longest {task.name or type(task).__name__}"
    needed = longest + offset + int(eos)
    if n_ctx < needed:
        raise ValueError(
            f"context too short: n_ctx={n_ctx} but the {what} sample needs {needed} tokens "
            f"({longest} characters + offset {offset}{' + 1 EOS' if eos else ''}): build the model with n_ctx >= "
            f"{needed}, or ask for shorter samples: {_what_fits(task, n_ctx - offset - int(eos))}"
        )
    return needed


def _what_fits(task: Task | int, budget: int) -> str:
    """Which task parameters fit `budget` characters: the largest upper end of the first range parameter that does
    (for a fixed checkpoint the context cannot grow, so the useful advice is which lengths to ask for)."""
    if budget < 1:
        return "this model fits no sample"
    params = {} if isinstance(task, int) else task.params()
    for key, value in params.items():
        if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value)):
            continue
        lo, hi = value
        for top in range(hi - 1, lo - 1, -1):
            try:
                if tasks.task_class(task.name)(**{**params, key: (lo, top)}).max_text_len() <= budget:
                    return f"this model fits {key} up to {top} (e.g. --param {key}={lo}-{top})"
            except (ValueError, TypeError):
                break
    return f"this model fits samples of at most {budget} characters"


def _vocab(vocab_size: int | Tokenizer, offset: int | None) -> tuple[int, int]:
    """The vocabulary size and the tokens' offset (the tokenizer's unless `offset` is given; 1 for a bare size)."""
    if isinstance(vocab_size, int):
        d_vocab, tok_offset = vocab_size, 1
    else:
        d_vocab, tok_offset = vocab_size.vocab_size, vocab_size.offset
    return d_vocab, tok_offset if offset is None else offset


def _check_sizes(sizes: dict[str, int], d_head: int | None) -> int:
    """ValueError on a size below 1 or heads that do not divide `d_model` (without `d_head`); the head dimension."""
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if d_head is None:
        d_model, n_heads = sizes["d_model"], sizes["n_heads"]
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}; pass d_head explicitly")
        d_head = d_model // n_heads
    return d_head


@dataclass(frozen=True)
class TinyConfig:
    """The sizes and settings of a `tiny` model; each field is also a keyword of `tiny`
    (`tiny(tok, n_layers=2, d_model=64)` equals `tiny(tok, TinyConfig(n_layers=2, d_model=64))`)."""

    n_layers: int = 2  # transformer blocks
    n_heads: int = 8  # attention heads per block
    d_model: int = 128  # width of the residual stream
    d_head: int | None = None  # width of one head (None: d_model // n_heads)
    d_mlp: int | None = None  # hidden width of the MLP (None: 4 * d_model)
    n_ctx: int = 256  # context length (rotary tables stop here)
    seed: int = 0  # seed of the initial weights
    task: Task | str | None = None  # a task (or a task name: its OOD preset) whose longest sample n_ctx must fit
    offset: int | None = None  # tokens before each sample (None: the tokenizer's, else 1)
    device: str | torch.device | None = None  # where the weights live (None: the backend's default)
    positional: Positional = "rotary"  # "rotary", "learned", "alibi" or "none" (`Positional`)
    backend: Backend | None = None  # "hooked" or "bridge" (None: `default_backend()`, "bridge" on TransformerLens 4)


class TinySettings(TypedDict, total=False):
    """`TinyConfig`'s fields as typed keywords of `tiny` (the defaults are `TinyConfig`'s; a test keeps the two lists
    equal)."""

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int | None
    d_mlp: int | None
    n_ctx: int
    seed: int
    task: Task | str | None
    offset: int | None
    device: str | torch.device | None
    positional: Positional
    backend: Backend | None


def tiny_config(config: TinyConfig | None, settings: dict) -> TinyConfig:
    """`config` (default `TinyConfig()`) with the keywords `settings` over it; TypeError naming an unknown one."""
    known = {f.name for f in fields(TinyConfig)}
    for key in settings:
        if key not in known:
            raise TypeError(f"tiny() got an unexpected keyword argument {key!r} (known: {', '.join(sorted(known))})")
    return replace(config or TinyConfig(), **settings)


def tiny(
    vocab_size: int | Tokenizer,
    config: TinyConfig | None = None,
    **settings: Unpack[TinySettings],
) -> HookedTransformer | TransformerBridge:
    """A from-scratch model that trains on CPU in minutes: LayerNorm, gelu, no dropout, `positional` encoding
    (rotary by default; "learned", "alibi" or "none", see `Positional`). ALiBi models use the tanh GELU
    ("gelu_new"), which makes them exactly Bloom (`aspan.models.bloom`).

    A `HookedTransformer` on TransformerLens 3; on TransformerLens 4 (which has no HookedTransformer), or with
    `backend="bridge"` (or `ASPAN_BACKEND=bridge`), the same network in its Hugging Face form inside a
    `TransformerBridge`. Both take every analysis, edit and training of aspan.

    The sizes and settings are `TinyConfig`'s fields, given as `config`, as keywords (`tiny(tok, n_layers=2,
    d_model=64)`), or both (the keywords win). `d_head` defaults to `d_model // n_heads`, `d_mlp` to `4 * d_model`.
    With `task` (or a task name: its OOD preset), `n_ctx` is checked to cover the longest sample; `offset` defaults
    to the tokenizer's (else 1).
    """
    c = tiny_config(config, settings)
    n_layers, n_heads, d_model, n_ctx, positional = c.n_layers, c.n_heads, c.d_model, c.n_ctx, c.positional
    d_head, d_mlp, offset, task, device = c.d_head, c.d_mlp, c.offset, c.task, c.device
    import_transformer_lens()
    d_vocab, offset = _vocab(vocab_size, offset)
    d_head = _check_sizes({"vocab_size": d_vocab, "n_layers": n_layers, "n_heads": n_heads, "d_model": d_model,
                           "n_ctx": n_ctx}, d_head)
    pos_cfg = positional_cfg(positional, d_head)
    if task is not None:
        check_context(n_ctx, task, offset)
    d_mlp = 4 * d_model if d_mlp is None else d_mlp
    from .safety import check_tl_memory

    backend = backend_named(c.backend or default_backend())
    if not backend.available():
        raise ValueError(f"backend {backend.name!r} needs HookedTransformer, which TransformerLens 4 does not have: "
                         f"use backend='bridge', or install TransformerLens 3.9 (pip install 'aspan[hooked]')")
    sizes = dict(d_vocab=d_vocab, n_layers=n_layers, n_heads=n_heads, d_model=d_model, d_head=d_head, d_mlp=d_mlp,
                 n_ctx=n_ctx)
    check_tl_memory("tiny model", {**sizes, **pos_cfg}, device, masks=backend.keeps_masks)
    return backend.fresh(sizes, positional, c.seed, device, None if isinstance(vocab_size, int) else vocab_size)
