"""The Bloom form of tiny models with ALiBi positions: exact.

TransformerLens's ALiBi tiny model (Press et al. 2022: `q.k / sqrt(d_head) + m_h (j - i)` with slopes
`m_h = 2^(-8 (h + 1) / n_heads)`; LayerNorm, biases in attention and MLP, a sequential residual) is a
`BloomForCausalLM` when three things hold, each checked by `why_not`:

- the MLP uses the tanh GELU (TransformerLens's "gelu_new"), which Bloom hard-wires (`bloom_gelu_forward`); so
  `models.tiny(positional="alibi")` builds ALiBi models with "gelu_new";
- the head count is a power of two: Bloom's slopes equal TransformerLens's only then (other counts interleave a
  second geometric series), and its bias `m_h j` differs from `m_h (j - i)` by a per-row constant the softmax
  ignores; the attention is otherwise `alibi + q.k / sqrt(d_head)` (`baddbmm`, the bias unscaled);
- the vocabulary is smaller than `d_model`: Bloom always applies a LayerNorm to the token embeddings
  (`word_embeddings_layernorm`), so the stored embeddings `E'` and that LayerNorm's weight `w` and bias `b` are
  solved for so that `LN(E'_i) w + b = E_i` for every token `i` (`embedding_layernorm_inverse`).

The weights are laid out as GPT-NeoX's (`query_key_value` in (head, qkv, d_head) order, `dense`, `dense_h_to_4h`,
`dense_4h_to_h`) under other names, so the conversion is GPT-NeoX's (`aspan.models.neox`) with names mapped; the
unembedding bias is folded into `ln_f`'s bias as for every form (`aspan.models.hfform`).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..tokenization import CharTokenizer
from . import neox
from .hfbase import Sizes, common_checks, first_failure, token_ids

MODEL_TYPE = "bloom"
ACT_FN = "gelu_new"  # TransformerLens's name of Bloom's tanh GELU
FUSED_QKV = "query_key_value"  # the fused projection's name inside `self_attention.`
FINAL_LN_BIAS = "transformer.ln_f.bias"
SCALE = 1e3  # |E'_i| / sqrt(d_model): the embedding LayerNorm's epsilon then moves its output by ~eps / 2 SCALE^2
# GPT-NeoX names -> Bloom names (prefixes; the embeddings are converted apart)
NAMES = (("gpt_neox.layers.", "transformer.h."), (".attention.", ".self_attention."),
         ("gpt_neox.final_layer_norm.", "transformer.ln_f."))


def why_not(model) -> str | None:
    """None if `model` converts exactly to Bloom, else the reason it does not."""
    cfg = model.cfg
    n = cfg.n_heads
    checks = [
        (lambda: cfg.positional_embedding_type == "alibi", "positions are not ALiBi"),
        (lambda: n & (n - 1) == 0, f"{n} heads is not a power of two (Bloom's ALiBi slopes differ then)"),
        (lambda: cfg.d_mlp == 4 * cfg.d_model, f"d_mlp {cfg.d_mlp} is not 4 x d_model (Bloom's MLP width)"),
        (lambda: cfg.d_vocab < cfg.d_model, f"d_vocab {cfg.d_vocab} >= d_model {cfg.d_model}: the embedding "
                                            "LayerNorm cannot be inverted"),
        *common_checks(cfg, act_fn=ACT_FN),
        (lambda: embedding_layernorm_inverse(model.embed.W_E) is not None, "the embedding LayerNorm cannot be "
                                                                          "inverted for these embeddings"),
    ]
    return first_failure(model, checks)


def embedding_layernorm_inverse(E: Tensor, tol: float = 1e-9) -> tuple[Tensor, Tensor, Tensor] | None:
    """`(E', w, b)` with `LayerNorm(E'_i) * w + b == E_i` for every row of `E` [d_vocab, d_model] (in float64, to `tol`
    relative to the largest entry of `E` or `b`), or None when there is none.

    Rows of `n = (E - b) / w` must have mean 0 and variance 1 (then `E' = SCALE * n`). With `u = 1 / w` and
    `v = b / w`, `n_i = E_i * u - v`: zero means ask `E u = s` for one scalar `s` (linear); a linear programme
    picks the `u` farthest from 0 relative to its largest entry. Unit variances ask `|E_i * u - v|^2 = d_model`:
    their differences and `sum(v) = s` are linear in `v`; of their solutions, `v` is the one closest to `E_0 * u`,
    and the scale of `(u, v)` (which leaves `b = v / u` unchanged) is set so the first row's variance is 1.
    Stored in float32, the embeddings are exact to about `1e-7 * max|b|`: `b` grows as `d_vocab` nears `d_model`."""
    from scipy.optimize import linprog

    En = E.detach().double().cpu().numpy()
    V, d = En.shape
    if V >= d:
        return None
    u0 = np.ones(d) + np.linalg.lstsq(En, np.full(V, En.sum(1).mean()) - En.sum(1), rcond=None)[0]
    sign = np.where(u0 < 0, -1.0, 1.0)  # variables (u, s, t): minimise t, 1 <= sign * u <= t, E u = s
    cost = np.r_[np.zeros(d + 1), 1.0]
    bound_rows = np.block([[-np.diag(sign), np.zeros((d, 2))], [np.diag(sign), np.zeros((d, 1)), -np.ones((d, 1))]])
    lp = linprog(cost, A_ub=bound_rows, b_ub=np.r_[-np.ones(d), np.zeros(d)],
                 A_eq=np.c_[En, -np.ones(V), np.zeros(V)], b_eq=np.zeros(V), bounds=[(None, None)] * (d + 2),
                 method="highs")
    if lp.status != 0:
        return None
    return _solve_v(En, lp.x[:d], lp.x[d], tol)


def _solve_v(En: np.ndarray, u: np.ndarray, s: float, tol: float) -> tuple[Tensor, Tensor, Tensor] | None:
    """The rest of `embedding_layernorm_inverse`: `v` with `sum(v) = s` and `|a_i - v|^2 = d` for `a = E * u`."""
    V, d = En.shape
    a = En * u
    eqs = np.r_[2 * (a[1:] - a[0]), np.ones((1, d))]
    rhs = np.r_[(a[1:] ** 2).sum(1) - (a[0] ** 2).sum(), s]
    v0 = np.linalg.lstsq(eqs, rhs, rcond=None)[0]
    null = np.linalg.svd(eqs)[2][V:].T  # [d, d - V]: directions orthogonal to every equation's row
    v = v0 + null @ (null.T @ (a[0] - v0))  # the solution closest to a_0
    radius = np.linalg.norm(a[0] - v)
    if not radius > 0:
        return None
    u, v = u * d**0.5 / radius, v * d**0.5 / radius  # |a_i - v|^2 = d for every i
    n, w, b = En * u - v, 1 / u, v / u
    err = np.abs(n * w + b - En).max()
    if not err <= tol * max(1.0, np.abs(En).max(), np.abs(b).max()) or not np.allclose(n.mean(1), 0, atol=1e-9):
        return None
    dtype = torch.float32
    return (torch.tensor(SCALE * n, dtype=dtype), torch.tensor(w, dtype=dtype), torch.tensor(b, dtype=dtype))


def hf_class():
    """`transformers.BloomForCausalLM`, imported on call."""
    from transformers import BloomForCausalLM

    return BloomForCausalLM


def hf_config(sizes: Sizes, tokenizer: CharTokenizer | None = None):
    """The `BloomConfig` of a tiny model of `sizes` (no dropout, untied unembedding; `n_positions` records the
    context length TransformerLens's ALiBi tables need)."""
    from transformers import BloomConfig

    return BloomConfig(
        vocab_size=sizes.d_vocab, hidden_size=sizes.d_model, n_layer=sizes.n_layers, n_head=sizes.n_heads,
        layer_norm_epsilon=sizes.eps, hidden_dropout=0.0, attention_dropout=0.0, tie_word_embeddings=False,
        apply_residual_connection_post_layernorm=False, n_positions=sizes.n_ctx, architectures=["BloomForCausalLM"],
        **token_ids(tokenizer),
    )


def sizes_of_config(config: dict[str, Any]) -> Sizes:
    """The `Sizes` of a BLOOM Hugging Face config."""
    d_model = config["hidden_size"]
    return Sizes(config["vocab_size"], config["n_layer"], config["n_head"], d_model, 4 * d_model,
                 config["n_positions"], config["layer_norm_epsilon"])


def pos_cfg(sizes: Sizes) -> dict[str, Any]:
    """The TransformerLens config entries of the form's positions (ALiBi)."""
    return {"positional_embedding_type": "alibi"}


def positional_of_config(config: dict[str, Any]) -> str:
    """The positional scheme of a BLOOM config: always `alibi`."""
    return "alibi"


def _renamed(state: dict[str, Tensor], pairs) -> dict[str, Tensor]:
    out = {}
    for key, value in state.items():
        for old, new in pairs:
            key = key.replace(old, new)
        out[key] = value
    return out


def to_hf_state(model) -> dict[str, Tensor]:
    """Bloom weights (HF names) of a convertible TransformerLens model: GPT-NeoX's, renamed, with the embeddings
    and their LayerNorm solved for."""
    state = neox.to_hf_state(model)
    del state["gpt_neox.embed_in.weight"]
    inverse = embedding_layernorm_inverse(model.embed.W_E)
    if inverse is None:
        raise ValueError("the embedding LayerNorm cannot be inverted for these embeddings")
    E, w, b = inverse
    out = _renamed(state, NAMES)
    out |= {"transformer.word_embeddings.weight": E, "transformer.word_embeddings_layernorm.weight": w,
            "transformer.word_embeddings_layernorm.bias": b}
    return {k: v.contiguous() for k, v in out.items()}


def fuse_qkv(parts: list[Tensor], kind: str, config) -> Tensor:
    """`query_key_value`'s weight or bias from separate q, k, v ones (GPT-NeoX's layout)."""
    return neox.fuse_qkv(parts, kind, config)


def from_hf_state(state: dict[str, Tensor], cfg) -> dict[str, Tensor]:
    """TransformerLens weights (all but `b_U`) from Bloom ones: the embedding LayerNorm applied to the stored
    embeddings gives `W_E`."""
    E = state["transformer.word_embeddings.weight"].double()
    w, b = (state[f"transformer.word_embeddings_layernorm.{x}"].double() for x in ("weight", "bias"))
    W_E = torch.nn.functional.layer_norm(E, (E.shape[-1],), w, b, eps=cfg.eps).to(E.dtype)
    neox_state = _renamed({k: v for k, v in state.items() if "word_embeddings" not in k},
                          [(new, old) for old, new in NAMES])
    neox_state["gpt_neox.embed_in.weight"] = W_E.float()
    out = neox.from_hf_state(neox_state, cfg)
    out["pos_embed.W_pos"] = torch.zeros(cfg.n_ctx, cfg.d_model)  # HookedTransformer 3.9 builds it for ALiBi, unused
    return out
