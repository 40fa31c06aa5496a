"""Checks made before any long work starts: devices and output paths (each failure a one-line `UsageError`)."""
from __future__ import annotations

import os
from pathlib import Path

from .errors import UsageError

DEVICES = "auto, cpu, cuda, cuda:N or mps"


def check_device(device: str | None, what: str = "device") -> str | None:
    """`device` unchanged when this machine can use it (None and "auto" always can); UsageError otherwise.

    Catches a misspelt device (`potato`) and a backend that is absent here (`cuda` without CUDA, `cuda:3` on a
    one-GPU machine) before a model is loaded, instead of a torch RuntimeError half-way through.
    """
    if device is None or device == "auto":
        return device
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise UsageError(f"{what} {device!r}: not a device (use {DEVICES})") from None
    if d.type == "cpu":
        return device
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"{what} {device!r}: CUDA is not available on this machine (use --device cpu)")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise UsageError(f"{what} {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return device
    if d.type == "mps":
        if not torch.backends.mps.is_available():
            raise UsageError(f"{what} {device!r}: MPS is not available on this machine (use --device cpu)")
        return device
    raise UsageError(f"{what} {device!r}: not supported (use {DEVICES})")


def _check_parent(path: Path, what: str) -> None:
    """The nearest existing ancestor of `path` must be a writable directory."""
    parent = path.parent
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"{what} {path}: {parent} is a file, not a directory")
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {path}: no permission to write in {parent}")


def _check_not_empty(path: str | os.PathLike, what: str) -> None:
    """An empty path (`--out ""`) would mean the current directory: refused, never guessed."""
    if not str(path).strip():
        raise UsageError(f"{what}: empty path; give a path")


def check_output_file(path: str | os.PathLike, what: str = "output file") -> Path:
    """`path` as a Path when a file can be written there: not empty, not a directory, inside a (creatable) writable
    directory."""
    _check_not_empty(path, what)
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory; give a file path")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{what} {path}: no permission to overwrite it")
    _check_parent(path, what)
    return path


def check_output_dir(path: str | os.PathLike, what: str = "run directory") -> Path:
    """`path` as a Path when it is (or can become) a writable directory: not empty, not an existing file."""
    _check_not_empty(path, what)
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{what} {path} is a file; give a directory path")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {path}: no permission to write in it")
    _check_parent(path, what)
    return path


def check_offsets(deltas, n_tokens: int, what: str = "delta") -> list[int]:
    """Key offsets as a non-empty list of ints that some sequence of `n_tokens` tokens can hold (|delta| < n_tokens).

    A reference shifted by `n_tokens` or more leaves every sequence: its scores would be all NaN or zero and its
    edits no-ops, so it is refused instead of being reported as a result.
    """
    deltas = [deltas] if isinstance(deltas, int) else list(deltas)
    if not deltas:
        raise UsageError(f"{what}: no offsets given (give at least one, e.g. 0)")
    for d in deltas:
        if isinstance(d, bool) or not isinstance(d, int):
            raise UsageError(f"{what}: offsets must be integers, got {d!r}")
        if abs(d) >= n_tokens:
            raise UsageError(f"{what}: offset {d} is outside every sequence (the longest has {n_tokens} tokens, "
                             f"so offsets must lie in {-(n_tokens - 1)}..{n_tokens - 1})")
    return deltas
