"""Checkpoints and training state: writing a checkpoint whole, finding the latest, reading its state back without
running code (earlier versions' pickles included), and checking that a resumed run is the run it continues."""
from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .. import models
from ..curves import CURVES_FILE
from ..io import atomic_dir, cut_rows, parse_json, to_json, write_text
from ..models import hfform
from ..models.checkpoint import architecture, saved_info
from .config import ARCHITECTURE, RESUME_FREE, TrainConfig

STATE_JSON, STATE_TENSORS = "train_state.json", "train_state.safetensors"  # a checkpoint's training state
LEGACY_STATE = "train_state.pt"  # earlier versions' pickle: read with torch.load(weights_only=True) only
STATE_FORMAT = "aspan-train-state"
STATE_VERSION = 2  # 2: with the digest of what a resume relies on (version 1 states, which have none, still resume)
STEP_NAME = re.compile(r"step-[0-9]+")  # what checkpoints/latest may hold


def _cut_logs(out_dir: Path, step: int) -> list[dict]:
    """Cut `log.jsonl`, `eval.jsonl` and `curves.jsonl` back to the rows of steps up to `step` (in place: works on a
    full disk too), the row saying why the run stopped dropped (the run goes on, or says it again); their remaining
    rows, train rows before the evaluations of the same step."""
    kept = lambda row: row.get("step", 0) <= step and row.get("kind") != "stop"  # noqa: E731
    rows = [r for name in ("log.jsonl", "eval.jsonl", CURVES_FILE) for r in cut_rows(out_dir / name, kept)]
    return sorted(rows, key=lambda r: (r.get("step", 0), r.get("kind") != "train"))


def _complete(path: Path) -> bool:
    return (path / "config.json").is_file() and ((path / STATE_JSON).is_file() or (path / LEGACY_STATE).is_file())


def _found(root: Path) -> str:
    names = sorted(p.name for p in root.glob("step-*") if STEP_NAME.fullmatch(p.name) and _complete(p))
    if not names:
        return f"and {root} holds no complete checkpoint"
    return f"checkpoints there: {', '.join(names)} (write the name of the one to continue from into {root / 'latest'})"


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The checkpoint `checkpoints/latest` names, or None when the run has none (no pointer, no checkpoint).

    The pointer must name a complete `step-N` directory inside `checkpoints/` (no path separators, no `..`, not
    absolute, not a link leading out); anything else, or a missing pointer beside existing checkpoints, is a
    ValueError naming the pointer and the checkpoints that exist (none is ever deleted for it).
    """
    root = Path(out_dir) / "checkpoints"
    pointer = root / "latest"
    if not pointer.exists():
        if root.is_dir() and any(STEP_NAME.fullmatch(p.name) for p in root.glob("step-*")):
            raise ValueError(f"{pointer} is missing; {_found(root)}")
        return None
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{pointer} is unreadable ({type(e).__name__}); {_found(root)}") from None
    if not STEP_NAME.fullmatch(name):
        raise ValueError(f"{pointer} must name a step-N directory of {root}, it holds {name[:80]!r}; "
                         f"{_found(root)}")
    path = root / name
    if path.resolve().parent != root.resolve():
        raise ValueError(f"{pointer} names {path}, a link leading out of {root}; {_found(root)}")
    if not _complete(path):
        raise ValueError(f"{pointer} names {name}, which is missing or incomplete; {_found(root)}")
    return path


SCRATCH_MARKER = ".aspan-scratch"  # marks a directory `train_resumable` made its own (it clears and removes it)
_RUN_FILES = {"log.jsonl", "eval.jsonl", CURVES_FILE, "checkpoints"}  # what a paused run directory holds


def claim_scratch(scratch: Path) -> Path | None:
    """Make `scratch` the scratch directory of `train_resumable` and return the checkpoint there to continue from
    (None: the run starts afresh in an empty directory). `scratch` may be new, empty, marked as such a directory
    (`SCRATCH_MARKER`), or, made before the marker existed, a paused run: a checkpoint and the logs only. Anything
    else is a ValueError and nothing is deleted: a directory it did not make is never cleared."""
    if scratch.is_symlink() or (scratch.exists() and not scratch.is_dir()):
        kind = "a link" if scratch.is_symlink() else "a file"
        raise ValueError(f"train_resumable: {scratch} is {kind}, not a directory; give a new or empty directory")
    names = set(os.listdir(scratch)) if scratch.is_dir() else set()
    if names and SCRATCH_MARKER not in names:
        try:
            paused = names <= _RUN_FILES and latest_checkpoint(scratch) is not None
        except ValueError:
            paused = False
        if not paused:
            raise ValueError(f"train_resumable: {scratch} is not empty and is not a scratch directory of "
                             f"train_resumable (it has no {SCRATCH_MARKER}), so it would be deleted; give a new or "
                             f"empty directory")
    ckpt = latest_checkpoint(scratch) if names else None
    if ckpt is None and names:
        shutil.rmtree(scratch)  # this function's own unfinished run, before its first checkpoint
    scratch.mkdir(parents=True, exist_ok=True)
    write_text(scratch / SCRATCH_MARKER, "the scratch directory of aspan.training.train_resumable: it is removed "
                                         "when the run ends\n")
    return ckpt


def _save_checkpoint(out_dir: Path, model, tokenizer, state: dict, meta: dict) -> Path:
    """Weights (aspan.models.save) and training state into a temporary directory renamed `checkpoints/step-N` when
    whole, then `latest` flipped and older checkpoints dropped: a failed write (a full disk) leaves nothing of it."""
    root = out_dir / "checkpoints"
    name = f"step-{state['step']:08d}"
    with atomic_dir(root / name) as tmp:
        models.save(model, tmp, tokenizer, hf=False, **meta)  # exact parameters: resuming needs them
        _write_state(tmp, state)
    write_text(root / "latest", name)
    for old in root.glob("step-*"):
        if old.name != name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return root / name


def _split_tensors(obj: Any, tensors: dict[str, torch.Tensor], key: str) -> Any:
    """`obj` as JSON data: each tensor moved into `tensors` (under a name made of its place) and replaced by
    `{"__tensor__": name}`; dict keys become strings."""
    if isinstance(obj, torch.Tensor):
        tensors[key] = obj.detach().cpu().clone().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        return {str(k): _split_tensors(v, tensors, f"{key}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_split_tensors(v, tensors, f"{key}.{i}") for i, v in enumerate(obj)]
    return obj


def _join_tensors(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of `_split_tensors` (KeyError for a tensor the file does not hold)."""
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        return {k: _join_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join_tensors(v, tensors) for v in obj]
    return obj


