"""Strict JSON (NaN and infinities become null, through one sanitiser, `clean`), JSONL, CSV and figure files;
bounded JSON and TOML reading; content hashes of files and of settings."""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path
from typing import IO, Any, Iterable

from ..errors import first_line, reading
from .files import PathLike, atomic_write, write_lines, write_text


def clean(obj: Any) -> Any:
    """`obj` as strict-JSON data: NaN/inf -> None, numpy/torch scalars -> numbers, tuples -> lists, keys -> str,
    torch dtypes -> their short name ("float32"), devices and paths -> str."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.dtype):
        return str(obj).removeprefix("torch.")
    if isinstance(obj, os.PathLike) or (torch is not None and isinstance(obj, torch.device)):
        return str(obj)
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def to_json(obj: Any, indent: int | None = 2, sort_keys: bool = False) -> str:
    """Strict JSON text of `clean(obj)`; anything else JSON cannot hold is written as its `str`."""
    seps = None if indent else (",", ":")
    return json.dumps(clean(obj), indent=indent, sort_keys=sort_keys, default=str, allow_nan=False, separators=seps)


def write_json(path: PathLike, obj: Any, sort_keys: bool = False) -> Path:
    """Write `obj` as indented strict JSON (NaN as null), atomically."""
    return write_text(path, to_json(obj, sort_keys=sort_keys) + "\n")


def write_jsonl(path: PathLike, rows: Iterable[dict[str, Any]] | Any, double_precision: int = 10) -> Path:
    """Write rows (dicts, or a DataFrame's records) as JSON lines, atomically; `pandas.read_json(lines=True)` reads it.

    A DataFrame is written by pandas (`double_precision` digits, NaN as null); dicts through `clean`.
    """
    if hasattr(rows, "to_json"):
        return atomic_write(path, lambda f: dump_frame(f, rows, double_precision))
    return write_lines(path, (to_json(r, indent=None) for r in rows))


def dump_frame(f: IO, table: Any, double_precision: int = 10) -> None:
    """A DataFrame's rows as JSON lines into the open file `f`, as `write_jsonl` writes them: called once per chunk,
    it streams one file from many tables."""
    if len(table):  # pandas ends every line, the last included, with a newline
        table.to_json(f, orient="records", lines=True, double_precision=double_precision)


def write_csv(path: PathLike, table: Any) -> Path:
    """Write a DataFrame as CSV (no index), atomically."""
    return write_text(path, table.to_csv(index=False))


def save_figure(fig: Any, path: PathLike) -> Path:
    """Write a plotly figure as JSON (`aspan report` reads `RUN_DIR/figures/*.json`), atomically."""
    return write_text(path, fig.to_json())


MAX_INT_DIGITS = 4300  # Python's own limit for converting text to int (sys.get_int_max_str_digits)


def _json_int(text: str) -> int:
    """An integer of a JSON document: refused, with its size, past Python's digit limit (instead of "Exceeds the
    limit (4300 digits)" with no file or key)."""
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"holds an integer of {len(text.lstrip('-')):,} digits (at most {MAX_INT_DIGITS:,})")
    return int(text)


def parse_json(text: str | bytes) -> Any:
    """`json.loads` with integers bounded (`_json_int`); a document nested too deeply raises RecursionError."""
    return json.loads(text, parse_int=_json_int)


def read_json(path: PathLike, what: str = "JSON file") -> Any:
    """The JSON document at `path`; anything wrong with it (not UTF-8, invalid, nested too deeply, an integer of
    thousands of digits) is one UsageError line naming the file (`aspan.errors.reading`)."""
    path = Path(path)
    with reading(path, what):
        return parse_json(path.read_bytes().decode("utf-8"))


def read_toml(path: PathLike, what: str = "config") -> dict[str, Any]:
    """Parse a TOML file; FileNotFoundError or ValueError naming the file."""
    import tomllib

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); TOML files "
                         "are UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:
        raise ValueError(f"{path}: invalid TOML: a value is nested too deeply to read") from None
    except ValueError as e:  # e.g. an integer of thousands of digits ("Exceeds the limit (4300 digits)")
        raise ValueError(f"{path}: invalid TOML: {first_line(e)}") from None


def _file_digest(path: Path) -> "hashlib._Hash":
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest


def sha256_of(path: PathLike) -> str:
    """The sha256 of a file's content, or of a directory's: every file below it (hidden ones, e.g. temporary files,
    left out) by relative path and content, in sorted order. FileNotFoundError when `path` is absent."""
    path = Path(path)
    if path.is_file():
        return _file_digest(path).hexdigest()
    if not path.is_dir():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    total = hashlib.sha256()
    for file in sorted(path.rglob("*")):
        relative = file.relative_to(path)
        if file.is_file() and not any(part.startswith(".") for part in relative.parts):
            total.update(relative.as_posix().encode() + b"\0" + _file_digest(file).digest())
    return total.hexdigest()


def settings_key(settings: dict[str, Any]) -> str:
    """Stable 16-hex-digit key of a settings dict (canonical JSON, independent of key order and hash seed)."""
    blob = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
