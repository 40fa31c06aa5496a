"""The GPT-2 form of tiny models with learned absolute positions: exact.

TransformerLens's learned-position tiny model (`positional_embedding_type` "standard": LayerNorm, erf GELU, biases,
attention scaled by sqrt(d_head)) is a `GPT2LMHeadModel` with `activation_function="gelu"` (erf, not GPT-2's own
tanh "gelu_new"), untied embeddings and no dropout; the inverse of TransformerLens's `convert_gpt2_weights`. GPT-2's
`lm_head` has no bias: the unembedding bias is folded into `ln_f`'s (`aspan.models.hfform`). GPT-2 keeps its
weights as Conv1D, [in, out].
"""
from __future__ import annotations

from typing import Any

import einops
import torch
from torch import Tensor

from ..tokenization import CharTokenizer
from .hfbase import Sizes, common_checks, first_failure, fold_unembed_bias, token_ids

MODEL_TYPE = "gpt2"
FUSED_QKV = "c_attn"  # the fused projection's name inside `attn.`
FINAL_LN_BIAS = "transformer.ln_f.bias"


def why_not(model) -> str | None:
    """None if `model` converts exactly to GPT-2, else the reason it does not."""
    cfg = model.cfg
    checks = [(lambda: cfg.positional_embedding_type == "standard", "positions are not learned"), *common_checks(cfg)]
    return first_failure(model, checks)


def hf_class():
    """`transformers.GPT2LMHeadModel`, imported on call."""
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel


def hf_config(sizes: Sizes, tokenizer: CharTokenizer | None = None):
    """The `GPT2Config` of a tiny model of `sizes` (erf GELU, no dropout, untied unembedding)."""
    from transformers import GPT2Config

    ids = token_ids(tokenizer) or {"bos_token_id": None, "eos_token_id": None}  # not GPT-2's 50256
    return GPT2Config(
        vocab_size=sizes.d_vocab, n_embd=sizes.d_model, n_layer=sizes.n_layers, n_head=sizes.n_heads,
        n_inner=sizes.d_mlp, n_positions=sizes.n_ctx, layer_norm_epsilon=sizes.eps, activation_function="gelu",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False, tie_word_embeddings=False,
        architectures=["GPT2LMHeadModel"], **ids,
    )


def sizes_of_config(config: dict[str, Any]) -> Sizes:
    """The `Sizes` of a GPT-2 Hugging Face config."""
    d_model = config["n_embd"]
    return Sizes(config["vocab_size"], config["n_layer"], config["n_head"], d_model,
                 config.get("n_inner") or 4 * d_model, config["n_positions"], config["layer_norm_epsilon"])


def pos_cfg(sizes: Sizes) -> dict[str, Any]:
    """The TransformerLens config entries of the form's positions (learned)."""
    return {"positional_embedding_type": "standard"}


def positional_of_config(config: dict[str, Any]) -> str:
    """The positional scheme of a GPT-2 config: always `learned`."""
    return "learned"


def to_hf_state(model) -> dict[str, Tensor]:
    """GPT-2 weights (HF names) of a convertible TransformerLens model, plus the folded final LayerNorm bias."""
    cfg, sd = model.cfg, {k: v.detach().cpu() for k, v in model.state_dict().items()}
    out = {"transformer.wte.weight": sd["embed.W_E"], "transformer.wpe.weight": sd["pos_embed.W_pos"]}
    for l in range(cfg.n_layers):
        p, a = f"transformer.h.{l}.", f"blocks.{l}.attn."
        W = [einops.rearrange(sd[a + w], "i m h -> m (i h)") for w in ("W_Q", "W_K", "W_V")]
        out |= {
            p + "ln_1.weight": sd[f"blocks.{l}.ln1.w"], p + "ln_1.bias": sd[f"blocks.{l}.ln1.b"],
            p + "attn.c_attn.weight": torch.cat(W, dim=1),  # [d_model, (q k v)]
            p + "attn.c_attn.bias": torch.cat([sd[a + b].flatten() for b in ("b_Q", "b_K", "b_V")]),
            p + "attn.c_proj.weight": einops.rearrange(sd[a + "W_O"], "i h m -> (i h) m"),
            p + "attn.c_proj.bias": sd[a + "b_O"],
            p + "ln_2.weight": sd[f"blocks.{l}.ln2.w"], p + "ln_2.bias": sd[f"blocks.{l}.ln2.b"],
            p + "mlp.c_fc.weight": sd[f"blocks.{l}.mlp.W_in"], p + "mlp.c_fc.bias": sd[f"blocks.{l}.mlp.b_in"],
            p + "mlp.c_proj.weight": sd[f"blocks.{l}.mlp.W_out"], p + "mlp.c_proj.bias": sd[f"blocks.{l}.mlp.b_out"],
        }
    out["transformer.ln_f.weight"] = sd["ln_final.w"]
    out[FINAL_LN_BIAS] = fold_unembed_bias(model).cpu()
    out["lm_head.weight"] = sd["unembed.W_U"].T
    return {k: v.contiguous() for k, v in out.items()}


def fuse_qkv(parts: list[Tensor], kind: str, config) -> Tensor:
    """`c_attn`'s weight ([d_model, (q k v)], Conv1D) or bias from the bridge's separate q, k, v Linear ones."""
    return torch.cat([x.T for x in parts], dim=1) if kind == "weight" else torch.cat(parts)


def from_hf_state(state: dict[str, Tensor], cfg) -> dict[str, Tensor]:
    """TransformerLens weights (all but `b_U`) from GPT-2 ones: TransformerLens's `convert_gpt2_weights`."""
    out = {"embed.W_E": state["transformer.wte.weight"], "pos_embed.W_pos": state["transformer.wpe.weight"]}
    for l in range(cfg.n_layers):
        p, a = f"transformer.h.{l}.", f"blocks.{l}.attn."
        W = state[p + "attn.c_attn.weight"].split(cfg.d_model, dim=1)
        b = state[p + "attn.c_attn.bias"].view(3, cfg.n_heads, cfg.d_head)
        out |= {f"{a}W_{x}": einops.rearrange(w, "m (i h) -> i m h", i=cfg.n_heads) for x, w in zip("QKV", W)}
        out |= {f"{a}b_{x}": b[n] for n, x in enumerate("QKV")}
        out |= {
            f"blocks.{l}.ln1.w": state[p + "ln_1.weight"], f"blocks.{l}.ln1.b": state[p + "ln_1.bias"],
            a + "W_O": einops.rearrange(state[p + "attn.c_proj.weight"], "(i h) m -> i h m", i=cfg.n_heads),
            a + "b_O": state[p + "attn.c_proj.bias"],
            f"blocks.{l}.ln2.w": state[p + "ln_2.weight"], f"blocks.{l}.ln2.b": state[p + "ln_2.bias"],
            f"blocks.{l}.mlp.W_in": state[p + "mlp.c_fc.weight"], f"blocks.{l}.mlp.b_in": state[p + "mlp.c_fc.bias"],
            f"blocks.{l}.mlp.W_out": state[p + "mlp.c_proj.weight"],
            f"blocks.{l}.mlp.b_out": state[p + "mlp.c_proj.bias"],
        }
    out["ln_final.w"], out["ln_final.b"] = state["transformer.ln_f.weight"], state[FINAL_LN_BIAS]
    out["unembed.W_U"] = state["lm_head.weight"].T
    return out
