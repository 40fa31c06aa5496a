"""Row stores: JSONL files of result rows that a resumed run appends to (each row on disk whole before the run goes
on), reads back checked, merges across shards and cuts back to the rows it keeps."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable

from .. import stopping
from .files import PathLike, _naming, refuse_link
from .formats import clean, parse_json, to_json


def read_rows(path: PathLike, fields: Iterable[str] = (), what: str = "", *,
              unique: bool = True) -> list[dict[str, Any]]:
    """Rows of a JSONL file, the first of each `key` kept (`unique=False`: every row, for files that record several
    rows under one key); a torn last line is skipped, a corrupt middle one is an
    error. With `fields` (or `unique=False`), every row must be a JSON object holding them: otherwise a ValueError
    naming the file and line, "not a `what` row". A symbolic link is refused (`refuse_link`): results are never read
    from elsewhere."""
    path = Path(path)
    refuse_link(path)
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    fields = tuple(fields)
    rows, seen = [], set()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = parse_json(line)
        except RecursionError:
            raise ValueError(f"{path}: line {i + 1} is nested too deeply to read") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            if i == len(lines) - 1:  # torn last line (no newline yet): an interrupted write
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None
        if (fields or not unique) and (problem := _row_problem(row, fields)):  # every row an object: keys read
            raise ValueError(f"{path} line {i + 1}: not a {what or 'result'} row ({problem})")
        key = row.get("key") if isinstance(row, dict) else None
        if unique and key is not None and key in seen:
            continue
        seen.add(key)
        rows.append(row)
    return rows


def _row_problem(row: Any, fields: tuple[str, ...]) -> str:
    """What keeps a parsed JSON line from being a row with `fields` ("" when nothing does)."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    missing = [f for f in fields if f not in row]
    return f"no {missing[0]!r}" if missing else ""


def union_rows(paths: Iterable[PathLike], fields: Iterable[str] = (), what: str = "", *,
               unique: bool = True) -> list[dict[str, Any]]:
    """Rows of several JSONL files (e.g. shards), deduplicated by key, in file order (`fields`, `what`: as
    `read_rows`; `unique=False`: every row of the first file holding a key, none of a later file's rows under it,
    and every row without a key)."""
    rows, seen = [], set()
    fields = tuple(fields)
    for p in paths:
        mine = read_rows(p, fields, what, unique=unique)
        if not unique:  # a file's rows under one key all kept; a later file's rows under a key seen left out
            rows += [r for r in mine if r.get("key") not in seen]
            seen |= {r.get("key") for r in mine} - {None}
            continue
        for r in mine:
            if r.get("key") not in seen:
                seen.add(r.get("key"))
                rows.append(r)
    return rows


def _open_no_link(path: Path, flags: int) -> int:
    """`os.open(path, flags | O_NOFOLLOW)`: a run-directory file is never appended to or truncated through a symbolic
    link (it could point anywhere); ValueError naming the file when it is one."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):
            refuse_link(path)
        raise


def _append(path: Path, data: bytes, sync: bool = True) -> None:
    """Append `data` with one O_APPEND write, then (with `sync`) fsync; no symbolic link followed."""
    fd = _open_no_link(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    except OSError as e:
        raise _naming(e, path) from None
    finally:
        os.close(fd)


def _cut_torn_tail(path: Path) -> None:
    """Truncate an unterminated last line so the next append starts on a fresh line."""
    if not os.path.lexists(path):
        return
    fd = _open_no_link(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
        if not data.endswith(b"\n"):
            os.ftruncate(fd, data.rfind(b"\n") + 1)
            os.fsync(fd)
    finally:
        os.close(fd)


class RowWriter:
    """Appends rows to a JSONL file, one whole line per write then fsync: a killed run loses at most a torn last
    line, which readers skip and the next writer cuts off, so a resumed run computes only the missing keys. A
    symbolic link in its place is refused (ValueError naming it) before any row is computed."""

    def __init__(self, path: PathLike, fields: Iterable[str] = (), what: str = ""):
        """`fields`, `what`: every row already in the file must hold these keys (`read_rows`)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(self.path)
        self.keys = {r.get("key") for r in read_rows(self.path, fields, what)}

    def write(self, row: dict[str, Any]) -> bool:
        """Append `row` unless its key is already in the file; True when written."""
        if row.get("key") in self.keys:
            return False
        _append(self.path, (json.dumps(clean(row), sort_keys=True, allow_nan=False, default=str) + "\n").encode())
        self.keys.add(row.get("key"))
        stopping.check()  # a safe point: the row is on disk, a resumed run starts after it
        return True


def append_line(path: PathLike, row: dict[str, Any]) -> None:
    """Append one JSON line with a single O_APPEND write, so a crash never leaves half a row (training logs)."""
    _append(Path(path), (to_json(row, indent=None) + "\n").encode(), sync=False)


def cut_rows(path: PathLike, keep: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Cut a JSONL file in place before its first row that `keep` rejects (and before a torn last line); returns
    the rows kept. Needs no free space (the file is truncated, not rewritten), so it works on a full disk too.
    ValueError names the file and line of an unreadable row in the middle."""
    path = Path(path)
    if not os.path.lexists(path):
        return []
    fd = _open_no_link(path, os.O_RDWR)
    try:
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
        rows, offset = _rows_to_keep(path, data, keep)
        if offset < len(data):
            os.ftruncate(fd, offset)
    finally:
        os.close(fd)
    return rows


def _rows_to_keep(path: Path, data: bytes, keep: Callable[[dict[str, Any]], bool]) -> tuple[list[dict], int]:
    """The leading rows of JSONL `data` that `keep` accepts, and the byte offset where the rest starts."""
    rows, offset = [], 0
    for number, line in enumerate(data.splitlines(keepends=True), 1):
        try:
            row = json.loads(line) if line.strip() else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            if not line.endswith(b"\n"):  # torn last line: an interrupted append
                break
            raise ValueError(f"{path}: line {number} is not valid JSON") from None
        if row is not None:
            if not isinstance(row, dict):
                raise ValueError(f"{path}: line {number} is not a JSON object")
            if not keep(row):
                break
            rows.append(row)
        offset += len(line)
    return rows, offset
