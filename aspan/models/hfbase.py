"""What every Hugging Face form of a tiny model shares (`aspan.models.neox`, `gpt2`, `bloom`): the sizes a form's
config needs, the checks every form makes, the unembedding-bias fold and the special token ids. The bottom of the
forms: they import it, and `aspan.models.hfform` (which dispatches to the forms) imports them; none imports back."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..tokenization import CharTokenizer

KEY = "aspan"  # the entry of config.json that holds the tokenizer and the metadata
VERSION = 2
FOLD_TOL = 1e-5  # max |b' W_U - (b W_U + b_U)| allowed, relative to the largest logit bias


@dataclass(frozen=True)
class Sizes:
    """The shape of a tiny model: what a Hugging Face config of any form needs."""

    d_vocab: int  # vocabulary size
    n_layers: int  # transformer blocks
    n_heads: int  # attention heads per block (d_head = d_model / n_heads)
    d_model: int  # residual width
    d_mlp: int  # MLP hidden width
    n_ctx: int  # context length: the learned position table's size, the rotary tables' length
    eps: float = 1e-5  # LayerNorm epsilon (TransformerLens's default)
    rotary_fraction: float = 1.0  # share of each head's dimensions that rotate (GPT-NeoX; 0 = no positions)
    rotary_base: float = 10000.0  # rotary base theta (GPT-NeoX)

    @classmethod
    def of(cls, cfg) -> Sizes:
        """The sizes of a TransformerLens config."""
        rotary = cfg.positional_embedding_type == "rotary"
        return cls(cfg.d_vocab, cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_mlp, cfg.n_ctx, cfg.eps,
                   (cfg.rotary_dim or 0) / cfg.d_head if rotary else 1.0, float(cfg.rotary_base))


def positional_of_cfg(cfg) -> str:
    """The `Positional` name (rotary, learned, alibi or none) of a TransformerLens config: NoPE is rotary over 0
    dimensions."""
    kind = cfg.positional_embedding_type
    if kind == "rotary":
        return "none" if not cfg.rotary_dim else "rotary"
    return {"standard": "learned", "alibi": "alibi"}.get(kind, kind)


def common_checks(cfg, act_fn: str = "gelu") -> list[tuple[Any, str]]:
    """(test, reason) pairs every form needs: LayerNorm, the form's GELU (`act_fn`: erf "gelu" unless the form says
    otherwise), a sequential residual, a plain MLP, full heads scaled by sqrt(d_head), no local attention or QK
    norm."""
    return [
        (lambda: cfg.normalization_type == "LN", f"normalization {cfg.normalization_type!r} is not LayerNorm"),
        (lambda: cfg.act_fn == act_fn, f"activation {cfg.act_fn!r} is not {act_fn}"),
        (lambda: not cfg.parallel_attn_mlp, "the residual is parallel"),
        (lambda: not cfg.gated_mlp and not cfg.attn_only, "the MLP is gated or absent"),
        (lambda: cfg.d_head * cfg.n_heads == cfg.d_model, "d_head x n_heads != d_model"),
        (lambda: cfg.n_key_value_heads in (None, cfg.n_heads), "grouped-query attention"),
        (
            lambda: cfg.use_attn_scale and abs(cfg.attn_scale - cfg.d_head**0.5) < 1e-9,
            "attention is not scaled by sqrt(d_head)",
        ),
        (lambda: not cfg.use_local_attn and not getattr(cfg, "use_qk_norm", False), "local attention or QK norm"),
    ]


def first_failure(model, checks: list[tuple[Any, str]]) -> str | None:
    """The reason of the first failing check (in order: later tests assume the earlier ones passed), then whether
    the unembedding bias folds; None if all pass."""
    for ok, reason in checks:
        if not ok():
            return reason
    if fold_unembed_bias(model) is None:
        cfg = model.cfg
        return f"the unembedding bias cannot be folded into the final LayerNorm (d_vocab {cfg.d_vocab} > d_model " \
               f"{cfg.d_model} or W_U rank-deficient)"
    return None


def fold_unembed_bias(model) -> Tensor | None:
    """The final LayerNorm bias `b'` with `b' W_U = b W_U + b_U` (exact to FOLD_TOL), or None if there is none."""
    return fold_bias(model.unembed.W_U, model.unembed.b_U, model.ln_final.b)


def fold_bias(W_U: Tensor, b_U: Tensor, b: Tensor) -> Tensor | None:
    """`b'` with `b' W_U = b W_U + b_U` for `W_U` [d_model, d_vocab], solved in float64; None if none is exact."""
    dtype = b.dtype
    W_U, b_U, b = (x.detach().double().cpu() for x in (W_U, b_U, b))
    if not b_U.abs().max() > 0:
        return b.to(dtype)
    delta = torch.linalg.lstsq(W_U.T, b_U[:, None]).solution[:, 0]  # W_U^T delta = b_U
    err = (delta @ W_U - b_U).abs().max()
    if not err <= FOLD_TOL * max(1.0, float(b_U.abs().max())):
        return None
    return (b + delta).to(dtype)


def token_ids(tokenizer: CharTokenizer | None) -> dict[str, int]:
    """The special token ids a Hugging Face config records (none without a tokenizer)."""
    if tokenizer is None:
        return {}
    return {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}
