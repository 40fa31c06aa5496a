"""`aspan gpu merge` trusts nothing in a slice: hostile archives and records, built here, are refused in one line
(`UsageError`) before anything is written, and the campaign is byte for byte as it was; a valid slice merges exactly;
a slice older than the campaign is refused, naming the run that would go back in time; locks keep a merge off a
campaign a slice holds and off run directories that live jobs hold."""
from __future__ import annotations

import gzip
import io
import json
import os
import stat
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspan.applications import slice_archive as a
from aspan.cli import main
from aspan.errors import UsageError
from aspan.io import claim_run

STARTED = "2026-11-27T08:18:39Z"


# ----------------------------------------------------------------------------------------------- helpers
def tree(root: Path) -> dict[str, tuple]:
    """Everything under `root` (and `root`'s parent's other entries): kind, bytes or link target, mode, inode; two
    equal trees mean nothing was written, removed, replaced or left beside."""
    out = {}
    for base in (root.parent,):
        for dirpath, dirnames, filenames in os.walk(base):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                st_ = os.lstat(p)
                rel = p.relative_to(base).as_posix()
                if stat.S_ISLNK(st_.st_mode):
                    out[rel] = ("link", os.readlink(p))
                elif stat.S_ISDIR(st_.st_mode):
                    out[rel] = ("dir", st_.st_mode, st_.st_ino)
                else:
                    out[rel] = ("file", p.read_bytes(), st_.st_mode, st_.st_ino)
    return out


def campaign(root: Path) -> Path:
    """A small campaign: run `r1` with rows, a paused training at step 100 and a directory outside it linked in."""
    camp = root / "camp" / "state"
    ckpt = camp / "r1" / "scratch" / "t" / "checkpoints"
    ckpt.mkdir(parents=True)
    (ckpt / "latest").write_text("step-00000100")
    (camp / "r1" / "runs.jsonl").write_text('{"key": 1}\n')
    (camp / "r1" / "old.txt").write_text("old")
    (root / "outside").mkdir()
    (root / "outside" / "victim.txt").write_text("keep me")
    (camp / "r1" / "link").symlink_to(root / "outside")
    return camp


def advance(camp: Path, step: int, rows: int) -> None:
    """What a slice does to the campaign: more rows, a later checkpoint, a file removed."""
    (camp / "r1" / "runs.jsonl").write_text("".join(f'{{"key": {i}}}\n' for i in range(rows)))
    (camp / "r1" / "scratch" / "t" / "checkpoints" / "latest").write_text(f"step-{step:08d}")
    (camp / "r1" / "old.txt").unlink(missing_ok=True)
    (camp / "r2").mkdir(exist_ok=True)
    (camp / "r2" / "runs.jsonl").write_text('{"key": "x"}\n' * rows)


def slice_of(camp: Path, out: Path, step: int, rows: int, started: str = STARTED) -> dict:
    """Run a slice's file changes on `camp` (advance) and pack them into `out`, as `run_slice` does."""
    out.mkdir(parents=True, exist_ok=True)
    before = a.snapshot(camp)
    advance(camp, step, rows)
    record = {"kind": "gpu slice", "started": started, "parts": a.pack(camp, before, out), "runs": []}
    (out / "run.json").write_text(json.dumps(record, indent=1))
    return record


def copy_tree(src: Path, dst: Path) -> None:
    import shutil

    shutil.copytree(src, dst, symlinks=True)


