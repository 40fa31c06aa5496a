"""The run-directory writer: atomic writes leave nothing on failure, strict JSON, resumable JSONL rows."""
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan import io
from aspan.io import RowWriter, read_rows, settings_key, union_rows
from tests.cli import aspan, one_line


def test_key_is_order_independent_and_stable_across_hash_seeds():
    a = {"strength": 1.0, "heads": "top:2", "rank": {"by": "score_sum", "seed": 1}}
    b = {"rank": {"seed": 1, "by": "score_sum"}, "heads": "top:2", "strength": 1.0}
    assert settings_key(a) == settings_key(b)
    assert settings_key(a) != settings_key({**a, "strength": 2.0})
    code = "from aspan.io import settings_key; print(settings_key({'b': [1, 2], 'a': 'x'}))"
    outs = {
        subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": s}, capture_output=True,
                       text=True, check=True).stdout
        for s in ("0", "1", "123")
    }
    assert len(outs) == 1


def test_writer_skips_existing_keys_and_reader_dedups(tmp_path):
    p = tmp_path / "r.jsonl"
    w = RowWriter(p)
    assert w.write({"key": "a", "x": 1})
    assert not w.write({"key": "a", "x": 2})
    assert RowWriter(p).write({"key": "a", "x": 3}) is False
    assert RowWriter(p).write({"key": "b", "x": 4})
    assert [r["x"] for r in read_rows(p)] == [1, 4]


def test_torn_last_line_is_ignored_and_cut_before_append(tmp_path):
    p = tmp_path / "r.jsonl"
    RowWriter(p).write({"key": "a", "x": 1})
    with open(p, "a") as f:
        f.write('{"key": "b", "x"')  # killed mid-write
    assert [r["key"] for r in read_rows(p)] == ["a"]
    w = RowWriter(p)
    assert w.write({"key": "b", "x": 2})
    assert [r["key"] for r in read_rows(p)] == ["a", "b"]
    assert all(json.loads(line) for line in p.read_text().splitlines())


def test_corrupt_middle_line_is_an_error(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"key": "a"}\nnot json\n{"key": "b"}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_rows(p)


@settings(deadline=None)  # file I/O: its time depends on the machine's load
@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers()), max_size=20))
def test_union_keeps_first_of_each_key(pairs):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        half = len(pairs) // 2
        for name, part in (("s0", pairs[:half]), ("s1", pairs[half:])):
            w = RowWriter(f"{d}/{name}.jsonl")
            for k, x in part:
                w.write({"key": k, "x": x})
        rows = union_rows([f"{d}/s0.jsonl", f"{d}/s1.jsonl"])
        first = {}
        for k, x in pairs:
            first.setdefault(k, x)
        assert {r["key"]: r["x"] for r in rows} == first
        assert len(rows) == len(first)


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers()), max_size=20),
       st.lists(st.tuples(st.sampled_from("bcd"), st.integers()), max_size=20))
def test_union_of_every_row_keeps_a_files_repeated_keys(first, second):
    """`unique=False` (files recording several rows under one key): every row of a file, in order; a later file's
    rows under a key an earlier file holds are left out (a unit that computed the same thing twice)."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for name, part in (("s0", first), ("s1", second)):
            Path(f"{d}/{name}.jsonl").write_text("".join(json.dumps({"key": k, "x": x}) + "\n" for k, x in part))
        rows = union_rows([f"{d}/s0.jsonl", f"{d}/s1.jsonl"], unique=False)
        held = {k for k, _ in first}
        assert [(r["key"], r["x"]) for r in rows] == first + [(k, x) for k, x in second if k not in held]
        assert len(read_rows(f"{d}/s0.jsonl", unique=False)) == len(first)


def test_union_of_every_row_keeps_rows_without_a_key_and_refuses_a_non_object(tmp_path):
    """Rows without a key (logs) are under no key: every file's are kept; a line that is not an object is named."""
    (tmp_path / "a.jsonl").write_text('{"step": 1}\n{"key": "k", "x": 1}\n')
    (tmp_path / "b.jsonl").write_text('{"step": 1}\n{"key": "k", "x": 2}\n')
    rows = union_rows([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], unique=False)
    assert rows == [{"step": 1}, {"key": "k", "x": 1}, {"step": 1}]
    (tmp_path / "c.jsonl").write_text('{"key": "k"}\n[1, 2]\n')
    with pytest.raises(ValueError, match="c.jsonl line 2: not a result row"):
        read_rows(tmp_path / "c.jsonl", unique=False)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_atomic_write_failure_keeps_old_file_and_leaves_no_temp(tmp_path, error):
    path = tmp_path / "sub" / "x.txt"
    io.write_text(path, "old")

    def write(f):
        f.write("half")
        raise error("boom")

    with pytest.raises(error):
        io.atomic_write(path, write)
    assert path.read_text() == "old" and sorted(p.name for p in path.parent.iterdir()) == ["x.txt"]


