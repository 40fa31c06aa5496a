"""Checks on what a model file says, made before anything is built from it (each failure one `UsageError` line
naming the file and the key).

- `check_aspan_config`: the aspan format's `config.json` (`format`, `version`, `model`: TransformerLens config fields
  with their types, ranges and allowed values; `tokenizer`, `meta`). Hub names (`tokenizer_name`) and
  `trust_remote_code` are refused: a checkpoint is read from its own directory, and no code it names is run.
- `parameter_bytes` / `check_memory`: what a model's parameters (and TransformerLens's per-layer attention masks)
  take, refused before allocation when it exceeds the memory this machine has available; `hf_memory` and
  `check_gguf_memory` for Hugging Face configs and GGUF files.
- `check_hf_checkpoint`: a Hugging Face directory's config, files, memory and weights (the checks of the config,
  files and weights themselves are `aspan.models.hfcheck`'s, re-exported here).
- The GGUF header reader (`gguf_shapes`, `gguf_layout`) that the GGUF checks read sizes from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple, get_args

from ..checks import ALL_GPUS, MEMORY_SHARE, available_bytes  # noqa: F401 (the share models may take)
from ..checks import refuse_over_memory as refuse
from ..errors import UsageError
from .hfcheck import (  # noqa: F401 (re-exported: imported from here)
    HF_FILES,
    HF_JSON_FILES,
    HF_POSITIVE,
    HF_SIZES,
    PICKLES,
    _first,
    _natural,
    check_hf_config,
    check_hf_files,
    check_hf_weights,
    expected_tensors,
    stored_tensors,
)
from .jsonvalues import (  # noqa: F401 (ActFn, Dtype and _short re-exported: imported from here)
    _NUMBER,
    _OPT_POSITIVE,
    _POS_NUMBER,
    _POSITIVE,
    ActFn,
    Dtype,
    _bool,
    _choice,
    _int,
    _is_int,
    _layer_types,
    _number,
    _refused,
    _short,
    _text,
)

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
# What one layer costs beyond its parameters (Python module objects, hook points): 39 KB for a transformers
# LlamaForCausalLM layer and 93 KB for a HookedTransformer block, measured at d_model 2 over 2,000 layers. A config
# of a million tiny layers passes a parameter count and still takes tens of GB.
LAYER_OVERHEAD = 128 * 1024
# What gguf's GGUFReader keeps per metadata key or array entry (a 3 MB file of 3 million booleans took 2.7 GB).
GGUF_ENTRY_BYTES = 1024


# Every TransformerLens 3.9 config field an aspan checkpoint may hold, with what it may be.
MODEL_FIELDS: dict[str, Callable[[Any], str | None]] = {
    **dict.fromkeys(("n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab", "NTK_original_ctx_len",
                     "yarn_original_max_position_embeddings"), _POSITIVE),
    **dict.fromkeys(("d_mlp", "n_key_value_heads", "window_size", "train_seq_length", "num_experts",
                     "experts_per_token", "relative_attention_max_distance", "relative_attention_num_buckets"),
                    _OPT_POSITIVE),
    "d_vocab_out": _int(1, also=(-1,)), "rotary_dim": _int(0, optional=True), "n_params": _int(0, optional=True),
    "seed": _int(0, optional=True), "checkpoint_index": _int(0, optional=True),
    "checkpoint_value": _number(optional=True), "decoder_start_token_id": _int(0, optional=True),
    **dict.fromkeys(("eps", "rotary_base", "rotary_scaling_factor", "NTK_by_parts_low_freq_factor",
                     "NTK_by_parts_high_freq_factor", "NTK_by_parts_factor", "yarn_factor", "yarn_attention_factor",
                     "yarn_beta_fast", "yarn_beta_slow"), _POS_NUMBER),
    **dict.fromkeys(("attn_scale", "initializer_range", "attn_scores_soft_cap", "output_logits_soft_cap"), _NUMBER),
    "rotary_base_local": _number(positive=True, optional=True), "clip_qkv": _number(positive=True, optional=True),
    **dict.fromkeys((
        "use_attn_scale", "use_hook_mlp_in", "use_attn_in", "use_qk_norm", "use_logn_attn", "use_dynamic_ntk_rope",
        "use_local_attn", "ungroup_grouped_query_attention", "from_checkpoint", "attn_only", "init_weights",
        "scale_attn_by_inverse_layer_idx", "final_rms", "parallel_attn_mlp", "use_hook_tokens", "gated_mlp",
        "post_embedding_ln", "rotary_adjacent_pairs", "tie_word_embeddings", "use_normalization_before_and_after",
        "use_NTK_by_parts_rope", "use_yarn_rope", "yarn_truncate", "yarn_global_attn_only", "use_attention_sinks",
        "norm_topk_prob", "default_prepend_bos", "use_split_qkv_input", "use_attn_result", "uses_rms_norm",
        "layer_norm_folding"), _bool()),
    "tokenizer_prepends_bos": _bool(optional=True),
    "model_name": _text(), "original_architecture": _text(optional=True),
    "checkpoint_label_type": _text(optional=True),
    "act_fn": _choice(*get_args(ActFn), None), "dtype": _choice(*get_args(Dtype)),
    "normalization_type": _choice("LN", "LNPre", "RMS", "RMSPre", None),
    "positional_embedding_type": _choice("standard", "rotary", "shortformer", "alibi", "relative_positional_bias"),
    "attention_dir": _choice("causal", "bidirectional"),
    "init_mode": _choice("gpt2", "xavier_uniform", "xavier_normal", "kaiming_uniform", "kaiming_normal", "muP"),
    "attn_types": _layer_types,
    # read from the checkpoint's own directory, never from a hub; no code a file names is run
    "tokenizer_name": _refused(None, "a hub tokenizer name is never loaded: the tokenizer is the checkpoint's own"),
    "trust_remote_code": _refused(False, "remote code is never run"),
    "load_in_4bit": _refused(False, "quantised loading is not supported"),
    "quantization_method": _refused(None, "quantised loading is not supported"),
    "n_devices": _refused(1, "a model is loaded onto one device"),
}
REQUIRED_FIELDS = ("n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab", "act_fn")
TOP_LEVEL = ("format", "version", "model", "tokenizer", "meta")


def check_aspan_config(file: Path, config: dict[str, Any], version: int) -> None:
    """UsageError naming `file` and the key, unless the aspan-format `config` is one a model can be built from."""
    if config.get("format") != "aspan":
        raise UsageError(f"{file}: format must be 'aspan', got {_short(config.get('format'))}")
    unknown = sorted(set(config) - set(TOP_LEVEL))
    if unknown:
        raise UsageError(f"{file}: unknown key {unknown[0]!r} (an aspan checkpoint has {', '.join(TOP_LEVEL)})")
    if config.get("version") != version or not _is_int(config.get("version")):
        raise UsageError(f"{file}: version must be {version}, got {config.get('version')!r}")
    for key in ("model", "tokenizer", "meta"):
        if key == "meta" and key not in config:
            continue
        if not isinstance(config.get(key), dict):
            raise UsageError(f"{file}: {key} must be a JSON object, got {type(config.get(key)).__name__}")
    model = config["model"]
    for key in REQUIRED_FIELDS:
        if key not in model and not (key == "act_fn" and model.get("attn_only") is True):
            raise UsageError(f"{file}: model.{key} is missing")
    for key, value in model.items():
        check = MODEL_FIELDS.get(key)
        why = "unknown key (not a TransformerLens config field)" if check is None else check(value)
        if why:
            raise UsageError(f"{file}: model.{key} {why}, got {_short(value)}")
    _check_model_consistency(file, model)


def _check_model_consistency(file: Path, model: dict[str, Any]) -> None:
    """The fields that depend on each other: heads, rotary dimensions, local attention, the MLP."""
    where = f"{file}: model."
    kv = model.get("n_key_value_heads")
    if kv is not None and model["n_heads"] % kv:
        raise UsageError(f"{where}n_key_value_heads {kv} does not divide n_heads {model['n_heads']}")
    rotary = model.get("rotary_dim")
    if model.get("positional_embedding_type") == "rotary" and rotary is not None and \
            (rotary > model["d_head"] or rotary % 2):
        raise UsageError(f"{where}rotary_dim must be even and <= d_head {model['d_head']}, got {rotary}")
    if model.get("use_local_attn") and (model.get("window_size") is None or model.get("attn_types") is None):
        raise UsageError(f"{where}use_local_attn needs window_size and attn_types")
    types = model.get("attn_types")
    if types is not None and len(types) != model["n_layers"]:
        raise UsageError(f"{where}attn_types has {len(types)} entries for n_layers {model['n_layers']}")
    if not model.get("attn_only") and (model.get("d_mlp") is None or model.get("act_fn") is None):
        raise UsageError(f"{where}{'d_mlp' if model.get('d_mlp') is None else 'act_fn'} is null but the model has "
                         f"an MLP (attn_only is false)")
    if (model.get("num_experts") is None) != (model.get("experts_per_token") is None):
        raise UsageError(f"{where}num_experts and experts_per_token must be set together")



# ------------------------------------------------------------------------------------------------ memory
@dataclass(frozen=True)
class ModelSizes:
    """The sizes of a decoder-only transformer that its memory depends on (`parameter_bytes`)."""

    d_vocab: int  # vocabulary: embedding and unembedding rows (the wider of the two where they differ)
    d_model: int  # residual stream width
    n_layers: int  # transformer blocks
    n_heads: int  # query heads per layer
    d_head: int  # width of one head
    d_mlp: int  # MLP hidden width (summed over experts for a mixture of experts; 0: attention only)
    n_ctx: int  # context length (the learned-position table and the masks)
    n_kv_heads: int | None = None  # key-value heads per layer (None: one per query head)
    learned_positions: bool = False  # a learned-position table of n_ctx rows
    gated: bool = False  # a gated MLP (three matrices instead of two)


def parameter_bytes(sizes: ModelSizes, *, dtype_bytes: int = 4, masks: bool = False) -> int:
    """Bytes of a decoder-only transformer's parameters: embeddings and unembedding, the learned-position table,
    attention (Q and O per head, K and V per key-value head, with biases), the MLP (gated: three matrices) and the
    LayerNorms, times `dtype_bytes`; with `masks`, TransformerLens's causal mask buffer (n_ctx x n_ctx bytes per
    layer) and its rotary tables."""
    z = sizes
    kv = z.n_kv_heads or z.n_heads
    attention = z.d_model * z.d_head * (2 * z.n_heads + 2 * kv) + z.d_head * (z.n_heads + 2 * kv) + z.d_model
    mlp = z.d_model * z.d_mlp * (3 if z.gated else 2) + z.d_mlp + z.d_model
    per_layer = attention + mlp + 4 * z.d_model
    params = 2 * z.d_vocab * z.d_model + z.d_vocab + z.n_layers * per_layer + 2 * z.d_model
    params += z.n_ctx * z.d_model if z.learned_positions else 0
    buffers = z.n_layers * (z.n_ctx * z.n_ctx + 2 * z.n_ctx * z.d_head * 4) if masks else 0
    return params * dtype_bytes + buffers


def refuse_over_memory(needed: int, what: str, detail: str, device: str | None = None, verb: str = "needs") -> None:
    """`aspan.checks.refuse_over_memory` against this module's `available_bytes` (which tests replace to play a
    smaller machine)."""
    refuse(needed, what, detail, device, verb, available=available_bytes(device))


def check_memory(needed: int, what: str, sizes: dict[str, Any], device: str | None = None) -> None:
    """`refuse_over_memory` for a model, naming its sizes."""
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
    refuse_over_memory(needed, what, shown, device, verb="the model would take")


def check_tl_memory(what: str, model: dict[str, Any], device: str | None = None, masks: bool = True) -> None:
    """`check_memory` for a TransformerLens config (a checked aspan `model` entry, or `models.tiny`'s sizes), with
    HookedTransformer's mask buffers (`masks`)."""
    vocab = max(model["d_vocab"], model.get("d_vocab_out") or 0)  # the unembedding may be wider (d_vocab_out)
    mlp = (model.get("d_mlp") or 0) * (model.get("num_experts") or 1)  # a mixture of experts: one MLP per expert
    sizes = ModelSizes(
        vocab, model["d_model"], model["n_layers"], model["n_heads"], model["d_head"], mlp, model["n_ctx"],
        n_kv_heads=model.get("n_key_value_heads"),
        learned_positions=model.get("positional_embedding_type", "standard") in ("standard", "shortformer"),
        gated=bool(model.get("gated_mlp")))
    needed = parameter_bytes(sizes, dtype_bytes=DTYPE_BYTES.get(model.get("dtype", "float32"), 4), masks=masks)
    needed += model["n_layers"] * LAYER_OVERHEAD
    shown = {k: model.get(k) for k in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx")}
    if (model.get("d_vocab_out") or -1) > model["d_vocab"]:
        shown["d_vocab_out"] = model["d_vocab_out"]
    check_memory(needed, what, shown, device)



def hf_memory(file: Path, config: dict[str, Any], device: str | None, backend: Any, dtype_bytes: int = 4) -> None:
    """`check_memory` for a Hugging Face config: its parameters at `dtype_bytes` each, twice where `backend` (a
    `ModelBackend`) converts the weights into a model of its own (a HookedTransformer: the Hugging Face model stays
    alive meanwhile), plus the attention masks of a backend that keeps them."""
    width, heads = _first(config, "hidden_size", "n_embd")[1], _first(config, "num_attention_heads", "n_head")[1]
    layers, n_ctx = _first(config, "num_hidden_layers", "n_layer")[1], \
        _first(config, "max_position_embeddings", "n_positions")[1] or 2048
    d_mlp = _first(config, "intermediate_size", "n_inner")[1] or 4 * width
    d_head = config.get("head_dim") or width // heads
    model_type = config.get("model_type")
    sizes = ModelSizes(config["vocab_size"], width, layers, heads, d_head, d_mlp, n_ctx,
                       n_kv_heads=config.get("num_key_value_heads"), learned_positions=model_type == "gpt2",
                       gated=model_type not in ("gpt2", "gpt_neox", "bloom"))
    needed = parameter_bytes(sizes, dtype_bytes=dtype_bytes, masks=backend.keeps_masks)
    shown = {k: config[k] for k in HF_SIZES if config.get(k) is not None}
    check_memory((needed + layers * LAYER_OVERHEAD) * (2 if backend.converts_weights else 1), str(file), shown, device)


def check_hf_checkpoint(directory: Path, config: dict[str, Any], device: str | None, backend: Any,
                        dtype_bytes: int = 4) -> None:
    """Everything about a Hugging Face checkpoint directory that can be checked before a model exists: its config's
    values, the memory the model would take (at `dtype_bytes` a parameter), and its weights' names and shapes."""
    file = directory / "config.json"
    check_hf_config(file, config)
    check_hf_files(directory)
    hf_memory(file, config, device, backend, dtype_bytes)
    check_hf_weights(directory, config)


# --------------------------------------------------------------------------------------------------- GGUF
GGUF_MAGIC = b"GGUF"
MIN_GGUF_KV, MIN_GGUF_TENSOR = 14, 33  # bytes: a one-byte key and value; a one-byte name and one dimension


def check_gguf_header(path: Path) -> None:
    """UsageError naming `path` unless it starts like a GGUF file (magic, version 2 or 3) whose tensor and metadata
    counts fit in its size: a reader would otherwise allocate for counts a hostile header makes up."""
    import struct

    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:4] != GGUF_MAGIC:
        raise UsageError(f"{path}: not a GGUF file (no GGUF header)")
    version, tensors, entries = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3):
        raise UsageError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    if 24 + tensors * MIN_GGUF_TENSOR + entries * MIN_GGUF_KV > size:
        raise UsageError(f"{path}: its GGUF header claims {tensors:,} tensors and {entries:,} metadata entries, more "
                         f"than its {size:,} bytes can hold (truncated or corrupt)")


