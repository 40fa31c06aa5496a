"""The command line keeps its promises to the user and to a process that calls `aspan.cli.main`:

- `main` leaves the warning filters as it found them, and a study's `--threads` leaves torch's thread count so.
- A setting given twice, differently (`report -o a -o b`, or `--out a -o b`), is refused, not one of them dropped.
- `--list-units` and `--print-config` write nothing and need no `--out`; a run without `--out` is refused in one line.
- `aspan study abc --protocol paper --print-config` reads back through `--config` alone (it names its protocol).
- `--print-config` escapes U+007F: every printed config parses back to the same values, whatever the strings (a
  Hypothesis property over `aspan.config.to_toml`, and one command line end to end).
- `--unit ²` (a digit `int()` reads), a 5,000-digit `--unit` and `--heads ""` are refused by name in one line;
  integer flags take ASCII digits only.
"""
from __future__ import annotations

import argparse
import tomllib
import warnings
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspan.cli import main
from aspan.config import load_config, to_toml

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def one_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    for w in words:
        assert w in err, (w, err)
    return err


# ----------------------------------------------------------------------------------------------- the host process
@pytest.mark.parametrize("argv", [["data", "--list"], ["study", "parity", "--quick"], ["report", "--help"]],
                         ids=["ok", "error", "help"])
