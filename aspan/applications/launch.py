"""`--launcher slurm`: a command's grid as a Slurm job array through submitit, one array task per shard of the grid
(`aspan sweep`, `aspan demo`, `aspan pretrained`), or a study's units as one job array per stage, one task per unit
(`aspan study`, `launch_study`), then one merge that writes the run directory as a one-machine run.

The run directory makes it safe. The launching command holds it (`aspan.io.claim_run`: a second launch is refused in
one line); each task holds its own shard's lock and appends its rows (keyed, resumable) to its own shard file. The
launcher watches the tasks (`squeue`; no accounting database needed): a task that left the queue with its shard
unfinished (failed, cancelled, pre-empted, out of time) is resubmitted alone, up to `max_retries` times. A sweep's
shard is finished when its rows are on disk; a demo's or pretrained run's when its task returned. The submitted job
ids are recorded in `<run dir>/.slurm/launch.json` (submitit's scripts, pickled calls and logs lie beside it), so a
rerun of the command (after `--no-wait`, a lost login session, or a shard out of retries) adopts the tasks still
queued, submits only the unfinished shards, and never runs a finished shard again. Once every shard is finished, the
shard files are merged into `sweep.jsonl` in grid order and the command runs once without a shard in the launching
process (computing no grid row again) to write the tables, figures, summary and report.

Nothing unchecked reaches Slurm: every resource is checked (`aspan.applications.slurm`: types, ranges, no control
character) and the launch state on read (`read_launch_state`) before anything is submitted, and `sbatch` runs with a
time limit (`aspan.applications.sbatch`), a failed submission leaving no launch folder behind.

The tasks run `sys.executable` on the nodes: the environment and the run directory must be on a filesystem the nodes
share.
"""
from __future__ import annotations

import getpass
import importlib
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from .. import stopping
from ..checks import check_output_dir
from ..errors import UsageError
from ..experiments.engine import ROW_FIELDS
from ..experiments.sweep import SweepConfig, grid, run_sweep, shard_points
from ..io import PathLike, claim_run, read_json, settings_key, union_rows, write_json, write_lines
from .claims import claim_config, claim_study
from .sbatch import check_commands, submit_array
from .slurm import MAX_ARRAY_TASKS, SlurmResources, check_shell_text, load_resources, short_repr
from .studies import study, study_threads
from .sweep import SweepRun, check_sweep, rows_file, run_sweep_dir, sweep_settings

STATE_DIR = ".slurm"  # submitit's folder inside the run directory: job scripts, pickled calls, logs, launch.json
# (removed once every shard is merged; a failed launch leaves it for its logs and for the next launch)
MAX_TASKS = 64  # the default number of array tasks is one per grid point, at most this many


# ----------------------------------------------------------------------------------------------- the queue
def queued_jobs() -> dict[str, str]:
    """{job id: state} of this user's jobs in the Slurm queue, one entry per array task (`12_3`); ChildProcessError
    in one line when `squeue` cannot be run."""
    cmd = ["squeue", "-h", "-r", "-o", "%i|%T", "-u", getpass.getuser()]
    for attempt in range(3):  # a busy controller may time out once
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            raise ChildProcessError("squeue not found: --launcher slurm runs on a Slurm login node") from None
        except (OSError, subprocess.TimeoutExpired) as e:
            why = str(e)
        else:
            if done.returncode == 0:
                break
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        if attempt == 2:
            raise ChildProcessError(f"squeue failed: {why}")
        time.sleep(5)
    jobs = {}
    for line in done.stdout.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id:
            jobs[job_id] = state
    return jobs


# ----------------------------------------------------------------------------------------------- the array
@dataclass
class Array:
    """One command's work as a Slurm job array over the shards of its grid."""

    out: Path  # the run directory
    name: str  # the command ("sweep", "demo", "pretrained"); the jobs are named aspan-<name>
    task: Callable[..., Any]  # what a task runs, task((i, n), *args): a module-level function
    args: tuple  # the task's other arguments (pickled into the run directory's .slurm folder)
    default_tasks: int  # the number of shards when neither the flags nor a previous launch give one
    finished: Callable[[int], set[int]] | None = None  # shards of n whose work is on disk; None: whose task returned
    folder: str = STATE_DIR  # its submitit folder and launch state, in the run directory (a study: one per stage)
    fixed: bool = False  # `default_tasks` is the only task count (a study's stage: one task per unit)


