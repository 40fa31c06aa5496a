"""Every value that reaches the batch script of `--launcher slurm` is checked before anything is submitted: no control
character (a newline would become a line of its own in the script every array task runs), each setting's type and
range, extra sbatch options that are words and not the launcher's own; the launch state (`.slurm/launch.json`) is
checked on read; `sbatch` runs with a time limit, and a failed, silent or hung submission ends in one line with no
`.slurm/` folder left. Run against stand-ins for `sbatch`, `squeue` and `srun` on PATH (shell scripts that record
their calls); the real one-node Slurm runs are in tests/cluster."""
from __future__ import annotations

import json
import math
import stat
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspan.applications import launch, sbatch
from aspan.applications.slurm import LIMITS, SlurmResources, control_character, load_resources
from aspan.cli import main
from aspan.errors import UsageError

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
CONTROL = [chr(c) for c in (*range(0x20), 0x7F, 0x85, 0x9F)] + ["\u2028", "\u2029"]

FAKE_SBATCH = """#!/bin/sh
# a stand-in for sbatch: records its arguments and the script, then answers as the test says
for a; do last=$a; done
echo "$@" >> "{log}"
/bin/cp "$last" "{script}"
[ -n "$FAKE_SLEEP" ] && exec /bin/sleep "$FAKE_SLEEP"
[ -n "$FAKE_ERR" ] && echo "sbatch: error: $FAKE_ERR" >&2 && exit 1
echo "${{FAKE_OUT-4242}}"
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch) -> Path:
    """`sbatch` (recording into `calls.log`, the last script into `script.sh`), `squeue` (an empty queue) and `srun`,
    alone on PATH (a Slurm installed on the machine stays out of sight); returns their folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {"sbatch": FAKE_SBATCH.format(log=bin_dir / "calls.log", script=bin_dir / "script.sh"),
               "squeue": "#!/bin/sh\nexit 0\n", "srun": "#!/bin/sh\nexit 0\n"}
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", str(bin_dir))
    for var in ("FAKE_SLEEP", "FAKE_ERR", "FAKE_OUT"):
        monkeypatch.delenv(var, raising=False)
    return bin_dir


def submitted(bin_dir: Path) -> int:
    log = bin_dir / "calls.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def one_line_error(capsys, *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.count("\n") == 0 and err.startswith("aspan "), err
    for w in words:
        assert w in err, (w, err)
    return err


def study(out: Path, *flags: str) -> int:
    """`aspan study parity --quick` launched on Slurm without waiting (cheap: nothing trains in this process)."""
    return main(["study", "parity", "--quick", "--out", str(out), "--launcher", "slurm", "--no-wait", "--quiet",
                 *flags])


# ----------------------------------------------------------------------------------------------- values, properties
def toml_string(text: str) -> str:
    """`text` as a TOML basic string (every character escaped, so any text can be written)."""
    return '"' + "".join(f"\\u{ord(c):04X}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08X}" for c in text) + '"'


text = st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",)), max_size=12)
with_control = st.builds(lambda a, c, b: a + c + b, text, st.sampled_from(CONTROL), text)


@FAST
@given(value=st.one_of(text, with_control), key=st.sampled_from(["partition", "mem", "sbatch"]))
def test_a_value_that_passes_never_adds_a_line_to_the_batch_script(tmp_path, value, key):
    """Whatever string a `[slurm]` table gives, either the loader refuses it in one line naming the file and key, or
    the batch script built from it has exactly the lines of the script without it (one `#SBATCH` line each)."""
    from submitit.slurm.slurm import _make_sbatch_string

    path = tmp_path / "s.toml"
    path.write_text(f"[slurm]\n{key} = {toml_string(value)}\n" if key != "sbatch" else
                    f"[slurm]\nsbatch = {{account = {toml_string(value)}}}\n")
    try:
        resources = load_resources(path, {})
    except UsageError as e:
        assert "\n" not in str(e) and f"{path}: [slurm]" in str(e)
        if control_character(value) is not None:
            assert "control character" in str(e)
        return
    assert control_character(value) is None
    plain = _make_sbatch_string(command="run", folder=tmp_path, **SlurmResources(
        partition="p" if resources.partition else None, mem="1G" if resources.mem else None,
        sbatch={"account": "a"} if key == "sbatch" else {}).executor_parameters())
    script = _make_sbatch_string(command="run", folder=tmp_path, **resources.executor_parameters())
    assert len(script.splitlines()) == len(plain.splitlines())
    assert [line.split("=")[0] for line in script.splitlines()] == [line.split("=")[0] for line in plain.splitlines()]


