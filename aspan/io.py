"""The run-directory writer: every file aspan writes goes through here (it imports nothing from aspan).

A write goes to a unique temporary file beside its target and is renamed over it, so a reader (or a parallel
shard) never sees half a file and an exception leaves nothing behind. JSON is strict (NaN/inf become null) and
made by one sanitiser, `clean`. Resumable results are JSONL rows keyed by a stable hash of their settings.
Character devices and FIFOs are written in place (renaming over them would destroy the node); nothing is
appended, truncated or replaced through a symbolic link (the run directory could otherwise write anywhere).

    run = RunDir("runs/demo")
    run.write_json("run.json", {"command": "aspan demo", **run_environment(model)})  # aspan.environment
    run.write_csv("sweep.csv", table)
    run.figure(fig, "01_rollout")          # -> runs/demo/figures/01_rollout.json (`aspan report` reads it)
    writer = RowWriter(run.path / "sweep.jsonl")   # resumable rows: a killed run continues where it stopped
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

from . import stopping
from .errors import first_line, reading

PathLike = str | os.PathLike


# ----------------------------------------------------------------------------------------------- atomic writes
HOST = socket.gethostname()


def _umask() -> int:
    """The process umask: from /proc on Linux (no window in which other threads see a changed umask), else read
    by setting and restoring it (Python < 3.13 has no getter)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temp_prefix(name: str) -> str:
    """`.NAME.HOST.PID.`: a temporary file names its writer, so a later write can tell a stale one (its writer died,
    e.g. SIGKILL, which no handler sees) from one being written now, and remove it."""
    return f".{name}.{HOST.replace('.', '_')}.{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    if pid <= 0:  # os.kill(0, ...) would signal our own process group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temps(directory: PathLike, name: str = "*", recursive: bool = False) -> list[Path]:
    """Remove the temporary files (and directories) that writers on this host left beside `name` in `directory`
    (and below it, with `recursive`) when they died without cleaning up; those of running writers and of other
    hosts are kept. Returns the removed."""
    removed = []
    found = Path(directory).rglob(f".{name}.*.tmp") if recursive else Path(directory).glob(f".{name}.*.tmp")
    for p in sorted(found):
        parts = p.name.split(".")  # ['', NAME..., HOST, PID, RANDOM, 'tmp'] (mkstemp's RANDOM has no dots)
        if len(parts) < 6 or parts[-4] != HOST.replace(".", "_") or not parts[-3].isdigit():
            continue
        if _pid_alive(int(parts[-3])):
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists():
            p.unlink()
        removed.append(p)
    return removed


