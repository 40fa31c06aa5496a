"""Tiny models as standard Hugging Face checkpoints, converted exactly: saving, reading back, the bridge's weights.

Each positional encoding of `models.tiny` has one form (`FORMS`), a module with the same functions (`why_not`,
`hf_config`, `to_hf_state`, `from_hf_state`, `pos_cfg`, `sizes_of_config`, `fuse_qkv`) built on what every form
shares (`aspan.models.hfbase`: sizes, checks, the bias fold); this module dispatches to them and they never import it:

- rotary, and none (NoPE, rotary over 0 dimensions): GPT-NeoX with a sequential residual (`aspan.models.neox`;
  NoPE is `partial_rotary_factor` 0: no rotation and no positional parameter, so it stays NoPE when trained);
- learned: GPT-2 (`aspan.models.gpt2`: learned absolute positions, Conv1D weights, erf GELU, untied unembedding);
- alibi: Bloom (`aspan.models.bloom`: ALiBi, tanh GELU, the embedding LayerNorm inverted; power-of-two head counts,
  d_mlp = 4 d_model and d_vocab < d_model, else the aspan format and a HookedTransformer only).

None of GPT-NeoX, GPT-2 and Bloom has an unembedding bias `b_U`. It is folded into the final LayerNorm's bias:
`logits = (n * w + b) W_U + b_U`, so a bias `b'` with `b' W_U = b W_U + b_U` gives the same logits for every input.
Such a `b'` exists when `W_U` has full column rank (`d_vocab <= d_model`); the fold is solved in float64 and checked,
and a model that cannot be folded is not converted (`why_not` says why).

A checkpoint directory holds what `transformers` needs on its own (`config.json`, `model.safetensors`,
`tokenizer.json`: a word-level tokenizer with one token per character, the same ids as `CharTokenizer`) plus an
`aspan` entry in `config.json` (the character tokenizer and the free metadata).

Why ALiBi is Bloom (transformers 5.23 has three causal LMs with ALiBi, and TransformerLens 4.3's bridge boots all
three): Bloom's attention is TransformerLens's (`alibi.baddbmm(q, k, beta=1, alpha=1/sqrt(head_dim))`, the bias
unscaled) for a power-of-two head count; its embedding LayerNorm is inverted and its tanh GELU is what ALiBi tiny
models use (`aspan.models.bloom`). Falcon (`alibi=True`) scales the bias: `FalconModel.forward` puts
`alibi / sqrt(head_dim)` into the attention mask, and the eager path adds it a second time
(`(attention_scores + alibi) * inv_norm_factor`), so neither path is TransformerLens's ALiBi. MPT has no bias
anywhere (`Wqkv`, `out_proj`, `up_proj`, `down_proj` are `bias=False`; its LayerNorms have none).
`tests/models/test_hfform.py` measures both against TransformerLens's ALiBi pattern.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import UsageError
from ..tokenization import CharTokenizer
from . import bloom, gpt2, neox
from .hfbase import KEY, VERSION, Sizes, fold_bias, positional_of_cfg

# The form of each positional encoding (absent: no exact form). The forms import `hfbase` only, never this module.
FORMS: dict[str, Any] = {"rotary": neox, "none": neox, "learned": gpt2, "alibi": bloom}


def form_for(positional: str):
    """The form module of a positional encoding; ValueError if there is none."""
    form = FORMS.get(positional)
    if form is None:
        raise ValueError(f"no Hugging Face form for {positional!r}")
    return form


def form_of_config(config: dict[str, Any]):
    """The form module of a Hugging Face config (by its `model_type`), or None."""
    return next((f for f in FORMS.values() if f is not None and f.MODEL_TYPE == config.get("model_type")), None)


def positional_of_config(config: dict[str, Any]) -> str | None:
    """The `Positional` name of an aspan form's Hugging Face config (None for another model type)."""
    form = form_of_config(config)
    return None if form is None else form.positional_of_config(config)


