"""Resumable JSONL results: one complete line per row (flush + fsync), keyed by a stable hash of its settings.

A run killed mid-write leaves at most one torn last line: readers skip it and writers cut it off before
appending, so a resumed run computes only the missing keys and never duplicates a row.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable


def settings_key(settings: dict[str, Any]) -> str:
    """Stable 16-hex-digit key of a settings dict (canonical JSON, independent of key order and hash seed)."""
    blob = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file, first occurrence of each `key` kept; a torn last line is skipped, a corrupt middle line is an error."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    rows, seen = [], set()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # torn last line (no newline yet): an interrupted write
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None
        key = row.get("key")
        if key is not None and key in seen:
            continue
        seen.add(key)
        rows.append(row)
    return rows


def _cut_torn_tail(path: Path) -> None:
    """Truncate an unterminated last line so the next append starts on a fresh line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    with open(path, "r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())


class RowWriter:
    """Appends rows to a JSONL file atomically enough for resumption: one write of one whole line, then fsync."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(self.path)
        self.keys = {r.get("key") for r in read_rows(self.path)}

    def write(self, row: dict[str, Any]) -> bool:
        """Append `row` unless its key is already in the file; True when written."""
        if row.get("key") in self.keys:
            return False
        line = json.dumps(clean(row), sort_keys=True, allow_nan=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.keys.add(row.get("key"))
        return True


def read_toml(path: str | Path, what: str = "config") -> dict[str, Any]:
    """Parse a TOML file; FileNotFoundError or ValueError naming the file."""
    import tomllib

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: invalid TOML: {e}") from None


def write_text(path: str | Path, text: str) -> Path:
    """Write text via a unique temp file beside `path` and rename, so readers (and parallel shards) never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, obj: Any) -> Path:
    """`write_text` of `obj` as indented JSON (NaN written as null)."""
    return write_text(path, json.dumps(clean(obj), indent=2, sort_keys=True, default=str))


def clean(obj: Any) -> Any:
    """`obj` with NaN/inf floats replaced by None (strict JSON), numpy/torch scalars as Python numbers, tuples as lists."""
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def union_rows(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Rows of several JSONL files (e.g. shards), deduplicated by key, in file order."""
    rows, seen = [], set()
    for p in paths:
        for r in read_rows(p):
            if r.get("key") not in seen:
                seen.add(r.get("key"))
                rows.append(r)
    return rows


def versions(*extra: str) -> dict[str, str]:
    """Versions of Python and of the packages a result depends on, `extra` distributions too (for run.json)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("aspan", "torch", "transformer-lens", "transformers", *extra):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "unknown"
    return out


def save_figure(fig, run_dir: str | Path, name: str) -> Path:
    """Write a plotly figure as `RUN_DIR/figures/NAME.json` (the run-dir layout the report reads)."""
    path = Path(run_dir) / "figures" / f"{name}.json"
    write_text(path, fig.to_json())
    return path
