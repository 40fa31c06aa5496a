"""Running the command line in a subprocess, as a user does, for the tests of its errors and writes."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# this checkout's package first (not whatever else is installed), then the caller's own path (CI's TransformerLens
# 4.3 overlay), one thread per process on the 2-core machine
PYTHONPATH = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
ENV = {**os.environ, "PYTHONPATH": PYTHONPATH, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# the small training run of the command-line tests
SMALL = ["--task", "reversal", "--param", "length=1-3", "--param", "charset=abcd", "--d-model", "16", "--n-heads", "2",
         "--n-layers", "1", "--batch-size", "4", "--eval-samples", "0", "--quiet", "--threads", "1"]


def aspan(*args: str, cwd: Path, code: str | None = None, peak: Path | None = None,
          **kw) -> subprocess.CompletedProcess:
    """`aspan ARGS` in a subprocess (`code`, when given, runs first in the same process, e.g. a monkeypatch of a
    module attribute; `peak`, when given, receives the process's VmHWM line at exit); keywords go to
    `subprocess.run` (env, timeout, input). A call in the default environment (but for ASPAN_BACKEND) runs in a
    process forked from a warm interpreter (`Zygote`) instead of a fresh one."""
    if ZYGOTE_ON and set(kw) <= {"env", "timeout", "input"} and _same_env(kw.get("env", ENV)):
        return _zygote().run(Job(list(args), cwd, kw.get("env", ENV), kw.get("input"), code, peak),
                             kw.get("timeout", 300))
    hwm = "next(line for line in open('/proc/self/status') if line.startswith('VmHWM'))"
    record = f"import atexit\natexit.register(lambda: open({str(peak)!r}, 'w').write({hwm}))\n" if peak else ""
    main = "import sys\nfrom aspan.cli import main\nsys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", f"{code or ''}\n{record}{main}"] if code or peak else [sys.executable, "-m",
                                                                                       "aspan.cli"]
    return subprocess.run([*cmd, *args], cwd=cwd, **{"env": ENV, "capture_output": True, "text": True,
                                                     "timeout": 300, **kw})


def one_line(err: str, *words: str) -> None:
    """stderr is exactly one line, no traceback, and names every one of `words`."""
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    for w in words:
        assert w in err, (w, err)


def aspan_peak(*args: str, cwd: Path, code: str | None = None) -> tuple[int, str, int]:
    """(exit code, stderr, peak resident memory in bytes) of `aspan ARGS` in a subprocess (`code` runs first, as in
    `aspan`): the child's own VmHWM, written at exit (the `ru_maxrss` that `wait4` reports also counts the forking
    parent's memory: in a whole test session, the test runner's gigabytes). A child forked from the zygote starts
    its VmHWM afresh at the fork, from the pages it shares with the zygote: the imports a fresh interpreter makes."""
    peak = cwd / "vmhwm.txt"
    r = aspan(*args, cwd=cwd, code=code, peak=peak)
    kib = int(peak.read_text().split()[1])
    peak.unlink()
    return r.returncode, r.stderr, kib * 1024


# ----------------------------------------------------------------------------------------------- warm start
# Importing torch and TransformerLens takes 5-8 s of CPU, more than most commands under test spend working. A zygote
# imports them once per test process; each call forks it, so the child starts warm yet runs `aspan.cli.main` in a
# process of its own (own cwd, environment, stdin/stdout/stderr files, exit code), as the fresh interpreter would.
# `code` (a monkeypatch) runs in the child before the command; calls that change the environment beyond ASPAN_BACKEND
# still start a fresh interpreter.
# ASPAN_TEST_FRESH=1 turns the zygote off.
ZYGOTE_ON = os.environ.get("ASPAN_TEST_FRESH", "") != "1" and hasattr(os, "fork")
_ZYGOTE_SRC = r"""
import json, os, sys, traceback
import torch, transformer_lens  # the slow imports, once
import aspan.cli
requests = os.fdopen(0, "r")
replies = os.fdopen(int(sys.argv[1]), "w")
for line in requests:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            for fd, name, mode in ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY), (2, "stderr", os.O_WRONLY)):
                os.dup2(os.open(job[name], mode), fd)
            sys.stdin, sys.stdout, sys.stderr = (open(0, "r", closefd=False), open(1, "w", closefd=False),
                                                 open(2, "w", closefd=False))
            sys.argv = ["aspan", *job["args"]]
            try:
                if job["code"]:
                    exec(compile(job["code"], "<test code>", "exec"), {"__name__": "__test_code__"})
                code = aspan.cli.main(job["args"])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, int) and e.code is not None:
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
                code = 1
        finally:
            for f in (sys.stdout, sys.stderr):
                try:
                    f.flush()
                except Exception:
                    pass
            if job["peak"]:
                with open(job["peak"], "w") as f:
                    f.write(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")))
            os._exit(code if isinstance(code, int) else 1)
    replies.write(json.dumps({"pid": pid}) + "\n")
    replies.flush()
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
    replies.flush()
"""


def _same_env(env: dict) -> bool:
    """Whether `env` is the zygote's environment but for ASPAN_BACKEND (read when a command runs, not at import)."""
    strip = lambda e: {k: v for k, v in e.items() if k != "ASPAN_BACKEND"}  # noqa: E731
    return strip(env) == strip(ENV)


@dataclass(frozen=True)
class Job:
    """One command for the zygote: its arguments, working directory, environment, stdin text, the code to run first
    and where to write the peak memory (both optional)."""

    args: list[str]
    cwd: Path
    env: dict
    stdin: str | None
    code: str | None = None
    peak: Path | None = None


class Zygote:
    """A warm interpreter that forks one child per command (see above)."""

    def __init__(self):
        read, write = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE_SRC, str(write)], stdin=subprocess.PIPE,
                                     env=ENV, text=True, pass_fds=(write,), cwd=ROOT)
        os.close(write)
        self.replies, self.buffer = read, b""

    def reply(self, timeout: float | None = None) -> dict | None:
        """The zygote's next reply line (unbuffered reads, so `select` sees what is not read yet); None on timeout."""
        import json
        import select

        while b"\n" not in self.buffer:
            if not select.select([self.replies], [], [], timeout)[0]:
                return None
            chunk = os.read(self.replies, 4096)
            if not chunk:
                raise RuntimeError("the test zygote died")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, job: "Job", timeout: float):
        import json
        import tempfile

        args = job.args
        with tempfile.TemporaryDirectory() as tmp:
            files = {name: Path(tmp) / name for name in ("stdin", "stdout", "stderr")}
            for name, path in files.items():
                path.write_text((job.stdin or "") if name == "stdin" else "")
            job = {"args": args, "cwd": str(job.cwd), "env": job.env, "code": job.code,
                   "peak": str(job.peak) if job.peak else None, **{k: str(v) for k, v in files.items()}}
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            pid = self.reply()["pid"]
            done = self.reply(timeout)
            if done is None:
                os.kill(pid, 9)
                self.reply()
                raise subprocess.TimeoutExpired(["aspan", *args], timeout)
            code = done["status"]
            out, err = files["stdout"].read_text(), files["stderr"].read_text()
        return subprocess.CompletedProcess(["aspan", *args], code, out, err)


_warm: list[Zygote] = []


def _zygote() -> Zygote:
    if not _warm or _warm[0].proc.poll() is not None:
        _warm[:] = [Zygote()]
    return _warm[0]