def test_main_leaves_the_warning_filters_as_it_found_them(argv, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        before = list(warnings.filters)
        main(argv)
        assert warnings.filters == before


class _Recording:
    """The parity study, but `run` records torch's thread count instead of training."""

    def __init__(self):
        from aspan.applications.studies import study

        self.real, self.threads = study("parity"), []

    def units(self, config):
        return self.real.units(config)

    def unit(self, config, which):
        return self.real.unit(config, which)

    def run(self, config, out, **kw):
        self.threads.append(torch.get_num_threads())


@pytest.mark.parametrize("unit", [[], ["--unit", "0"]], ids=["whole", "unit"])
def test_a_studys_threads_are_the_callers_again_afterwards(tmp_path, monkeypatch, unit):
    import aspan.commands.study as command

    recording = _Recording()
    monkeypatch.setattr(command, "study", lambda name: recording)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        assert main(["study", "parity", "--quick", "--threads", "1", "--no-report", "--out", str(tmp_path / "p"),
                     "--quiet", *unit]) == 0
        assert recording.threads == [1] and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------------------------- given twice
@pytest.mark.parametrize("flags", [["-o", "a.html", "-o", "b.html"], ["--out", "a.html", "-o", "b.html"],
                                   ["-o", "a.html", "--out", "b.html"], ["--output", "a.html", "-o", "b.html"]])
def test_report_refuses_an_output_given_twice_differently(tmp_path, capsys, monkeypatch, flags):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rd").mkdir()
    assert main(["report", "rd", *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("aspan report: error: argument ") and "given twice (a.html and b.html)" in lines[-1]
    assert all("deprecated" in line for line in lines[:-1]) and "Traceback" not in "".join(lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rd"]


@pytest.mark.parametrize("argv", [["eval", "m", "--out", "a", "--run-dir", "b"],
                                  ["eval", "m", "--run-dir", "a", "--out", "b"],
                                  ["eval", "m", "-o", "a", "--output", "b"], ["data", "-o", "a", "-o", "b"]])
def test_other_outputs_given_twice_differently_are_refused_too(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert "given twice (a and b)" in lines[-1] and all("deprecated" in line for line in lines[:-1])
    assert list(tmp_path.iterdir()) == []


def test_report_takes_the_same_output_twice_as_once(tmp_path, capsys):
    (tmp_path / "rd").mkdir()
    main(["report", str(tmp_path / "rd"), "-o", str(tmp_path / "a.html"), "--out", str(tmp_path / "a.html")])
    assert "given twice" not in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- --out
@pytest.mark.parametrize("argv", [["study", "parity", "--quick"], ["study", "qk", "--quick"],
                                  ["study", "abc", "--protocol", "paper", "--quick"]], ids=["parity", "qk", "abc"])
def test_list_units_and_print_config_need_no_out_and_write_nothing(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--list-units"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) >= 5 and listed[0].startswith("0\t")
    assert main([*argv, "--print-config"]) == 0 and " = " in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["parity", "qk"])
def test_a_study_run_without_out_is_refused_in_one_line(tmp_path, capsys, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert main(["study", name, "--quick", "--quiet"]) == 2
    one_line(capsys, "aspan study: error: --out DIR is required")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------------------- --print-config
@pytest.mark.parametrize("argv", [["--protocol", "paper"], ["--protocol", "paper", "--quick"],
                                  ["--protocol", "paper", "--quick", "--tasks", "parity", "--seeds", "3,4"],
                                  [], ["--quick"]])
def test_a_printed_abc_config_reads_back_through_config_alone(tmp_path, capsys, monkeypatch, argv):
    from aspan.applications.studies.abc import AbcStudyConfig
    from aspan.applications.studies.abc_paper import PaperConfig

    monkeypatch.chdir(tmp_path)
    assert main(["study", "abc", *argv, "--print-config"]) == 0
    printed = capsys.readouterr().out
    paper = "paper" in argv
    assert printed.startswith(f'protocol = "{"paper" if paper else "aligned"}"\n')
    (tmp_path / "c.toml").write_text(printed)
    assert main(["study", "abc", "--config", "c.toml", "--print-config"]) == 0
    assert capsys.readouterr().out == printed
    assert main(["study", "abc", "--config", "c.toml", "--list-units"]) == 0  # the same study's units
    assert len(capsys.readouterr().out.splitlines()) >= 1
    cls = PaperConfig if paper else AbcStudyConfig
    assert to_toml(load_config(cls, toml_path=tmp_path / "c.toml")) == printed.partition("\n")[2]
    other = "aligned" if paper else "paper"
    assert main(["study", "abc", "--protocol", other, "--config", "c.toml", "--print-config"]) == 2
    one_line(capsys, f"--protocol {other}: c.toml holds the settings of protocol")


def test_a_config_naming_no_known_protocol_is_refused(tmp_path, capsys):
    (tmp_path / "c.toml").write_text('protocol = "papr"\n')
    assert main(["study", "abc", "--config", str(tmp_path / "c.toml"), "--print-config"]) == 2
    one_line(capsys, "c.toml: protocol must be one of aligned, paper, got 'papr'")


@dataclass
class Inner:
    note: str = ""


@dataclass
class Strings:
    name: str = ""
    tags: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)


hostile = st.text(st.one_of(st.characters(exclude_categories=("Cs",)),
                            st.sampled_from(["\x7f", "\x00", "\n", "\r", '"', "\\", "\u2028", "\x85", "\U0001F600"])),
                  max_size=12)


@FAST
@given(name=hostile, tags=st.lists(hostile, max_size=3), extra=st.dictionaries(hostile, hostile, max_size=3),
       note=hostile)
def test_every_printed_config_reads_back_to_the_same_values(tmp_path, name, tags, extra, note):
    cfg = Strings(name, tuple(tags), extra, Inner(note))
    text = to_toml(cfg)
    assert "\x7f" not in text
    tomllib.loads(text)  # TOML at all
    path = tmp_path / "c.toml"
    path.write_text(text, encoding="utf-8")
    assert load_config(Strings, toml_path=path) == cfg


def test_del_is_escaped_and_a_lone_surrogate_is_refused_by_name():
    assert 'name = "a\\u007Fb"' in to_toml(Strings(name="a\x7fb"))
    with pytest.raises(ValueError, match="^inner.note: a string with a lone surrogate has no TOML form$"):
        to_toml(Strings(inner=Inner("\ud800")))


def test_a_command_line_string_with_del_prints_and_reads_back(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "m", "--output", "rec\x7f.jsonl", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert 'output = "rec\\u007F.jsonl"' in printed
    (tmp_path / "c.toml").write_text(printed)
    assert main(["eval", "--config", "c.toml", "--print-config"]) == 0 and capsys.readouterr().out == printed


# ----------------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("unit, shown", [("²", "'²'"), ("٣", "'٣'"), ("1" * 5000, "(5000 characters)"),
                                         ("15", "'15'"), ("-1", "'-1'"), ("", "''")])
def test_a_unit_that_is_not_one_is_refused_by_name_in_one_line(tmp_path, capsys, unit, shown):
    out = tmp_path / "p"
    assert main(["study", "parity", "--quick", "--out", str(out), "--unit", unit, "--quiet"]) == 2
    err = one_line(capsys, "aspan study: error: --unit: no unit ", shown, "in study parity: 0-14")
    assert len(err) < 300 and not out.exists()


def test_a_unit_is_its_index_in_ascii_digits_or_its_key():
    from aspan.applications.studies import study

    parity = study("parity")
    config = parity.config.quick(threads=1)
    units = parity.units(config)
    assert parity.unit(config, "3") == parity.unit(config, 3) == (3, units[3])
    assert parity.unit(config, "03") == (3, units[3]) and parity.unit(config, units[5].key) == (5, units[5])


@pytest.mark.parametrize("command", ["abc", "eval"])
@pytest.mark.parametrize("heads", ["", ",", " , ", "1.x", "².1", "1.2.3", "1" * 5000 + ".1"])
def test_heads_that_name_no_head_are_refused_by_name_in_one_line(tmp_path, capsys, ckpt, command, heads):
    out = tmp_path / "out"
    argv = ["abc", str(ckpt), "--task", "reversal"] if command == "abc" else ["eval", str(ckpt)]
    assert main([*argv, "--heads", heads, "--out", str(out), "--quiet"]) == 2
    err = one_line(capsys, "--heads")
    assert len(err) < 300 and not out.exists()


pairs = st.lists(st.tuples(st.integers(0, 999), st.integers(0, 999)), min_size=1, max_size=4)
space = st.sampled_from(["", " ", "  "])


@FAST
@given(heads=pairs, before=space, after=space, sep=st.sampled_from([".", ":"]))
def test_heads_parse_to_the_pairs_they_name(heads, before, after, sep):
    from aspan.applications.abc import parse_heads as abc_heads
    from aspan.applications.eval import parse_heads as eval_heads

    text = ",".join(f"{before}{layer}{sep}{head}{after}" for layer, head in heads)
    assert eval_heads(text) == heads
    if sep == ".":
        assert abc_heads(text) == abc_heads(text + ",") == heads  # abc allows a trailing comma, as before


@FAST
@given(text=st.text(st.sampled_from("0123456789.,: ²٣x-"), max_size=10))
def test_any_heads_text_parses_to_pairs_or_is_refused_naming_heads(text):
    from aspan.applications.abc import parse_heads as abc_heads
    from aspan.applications.eval import parse_heads as eval_heads

    for parse in (abc_heads, eval_heads):
        try:
            got = parse(text)
        except ValueError as e:
            assert "--heads" in str(e) and "\n" not in str(e)
        else:
            assert got and all(isinstance(x, int) and x >= 0 for pair in got for x in pair)
            assert parse(",".join(f"{layer}.{head}" for layer, head in got)) == got


@pytest.mark.parametrize("text", ["²", "٣", "1" * 5000, "1_000" * 10, "", "x"])
def test_integer_flags_take_ascii_digits_only_and_say_so_in_one_short_line(text):
    from aspan.commands.argtypes import positive_int

    with pytest.raises(argparse.ArgumentTypeError) as e:
        positive_int(text)
    assert str(e.value).startswith("expected an integer, got ") and len(str(e.value)) < 100


def test_integer_flags_read_what_they_read_before():
    from aspan.commands.argtypes import nonneg_int, positive_int

    assert [positive_int(t) for t in ("1", "12", "+4", " 7 ", "1_000")] == [1, 12, 4, 7, 1000]
    assert nonneg_int("0") == 0
