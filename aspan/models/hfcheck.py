"""Checks of a Hugging Face checkpoint directory made before anything is built from it: its `config.json`'s
sizes, norms and rotary settings, the files transformers may open, and the names and shapes of its safetensors
weights (each failure one `UsageError` line naming the file and the key)."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable, get_args

from ..errors import UsageError, reading
from ..io import read_json
from .jsonvalues import _POS_NUMBER, Dtype, _choice, _int, _is_number, _short

# ---------------------------------------------------------------------------------- Hugging Face directories
# Size keys of the Hugging Face configs the toolkit loads (GPT-NeoX, GPT-2, Bloom, Llama, Qwen2, Gemma3), each an
# integer >= 1 where present (`n_inner`, `head_dim` and `num_key_value_heads` may be null).
HF_SIZES = ("vocab_size", "hidden_size", "n_embd", "num_hidden_layers", "n_layer", "num_attention_heads", "n_head",
            "intermediate_size", "n_inner", "max_position_embeddings", "n_positions", "num_key_value_heads",
            "head_dim", "sliding_window")
HF_POSITIVE = ("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps", "rope_theta", "rope_local_base_freq",
               "query_pre_attn_scalar")
_LAYER = re.compile(r"\.\d+\.")  # a layer index inside a tensor name
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack", "model.ckpt",
           "model.pt")


def _first(config: dict[str, Any], *keys: str) -> tuple[str, Any]:
    """The first of `keys` present (non-null) in `config`, and its value; (keys[0], None) when none is."""
    return next(((k, config[k]) for k in keys if config.get(k) is not None), (keys[0], None))


def check_hf_config(file: Path, config: dict[str, Any]) -> None:
    """UsageError naming `file` and the key unless the Hugging Face `config`'s sizes, norms and rotary settings are
    ones a model can be built from; remote code (`auto_map`, `trust_remote_code`) is refused."""
    for key in ("auto_map", "trust_remote_code"):
        if config.get(key):
            raise UsageError(f"{file}: {key} is refused: the toolkit never runs code a checkpoint names")
    if not isinstance(config.get("model_type", ""), str):
        raise UsageError(f"{file}: model_type must be a string, got {_short(config['model_type'])}")
    bad = next((k for k, v in config.items() if isinstance(v, float) and not math.isfinite(v)), None)
    if bad is not None:  # a NaN or infinite setting (a soft-cap, a scale) makes every logit NaN
        raise UsageError(f"{file}: {bad} must be a finite number, got {config[bad]}")
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise UsageError(f"{file}: architectures must be a list of class names or null, got {_short(archs)}")
    if "quantization_config" in config:
        quant = config["quantization_config"]
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        raise UsageError(f"{file}: quantization_config ({_short(method)}) is refused: quantised checkpoints are not "
                         f"supported (weights are read as stored, in floating point)")
    for key in ("dtype", "torch_dtype"):
        why = _choice(*get_args(Dtype), None)(config.get(key))
        if why:
            raise UsageError(f"{file}: {key} {why}, got {_short(config[key])}")
    for key in HF_SIZES:
        if config.get(key) is not None or (key in config and key not in ("n_inner", "head_dim", "sliding_window",
                                                                            "num_key_value_heads")):
            why = _int(1)(config[key])
            if why:
                raise UsageError(f"{file}: {key} {why}, got {_short(config[key])}")
    for key in HF_POSITIVE:
        if key in config and _POS_NUMBER(config[key]):
            raise UsageError(f"{file}: {key} {_POS_NUMBER(config[key])}, got {_short(config[key])}")
    (width_key, width), (heads_key, heads) = _first(config, "hidden_size", "n_embd"), \
        _first(config, "num_attention_heads", "n_head")
    for key, value in ((width_key, width), (heads_key, heads), _first(config, "num_hidden_layers", "n_layer"),
                       ("vocab_size", config.get("vocab_size"))):
        if value is None:
            raise UsageError(f"{file}: {key} is missing")
    if config.get("head_dim") is None and width % heads:
        raise UsageError(f"{file}: {heads_key} {heads} does not divide {width_key} {width}")
    kv = config.get("num_key_value_heads")
    if kv is not None and heads % kv:
        raise UsageError(f"{file}: num_key_value_heads {kv} does not divide {heads_key} {heads}")
    _check_rope(file, config)


def _check_rope(file: Path, config: dict[str, Any]) -> None:
    """`partial_rotary_factor` in [0, 1] and a positive rope theta, at the top level or in `rope_parameters`."""
    rope = config.get("rope_parameters")
    if rope is not None and not isinstance(rope, dict):
        raise UsageError(f"{file}: rope_parameters must be a JSON object, got {_short(rope)}")
    nested = [(f"rope_parameters.{k}", v) for k, v in (rope or {}).items()]
    nested += [(f"rope_parameters.{t}.{k}", v) for t, sub in (rope or {}).items() if isinstance(sub, dict)
               for k, v in sub.items()]
    for key, value in [*nested, *(("partial_rotary_factor", config[k]) for k in ["partial_rotary_factor"]
                                  if k in config)]:
        name = key.rsplit(".", 1)[-1]
        if name == "partial_rotary_factor" and not (_is_number(value) and 0 <= value <= 1):
            raise UsageError(f"{file}: {key} must be a number in [0, 1], got {_short(value)}")
        if name in ("rope_theta", "factor") and _POS_NUMBER(value):
            raise UsageError(f"{file}: {key} {_POS_NUMBER(value)}, got {_short(value)}")


def stored_tensors(directory: Path) -> dict[str, tuple[Path, list[int]]]:
    """name -> (file, shape) of every tensor in a directory's safetensors weights (`model.safetensors`, or the shards
    `model.safetensors.index.json` names, each inside the directory), from the headers alone; UsageError naming the
    file when weights are missing, pickled (never read: unpickling runs code), truncated or corrupt."""
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        files = _shards(index)
    else:
        pickled = next((directory / n for n in PICKLES if (directory / n).exists()), None)
        if pickled is not None:
            raise UsageError(f"{pickled}: only safetensors weights are read (a pickle can run code when loaded); "
                             f"convert it to model.safetensors")
        raise UsageError(f"{single}: missing (no weights in {directory})")
    from safetensors import SafetensorError, safe_open

    out: dict[str, tuple[Path, list[int]]] = {}
    for file in files:
        try:
            with safe_open(str(file), "pt") as f:
                for name in f.keys():
                    out[name] = (file, list(f.get_slice(name).get_shape()))
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise UsageError(f"{file}: corrupt or truncated safetensors file ({e})") from None
    return out


def _shards(index: Path) -> list[Path]:
    """The shard files a safetensors index names (plain file names inside its directory)."""
    doc = read_json(index, "safetensors index")
    for key in ("metadata", "weight_map"):
        if not isinstance(doc, dict) or not isinstance(doc.get(key), dict):
            raise UsageError(f"{index}: not a safetensors index ({key} must be a JSON object)")
    values = list(doc["weight_map"].values())
    bad = next((v for v in values if not isinstance(v, str)), None)
    if bad is not None:
        raise UsageError(f"{index}: weight_map names {_short(bad)}, not a file in {index.parent}")
    names = sorted(set(values))
    for name in names:
        if not isinstance(name, str) or Path(name).name != name or not (index.parent / name).is_file():
            raise UsageError(f"{index}: weight_map names {_short(name)}, not a file in {index.parent}")
    return [index.parent / n for n in names]


def expected_tensors(directory: Path) -> tuple[dict[str, list[int]], list[set[str]], set[str], Callable[[str], str]]:
    """(name -> shape of every parameter, groups of names sharing one tensor, optional buffer names, the renaming
    `transformers` applies to stored names) of the Hugging Face model the directory's config.json describes, built on
    the meta device (nothing allocated, no weights read). Call after `check_hf_config` and `hf_memory`: the sizes are
    then sane."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from .loaded import quiet_hf

    file = directory / "config.json"
    try:  # transformers validates every field (huggingface_hub's StrictDataclassFieldValidationError, among others)
        hf_config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
        with torch.device("meta"), quiet_hf():  # its generation-config notes (e.g. on `output_attentions`) too
            model = AutoModelForCausalLM.from_config(hf_config)
    except Exception as e:  # noqa: BLE001 - anything a config file makes transformers raise is that file's fault
        text = " ".join(str(e).split())
        raise UsageError(f"{file}: cannot build the model it describes ({type(e).__name__}: {_short(text, 300)})") \
            from None
    shapes, owners = {}, {}
    for name, p in model.named_parameters(remove_duplicate=False):
        shapes[name] = list(p.shape)
        owners.setdefault(id(p), set()).add(name)
    buffers = {name for name, _ in model.named_buffers()}
    return shapes, list(owners.values()), buffers, _stored_name(model)


