"""`aspan sweep --config FILE`: a resumable grid of attention interventions, each against a matched baseline
(`aspan.applications.sweep.run_sweep_dir`; the interventions are those of Spiegel et al. 2025, Appendix F)."""
from __future__ import annotations

import argparse
from pathlib import Path

from aspan.config import load_config
from aspan.options import ID_BUDGET

from .argtypes import device, nonneg_int, output_dir, points_fraction, shard
from .grammar import PRINT_CONFIG_HELP, add_config_file, add_quiet, config_file
from .launcher_options import add_launcher_options, check_launcher, print_job_ids, resource_flags

HELP = "run a resumable grid of attention reinforcement settings from a TOML config (rows to JSONL, figures)"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan sweep --config reversal_reinforce --out runs/sweep --quiet",
    "aspan sweep --config reversal_reinforce --out runs/sweep --shard 0/4",
    "aspan sweep --config reversal_reinforce --out runs/sweep --limit 0",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options and arguments of `aspan sweep` to its parser."""
    add_config_file(p, "TOML sweep config: a file, or a config aspan ships, by name (reversal_reinforce)")
    p.add_argument("--out", type=output_dir, default=None, help="run directory (default runs/sweep-<config name>)")
    p.add_argument("--shard", type=shard, default=None, metavar="I/N",
                   help="run only shard I of N (0 <= I < N), e.g. $SLURM_ARRAY_TASK_ID/8")
    p.add_argument("--limit", type=nonneg_int, default=None,
                   help="stop after this many new rows (0: only rebuild tables and figures)")
    p.add_argument("--device", type=device, default=None, help="override the config's device")
    p.add_argument("--id-budget", type=points_fraction, default=None, metavar="PP",
                   help="selection rule: largest OOD exact gain whose ID exact drop is at most PP percentage points "
                        f"(default: {ID_BUDGET * 100:g})")
    p.add_argument("--print-config", action="store_true", help=PRINT_CONFIG_HELP)
    add_quiet(p)
    add_launcher_options(p)


def run(args: argparse.Namespace) -> int:
    """Run `aspan sweep` with the parsed arguments; the exit code."""
    check_launcher(args)
    path = config_file(args)
    from aspan.applications.sweep import SweepConfig, format_selection, run_sweep_dir  # pandas, torch

    args.config = path  # the launcher reads its [slurm] table from the same file
    # the file's keys, then --device; fully validated before any model work
    config = load_config(SweepConfig, toml_path=path, flags={"device": args.device}, name="sweep config")
    if args.print_config:
        print(config.toml_text(), end="")
        return 0
    if args.launcher == "slurm":
        return launch(args, config)
    summary = run_sweep_dir(config, args.out or f"runs/sweep-{Path(path).stem}", sweep_run(args, path))
    if "selection" in summary:  # the grid is complete: the selection rule's choice
        print(format_selection(summary["selection"]))
    return 0


def launch(args: argparse.Namespace, config) -> int:
    """Run the sweep's grid as a Slurm job array (`--launcher slurm`); the exit code."""
    from aspan.applications.launch import launch_sweep, load_resources
    from aspan.applications.sweep import format_selection

    resources = load_resources(args.config, resource_flags(args))
    result = launch_sweep(config, args.out or f"runs/sweep-{Path(args.config).stem}", resources,
                          sweep_run(args, args.config), wait=not args.no_wait)
    if args.no_wait:
        print_job_ids(result)
    elif "selection" in result:  # the grid is complete: the selection rule's choice, as a local run prints it
        print(format_selection(result["selection"]))
    return 0


def sweep_run(args: argparse.Namespace, path: str):
    """How this job runs the grid (`aspan.applications.sweep.SweepRun`) from the flags given (an unset flag keeps
    the dataclass default)."""
    from aspan.applications.sweep import SweepRun

    given = {"shard": args.shard, "limit": args.limit, "id_budget": args.id_budget}
    return SweepRun(config_file=str(path), progress=not args.quiet, **{k: v for k, v in given.items() if v is not None})
