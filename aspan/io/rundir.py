"""A run directory: its files written by name (`RunDir`), and the claim one job holds on it for one configuration
(`claim_run`: a lock naming the job, and the settings its results belong to)."""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator

from ..errors import first_line
from .files import HOST, PathLike, _pid_alive, remove_stale_temps, write_text
from .formats import parse_json, save_figure, to_json, write_csv, write_json, write_jsonl
from .rows import _open_no_link


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


@contextlib.contextmanager
def hold(lock: PathLike, command: str, directory: PathLike | None = None) -> Iterator[Path]:
    """Hold lock file `lock` for `command` (what `claim` holds, without its run-directory bookkeeping): a second
    holder fails at once (ValueError naming the first, and `directory`, default the lock's, as what is in use); a dead
    holder's lock is taken over. The file is removed on release, unless another file has since taken its name."""
    lock = Path(lock)
    fd = _acquire(Path(directory) if directory is not None else lock.parent, lock, command)
    try:
        yield lock
    finally:
        _release(fd, lock)


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