def why_not(model) -> str | None:
    """None if `model` (a HookedTransformer) converts exactly to its Hugging Face form, else the reason."""
    positional = positional_of_cfg(model.cfg)
    form = FORMS.get(positional)
    if form is None:
        return f"positions {positional!r} have no Hugging Face form"
    return form.why_not(model)


def to_hf(model, tokenizer: CharTokenizer | None = None):
    """The Hugging Face model (float32, eval mode) with the weights of a convertible TransformerLens model."""
    reason = why_not(model)
    if reason is not None:
        raise ValueError(f"this model has no exact Hugging Face form: {reason}")
    form = form_for(positional_of_cfg(model.cfg))
    with torch.random.fork_rng(devices=[]):  # the random init (overwritten below) leaves the caller's RNG alone
        hf = form.hf_class()(form.hf_config(Sizes.of(model.cfg), tokenizer)).float().eval()
    state = form.to_hf_state(model)
    if "lm_head.weight" not in hf.state_dict() and "lm_head.weight" in state:  # older GPT-NeoX names it embed_out
        state["embed_out.weight"] = state.pop("lm_head.weight")
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not _is_buffer(k)]:
        raise RuntimeError(f"{form.MODEL_TYPE} state mismatch: missing {missing}, unexpected {unexpected}")
    return hf


def _is_buffer(name: str) -> bool:
    """Whether a state-dict entry is a non-learned buffer some transformers versions list (masks, rotary tables)."""
    return "rotary" in name or "masked_bias" in name or name.endswith(".attn.bias")


