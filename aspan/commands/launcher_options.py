"""`--launcher local|slurm` and the Slurm resources, for the commands that can run as a job array
(`aspan.applications.launch`)."""
from __future__ import annotations

import argparse
from typing import Any

from ..errors import UsageError
from ..options import LAUNCHERS
from .argtypes import nonneg_int, positive_float, positive_int
from .grammar import from_settings

RESOURCE_FLAGS = ("partition", "time", "cpus", "gpus", "mem", "array_parallelism", "array_tasks", "max_retries", "poll")


def _sbatch_option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (an sbatch option without its dashes), got {text!r}")
    return key.strip().lstrip("-"), value


def add_launcher_options(p: argparse.ArgumentParser) -> None:
    """The launcher, the resources of each Slurm task (each default: the `--config` TOML's `[slurm]` table, else the
    built-in one) and how the launcher waits."""
    g = p.add_argument_group("launcher", "where the work runs; with slurm, one Slurm array task per shard (a study: "
                                         "per unit, one array per stage) through submitit")
    g.add_argument("--launcher", choices=LAUNCHERS, default="local",
                   help="local: this process (default); slurm: a job array, watched, failed tasks resubmitted, "
                        "then merged into the run directory")
    g.add_argument("--partition", default=None, help="Slurm partition (when not given: the cluster's default)")
    g.add_argument("--time", type=positive_int, default=None, metavar="MIN", help="minutes per task")
    g.add_argument("--cpus", type=positive_int, default=None, help="CPUs per task")
    g.add_argument("--gpus", type=nonneg_int, default=None, help="GPUs per task")
    g.add_argument("--mem", default=None, metavar="SIZE",
                   help="memory per task, e.g. 16G (when not given: the partition's default)")
    g.add_argument("--array-parallelism", type=positive_int, default=None, metavar="N",
                   help="array tasks running at once")
    g.add_argument("--array-tasks", type=positive_int, default=None, metavar="N",
                   help="array tasks, one shard of the grid each (when not given: sweep one per grid point, at most "
                        "64; demo and pretrained 4; a resumed launch keeps its first count; a study has one per "
                        "unit)")
    g.add_argument("--max-retries", type=nonneg_int, default=None, metavar="N",
                   help="times a failed, cancelled or pre-empted task is resubmitted alone")
    g.add_argument("--sbatch", type=_sbatch_option, action="append", default=None, metavar="KEY=VALUE",
                   help="extra sbatch option, repeatable, e.g. --sbatch account=lab --sbatch qos=low (a word, a "
                        "value without control characters; not one the launcher sets, e.g. array or output)")
    g.add_argument("--poll", type=positive_float, default=None, metavar="SECONDS",
                   help="seconds between two looks at the queue (above 0, at most 3600)")
    g.add_argument("--no-wait", action="store_true",
                   help="submit, print the job ids and return (rerun without it to wait, resubmit and merge)")
    # --help shows each default as SlurmResources holds it (imported only then)
    from_settings(p, "aspan.applications.slurm:SlurmResources", only=RESOURCE_FLAGS)


def resource_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The resource flags given (None: not given), as `SlurmResources` fields."""
    flags = {name: getattr(args, name) for name in RESOURCE_FLAGS}
    flags["sbatch"] = dict(args.sbatch) if args.sbatch else None
    return flags


def check_launcher(args: argparse.Namespace) -> None:
    """Slurm-only flags without `--launcher slurm`, or `--shard` with it: a one-line usage error."""
    if args.launcher == "slurm":
        if getattr(args, "shard", None) is not None:
            raise UsageError("--shard and --launcher slurm: the launcher submits every shard (see --array-tasks)")
        if getattr(args, "limit", None) is not None:
            raise UsageError("--limit and --launcher slurm: every task completes its shard")
        return
    given = [n for n in (*RESOURCE_FLAGS, "sbatch") if getattr(args, n) is not None] + \
        (["no_wait"] if args.no_wait else [])
    if given:
        raise UsageError(f"--{given[0].replace('_', '-')} needs --launcher slurm")


def print_job_ids(ids: list[str]) -> None:
    """What `--no-wait` prints: the array's job id (a resubmitted shard runs as a job of its own)."""
    print(" ".join(sorted({j.split("_")[0] for j in ids}, key=int)) if ids
          else "nothing submitted: every shard is finished or already queued")


def run_launched(args: argparse.Namespace, name: str, cfg: Any, command: str) -> int:
    """`aspan demo` or `aspan pretrained` with `--launcher slurm` (`aspan.applications.launch.launch_app`)."""
    from aspan.applications.launch import launch_app, load_resources

    resources = load_resources(getattr(args, "config", None), resource_flags(args))
    result = launch_app(name, cfg, resources, command=command, wait=not args.no_wait, progress=not args.quiet)
    if args.no_wait:
        print_job_ids(result)
    return 0
