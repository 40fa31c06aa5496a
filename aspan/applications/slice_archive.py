"""The state archive of a GPU slice (`aspan.applications.campaign`): what a slice changed in the campaign directory,
packed on the machine that ran it (`pack`) and applied to the campaign here (`merge_slice`).

A slice comes back from a machine the user may not control, so a merge trusts nothing in it, and everything it names
is checked before anything is written:

- its record (`run.json`): a JSON object of at most `MAX_LIST_BYTES`, `started` a UTC time stamp, `parts` exactly
  `state.tar.gz`, or `state.tar.gz.part00`, `.part01`, ..., each a regular file (not a link) in the slice directory
  of at most `PART_BYTES`, at most `MAX_PARTS` of them;
- the archive: gzip that inflates to at most `MAX_INFLATION` times its size (at least `MIN_INFLATED` bytes); only
  regular files, each once, under relative names without `.`, `..`, `.git`, control characters or lock files; the
  list of removed files and the base (below) each at most `MAX_LIST_BYTES`, of the right types;
- where it goes: no name passes through a symbolic link or under a file of the campaign, and no file replaces a
  directory or a link.

A slice records the state it started from (`BASE` in the archive: the sha256 each file it changed or removed had when
it started, null for a file it created). A merge applies a slice only where the campaign still holds that state (or
already holds the slice's result): a slice older than the campaign, merged after a newer one, would take a run back
in time, and is refused, naming the run.

Then the merge is one step: the campaign is copied beside itself (hard links: no space, and the campaign's own files
are never written), the archive applied to the copy, and the copy swapped in (one atomic exchange, `renameat2`, on
Linux; elsewhere two renames, undone when the second fails). On any failure the campaign is as it was. A slice and a
merge each hold the campaign's lock (`campaign_lock`), and a merge also holds the lock of every run directory in the
campaign, so it never replaces a directory that a live job writes.
"""
from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, Iterator

from ..errors import UsageError, reading
from ..io import LOCK, atomic_write, hold, parse_json, remove_stale_temps, temp_dir_beside

STATE = "state.tar.gz"
REMOVED = ".campaign-removed.json"  # inside the archive: the files the slice deleted
BASE = ".campaign-base.json"  # inside the archive: each changed or removed file's sha256 when the slice started
SKIP_PACK = ("report.html",)  # never shipped back: reports `aspan report` rebuilds (and lock files, `is_lock`)
PART_BYTES = 15 * 2**20  # the largest part of state.tar.gz
MAX_PARTS = 64  # the most parts a slice may return
MAX_INFLATION = 100  # the archive inflates to at most this many times its size ...
MIN_INFLATED = 64 * 2**20  # ... or this many bytes, whichever is more
MAX_LIST_BYTES = 16 * 2**20  # run.json, the removed list and the base, each
STARTED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")  # run.json's `started`, as `time.strftime` writes it
PLAIN = (tarfile.REGTYPE, tarfile.AREGTYPE)  # the only archive members a merge writes: regular files
STEP = re.compile(r"step-(\d{1,12})")  # a training's `checkpoints/latest`


def is_lock(name: str) -> bool:
    """Whether file name `name` is a lock (`.aspan.lock`, `.aspan.shard-I-of-N.lock`, a campaign's lock)."""
    return name.startswith(".") and name.endswith(".lock") and (name.startswith(".aspan") or "campaign" in name)


def campaign_lock(campaign: Path, command: str) -> contextlib.AbstractContextManager:
    """The lock a slice and a merge hold on `campaign`: a file beside it (a merge replaces the directory itself), so
    a second slice or merge fails at once, naming the first."""
    campaign = Path(campaign).absolute()
    campaign.parent.mkdir(parents=True, exist_ok=True)
    return hold(campaign.parent / f".{campaign.name}.campaign.lock", command, directory=campaign)


# ----------------------------------------------------------------------------------------------- packing
def snapshot(directory: Path) -> dict[str, str]:
    """sha256 of every regular file under `directory` (not through a link), by path relative to it."""
    out = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[p.relative_to(directory).as_posix()] = _sha256(p)
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


def latest_steps(campaign: Path) -> dict[str, int]:
    """The step of every training's latest checkpoint in `campaign`, by the training's directory."""
    out = {}
    for p in sorted(campaign.glob("**/checkpoints/latest")):
        m = STEP.fullmatch(p.read_text(errors="replace").strip()) if p.is_file() and not p.is_symlink() else None
        if m:
            out[p.parent.parent.relative_to(campaign).as_posix()] = int(m[1])
    return out


