"""`aspan data` / `aspan show`: JSONL output, --list, --param parsing, errors exit 2 with one line."""
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aspan import tasks
from aspan.cli import main
from aspan.io import write_lines
from aspan.tasks import Sample
from aspan.tasks.params import parse_bool, parse_params, parse_range, parse_value


def test_data_to_file_matches_generate(tmp_path, capsys):
    out = tmp_path / "sub" / "ff.jsonl"
    assert main(["data", "--task", "flipflop", "--split", "ood", "-n", "30", "--seed", "5", "-o", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [Sample.from_dict(r) for r in rows] == tasks.preset("flipflop", "ood").generate(30, seed=5)
    assert set(rows[0]) == {"task", "text", "prompt_len", "references", "params"}
    assert rows[0]["params"] == {"instructions": [10, 99], "registers": 2, "flips": True}
    assert [p.name for p in out.parent.iterdir()] == ["ff.jsonl"]  # no temp file left behind
    assert capsys.readouterr().out == ""


def test_data_to_stdout_with_params(capsys):
    assert (
        main(["data", "--task", "assign", "-n", "5", "--param", "pairs=3-4", "--param", "values=xyz",
              "--param", "length=7"]) == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 5
    for r in rows:
        assert r["params"] == {"pairs": [3, 4], "length": [7, 7], "keys": tasks.get("assign").keys, "values": "xyz"}
        assert len(r["text"]) - r["prompt_len"] == 7 and set(r["text"][-7:]) <= set("xyz")


def test_data_bool_param(capsys):
    assert main(["data", "--task", "parity", "-n", "20", "--param", "scratchpad=false", "-o", "-"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(len(r["text"]) == r["prompt_len"] + 1 for r in rows)


def test_list(capsys):
    assert main(["data", "--list"]) == 0
    out = capsys.readouterr().out
    for name in tasks.NAMES:
        assert f"\n{name}:" in "\n" + out
        assert repr(tasks.preset(name, "ood").params()[next(iter(tasks.presets(name)["ood"]))]) in out
    assert "registers=2" in out and "scratchpad=True" in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["data", "--task", "nosuchtask"], ["unknown task", "nosuchtask"]),
        (["data"], ["TASK"]),
        (["data", "--task", "flipflop", "--param", "registers=11"], ["registers"]),
        (["data", "--task", "flipflop", "--param", "regs=2"], ["regs", "instructions"]),
        (["data", "--task", "flipflop", "--param", "flips=maybe"], ["flips", "boolean"]),
        (["data", "--task", "parity", "--param", "length"], ["key=value"]),
        (["data", "--task", "parity", "--param", "length=5-2"], ["length", "reversed"]),
        (["data", "--task", "parity", "-n", "-1"], ["-n"]),
        (["show", "--task", "nosuchtask"], ["unknown task"]),
    ],
)
def test_errors_exit_2_with_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"aspan {argv[0]}: error:")
    for w in words:
        assert w in err


def test_failed_write_leaves_old_file(tmp_path):
    out = tmp_path / "x.jsonl"
    out.write_text("old\n")

    def lines():
        yield "new"
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_lines(out, lines())
    assert out.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["x.jsonl"]


def test_show_marks_references(capsys):
    assert main(["show", "--task", "assign", "--seed", "3", "-n", "2", "--width", "200"]) == 0
    out = capsys.readouterr().out
    samples = tasks.preset("assign").generate(2, seed=3)
    lines = out.splitlines()
    for s in samples:
        i = lines.index(s.text)
        for j, refs in enumerate(s.references):
            marks = lines[i + 1 + j].split("  t")[0]
            assert [p for p, c in enumerate(marks) if c == "^"] == sorted(refs)
            assert marks.index("*") == s.prompt_len + j


def test_show_compact_when_long(capsys):
    assert main(["show", "--task", "parity", "--split", "ood", "--param", "scratchpad=no", "--width", "20"]) == 0
    out = capsys.readouterr().out
    s = tasks.preset("parity", "ood", scratchpad=False).generate(1)[0]
    assert f"t0={s.target!r} <- 0..{s.prompt_len - 2}" in out
    assert max(len(line) for line in out.splitlines() if line.startswith("t")) < 40


def test_subprocess_console():
    env = {**os.environ, "PYTHONHASHSEED": "7"}
    r = subprocess.run([sys.executable, "-m", "aspan.cli", "data", "--task", "parity", "-n", "3", "--seed", "1"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [Sample.from_dict(json.loads(x)) for x in r.stdout.splitlines()] == tasks.preset("parity").generate(
        3, seed=1
    )
    r = subprocess.run(
        [sys.executable, "-m", "aspan.cli", "data", "--task", "bogus"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "unknown task 'bogus'" in r.stderr and "Traceback" not in r.stderr


# --- the --param value parser ---

@given(st.integers(-10**6, 10**6))
def test_parse_int(i):
    assert parse_value(str(i)) == i == parse_range(str(i)) == parse_value(f" {i}", like=3)


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from(["-", ",", " - ", ", "]))
def test_parse_range(a, b, sep):
    assert parse_value(f"{a}{sep}{b}") == [a, b] == parse_value(f"{a}{sep}{b}", like=(1, 2))


@given(st.sampled_from(["true", "yes", "on", "1", "false", "no", "off", "0"]), st.booleans())
def test_parse_bool(word, upper):
    w = word.upper() if upper else word
    assert parse_bool(w) is (word in ("true", "yes", "on", "1")) is parse_value(w, like=False)


@given(st.text(min_size=1).filter(lambda t: t.strip() and "=" not in t))
def test_parse_string_kept_for_string_params(text):
    assert parse_value(text, like="abc") == text
    v = parse_value(text)
    assert v == text or isinstance(v, (int, bool, list))


@given(st.integers(1, 9), st.integers(0, 9))
def test_parse_params_typed_by_default(lo, extra):
    got = parse_params("flipflop", [f"instructions={lo}-{lo + extra}", f"registers={lo}", "flips=off"])
    assert got == {"instructions": [lo, lo + extra], "registers": lo, "flips": False}
    assert parse_params("assign", ["keys=0123", "values=10"]) == {"keys": "0123", "values": "10"}


def test_parse_errors():
    for bad in ("x", "1-", "1-2-3", ""):
        with pytest.raises(ValueError):
            parse_range(bad)
    with pytest.raises(ValueError, match="registers"):
        parse_params("flipflop", ["registers=two"])


# ------------------------------------------------------------------------------ sizes bounded before work
@given(st.integers(1, 10**12))
def test_a_sample_length_is_refused_before_generation_iff_past_the_bound(length):
    from aspan.applications.data import MAX_SAMPLE_CHARS, check_lengths
    from aspan.errors import UsageError

    task = tasks.get("reversal", length=(1, length))
    if task.max_text_len() > MAX_SAMPLE_CHARS:
        with pytest.raises(UsageError, match=f"--param length=1-{length}: reversal samples of up to"):
            check_lengths(task)
    else:
        check_lengths(task)


@pytest.mark.parametrize("command", ["data", "show"])
def test_huge_sample_lengths_are_refused_in_one_line_without_allocating(tmp_path, command):
    """`--param length=100000000-100000000` took 5.3 GB in 40 s; now one line, at once, at the memory of the imports."""
    from tests.cli import aspan_peak, one_line

    code, err, peak = aspan_peak(command, "--task", "reversal", "--param", "length=100000000-100000000", cwd=tmp_path)
    assert code == 2, err[-2000:]
    one_line(err, "--param length=100000000-100000000", "200,000,001 characters")
    assert peak < 1.5 * 2**30, peak