@FAST
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10**6)))
def test_poll_is_a_finite_positive_number_of_at_most_an_hour(value):
    ok = math.isfinite(value) and 0 < value <= 3600
    try:
        load_resources(None, {"poll": value})
    except UsageError as e:
        assert not ok and str(e).startswith("--poll: poll must be") and "\n" not in str(e)
    else:
        assert ok


@FAST
@given(name=st.sampled_from(["time", "cpus", "gpus", "array_parallelism", "array_tasks", "max_retries"]),
       value=st.one_of(st.integers(-5, 10**12), st.booleans(), st.floats(0, 10), st.text(max_size=3)))
def test_counts_are_integers_in_their_range_from_a_table_or_a_flag(tmp_path, name, value):
    least, most = LIMITS[name]
    ok = isinstance(value, int) and not isinstance(value, bool) and least <= value <= most
    path = tmp_path / "s.toml"
    path.write_text(f"[slurm]\n{name} = {toml_value(value)}\n")
    for source, where in ((lambda: load_resources(path, {}), f"{path}: [slurm]"),
                          (lambda: load_resources(None, {name: value}), f"--{name.replace('_', '-')}")):
        try:
            got = source()
        except UsageError as e:
            assert not ok and str(e).startswith(where) and name in str(e) and "\n" not in str(e), str(e)
        else:
            assert ok and getattr(got, name) == value


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return toml_string(value) if isinstance(value, str) else repr(value)


@pytest.mark.parametrize("key, message", [
    ("array", "set by the launcher itself"), ("output", "set by the launcher itself"),
    ("job_name", "set by the launcher itself"), ("time", "use time"), ("cpus-per-task", "use cpus"),
    ("a b", "must be a word"), ("--qos", "must be a word"), ("ac²count", "must be a word"), ("", "must be a word"),
])
def test_extra_sbatch_options_are_words_and_never_the_launchers_own(key, message):
    with pytest.raises(UsageError, match=message):
        load_resources(None, {"sbatch": {key: "x"}})


def test_valid_resources_load_as_before(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[slurm]\npartition = "gpu,debug"\ntime = 240\nmem = "16G"\npoll = 0.5\n'
                    'sbatch = {account = "lab", mail-type = "END,FAIL", qos = "low"}\n')
    got = load_resources(path, {"sbatch": {"comment": "a run with spaces and 'quotes'"}, "gpus": 2})
    assert (got.partition, got.time, got.mem, got.poll, got.gpus) == ("gpu,debug", 240, "16G", 0.5, 2)
    assert got.sbatch == {"account": "lab", "mail-type": "END,FAIL", "qos": "low",
                          "comment": "a run with spaces and 'quotes'"}


