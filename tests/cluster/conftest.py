"""A real one-node Slurm for the tests of `--launcher slurm`: `scripts/slurm_local.sh start` (which installs Debian's
slurm-wlm and munge when they are missing and the tests run as root) on a free port pair, in a directory of its own,
`SLURM_CONF` pointing at it for the session; stopped at the end. Where it cannot start, the tests skip with the
script's reason, except under CI (`CI` set and not "false"), where that is a failure: CI must run them."""
from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm_local.sh"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"Slurm is needed under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _free_port_pair() -> int:
    """A port P with P and P + 1 free (slurmctld, slurmd)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free pair of ports")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """The directory of a running one-node Slurm (2 CPUs); `SLURM_CONF` names its configuration."""
    if os.geteuid() != 0:
        _unavailable("a one-node Slurm needs root (slurmd runs jobs as their users)")
    directory = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "SLURM_LOCAL_DIR": str(directory), "SLURM_LOCAL_PORT": str(_free_port_pair())}
    done = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120)
        _unavailable((done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1])
    patch = pytest.MonkeyPatch()
    patch.setenv("SLURM_CONF", str(directory / "slurm.conf"))
    try:
        yield directory
    finally:
        patch.undo()
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120)
