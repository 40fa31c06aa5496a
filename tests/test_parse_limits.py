"""Parsers of user files (TOML configs, JSONL data, JSON configs) answer any nesting depth and any integer size
with a value or one line naming the file (and line), never a RecursionError or "Exceeds the limit (4300 digits)"."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspan.io import read_json, read_toml
from aspan.tasks import read_samples
from tests.cli import SMALL, aspan, one_line

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(st.integers(1, 6000), st.sampled_from(["[", "{x = "]))
def test_toml_nested_at_any_depth_parses_or_is_one_line(tmp_path, depth, opener):
    closer = "]" if opener == "[" else "}"
    path = tmp_path / "deep.toml"
    path.write_text("a = " + opener * depth + "1" + closer * depth + "\n")
    try:
        read_toml(path)
    except ValueError as e:
        assert str(path) in str(e) and "\n" not in str(e), e


@FAST
@given(st.integers(1, 60000))
def test_a_data_line_nested_at_any_depth_is_one_line_naming_the_line(tmp_path, depth):
    path = tmp_path / "data.jsonl"
    path.write_text("[" * depth + "]" * depth + "\n")
    with pytest.raises(ValueError) as info:
        read_samples(path)
    assert str(info.value).startswith(f"{path} line 1: ") and "\n" not in str(info.value)


@FAST
@given(st.integers(1, 20000))
def test_json_integers_of_any_size_are_read_or_refused_naming_the_file(tmp_path, digits):
    path = tmp_path / "config.json"
    path.write_text('{"n": ' + "7" * digits + "}")
    try:
        assert read_json(path)["n"] == int("7" * digits)
    except ValueError as e:
        assert digits > 4300 and str(path) in str(e) and f"{digits:,} digits" in str(e), e


def test_the_command_line_says_so_in_one_line(tmp_path):
    (tmp_path / "deep.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    (tmp_path / "deep.jsonl").write_text("[" * 50000 + "]" * 50000 + "\n")
    for args, words in ((["sweep", "--config", "deep.toml", "--out", "s"], ["deep.toml", "nested too deeply"]),
                        (["train", *SMALL, "--data", "deep.jsonl", "--out", "t"], ["deep.jsonl line 1", "nested"])):
        r = aspan(*args, cwd=tmp_path)
        assert r.returncode == 2, r.stderr[-2000:]
        one_line(r.stderr, *words)


def test_hand_edited_run_files_nested_deeply_are_one_line(tmp_path):
    """A run directory's recorded settings (and a checkpoint's training state) nested thousands deep: one line naming
    the file, as for any other unreadable one."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ".aspan-settings.json").write_text("[" * 50000 + "]" * 50000)
    r = aspan("train", *SMALL, "--steps", "1", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(r.stderr, str(out / ".aspan-settings.json"), "nested too deeply")


def test_a_toml_integer_of_5000_digits_names_the_file(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text("a = " + "9" * 5000 + "\n")
    with pytest.raises(ValueError, match=f"{path}: invalid TOML: ValueError: Exceeds the limit"):
        read_toml(path)