def run_task(task: Callable[..., Any], shard: tuple[int, int], args: tuple, marker: str) -> Any:
    """What each Slurm task runs: `task(shard, *args)`, then `marker` written (its shard is finished)."""
    result = task(shard, *args)
    write_json(marker, {"shard": list(shard)})
    return result


@dataclass
class _Plan:
    """The array of one run directory: how many shards, and the job each shard's latest task runs as."""

    out: Path
    tasks: int
    jobs: dict[int, str]  # shard -> Slurm job id of its latest task
    attempts: dict[int, int]  # shard -> tasks submitted for it by this launch
    folder: str = STATE_DIR  # `Array.folder`

    @property
    def state_file(self) -> Path:
        return self.out / self.folder / "launch.json"

    def marker(self, shard: int) -> Path:
        return self.out / self.folder / "finished" / f"shard-{shard}-of-{self.tasks}.json"

    def save(self) -> None:
        write_json(self.state_file, {"tasks": self.tasks, "jobs": {str(i): j for i, j in self.jobs.items()},
                                     "attempts": {str(i): n for i, n in self.attempts.items()}})


def _plan(array: Array, resources: SlurmResources) -> _Plan:
    """The array for `array.out`: a previous launch's (its task count and jobs, checked: `read_launch_state`), else
    a new one of `resources.array_tasks` shards (default `array.default_tasks`)."""
    state_file = array.out / array.folder / "launch.json"
    if state_file.exists():
        tasks, jobs = read_launch_state(state_file, array.default_tasks if array.fixed else None)
        # its jobs are adopted; the count of attempts starts again (a rerun gives each shard its retries anew)
        return _Plan(array.out, tasks, jobs, {}, array.folder)
    return _Plan(array.out, resources.array_tasks or array.default_tasks, {}, {}, array.folder)


_JOB_ID = re.compile(r"[0-9]{1,20}(_[0-9]{1,9})?")


def read_launch_state(path: Path, tasks: int | None = None) -> tuple[int, dict[int, str]]:
    """(task count, {shard: Slurm job id}) of a launch state file (`_Plan.save`), every value checked: `tasks` an
    integer from 1 to `MAX_ARRAY_TASKS` (and equal to `tasks` where given: a study's stage has one task per unit),
    each shard of `jobs` one of them and each job id a Slurm one (`123` or `123_4`). ValueError in one line naming
    the file and key otherwise."""
    state = read_json(path, "launch state")
    again = "; remove it to start the array afresh"
    if not isinstance(state, dict) or not isinstance(state.get("jobs", {}), dict):
        raise ValueError(f"{path}: not a launch state (an object with tasks and jobs){again}")
    n = state.get("tasks")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_ARRAY_TASKS:
        raise ValueError(f"{path}: tasks must be an integer from 1 to {MAX_ARRAY_TASKS}, got {short_repr(n)}{again}")
    if tasks is not None and n != tasks:
        raise ValueError(f"{path}: tasks is {n}, but this array has {tasks}{again}")
    jobs = {}
    for shard, job in state.get("jobs", {}).items():
        if not (shard.isascii() and shard.isdigit() and int(shard) < n):
            raise ValueError(f"{path}: jobs: {short_repr(shard)} is not a shard of 0-{n - 1}{again}")
        if not isinstance(job, str) or not _JOB_ID.fullmatch(job):
            raise ValueError(f"{path}: jobs: shard {shard}'s {short_repr(job)} is not a Slurm job id{again}")
        jobs[int(shard)] = job
    return n, jobs


def _incomplete(plan: _Plan, array: Array) -> list[int]:
    done = array.finished(plan.tasks) if array.finished else \
        {i for i in range(plan.tasks) if plan.marker(i).exists()}
    return [i for i in range(plan.tasks) if i not in done]


def _submit(plan: _Plan, shards: list[int], array: Array, resources: SlurmResources) -> list[str]:
    """Submit one array of `shards` (one task each); record their job ids in the plan. Returns the ids. A failed
    submission (one line) leaves no launch folder where none was before."""
    folder = plan.out / plan.folder
    fresh = [d for d in (folder, *folder.parents) if not d.exists() and plan.out in d.parents]
    params = {**resources.executor_parameters(), "job_name": f"aspan-{array.name}"}
    calls = [(run_task, (array.task, (i, plan.tasks), array.args, str(plan.marker(i)))) for i in shards]
    try:
        ids = submit_array(folder, params, calls)
    except BaseException:
        for d in fresh:  # what this submission created, innermost first (`.slurm/stage-1`, then `.slurm`)
            shutil.rmtree(d, ignore_errors=True)
        raise
    for i, job in zip(shards, ids):
        plan.jobs[i] = job
        plan.attempts[i] = plan.attempts.get(i, 0) + 1
    plan.save()
    return ids


