"""`--launcher slurm`: a sweep as a Slurm job array through submitit, one array task per shard of its grid, then one
merge that writes the run directory as a one-machine run would.

The run directory makes it safe. The launching command holds it (`aspan.io.claim_run`: a second launch is refused in
one line); each task holds its own shard's lock and appends its rows (keyed, resumable) to its own shard file. The
launcher watches the tasks (`squeue`; no accounting database needed): a task that left the queue with its shard's
rows incomplete (failed, cancelled, pre-empted, out of time) is resubmitted alone, up to `max_retries` times. The
submitted job ids are recorded in `<run dir>/.slurm/launch.json` (submitit's scripts and logs lie beside it), so a
rerun of the command (after `--no-wait`, a lost login session, or a task that ran out of retries) adopts the tasks
still queued, submits only the shards whose rows are incomplete, and never runs a finished shard again. Once every
shard is complete, the shard files are merged into `sweep.jsonl` in grid order and `run_sweep_dir` writes the table,
figures, summary and held-out selection exactly as `aspan sweep` without shards does.

The tasks run `sys.executable` on the nodes: the environment and the run directory must be on a filesystem the nodes
share (see the cluster notes).
"""
from __future__ import annotations

import getpass
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from .. import stopping
from ..checks import check_output_dir
from ..errors import UsageError
from ..experiments.engine import ROW_FIELDS
from ..experiments.sweep import SweepConfig, grid, run_sweep, shard_points
from ..io import PathLike, claim_run, read_json, settings_key, union_rows, write_json, write_lines
from .sweep import check_sweep, rows_file, run_sweep_dir, sweep_settings

Launcher = Literal["local", "slurm"]
STATE_DIR = ".slurm"  # submitit's folder inside the run directory: job scripts, pickled calls, logs, launch.json
# (removed once every shard is merged; a failed launch leaves it for its logs and for the next launch)
MAX_TASKS = 64  # the default number of array tasks is one per grid point, at most this many


@dataclass
class SlurmResources:
    """What each array task asks Slurm for, and how the launcher drives the array (flags, or a `[slurm]` table in the
    `--config` TOML)."""

    partition: str | None = None  # --partition; None: the cluster's default partition
    time: int = 60  # minutes per task (--time); a task out of time is resubmitted and resumes from its rows
    cpus: int = 1  # CPUs per task (--cpus-per-task)
    gpus: int = 0  # GPUs per task (--gpus-per-node; each task is one process on one node)
    mem: str | None = None  # memory per task, e.g. "16G" (--mem); None: the partition's default
    array_parallelism: int = 256  # array tasks running at once (the array's %N)
    tasks: int | None = None  # array tasks, one grid shard each; None: one per grid point, at most 64
    max_retries: int = 2  # times one failed, cancelled or pre-empted task is resubmitted alone
    sbatch: dict[str, str] = field(default_factory=dict)  # extra sbatch options, e.g. {account = "lab", qos = "low"}
    poll: float = 10.0  # seconds between two looks at the queue while waiting

    def check(self) -> None:
        """ValueError naming the first setting out of range."""
        for name in ("time", "cpus", "array_parallelism"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("gpus", "max_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0, got {getattr(self, name)}")
        if self.tasks is not None and self.tasks < 1:
            raise ValueError(f"tasks must be at least 1, got {self.tasks}")
        if self.poll <= 0:
            raise ValueError(f"poll must be positive, got {self.poll}")
        for key, value in self.sbatch.items():
            if not isinstance(value, str) or not key.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"sbatch: option {key!r} must be a word with a string value")

    def executor_parameters(self) -> dict[str, Any]:
        """submitit's `SlurmExecutor.update_parameters` arguments."""
        params: dict[str, Any] = {"time": self.time, "cpus_per_task": self.cpus, "ntasks_per_node": 1, "nodes": 1,
                                  "array_parallelism": self.array_parallelism, "job_name": "aspan-sweep",
                                  "additional_parameters": dict(self.sbatch)}
        if self.partition:
            params["partition"] = self.partition
        if self.gpus:
            params["gpus_per_node"] = self.gpus
        if self.mem:
            params["mem"] = self.mem
        return params