def _stored_name(model) -> Callable[[str], str]:
    """The name `transformers` gives a stored tensor when loading into `model` (its renamings for older checkpoints,
    e.g. GPT-NeoX's `embed_out` as `lm_head`, and the base-model prefix added or dropped); names as stored where this
    `transformers` has no such machinery."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, rename_source_key
    except ImportError:  # pragma: no cover - transformers before 5
        return lambda name: name
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if not isinstance(t, WeightRenaming)]
    state = model.state_dict()
    return lambda name: rename_source_key(name, renamings, converters, model.base_model_prefix, state)[0]


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _blame(config: dict[str, Any], expected: list[int], stored: list[int] | None) -> str:
    """The config keys behind a tensor's expected shape that the stored tensor contradicts (all sizes if unclear)."""
    differing = set(expected) - set(stored or [])
    keys = [k for k in HF_SIZES if config.get(k) is not None and config[k] in differing]
    if stored is None:  # a whole tensor missing or unused: its layer index points at the layer count
        keys = [_first(config, "num_hidden_layers", "n_layer")[0]]
    keys = keys or [k for k in HF_SIZES if config.get(k) is not None]
    return ", ".join(f"{k}={config[k]}" for k in keys)


def check_hf_weights(directory: Path, config: dict[str, Any]) -> None:
    """UsageError naming the first mismatch unless every stored tensor is one the config's model has, with its shape,
    and every parameter the model has is stored (once for tensors it shares); from the safetensors headers, before
    any model is instantiated."""
    file = directory / "config.json"
    shapes, groups, buffers, rename = expected_tensors(directory)
    stored = {rename(name): (name, *where) for name, where in stored_tensors(directory).items()}
    for name in sorted(stored, key=_natural):
        _, where, shape = stored[name]
        if name in shapes and shape != shapes[name]:
            raise UsageError(f"{where}: {name} has shape {shape} but {file} ({_blame(config, shapes[name], shape)}) "
                             f"gives {shapes[name]}")
        if name not in shapes and name not in buffers:
            blame = _blame(config, [], None) if _LAYER.search(name) else _blame(config, [], [])
            raise UsageError(f"{where}: {stored[name][0]} is not a tensor of the model {file} describes ({blame}); "
                             f"every stored tensor must be used")
    for group in sorted(groups, key=lambda g: _natural(min(g))):
        if not group & stored.keys():
            name = min(group, key=_natural)
            blame = _blame(config, [], None) if _LAYER.search(name) else _blame(config, [], [])
            raise UsageError(f"{file} ({blame}): its model needs {name}, which the weights in {directory} lack")