def hf_tokenizer(tokenizer: CharTokenizer | None, d_vocab: int = 0):
    """A `PreTrainedTokenizerFast` with the same ids as `tokenizer` (one token per character), for `tokenizer.json`;
    without one, `d_vocab` placeholder tokens (a TransformerBridge needs a tokenizer file to boot)."""
    from tokenizers import Regex, decoders, pre_tokenizers
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models as tk_models
    from transformers import PreTrainedTokenizerFast

    if tokenizer is None:
        stoi = {"<pad>": 0, "<bos>": 1, "<eos>": 2, **{f"<{i}>": i for i in range(3, d_vocab)}}
    else:
        stoi = dict(tokenizer.stoi)
    raw = RawTokenizer(tk_models.WordLevel(stoi, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    raw.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def save_hf(hf, directory: Path, tokenizer: CharTokenizer | None, meta: dict[str, Any]) -> None:
    """Write the checkpoint files of the Hugging Face model `hf` (`to_hf` of a HookedTransformer, the model a
    TransformerBridge wraps: `aspan.models.backend`) with `tokenizer` and `meta` into `directory` (which exists and
    is empty)."""
    from transformers.utils import logging as hf_logging

    if tokenizer is not None:
        hf.config.update({KEY: {"version": VERSION, "tokenizer": tokenizer.to_dict(), "meta": meta}})
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        hf.save_pretrained(directory, safe_serialization=True)
    finally:
        if was:
            hf_logging.enable_progress_bar()
    hf_tokenizer(tokenizer, hf.config.vocab_size).save_pretrained(directory)
    # the files' modes (some writers make 0600 files) are set by `aspan.io.atomic_dir`, which writes a checkpoint


def _is_split(name: str) -> bool:
    """Whether a (canonical) parameter name is one of the bridge's separate q, k, v projections."""
    return (".attention." in name or ".attn." in name or ".self_attention." in name) and \
        name.rsplit(".", 2)[-2] in ("q", "k", "v")


def split_qkv_is_live(bridge) -> bool:
    """Whether the bridge computes attention with its separate q, k, v projections rather than the fused one
    (GPT-NeoX's `query_key_value` on TransformerLens 3.9, GPT-2's `c_attn`): both exist as parameters, only one
    gets a gradient."""
    named = dict(bridge.original_model.named_parameters())
    q = next((p for n, p in named.items() if any(f".{a}.q." in n for a in ("attention", "attn", "self_attention"))
              and n.endswith("weight")), None)
    fused = next((p for n, p in named.items()
                  if ("query_key_value" in n or ".qkv." in n or "c_attn" in n) and n.endswith("weight")), None)
    if q is None or fused is None:
        return q is not None
    flags = (q.requires_grad, fused.requires_grad)
    q.requires_grad_(True)
    fused.requires_grad_(True)
    try:
        with torch.enable_grad():
            out = bridge(torch.zeros(1, 2, dtype=torch.long, device=q.device)).float().sum()
            g_q, g_fused = torch.autograd.grad(out, [q, fused], allow_unused=True)
    finally:
        q.requires_grad_(flags[0])
        fused.requires_grad_(flags[1])
    return g_q is not None and (g_fused is None or g_q.abs().sum() > 0)


def unwrap(wrapped, live_split: bool = False):
    """A plain Hugging Face model with the weights of the one a TransformerBridge wraps.

    The bridge replaces submodules by wrappers (`_original_component`, plus aliases such as `attn.q`), so the wrapped
    model's state dict repeats every tensor under several names; the canonical name is the one a fresh model has.
    Where the bridge trains separate q, k, v projections (`live_split`) they are fused back in the form's layout; an
    unembedding bias the bridge added (TransformerLens 3.9) is folded into the final LayerNorm bias.
    """
    form = form_of_config(wrapped.config.to_dict())
    fresh = type(wrapped)(wrapped.config).float().eval()
    target = fresh.state_dict()
    state, split = {}, {}
    for name, tensor in wrapped.state_dict().items():
        canon = name.replace("._original_component", "").replace("_original_component.", "")
        if canon in target and canon not in state:
            state[canon] = tensor.detach().cpu()
        elif _is_split(canon) or canon == "lm_head.bias":
            split[canon] = tensor.detach().cpu()
    if split and live_split and form is not None:
        for key in [k for k in split if k.endswith(".q.weight") or k.endswith(".q.bias")]:
            stem, kind = key[: -len("q.weight" if key.endswith("weight") else "q.bias")], key.rsplit(".", 1)[-1]
            parts = [split.get(f"{stem}{x}.{kind}") for x in "qkv"]
            if all(x is not None for x in parts):
                state[f"{stem}{form.FUSED_QKV}.{kind}"] = form.fuse_qkv(parts, kind, wrapped.config)
    bias = split.get("lm_head.bias")
    if bias is not None and "lm_head.bias" not in target and bias.abs().max() > 0:
        head = state.get("lm_head.weight", state.get("embed_out.weight"))
        folded = None if form is None else fold_bias(head.T, bias, state[form.FINAL_LN_BIAS])
        if folded is None:
            raise ValueError("the bridge's trained unembedding bias cannot be folded into the final LayerNorm bias")
        state[form.FINAL_LN_BIAS] = folded
    missing = [k for k in target if k not in state and not _is_buffer(k)]
    if missing:
        raise ValueError(f"cannot recover the Hugging Face weights of this TransformerBridge (missing {missing[:3]})")
    fresh.load_state_dict(state, strict=False)
    return fresh


def is_aspan_hf(config: dict[str, Any]) -> bool:
    """Whether a config.json is an aspan tiny model in one of its Hugging Face forms."""
    return isinstance(config.get(KEY), dict) and form_of_config(config) is not None


def check_form_config(file: Path, config: dict[str, Any]) -> Sizes:
    """The sizes of an aspan Hugging Face config whose values `safety.check_hf_config` accepted; UsageError naming
    the key when the form's own keys are missing or its rotary share is not an even number of each head's dimensions
    (Hugging Face truncates that share where TransformerLens rounds it: the two backends would differ)."""
    try:
        sizes = form_of_config(config).sizes_of_config(config)
    except KeyError as e:
        raise UsageError(f"{file}: {e.args[0]} is missing") from None
    rotary = sizes.rotary_fraction * (sizes.d_model // sizes.n_heads)
    if config.get("model_type") == "gpt_neox" and (rotary != int(rotary) or int(rotary) % 2):
        raise UsageError(f"{file}: rope_parameters.partial_rotary_factor {sizes.rotary_fraction} rotates {rotary:g} "
                         f"of each head's {sizes.d_model // sizes.n_heads} dimensions; it must be an even number")
    return sizes


def tl_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The TransformerLens config fields of an aspan Hugging Face config (what a HookedTransformer of it has, and what
    a resumed training run compares)."""
    form = form_of_config(config)
    s = form.sizes_of_config(config)
    return dict(n_layers=s.n_layers, d_model=s.d_model, n_ctx=s.n_ctx, d_head=s.d_model // s.n_heads,
                n_heads=s.n_heads, d_mlp=s.d_mlp, d_vocab=s.d_vocab, act_fn=getattr(form, "ACT_FN", "gelu"),
                normalization_type="LN", eps=s.eps,
                n_key_value_heads=None, **form.pos_cfg(s))


def tl_config(config: dict[str, Any], device: str | None):
    """The TransformerLens config of an aspan Hugging Face checkpoint (the tiny model's config, read back)."""
    from transformer_lens import HookedTransformerConfig

    return HookedTransformerConfig(**tl_fields(config), default_prepend_bos=False, device=device, init_weights=False)


def from_hf_state(state: dict[str, Tensor], config: dict[str, Any], cfg) -> dict[str, Tensor]:
    """TransformerLens weights from an aspan Hugging Face checkpoint's (`b_U` is zero: it lives in the final
    LayerNorm bias)."""
    out = form_of_config(config).from_hf_state(state, cfg)
    head = out["unembed.W_U"]
    out["unembed.b_U"] = torch.zeros(cfg.d_vocab, dtype=head.dtype)
    return {k: v.contiguous() for k, v in out.items()}


def read_state(path: Path) -> dict[str, Tensor]:
    """The safetensors weights of a checkpoint directory (ValueError naming the file if unreadable)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = path / "model.safetensors"
    if not file.is_file():
        raise ValueError(f"{file}: missing")
    try:
        state = load_file(str(file), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"{file}: corrupt or truncated safetensors file ({e})") from None
    check_finite(file, state)
    return state


def check_finite(file: Path, tensors: dict[str, Tensor]) -> None:
    """ValueError naming `file` and the first floating-point tensor of `tensors` that holds nan or inf: such a
    checkpoint is corrupt (training stops at the first non-finite loss), and loading it would only give NaN logits."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{file}: corrupt checkpoint: {name} holds nan or inf values (restore the file, or use "
                             f"an earlier checkpoint)")


def aspan_entry(path: Path, config: dict[str, Any]) -> tuple[CharTokenizer, dict[str, Any]]:
    """The character tokenizer and metadata stored in an aspan Hugging Face checkpoint's config.json."""
    entry = config[KEY]
    if not isinstance(entry.get("meta", {}), dict) or not isinstance(entry.get("tokenizer"), dict):
        raise ValueError(f"{path / 'config.json'}: {KEY}.meta and {KEY}.tokenizer must be JSON objects")
    try:
        return CharTokenizer.from_dict(entry["tokenizer"]), dict(entry.get("meta", {}))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path / 'config.json'}: invalid {KEY!r} entry ({type(e).__name__}: {e})") from None


def tiny_bridge(sizes: Sizes, positional: str, seed: int, device: str, tokenizer: CharTokenizer | None = None):
    """The tiny model (LayerNorm, GELU, sequential residual; `positional` rotary, none, learned or alibi) as a fresh
    Hugging Face model of its form inside a TransformerBridge: what `models.tiny` builds on TransformerLens 4, where
    HookedTransformer no longer exists. Initialised at TransformerLens's scale (0.8 / sqrt(d_model))."""
    import tempfile

    from .loaded import bridge

    form = form_for(positional)
    config = form.hf_config(sizes, None)
    config.initializer_range = 0.8 / sizes.d_model**0.5
    with torch.random.fork_rng():  # seeded init without touching the caller's global RNG state
        torch.manual_seed(seed)
        hf = form.hf_class()(config).float().eval()
    with tempfile.TemporaryDirectory(prefix="aspan-tiny-") as tmp:
        save_hf(hf, Path(tmp), tokenizer, {})
        return bridge(tmp, device)
