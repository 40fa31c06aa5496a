"""Several runs at once on one device inside a GPU slice (`aspan.applications.campaign`): a study's units
(`aspan.applications.studies.Unit`) as concurrent processes, and the short probe that chooses how many.

The campaign's models are small: one of them leaves a GPU launch-bound (the host issues kernels one after another,
and the device idles between them), so K independent trainings in K processes share one device at close to K times
the throughput, until the device (or the host) is busy. How many pay is measured, not guessed: `probe` starts
processes that each train a model of the run's shape (`ProbeShape`) through `aspan.training.train`, times 1, then 2,
then 4 of them training at once for a few seconds, and stops at the first K whose total throughput does not rise by
`PROBE_GAIN` over the last; the slice records the probe in its `run.json`.

`run_units` then runs the study's units stage by stage (a unit reads the rows of earlier stages only), at most K at a
time, each as its own `aspan study ... --unit I` process under the slice's deadline (the worker command the slice is
given, `aspan.commands.gpu_worker`). Each unit holds its own lock and writes its own row files, as under a Slurm
array; the slice holds the campaign lock, and when every unit is done it runs the study once more in its own process
without a unit, which merges the unit files and writes the outputs: the rows are those of a one-process run (the
same keys and values; tested on CPU with K = 2). A unit the deadline reached pauses checkpointed (worker exit
`PAUSED_EXIT`); a stop signal is passed on to the units, which stop at their next step, checkpointed.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import stopping, tasks
from ..io import write_text
from ..tokenization import CharTokenizer

PAUSED_EXIT = 75  # a unit worker's exit code when the slice's deadline paused its training (checkpointed)
UNITS_DONE = ".campaign-units.json"  # in a run's directory: the keys of its units that finished, by the slice
PROBE_GAIN = 1.15  # K is raised only while the throughput rises by at least this factor
PROBE_WARM_S = 2.0  # seconds each probe process trains before the timed phases (kernels, caches, allocator)
PROBE_TIMEOUT_S = 180.0  # the most a probe may take, start-up included
POLL_S = 0.2  # how often the slice looks at its unit processes


@dataclass(frozen=True)
class ProbeShape:
    """One training step of a run, for the concurrency probe: a tiny model of this shape trained on reversal strings
    of `length` characters (2 x length + 2 positions) at `batch_size`."""

    n_layers: int = 2
    n_heads: int = 8
    d_model: int = 128
    batch_size: int = 64
    length: int = 10  # reversal strings of exactly this many characters
    positional: str = "rotary"

    @classmethod
    def of(cls, table: dict | None) -> "ProbeShape":
        """The shape of a plan entry's `probe` table; ValueError naming an unknown key or a bad value."""
        from dataclasses import fields

        table = dict(table or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ValueError(f"probe: unknown key {unknown[0]!r} (keys: {', '.join(sorted(known))})")
        shape = cls(**table)
        for name in known - {"positional"}:
            value = getattr(shape, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"probe.{name} must be an int >= 1, got {value!r}")
        return shape


# ----------------------------------------------------------------------------------------------- the probe
def choose_k(throughput: dict[int, float], gain: float = PROBE_GAIN) -> int:
    """The K to run at: the last K (in the order measured) whose throughput rose by `gain` over the one before."""
    ks = list(throughput)
    chosen = ks[0]
    for k in ks[1:]:
        if throughput[k] < gain * throughput[chosen]:
            break
        chosen = k
    return chosen


def probe(device: str, shape: ProbeShape, ks: Sequence[int] = (1, 2, 4), seconds: float = 3.0) -> dict[str, Any]:
    """Time 1, 2, 4, ... processes training `shape` at once on `device` (each phase `seconds` long) and choose K
    (`choose_k`), stopping at the first K that does not raise the throughput. Returns {"k", "throughput" (samples/s
    by K), "shape", "seconds"}; never raises (a probe that fails returns k 1 and its error)."""
    t0 = time.perf_counter()
    ks = sorted(set(ks))
    procs: list[subprocess.Popen] = []
    got: dict[int, float] = {}
    try:
        cmd = [sys.executable, "-m", "aspan.applications.slice_units", json.dumps(asdict(shape)), device]
        procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True, bufsize=1) for _ in range(max(ks))]
        for p in procs:
            _expect(p, "ready", t0)
        for k in ks:
            for p in procs[:k]:
                p.stdin.write(f"go {seconds}\n")
            parts = [_expect(p, "done", t0).split() for p in procs[:k]]
            got[k] = sum(int(steps) * shape.batch_size / float(secs) for steps, secs in parts)
            if k != ks[0] and choose_k(got) != k:
                break
        result = {"k": choose_k(got)}
    except (OSError, ValueError, TimeoutError) as e:
        result = {"k": 1, "error": f"{type(e).__name__}: {e}"}
    finally:
        for p in procs:
            _close(p)
    return {**result, "throughput": {str(k): round(v, 1) for k, v in got.items()}, "shape": asdict(shape),
            "seconds": round(time.perf_counter() - t0, 2)}


