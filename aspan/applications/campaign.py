"""A study campaign advanced in slices of a few minutes of GPU time (`aspan gpu slice`, `make gpu`).

A campaign is an ordered list of study runs (`CampaignPlan`, a TOML file such as `configs/gpu/campaign.toml`), each
an `aspan` command line whose run directory is `CAMPAIGN/NAME`. A slice runs the device checks
(`aspan.applications.device_checks`) and then the first unfinished runs, in order, under one wall-clock budget
(`aspan.training.time_budget`): every training inside checkpoints itself at most `checkpoint_s` old and pauses at
the deadline, so the slice ends in time with every finished row written, and the next slice, given the directory
back, continues exactly where this one stopped (the studies' rows are keyed by their settings; a paused training
resumes from its checkpoint).

What a slice returns is small and flat, for machines that hand back only a few files: `run.json` (the environment,
the checks, what each run did, the state it started from) and the campaign's changed files as `state.tar.gz` (split
in parts), which `merge_slice` checks and applies to the campaign directory here, all or nothing
(`aspan.applications.slice_archive`). A slice holds the campaign's lock while it runs, so two slices (or a slice and
a merge) never share a campaign; a stop signal (SIGTERM, Ctrl-C) ends the slice after the run it is in, checkpointed,
with its record and archive written.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import stopping
from ..config import load_config
from ..environment import run_environment
from ..errors import Terminated, UsageError
from ..io import write_text
from ..training import BudgetSpent, TimeBudget, time_budget
from .device_checks import CHECKS, run_checks
from .slice_archive import STATE, campaign_lock, latest_steps, merge_slice, pack, snapshot  # noqa: F401 (the archive's
from .slice_units import UNITS_DONE, ProbeShape, UnitJob, probe, run_units  # STATE and merge_slice, importable here)
from .studies import REGISTRY, row_files, study

DONE = ".campaign-done.json"  # in a run's directory once its command finished (not paused)


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    """One study run of a campaign."""

    name: str  # its run directory under the campaign directory (letters, digits, '_' and '-')
    command: tuple[str, ...]  # the `aspan` command line, without --out and --device (the slice adds them)
    claim: str = ""  # the question it answers, in a sentence
    requires: tuple[str, ...] = ()  # importable packages it needs; without one the slice skips it and says why
    estimate: str = ""  # how its GPU minutes were estimated (the measurements it scales from)
    estimate_min: float = 0.0  # GPU minutes the whole run takes by that estimate (what slices already spent included)
    probe: dict = field(default_factory=dict)  # the shape of its trainings for the concurrency probe (`ProbeShape`)
    units_at_once: int = 0  # 0: the probe chooses how many of its units run at once; N: N (1: one process)
    # True: its state cannot travel between slices (a base too large to carry), so a slice starts it only with
    # `estimate_min` minutes left and ships nothing of it back until it is done
    atomic: bool = False
    prune: tuple[str, ...] = ()  # globs under its directory deleted once it is done (what no later run reads)
    unit_s: float = 0.0  # seconds one of its units takes by its estimate: a slice starts none with less time left


@dataclass(frozen=True)
class CampaignPlan:
    """A campaign: its runs in order and the budget of one slice."""

    runs: tuple[dict, ...] = ()  # the runs in order, each an `Entry`'s keys
    budget_s: float = 480.0  # wall seconds of one slice, checks included
    reserve_s: float = 45.0  # seconds kept back at the end for the outputs and the archive
    checkpoint_s: float = 120.0  # the oldest a running training's checkpoint may get
    checks: tuple[str, ...] = ("hooks", "generation", "training", "distributed")  # device checks run first
    concurrency: tuple[int, ...] = (1, 2, 4)  # how many units at once the probe tries, in order (`slice_units`)
    probe_s: float = 3.0  # seconds each phase of the probe trains
    loan_s: float = 660.0  # slice seconds one GPU loan gives (for the loans left that `status` prints)
    # the most the campaign directory may hold when a slice ends: what code and wheels leave of the carry budget
    # (`aspan gpu carry` checks the sum); a slice over it drops paused trainings, the least advanced first
    state_mib: float = 10.0

    def entries(self) -> list[Entry]:
        """The plan's runs as `Entry` objects, in plan order."""
        return [Entry(**{k: tuple(v) if k in ("command", "requires", "prune") else v for k, v in r.items()})
                for r in self.runs]

    def check(self) -> None:
        """ValueError naming the run and key that is wrong, before any work."""
        if not isinstance(self.runs, (list, tuple)):
            raise ValueError("runs must be a list of tables")
        names: set[str] = set()
        for i, run in enumerate(self.runs):
            check_run(run, f"runs[{i}]", names)
        if not self.runs:
            raise ValueError("runs: a campaign needs at least one run")
        for key in ("budget_s", "reserve_s", "checkpoint_s", "probe_s", "loan_s", "state_mib"):
            check_seconds(getattr(self, key), key)
        if not self.concurrency or any(isinstance(k, bool) or not isinstance(k, int) or k < 1
                                       for k in self.concurrency):
            raise ValueError(f"concurrency must be a list of ints >= 1, got {self.concurrency!r}")
        if not 0 <= self.reserve_s < self.budget_s or self.checkpoint_s <= 0:
            raise ValueError("budget_s must exceed reserve_s >= 0, and checkpoint_s must be > 0")
        bad = [c for c in self.checks if c not in CHECKS]
        if bad:
            raise ValueError(f"checks: unknown check {bad[0]!r} (checks: {', '.join(CHECKS)})")