# GGUF metadata value types (the GGUF specification): fixed sizes by type id; 8 is a string, 9 an array
GGUF_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
GGUF_STRING, GGUF_ARRAY = 8, 9
# A metadata array holds at most this many entries: the largest tokenizers hold about 262,000 tokens and 280,000
# merges; a reader (gguf's GGUFReader) keeps a few hundred bytes per entry, so a 3 MB file of 3 million booleans
# took 2.7 GB before anything looked at it.
MAX_GGUF_ARRAY = 1 << 20
MAX_GGUF_NESTING = 4  # arrays of arrays, at most this deep (the header reader below is recursive)


class GGUFArray(NamedTuple):
    """A metadata array as the header reader returns it: its element type and length (its entries are skipped)."""

    kind: int
    length: int


class _GGUFHeader:
    """Sequential reader of a GGUF header (metadata and tensor descriptions; never the tensor data) that refuses,
    naming the file, any length running past the end of the file."""

    def __init__(self, path: Path, f):
        self.path, self.f, self.size = path, f, path.stat().st_size

    def take(self, fmt: str) -> Any:
        import struct

        n = struct.calcsize("<" + fmt)
        data = self.f.read(n)
        if len(data) < n:
            raise UsageError(f"{self.path}: GGUF header ends early (truncated or corrupt)")
        return struct.unpack("<" + fmt, data)[0]

    def string(self) -> str:
        n = self.take("Q")
        if n > self.size - self.f.tell():
            raise UsageError(f"{self.path}: GGUF header holds a string of {n:,} bytes, longer than the file")
        return self.f.read(n).decode("utf-8", "replace")

    def value(self, kind: int, key: str = "", depth: int = 0) -> Any:
        if kind in GGUF_FIXED:
            return self.take(GGUF_FIXED[kind])
        if kind == GGUF_STRING:
            return self.string()
        if kind == GGUF_ARRAY:
            return self.array(key, depth)
        raise UsageError(f"{self.path}: GGUF metadata {key} has a value of unknown type {kind}")

    def array(self, key: str, depth: int) -> GGUFArray:
        """An array's type and length; its entries are skipped (the tokenizer's vocabulary holds no size)."""
        import struct

        item, n = self.take("I"), self.take("Q")
        left = self.size - self.f.tell()
        if n > left or (item in GGUF_FIXED and n * struct.calcsize(GGUF_FIXED[item]) > left):
            raise UsageError(f"{self.path}: GGUF header holds an array of {n:,} entries, more than the file holds")
        if n > MAX_GGUF_ARRAY:
            raise UsageError(f"{self.path}: GGUF metadata {key} is an array of {n:,} entries; at most "
                             f"{MAX_GGUF_ARRAY:,} are read (no tokenizer needs more)")
        if item == GGUF_ARRAY and depth + 1 >= MAX_GGUF_NESTING:
            raise UsageError(f"{self.path}: GGUF metadata {key} nests arrays more than {MAX_GGUF_NESTING} deep")
        if item in GGUF_FIXED:
            self.f.seek(n * struct.calcsize(GGUF_FIXED[item]), 1)
        else:
            for _ in range(n):
                self.value(item, key, depth + 1)
        return GGUFArray(item, n)