def _straight_target(path: Path) -> bool:
    """Whether `path` is written in place rather than replaced: a character device (`/dev/null`, `/dev/full`) or a
    FIFO, whose reader expects the bytes; renaming a file over it would destroy the node and send nothing. A symbolic
    link to anything else is refused (ValueError naming it): a run directory is never written through a link."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    if mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        return True
    refuse_link(path)
    return False


def refuse_link(path: Path) -> None:
    """ValueError naming `path` when it is a symbolic link: a run-directory file is never written, and its results
    never read, through one (it could point anywhere)."""
    if path.is_symlink():
        raise ValueError(f"{path} is a symbolic link (to {os.readlink(path)}): refusing to use it; remove it or use "
                         "another run directory")


def _naming(error: OSError, path: Path, tmp: Path | None = None) -> OSError:
    """`error` with `path` as its file name when it names none (a full disk says which file it could not write) or
    names `tmp`, the temporary file or directory written in `path`'s place (a file inside `tmp`: the same file
    inside `path`)."""
    name = None if error.filename is None else Path(os.fsdecode(error.filename))
    if error.errno is None or (name is not None and (tmp is None or not name.is_relative_to(tmp))):
        return error
    target = path if name is None else path / name.relative_to(tmp)
    return type(error)(error.errno, error.strerror or str(error), str(target))


def atomic_write(path: PathLike, write: Callable[[IO], None], binary: bool = False) -> Path:
    """Call `write(file)` on a temporary file beside `path`, fsync, then rename it over `path`.

    On any exception (KeyboardInterrupt, and SIGTERM under the CLI, included) the temporary file is removed and
    `path` is left untouched; temporary files a killed writer left beside `path` are removed first. The file gets
    the mode any new file gets (0666 minus the umask), not mkstemp's private 0600. A character device or a FIFO is
    written in place instead; a symbolic link is refused. An OSError (a full disk) names `path`.
    """
    path = Path(path)
    mode, encoding = ("wb", {}) if binary else ("w", {"encoding": "utf-8"})
    if _straight_target(path):
        try:
            with open(path, mode, **encoding) as f:
                write(f)
        except OSError as e:
            raise _naming(e, path) from None
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent, path.name)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path.name), suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, mode, **encoding) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise _naming(e, path) from None
        raise
    return path


def write_text(path: PathLike, text: str) -> Path:
    """Write `text` atomically."""
    return atomic_write(path, lambda f: f.write(text))


def write_lines(path: PathLike, lines: Iterable[str]) -> Path:
    """Write each of `lines` followed by a newline, atomically (streams: the lines need not fit in memory)."""

    def write(f: IO) -> None:
        for line in lines:
            f.write(line + "\n")
            stopping.check()  # a safe point: a stop signal removes the temporary file

    return atomic_write(path, write)


def _follow_umask(root: Path) -> None:
    """Give `root` and everything in it the modes new files get (0666/0777 minus the umask): mkdtemp makes 0700
    and some writers (safetensors) 0600, which would otherwise become the checkpoint's private modes."""
    mask = _umask()
    os.chmod(root, 0o777 & ~mask)
    for base, dirs, files in os.walk(root):
        for d in dirs:
            os.chmod(os.path.join(base, d), 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(base, name), 0o666 & ~mask)


@contextlib.contextmanager
def atomic_dir(directory: PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside `directory`; on success its files are moved into `directory`.

    A new `directory` appears whole (one rename); an existing one gets each file replaced, `config.json` last
    (it marks a complete checkpoint). On an exception the temporary directory is removed.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(directory.parent, directory.name)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(directory.name), suffix=".tmp", dir=directory.parent))
    try:
        yield tmp
        _follow_umask(tmp)
        if not directory.exists():
            os.replace(tmp, directory)
            return
        for name in sorted(os.listdir(tmp), key=lambda n: n == "config.json"):
            target = directory / name
            if (tmp / name).is_dir():
                shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp / name, target)
    except OSError as e:
        raise _naming(e, directory, tmp) from None
    except Exception as e:
        inside = _os_error_inside(e)
        if inside is None:
            raise
        raise _naming(inside, directory) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _os_error_inside(error: Exception) -> OSError | None:
    """The operating-system error a writer that is not Python's reports in its message (safetensors'
    `SafetensorError: ... I/O error: No space left on device (os error 28)`), as an OSError; None for others."""
    m = re.search(r"\(os error (\d+)\)", str(error))
    return OSError(int(m[1]), os.strerror(int(m[1]))) if m else None


# ----------------------------------------------------------------------------------------------- JSON
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


# ----------------------------------------------------------------------------------------------- resumable rows
def settings_key(settings: dict[str, Any]) -> str:
    """Stable 16-hex-digit key of a settings dict (canonical JSON, independent of key order and hash seed)."""
    blob = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def read_rows(path: PathLike, fields: Iterable[str] = (), what: str = "") -> list[dict[str, Any]]:
    """Rows of a JSONL file, the first of each `key` kept; a torn last line is skipped, a corrupt middle one is an
    error. With `fields`, every row must be a JSON object holding them: otherwise a ValueError naming the file and
    line, "not a `what` row". A symbolic link is refused (`refuse_link`): results are never read from elsewhere."""
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
        if fields and (problem := _row_problem(row, fields)):
            raise ValueError(f"{path} line {i + 1}: not a {what or 'result'} row ({problem})")
        key = row.get("key") if isinstance(row, dict) else None
        if key is not None and key in seen:
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


def union_rows(paths: Iterable[PathLike], fields: Iterable[str] = (), what: str = "") -> list[dict[str, Any]]:
    """Rows of several JSONL files (e.g. shards), deduplicated by key, in file order (`fields`, `what`: as
    `read_rows`)."""
    rows, seen = [], set()
    fields = tuple(fields)
    for p in paths:
        for r in read_rows(p, fields, what):
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