def check_seconds(value: Any, key: str) -> None:
    """ValueError naming `key` unless `value` is a finite number (no NaN, no infinity, no integer beyond a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number of seconds, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        text = repr(value)
        text = text if len(text) <= 20 else text[:20] + "..."
        raise ValueError(f"{key} must be a finite number of seconds, got {text}")


def check_run(run: Any, where: str, names: set[str]) -> None:
    """ValueError naming `where` and the key when one run of a plan is wrong; its name is added to `names`."""
    from dataclasses import fields

    known = {f.name for f in fields(Entry)}
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
    if next((c for c in command if not c.startswith("-")), None) == "gpu":
        raise ValueError(f"{where}.command must not be `aspan gpu` (a slice does not run slices)")
    requires = run.get("requires", ())
    if not isinstance(requires, (list, tuple)) or not all(isinstance(r, str) and module_name(r) for r in requires):
        raise ValueError(f"{where}.requires must be a list of module names (e.g. [\"gguf\"]), got {requires!r}")
    for key in ("claim", "estimate"):
        if not isinstance(run.get(key, ""), str):
            raise ValueError(f"{where}.{key} must be text, got {run[key]!r}")
    check_run_extras(run, where)


def check_run_extras(run: dict, where: str) -> None:
    """ValueError naming `where` and the key when a run's estimate, probe, concurrency, atomic or prune is wrong."""
    minutes = run.get("estimate_min", 0.0)
    check_seconds(minutes, f"{where}.estimate_min")
    if minutes < 0:
        raise ValueError(f"{where}.estimate_min must be >= 0, got {minutes!r}")
    if not isinstance(run.get("probe", {}), dict):
        raise ValueError(f"{where}.probe must be a table, got {run['probe']!r}")
    try:
        ProbeShape.of(run.get("probe"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}.{e}") from None
    unit_s = run.get("unit_s", 0.0)
    check_seconds(unit_s, f"{where}.unit_s")
    k = run.get("units_at_once", 0)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"{where}.units_at_once must be an int >= 0, got {k!r}")
    if not isinstance(run.get("atomic", False), bool):
        raise ValueError(f"{where}.atomic must be true or false, got {run['atomic']!r}")
    prune = run.get("prune", ())
    if not isinstance(prune, (list, tuple)) or not all(isinstance(g, str) and g and not g.startswith("/")
                                                        and ".." not in g.split("/") for g in prune):
        raise ValueError(f"{where}.prune must be a list of relative globs inside the run's directory, got {prune!r}")


def module_name(text: str) -> bool:
    """Whether `text` is a (dotted) module name."""
    return all(part.isidentifier() for part in text.split("."))


