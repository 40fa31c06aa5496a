"""`aspan study abc --protocol paper --quick --launcher slurm` on a real one-node Slurm (tests/cluster/conftest.py):
its units as two job arrays (vanilla and ABS, then ABC on the vanilla models); a unit's task cancelled with `scancel`
is resubmitted alone and completes; a second launch on the held directory is refused in one line; the merged run
directory equals a one-machine run's: the same rows (timings aside), the same table and the same files."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from aspan.applications.launch import queued_jobs
from aspan.cli import main

ARGV = ["study", "abc", "--protocol", "paper", "--quick", "--threads", "1", "--quiet"]
TIMING = ("wall_s", "time")


def rows(out: Path, name: str) -> list[dict]:
    """The distinct rows of row file `name`, timings aside (checks.jsonl logs every check as it happens: a training
    cancelled after a check and resumed from its last checkpoint logs that check again, as a local run would)."""
    found = {json.dumps({k: v for k, v in json.loads(line).items() if k not in TIMING}, sort_keys=True)
             for line in (out / name).read_text().splitlines() if line.strip()}
    return [json.loads(r) for r in sorted(found)]


def files(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*")}


def running_unit(out: Path, timeout: float = 300) -> str:
    """The id of a running task of `out`'s first stage, once there is one."""
    deadline = time.monotonic() + timeout
    state_file = out / ".slurm" / "stage-1" / "launch.json"
    while time.monotonic() < deadline:
        if state_file.exists():
            mine = set(json.loads(state_file.read_text())["jobs"].values())
            found = [j for j, s in queued_jobs().items() if j in mine and s == "RUNNING"]
            if found:
                return found[0]
        time.sleep(0.2)
    raise AssertionError(f"no task of {out} ran in {timeout} s")


def test_the_quick_paper_study_through_slurm_survives_a_cancelled_unit_and_equals_a_local_run(slurm, tmp_path,
                                                                                               capsys):
    on_slurm, local, log = tmp_path / "slurm", tmp_path / "local", tmp_path / "launcher.err"
    cmd = [sys.executable, "-m", "aspan.cli", *ARGV, "--out", str(on_slurm), "--launcher", "slurm", "--poll", "0.5",
           "--time", "10", "--array-parallelism", "1", "--max-retries", "1"]
    with log.open("w") as err:
        launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            cancelled = running_unit(on_slurm)
            subprocess.run(["scancel", cancelled], check=True, timeout=60)
            assert main([*ARGV, "--out", str(on_slurm), "--launcher", "slurm"]) == 2
            refused = capsys.readouterr().err.strip().splitlines()
            assert len(refused) == 1 and f"run directory {on_slurm} is in use by" in refused[0], refused
            launcher.wait(timeout=600)
        finally:
            if launcher.poll() is None:
                launcher.kill()
    assert launcher.returncode == 0, log.read_text()[-3000:]
    assert f"task {cancelled} ended with its shard unfinished" in log.read_text()
    assert log.read_text().count("resubmitting") == 1

    assert main([*ARGV, "--out", str(local)]) == 0
    capsys.readouterr()
    for name in ("runs.jsonl", "checks.jsonl", "positions.jsonl"):
        assert len(rows(local, name)) >= 3 and rows(on_slurm, name) == rows(local, name), name
    assert (on_slurm / "table.csv").read_text() == (local / "table.csv").read_text()
    assert files(on_slurm) == files(local)  # no unit file, no submitit folder left