def test_atomic_dir_failure_leaves_nothing_and_success_replaces_files(tmp_path):
    target = tmp_path / "ckpt"
    with pytest.raises(RuntimeError), io.atomic_dir(target) as tmp:
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    for text in ("1", "2"):
        with io.atomic_dir(target) as tmp:
            (tmp / "config.json").write_text(text)
        assert (target / "config.json").read_text() == text and [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_clean_gives_strict_json():
    import numpy as np
    import torch

    obj = {1: float("nan"), "t": (np.float32(0.5), torch.tensor(3)), "inf": -float("inf"), "d": torch.float16,
           "dev": torch.device("cpu")}
    text = io.to_json(obj)
    assert json.loads(text) == {"1": None, "t": [0.5, 3], "inf": None, "d": "float16", "dev": "cpu"}
    assert "NaN" not in text and "Infinity" not in text


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(), c, max_size=3), max_leaves=10))
def test_json_round_trips_every_finite_value(obj):
    back = json.loads(io.to_json(obj))

    def expect(o):
        if isinstance(o, float) and (o != o or o in (float("inf"), -float("inf"))):
            return None
        if isinstance(o, dict):
            return {k: expect(v) for k, v in o.items()}
        if isinstance(o, list):
            return [expect(v) for v in o]
        return o

    assert back == expect(obj)


def test_run_dir_writes_tables_records_and_figures(tmp_path):
    import pandas as pd
    import plotly.graph_objects as go

    run = io.RunDir(tmp_path / "run")
    df = pd.DataFrame({"a": [1, 2], "b": [0.5, float("nan")]})
    run.write_csv("t.csv", df)
    run.records("r.jsonl", df)
    run.write_json("s.json", {"x": float("nan")})
    path = run.figure(go.Figure(go.Scatter(x=[1], y=[2])), "f")
    assert path == tmp_path / "run" / "figures" / "f.json"
    assert pd.read_csv(run / "t.csv").a.tolist() == [1, 2]
    assert pd.read_json(run / "r.jsonl", lines=True).a.tolist() == [1, 2]
    assert json.loads((run / "s.json").read_text()) == {"x": None}
    assert json.loads(path.read_text())["data"][0]["y"] == [2]


# ------------------------------------------------------------------------------------ the command line's writes
ROOT = Path(__file__).resolve().parent.parent


def char_device(directory: Path, name: str) -> Path:
    """A character device like /dev/NAME (null, full): made in `directory` where this user may (root), so the code
    under test never touches the machine's own node; else the machine's (which such a user cannot replace)."""
    numbers = {"null": (1, 3), "full": (1, 7)}[name]
    node = directory / name
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(*numbers))
    except PermissionError:
        return Path("/dev") / name
    return node


