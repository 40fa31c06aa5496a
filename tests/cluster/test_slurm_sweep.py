"""`aspan sweep --launcher slurm` on a real one-node Slurm (tests/cluster/conftest.py): the merged run directory equals
a one-machine run's, a task cancelled with `scancel` is resubmitted alone and completes with no row lost or repeated,
a second launch on a held directory is refused in one line, and a rerun adopts queued tasks and reruns no finished
shard."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aspan.applications import launch
from aspan.applications.launch import queued_jobs
from aspan.applications.sweep import SweepRun, run_sweep_dir
from aspan.cli import main
from aspan.experiments.sweep import SweepConfig, grid

# Four grid points (two strengths, two offsets) of the tiny test model on two OOD samples: seconds per task.
CONFIG = """model = "{ckpt}"
task = "reversal"
split = "ood"
task_params = {{length = [11, 12]}}
n_samples = 2
seeds = [0]
batch_size = 2
strengths = [0.5, 3.0]
deltas = [0, 2]
device = "cpu"
[heads]
list = [[0, 0]]
[slurm]
time = 10
poll = 0.5
"""


@pytest.fixture
def toml(ckpt, tmp_path) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(CONFIG.format(ckpt=ckpt))
    return path


def rows(out: Path) -> list[dict]:
    """The rows of `out`'s sweep.jsonl, in file order, without their timing."""
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (out / "sweep.jsonl").read_text().splitlines()]


def files(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*")}


def array_task(out: Path, state: str, timeout: float = 300) -> str:
    """The id of a task of `out`'s array in Slurm state `state`, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state_file = out / ".slurm" / "launch.json"
        if state_file.exists():
            mine = set(json.loads(state_file.read_text())["jobs"].values())
            found = [j for j, s in queued_jobs().items() if j in mine and s == state]
            if found:
                return found[0]
        time.sleep(0.2)
    raise AssertionError(f"no task of {out} became {state} in {timeout} s")


def test_a_slurm_sweep_survives_a_cancelled_task_and_equals_a_local_run(slurm, toml, tmp_path, capsys):
    out = tmp_path / "slurm"
    log = tmp_path / "launcher.err"
    cmd = [sys.executable, "-m", "aspan.cli", "sweep", "--config", str(toml), "--out", str(out), "--launcher", "slurm",
           "--array-tasks", "2", "--array-parallelism", "1", "--max-retries", "1", "--quiet"]
    with log.open("w") as err:
        launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            running = array_task(out, "RUNNING")
            subprocess.run(["scancel", running], check=True, timeout=60)
            # a second launch while the first holds the directory: one line, nothing submitted
            assert main(["sweep", "--config", str(toml), "--out", str(out), "--launcher", "slurm", "--quiet"]) == 2
            refused = capsys.readouterr().err.strip().splitlines()
            assert len(refused) == 1 and f"run directory {out} is in use by" in refused[0], refused
            launcher.wait(timeout=600)
        finally:
            if launcher.poll() is None:
                launcher.kill()
    assert launcher.returncode == 0, log.read_text()[-3000:]
    assert f"task {running} ended with its shard unfinished" in log.read_text()
    assert log.read_text().count("resubmitting") == 1  # the cancelled task alone (the other was pending, then ran)

    local = tmp_path / "local"
    config = SweepConfig.from_toml(toml)
    run_sweep_dir(config, local, SweepRun(config_file=str(toml), progress=False))
    assert len(rows(out)) == len(grid(config)) == 4
    assert rows(out) == rows(local)  # same keys, values and order: no row lost or repeated
    summary = {p: json.loads((p / "summary.json").read_text()) for p in (out, local)}
    assert summary[out] == summary[local]
    assert files(out) == files(local)  # no shard file, no submitit folder left: the directory of a one-machine run


def test_no_wait_then_a_rerun_adopts_the_queued_tasks_and_reruns_no_finished_shard(slurm, toml, tmp_path, capsys,
                                                                                    monkeypatch):
    out = tmp_path / "run"
    assert main(["sweep", str(toml), "--out", str(out), "--launcher", "slurm", "--array-tasks", "2", "--no-wait"]) == 0
    job_ids = capsys.readouterr().out.split()
    assert len(job_ids) == 1 and job_ids[0].isdigit(), job_ids  # the array's job id
    assert not (out / "sweep.jsonl").exists()
    submitted = []
    original = launch._submit
    monkeypatch.setattr(launch, "_submit", lambda plan, shards, *a: submitted.append(shards) or original(
        plan, shards, *a))
    # at once: both tasks queued or running, adopted; nothing submitted again
    assert main(["sweep", str(toml), "--out", str(out), "--launcher", "slurm", "--quiet"]) == 0
    assert submitted == [] and len(rows(out)) == 4 and not (out / ".slurm").exists()
    # once complete: a rerun computes nothing and submits nothing
    before = (out / "sweep.jsonl").read_bytes()
    assert main(["sweep", str(toml), "--out", str(out), "--launcher", "slurm", "--quiet"]) == 0
    assert submitted == [] and (out / "sweep.jsonl").read_bytes() == before


def test_a_submission_slurm_refuses_ends_in_one_line_and_leaves_no_run_directory(slurm, toml, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["sweep", "--config", str(toml), "--out", str(out), "--launcher", "slurm", "--partition", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "aspan sweep: error: sbatch failed: Batch job submission failed: Invalid partition name specified"
    assert not out.exists()


def test_a_value_that_would_break_the_script_never_reaches_the_queue_and_shell_text_stays_a_value(slurm, toml,
                                                                                                 tmp_path, capsys):
    marker = tmp_path / "marker"
    before = queued_jobs()
    out = tmp_path / "bad"
    assert main(["sweep", "--config", str(toml), "--out", str(out), "--launcher", "slurm", "--sbatch",
                 f"comment=a\ntouch {marker}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("aspan sweep: error: --sbatch: sbatch option 'comment' holds the control character U+000A")
    assert "\n" not in err and not out.exists() and queued_jobs() == before
    value = f"a; touch {marker} $(touch {marker}) `touch {marker}`"
    out = tmp_path / "run"
    assert main(["sweep", "--config", str(toml), "--out", str(out), "--launcher", "slurm", "--array-tasks", "1",
                 "--no-wait", "--sbatch", f"comment={value}"]) == 0
    job = capsys.readouterr().out.strip()
    try:
        shown = subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%k"], capture_output=True, text=True,
                               timeout=60, check=True).stdout.splitlines()
    finally:
        subprocess.run(["scancel", job], timeout=60, check=True)
    assert shown == [value] and not marker.exists()  # one sbatch option, verbatim; no shell ran it