# ----------------------------------------------------------------------------------------------- the command line
@pytest.mark.parametrize("toml, flags, words", [
    ('[slurm]\nsbatch = {account = "lab\\necho pwned"}\n', [], ["s.toml: [slurm]", "account", "U+000A"]),
    ('[slurm]\npartition = "gpu\\rx"\n', [], ["s.toml: [slurm]", "partition", "U+000D"]),
    ('[slurm]\npoll = nan\n', [], ["s.toml: [slurm]", "poll", "must be a finite number"]),
    ('[slurm]\npoll = inf\n', [], ["s.toml: [slurm]", "poll", "must be a finite number"]),
    ('[slurm]\nmem = "16G; rm -rf ~"\n', [], ["s.toml: [slurm]", "mem must be a size"]),
    ('[slurm]\narray_parallelism = 1000000000000\n', [], ["array_parallelism must be at most"]),
    ('', ["--sbatch", "account=lab\necho pwned"], ["--sbatch: sbatch option 'account'", "U+000A"]),
    ('', ["--partition", "gpu\necho pwned"], ["--partition: partition", "U+000A"]),
    ('', ["--mem", "16G\x7f"], ["--mem: mem", "U+007F"]),
    # a bad flag is blamed on the flag, not on the config file that also gives sbatch options
    ('[slurm]\nsbatch = {account = "lab"}\n', ["--sbatch", "a b=1"], ["--sbatch: sbatch option 'a b'"]),
])
def test_a_bad_value_is_refused_in_one_line_before_anything_is_written_or_submitted(tmp_path, capsys, fake_slurm,
                                                                                    toml, flags, words):
    config = tmp_path / "s.toml"
    config.write_text(toml)
    out = tmp_path / "run"
    assert study(out, "--config", str(config), *flags) == 2
    err = one_line_error(capsys, *words)
    if flags and flags[0] == "--sbatch" and toml:
        assert "s.toml" not in err
    assert not out.exists() and submitted(fake_slurm) == 0


def test_a_valid_launch_submits_one_array_whose_script_has_only_sbatch_lines(tmp_path, capsys, fake_slurm):
    config = tmp_path / "s.toml"
    config.write_text('[slurm]\nsbatch = {account = "lab", comment = "a; b $(c) `d`"}\n')
    out = tmp_path / "run"
    assert study(out, "--config", str(config), "--partition", "debug") == 0
    assert capsys.readouterr().out.strip() == "4242"
    assert submitted(fake_slurm) == 1 and "--parsable" in (fake_slurm / "calls.log").read_text()
    script = (fake_slurm / "script.sh").read_text().splitlines()
    params = [line for line in script[3:script.index("# command")] if line]
    assert all(line.startswith("#SBATCH --") for line in params), params
    assert "#SBATCH --comment='a; b $(c) `d`'" in params and "#SBATCH --partition=debug" in params
    stage = out / ".slurm" / "stage-1"
    state = json.loads((stage / "launch.json").read_text())
    assert state["tasks"] == 10 and state["jobs"] == {str(i): f"4242_{i}" for i in range(10)}
    assert sorted(p.name for p in stage.glob("*_submitted.pkl")) == sorted(f"4242_{i}_submitted.pkl"
                                                                          for i in range(10))
    assert (stage / "4242_submission.sh").exists() and not list(stage.glob(".submitting-*"))


@pytest.mark.parametrize("env, words", [
    ({"FAKE_OUT": "queued"}, ["sbatch printed no job id", "'queued'"]),
    ({"FAKE_OUT": ""}, ["sbatch printed no job id", "'nothing'"]),
    ({"FAKE_ERR": "Batch job submission failed: Invalid account"}, ["sbatch failed: Batch job submission failed"]),
])
def test_a_failed_or_silent_submission_ends_in_one_line_and_leaves_nothing(tmp_path, capsys, fake_slurm, monkeypatch,
                                                                          env, words):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "run"
    assert study(out) == 2
    one_line_error(capsys, *words)
    assert submitted(fake_slurm) == 1 and not out.exists()


def test_sbatch_that_hangs_is_stopped_at_its_time_limit(tmp_path, capsys, fake_slurm, monkeypatch):
    monkeypatch.setenv("FAKE_SLEEP", "60")
    monkeypatch.setattr(sbatch, "SBATCH_TIMEOUT_S", 1.0)
    out = tmp_path / "run"
    start = time.monotonic()
    assert study(out) == 2
    assert time.monotonic() - start < 30
    one_line_error(capsys, "sbatch did not answer within 1 s")
    assert not out.exists()