def pack(campaign: Path, before: dict[str, str], out: Path) -> list[str]:
    """`out/state.tar.gz` (or `.partNN` pieces of at most `PART_BYTES`): every file of `campaign` that is new or
    changed since `before` (a `snapshot`), the list of removed ones and the base they changed from. Returns the names
    written."""
    after = snapshot(campaign)
    shipped = [p for p in after if Path(p).name not in SKIP_PACK and not is_lock(Path(p).name)]
    changed = [p for p in shipped if before.get(p) != after[p]]
    removed = sorted(p for p in set(before) - set(after) if not is_lock(Path(p).name))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in changed:
            tar.add(campaign / p, arcname=p, recursive=False)
        for name, value in ((REMOVED, removed), (BASE, {p: before.get(p) for p in (*changed, *removed)})):
            data = json.dumps(value, sort_keys=True).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    for stale in out.glob(f"{STATE}*"):  # an earlier slice's parts in the same directory
        if stale.is_file():
            stale.unlink()
    blob = buf.getvalue()
    names = [STATE] if len(blob) <= PART_BYTES else part_names(-(-len(blob) // PART_BYTES))
    for i, name in enumerate(names):
        write_bytes(out / name, blob[i * PART_BYTES: (i + 1) * PART_BYTES])
    return names


def part_names(n: int) -> list[str]:
    """The names of an archive in `n` parts."""
    return [f"{STATE}.part{i:02d}" for i in range(n)]


def write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    atomic_write(path, lambda f: f.write(data), binary=True)


# ----------------------------------------------------------------------------------------------- reading a slice
@dataclass
class Archive:
    """What a slice's archive holds, read and checked (nothing written yet)."""

    parts: list[Path]  # its parts, in order
    files: dict[str, str] = field(default_factory=dict)  # member name -> sha256 of its data
    removed: list[str] = field(default_factory=list)  # files the slice deleted
    base: dict[str, str | None] = field(default_factory=dict)  # name -> its sha256 when the slice started
    latest: dict[str, int] = field(default_factory=dict)  # training directory -> the slice's latest checkpoint step


def read_record(slice_dir: Path) -> dict[str, Any]:
    """The slice's `run.json`, checked (UsageError naming the file and key)."""
    return parse_record(slice_dir / "run.json", _read_plain(slice_dir / "run.json", MAX_LIST_BYTES, "slice record"))


def parse_record(path: Path, data: bytes) -> dict[str, Any]:
    """The slice record `data` (read from `path`), checked (UsageError naming the file and key)."""
    with reading(path, "slice record (run.json)"):
        record = parse_json(data.decode("utf-8"))
    if not isinstance(record, dict):
        raise UsageError(f"{path}: not a slice record (a JSON object), got {type(record).__name__}")
    started = record.get("started")
    if not isinstance(started, str) or not STARTED.fullmatch(started):
        raise UsageError(f"{path}: 'started' must be a UTC time as YYYY-MM-DDTHH:MM:SSZ, got {started!r}")
    parts = record.get("parts")
    if not isinstance(parts, list) or not 1 <= len(parts) <= MAX_PARTS or \
            parts not in ([STATE], part_names(len(parts))):
        raise UsageError(f"{path}: 'parts' must be [{STATE!r}] or {STATE}.part00, .part01, ... (at most {MAX_PARTS}), "
                         f"got {_short(parts)}")
    runs = record.get("runs", [])
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise UsageError(f"{path}: 'runs' must be a list of objects, got {_short(runs)}")
    return record


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _read_plain(path: Path, limit: int, what: str) -> bytes:
    """The bytes of regular file `path` (not a link), of at most `limit` bytes (UsageError naming it otherwise)."""
    _check_plain(path, limit, what)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UsageError(f"{path}: larger than a {what} may be ({limit} bytes)")
    return data


def _check_plain(path: Path, limit: int, what: str) -> int:
    """The size of regular file `path`; UsageError when it is a link, not a regular file or over `limit` bytes."""
    import stat

    st = os.lstat(path)  # FileNotFoundError names the path
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{path}: a {what} must be a regular file in the slice directory, not a link or special file")
    if st.st_size > limit:
        raise UsageError(f"{path}: larger than a {what} may be ({st.st_size} bytes; at most {limit})")
    return st.st_size


class _Parts(io.RawIOBase):
    """The parts' bytes in order, at most `limit` of them (the sizes measured when they were checked)."""

    def __init__(self, paths: list[Path], limit: int):
        self.paths, self.limit, self.count, self.file = list(paths), limit, 0, None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while True:
            if self.file is None:
                if not self.paths:
                    return 0
                self.file = open(self.paths.pop(0), "rb")
            n = self.file.readinto(buffer)
            self.count += n
            if self.count > self.limit:
                raise UsageError(f"the archive's parts grew while they were read (over {self.limit} bytes)")
            if n:
                return n
            self.file.close()
            self.file = None

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        super().close()


class _Capped(io.RawIOBase):
    """What `source` gives, refusing (UsageError) more than `limit` bytes: a small archive cannot inflate to fill the
    disk or the memory."""

    def __init__(self, source: IO[bytes], limit: int):
        self.source, self.limit, self.count = source, limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.source.readinto(buffer)
        self.count += n
        if self.count > self.limit:
            raise UsageError(f"the archive inflates to more than {self.limit} bytes ({MAX_INFLATION} times its size)")
        return n


@contextlib.contextmanager
def _members(archive: Archive) -> Iterator[Iterator[tuple[tarfile.TarInfo, IO[bytes] | None]]]:
    """The archive's members with their data, streamed (nothing seeks back; what is read is bounded)."""
    sizes = sum(p.stat().st_size for p in archive.parts)
    parts = _Parts(archive.parts, sizes)
    gz = gzip.GzipFile(fileobj=io.BufferedReader(parts), mode="rb")
    stream = io.BufferedReader(_Capped(gz, max(MIN_INFLATED, MAX_INFLATION * sizes)))
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            yield ((m, tar.extractfile(m) if m.type in PLAIN else None) for m in tar)
        while stream.read(2**20):  # to the end of the gzip stream: a truncated or padded one is refused
            pass
    finally:
        stream.close()
        parts.close()


def read_archive(slice_dir: Path, record: dict[str, Any]) -> Archive:
    """The slice's archive, read to its end and checked (UsageError naming the slice directory and what is wrong)."""
    archive = Archive([slice_dir / name for name in record["parts"]])
    for p in archive.parts:
        _check_plain(p, PART_BYTES, "part of the slice's archive")
    lists: dict[str, bytes] = {}
    with reading(slice_dir, "slice archive"), _members(archive) as members:
        for m, data in members:
            name = _member_name(m, archive, slice_dir)
            if name in (REMOVED, BASE):
                lists[name] = _read_list(data, m, slice_dir)
            else:
                archive.files[name], step = _digest(data, name)
                if step is not None:
                    archive.latest[name.removesuffix("/checkpoints/latest")] = step
    _read_lists(lists, archive, slice_dir)
    return archive


def _member_name(m: tarfile.TarInfo, archive: Archive, slice_dir: Path) -> str:
    if m.type not in PLAIN:
        raise UsageError(f"{slice_dir}: archive member {m.name!r} is not a plain file inside the campaign (a link, "
                         "directory or device)")
    name = check_name(m.name, f"{slice_dir}: archive member")
    if name in archive.files:
        raise UsageError(f"{slice_dir}: archive member {name!r} appears twice")
    return name


def check_name(name: Any, what: str) -> str:
    """`name` when it is a relative file name inside the campaign: text, no `/` at either end, no empty, `.`, `..`
    or `.git` part, no control character, not a lock file (UsageError starting with `what` otherwise)."""
    if not isinstance(name, str):
        raise UsageError(f"{what} {_short(name)} is not a file name")
    parts = name.split("/")
    if (not name.isprintable() or len(name) > 4096 or any(p in ("", ".", "..", ".git") for p in parts)
            or any(len(p.encode("utf-8", "replace")) > 255 for p in parts) or is_lock(parts[-1])):
        raise UsageError(f"{what} {_short(name)} is not a plain file inside the campaign")
    return name


def _read_list(data: IO[bytes] | None, m: tarfile.TarInfo, slice_dir: Path) -> bytes:
    if m.size > MAX_LIST_BYTES:
        raise UsageError(f"{slice_dir}: archive member {m.name} is {m.size} bytes (at most {MAX_LIST_BYTES})")
    return data.read() if data is not None else b""


def _digest(data: IO[bytes] | None, name: str) -> tuple[str, int | None]:
    """(sha256 of a member's data, the step it names when it is a training's `checkpoints/latest`)."""
    digest, head = hashlib.sha256(), b""
    while data is not None and (chunk := data.read(2**20)):
        digest.update(chunk)
        head = head or chunk[:64]
    m = STEP.fullmatch(head.decode("utf-8", "replace").strip()) if name.endswith("/checkpoints/latest") else None
    return digest.hexdigest(), int(m[1]) if m else None


def _read_lists(lists: dict[str, bytes], archive: Archive, slice_dir: Path) -> None:
    """The removed list and the base, parsed and checked against the members."""
    for name in (REMOVED, BASE):
        if name not in lists:
            raise UsageError(f"{slice_dir}: the archive has no {name} (a slice of an older aspan, or not a slice)")
    with reading(slice_dir / REMOVED, "list of removed files"):
        removed = parse_json(lists[REMOVED].decode("utf-8"))
    with reading(slice_dir / BASE, "slice base"):
        base = parse_json(lists[BASE].decode("utf-8"))
    if not isinstance(removed, list):
        raise UsageError(f"{slice_dir}: {REMOVED} must be a list of file names, got {_short(removed)}")
    archive.removed = sorted({check_name(p, f"{slice_dir}: removed file") for p in removed})
    clash = set(archive.removed) & set(archive.files)
    if clash:
        raise UsageError(f"{slice_dir}: {min(clash)!r} is both written and removed by the slice")
    hexdigest = re.compile(r"[0-9a-f]{64}")
    if not isinstance(base, dict) or not all(v is None or (isinstance(v, str) and hexdigest.fullmatch(v))
                                             for v in base.values()):
        raise UsageError(f"{slice_dir}: {BASE} must map file names to sha256 digests or null, got {_short(base)}")
    if set(base) != {*archive.files, *archive.removed}:
        odd = sorted(set(base) ^ {*archive.files, *archive.removed})[0]
        raise UsageError(f"{slice_dir}: {BASE} does not match the archive (about {odd!r})")
    archive.base = base
    _check_nesting(archive, slice_dir)


def _check_nesting(archive: Archive, slice_dir: Path) -> None:
    """No member lies under another member's name (a file cannot also be a directory)."""
    for name in archive.files:
        parts = name.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in archive.files:
                raise UsageError(f"{slice_dir}: archive member {name!r} lies under the file {'/'.join(parts[:i])!r}")


# ----------------------------------------------------------------------------------------------- checking the campaign
def check_targets(campaign: Path, archive: Archive, slice_dir: Path) -> None:
    """UsageError when a name of the slice passes through a link or a file of `campaign` (a file the slice removes
    may become a directory), a member would replace a directory or a link, or a removed name is not a regular file."""
    import stat

    removed = set(archive.removed)
    for name in (*archive.files, *archive.removed):
        parts = name.split("/")
        for i in range(1, len(parts)):
            here = campaign.joinpath(*parts[:i])
            mode = _lmode(here)
            if mode is None:
                break
            if stat.S_ISLNK(mode) or not (stat.S_ISDIR(mode) or "/".join(parts[:i]) in removed):
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "a file"
                raise UsageError(f"{slice_dir}: {name!r} would be written or removed through {here}, which is {kind}")
        mode = _lmode(campaign / name)
        if mode is not None and not stat.S_ISREG(mode):
            raise UsageError(f"{slice_dir}: {name!r} is not a regular file in the campaign ({campaign / name} is a "
                             f"{'symbolic link' if stat.S_ISLNK(mode) else 'directory or special file'})")


def _lmode(path: Path) -> int | None:
    try:
        return os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None


def check_base(campaign: Path, archive: Archive, slice_dir: Path) -> None:
    """UsageError naming the run when the campaign no longer holds the state the slice started from (nor its result)
    for a file it changed or removed: the slice is older than the campaign."""
    stale = [name for name in sorted({*archive.files, *archive.removed})
             if _current(campaign / name) not in (archive.base[name], archive.files.get(name))]
    if not stale:
        return
    run = stale[0].split("/")[0]
    steps = {t: s for t, s in archive.latest.items() if t.split("/")[0] == run}
    here = {t: s for t, s in latest_steps(campaign).items() if t in steps}
    back = [t for t in steps if here.get(t, -1) > steps[t]]
    what = (f"its latest checkpoint in {back[0]} would go from step {here[back[0]]} back to {steps[back[0]]}" if back
            else f"{stale[0]} changed here since the slice started")
    raise UsageError(f"{slice_dir}: the slice is older than the campaign: run {run} would go back in time ({what}); "
                     "merge slices in the order they ran, and run a new slice instead of this one")


def _current(path: Path) -> str | None:
    return _sha256(path) if path.is_file() and not path.is_symlink() else None


def hold_run_dirs(campaign: Path, held: contextlib.ExitStack, command: str) -> None:
    """Hold the lock of every run directory of `campaign` (its directories) and every lock file in them: a live job
    there makes the merge fail at once, naming it, and no job starts in them until the merge is done."""
    if not campaign.is_dir():
        return
    for run in sorted(p for p in campaign.iterdir() if p.is_dir() and not p.is_symlink()):
        locks = {run / LOCK, *(p for p in run.rglob(".aspan*.lock") if p.is_file() and not p.is_symlink())}
        for lock in sorted(locks):
            held.enter_context(hold(lock, command, directory=lock.parent))


# ----------------------------------------------------------------------------------------------- applying it
def stage(campaign: Path, archive: Archive) -> Path:
    """A copy of `campaign` beside it (hard links; lock files left out) with the archive applied: the removed files
    deleted, the members written as new files. Removed again on any failure."""
    remove_stale_temps(campaign.parent, campaign.name)
    staged = temp_dir_beside(campaign)
    try:
        if campaign.is_dir():
            shutil.copytree(campaign, staged, symlinks=True, copy_function=_link_or_copy, dirs_exist_ok=True,
                            ignore=lambda _, names: [n for n in names if is_lock(n)])
        for name in archive.removed:
            (staged / name).unlink(missing_ok=True)
        with _members(archive) as members:
            for m, data in members:
                if m.name not in (REMOVED, BASE):
                    _write_member(staged, m, data)
        return staged
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link (no space; the file is never written here, only replaced), or a copy where links are refused."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def _write_member(root: Path, m: tarfile.TarInfo, data: BinaryIO | None) -> None:
    """Write member `m` as a new file under `root`: its directories created (never through a link), a hard-linked
    old file replaced, not written."""
    target = root / m.name
    here = root
    for part in m.name.split("/")[:-1]:
        here = here / part
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            raise UsageError(f"{here} is not a directory (it changed while the merge ran)")
        here.mkdir(exist_ok=True)
    if target.is_symlink() or target.exists():
        target.unlink()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    with os.fdopen(fd, "wb") as f:
        if data is not None:
            shutil.copyfileobj(data, f, 2**20)
        f.flush()
        os.fsync(f.fileno())
    if 0 <= m.mtime < 2**40:
        os.utime(target, (m.mtime, m.mtime))


def swap_in(staged: Path, campaign: Path) -> Path | None:
    """Put `staged` in the place of `campaign` in one step; the path now holding the campaign as it was (None when
    there was none), for the caller to remove."""
    if not campaign.exists():
        os.rename(staged, campaign)
        return None
    if _exchange(staged, campaign):
        return staged
    old = temp_dir_beside(campaign)
    old.rmdir()
    os.rename(campaign, old)
    try:
        os.rename(staged, campaign)
    except BaseException:
        os.rename(old, campaign)
        raise
    return old


def _exchange(a: Path, b: Path) -> bool:
    """Swap paths `a` and `b` in one step (Linux's `renameat2` with RENAME_EXCHANGE); False where this system cannot,
    so the caller renames twice."""
    if sys.platform != "linux":
        return False
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_cwd, rename_exchange = -100, 2
    if renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def merge_slice(slice_dir: str | Path, campaign: str | Path, slices: str | Path | None = None) -> dict[str, Any]:
    """Apply a slice's archive to `campaign`, all or nothing, and return its run.json record (also written to
    `slices/slice-<started>.json` when `slices` is given). Everything is checked first: UsageError in one line,
    naming the slice and what is wrong, and nothing written."""
    slice_dir, campaign = Path(slice_dir), Path(campaign).resolve()
    if campaign.exists() and not campaign.is_dir():
        raise UsageError(f"campaign directory {campaign} is a file; give a directory path")
    raw = _read_plain(slice_dir / "run.json", MAX_LIST_BYTES, "slice record")
    record = parse_record(slice_dir / "run.json", raw)
    archive = read_archive(slice_dir, record)
    command = f"aspan gpu merge {slice_dir}"
    with campaign_lock(campaign, command), contextlib.ExitStack() as held:
        check_targets(campaign, archive, slice_dir)
        check_base(campaign, archive, slice_dir)
        hold_run_dirs(campaign, held, command)
        apply(campaign, archive)
        if slices is not None:
            keep_record(raw, record, Path(slices))
    return record


def apply(campaign: Path, archive: Archive) -> None:
    """The checked archive applied to `campaign` in one step (`stage`, then `swap_in`); nothing left beside."""
    staged = stage(campaign, archive)
    try:
        old = swap_in(staged, campaign)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def keep_record(raw: bytes, record: dict[str, Any], slices: Path) -> Path:
    """Write a merged slice's record (its bytes `raw`) to `slices/slice-<started>.json`; the path."""
    path = slices / ("slice-" + record["started"].replace(":", "") + ".json")
    write_bytes(path, raw)
    return path
