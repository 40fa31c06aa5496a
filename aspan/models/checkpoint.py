"""Save and load models: tiny models as Hugging Face checkpoints (GPT-NeoX, GPT-2 or Bloom; the aspan format where
no exact Hugging Face form exists), HF directories, GGUF files; as a HookedTransformer or a TransformerBridge
(`backend`)."""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..checks import check_device
from ..errors import UsageError, reading
from ..hf_tokenization import HFCharAdapter
from ..io import atomic_dir, clean, read_json, sha256_of, to_json
from ..options import BACKENDS, Backend, ModelDtype, check_option, dtype_name
from ..tokenization import CharTokenizer, Tokenizer
from . import hfform
from .backend import backend_named, backend_of, default_backend
from .build import build, to_bridge  # noqa: F401 (to_bridge: kept importable here)
from .loaded import LoadedModel, import_transformer_lens, process_kept
from .safety import ALL_GPUS, check_aspan_config, check_hf_checkpoint, check_hf_config, check_tl_memory
from .trained import TrainedTask, from_meta, record_task

WEIGHTS, CONFIG, HF_TOKENIZER_DIR = "model.safetensors", "config.json", "hf_tokenizer"
FORMAT, VERSION = "aspan", 1
MAX_CONFIG_BYTES = 16 * 2**20  # a config.json (sizes, tokenizer, metadata) is kilobytes; refuse a giant one unread