def member(name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple:
    return (name, data, kind, link)


def archive(members: list[tuple], removed=(), base=None, extra: bytes = b"") -> bytes:
    """A gzip tar of `members` (name, data, type, link), the removed list and the base (default: every
    name from null, i.e. new)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data, kind, link in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
        if removed is not None:
            listed = removed if isinstance(removed, bytes) else json.dumps(removed).encode()
            _add(tar, a.REMOVED, listed)
        if base is not False:
            names = [m[0] for m in members] + (list(removed) if isinstance(removed, (list, tuple)) else [])
            value = base if base is not None else {n: None for n in names if isinstance(n, str)}
            _add(tar, a.BASE, value if isinstance(value, bytes) else json.dumps(value).encode())
    return buf.getvalue() + extra


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def hostile(root: Path, blob: bytes | None, record: dict | bytes | None = None, parts=None) -> Path:
    """A slice directory holding `blob` as its archive and `record` (default: a valid one) as run.json."""
    out = Path(tempfile.mkdtemp(dir=root, prefix="slice"))
    if blob is not None:
        (out / a.STATE).write_bytes(blob)
    rec = record if record is not None else {"started": STARTED, "parts": parts or [a.STATE], "runs": []}
    (out / "run.json").write_bytes(rec if isinstance(rec, bytes) else json.dumps(rec).encode())
    return out


def refused(slice_dir: Path, camp: Path, *words: str, error=UsageError) -> str:
    """Merging `slice_dir` raises `error` in one line naming every one of `words`, and changes nothing."""
    was = tree(camp)
    with pytest.raises(error) as got:
        a.merge_slice(slice_dir, camp)
    text = str(got.value)
    assert "\n" not in text.strip() and len(text) < 600, text
    for w in words:
        assert w in text, (w, text)
    assert tree(camp) == was, "a refused merge wrote, removed or left something"
    return text


# ----------------------------------------------------------------------------------------------- valid slices
@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
@pytest.mark.parametrize("part_bytes", [a.PART_BYTES, 200], ids=["one-part", "parts"])
def test_a_valid_slice_merges_exactly(tmp_path, monkeypatch, exchange, part_bytes):
    monkeypatch.setattr(a, "PART_BYTES", part_bytes)
    if not exchange:
        monkeypatch.setattr(a, "_exchange", lambda *_: False)
    camp = campaign(tmp_path)
    here = tmp_path / "here" / "state"
    copy_tree(camp, here)
    record = slice_of(camp, tmp_path / "out", step=1000, rows=5)
    assert (len(record["parts"]) > 1) == (part_bytes == 200)
    assert a.merge_slice(tmp_path / "out", here, slices=tmp_path / "here" / "slices") == record
    assert a.snapshot(here) == a.snapshot(camp)
    assert os.readlink(here / "r1" / "link") == str(tmp_path / "outside")
    assert sorted(p.name for p in here.parent.iterdir()) == ["slices", "state"], "no lock or staging left beside"
    kept = json.loads((tmp_path / "here" / "slices" / "slice-2026-11-27T081839Z.json").read_text())
    assert kept == record
    assert (tmp_path / "outside" / "victim.txt").read_text() == "keep me"
    # merged twice: the campaign already holds the slice's result, nothing changes
    a.merge_slice(tmp_path / "out", here)
    assert a.snapshot(here) == a.snapshot(camp)


def test_a_slice_merges_into_a_new_directory_and_a_file_may_become_a_directory(tmp_path):
    camp = tmp_path / "c"
    (camp / "r").mkdir(parents=True)
    (camp / "r" / "x").write_text("file")
    before = a.snapshot(camp)
    (camp / "r" / "x").unlink()
    (camp / "r" / "x").mkdir()
    (camp / "r" / "x" / "y").write_text("now a directory")
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"started": STARTED, "parts": a.pack(camp, before, out)}))
    here = tmp_path / "here" / "state"
    (here / "r").mkdir(parents=True)
    (here / "r" / "x").write_text("file")
    a.merge_slice(out, here)
    assert a.snapshot(here) == a.snapshot(camp)
    fresh = tmp_path / "fresh" / "state"  # x is not there: its removal has nothing to do
    a.merge_slice(out, fresh)
    assert a.snapshot(fresh) == a.snapshot(camp)


# ----------------------------------------------------------------------------------------------- hostile slices
HOSTILE_ARCHIVES = {
    "absolute name": ([member("/tmp/escape.txt")], [], "not a plain file"),
    "dot-dot": ([member("../escape.txt")], [], "not a plain file"),
    "dot-dot inside": ([member("r1/../../escape.txt")], [], "not a plain file"),
    "dot": ([member("r1/./x")], [], "not a plain file"),
    "empty part": ([member("r1//x")], [], "not a plain file"),
    "control character": ([member("r1/a\nb")], [], "not a plain file"),
    "git directory": ([member("r1/.git/config")], [], "not a plain file"),
    "lock file": ([member("r1/.aspan.lock")], [], "not a plain file"),
    "symlink member": ([member("r1/evil", b"", tarfile.SYMTYPE, link="/etc/passwd")], [], "not a plain file"),
    "hard link member": ([member("r1/evil", b"", tarfile.LNKTYPE, link="r1/runs.jsonl")], [], "not a plain file"),
    "directory member": ([member("r1/d", b"", tarfile.DIRTYPE)], [], "not a plain file"),
    "device member": ([member("r1/dev", b"", tarfile.CHRTYPE)], [], "not a plain file"),
    "fifo member": ([member("r1/fifo", b"", tarfile.FIFOTYPE)], [], "not a plain file"),
    "twice": ([member("r1/x"), member("r1/x")], [], "appears twice"),
    "file and directory": ([member("r1/x"), member("r1/x/y")], [], "lies under the file"),
    "written and removed": ([member("r1/x")], ["r1/x"], "both written and removed"),
    "under a file": ([member("r1/runs.jsonl/x")], [], "which is a file"),
    "through a link": ([member("r1/link/victim.txt")], [], "which is a symbolic link"),
    "over a directory": ([member("r1/scratch")], [], "not a regular file in the campaign"),
    "over a link": ([member("r1/link")], [], "not a regular file in the campaign"),
    "remove absolute": ([], ["/tmp/victim"], "not a plain file"),
    "remove dot-dot": ([], ["../outside/victim.txt"], "not a plain file"),
    "remove through a link": ([], ["r1/link/victim.txt"], "which is a symbolic link"),
    "remove a directory": ([], ["r1/scratch"], "not a regular file in the campaign"),
    "remove a link": ([], ["r1/link"], "not a regular file in the campaign"),
}


@pytest.mark.parametrize("case", HOSTILE_ARCHIVES)
def test_a_hostile_archive_is_refused_in_one_line_and_nothing_changes(tmp_path, case):
    members, removed, words = HOSTILE_ARCHIVES[case]
    camp = campaign(tmp_path)
    refused(hostile(tmp_path, archive(members, removed)), camp, words)
    assert (tmp_path / "outside" / "victim.txt").read_text() == "keep me"
    assert not Path("/tmp/escape.txt").exists() or case not in ("absolute name",)


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


HOSTILE_LISTS = {
    "removed a string": (b'"abc"', None, "must be a list"),
    "removed an object": (b'{"r1/runs.jsonl": 1}', None, "must be a list"),
    "removed of numbers": (b"[1, 2]", None, "not a file name"),
    "removed nested 10,000 deep": (_deep(10_000), None, "nested too deeply"),
    "removed not JSON": (b"[1,", None, "not a valid list of removed files"),
    "removed not UTF-8": (b'["\xff"]', None, "not a valid list of removed files"),
    "no removed list": (None, None, "has no .campaign-removed.json"),
    "base a list": (b"[]", b"[]", "must map file names"),
    "base not a digest": (b"[]", b'{"r1/new": "x"}', "must map file names"),
    "base of other names": (b"[]", b'{"r1/other": null}', "does not match the archive"),
    "base nested 10,000 deep": (b"[]", _deep(10_000), "nested too deeply"),
    "no base": (b"[]", False, "has no .campaign-base.json"),
}


@pytest.mark.parametrize("case", HOSTILE_LISTS)
def test_hostile_removed_lists_and_bases_are_refused(tmp_path, case):
    removed, base, words = HOSTILE_LISTS[case]
    camp = campaign(tmp_path)
    refused(hostile(tmp_path, archive([member("r1/new")], removed, base)), camp, words)


def test_a_removed_list_that_inflates_is_refused_before_it_is_read(tmp_path):
    """300 kB of gzip that would inflate to hundreds of megabytes: refused by its declared size."""
    camp = campaign(tmp_path)
    buf = io.BytesIO()
    size = a.MAX_LIST_BYTES + 1
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(a.REMOVED)
        info.size = size
        tar.addfile(info, io.BytesIO(b"[" + b" " * (size - 2) + b"]"))
    assert len(buf.getvalue()) < 100_000
    refused(hostile(tmp_path, buf.getvalue()), camp, "bytes (at most")


def test_an_archive_that_inflates_beyond_its_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(a, "MIN_INFLATED", 2**20)
    camp = campaign(tmp_path)
    blob = archive([member("r1/zeros", bytes(4 * 2**20))])
    assert len(blob) < 2**20 // a.MAX_INFLATION * 4
    refused(hostile(tmp_path, blob), camp, "inflates to more than")


@pytest.mark.parametrize("case", ["truncated", "not gzip", "gzip of garbage", "plain tar", "empty", "padded"])
def test_a_broken_archive_is_refused(tmp_path, case):
    camp = campaign(tmp_path)
    good = archive([member("r1/new", b"n" * 5000)])
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w") as tar:
        _add(tar, "r1/new", b"n")
    blob = {"truncated": good[: len(good) // 2], "not gzip": b"PK\x03\x04 not a gzip file at all",
            "gzip of garbage": gzip.compress(os.urandom(3000)), "plain tar": plain.getvalue(), "empty": b"",
            "padded": good + b"trailing bytes"}[case]
    refused(hostile(tmp_path, blob), camp, "not a valid slice archive")


HOSTILE_RECORDS = {
    "not JSON": (b"{", "not a valid slice record"),
    "a list": (b"[]", "not a slice record"),
    "nested 10,000 deep": (b'{"a": ' + _deep(10_000) + b"}", "nested too deeply"),
    "no started": ({"parts": [a.STATE]}, "'started' must be"),
    "started a number": ({"started": 5, "parts": [a.STATE]}, "'started' must be"),
    "started a path": ({"started": "../../x", "parts": [a.STATE]}, "'started' must be"),
    "parts a string": ({"started": STARTED, "parts": a.STATE}, "'parts' must be"),
    "parts outside": ({"started": STARTED, "parts": ["../state.tar.gz"]}, "'parts' must be"),
    "parts absolute": ({"started": STARTED, "parts": ["/etc/passwd"]}, "'parts' must be"),
    "parts out of order": ({"started": STARTED, "parts": ["state.tar.gz.part01", "state.tar.gz.part00"]},
                           "'parts' must be"),
    "parts too many": ({"started": STARTED, "parts": a.part_names(a.MAX_PARTS + 1)}, "'parts' must be"),
    "runs a string": ({"started": STARTED, "parts": [a.STATE], "runs": "abc"}, "'runs' must be"),
}


@pytest.mark.parametrize("case", HOSTILE_RECORDS)
def test_a_hostile_record_is_refused(tmp_path, case):
    record, words = HOSTILE_RECORDS[case]
    camp = campaign(tmp_path)
    refused(hostile(tmp_path, archive([member("r1/new")]), record=record), camp, words)


def test_parts_must_be_plain_files_of_bounded_size_in_the_slice(tmp_path, monkeypatch):
    camp = campaign(tmp_path)
    blob = archive([member("r1/new", os.urandom(3000))])
    linked = hostile(tmp_path, None)
    (tmp_path / "elsewhere.tar.gz").write_bytes(blob)
    (linked / a.STATE).symlink_to(tmp_path / "elsewhere.tar.gz")
    refused(linked, camp, "regular file")
    record = linked / "run.json"
    linked_record = hostile(tmp_path, blob, record=b"{}")
    (linked_record / "run.json").unlink()
    (linked_record / "run.json").symlink_to(record)
    refused(linked_record, camp, "regular file")
    missing = hostile(tmp_path, None)
    refused(missing, camp, "state.tar.gz", error=FileNotFoundError)
    monkeypatch.setattr(a, "PART_BYTES", 1000)
    refused(hostile(tmp_path, blob), camp, "larger than")


def test_the_command_line_refuses_a_hostile_slice_in_one_line(tmp_path, capsys):
    camp = campaign(tmp_path)
    was = tree(camp)
    for blob in (archive([], ["/tmp/victim"]), b"not gzip", archive([member("r1/link/victim.txt")])):
        assert main(["gpu", "merge", str(hostile(tmp_path, blob)), "--campaign", str(camp)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("aspan gpu: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert tree(camp) == was


# ----------------------------------------------------------------------------------------------- structured inputs
NAME_PARTS = st.sampled_from(["r1", "r2", "x", "..", ".", "", "link", "runs.jsonl", "old.txt", "scratch", ".git",
                              ".aspan.lock", "a\x00b", "ü", "/"])
NAMES = st.lists(NAME_PARTS, min_size=1, max_size=4).map("/".join)
KINDS = st.sampled_from([tarfile.REGTYPE, tarfile.REGTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
                         tarfile.DIRTYPE])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5) | NAMES,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3), max_leaves=8)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(members=st.lists(st.tuples(NAMES, st.binary(max_size=20), KINDS), max_size=4),
       removed=st.one_of(st.lists(NAMES, max_size=3), JSON), base=st.one_of(st.none(), JSON),
       cut=st.one_of(st.none(), st.integers(0, 400)))
def test_any_archive_is_merged_inside_the_campaign_or_refused_without_a_trace(tmp_path, members, removed, base, cut):
    """Whatever the archive: a one-line UsageError and the campaign (and its surroundings) unchanged, or a merge that
    wrote only inside the campaign and removed only regular files there."""
    with tempfile.TemporaryDirectory(dir=tmp_path) as root:
        root = Path(root)
        camp = campaign(root)
        outside = tree(root / "outside" / "victim.txt")
        try:
            blob = archive([member(n, d, k, link="r1/runs.jsonl") for n, d, k in members], removed, base)
        except (ValueError, UnicodeEncodeError, tarfile.TarError):
            return  # tarfile itself cannot write this member name
        blob = blob if cut is None else blob[:cut]
        slice_dir = hostile(root, blob)
        was = tree(camp)
        try:
            a.merge_slice(slice_dir, camp)
        except UsageError as e:
            assert "\n" not in str(e).strip()
            assert tree(camp) == was
        else:
            now = a.snapshot(camp)
            assert all(not Path(p).is_absolute() and ".." not in Path(p).parts for p in now)
            assert os.readlink(camp / "r1" / "link") == str(root / "outside")
        assert tree(root / "outside" / "victim.txt") == outside
        assert sorted(p.name for p in camp.parent.iterdir()) == ["state"]


# ----------------------------------------------------------------------------------------------- base state and locks
def test_a_stale_slice_is_refused_naming_the_run_that_would_go_back_in_time(tmp_path):
    gpu = campaign(tmp_path)  # the machine the slices ran on
    here = tmp_path / "here" / "state"
    copy_tree(gpu, here)
    slice_of(gpu, tmp_path / "s1", step=585, rows=3)
    slice_of(gpu, tmp_path / "s2", step=3330, rows=8, started="2026-11-27T09:00:00Z")
    a.merge_slice(tmp_path / "s1", here)
    a.merge_slice(tmp_path / "s2", here)
    assert a.snapshot(here) == a.snapshot(gpu)
    text = refused(tmp_path / "s1", here, "older than the campaign", "run r1",
                   "r1/scratch/t would go from step 3330 back to 585")
    assert "merge slices in the order they ran" in text


def test_two_slices_from_one_state_merge_once(tmp_path):
    start = campaign(tmp_path)
    other = tmp_path / "other" / "state"
    here = tmp_path / "here" / "state"
    copy_tree(start, other)
    copy_tree(start, here)
    slice_of(start, tmp_path / "a", step=900, rows=4)
    slice_of(other, tmp_path / "b", step=700, rows=2)
    a.merge_slice(tmp_path / "a", here)
    refused(tmp_path / "b", here, "older than the campaign", "run r1")


def test_a_merge_waits_for_no_one(tmp_path):
    """A slice holding the campaign, a job holding a run directory, or one holding a training inside it: the merge
    fails at once naming the holder, and nothing changes."""
    gpu = campaign(tmp_path)
    here = tmp_path / "here" / "state"
    copy_tree(gpu, here)
    slice_of(gpu, tmp_path / "s", step=1000, rows=3)
    with a.campaign_lock(here, "aspan gpu slice --out x"):
        refused(tmp_path / "s", here, "in use by 'aspan gpu slice --out x'", error=ValueError)
    with claim_run(here / "r1", command="aspan study abc ..."):
        refused(tmp_path / "s", here, "in use by 'aspan study abc ...'", error=ValueError)
    with claim_run(here / "r1" / "scratch" / "t", command="aspan train ..."):
        refused(tmp_path / "s", here, "in use by 'aspan train ...'", error=ValueError)
    a.merge_slice(tmp_path / "s", here)
    assert a.snapshot(here) == a.snapshot(gpu)


@pytest.mark.parametrize("where", ["writing the second file", "swapping in", "the second rename"])
def test_a_failure_while_applying_leaves_the_campaign_as_it_was(tmp_path, monkeypatch, where):
    gpu = campaign(tmp_path)
    here = tmp_path / "here" / "state"
    copy_tree(gpu, here)
    slice_of(gpu, tmp_path / "s", step=1000, rows=3)
    was = tree(here)
    if where == "writing the second file":
        calls, write = [], a._write_member

        def failing(root, m, data):
            calls.append(m.name)
            if len(calls) == 2:
                raise OSError(28, "No space left on device")
            write(root, m, data)
        monkeypatch.setattr(a, "_write_member", failing)
    elif where == "swapping in":
        monkeypatch.setattr(a, "_exchange", lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    else:
        monkeypatch.setattr(a, "_exchange", lambda *_: False)
        rename, failed = os.rename, []

        def second_fails(src, dst):  # the staged copy's rename fails; the old campaign's rename back does not
            if Path(dst) == here and not failed:
                failed.append(src)
                raise OSError(5, "Input/output error")
            rename(src, dst)
        monkeypatch.setattr(a.os, "rename", second_fails)
    with pytest.raises((OSError, KeyboardInterrupt)):
        a.merge_slice(tmp_path / "s", here)
    monkeypatch.undo()
    assert tree(here) == was
    a.merge_slice(tmp_path / "s", here)  # and it merges once the trouble is gone
    assert a.snapshot(here) == a.snapshot(gpu)
