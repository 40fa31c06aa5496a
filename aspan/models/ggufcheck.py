"""A GGUF file checked against itself and against the model built from it, as Hugging Face directories are
(`aspan.models.safety.check_hf_weights`): each failure one `UsageError` line naming the file and the first mismatch.

- `check_gguf_file`, before transformers reads the tensors: the model the file describes fits in memory
  (`check_gguf_memory`); its header's metadata (sizes, norm epsilon, tokenizer arrays and token ids) hold values a
  model can be built from, the sizes of its stored tensors, and its layers are the blocks it stores; then
  (`check_gguf_model`) every tensor it stores is one the model transformers builds from it uses, with as many
  entries, and every parameter of that model comes from a stored tensor (transformers fills a missing one with random
  values and drops an unknown one, silently). That model is built on the meta device: nothing is allocated.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .safety import GGUF_STRING, GGUFArray, _natural, _short, check_gguf_memory, gguf_layout

_BLOCK = re.compile(r"^blk\.(\d+)\.")
# Tensors a GGUF file may store that transformers derives from the metadata instead (Llama 3's rope scaling
# factors): stored, not used, and no sign of a mismatch.
DERIVED = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
# Settings of the model that must be finite and positive (norm epsilon, rotary base and scaling).
POSITIVE = ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "rope.freq_base", "rope.scaling.factor")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id", "seperator_token_id")


def _positive_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _sizes(path: Path, meta: dict[str, Any], arch: str) -> None:
    """Sizes are integers >= 1 (the head count divides the width, the key-value heads the heads); the norm epsilon and
    rotary settings are finite positive numbers, and no float setting is NaN or infinite."""
    for name in ("block_count", "embedding_length", "attention.head_count"):
        if not _positive_int(meta.get(f"{arch}.{name}")):
            raise UsageError(f"{path}: GGUF metadata {arch}.{name} must be an integer >= 1, got "
                             f"{_short(meta.get(f'{arch}.{name}'))}")
    for name in ("context_length", "feed_forward_length", "attention.head_count_kv", "vocab_size",
                 "attention.key_length", "attention.value_length"):
        key = f"{arch}.{name}"
        if key in meta and not _positive_int(meta[key]):
            raise UsageError(f"{path}: GGUF metadata {key} must be an integer >= 1, got {_short(meta[key])}")
    width, heads = meta[f"{arch}.embedding_length"], meta[f"{arch}.attention.head_count"]
    if f"{arch}.attention.key_length" not in meta and width % heads:
        raise UsageError(f"{path}: GGUF metadata {arch}.attention.head_count {heads} does not divide "
                         f"{arch}.embedding_length {width}")
    kv = meta.get(f"{arch}.attention.head_count_kv")
    if kv is not None and heads % kv:
        raise UsageError(f"{path}: GGUF metadata {arch}.attention.head_count_kv {kv} does not divide "
                         f"{arch}.attention.head_count {heads}")
    for name in POSITIVE:
        value = meta.get(f"{arch}.{name}")
        if f"{arch}.{name}" in meta and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                               and math.isfinite(value) and value > 0):
            raise UsageError(f"{path}: GGUF metadata {arch}.{name} must be a finite positive number, got "
                             f"{_short(value)}")
    bad = next((k for k, v in meta.items() if k.startswith(f"{arch}.") and isinstance(v, float)
                and not math.isfinite(v)), None)
    if bad is not None:  # a NaN anywhere in the model's settings makes every logit NaN
        raise UsageError(f"{path}: GGUF metadata {bad} must be a finite number, got {meta[bad]}")


def _tokenizer(path: Path, meta: dict[str, Any]) -> None:
    """The token list is a non-empty array of strings; scores (a SentencePiece tokenizer needs them), token types and
    merges are arrays of its length where given; token ids lie inside the vocabulary."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if not (isinstance(tokens, GGUFArray) and tokens.kind == GGUF_STRING and tokens.length >= 1):
        raise UsageError(f"{path}: GGUF metadata tokenizer.ggml.tokens must be a non-empty array of strings, got "
                         f"{_short(tokens)}")
    model = meta.get("tokenizer.ggml.model")
    if not isinstance(model, str):
        raise UsageError(f"{path}: GGUF metadata tokenizer.ggml.model must be a string, got {_short(model)}")
    needed = {"llama": ("scores",), "gpt2": ("merges",)}.get(model, ())
    for name in ("scores", "token_type", "merges"):
        value = meta.get(f"tokenizer.ggml.{name}")
        if value is None and name in needed:
            raise UsageError(f"{path}: GGUF metadata tokenizer.ggml.{name} is missing (a {model!r} tokenizer needs "
                             f"it)")
        if value is not None and (not isinstance(value, GGUFArray) or (name != "merges"
                                                                        and value.length != tokens.length)):
            raise UsageError(f"{path}: GGUF metadata tokenizer.ggml.{name} must be an array of one entry per token "
                             f"of tokenizer.ggml.tokens ({tokens.length:,}), got {_short(value)}")
    size = tokens.length
    for name in TOKEN_IDS:
        value = meta.get(f"tokenizer.ggml.{name}")
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < size):
            raise UsageError(f"{path}: GGUF metadata tokenizer.ggml.{name} must be a token id below {size:,}, got "
                             f"{_short(value)}")