def _expect(p: subprocess.Popen, word: str, t0: float) -> str:
    """The rest of the probe worker's next `probe: WORD ...` line (other lines skipped); TimeoutError past the
    probe's time limit, ValueError when the worker ended."""
    while True:
        if time.perf_counter() - t0 > PROBE_TIMEOUT_S:
            raise TimeoutError(f"the probe took over {PROBE_TIMEOUT_S:g} s")
        line = p.stdout.readline()
        if not line:
            raise ValueError(f"a probe process ended (exit {p.poll()}) before it said {word!r}")
        head, _, rest = line.strip().partition(" ")
        if head == f"probe:{word}":
            return rest


def _close(p: subprocess.Popen) -> None:
    try:
        p.stdin.close()
        p.wait(timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        p.kill()
        p.wait()


def probe_worker(shape: ProbeShape, device: str) -> None:
    """A probe process: build the model, train `PROBE_WARM_S` seconds, say "ready", then for every "go SECONDS" line
    train that long and say "done STEPS SECONDS"; end at the end of its input."""
    from .. import models

    task = tasks.preset("reversal", "id", length=(shape.length, shape.length))
    tok = CharTokenizer()
    model = models.tiny(tok, n_layers=shape.n_layers, n_heads=shape.n_heads, d_model=shape.d_model,
                        n_ctx=2 * shape.length + 4, positional=shape.positional, device=device)
    _burst(model, tok, task, shape, device, PROBE_WARM_S)
    _say("probe:ready")
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["go"]:
            steps, secs = _burst(model, tok, task, shape, device, float(words[1]))
            _say(f"probe:done {steps} {secs}")


def _say(line: str) -> None:
    """One line of a probe process's answer to the slice that started it (its stdout is that channel)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _burst(model, tok, task, shape: ProbeShape, device: str, seconds: float) -> tuple[int, float]:
    """Train for `seconds` of wall time through `aspan.training.train`; (steps, seconds taken)."""
    from ..training import BudgetSpent, TimeBudget, TrainConfig, time_budget, train

    cfg = TrainConfig.scratch(steps=10**7, batch_size=shape.batch_size, device=device, log_every=10**7, seed=0)
    t0 = time.perf_counter()
    steps = 0
    try:
        with time_budget(TimeBudget(time.monotonic() + seconds, checkpoint_s=10**6)):
            train(model, tok, task, cfg, progress=False)
    except BudgetSpent as e:
        steps = e.step
    return steps, time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------- units
@dataclass(frozen=True)
class UnitJob:
    """What `run_units` needs besides the units: the run, where it goes and how a unit process starts."""

    name: str  # the campaign run
    argv: tuple[str, ...]  # the run's `aspan` command line, --out and --device included
    run_dir: Path  # its run directory
    worker: tuple[str, ...]  # the command that runs one aspan command line under a deadline (`gpu_worker`)
    deadline_epoch: float  # time.time() at which the units pause
    checkpoint_s: float  # the oldest a running unit's checkpoint may get
    t0: float = field(default_factory=time.perf_counter)  # the units' start times are recorded from here
    unit_s: float = 0.0  # seconds one unit takes by the run's estimate (0: not known)


@dataclass
class _Running:
    index: int
    key: str
    proc: subprocess.Popen
    log: Path
    started: float = field(default_factory=time.perf_counter)


def done_units(run_dir: Path) -> set[str]:
    """The keys of the run's units the slices finished (`UNITS_DONE`)."""
    path = run_dir / UNITS_DONE
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        return set()
    return set(got) if isinstance(got, list) and all(isinstance(k, str) for k in got) else set()


def _mark_done(run_dir: Path, keys: set[str]) -> None:
    write_text(run_dir / UNITS_DONE, json.dumps(sorted(keys)))


def run_units(job: UnitJob, units: Sequence, k: int, clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """The units not yet done, stage by stage, at most `k` processes at a time, until the deadline, a paused or
    failed unit, or a stop signal. Returns {"status": "done" | "paused" | "failed" | "stopped", "units": [what each
    started unit did]}; "done" when every unit is."""
    job.run_dir.mkdir(parents=True, exist_ok=True)
    finished = done_units(job.run_dir)
    indexed = [(i, u) for i, u in enumerate(units)]
    record: list[dict] = []
    logs = Path(tempfile.mkdtemp(prefix="aspan-units-"))
    status = "done"
    run = _Stages(job, k, finished, record, logs, clock)
    for stage in sorted({u.stage for u in units}):
        pending = [(i, u) for i, u in indexed if u.stage == stage and u.key not in finished]
        status = _run_stage(run, pending)
        if status != "done":
            break
    return {"status": status, "units": record}


@dataclass
class _Stages:
    """What `_run_stage` shares across stages: the job, K, the units finished, the record, the logs, the clock."""

    job: UnitJob
    k: int
    finished: set[str]
    record: list[dict]
    logs: Path
    clock: Callable[[], float]


def _run_stage(run: _Stages, pending: list) -> str:
    """One stage's units, at most `run.k` at a time: "done" when all of them finished, else the worst of what its
    units did ("failed" over "stopped" over "paused"); once one unit did not finish, no other starts."""
    job, k, finished, record, logs, clock = run.job, run.k, run.finished, run.record, run.logs, run.clock
    running: list[_Running] = []
    status = "done"
    durations: list[float] = []
    while pending or running:
        while pending and len(running) < k and status == "done" and _may_start(job, durations, clock):
            i, unit = pending.pop(0)
            running.append(_start(job, i, unit.key, logs))
        if not running:  # nothing runs and nothing may start: the deadline is too near, or a unit did not finish
            return _worst(status, "paused")
        time.sleep(POLL_S)
        if stopping.received() is not None:
            status = _worst(status, "stopped")
            for r in running:
                _signal(r.proc, stopping.received())
        for r in [r for r in running if r.proc.poll() is not None]:
            running.remove(r)
            entry = _ended(job, r, finished)
            record.append(entry)
            if entry["status"] == "done":
                durations.append(entry["seconds"])
            status = _worst(status, entry["status"])
    return status


RANK = {"done": 0, "paused": 1, "stopped": 2, "failed": 3}


def _worst(a: str, b: str) -> str:
    return a if RANK[a] >= RANK[b] else b


def _ended(job: UnitJob, r: _Running, finished: set[str]) -> dict[str, Any]:
    """What an ended unit process did; a finished unit is marked done in the run directory."""
    code = r.proc.returncode
    what = {0: "done", PAUSED_EXIT: "paused", 130: "stopped", 143: "stopped"}.get(code, "failed")
    entry = {"unit": r.index, "key": r.key, "status": what, "exit": code, "start_s": round(r.started - job.t0, 2),
             "seconds": round(time.perf_counter() - r.started, 2)}
    if what == "done":
        finished.add(r.key)
        _mark_done(job.run_dir, finished)
    elif what == "failed":
        entry["output_tail"] = r.log.read_text(errors="replace").strip().splitlines()[-5:]
    return entry


def _may_start(job: UnitJob, durations: list[float], clock: Callable[[], float]) -> bool:
    """Whether a unit may start now: a stop signal has not come, and the time left is at least what a unit takes
    (the shortest this slice has finished, else the run's estimate, at least 30 s), so a slice's end leaves few
    paused units to carry."""
    if stopping.received() is not None:
        return False
    left = job.deadline_epoch - clock()
    return left > max(30.0, min(durations) if durations else job.unit_s)


def _start(job: UnitJob, index: int, key: str, logs: Path) -> _Running:
    argv = [*job.worker, "--until", repr(job.deadline_epoch), "--checkpoint-s", repr(job.checkpoint_s), "--",
            *job.argv, "--unit", str(index)]
    log = logs / f"{job.name}-unit-{index}.log"
    with open(log, "w") as f:  # the child keeps its own descriptor
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return _Running(index, key, proc, log)


def _signal(proc: subprocess.Popen, signum: int | None) -> None:
    if proc.poll() is None and signum is not None:
        try:
            proc.send_signal(signal.Signals(signum))
        except OSError:
            pass


if __name__ == "__main__":  # a probe process: python -m aspan.applications.slice_units SHAPE_JSON DEVICE
    probe_worker(ProbeShape(**json.loads(sys.argv[1])), sys.argv[2])
