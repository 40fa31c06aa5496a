"""Running the command line in a subprocess, as a user does, for the tests of its errors and writes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# this checkout's package first (not whatever else is installed), then the caller's own path (CI's TransformerLens
# 4.3 overlay), one thread per process on the 2-core machine
PYTHONPATH = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
ENV = {**os.environ, "PYTHONPATH": PYTHONPATH, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# the small training run of the command-line tests
SMALL = ["--task", "reversal", "--param", "length=1-3", "--param", "charset=abcd", "--d-model", "16", "--n-heads", "2",
         "--n-layers", "1", "--batch-size", "4", "--eval-samples", "0", "--quiet", "--threads", "1"]


def aspan(*args: str, cwd: Path, code: str | None = None, **kw) -> subprocess.CompletedProcess:
    """`aspan ARGS` in a subprocess (`code`, when given, runs first in the same interpreter, e.g. a monkeypatch);
    keywords go to `subprocess.run` (env, timeout, input)."""
    main = "import sys\nfrom aspan.cli import main\nsys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", f"{code}\n{main}"] if code else [sys.executable, "-m", "aspan.cli"]
    return subprocess.run([*cmd, *args], cwd=cwd, **{"env": ENV, "capture_output": True, "text": True,
                                                     "timeout": 300, **kw})


def one_line(err: str, *words: str) -> None:
    """stderr is exactly one line, no traceback, and names every one of `words`."""
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    for w in words:
        assert w in err, (w, err)


def aspan_peak(*args: str, cwd: Path, code: str = "") -> tuple[int, str, int]:
    """(exit code, stderr, peak resident memory in bytes) of `aspan ARGS` in a subprocess (`code` runs first, as in
    `aspan`): the child's own VmHWM, written at exit (the `ru_maxrss` that `wait4` reports also counts the forking
    parent's memory: in a whole test session, the test runner's gigabytes)."""
    peak = cwd / "vmhwm.txt"
    hwm = "next(line for line in open('/proc/self/status') if line.startswith('VmHWM'))"
    record = f"import atexit\natexit.register(lambda: open({str(peak)!r}, 'w').write({hwm}))"
    r = aspan(*args, cwd=cwd, code=f"{code}\n{record}")
    kib = int(peak.read_text().split()[1])
    peak.unlink()
    return r.returncode, r.stderr, kib * 1024
