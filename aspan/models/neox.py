"""The GPT-NeoX form of tiny models with rotary positions or none (NoPE): exact, with a sequential residual.

The tiny model (LayerNorm, rotary in TransformerLens's rotate-half layout, a GELU MLP, biases everywhere) is a
GPT-NeoX with `use_parallel_residual=False`, except for the unembedding bias, folded into the final LayerNorm bias
(`aspan.models.hfform`). NoPE is rotary over 0 dimensions in both: `partial_rotary_factor` 0 rotates nothing and
GPT-NeoX has no positional parameter, so a NoPE model stays NoPE when trained. What every form shares is in
`aspan.models.hfbase`; saving, reading back and the bridge's weights are in `aspan.models.hfform`.
"""
from __future__ import annotations

from typing import Any

import einops
import torch
from torch import Tensor

from ..tokenization import CharTokenizer
from .hfbase import Sizes, common_checks, first_failure, fold_unembed_bias, token_ids

MODEL_TYPE = "gpt_neox"
FUSED_QKV = "query_key_value"  # the fused projection's name inside `attention.`
FINAL_LN_BIAS = "gpt_neox.final_layer_norm.bias"


def why_not(model) -> str | None:
    """None if `model` converts exactly to GPT-NeoX, else the reason it does not."""
    cfg = model.cfg
    checks = [
        (lambda: cfg.positional_embedding_type == "rotary", "positions are not rotary (nor none)"),
        (
            lambda: not getattr(cfg, "rotary_adjacent_pairs", False),
            "rotary pairs are adjacent (GPT-NeoX rotates halves)",
        ),
        *common_checks(cfg),
        (
            lambda: (cfg.rotary_dim or 0) % 2 == 0 and (cfg.rotary_dim or 0) <= cfg.d_head,
            "rotary_dim must be even and <= d_head",
        ),
    ]
    return first_failure(model, checks)


def hf_class():
    """`transformers.GPTNeoXForCausalLM`, imported on call."""
    from transformers import GPTNeoXForCausalLM

    return GPTNeoXForCausalLM


def hf_config(sizes: Sizes, tokenizer: CharTokenizer | None = None):
    """The `GPTNeoXConfig` of a tiny model of `sizes`."""
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        vocab_size=sizes.d_vocab, hidden_size=sizes.d_model, num_hidden_layers=sizes.n_layers,
        num_attention_heads=sizes.n_heads, intermediate_size=sizes.d_mlp, hidden_act="gelu",
        max_position_embeddings=sizes.n_ctx, layer_norm_eps=sizes.eps, use_parallel_residual=False,
        tie_word_embeddings=False, attention_bias=True, hidden_dropout=0.0, attention_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": sizes.rotary_base,
                         "partial_rotary_factor": sizes.rotary_fraction},
        architectures=["GPTNeoXForCausalLM"], **token_ids(tokenizer),
    )


def sizes_of_config(config: dict[str, Any]) -> Sizes:
    """The `Sizes` of a GPT-NeoX Hugging Face config (rotary fraction and base included)."""
    rope = config.get("rope_parameters") or {}
    return Sizes(config["vocab_size"], config["num_hidden_layers"], config["num_attention_heads"],
                 config["hidden_size"], config["intermediate_size"], config["max_position_embeddings"],
                 config["layer_norm_eps"], rope.get("partial_rotary_factor", 1.0), rope.get("rope_theta", 10000.0))


def pos_cfg(sizes: Sizes) -> dict[str, Any]:
    """TransformerLens positional fields: rotary over the rotating share of each head (0 dimensions: NoPE)."""
    d_head = sizes.d_model // sizes.n_heads
    return {"positional_embedding_type": "rotary", "rotary_dim": round(sizes.rotary_fraction * d_head),
            "rotary_base": sizes.rotary_base}


def positional_of_config(config: dict[str, Any]) -> str:
    """The positional scheme of a GPT-NeoX config: `rotary`, or `none` when no dimension rotates."""
    return "rotary" if sizes_of_config(config).rotary_fraction > 0 else "none"