def test_data_to_a_character_device_writes_into_it_and_keeps_the_node(tmp_path):
    null = char_device(tmp_path, "null")
    r = aspan("data", "--task", "reversal", "-n", "3", "-o", str(null), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISCHR(os.lstat(null).st_mode)  # not replaced by a regular file
    assert not [p for p in null.parent.iterdir() if p.name.startswith(f".{null.name}.")]  # no temp file beside it


def test_data_to_a_full_device_is_one_line_no_space_naming_the_file(tmp_path):
    full = char_device(tmp_path, "full")
    r = aspan("data", "--task", "reversal", "-n", "3", "-o", str(full), cwd=tmp_path)
    assert r.returncode == 2
    one_line(r.stderr, str(full), "No space left on device")
    assert stat.S_ISCHR(os.lstat(full).st_mode)


def test_data_to_a_fifo_reaches_its_reader(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open before the writer, so its open does not block
    try:
        r = aspan("data", "--task", "reversal", "-n", "3", "-o", str(fifo), cwd=tmp_path)
        got = os.read(reader, 1 << 16).decode()
    finally:
        os.close(reader)
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["task"] for line in got.splitlines()] == ["reversal"] * 3
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_data_on_a_full_disk_names_the_file_and_leaves_no_temp_file(tmp_path):
    full_disk = ("import errno, os\ndef fsync(fd):\n    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
                 "os.fsync = fsync")
    out = tmp_path / "out" / "samples.jsonl"
    r = aspan("data", "--task", "reversal", "-n", "3", "-o", str(out), cwd=tmp_path, code=full_disk)
    assert r.returncode == 2
    one_line(r.stderr, str(out), "No space left on device")
    assert list(out.parent.iterdir()) == []


def _stale_lock(directory: Path, pid) -> None:
    """A lock file no job holds (its flock is free) naming `pid` on this host."""
    directory.mkdir()
    (directory / io.LOCK).write_text(json.dumps({"host": io.HOST, "pid": pid, "command": "gone", "started": "?"}))


@pytest.mark.parametrize("pid", [os.getpid(), "abc"], ids=["live-unrelated-pid", "junk-pid"])
def test_a_lock_whose_flock_is_free_does_not_block_the_directory(tmp_path, pid):
    """The pid of a dead holder may belong to another process by now (here: this test's own, alive), or the file
    may hold junk: the free flock says no job holds the directory."""
    run_dir = tmp_path / "run"
    _stale_lock(run_dir, pid)
    r = aspan("eval", "reversal", "-n", "2", "--no-attn", "--device", "cpu", "--out", str(run_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (run_dir / "run.json").exists() and not (run_dir / io.LOCK).exists()


def test_a_junk_pid_where_flock_is_unsupported_names_the_lock_file(tmp_path, monkeypatch):
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "no locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    _stale_lock(tmp_path / "run", "abc")
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'run' / io.LOCK}: pid 'abc' is not a process id"):
        with io.claim(tmp_path / "run"):
            pass


def test_rows_are_never_appended_cut_or_read_through_a_symbolic_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep: no newline at the end")
    link = tmp_path / "rows.jsonl"
    link.symlink_to(victim)
    with pytest.raises(ValueError, match=rf"^{link} is a symbolic link"):
        RowWriter(link)
    with pytest.raises(ValueError, match=rf"^{link} is a symbolic link"):
        io.append_line(link, {"x": 1})
    with pytest.raises(ValueError, match=rf"^{link} is a symbolic link"):
        io.write_json(link, {"x": 1})
    with pytest.raises(ValueError, match=rf"^{link} is a symbolic link"):
        read_rows(link)  # nor are results read from elsewhere
    assert victim.read_text() == "keep: no newline at the end" and link.is_symlink()


# ------------------------------------------------------------------------------------ what a run directory holds
def tiny_checkpoint(path: Path, seed: int = 0) -> Path:
    from aspan import models
    from aspan.tokenization import CharTokenizer

    model = models.tiny(CharTokenizer(), n_layers=1, n_heads=2, d_model=16, n_ctx=64, seed=seed, device="cpu")
    return models.save(model, path, CharTokenizer(), task="reversal")


def sweep_args(tmp_path: Path) -> list[str]:
    ckpt = tmp_path / "ckpt"
    if not ckpt.exists():
        tiny_checkpoint(ckpt)
    (tmp_path / "s.toml").write_text(f'model = "{ckpt}"\ntask = "reversal"\nn_samples = 2\nbatch_size = 2\n'
                                     'task_params = {length = [2, 3]}\nstrengths = [1.0]\n[heads]\nlist = [[0, 0]]\n')
    return ["sweep", "--config", str(tmp_path / "s.toml"), "--out", str(tmp_path / "run"), "--quiet"]


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_sweep_whose_model_was_replaced_by_another_of_the_same_shape_is_refused(tmp_path):
    first = aspan(*sweep_args(tmp_path), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    before = files_of(tmp_path / "run")
    shutil.rmtree(tmp_path / "ckpt")
    tiny_checkpoint(tmp_path / "ckpt", seed=1)  # same shape, other weights
    second = aspan(*sweep_args(tmp_path), cwd=tmp_path)
    assert second.returncode == 2
    one_line(second.stderr, "another configuration", "model_sha256")
    assert files_of(tmp_path / "run") == before