@pytest.mark.parametrize("missing", ["srun", "sbatch", "squeue"])
def test_a_missing_slurm_command_is_named_before_anything_is_written(tmp_path, capsys, fake_slurm, missing):
    (fake_slurm / missing).unlink()
    out = tmp_path / "run"
    assert study(out) == 2
    one_line_error(capsys, f"{missing} not found: --launcher slurm runs on a Slurm login node")
    assert not out.exists() and submitted(fake_slurm) == 0


def test_a_failed_resubmission_keeps_the_stage_folder_of_the_earlier_submission(tmp_path, capsys, fake_slurm,
                                                                                 monkeypatch):
    out = tmp_path / "run"
    assert study(out) == 0
    before = sorted(p.name for p in (out / ".slurm" / "stage-1").iterdir())
    monkeypatch.setenv("FAKE_ERR", "Socket timed out")  # the queue is empty: every unit is submitted again
    assert study(out) == 2
    one_line_error(capsys, "sbatch failed: Socket timed out")
    assert sorted(p.name for p in (out / ".slurm" / "stage-1").iterdir()) == before


def test_a_run_directory_path_that_cannot_stand_in_the_script_is_refused(tmp_path, capsys, fake_slurm):
    for name, words in (("a\nb", ["the run directory's path", "U+000A"]), ("a%Ab", ["holds a %"])):
        out = tmp_path / name
        assert study(out) == 2
        one_line_error(capsys, *words)
        assert not out.exists() and submitted(fake_slurm) == 0


# ----------------------------------------------------------------------------------------------- the launch state
@pytest.mark.parametrize("state, words", [
    ({"tasks": 1e9, "jobs": {}}, ["tasks must be an integer from 1 to 100000, got 1000000000.0"]),
    ({"tasks": 1000000000, "jobs": {}}, ["tasks must be an integer from 1 to 100000"]),
    ({"tasks": 0, "jobs": {}}, ["tasks must be an integer from 1 to 100000, got 0"]),
    ({"tasks": True, "jobs": {}}, ["tasks must be an integer"]),
    ({"tasks": "10", "jobs": {}}, ["tasks must be an integer"]),
    ({"jobs": {}}, ["tasks must be an integer", "got None"]),
    ({"tasks": 3, "jobs": {}}, ["tasks is 3, but this array has 10"]),
    ({"tasks": 10, "jobs": {"12": "7"}}, ["jobs: '12' is not a shard of 0-9"]),
    ({"tasks": 10, "jobs": {"²": "7"}}, ["jobs: '²' is not a shard of 0-9"]),
    ({"tasks": 10, "jobs": {"1": "7; rm -rf ~"}}, ["jobs: shard 1's '7; rm -rf ~' is not a Slurm job id"]),
    ({"tasks": 10, "jobs": {"1": 7}}, ["is not a Slurm job id"]),
    ({"tasks": 10, "jobs": ["7"]}, ["not a launch state"]),
    ([1, 2], ["not a launch state"]),
])
def test_a_tampered_launch_state_is_refused_by_key_in_one_line(tmp_path, capsys, fake_slurm, state, words):
    out = tmp_path / "run"
    assert study(out) == 0  # a launch; its state file then tampered with
    capsys.readouterr()
    state_file = out / ".slurm" / "stage-1" / "launch.json"
    state_file.write_text(json.dumps(state))
    assert study(out) == 2
    one_line_error(capsys, str(state_file), *words, "remove it to start the array afresh")
    assert submitted(fake_slurm) == 1


def test_a_launch_state_of_the_right_shape_is_adopted(tmp_path, capsys, fake_slurm, monkeypatch):
    out = tmp_path / "run"
    assert study(out) == 0
    capsys.readouterr()
    monkeypatch.setattr(launch, "queued_jobs", lambda: {f"4242_{i}": "PENDING" for i in range(10)})
    assert study(out) == 0  # every unit's task still queued: adopted, nothing submitted again
    assert capsys.readouterr().out.strip() == "nothing submitted: every shard is finished or already queued"
    assert submitted(fake_slurm) == 1