def installed(module: str) -> bool:
    """Whether module `module` (dotted) can be imported here, found without importing it or any package above it
    (`importlib.util.find_spec("a.b")` imports `a`, whose code then runs)."""
    import importlib.machinery
    import importlib.util
    import sys

    parts, locations = module.split("."), None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        if name in sys.modules:
            locations = getattr(sys.modules[name], "__path__", None)
            continue
        if i and not locations:  # the parent is a module, not a package
            return False
        spec = (importlib.util.find_spec(name) if i == 0
                else importlib.machinery.PathFinder.find_spec(name, list(locations)))
        if spec is None:
            return False
        locations = spec.submodule_search_locations
    return True


def load_plan(path: str | Path) -> CampaignPlan:
    """The campaign of TOML file `path` (UsageError naming the file and key)."""
    return load_config(CampaignPlan, toml_path=path, name="campaign")


# ----------------------------------------------------------------------------------------------- state
def entry_state(campaign: Path, entry: Entry) -> dict[str, Any]:
    """Where one run stands: "done", "started" (its directory exists) or "not started", and its rows so far."""
    run = campaign / entry.name
    state = "done" if (run / DONE).is_file() else "started" if run.is_dir() else "not started"
    n = sum(count_rows(p) for name in rows_files(entry) for p in study_row_files(run, name)) if run.is_dir() else 0
    paused = sorted(str(p.parent.parent.relative_to(run)) for p in run.glob("scratch/*/checkpoints/latest"))
    return {"name": entry.name, "state": state, "rows": n, "paused_trainings": paused}


def rows_files(entry: Entry) -> tuple[str, ...]:
    """The row files a run's rows are counted in: for `aspan study NAME`, the first row file of the studies that
    subcommand runs (`Study.rows`: `runs.jsonl`, parity's `rows.jsonl`); for other commands `runs.jsonl`."""
    words = [w for w in entry.command if not w.startswith("-")]
    if words[:1] != ["study"] or len(words) < 2:
        return ("runs.jsonl",)
    names = [name for name, r in REGISTRY.items() if r.command == words[1]]
    return tuple(dict.fromkeys(study(name).rows[0] for name in names)) or ("runs.jsonl",)


def study_row_files(run: Path, name: str) -> list[Path]:
    """Row file `name` of run directory `run` and its units' files, those that exist."""
    return [p for p in row_files(run, name) if p.is_file()]