def _write_state(directory: Path, state: dict) -> None:
    """The training state as `train_state.safetensors` (its tensors) and `train_state.json` (the rest, with the
    digest of what a resume relies on: `_digest`); the checkpoint's `config.json` is written already."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    data = _split_tensors(state, tensors, "state")
    save_file(tensors, str(directory / STATE_TENSORS))
    digest = _digest(data, directory)
    doc = {"format": STATE_FORMAT, "version": STATE_VERSION, "state": data, "digest": digest}
    (directory / STATE_JSON).write_text(to_json(doc) + "\n")


def _digest(data: Any, ckpt: Path) -> str:
    """sha256 of what a resume relies on besides the tensors: the training state's JSON part (its step, settings,
    scheduler and optimiser groups) and the checkpoint's `config.json` (the run's settings, step and model)."""
    import hashlib

    h = hashlib.sha256(to_json(data, indent=None, sort_keys=True).encode())
    h.update(b"\0" + (ckpt / "config.json").read_bytes())
    return h.hexdigest()


def _check_digest(ckpt: Path, doc: dict, advice: str) -> None:
    """ValueError when a checkpoint's training state or config.json changed after it was written (an edited setting
    or step): a resume would continue silently as another run. States written before the digest have none."""
    if doc.get("version", 1) < 2:
        return
    try:
        same = doc.get("digest") == _digest(doc["state"], ckpt)
    except (OSError, ValueError, TypeError, RecursionError):
        same = False
    if not same:
        raise ValueError(f"cannot resume: {ckpt} was changed after it was written (its {STATE_JSON} or config.json "
                         f"does not match the digest saved with it: an edited setting or step); {advice}")


def read_state(ckpt: str | os.PathLike) -> dict:
    """The training state of checkpoint directory `ckpt` (step, optimizer, scheduler, RNG, config), read without
    running code: safetensors + JSON, or an earlier version's `train_state.pt` through `torch.load(weights_only=True)`,
    which refuses a pickle that would import or call anything. ValueError naming the file otherwise."""
    ckpt = Path(ckpt)
    advice = f"delete {ckpt} to resume from an earlier checkpoint, or start afresh"
    if (ckpt / STATE_JSON).is_file():
        file = ckpt / STATE_JSON
        state = _read_state_files(ckpt, file, advice)
    elif (ckpt / LEGACY_STATE).is_file():
        file = ckpt / LEGACY_STATE
        state = _read_legacy_state(file, advice)
    else:
        raise ValueError(f"cannot resume: {ckpt} holds no training state ({STATE_JSON} is missing); {advice}")
    problem = _state_problem(state)
    if problem:
        raise ValueError(f"cannot resume: {file} is not a training state ({problem}); {advice}")
    if STEP_NAME.fullmatch(ckpt.name) and int(ckpt.name[5:]) != state["step"]:
        raise ValueError(f"cannot resume: {file} says step {state['step']}, but its checkpoint is {ckpt.name} (an "
                         f"edited step); {advice}")
    tensors = dict(_tensors({k: v for k, v in state.items() if k != "rng"}, "state"))
    tensor_file = ckpt / STATE_TENSORS if file.name == STATE_JSON else file
    hfform.check_finite(tensor_file, tensors)  # the optimiser's moments (and a bridge's parameters)
    return state


def _tensors(obj: Any, key: str):
    """(place, tensor) of every tensor inside `obj` (dicts and lists), not copied."""
    if isinstance(obj, torch.Tensor):
        yield key, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{key}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{key}.{i}")


def _read_state_files(ckpt: Path, file: Path, advice: str) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        doc = parse_json(file.read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
            raise ValueError(f"format is not {STATE_FORMAT!r}")
        version = doc.get("version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= STATE_VERSION:
            raise ValueError(f"version {version!r}")
        state = _join_tensors(doc["state"], load_file(str(ckpt / STATE_TENSORS), device="cpu"))
        state["optimizer"]["state"] = {int(k): v for k, v in state["optimizer"]["state"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, SafetensorError) as e:
        raise ValueError(f"cannot resume: {file} (with {STATE_TENSORS}) is truncated or corrupt "
                         f"({type(e).__name__}); {advice}") from None
    _check_digest(ckpt, doc, advice)
    return state


def _read_legacy_state(file: Path, advice: str) -> dict:
    try:
        with warnings.catch_warnings():  # a plain pickle (not torch.save's) makes torch warn about its protocol
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only load failed" in str(e).lower():
            raise ValueError(f"cannot resume: {file} asks to import or call code when loaded (refused, nothing was "
                             f"run); {advice}") from None
        raise ValueError(f"cannot resume: {file} is truncated or corrupt (UnpicklingError); {advice}") from None
    except Exception as e:  # a truncated or corrupt file fails in many ways (EOFError, RuntimeError, zip errors)
        raise ValueError(f"cannot resume: {file} is truncated or corrupt ({type(e).__name__}); {advice}") from None


def _state_problem(state: Any) -> str | None:
    """What makes `state` unusable as a training state, or None."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not a dict"
    for key, kind in (("step", int), ("optimizer", dict), ("scheduler", dict), ("rng", dict), ("config", dict)):
        if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
            return f"{key!r} missing or not a {kind.__name__}"
    if state["step"] < 0:
        return f"negative step {state['step']}"
    if not isinstance(state["rng"].get("torch"), torch.Tensor):
        return "no torch RNG state"
    return None


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    if s.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def check_resume(ckpt: Path, config: TrainConfig, meta: dict | None, model) -> None:
    """ValueError naming the first setting of this run that differs from the checkpoint's: a resumed run must be the
    run it continues (same training settings, task, data, initialisation and architecture), or it would record
    settings it never trained with."""
    try:
        saved_meta, saved_model = saved_info(ckpt)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot resume: {ckpt / 'config.json'} is unreadable ({type(e).__name__}: {e})") from None
    as_json = lambda d: json.loads(json.dumps(d, default=str))  # noqa: E731  (tuples as lists, like the saved file)
    new, old = as_json(asdict(config)), saved_meta.get("train_config", {})
    pairs = [(f"--{k.replace('_', '-')}", old.get(k), v) for k, v in new.items() if k not in RESUME_FREE and k in old]
    pairs += [(f"run setting {k!r}", saved_meta.get(k), v) for k, v in as_json(meta or {}).items()
              if k not in ("step", "train_config", "trainable_parameters")]
    current = architecture(model)
    pairs += [(f"model {k}", saved_model.get(k), current.get(k)) for k in ARCHITECTURE
              if k in saved_model or k in current]
    for what, before, now in pairs:
        if before != now:
            raise ValueError(f"cannot resume {ckpt.parent.parent}: it was trained with {what} = {before!r}, "
                             f"now {now!r} (use the same settings, or a new --out)")
