"""`scripts/slurm_local.sh`: `stop` stops exactly what `start` started. A second cluster, next to the session's
(tests/cluster/conftest.py), is started in a directory of its own: its slurmctld, slurmd and its own munged run from
their pid files there; `stop` ends all three and removes the pid files, and every munged that was running before
(the system's, the session cluster's) is still running."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.cluster.conftest import SCRIPT, _free_port_pair

PID_FILES = {"slurmctld": "slurmctld.pid", "slurmd": "slurmd.pid", "munged": "munge/munged.pid"}


def _mungeds() -> set[int]:
    """The munged processes running now (a daemon's exited first fork, a zombie until reaped, is not one)."""
    done = subprocess.run(["pgrep", "-x", "munged"], capture_output=True, text=True)
    return {int(pid) for pid in done.stdout.split() if _running(int(pid))}


def _running(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_stop_stops_what_start_started_and_nothing_else(slurm, tmp_path):
    session_munged = int((slurm / PID_FILES["munged"]).read_text())
    assert _running(session_munged) and session_munged in _mungeds()  # the session's cluster has its own munged
    before = _mungeds()
    directory = tmp_path / "cluster"
    env = {**os.environ, "SLURM_LOCAL_DIR": str(directory), "SLURM_LOCAL_PORT": str(_free_port_pair())}
    started = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=300)
    try:
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip() == f"export SLURM_CONF={directory / 'slurm.conf'}"
        pids = {name: int((directory / file).read_text()) for name, file in PID_FILES.items()}
        for name, pid in pids.items():
            assert _running(pid) and Path(f"/proc/{pid}/comm").read_text().strip() == name, (name, pid)
        assert pids["munged"] not in before  # start launched a munged of its own
        conf = (directory / "slurm.conf").read_text()
        assert f"AuthInfo=socket={directory / 'munge' / 'munge.socket'}" in conf.splitlines()
        job = subprocess.run(["sbatch", "--parsable", "--wait", "-o", "/dev/null", "--wrap", "true"], timeout=120,
                             env={**env, "SLURM_CONF": str(directory / "slurm.conf")}, capture_output=True, text=True)
        assert job.returncode == 0, job.stderr  # the cluster authenticates through that munged
    finally:
        stopped = subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [name for name, pid in pids.items() if _running(pid)], "still running after stop"
    assert not [file for file in PID_FILES.values() if (directory / file).exists()]
    assert {pid for pid in before if _running(pid)} == before, "stop ended a munged it had not started"
