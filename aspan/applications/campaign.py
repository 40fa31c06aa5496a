"""A study campaign advanced in slices of a few minutes of GPU time (`aspan gpu slice`, `make gpu`).

A campaign is an ordered list of study runs (`CampaignPlan`, a TOML file such as `configs/gpu/campaign.toml`), each
an `aspan` command line whose run directory is `CAMPAIGN/NAME`. A slice runs the device checks
(`aspan.applications.device_checks`) and then the first unfinished runs, in order, under one wall-clock budget
(`aspan.training.time_budget`): every training inside checkpoints itself at most `checkpoint_s` old and pauses at
the deadline, so the slice ends in time with every finished row written, and the next slice, given the directory
back, continues exactly where this one stopped (the studies' rows are keyed by their settings; a paused training
resumes from its checkpoint).

What a slice returns is small and flat, for machines that hand back only a few files: `run.json` (the environment,
the checks, what each run did) and the campaign's changed files as `state.tar.gz` (split in parts of at most
`PART_BYTES`), which `merge_slice` applies to the campaign directory here.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..config import load_config
from ..environment import run_environment
from .device_checks import CHECKS, run_checks

DONE = ".campaign-done.json"  # in a run's directory once its command finished (not paused)
SKIP_PACK = (".aspan.lock", "report.html")  # never shipped back: a lock, and reports `aspan report` rebuilds
PART_BYTES = 15 * 2**20  # the largest part of state.tar.gz
STATE = "state.tar.gz"
REMOVED = ".campaign-removed.json"  # inside the archive: files the slice deleted


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    """One study run of a campaign."""

    name: str  # its run directory under the campaign directory (letters, digits, '_' and '-')
    command: tuple[str, ...]  # the `aspan` command line, without --out and --device (the slice adds them)
    claim: str = ""  # the question it answers, in a sentence
    requires: tuple[str, ...] = ()  # importable packages it needs; without one the slice skips it and says why
    estimate: str = ""  # how many slices it needs, and how that was estimated


@dataclass(frozen=True)
class CampaignPlan:
    """A campaign: its runs in order and the budget of one slice."""

    runs: tuple[dict, ...] = ()  # the runs in order, each an `Entry`'s keys
    budget_s: float = 480.0  # wall seconds of one slice, checks included
    reserve_s: float = 45.0  # seconds kept back at the end for the outputs and the archive
    checkpoint_s: float = 120.0  # the oldest a running training's checkpoint may get
    checks: tuple[str, ...] = ("hooks", "generation", "training", "distributed")  # device checks run first

    def entries(self) -> list[Entry]:
        """The plan's runs as `Entry` objects, in plan order."""
        return [Entry(**{k: tuple(v) if k in ("command", "requires") else v for k, v in r.items()})
                for r in self.runs]

    def check(self) -> None:
        """ValueError naming the run and key that is wrong, before any work."""
        from dataclasses import fields

        known = {f.name for f in fields(Entry)}
        names = set()
        for i, run in enumerate(self.runs):
            where = f"runs[{i}]"
            if not isinstance(run, dict):
                raise ValueError(f"{where} must be a table")
            unknown = sorted(set(run) - known)
            if unknown:
                raise ValueError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(known))})")
            name = run.get("name")
            if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_-" for c in name):
                raise ValueError(f"{where}.name must be letters, digits, '_' and '-', got {name!r}")
            if name in names:
                raise ValueError(f"{where}.name {name!r} is used twice")
            names.add(name)
            command = run.get("command")
            if not isinstance(command, (list, tuple)) or not command or not all(isinstance(c, str) for c in command):
                raise ValueError(f"{where}.command must be a non-empty list of strings")
            if {"--out", "--device"} & set(command):
                raise ValueError(f"{where}.command must not set --out or --device (the slice sets them)")
        if not self.runs:
            raise ValueError("runs: a campaign needs at least one run")
        if not 0 <= self.reserve_s < self.budget_s or self.checkpoint_s <= 0:
            raise ValueError("budget_s must exceed reserve_s >= 0, and checkpoint_s must be > 0")
        bad = [c for c in self.checks if c not in CHECKS]
        if bad:
            raise ValueError(f"checks: unknown check {bad[0]!r} (checks: {', '.join(CHECKS)})")