# ----------------------------------------------------------------------------------------------- run directories
class RunDir:
    """A run directory: `run.json`, `summary.json`, tables (CSV), records (JSONL), `figures/*.json`, `views/`."""

    def __init__(self, path: PathLike):
        self.path = Path(path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def write_text(self, name: str, text: str) -> Path:
        """Write `text` to `name` in the run directory, atomically; the path."""
        return write_text(self.path / name, text)

    def write_json(self, name: str, obj: Any) -> Path:
        """Write `obj` as strict JSON to `name` in the run directory, atomically; the path."""
        return write_json(self.path / name, obj)

    def write_csv(self, name: str, table: Any) -> Path:
        """Write `table` (a DataFrame or rows) as CSV to `name` in the run directory, atomically; the path."""
        return write_csv(self.path / name, table)

    def records(self, name: str, rows: Iterable[dict[str, Any]] | Any, double_precision: int = 10) -> Path:
        """Write `rows` as JSON lines to `name` in the run directory, atomically; the path."""
        return write_jsonl(self.path / name, rows, double_precision)

    def figure(self, fig: Any, name: str) -> Path:
        """Save a plotly figure as `figures/NAME.json`."""
        return save_figure(fig, self.path / "figures" / f"{name}.json")

    def remove(self, name: str) -> None:
        """Remove a file a previous run into this directory left (a rerun must not leave stale outputs)."""
        (self.path / name).unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------- one job, one config
LOCK = ".aspan.lock"  # names the job that holds the run directory (host, pid, command, start time)
SETTINGS = ".aspan-settings.json"  # the configuration the run directory's results belong to


def _read_holder(lock: Path) -> dict[str, Any]:
    try:
        holder = parse_json(lock.read_text())
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}


def _busy(directory: Path, lock: Path, holder: dict[str, Any]) -> ValueError:
    who = (f"{holder.get('command', '?')!r} (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
           f"started {holder.get('started', '?')})")
    return ValueError(f"run directory {directory} is in use by {who}: wait for it, or use another --out "
                      f"(if that job is gone, remove {lock})")


def _holder_pid(lock: Path, holder: dict[str, Any]) -> int:
    """The pid a lock file names; ValueError naming the file when it is not a number."""
    pid = holder.get("pid", 0)
    try:
        return int(pid or 0)
    except (TypeError, ValueError):
        raise ValueError(f"{lock}: pid {pid!r} is not a process id; remove it if no job uses its directory") from None


def _acquire(directory: Path, lock: Path, command: str) -> int:
    """Hold `lock`: an exclusive `flock` on it (the kernel drops it when its holder dies, so a crashed job's lock is
    taken over) plus the holder's description in it, for the message a second job gets. Returns the open fd.

    A free flock decides: the pid written in the file may since belong to an unrelated process. Only where the file
    system has no flock (some network mounts) does the holder's pid decide, and a lock file naming another host
    is respected either way (its job cannot be seen from here)."""
    import fcntl

    me = {"host": HOST, "pid": os.getpid(), "command": command, "started": _now()}
    while True:
        fd = _open_no_link(lock, os.O_RDWR | os.O_CREAT)
        flocked = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(directory, lock, _read_holder(lock)) from None
        except OSError:  # a file system without flock: the holder's pid decides below
            flocked = False
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:  # its holder removed it between our open and our flock: start over
            same = False
        if not same:
            os.close(fd)
            continue
        holder = _read_holder(lock)
        if holder and holder.get("host") != HOST:  # another host's job: its liveness cannot be checked from here
            os.close(fd)
            raise _busy(directory, lock, holder)
        if not flocked and holder:
            try:
                pid = _holder_pid(lock, holder)
            except ValueError:
                os.close(fd)
                raise
            if pid != os.getpid() and _pid_alive(pid):
                os.close(fd)
                raise _busy(directory, lock, holder)
        os.ftruncate(fd, 0)
        os.write(fd, (to_json(me, indent=None) + "\n").encode())
        os.fsync(fd)
        return fd


