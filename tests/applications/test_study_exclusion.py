"""A study's units and its whole run exclude each other, and the whole run touches only its own unit files.

- A run of the whole study (no `--unit`) holds every unit's lock from its merge to its last output: a `--unit K` job
  (or a Slurm array task) started meanwhile is refused in one line, and a whole run started while a unit job holds
  its lock is refused in one line naming that job; neither trains anything.
- Files named like unit files that are not the study's (`rows.unit-99.jsonl` of a study of 15 units,
  `rows.unit-abc.jsonl`) are neither read, merged nor deleted: the merge, the whole run and a unit run refuse in one
  line naming the file, and every file stays as it was.
"""
from __future__ import annotations

import json
import signal
import string
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspan.applications.studies import Study, Unit, merge_units, study, unit_file
from aspan.cli import main
from aspan.errors import UsageError
from aspan.io import claim_run

from ..cli import ENV


@dataclass
class Toy:
    units: int = 5

    def check(self) -> None:
        pass


def toy_study(calls: list) -> Study:
    """A study of `Toy.units` units (one stage) whose runner records what it was asked and, for the whole run,
    whether a unit job could take its lock meanwhile."""

    def runner(config, out, *, progress, unit):
        if unit is None:
            try:
                with claim_run(out, shard=(1, config.units), command="aspan study toy --unit 1"):
                    calls.append("a unit job ran during the whole run")
            except ValueError as e:
                calls.append(str(e))
        calls.append(unit)

    return Study("toy", Toy, runner, lambda c: [Unit(f"u{i}", 0) for i in range(c.units)], ("rows.jsonl",))


def snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def one_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    for w in words:
        assert w in err, (w, err)
    return err


def test_a_unit_job_cannot_run_while_the_whole_study_runs(tmp_path):
    calls = []
    toy_study(calls).run(Toy(), tmp_path, progress=False)
    assert len(calls) == 2 and calls[1] is None
    assert f"run directory {tmp_path} is in use by" in calls[0] and "\n" not in calls[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # every lock released


def test_the_whole_study_cannot_start_while_a_unit_job_holds_its_lock(tmp_path):
    calls = []
    with claim_run(tmp_path, shard=(3, 5), command="aspan study toy --unit 3"):
        with pytest.raises(ValueError, match=r"in use by 'aspan study toy --unit 3'"):
            toy_study(calls).run(Toy(), tmp_path, progress=False)
        toy_study(calls).run(Toy(), tmp_path, progress=False, unit="u1")  # another unit runs beside it
    assert calls == ["u1"]


def test_the_command_line_refuses_a_whole_run_beside_a_unit_job_and_trains_nothing(tmp_path, capsys):
    out = tmp_path / "p"
    with claim_run(out, shard=(2, 15), command="aspan study parity --unit 2"):  # the lock a `--unit 2` job holds
        before = snapshot(out)
        assert main(["study", "parity", "--quick", "--out", str(out), "--quiet"]) == 2
        one_line(capsys, f"run directory {out} is in use by 'aspan study parity --unit 2'")
        assert snapshot(out) == before


def test_a_unit_job_is_refused_while_the_whole_study_runs_in_another_process(tmp_path, capsys):
    """The whole study in a process of its own; once it holds every unit's lock, `--unit 3` is refused in one line
    naming it, and writes nothing; SIGTERM then stops the whole run (exit 143)."""
    out = tmp_path / "p"
    whole = subprocess.Popen([sys.executable, "-m", "aspan.cli", "study", "parity", "--quick", "--threads", "1",
                              "--out", str(out), "--quiet"], env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while len(list(out.glob(".aspan.shard-*-of-15.lock"))) < 15:
            assert whole.poll() is None and time.monotonic() < deadline, "the whole run never held every unit lock"
            time.sleep(0.1)
        assert main(["study", "parity", "--quick", "--threads", "1", "--out", str(out), "--unit", "3",
                     "--quiet"]) == 2
        one_line(capsys, f"run directory {out} is in use by", "aspan study parity --quick")
        assert not list(out.glob("*.unit-*"))
        whole.send_signal(signal.SIGTERM)
        assert whole.wait(timeout=120) == 143, whole.stderr.read()
    finally:
        if whole.poll() is None:
            whole.kill()
            whole.wait()


# ----------------------------------------------------------------------------------------------- foreign unit files
FOREIGN = ["rows.unit-15.jsonl", "rows.unit-99.jsonl", "rows.unit-abc.jsonl", "rows.unit-².jsonl",
           "rows.unit-007.jsonl", "rows.unit-.jsonl", "rows.unit-1.x.jsonl", "learning_curves.unit-20.jsonl",
           "rows.unit-" + "1" * 200 + ".jsonl"]


def write_units(out: Path, foreign: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows.jsonl").write_text(json.dumps({"key": "a"}) + "\n")
    unit_file(out, "rows.jsonl", 2).write_text(json.dumps({"key": "b"}) + "\n")
    (out / foreign).write_text(json.dumps({"key": "z"}) + "\n")


@pytest.mark.parametrize("foreign", FOREIGN, ids=lambda f: f[:30])
def test_the_merge_refuses_unit_files_that_are_not_the_studys_and_changes_nothing(tmp_path, foreign):
    units = study("parity").units(study("parity").config.quick(threads=1))
    assert len(units) == 15
    write_units(tmp_path, foreign)
    before = snapshot(tmp_path)
    with pytest.raises(UsageError) as e:
        merge_units(tmp_path, units, ("rows.jsonl", "learning_curves.jsonl"))
    assert str(e.value) == (f"{tmp_path / foreign}: not a unit file of this study (its units are 0-14); move it out "
                            f"of {tmp_path}")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("argv", [[], ["--unit", "0"]], ids=["whole", "unit"])
def test_the_command_line_refuses_a_foreign_unit_file_in_one_line_and_writes_nothing(tmp_path, capsys, argv):
    out = tmp_path / "p"
    write_units(out, "rows.unit-99.jsonl")
    before = snapshot(out)
    assert main(["study", "parity", "--quick", "--threads", "1", "--out", str(out), "--quiet", *argv]) == 2
    one_line(capsys, "rows.unit-99.jsonl: not a unit file of this study (its units are 0-14)")
    assert snapshot(out) == before


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(suffix=st.text(string.ascii_letters + string.digits + "²٣-_.", max_size=4))
def test_only_the_studys_own_unit_files_are_merged(tmp_path_factory, suffix):
    out = tmp_path_factory.mktemp("run")
    units = [Unit(f"u{i}", 0) for i in range(5)]
    (out / "rows.jsonl").write_text(json.dumps({"key": "a"}) + "\n")
    name = f"rows.unit-{suffix}.jsonl"
    (out / name).write_text(json.dumps({"key": "z"}) + "\n")
    before = snapshot(out)
    own = suffix in {"0", "1", "2", "3", "4"}
    try:
        merged = merge_units(out, units, ("rows.jsonl",))
    except UsageError as e:
        assert not own and str(e).startswith(f"{out / name}: not a unit file") and snapshot(out) == before
    else:
        assert own and merged == 1 and not (out / name).exists()
        assert [json.loads(x)["key"] for x in (out / "rows.jsonl").read_text().splitlines()] == ["a", "z"]