def to_hf_state(model) -> dict[str, Tensor]:
    """GPT-NeoX weights (HF names) of a convertible TransformerLens model: the inverse of TransformerLens's own
    `convert_neox_weights`, plus the folded final LayerNorm bias."""
    cfg, sd = model.cfg, {k: v.detach().cpu() for k, v in model.state_dict().items()}
    out = {"gpt_neox.embed_in.weight": sd["embed.W_E"]}
    for l in range(cfg.n_layers):
        p, a = f"gpt_neox.layers.{l}.", f"blocks.{l}.attn."
        W = torch.stack([sd[a + "W_Q"], sd[a + "W_K"], sd[a + "W_V"]])  # [qkv, head, d_model, d_head]
        b = torch.stack([sd[a + "b_Q"], sd[a + "b_K"], sd[a + "b_V"]])  # [qkv, head, d_head]
        out |= {
            p + "input_layernorm.weight": sd[f"blocks.{l}.ln1.w"], p + "input_layernorm.bias": sd[f"blocks.{l}.ln1.b"],
            p + "attention.query_key_value.weight": einops.rearrange(W, "qkv i m h -> (i qkv h) m"),
            p + "attention.query_key_value.bias": einops.rearrange(b, "qkv i h -> (i qkv h)"),
            p + "attention.dense.weight": einops.rearrange(sd[a + "W_O"], "i h m -> m (i h)"),
            p + "attention.dense.bias": sd[a + "b_O"],
            p + "post_attention_layernorm.weight": sd[f"blocks.{l}.ln2.w"],
            p + "post_attention_layernorm.bias": sd[f"blocks.{l}.ln2.b"],
            p + "mlp.dense_h_to_4h.weight": sd[f"blocks.{l}.mlp.W_in"].T,
            p + "mlp.dense_h_to_4h.bias": sd[f"blocks.{l}.mlp.b_in"],
            p + "mlp.dense_4h_to_h.weight": sd[f"blocks.{l}.mlp.W_out"].T,
            p + "mlp.dense_4h_to_h.bias": sd[f"blocks.{l}.mlp.b_out"],
        }
    out["gpt_neox.final_layer_norm.weight"] = sd["ln_final.w"]
    out[FINAL_LN_BIAS] = fold_unembed_bias(model).cpu()
    out["lm_head.weight"] = sd["unembed.W_U"].T
    return {k: v.contiguous() for k, v in out.items()}


def fuse_qkv(parts: list[Tensor], kind: str, config) -> Tensor:
    """`query_key_value`'s weight or bias from the bridge's separate q, k, v ones, in GPT-NeoX's (head, qkv, d_head)
    order."""
    fused = torch.stack(parts)  # [qkv, (head d_head), ...]
    pattern = "qkv (i h) m -> (i qkv h) m" if kind == "weight" else "qkv (i h) -> (i qkv h)"
    return einops.rearrange(fused, pattern, i=config.num_attention_heads)


def from_hf_state(state: dict[str, Tensor], cfg) -> dict[str, Tensor]:
    """TransformerLens weights (all but `b_U`) from GPT-NeoX ones."""
    g = lambda k: state[k]  # noqa: E731
    out = {"embed.W_E": g("gpt_neox.embed_in.weight")}
    for l in range(cfg.n_layers):
        p, a = f"gpt_neox.layers.{l}.", f"blocks.{l}.attn."
        W = einops.rearrange(
            g(p + "attention.query_key_value.weight"), "(i qkv h) m -> qkv i m h", i=cfg.n_heads, qkv=3
        )
        b = einops.rearrange(g(p + "attention.query_key_value.bias"), "(i qkv h) -> qkv i h", i=cfg.n_heads, qkv=3)
        out |= {
            f"blocks.{l}.ln1.w": g(p + "input_layernorm.weight"), f"blocks.{l}.ln1.b": g(p + "input_layernorm.bias"),
            a + "W_Q": W[0], a + "W_K": W[1], a + "W_V": W[2], a + "b_Q": b[0], a + "b_K": b[1], a + "b_V": b[2],
            a + "W_O": einops.rearrange(g(p + "attention.dense.weight"), "m (i h) -> i h m", i=cfg.n_heads),
            a + "b_O": g(p + "attention.dense.bias"),
            f"blocks.{l}.ln2.w": g(p + "post_attention_layernorm.weight"),
            f"blocks.{l}.ln2.b": g(p + "post_attention_layernorm.bias"),
            f"blocks.{l}.mlp.W_in": g(p + "mlp.dense_h_to_4h.weight").T,
            f"blocks.{l}.mlp.b_in": g(p + "mlp.dense_h_to_4h.bias"),
            f"blocks.{l}.mlp.W_out": g(p + "mlp.dense_4h_to_h.weight").T,
            f"blocks.{l}.mlp.b_out": g(p + "mlp.dense_4h_to_h.bias"),
        }
    out["ln_final.w"], out["ln_final.b"] = g("gpt_neox.final_layer_norm.weight"), g(FINAL_LN_BIAS)
    out["unembed.W_U"] = state.get("embed_out.weight", state.get("lm_head.weight")).T
    return out