def gguf_shapes(path: Path) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """(metadata, tensor shapes) of a GGUF file, read from its header alone (`check_gguf_header` first); arrays are
    given as `GGUFArray` (type and length)."""
    meta, shapes, _ = gguf_layout(path)
    return meta, shapes


def gguf_layout(path: Path) -> tuple[dict[str, Any], dict[str, list[int]], dict[str, tuple[int, int, int]]]:
    """`gguf_shapes`, and where each tensor's data lies: name -> (type id, offset from the start of the data, the
    data's start in the file)."""
    check_gguf_header(path)
    meta: dict[str, Any] = {}
    shapes: dict[str, list[int]] = {}
    places: dict[str, tuple[int, int]] = {}
    with open(path, "rb") as f:
        f.seek(8)
        header = _GGUFHeader(path, f)
        tensors, entries = header.take("Q"), header.take("Q")
        for _ in range(entries):
            key = header.string()
            meta[key] = header.value(header.take("I"), key)
        for _ in range(tensors):
            name, n_dims = header.string(), header.take("I")
            if n_dims > 8:
                raise UsageError(f"{path}: GGUF tensor {name!r} claims {n_dims} dimensions (corrupt)")
            shapes[name] = [header.take("Q") for _ in range(n_dims)]
            places[name] = (header.take("I"), header.take("Q"))  # its type and data offset
        align = meta.get("general.alignment", 32)
        align = align if isinstance(align, int) and align > 0 else 32
        start = -(-f.tell() // align) * align
    return meta, shapes, {name: (kind, offset, start) for name, (kind, offset) in places.items()}


def check_gguf_memory(path: Path, device: str | None, backend: Any,
                      header: tuple[dict[str, Any], dict[str, list[int]]] | None = None, dtype_bytes: int = 4) -> None:
    """`check_memory` for a GGUF file before transformers dequantises it: every tensor of its header in float32
    (whatever its quantisation) and again at `dtype_bytes` (the dequantised tensors and the model they are copied
    into, or for a HookedTransformer the Hugging Face model its weights are converted from), plus a
    HookedTransformer's masks. On
    SmolLM2-135M (134.5M parameters, 0.54 GB in float32) a process that only loads it peaked at 1.2 GB (bridge) and
    1.74 GB (HookedTransformer), the interpreter, torch and transformers included; the estimates are 1.1 and 3.1 GB
    (with each layer's objects, `LAYER_OVERHEAD`, and the reader's 147,000 tokenizer entries, `GGUF_ENTRY_BYTES`)."""
    meta, shapes = gguf_shapes(path) if header is None else header  # `header`: what `gguf_shapes` read already
    params = sum(math.prod(shape) for shape in shapes.values())
    arch = meta.get("general.architecture")
    layers, n_ctx = meta.get(f"{arch}.block_count"), meta.get(f"{arch}.context_length")
    heads, width = meta.get(f"{arch}.attention.head_count"), meta.get(f"{arch}.embedding_length")
    prefix = f"{arch}." if isinstance(arch, str) else ""
    sizes = {"tensors": len(shapes), "parameters": params, f"{prefix}block_count": layers,
             f"{prefix}context_length": n_ctx}
    needed = params * (4 + dtype_bytes)
    if isinstance(layers, int) and layers > 0:
        needed += 2 * layers * LAYER_OVERHEAD
    if backend.keeps_masks:
        if all(isinstance(v, int) and v > 0 for v in (layers, n_ctx, heads, width)):
            needed += layers * (n_ctx * n_ctx + 2 * n_ctx * (width // heads) * 4)
            # the masks' size comes from these too: a refusal names them
            sizes.update({f"{prefix}embedding_length": width, f"{prefix}attention.head_count": heads})
    entries = len(meta) + sum(v.length for v in meta.values() if isinstance(v, GGUFArray))  # keys and array items
    if entries * GGUF_ENTRY_BYTES > needed:  # the reader's metadata, when it outweighs the model
        sizes["metadata entries"] = entries
    check_memory(needed + entries * GGUF_ENTRY_BYTES, str(path), sizes, device)