def default_device() -> str:
    """`cuda` when a GPU is available, else `cpu`."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def cfg_to_dict(cfg) -> dict[str, Any]:
    """The model config as a JSON-able dict (device dropped: it is chosen at load time)."""
    d = {k: clean(v) for k, v in cfg.to_dict().items() if k != "device"}
    json.dumps(d)  # fail here, not half-way through writing, if TransformerLens adds an exotic field
    return d


def cfg_from_dict(d: dict[str, Any], device: str | None = None, dtype: torch.dtype | None = None):
    """The HookedTransformerConfig of a saved config dict, on `device`, in `dtype` (None: the one saved)."""
    from transformer_lens import HookedTransformerConfig

    d = dict(d)
    saved = getattr(torch, d.pop("dtype", "float32"))
    dtype = dtype or saved
    seed = d.pop("seed", None)  # the config would reseed every global RNG on construction
    cfg = HookedTransformerConfig.from_dict({**d, "dtype": dtype, "device": device, "init_weights": False})
    cfg.seed = seed
    return cfg


def save(
    model, directory: str | os.PathLike, tokenizer: Tokenizer, hf: bool | None = None, **meta: Any
) -> Path:
    """Write the checkpoint of `model` (its tokenizer, free `meta`) into `directory`, atomically.

    `hf=None` (default): a standard Hugging Face checkpoint when the model has an exact Hugging Face form (GPT-NeoX
    for rotary or no positions, GPT-2 for learned ones, Bloom for ALiBi) and a character tokenizer
    (`aspan.models.hfform`), else the aspan format (`model.safetensors` with TransformerLens names + `config.json`);
    `hf=True` requires the former, `hf=False` forces the latter (exact parameters, e.g. for resuming training).
    Files are written to a temporary directory beside the target, then moved in (`aspan.io.atomic_dir`).
    """
    hf_model = backend_of(model).hf_model(model, tokenizer, hf)  # ValueError when the asked-for form is impossible
    if hf_model is not None:
        with atomic_dir(Path(directory)) as tmp:
            hfform.save_hf(hf_model, tmp, tokenizer, clean(meta))
        return Path(directory)
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tok = tokenizer.to_dict()  # type: ignore[attr-defined]
    hf_tok = getattr(tokenizer, "hf_tokenizer", None)
    if hf_tok is not None:  # the HF tokenizer files go inside the checkpoint: it stays self-contained
        tok = {**tok, "hf_path": HF_TOKENIZER_DIR}
    config = {"format": FORMAT, "version": VERSION, "model": cfg_to_dict(model.cfg), "tokenizer": tok, "meta": meta}
    config_text = to_json(config, sort_keys=True)  # fails before any write
    with atomic_dir(directory) as tmp:  # config.json moves in last: it marks a complete checkpoint
        if hf_tok is not None:
            hf_tok.save_pretrained(tmp / HF_TOKENIZER_DIR)
        weights = {k: v.detach().to("cpu").contiguous() for k, v in model.named_parameters()}
        save_file(weights, str(tmp / WEIGHTS), metadata={"format": FORMAT})
        (tmp / CONFIG).write_text(config_text)
    return directory


def _read_config(path: Path) -> dict[str, Any]:
    file = path / CONFIG
    if file.exists() and not file.is_file():
        raise UsageError(f"{file}: not a regular file ({_kind(file)})")
    if not file.is_file():
        raise ValueError(f"{file}: missing; not a model checkpoint directory")
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise UsageError(f"{file}: {file.stat().st_size:,} bytes; a model config is at most {MAX_CONFIG_BYTES:,}")
    config = read_json(file, "model config (JSON)")
    if not isinstance(config, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(config).__name__}")
    return config


def saved_info(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """(meta, architecture) of a checkpoint directory in either format: its free metadata and its model's
    TransformerLens config fields (ValueError naming the file if unreadable)."""
    config = _read_config(Path(path))
    if hfform.is_aspan_hf(config):
        check_hf_config(Path(path) / CONFIG, config)
        hfform.check_form_config(Path(path) / CONFIG, config)
        return dict(config[hfform.KEY].get("meta", {})), hfform.tl_fields(config)
    check_aspan_config(Path(path) / CONFIG, config, VERSION)
    return config.get("meta", {}), config["model"]


def saved_task(path_or_name: str | os.PathLike) -> TrainedTask | None:
    """The training task an aspan checkpoint's metadata names, read without loading its weights; None for models
    that name none (GGUF files, SmolLM2, other Hugging Face checkpoints)."""
    path = model_path(path_or_name)
    if not (path / CONFIG).is_file():
        return None
    config = _read_config(path)
    if config.get("format") != FORMAT and not hfform.is_aspan_hf(config):
        return None
    return from_meta(saved_info(path)[0])


def architecture(model) -> dict[str, Any]:
    """The TransformerLens config fields of a model, as `saved_info` gives them: a TransformerBridge's from its Hugging
    Face config (its own `cfg` leaves out, e.g., the rotary dimension)."""
    config = backend_of(model).hf_config(model)
    if config is not None and hfform.form_of_config(config) is not None:
        return hfform.tl_fields(config)
    return cfg_to_dict(model.cfg)


def _tokenizer_from_dict(d: dict[str, Any], base_dir: Path) -> Tokenizer:
    """The tokenizer an aspan checkpoint stores; an `hf_char` one reads its Hugging Face files from inside the
    checkpoint directory only (never an absolute path, a parent directory or a hub name)."""
    where = f"{base_dir / CONFIG}: tokenizer"
    kind = d.get("type", "char")
    if kind == "char":
        if not isinstance(d.get("chars"), str) or not isinstance(d.get("bos", True), bool):
            raise UsageError(f"{where}: a char tokenizer needs chars (a string) and bos (true or false)")
        return CharTokenizer.from_dict(d)
    if kind == "hf_char":
        hf_path = d.get("hf_path")
        inside = isinstance(hf_path, str) and not os.path.isabs(hf_path) and \
            (base_dir / hf_path).resolve().is_relative_to(base_dir.resolve()) and (base_dir / hf_path).is_dir()
        if not inside:
            raise UsageError(f"{where}.hf_path must name a directory inside the checkpoint, got {hf_path!r}")
        return HFCharAdapter.from_dict(d, base_dir=base_dir)
    raise UsageError(f"{where}.type must be 'char' or 'hf_char', got {kind!r}")


def _load_hfform(path: Path, config: dict[str, Any], where: Placement) -> LoadedModel:
    """An aspan tiny model stored in its Hugging Face form, as `where.backend` builds it, in `where.dtype`."""
    tokenizer, meta = hfform.aspan_entry(path, config)
    d_vocab = hfform.check_form_config(path / CONFIG, config).d_vocab
    if tokenizer.vocab_size > d_vocab:
        raise UsageError(f"{path / CONFIG}: vocab_size {d_vocab} is smaller than the tokenizer's "
                         f"{tokenizer.vocab_size} tokens")
    hfform.read_state(path)  # ValueError naming the file if missing, truncated or corrupt: before any model
    return LoadedModel(backend_named(where.backend).from_form(path, config, where), tokenizer, meta)


def _load_aspan(path: Path, config: dict[str, Any], device: str, dtype: torch.dtype | None = None) -> LoadedModel:
    """An aspan-format checkpoint as a HookedTransformer, in `dtype` (None: the one saved)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = path / CONFIG
    check_aspan_config(file, config, VERSION)  # types, ranges and allowed values, before anything is built
    asked = {} if dtype is None else {"dtype": dtype_name(dtype)}
    check_tl_memory(str(file), {**config["model"], **asked}, device)
    try:
        tokenizer = _tokenizer_from_dict(config["tokenizer"], path)
        cfg = cfg_from_dict(config["model"], device, dtype)
    except (KeyError, TypeError, ValueError, AttributeError, AssertionError) as e:
        raise UsageError(f"{file}: invalid aspan model config ({type(e).__name__}: {e})") from None
    if tokenizer.vocab_size > cfg.d_vocab:
        raise UsageError(f"{file}: model.d_vocab {cfg.d_vocab} is smaller than the tokenizer's {tokenizer.vocab_size} "
                         f"tokens")
    weights_file = path / WEIGHTS
    if not weights_file.is_file():
        raise ValueError(f"{weights_file}: missing")
    try:
        weights = load_file(str(weights_file), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"{weights_file}: corrupt or truncated safetensors file ({e})") from None
    hfform.check_finite(weights_file, weights)
    model = build(cfg)
    expected = {k: p.shape for k, p in model.named_parameters()}
    missing = sorted(expected.keys() - weights.keys())
    unexpected = sorted(weights.keys() - expected.keys())
    wrong = [k for k in expected.keys() & weights.keys() if weights[k].shape != expected[k]]
    if missing or unexpected or wrong:
        raise ValueError(
            f"{weights_file}: does not match {file} (missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"wrong shape {sorted(wrong)[:5]})"
        )
    model.load_state_dict(weights, strict=False)
    return LoadedModel(model.eval(), tokenizer, config.get("meta", {}))


