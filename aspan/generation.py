"""Greedy generation from equal-length prompts, KV-cached through the model's backend (`aspan.models.backend`), with
hooks active and, for interleaved formats, characters given rather than generated.

    new = greedy(model, prompt_ids, 20, eos_id=tokenizer.eos_id)
    assert torch.equal(new, greedy(model, prompt_ids, 20, eos_id=tokenizer.eos_id, use_cache=False))

`aspan.evaluation.evaluate(..., mode="generate")` scores samples this way.
"""
from __future__ import annotations

from typing import Callable, Sequence, TypedDict, Unpack

import torch
from jaxtyping import Int
from torch import Tensor

from .models.backend import backend_of

HookList = Sequence[tuple[str, Callable]]


class GreedySettings(TypedDict, total=False):
    """The optional keywords of `greedy` (their defaults in brackets)."""

    use_cache: bool  # reuse keys and values between steps [True]; False re-runs the whole sequence each step
    fwd_hooks: HookList  # hooks active in every forward of the generation [none]
    forced: Int[Tensor, "batch new"] | None  # per step a token id to emit, or -1 for the model's choice [None]


# ----------------------------------------------------------------------------------------------- generation
@torch.no_grad()
def greedy(
    model,
    prompt: Int[Tensor, "batch p"],
    max_new: int,
    eos_id: int | None = None,
    **options: Unpack[GreedySettings],
) -> Int[Tensor, "batch new"]:
    """Greedy continuation of equal-length prompts, up to `max_new` tokens; stops early once every row emitted EOS.

    With `use_cache` (the default) the prompt is run once and each new token reuses the keys and values
    (TransformerLens KV cache); with `use_cache=False` every step re-runs the whole sequence (the reference the cache
    must equal). `fwd_hooks` are active throughout; `forced` (token id, or -1 for "the model's choice") supplies
    the `given` characters of interleaved formats (`GreedySettings`).
    """
    unknown = sorted(set(options) - set(GreedySettings.__annotations__))
    if unknown:
        raise TypeError(f"greedy() got an unexpected keyword argument {unknown[0]!r}")
    use_cache, forced = options.get("use_cache", True), options.get("forced")
    fwd_hooks = options.get("fwd_hooks", ())
    b, p = prompt.shape
    if p + max_new - 1 > model.cfg.n_ctx:
        raise ValueError(f"prompt ({p}) + {max_new} new tokens exceed the model's context n_ctx={model.cfg.n_ctx}")
    device = model.cfg.device
    seq = prompt.to(device)
    out: list[Tensor] = []
    done = torch.zeros(b, dtype=torch.bool, device=device)
    step_fn = cached_step(model, b, device) if use_cache else None
    with model.hooks(fwd_hooks=list(fwd_hooks)):
        logits = step_fn(seq, p) if use_cache else model(seq)
        for step in range(max_new):
            nxt = logits[:, -1].argmax(-1)
            if forced is not None and step < forced.shape[1]:
                nxt = torch.where(forced[:, step].to(device) >= 0, forced[:, step].to(device), nxt)
            out.append(nxt)
            if eos_id is not None:
                done |= nxt == eos_id
            if step == max_new - 1 or bool(done.all()):
                break
            if use_cache:
                logits = step_fn(nxt[:, None], p + step + 1)
            else:
                seq = torch.cat([seq, nxt[:, None]], 1)
                logits = model(seq)
    return torch.stack(out, 1)


def cached_step(model, batch: int, device) -> Callable[[Tensor, int], Tensor]:
    """`step(new_tokens, total_len) -> logits`: a forward over the new tokens only, reusing the KV cache (the first
    call runs the prompt): the backend's own cache (`aspan.models.backend`)."""
    return backend_of(model).cached_step(model, batch, device)