def _failure(plan: _Plan, shard: int) -> str:
    """Where to read why shard `shard`'s last task ended: the last line of its error log, and the log's path."""
    job_id = plan.jobs[shard]
    log = plan.out / plan.folder / f"{job_id}_0_log.err"
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return f"{lines[-1] if lines else 'no error output'} (log: {log})"


DRAIN_S = 120.0  # how long a finished array's tasks may stay in the queue (writing their result files) before the merge


def _watch(plan: _Plan, array: Array, resources: SlurmResources, progress: bool) -> None:
    """Wait until every shard is finished, resubmitting a shard whose task left the queue without finishing it, then
    until its tasks have left the queue (at most `DRAIN_S`: submitit writes each task's result file after the shard's
    rows, and the merge removes the folder it writes into). ChildProcessError naming the shard once it has used its
    `max_retries`. Ctrl-C or SIGTERM stop the wait (`aspan.stopping`), not the tasks: the next launch adopts them."""
    from tqdm.auto import tqdm

    bar = tqdm(total=plan.tasks, desc=f"slurm tasks ({array.name})", unit="task", disable=not progress)
    drained_by = time.monotonic() + DRAIN_S
    try:
        while True:
            todo = _incomplete(plan, array)
            bar.n = plan.tasks - len(todo)
            bar.refresh()
            queued = queued_jobs()
            if not todo:  # every shard's rows are in; the tasks still write their result files, then leave the queue
                if not any(job in queued for job in plan.jobs.values()) or time.monotonic() > drained_by:
                    return
                time.sleep(min(resources.poll, 1.0))
                continue
            drained_by = time.monotonic() + DRAIN_S
            gone = [i for i in todo if plan.jobs.get(i) not in queued]
            if gone:  # finished just before it left the queue?
                gone = [i for i in gone if i in _incomplete(plan, array)]
            over = [i for i in gone if plan.attempts.get(i, 0) > resources.max_retries]
            if over:
                raise ChildProcessError(f"shard {over[0]}/{plan.tasks} of {plan.out} failed {plan.attempts[over[0]]} "
                                        f"times: {_failure(plan, over[0])}; rerun the command to try again")
            if gone:
                for i in gone:
                    bar.write(f"shard {i}/{plan.tasks}: task {plan.jobs.get(i)} ended with its shard unfinished "
                              f"({_failure(plan, i)}); resubmitting", file=sys.stderr)
                _submit(plan, gone, array, resources)
            stopping.check()
            time.sleep(resources.poll)
            stopping.check()
    finally:
        bar.close()


def check_launch(out: Path, resources: SlurmResources) -> None:
    """What must hold before anything is submitted from run directory `out`: every resource in range
    (`SlurmResources.check`), a run directory path that can stand in the batch script (no control character, no
    `%`, which Slurm reads as a file-name pattern), and Slurm's commands on PATH. UsageError or ChildProcessError in
    one line."""
    try:
        resources.check()
    except ValueError as e:
        raise UsageError(f"slurm resources: {e}") from None
    try:
        check_shell_text(str(Path(out).absolute()), "the run directory's path")
    except ValueError as e:
        raise UsageError(str(e)) from None
    if "%" in str(Path(out).absolute()):
        raise UsageError(f"the run directory's path {str(out)!r} holds a %, which Slurm reads as a file-name pattern: "
                         "use --out without one")
    check_commands()


def run_array(array: Array, resources: SlurmResources, wait: bool = True, progress: bool = True) -> list[str]:
    """Inside the caller's hold on `array.out`: adopt the tasks a previous launch left queued, submit the shards
    neither finished nor queued, and (with `wait`) watch until every shard is finished. Returns the job ids
    submitted by this call before the watch."""
    check_launch(array.out, resources)
    plan = _plan(array, resources)
    todo = _incomplete(plan, array)
    queued = queued_jobs() if todo else {}
    missing = [i for i in todo if plan.jobs.get(i) not in queued]
    new = _submit(plan, missing, array, resources) if missing else []
    if wait:
        _watch(plan, array, resources, progress)
    return new


def shard_files(out: Path) -> list[Path]:
    """The shard rows files in `out`, in shard order of each count."""
    def order(p: Path) -> tuple[int, int]:
        i, _, n = p.name.removeprefix("sweep.shard-").removesuffix(".jsonl").partition("-of-")
        return (int(n), int(i)) if i.isdigit() and n.isdigit() else (0, 0)
    return sorted(out.glob("sweep.shard-*-of-*.jsonl"), key=order)