def count_rows(path: Path) -> int:
    """The rows (non-blank lines) of a JSONL file."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def status(plan: CampaignPlan, campaign: str | Path, slices: str | Path | None = None) -> list[dict[str, Any]]:
    """Every run's state, in the campaign's order, with the GPU minutes the slices recorded in `slices` (default:
    the campaign's parent's `slices/`, where `aspan gpu merge` copies each slice's run.json) spent on it, its
    estimate, and the minutes left by that estimate."""
    spent = minutes_spent(Path(campaign).parent / "slices" if slices is None else Path(slices))
    out = []
    for e in plan.entries():
        state = entry_state(Path(campaign), e)
        done = spent.get(e.name, 0.0)
        left = 0.0 if state["state"] == "done" else max(0.0, e.estimate_min - done)
        out.append({**state, "claim": e.claim, "minutes_done": round(done, 2), "estimate_min": e.estimate_min,
                    "minutes_left": round(left, 2)})
    return out


def minutes_spent(slices: Path) -> dict[str, float]:
    """GPU minutes each run took in the slice records (`slice-*.json`) of directory `slices`, by run name."""
    spent: dict[str, float] = {}
    for path in sorted(slices.glob("slice-*.json")) if slices.is_dir() else ():
        try:
            runs = json.loads(path.read_text()).get("runs", [])
        except (OSError, ValueError, AttributeError):
            continue
        for r in runs if isinstance(runs, list) else ():
            if isinstance(r, dict) and isinstance(r.get("seconds"), (int, float)):
                spent[str(r.get("name"))] = spent.get(str(r.get("name")), 0.0) + r["seconds"] / 60
    return spent


def format_status(rows: list[dict[str, Any]], loan_s: float = CampaignPlan.loan_s) -> str:
    """The campaign's state as text: runs done, one line per run (state, rows, GPU minutes spent and left by its
    estimate, paused trainings), then the minutes and GPU loans left."""
    done = sum(r["state"] == "done" for r in rows)
    lines = [f"{done} of {len(rows)} runs done"]
    for r in rows:
        extra = f", paused in {', '.join(r['paused_trainings'])}" if r["paused_trainings"] else ""
        minutes = (f"{r.get('minutes_done', 0.0):5.1f} GPU-min done, {r.get('minutes_left', 0.0):5.1f} left "
                   f"(estimate {r.get('estimate_min', 0.0):g})")
        lines.append(f"  {r['name']:24s} {r['state']:12s} {r['rows']:5d} rows  {minutes}{extra}")
    spent = sum(r.get("minutes_done", 0.0) for r in rows)
    left = sum(r.get("minutes_left", 0.0) for r in rows)
    loans = math.ceil(left / (loan_s / 60)) if left > 0 else 0
    lines.append(f"GPU minutes: {spent:.1f} done, {left:.1f} left by the estimates: {loans} loan(s) of "
                 f"{loan_s / 60:g} slice minutes")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- one slice
def no_units(argv: list[str]) -> None:
    """`Slice.list_units` when none is given: no command line is a study of units (each runs whole)."""
    return None


@dataclass
class Slice:
    """What one slice needs besides the plan."""

    campaign: Path  # the campaign directory (changed in place)
    out: Path  # where run.json and the state archive go (outside the campaign)
    run_command: Callable[[list[str]], int]  # runs an `aspan` command line in this process (`aspan.cli.main`)
    device: str = "cuda"
    clock: Callable[[], float] = time.monotonic  # tests pass a step counter here
    record: dict[str, Any] = field(default_factory=dict)
    # the command that runs one `aspan` command line under a deadline in a process of its own
    # (`aspan.commands.gpu_worker`); (): every run in this process, its units one after another
    worker: tuple[str, ...] = ()
    list_units: Callable[[list[str]], list | None] = no_units  # a command line's study units, or None
    units_at_once: int = 0  # 0: each run's `units_at_once` (0 there: the probe chooses); N: N for every run
    probes: dict[str, dict] = field(default_factory=dict)  # this slice's probes, by shape


def run_entry(entry: Entry, s: Slice, plan: CampaignPlan, deadline: float) -> dict[str, Any]:
    """Run one entry's command under the budget until `deadline`: "done", "paused" (the budget ran out; its
    trainings checkpointed), "stopped" (a stop signal came; its trainings checkpointed), "skipped" (a required package
    is missing, or an atomic run's estimate does not fit the time left) or "failed" (its exit code). A study whose
    units may run at once (`slice_units`) runs them first, K at a time, then once in this process to merge them."""
    missing = [p for p in entry.requires if not installed(p)]
    if missing:
        return {"name": entry.name, "status": "skipped", "why": f"needs {', '.join(missing)}, not installed here"}
    argv = [*entry.command, "--out", str(s.campaign / entry.name), "--device", s.device]
    if entry.atomic:
        left_min, gain = (deadline - s.clock()) / 60, expected_gain(entry, s, plan, argv)
        if entry.estimate_min / gain > left_min:
            return {"name": entry.name, "status": "skipped",
                    "why": f"atomic: needs {entry.estimate_min / gain:.1f} min by its estimate ({entry.estimate_min:g} "
                           f"at one unit at a time, / {gain:.2f} measured for K units), {left_min:.1f} left"}
    t0 = time.perf_counter()
    concurrent = run_concurrent(entry, s, plan, deadline, argv)
    if concurrent.get("status", "done") != "done":
        return {"name": entry.name, **concurrent, "seconds": time.perf_counter() - t0}
    result = run_in_process(entry, s, plan, deadline, argv)
    return {**result, **{k: v for k, v in concurrent.items() if k != "status"},
            "seconds": time.perf_counter() - t0}


def run_in_process(entry: Entry, s: Slice, plan: CampaignPlan, deadline: float, argv: list[str]) -> dict[str, Any]:
    """The entry's command in this process under the budget; a finished run is marked done and pruned."""
    try:
        with time_budget(TimeBudget(deadline, plan.checkpoint_s, s.clock)):
            code = s.run_command(argv)
    except BudgetSpent as e:
        return {"name": entry.name, "status": "paused", "why": str(e)}
    if stopping.received() is not None:  # the command stopped at its safe point (and said so)
        return {"name": entry.name, "status": "stopped", "signal": _signal_name(), "exit": code}
    if code != 0:
        return {"name": entry.name, "status": "failed", "exit": code}
    run = s.campaign / entry.name
    write_text(run / DONE, json.dumps({"command": argv, "finished": time.time()}))
    return {"name": entry.name, "status": "done", "pruned": prune_done(run, entry.prune)}


def run_concurrent(entry: Entry, s: Slice, plan: CampaignPlan, deadline: float, argv: list[str]) -> dict[str, Any]:
    """A study's units K at a time in processes of their own (`slice_units.run_units`), K from `units_at_once` or
    the probe; {} when the run is not a study, has one unit, runs at K = 1, or the slice has no worker command."""
    units = s.list_units(argv) if s.worker else None
    if not units or len(units) < 2:
        return {}
    k, record = s.units_at_once or entry.units_at_once, {}
    if not k:
        record = {"probe": run_probe(entry, s, plan)}
        k = record["probe"]["k"]
    if k < 2:
        return {"units_at_once": 1, **record}
    job = UnitJob(entry.name, tuple(argv), s.campaign / entry.name, tuple(s.worker),
                  time.time() + (deadline - s.clock()), plan.checkpoint_s, unit_s=entry.unit_s)
    got = run_units(job, units, k)
    return {"units_at_once": k, **record, **got}


def run_probe(entry: Entry, s: Slice, plan: CampaignPlan) -> dict[str, Any]:
    """The concurrency probe of the entry's shape, once per shape and slice (`slice_units.probe`)."""
    shape = ProbeShape.of(entry.probe)
    key = json.dumps(asdict(shape), sort_keys=True)
    if key not in s.probes:
        s.probes[key] = probe(s.device, shape, plan.concurrency, plan.probe_s)
        logger.info("aspan gpu slice: %s: probe %s", entry.name, s.probes[key])
    return s.probes[key]


def expected_gain(entry: Entry, s: Slice, plan: CampaignPlan, argv: list[str]) -> float:
    """How many times faster than one unit at a time the entry's units will run in this slice: the probe's
    throughput at its K over its throughput at K = 1 (1 when its units run one at a time)."""
    units = s.list_units(argv) if s.worker else None
    if not units or len(units) < 2 or (s.units_at_once or entry.units_at_once) == 1:
        return 1.0
    got = run_probe(entry, s, plan)
    rates = got.get("throughput", {})
    one, at_k = rates.get("1"), rates.get(str(got["k"]))
    return max(1.0, at_k / one) if one and at_k else 1.0


def prune_done(run: Path, globs: tuple[str, ...]) -> list[str]:
    """Delete what a finished run no longer needs: the files and directories matching `globs` under `run`, and its
    record of finished units. Returns what was deleted (relative names)."""
    import shutil

    gone = []
    for pattern in (*globs, UNITS_DONE):
        for p in sorted(run.glob(pattern)):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
            else:
                continue
            gone.append(p.relative_to(run).as_posix())
    return gone


def _signal_name() -> str | None:
    import signal

    got = stopping.received()
    return None if got is None else signal.Signals(got).name


def check_out(campaign: Path, out: Path) -> None:
    """UsageError when `out` is the campaign directory or inside it (the slice's outputs would overwrite a run's
    files and ship in their own archive)."""
    inside, camp = Path(out).resolve(), Path(campaign).resolve()
    if inside == camp or camp in inside.parents:
        raise UsageError(f"--out {out} is inside the campaign directory {campaign}: give a directory outside it")


def run_slice(plan: CampaignPlan, s: Slice) -> dict[str, Any]:
    """The device checks, then the campaign's unfinished runs in order until the budget is spent or a stop signal
    comes, holding the campaign's lock; writes `out/run.json` and the archive of what changed in the campaign
    directory (also when stopped: the signal is raised again after). Returns the record."""
    check_out(s.campaign, s.out)
    s.campaign.mkdir(parents=True, exist_ok=True)
    with campaign_lock(s.campaign, f"aspan gpu slice --out {s.out}"):
        return _run_locked(plan, s)


def _run_locked(plan: CampaignPlan, s: Slice) -> dict[str, Any]:
    start = s.clock()
    deadline = start + plan.budget_s - plan.reserve_s
    s.out.mkdir(parents=True, exist_ok=True)
    before = snapshot(s.campaign)
    s.record = {"kind": "gpu slice", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "budget_s": plan.budget_s, "reserve_s": plan.reserve_s, "campaign": str(s.campaign),
                "started_from": started_from(s.campaign, before), "environment": run_environment(device=s.device),
                "commit": _commit(), "runs": []}
    t0 = time.perf_counter()
    stop: BaseException | None = None
    try:
        s.record["checks"] = run_checks(s.device, plan.checks) if plan.checks else {}
        s.record["checks_s"] = round(time.perf_counter() - t0, 2)
        run_entries(plan, s, deadline)
    except (Terminated, KeyboardInterrupt) as e:  # at a safe point outside the runs' commands (the checks)
        stop = e
    if stopping.received() is not None:
        s.record["stopped"] = _signal_name()
    s.record["status"] = status(plan, s.campaign)
    s.record["wall_s"] = round(time.perf_counter() - t0, 2)
    unfinished = tuple(e.name for e in plan.entries() if e.atomic and entry_state(s.campaign, e)["state"] != "done")
    if unfinished:
        s.record["not_shipped"] = list(unfinished)  # atomic runs not done: nothing of them travels
    dropped = fit_state(s.campaign, plan.state_mib * 2**20, unfinished)
    if dropped:
        s.record["dropped"] = dropped  # paused trainings the state could not carry: they start again
    s.record["parts"] = pack(s.campaign, before, s.out, unfinished)
    write_text(s.out / "run.json", json.dumps(s.record, indent=1, default=str))
    if stop is not None:
        raise stop
    return s.record


def run_entries(plan: CampaignPlan, s: Slice, deadline: float) -> None:
    """The plan's unfinished runs in order, until the deadline, a paused run or a stop signal."""
    for entry in plan.entries():
        if entry_state(s.campaign, entry)["state"] == "done":
            continue
        if s.clock() >= deadline or stopping.received() is not None:
            break
        result = run_entry(entry, s, plan, deadline)
        s.record["runs"].append(result)
        logger.info("aspan gpu slice: %s: %s", entry.name, result["status"])
        if result["status"] in ("paused", "stopped"):
            break


def fit_state(campaign: Path, limit: float, exclude: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Drop paused trainings (their scratch directories) from `campaign`, the least advanced first, until its files
    (less the runs `exclude`) take at most `limit` bytes: a state over it could not travel to the next slice. A
    dropped training starts again from its first step (its rows, keyed by their settings, come out the same).
    Returns what was dropped: run, training directory, its step and bytes."""
    import shutil

    def size(p: Path) -> int:
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())

    total = sum(size(d) if d.is_dir() else d.stat().st_size for d in campaign.iterdir()
                if d.name not in exclude) if campaign.is_dir() else 0
    paused = sorted(((step, name) for name, step in latest_steps(campaign).items()
                     if name.split("/", 1)[0] not in exclude), key=lambda x: (x[0], x[1]))
    dropped = []
    for step, name in paused:
        if total <= limit:
            break
        where = campaign / name
        freed = size(where)
        shutil.rmtree(where)
        total -= freed
        dropped.append({"run": name.split("/", 1)[0], "training": name, "step": step, "bytes": freed})
        logger.warning("aspan gpu slice: dropped the paused training %s at step %d (%.1f MiB): the state must "
                       "stay under %.0f MiB to travel", name, step, freed / 2**20, limit / 2**20)
    return dropped


def started_from(campaign: Path, before: dict[str, str]) -> dict[str, Any]:
    """The campaign's state when a slice starts: its files and their digest, and every training's latest checkpoint
    step (the archive holds, per file, what a merge checks)."""
    import hashlib

    digest = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    return {"files": len(before), "digest": digest, "latest": latest_steps(campaign)}


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
