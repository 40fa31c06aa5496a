"""Atomic files: a write goes to a temporary file beside its target (named after its writer, so a stale one can be
told apart and removed) and is renamed over it; a directory is built whole and renamed into place. Character devices
and FIFOs are written in place, and nothing is written through a symbolic link."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

from .. import stopping

PathLike = str | os.PathLike
HOST = socket.gethostname()


def _umask() -> int:
    """The process umask, never changed (Python < 3.13 has no getter, and setting and restoring it would open a window
    in which the host's other threads create files with a wrong mode): from /proc on Linux, else from the mode of a
    directory made with mode 0777 in a private temporary directory."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with tempfile.TemporaryDirectory(prefix="aspan-umask-") as tmp:
        probe = os.path.join(tmp, "probe")
        os.mkdir(probe, 0o777)
        return 0o777 & ~os.stat(probe).st_mode


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


def temp_dir_beside(path: PathLike) -> Path:
    """A new empty directory beside `path`, with the mode new directories get, named after its writer like the
    temporary files (`remove_stale_temps(parent, name)` removes it once its writer is dead)."""
    import secrets

    path = Path(path)
    while True:
        tmp = path.parent / f"{_temp_prefix(path.name)}{secrets.token_hex(4)}.tmp"
        try:
            os.mkdir(tmp, 0o777)
            return tmp
        except FileExistsError:
            continue


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
