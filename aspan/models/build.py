"""What the backends build a model from: a HookedTransformer from its TransformerLens config (`build`), a fresh tiny
model on either class (`fresh_hooked`, `fresh_bridged`), a HookedTransformer from an aspan checkpoint's Hugging Face
form (`hooked_from_form`), and a TransformerBridge over a HookedTransformer's Hugging Face form (`to_bridge`).
`aspan/models/backend.py` calls these; they import nothing that imports it, so the packages' one-way rule holds.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..options import POSITIONAL, Positional  # noqa: F401 (Positional: kept importable here)
from ..tokenization import CharTokenizer, Tokenizer
from . import hfform
from .loaded import bridge, import_transformer_lens

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer, HookedTransformerConfig

WEIGHTS, CONFIG = "model.safetensors", "config.json"  # the files of a checkpoint directory (as aspan.models.checkpoint)
_DEPRECATED = r"HookedTransformer(\.from_pretrained)? is deprecated"



def positional_cfg(positional: str, d_head: int) -> dict:
    """HookedTransformerConfig fields for `positional`. NoPE is rotary over 0 dimensions: no rotation, no
    parameters, and a checkpoint's config alone says it."""
    if positional == "rotary":
        if d_head % 2:
            raise ValueError(f"rotary positions need an even d_head, got {d_head}")
        return {"positional_embedding_type": "rotary", "rotary_dim": d_head}
    if positional == "none":
        return {"positional_embedding_type": "rotary", "rotary_dim": 0}
    if positional == "learned":
        return {"positional_embedding_type": "standard"}
    if positional == "alibi":  # the tanh GELU: exactly Bloom's, the Hugging Face form of ALiBi (models.bloom)
        return {"positional_embedding_type": "alibi", "act_fn": "gelu_new"}
    raise ValueError(f"unknown positional encoding {positional!r}; choose one of {', '.join(POSITIONAL)}")


def build(cfg: HookedTransformerConfig) -> HookedTransformer:
    """`HookedTransformer(cfg)` with TransformerLens' deprecation warning silenced (and nothing else), after
    `safety.check_tl_memory`: a config too large for this machine is refused before anything is allocated."""
    import_transformer_lens()
    from transformer_lens import HookedTransformer

    from .safety import check_tl_memory

    fields = {k: getattr(cfg, k) for k in ("d_vocab", "d_vocab_out", "d_model", "n_layers", "n_heads", "d_head",
                                            "d_mlp", "n_ctx", "n_key_value_heads", "num_experts",
                                            "positional_embedding_type", "gated_mlp")}
    check_tl_memory("model config", {**fields, "dtype": str(cfg.dtype).removeprefix("torch.")}, cfg.device)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_DEPRECATED, category=DeprecationWarning)
        return HookedTransformer(cfg)


def fresh_hooked(sizes: dict[str, int], positional: str, seed: int,
                 device: str | torch.device | None) -> HookedTransformer:
    """The TransformerLens 3 HookedTransformer of `sizes` (d_vocab, n_layers, n_heads, d_model, d_head, d_mlp,
    n_ctx), seeded without touching the caller's global RNG state."""
    from transformer_lens import HookedTransformerConfig

    pos_cfg = positional_cfg(positional, sizes["d_head"])
    cfg = HookedTransformerConfig(
        n_layers=sizes["n_layers"],
        d_model=sizes["d_model"],
        n_ctx=sizes["n_ctx"],
        d_head=sizes["d_head"],
        n_heads=sizes["n_heads"],
        d_mlp=sizes["d_mlp"],
        d_vocab=sizes["d_vocab"],
        normalization_type="LN",
        **{"act_fn": "gelu", **pos_cfg},
        device=None if device is None else str(device),
        default_prepend_bos=False,
    )
    with torch.random.fork_rng():  # seeded init without touching the caller's global RNG state
        torch.manual_seed(seed)
        model = build(cfg)
    cfg.seed = seed
    return model


def fresh_bridged(sizes: dict[str, int], positional: str, seed: int, device: str | torch.device | None,
                  tokenizer: Tokenizer | None):
    """The tiny model of `sizes` as a fresh Hugging Face model inside a TransformerBridge (TransformerLens 4, or the
    bridge backend on 3.9): GPT-NeoX for rotary or no positions, GPT-2 for learned ones, Bloom for ALiBi (power-of-two
    head counts and d_mlp = 4 d_model only: ValueError otherwise)."""
    from .hfbase import Sizes
    from .hfform import form_for, tiny_bridge

    try:
        form_for(positional)  # before any work
    except ValueError as e:
        raise ValueError(f"positional={positional!r} needs the hooked backend (HookedTransformer, TransformerLens 3): "
                         f"{e}") from None
    if sizes["d_head"] * sizes["n_heads"] != sizes["d_model"]:
        raise ValueError(f"the bridge backend builds d_head = d_model / n_heads, got d_head={sizes['d_head']}")
    n = sizes["n_heads"]
    if positional == "alibi" and (n & (n - 1) or sizes["d_mlp"] != 4 * sizes["d_model"]):
        raise ValueError(f"ALiBi on the bridge (Bloom) needs a power-of-two head count and d_mlp = 4 x d_model, got "
                         f"{n} heads and d_mlp {sizes['d_mlp']}")
    shape = Sizes(sizes["d_vocab"], sizes["n_layers"], sizes["n_heads"], sizes["d_model"], sizes["d_mlp"],
                  sizes["n_ctx"], rotary_fraction=0.0 if positional == "none" else 1.0)
    return tiny_bridge(shape, positional, seed, "cpu" if device is None else str(device), tokenizer)


def hooked_from_form(path: Path, config: dict[str, Any], device: str, dtype: torch.dtype):
    """A HookedTransformer from an aspan checkpoint in its Hugging Face form (the weights converted)."""
    cfg = hfform.tl_config(config, device)
    cfg.dtype = dtype
    state = hfform.from_hf_state(hfform.read_state(path), config, cfg)
    model = build(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos", "alibi"))]:
        raise ValueError(f"{path / WEIGHTS}: does not match {path / CONFIG} (missing {missing[:5]})")
    return model.eval()


def to_bridge(model, tokenizer: Tokenizer, device: str, dtype: torch.dtype | None = None):
    """A TransformerBridge over the Hugging Face form of a HookedTransformer (through a temporary checkpoint), in
    `dtype` (None: float32)."""
    import tempfile

    reason = hfform.why_not(model) if isinstance(tokenizer, CharTokenizer) else "no character tokenizer"
    if reason is not None:
        raise ValueError(f"backend 'bridge' needs a model with a Hugging Face form: {reason}")
    with tempfile.TemporaryDirectory(prefix="aspan-bridge-") as tmp:
        hfform.save_hf(hfform.to_hf(model, tokenizer), Path(tmp), tokenizer, {})
        return bridge(tmp, device, dtype=dtype)