# The JSON files of a Hugging Face directory that transformers reads besides config.json, each a JSON object.
HF_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                 "generation_config.json")
# Every file of a Hugging Face directory transformers may open: each must be a regular file where present (a FIFO
# would block the load for ever).
HF_FILES = ("config.json", *HF_JSON_FILES, "model.safetensors", "model.safetensors.index.json", "tokenizer.model",
            "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja")


def check_hf_files(directory: Path) -> None:
    """UsageError naming the file unless every file transformers may open (`HF_FILES`) is a regular file where
    present, each JSON file it reads (`HF_JSON_FILES`) is a JSON object (bounded integers and nesting:
    `aspan.io.read_json`) and the `tokenizers` library reads its `tokenizer.json` (files of another shape, e.g.
    `{"model": 5}` or a list, made transformers raise a KeyError, TypeError or AttributeError naming no file)."""
    for name in HF_FILES:
        file = directory / name
        if file.exists() and not file.is_file():
            raise UsageError(f"{file}: not a regular file; a checkpoint's files are read as files")
    for name in HF_JSON_FILES:
        file = directory / name
        if file.is_file() and not isinstance(read_json(file, f"{name} (JSON)"), dict):
            raise UsageError(f"{file}: not a valid {name} (a JSON object is expected)")
    file = directory / "tokenizer.json"
    if file.is_file():
        from tokenizers import Tokenizer

        with reading(file, "tokenizer file (JSON of the tokenizers library)"):
            Tokenizer.from_file(str(file))