def load_plan(path: str | Path) -> CampaignPlan:
    """The campaign of TOML file `path` (UsageError naming the file and key)."""
    return load_config(CampaignPlan, toml_path=path, name="campaign")


# ----------------------------------------------------------------------------------------------- state
def entry_state(campaign: Path, entry: Entry) -> dict[str, Any]:
    """Where one run stands: "done", "started" (its directory exists) or "not started", and its rows so far."""
    run = campaign / entry.name
    rows = run / "runs.jsonl"
    n = sum(1 for line in rows.read_text().splitlines() if line.strip()) if rows.is_file() else 0
    state = "done" if (run / DONE).is_file() else "started" if run.is_dir() else "not started"
    paused = sorted(str(p.parent.parent.relative_to(run)) for p in run.glob("scratch/*/checkpoints/latest"))
    return {"name": entry.name, "state": state, "rows": n, "paused_trainings": paused}


def status(plan: CampaignPlan, campaign: str | Path) -> list[dict[str, Any]]:
    """Every run's state, in the campaign's order."""
    return [{**entry_state(Path(campaign), e), "claim": e.claim} for e in plan.entries()]


def format_status(rows: list[dict[str, Any]]) -> str:
    """The campaign's state as text: runs done, then one line per run (state, rows, paused trainings)."""
    done = sum(r["state"] == "done" for r in rows)
    lines = [f"{done} of {len(rows)} runs done"]
    for r in rows:
        extra = f", paused in {', '.join(r['paused_trainings'])}" if r["paused_trainings"] else ""
        lines.append(f"  {r['name']:24s} {r['state']:12s} {r['rows']:5d} rows{extra}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- one slice
@dataclass
class Slice:
    """What one slice needs besides the plan."""

    campaign: Path  # the campaign directory (changed in place)
    out: Path  # where run.json and the state archive go
    run_command: Callable[[list[str]], int]  # runs an `aspan` command line in this process (`aspan.cli.main`)
    device: str = "cuda"
    clock: Callable[[], float] = time.monotonic  # tests pass a step counter here
    record: dict[str, Any] = field(default_factory=dict)


def run_entry(entry: Entry, s: Slice, plan: CampaignPlan, deadline: float) -> dict[str, Any]:
    """Run one entry's command under the budget until `deadline`: "done", "paused" (the budget ran out; its
    trainings checkpointed), "skipped" (a required package is missing) or "failed" (its exit code)."""
    from importlib.util import find_spec

    from ..training import BudgetSpent, TimeBudget, time_budget

    missing = [p for p in entry.requires if find_spec(p) is None]
    if missing:
        return {"name": entry.name, "status": "skipped", "why": f"needs {', '.join(missing)}, not installed here"}
    argv = [*entry.command, "--out", str(s.campaign / entry.name), "--device", s.device]
    t0 = time.perf_counter()
    try:
        with time_budget(TimeBudget(deadline, plan.checkpoint_s, s.clock)):
            code = s.run_command(argv)
    except BudgetSpent as e:
        return {"name": entry.name, "status": "paused", "why": str(e), "seconds": time.perf_counter() - t0}
    seconds = time.perf_counter() - t0
    if code != 0:
        return {"name": entry.name, "status": "failed", "exit": code, "seconds": seconds}
    (s.campaign / entry.name / DONE).write_text(json.dumps({"command": argv, "finished": time.time()}))
    return {"name": entry.name, "status": "done", "seconds": seconds}


def run_slice(plan: CampaignPlan, s: Slice) -> dict[str, Any]:
    """The device checks, then the campaign's unfinished runs in order until the budget is spent; writes
    `out/run.json` and the archive of what changed in the campaign directory. Returns the record."""
    start = s.clock()
    deadline = start + plan.budget_s - plan.reserve_s
    s.campaign.mkdir(parents=True, exist_ok=True)
    s.out.mkdir(parents=True, exist_ok=True)
    before = snapshot(s.campaign)
    s.record = {"kind": "gpu slice", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "budget_s": plan.budget_s, "reserve_s": plan.reserve_s, "campaign": str(s.campaign),
                "environment": run_environment(device=s.device), "commit": _commit(), "runs": []}
    t0 = time.perf_counter()
    s.record["checks"] = run_checks(s.device, plan.checks) if plan.checks else {}
    s.record["checks_s"] = round(time.perf_counter() - t0, 2)
    for entry in plan.entries():
        if entry_state(s.campaign, entry)["state"] == "done":
            continue
        if s.clock() >= deadline:
            break
        result = run_entry(entry, s, plan, deadline)
        s.record["runs"].append(result)
        logger.info("aspan gpu slice: %s: %s", entry.name, result["status"])
        if result["status"] == "paused":
            break
    s.record["status"] = status(plan, s.campaign)
    s.record["wall_s"] = round(time.perf_counter() - t0, 2)
    s.record["parts"] = pack(s.campaign, before, s.out)
    (s.out / "run.json").write_text(json.dumps(s.record, indent=1, default=str))
    return s.record


def _commit() -> str | None:
    """The git commit of the source tree this runs from: `ASPAN_SOURCE_COMMIT` when set (a copy of the tree without
    its .git, as a lent GPU machine gets), else git's answer, else None."""
    import os
    import subprocess

    if os.environ.get("ASPAN_SOURCE_COMMIT"):
        return os.environ["ASPAN_SOURCE_COMMIT"]

    root = Path(__file__).resolve().parents[2]
    try:
        got = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return got.stdout.strip() or None


# ----------------------------------------------------------------------------------------------- the archive
def snapshot(directory: Path) -> dict[str, str]:
    """sha256 of every file under `directory`, by path relative to it."""
    out = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[p.relative_to(directory).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def pack(campaign: Path, before: dict[str, str], out: Path) -> list[str]:
    """`out/state.tar.gz` (or `.partNN` pieces of at most `PART_BYTES`): every file of `campaign` that is new or
    changed since `before`, and the list of removed ones. Returns the names written."""
    after = snapshot(campaign)
    changed = [p for p, h in after.items() if before.get(p) != h and Path(p).name not in SKIP_PACK]
    removed = sorted(set(before) - set(after))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in changed:
            tar.add(campaign / p, arcname=p, recursive=False)
        data = json.dumps(removed).encode()
        info = tarfile.TarInfo(REMOVED)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    if len(blob) <= PART_BYTES:
        (out / STATE).write_bytes(blob)
        return [STATE]
    names = []
    for i in range(0, len(blob), PART_BYTES):
        name = f"{STATE}.part{i // PART_BYTES:02d}"
        (out / name).write_bytes(blob[i : i + PART_BYTES])
        names.append(name)
    return names


def merge_slice(slice_dir: str | Path, campaign: str | Path) -> dict[str, Any]:
    """Apply a slice's archive to `campaign` (files written, removed ones deleted) and return its run.json record.
    Refuses (ValueError naming the member) an archive member that is not a regular file inside the directory."""
    slice_dir, campaign = Path(slice_dir), Path(campaign)
    record = json.loads((slice_dir / "run.json").read_text())
    parts = [slice_dir / n for n in record.get("parts", [])]
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise ValueError(f"{missing[0]}: missing (the slice wrote {', '.join(record['parts'])})")
    blob = b"".join(p.read_bytes() for p in parts)
    campaign.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        members = tar.getmembers()
        for m in members:
            if not m.isfile() or m.name.startswith("/") or ".." in Path(m.name).parts:
                raise ValueError(f"{slice_dir}: archive member {m.name!r} is not a plain file inside the campaign")
        removed = json.loads(tar.extractfile(REMOVED).read()) if REMOVED in tar.getnames() else []
        for m in members:
            if m.name != REMOVED:
                tar.extract(m, campaign, filter="data")
    for p in removed:
        target = campaign / p
        if ".." not in Path(p).parts and target.is_file():
            target.unlink()
    return record