def _widths(path: Path, meta: dict[str, Any], shapes: dict[str, list[int]], arch: str) -> None:
    """The sizes the model is built with are those of the stored tensors (GGUF lists a matrix's dimensions fastest
    first: the token embedding is [width, vocabulary]): transformers would build a model of the metadata's sizes,
    then fail to load the weights into it, after allocating it."""
    embedding = shapes.get("token_embd.weight")
    if embedding is None or len(embedding) != 2:
        raise UsageError(f"{path}: token_embd.weight must be a stored matrix, got {_short(embedding)}")
    vocab_key = f"{arch}.vocab_size" if f"{arch}.vocab_size" in meta else "tokenizer.ggml.tokens"
    vocab = meta[vocab_key] if vocab_key != "tokenizer.ggml.tokens" else meta[vocab_key].length
    up = shapes.get("blk.0.ffn_up.weight")
    for key, value, stored, tensor in ((f"{arch}.embedding_length", meta[f"{arch}.embedding_length"], embedding[0],
                                        "token_embd.weight"), (vocab_key, vocab, embedding[1], "token_embd.weight"),
                                       (f"{arch}.feed_forward_length", meta.get(f"{arch}.feed_forward_length"),
                                        up[1] if up and len(up) == 2 else None, "blk.0.ffn_up.weight")):
        if value is not None and stored is not None and value != stored:
            what = "entries" if key == "tokenizer.ggml.tokens" else "is"
            raise UsageError(f"{path}: GGUF metadata {key} {what} {value:,} but the stored {tensor} has "
                             f"{stored:,}")


def _data(path: Path, shapes: dict[str, list[int]], places: dict[str, tuple[int, int, int]]) -> None:
    """Every tensor's data lies inside the file (a cut file was read as far as it went, then failed reshaping an
    array)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    size = path.stat().st_size
    for name in sorted(shapes, key=_natural):
        kind, offset, start = places[name]
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise UsageError(f"{path}: stores {name} in an unknown tensor type {kind}") from None
        end = start + offset + math.prod(shapes[name]) // block * block_bytes
        if end > size:
            raise UsageError(f"{path}: the data of {name} ends at byte {end:,}, past the end of the file ({size:,} "
                             f"bytes): truncated or corrupt")


def _blocks(path: Path, shapes: dict[str, list[int]], layers: int, arch: str) -> None:
    """The blocks stored (`blk.N.*`) are exactly 0 .. block_count - 1."""
    stored = sorted({int(m[1]) for name in shapes if (m := _BLOCK.match(name))})
    extra = next((i for i in stored if i >= layers), None)
    if extra is not None:
        raise UsageError(f"{path}: stores tensors of block {extra} (blk.{extra}.*) but GGUF metadata "
                         f"{arch}.block_count is {layers}")
    missing = next((i for i in range(layers) if i not in set(stored)), None)
    if missing is not None:
        raise UsageError(f"{path}: GGUF metadata {arch}.block_count is {layers} but the file stores no tensor of "
                         f"block {missing} (blk.{missing}.*)")


def check_gguf_file(path: Path, device: str | None, backend: Any, dtype_bytes: int = 4) -> None:
    """Everything about a GGUF file that can be checked from its header before a reader allocates anything: the
    memory its model takes, its metadata (`_sizes`, `_tokenizer`, `_widths`), its stored blocks against
    `block_count`, then its tensors against the model transformers builds from it (`check_gguf_model`, on the meta
    device)."""
    meta, shapes, places = gguf_layout(path)
    # first: tensor shapes alone can claim terabytes
    check_gguf_memory(path, device, backend, (meta, shapes), dtype_bytes)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise UsageError(f"{path}: GGUF metadata general.architecture must be a string, got {_short(arch)}")
    _sizes(path, meta, arch)
    _tokenizer(path, meta)
    _widths(path, meta, shapes, arch)
    _blocks(path, shapes, meta[f"{arch}.block_count"], arch)
    _data(path, shapes, places)
    check_gguf_model(path, described_model(path), shapes)


def _weights_map(hf_model) -> dict[str, str]:
    """GGUF tensor name -> parameter name, as transformers maps them when it loads a GGUF file into `hf_model`."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    arch = hf_model.config.model_type
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=hf_model.config.to_dict())
    return get_gguf_hf_weights_map(hf_model, processor)


def described_model(path: Path):
    """The model the GGUF file's metadata describes, as transformers builds it from them, on the meta device (nothing
    allocated, no tensor data read). Call after the header's checks: the sizes are then the stored tensors'."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from .loaded import quiet_hf

    with quiet_hf():
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)


def check_gguf_model(path: Path, hf_model, shapes: dict[str, list[int]]) -> None:
    """UsageError naming `path` and the first mismatch unless every tensor the file stores (`shapes`, from its
    header) is one of `hf_model`'s parameters (the model transformers builds from the file), with as many entries, and
    every parameter comes from a stored tensor (once for parameters that share one, e.g. tied embeddings)."""
    to_param = _weights_map(hf_model)
    params = dict(hf_model.named_parameters(remove_duplicate=False))
    layers = getattr(hf_model.config, "num_hidden_layers", None)
    for name in sorted(shapes, key=_natural):
        if name not in to_param and name not in DERIVED:
            raise UsageError(f"{path}: stores {name}, which is not a tensor of the model it describes "
                             f"(num_hidden_layers={layers}); every stored tensor must be used")
        param = params.get(to_param.get(name, ""))
        if param is not None and math.prod(shapes[name]) != param.numel():
            raise UsageError(f"{path}: stores {name} with shape {shapes[name][::-1]} but the model it describes "
                             f"needs {list(param.shape)} ({to_param[name]})")
    from_file = {param for name, param in to_param.items() if name in shapes}
    owners: dict[int, list[str]] = {}
    for name, p in params.items():
        owners.setdefault(id(p), []).append(name)
    to_gguf = {param: name for name, param in to_param.items()}
    for names in owners.values():
        if not from_file & set(names):
            wanted = next((to_gguf[n] for n in names if n in to_gguf), names[0])
            raise UsageError(f"{path}: its model (num_hidden_layers={layers}) needs {wanted}, which the file "
                             f"lacks")