def load_resources(toml_path: PathLike | None, flags: dict[str, Any]) -> SlurmResources:
    """The defaults, then the `[slurm]` table of `toml_path` (when it has one), then the given `flags` (None: not
    given); UsageError in one line naming the file and key, or the flag."""
    from ..config import check_type, field_defaults
    from ..io import read_toml

    values: dict[str, Any] = {}
    where = "slurm resources"
    if toml_path is not None:
        table = read_toml(toml_path, "config").get("slurm", {})
        where = f"{toml_path}: [slurm]"
        if not isinstance(table, dict):
            raise UsageError(f"{toml_path}: slurm must be a table ([slurm])")
        known = {f.name for f in fields(SlurmResources)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        values = dict(table)
    hints = _hints()
    for key, value in values.items():
        check_type(value, hints[key], f"{where} {key}")
    for key, value in flags.items():
        if value is not None:
            values[key] = {**values.get("sbatch", {}), **value} if key == "sbatch" else value
            where = f"--{key.replace('_', '-')}" if key != "sbatch" else where
    resources = SlurmResources(**{**field_defaults(SlurmResources), **values})
    try:
        resources.check()
    except ValueError as e:
        raise UsageError(f"{where}: {e}") from None
    return resources


def _hints() -> dict[str, Any]:
    import typing

    return typing.get_type_hints(SlurmResources)


# ----------------------------------------------------------------------------------------------- the queue
def queued_jobs() -> dict[str, str]:
    """{job id: state} of this user's jobs in the Slurm queue, one entry per array task (`12_3`); ChildProcessError
    in one line when `squeue` cannot be run."""
    try:
        done = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T", "-u", getpass.getuser()], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ChildProcessError(f"squeue failed: {e}") from None
    if done.returncode != 0:
        raise ChildProcessError(f"squeue failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    jobs = {}
    for line in done.stdout.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id:
            jobs[job_id] = state
    return jobs


# ----------------------------------------------------------------------------------------------- the sweep
def sweep_task(config: SweepConfig, out: str, shard: tuple[int, int], source: str) -> int:
    """One array task: shard `shard` of `config`'s grid into `out`'s shard file, holding that shard's lock (rows
    only: the launcher's merge writes the tables, figures and selection). Returns the rows the shard file holds."""
    settings = sweep_settings(config)
    with claim_run(out, settings, shard=shard, command=f"aspan sweep {source} --shard {shard[0]}/{shard[1]}"):
        rows = run_sweep(config, rows_file(Path(out), shard), shard=shard, progress=False)
    return len(rows)


@dataclass
class _Plan:
    """The array of one run directory: how many shards, which are done, and the job each live one runs as."""

    out: Path
    points: list[dict[str, Any]]
    tasks: int
    jobs: dict[int, str]  # shard -> Slurm job id of its latest task
    attempts: dict[int, int]  # shard -> tasks submitted for it, this launch and before

    @property
    def state_file(self) -> Path:
        return self.out / STATE_DIR / "launch.json"

    def done_keys(self) -> set[str]:
        return {r["key"] for r in union_rows(sorted(self.out.glob("sweep*.jsonl")), ROW_FIELDS, "sweep")}

    def incomplete(self) -> list[int]:
        done = self.done_keys()
        return [i for i in range(self.tasks)
                if any(settings_key(p) not in done for p in shard_points(self.points, (i, self.tasks)))]

    def save(self) -> None:
        write_json(self.state_file, {"tasks": self.tasks, "jobs": {str(i): j for i, j in self.jobs.items()},
                                     "attempts": {str(i): n for i, n in self.attempts.items()}})


def _plan(out: Path, points: list[dict[str, Any]], resources: SlurmResources) -> _Plan:
    """The array for `out`: a previous launch's (its task count, jobs and attempts), else a new one of
    `resources.tasks` shards (default one per grid point, at most `MAX_TASKS`)."""
    state_file = out / STATE_DIR / "launch.json"
    if state_file.exists():
        state = read_json(state_file, "launch state")
        try:
            return _Plan(out, points, int(state["tasks"]), {int(i): str(j) for i, j in state["jobs"].items()},
                         {int(i): int(n) for i, n in state["attempts"].items()})
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ValueError(f"{state_file}: not a launch state; remove it to start the array afresh") from None
    tasks = resources.tasks or min(len(points), MAX_TASKS)
    return _Plan(out, points, min(tasks, len(points)), {}, {})


def _submit(plan: _Plan, shards: list[int], config: SweepConfig, resources: SlurmResources, source: str) -> list[str]:
    """Submit one array of `shards` (one task each); record their job ids in the plan. Returns the ids."""
    import submitit

    executor = submitit.SlurmExecutor(folder=plan.out / STATE_DIR, max_num_timeout=0)
    executor.update_parameters(**resources.executor_parameters())
    args = [(config, str(plan.out), (i, plan.tasks), source) for i in shards]
    jobs = executor.map_array(sweep_task, *zip(*args))
    for i, job in zip(shards, jobs):
        plan.jobs[i] = str(job.job_id)
        plan.attempts[i] = plan.attempts.get(i, 0) + 1
    plan.save()
    return [str(job.job_id) for job in jobs]


def _failure(plan: _Plan, shard: int) -> str:
    """Where to read why shard `shard`'s last task ended: the last line of its error log, and the log's path."""
    job_id = plan.jobs[shard]
    log = plan.out / STATE_DIR / f"{job_id}_0_log.err"
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return f"{lines[-1] if lines else 'no error output'} (log: {log})"


def _watch(plan: _Plan, config: SweepConfig, resources: SlurmResources, source: str, progress: bool) -> None:
    """Wait until every shard's rows are complete, resubmitting a shard whose task left the queue without
    completing them; ChildProcessError naming the shard once it has used its `max_retries`. Ctrl-C or SIGTERM stop
    the wait (`aspan.stopping`), not the tasks: the next launch adopts them."""
    from tqdm.auto import tqdm

    bar = tqdm(total=plan.tasks, desc="slurm tasks", unit="task", disable=not progress)
    try:
        while True:
            todo = plan.incomplete()
            bar.n = plan.tasks - len(todo)
            bar.refresh()
            if not todo:
                return
            queued = queued_jobs()
            gone = [i for i in todo if plan.jobs.get(i) not in queued]
            if gone:
                gone = [i for i in gone if i in plan.incomplete()]  # rows written just before the task left
            over = [i for i in gone if plan.attempts.get(i, 0) > resources.max_retries]
            if over:
                i = over[0]
                raise ChildProcessError(f"shard {i}/{plan.tasks} of {plan.out} failed {plan.attempts[i]} times: "
                                   f"{_failure(plan, i)}; rerun the command to try again")
            if gone:
                for i in gone:
                    bar.write(f"shard {i}/{plan.tasks}: task {plan.jobs.get(i)} ended with its rows incomplete "
                              f"({_failure(plan, i)}); resubmitting", file=sys.stderr)
                _submit(plan, gone, config, resources, source)
            stopping.check()
            time.sleep(resources.poll)
            stopping.check()
    finally:
        bar.close()


def merge_shards(config: SweepConfig, out: Path) -> int:
    """Every row of `out`'s rows files that belongs to the grid, into `sweep.jsonl` in grid order (as a run
    without shards writes it), then the shard files removed. Returns the number of rows."""
    keys = [settings_key(p) for p in grid(config)]
    shard_files = sorted(out.glob("sweep.shard-*.jsonl"))
    by_key = {r["key"]: r for r in union_rows(sorted(out.glob("sweep*.jsonl")), ROW_FIELDS, "sweep")}
    rows = [by_key[k] for k in keys if k in by_key]
    write_lines(out / "sweep.jsonl", (json.dumps(r, sort_keys=True, allow_nan=False, default=str) for r in rows))
    for f in shard_files:
        f.unlink()
    return len(rows)


def launch_sweep(config: SweepConfig, out: PathLike, resources: SlurmResources, *, config_file: str | None = None,
                 id_budget: float | None = None, wait: bool = True, progress: bool = True) -> dict | list[str]:
    """Run (or resume) `config`'s grid in run directory `out` as a Slurm job array, one task per shard; wait for it,
    resubmitting failed tasks, merge, and write the run directory as `run_sweep_dir` does. Returns its summary, or
    with `wait=False` the job ids just submitted (the tasks still queued are adopted by the next launch)."""
    from ..experiments.engine import ID_BUDGET

    source = config_file or "sweep config"
    check_sweep(config, source)
    out = check_output_dir(out)
    points = grid(config)
    union_rows(sorted(out.glob("sweep*.jsonl")), ROW_FIELDS, "sweep")  # a corrupt rows file is refused first
    with claim_run(out, sweep_settings(config), command=f"aspan sweep {source} --launcher slurm"):
        plan = _plan(out, points, resources)
        todo = plan.incomplete()
        queued = queued_jobs() if todo else {}
        new = _submit(plan, [i for i in todo if plan.jobs.get(i) not in queued], config, resources, source) \
            if any(plan.jobs.get(i) not in queued for i in todo) else []
        if not wait:
            return new
        _watch(plan, config, resources, source, progress)
        merge_shards(config, out)
        shutil.rmtree(out / STATE_DIR, ignore_errors=True)  # the job scripts and logs of tasks that all completed
    return run_sweep_dir(config, out, config_file=config_file, id_budget=ID_BUDGET if id_budget is None else id_budget,
                         progress=progress)


__all__ = ["Launcher", "SlurmResources", "launch_sweep", "load_resources", "merge_shards", "queued_jobs",
           "sweep_task"]