def merge_rows(out: Path, keys: list[str] | None = None) -> int:
    """Every shard file's rows into `out/sweep.jsonl` (after the rows it holds), once per key, then the shard files
    removed: in the order of `keys` (rows of other keys left out), else round robin over the shards of each count,
    which is the grid order a run without shards writes (shard I of N holds the points I, I + N, ...). Returns the
    number of rows."""
    files = shard_files(out)
    main = out / "sweep.jsonl"
    rows = union_rows([main] if main.exists() else [], ROW_FIELDS, "sweep")
    by_count: dict[str, list[list[dict]]] = {}
    for f in files:
        by_count.setdefault(f.name.rpartition("-of-")[2], []).append(union_rows([f], ROW_FIELDS, "sweep"))
    for shards in by_count.values():
        rows += [r for j in range(max(map(len, shards), default=0)) for s in shards if j < len(s) for r in [s[j]]]
    unique = {}
    for r in rows:
        unique.setdefault(r["key"], r)
    ordered = [unique[k] for k in keys if k in unique] if keys is not None else list(unique.values())
    write_lines(main, (json.dumps(r, sort_keys=True, allow_nan=False, default=str) for r in ordered))
    for f in files:
        f.unlink()
    return len(ordered)


def finish(out: Path) -> None:
    """The job scripts, pickled calls and logs of an array whose shards all finished."""
    shutil.rmtree(out / STATE_DIR, ignore_errors=True)


# ----------------------------------------------------------------------------------------------- the commands
def sweep_task(shard: tuple[int, int], config: SweepConfig, out: str, source: str) -> int:
    """One array task of a sweep: shard `shard` of `config`'s grid into `out`'s shard file, holding that shard's lock
    (rows only: the launcher's merge writes the tables, figures and selection). Returns the shard file's rows."""
    with claim_run(out, sweep_settings(config), shard=shard,
                   command=f"aspan sweep {source} --shard {shard[0]}/{shard[1]}"):
        rows = run_sweep(config, rows_file(Path(out), shard), shard=shard, progress=False)
    return len(rows)


def sweep_array(config: SweepConfig, out: Path, source: str) -> Array:
    """A sweep's array: one task per shard (default one per grid point, at most `MAX_TASKS`); a shard is finished
    when every row of its points is on disk (in any rows file)."""
    points = grid(config)

    def finished(n: int) -> set[int]:
        done = {r["key"] for r in union_rows(sorted(out.glob("sweep*.jsonl")), ROW_FIELDS, "sweep")}
        return {i for i in range(n) if all(settings_key(p) in done for p in shard_points(points, (i, n)))}

    return Array(out, "sweep", sweep_task, (config, str(out), source), min(len(points), MAX_TASKS), finished)


def launch_sweep(config: SweepConfig, out: PathLike, resources: SlurmResources, run: SweepRun | None = None, *,
                 wait: bool = True) -> dict | list[str]:
    """Run (or resume) `config`'s grid in run directory `out` as a Slurm job array, one task per shard; wait for it,
    resubmitting failed tasks, merge, and write the run directory as `run_sweep_dir` does with `run` (its
    `config_file`, `id_budget` and `progress`; the launcher runs every shard). Returns its summary, or with
    `wait=False` the job ids just submitted (the tasks still queued are adopted by the next launch)."""
    run = run or SweepRun()
    progress = run.progress
    source = run.config_file or "sweep config"
    check_sweep(config, source)
    out = check_output_dir(out)
    union_rows(sorted(out.glob("sweep*.jsonl")), ROW_FIELDS, "sweep")  # a corrupt rows file is refused first
    with claim_run(out, sweep_settings(config), command=f"aspan sweep {source} --launcher slurm"):
        new = run_array(sweep_array(config, out, source), resources, wait, progress)
        if not wait:
            return new
        merge_rows(out, [settings_key(p) for p in grid(config)])
        finish(out)
    return run_sweep_dir(config, out, replace(run, shard=None, limit=None, command=None))


APPS = {"demo": "aspan.applications.demo:run_demo", "pretrained": "aspan.applications.pretrained:run_pretrained"}
APP_TASKS = 4  # the default number of shards of `aspan demo` and `aspan pretrained` (each task sets its model up)


def _app(name: str) -> tuple[Any, Callable[..., dict]]:
    """(module, run function) of application `name`."""
    module, _, function = APPS[name].partition(":")
    mod = importlib.import_module(module)
    return mod, getattr(mod, function)