def _release(fd: int, lock: Path) -> None:
    try:
        if os.fstat(fd).st_ino == os.stat(lock).st_ino:
            lock.unlink()
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _first_difference(old: Any, new: Any, key: str = "") -> tuple[str, Any, Any] | None:
    """(dotted key, old value, new value) of the first place two JSON values differ, or None."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            diff = _first_difference(old.get(k), new.get(k), f"{key}.{k}" if key else str(k))
            if diff:
                return diff
        return None
    return None if old == new else (key or "settings", old, new)


def recorded_settings(directory: PathLike) -> Any:
    """The configuration recorded in run directory `directory` (`check_settings`), or None when none is;
    ValueError naming the file when it is unreadable."""
    file = Path(directory) / SETTINGS
    if not file.exists():
        return None
    try:
        return parse_json(file.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise ValueError(f"{file}: unreadable ({first_line(e)}); remove it if {directory} holds nothing you need") \
            from None


def check_settings(directory: PathLike, settings: dict[str, Any]) -> bool:
    """Record `settings` as the configuration of `directory`, or check it equals the recorded one; True when newly
    recorded. A different configuration is refused (ValueError naming the first difference): results of two
    configurations are never mixed in one run directory."""
    directory = Path(directory)
    file, new = directory / SETTINGS, json.loads(to_json(settings))
    old = recorded_settings(directory)
    if old is not None:
        diff = _first_difference(old, new)
        if diff:
            raise ValueError(f"run directory {directory} holds results of another configuration ({diff[0]} = "
                             f"{diff[1]!r} there, {diff[2]!r} now): use another --out, or remove {directory}")
        return False
    write_text(file, to_json(new) + "\n")
    return True


def run_lock(shard: tuple[int, int] | None = None) -> str:
    """The lock file of a job in a run directory: `LOCK`, or one per shard I of N (parallel shards write their own
    rows files, so each holds its own lock)."""
    return LOCK if shard is None else f".aspan.shard-{shard[0]}-of-{shard[1]}.lock"


def command_line() -> str:
    """This process's command line as `aspan ARGS`, shell-quoted (what a second job's refusal names)."""
    import shlex

    return " ".join(["aspan", *map(shlex.quote, sys.argv[1:])])


def claim_run(out: PathLike, settings: dict[str, Any] | None = None, *, shard: tuple[int, int] | None = None,
              command: str | None = None) -> contextlib.AbstractContextManager[RunDir]:
    """How every command holds the run directory it writes: `claim` of `out` with the lock of `shard` (`run_lock`)
    and the command line (default: this process's, `command_line`); with `settings`, for one configuration."""
    return claim(out, settings, command=command or command_line(), lock=run_lock(shard))


@contextlib.contextmanager
def claim(directory: PathLike, settings: dict[str, Any] | None = None, command: str | None = None,
          lock: str = LOCK) -> Iterator[RunDir]:
    """Hold run directory `directory` for one job (a second job fails at once, naming the holder) and, with
    `settings`, for one configuration (`check_settings`). On failure, nothing but results survives: a run that
    produced no file besides `run.json` leaves no run.json, no settings and (if it created it) no directory.

        with claim(out, settings={"config": ...}, command="aspan sweep c.toml") as run:
            run.write_json("run.json", ...)

    `lock` names the lock file: parallel shards writing different files each hold their own.
    """
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ValueError(f"run directory {path} is a file; give a directory path")
    new_dirs = [d for d in (path, *path.parents) if not d.exists()]  # removed again if the job leaves them empty
    path.mkdir(parents=True, exist_ok=True)
    before = set(os.listdir(path))
    fd = _acquire(path, path / lock, command or " ".join(["aspan", *sys.argv[1:]]))
    remove_stale_temps(path, recursive=True)  # what killed jobs (SIGKILL, a power cut) left anywhere in it
    try:
        if settings is not None:
            check_settings(path, settings)
        yield RunDir(path)
    except BaseException:
        new = set(os.listdir(path)) - before - {lock}
        if new <= {SETTINGS, "run.json"}:
            for name in new:
                (path / name).unlink(missing_ok=True)
        raise
    finally:
        _release(fd, path / lock)
        for d in new_dirs:
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