# Checkpoints shipped inside the package, loadable by name (e.g. `load("reversal")`).
SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints"


def shipped() -> list[str]:
    """Names of the checkpoints shipped in the package."""
    return sorted(p.name for p in SHIPPED.iterdir() if (p / CONFIG).is_file()) if SHIPPED.is_dir() else []


def resolve(path_or_name: str | os.PathLike) -> Path:
    """The path of a checkpoint: as given when it exists, else the shipped checkpoint of that name."""
    path = Path(path_or_name)
    if not path.exists() and str(path_or_name) in shipped():
        return SHIPPED / str(path_or_name)
    return path


def model_path(path_or_name: str | os.PathLike) -> Path:
    """The file or directory a model argument names: "smollm2" -> its `.gguf` file, a shipped name -> its
    checkpoint, anything else as given (it need not exist)."""
    if str(path_or_name).lower() == "smollm2" and not Path(path_or_name).exists():
        from .hf import smollm2_path

        return smollm2_path()
    return resolve(path_or_name)


def content_hash(path_or_name: str | os.PathLike) -> str:
    """sha256 of a model's files (`aspan.io.sha256_of` over its checkpoint directory or file): tells a model apart
    from another of the same shape put in its place. FileNotFoundError when there is no model there."""
    return sha256_of(model_path(path_or_name))