def app_task(shard: tuple[int, int], name: str, cfg: Any, command: str) -> dict:
    """One array task of `aspan demo` or `aspan pretrained`: the run with `shard` (it sets its model up, evaluates
    that shard of the grid into its own rows file and stops), holding that shard's lock."""
    run = _app(name)[1]
    return run(replace(cfg, shard=shard), command=f"{command} --shard {shard[0]}/{shard[1]}", progress=False)


def launch_app(name: str, cfg: Any, resources: SlurmResources, *, command: str, wait: bool = True,
               progress: bool = True) -> dict | list[str]:
    """Run (or resume) application `name` ("demo" or "pretrained") with settings `cfg` as a Slurm job array over
    the shards of its intervention grid; wait, resubmitting failed tasks, merge the shards' rows into `sweep.jsonl`,
    then run it without a shard in this process (it computes no row again) to write the run directory as a
    one-machine run. A shard is finished when its task returned. Returns the run's summary, or with `wait=False`
    the job ids just submitted."""
    module, run = _app(name)
    if cfg.shard is not None:
        raise UsageError("--shard and --launcher slurm: the launcher submits every shard (see --array-tasks)")
    cfg.check()
    out = check_output_dir(cfg.out)
    union_rows(sorted(out.glob("sweep*.jsonl")), ROW_FIELDS, "sweep")  # a corrupt rows file is refused first
    with claim_config(out, name, cfg, module.RUNTIME, command=f"{command} --launcher slurm"):
        new = run_array(Array(out, name, app_task, (name, cfg, command), APP_TASKS), resources, wait, progress)
        if not wait:
            return new
        merge_rows(out)
        finish(out)
    return run(cfg, command=command, progress=progress)


@dataclass(frozen=True)
class StudyJob:
    """What each array task of a study needs to run one unit as `aspan study ... --unit K` would."""

    name: str  # the registered study (`aspan.applications.studies.REGISTRY`)
    command: str  # its `aspan study` subcommand, under which the run directory's configuration is recorded
    config: Any  # its settings (checked)
    out: str  # the run directory
    options: dict[str, Any]  # the command's options that change what it computes (`claim_study`)
    config_file: str | None = None  # the `--config` TOML, whose content is part of the configuration
    threads: int | None = None  # torch CPU threads of each task (None: torch's choice)


def study_task(shard: tuple[int, int], job: StudyJob, indices: list[int]) -> int:
    """One array task of a study: unit `indices[shard[0]]` of its units, alone, holding that unit's lock (its rows
    only: the launcher's merge writes the tables, figures and report). Returns the unit's index."""
    found = study(job.name)
    units = found.units(job.config)
    i = indices[shard[0]]
    with study_threads(job.threads), claim_study(job.out, job.command, job.options, job.config_file,
                                                 shard=(i, len(units)),
                                                 command=f"aspan study {job.command} --out {job.out} --unit {i}"):
        found.run(job.config, job.out, progress=False, unit=units[i].key)
    return i


def launch_study(job: StudyJob, resources: SlurmResources, *, wait: bool = True,
                 progress: bool = True) -> list[str] | None:
    """Inside the caller's hold on `job.out` (`claim_study`): run the study's units as Slurm job arrays, one per
    stage in order (`aspan.applications.studies.Unit`), one task per unit; each array is watched, its failed tasks
    resubmitted, before the next stage's is submitted. A unit is finished when its task returned. Returns None once
    every unit is finished (the caller then runs the study in its own process: it merges the units' rows, trains
    nothing and writes every output, then calls `finish`); with `wait=False`, the job ids submitted for the first
    stage not finished (a rerun adopts them and goes on to the next stage)."""
    if resources.array_tasks is not None:
        raise UsageError("--array-tasks: a study's array has one task per unit of a stage (see --list-units)")
    units = study(job.name).units(job.config)
    out = Path(job.out)
    for stage in sorted({u.stage for u in units}):
        indices = [i for i, u in enumerate(units) if u.stage == stage]
        array = Array(out, "study", study_task, (job, indices), len(indices), folder=f"{STATE_DIR}/stage-{stage}",
                      fixed=True)
        each = replace(resources, array_tasks=len(indices))
        if not wait and _incomplete(_plan(array, each), array):
            return run_array(array, each, wait=False)
        run_array(array, each, wait, progress)
    return None


__all__ = ["Array", "SlurmResources", "StudyJob", "app_task", "finish", "launch_app", "launch_study", "launch_sweep",
           "load_resources", "merge_rows", "queued_jobs", "run_array", "study_task", "sweep_task"]