def weights_hash(model) -> str:
    """sha256 of a model object's parameters and buffers (names, dtypes, shapes and bytes, in order): what
    `content_hash` is for a model held in memory (another model, or this one trained further, hashes differently)."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        flat = tensor.detach().reshape(-1).contiguous().cpu()
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def load(
    path_or_name: str | os.PathLike, device: str | None = None, backend: Backend | None = None,
    dtype: ModelDtype | torch.dtype | None = None, device_map: str | dict[str, Any] | None = None, **adapter: Any,
) -> LoadedModel:
    """A model of any kind (`_load`) on `device` (None or "auto": CUDA when present) with `backend`, in `dtype`
    (float32 by default, bfloat16 or float16, as a name or a `torch.dtype`), or spread over several devices by
    `device_map` (Hugging Face's placement: "auto", "balanced" or a dict; Hugging Face checkpoints, GGUF files and
    SmolLM2 on the bridge backend). The training task its metadata names is recorded on the model
    (`aspan.models.trained`): evaluating it on another task's samples is then refused unless asked for. Pretrained
    models name none."""
    import_transformer_lens()
    where = Placement.of(device, backend, dtype, device_map)
    # a load leaves the caller's random state, environment, warning filters and logging as they were
    with process_kept(), \
            torch.random.fork_rng(devices=range(torch.cuda.device_count()) if where.device.startswith("cuda") else []):
        loaded = _load(path_or_name, where, **adapter)
    record_task(loaded.model, from_meta(loaded.meta))
    return loaded


class Placement(NamedTuple):
    """Where and how a model is loaded: checked and resolved before anything is read."""

    device: str  # the device (never "auto": resolved to CUDA when present, else the CPU)
    backend: Backend  # "hooked" (HookedTransformer) or "bridge" (TransformerBridge)
    dtype: torch.dtype  # float32 (default), bfloat16 or float16
    device_map: Any  # None (one device), or Hugging Face's placement over several (bridge only)

    @classmethod
    def of(cls, device: str | None, backend: Backend | None, dtype: Any, device_map: Any) -> Placement:
        """Resolve device, backend, dtype and device map (None or `auto`: the defaults); ValueError on a bad choice."""
        device = default_device() if device in (None, "auto") else check_device(device)
        backend = default_backend() if backend is None else check_option("backend", backend, BACKENDS)
        if not backend_named(backend).available():
            raise ValueError("backend 'hooked' needs TransformerLens 3 (HookedTransformer); this one has only 'bridge'")
        if device_map is not None and not backend_named(backend).takes_device_map:
            raise UsageError("device_map needs backend 'bridge' (a HookedTransformer is loaded onto one device)")
        return cls(device, backend, getattr(torch, dtype_name(dtype)), device_map)

    @property
    def memory_device(self) -> str:
        """The device whose free memory the memory refusal counts (every GPU's for a device_map)."""
        return ALL_GPUS if self.device_map is not None and self.device.startswith("cuda") else self.device


def _load(path_or_name: str | os.PathLike, where: Placement, **adapter: Any) -> LoadedModel:
    """Load an aspan checkpoint, a shipped one by name ("reversal"), a local HF checkpoint (Llama, Qwen2, Gemma3),
    a `.gguf` file, or "smollm2", as `where` says (device, backend, dtype, device_map).

    Pretrained models come with an `HFCharAdapter`; `adapter` keywords (instruction, few_shot, bos, alphabet)
    go to it. `backend`: "hooked" (HookedTransformer, the default on TransformerLens 3) or "bridge"
    (TransformerBridge in compatibility mode, the only one on TransformerLens 4). ValueError names the file on a
    corrupt or invalid checkpoint; FileNotFoundError if absent.
    """
    from . import hf

    device, backend, dtype, device_map = where
    hf_kwargs = {"dtype": dtype, **({} if device_map is None else {"device_map": device_map})}
    if str(path_or_name).lower() == "smollm2" and not Path(path_or_name).exists():
        return hf.load_smollm2(backend_named(backend), device=device, **hf_kwargs, **adapter)
    path = resolve(path_or_name)
    if not path.exists():
        names = ", ".join(repr(n) for n in [*shipped(), "smollm2"])
        raise FileNotFoundError(
            f"no model at {path} (expected a checkpoint directory, a .gguf file, or one of {names})"
        )
    if not path.is_dir():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{path}: expected a checkpoint directory or a .gguf file")
        if not path.is_file():
            raise UsageError(f"{path}: not a regular file ({_kind(path)}); a .gguf model is read from a file")
        with reading(path, "GGUF model file"):
            return hf.load_gguf(path, backend_named(backend), device=device, **hf_kwargs, **adapter)
    config = _read_config(path)
    if config.get("format") == FORMAT or hfform.is_aspan_hf(config):
        if adapter:
            raise ValueError(f"{path}: an aspan checkpoint stores its tokenizer; unexpected {sorted(adapter)}")
    if config.get("format") == FORMAT:
        if device_map is not None:
            raise UsageError(f"{path}: device_map needs a Hugging Face checkpoint; this one is in the aspan format")
        with reading(path, "aspan checkpoint directory"):
            return backend_named(backend).from_hooked(functools.partial(_load_aspan, path, config, device), where)
    if hfform.is_aspan_hf(config):
        # config values, memory, weights: before any model
        check_hf_checkpoint(path, config, where.memory_device, backend_named(backend), dtype.itemsize)
        with reading(path, "aspan checkpoint directory (Hugging Face form)"):
            return _load_hfform(path, config, where)
    if not (config.get("architectures") or config.get("model_type")):
        raise ValueError(f"{path / CONFIG}: neither an aspan checkpoint (format 'aspan') nor a Hugging Face config "
                         f"(no model_type)")
    check_hf_config(path / CONFIG, config)  # architectures, quantisation, sizes: before anything reads them
    try:
        hf.architecture(config)
    except ValueError as e:
        raise UsageError(f"{path / CONFIG}: {e}") from None
    check_hf_checkpoint(path, config, where.memory_device, backend_named(backend), dtype.itemsize)
    with reading(path, "Hugging Face checkpoint directory"):
        return backend_named(backend).from_hf_dir(path, config, where, adapter)


def _kind(path: Path) -> str:
    """What a path that is neither a directory nor a regular file is: a FIFO, a socket, a device..."""
    import stat

    mode = path.stat().st_mode
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "a directory" if path.is_dir() else "a special file")
