"""`aspan data --task TASK`: write task samples as JSONL (one `Sample.to_dict()` per line), atomically; `--list`
the tasks (`aspan.applications.data`)."""
from __future__ import annotations

import argparse

from aspan.applications.data import SPLITS, TASK_NAMES, describe_tasks, task_preset, write_samples

from ..errors import UsageError
from .argtypes import nonneg_int, output_file_or_stdout
from .grammar import Once, add_quiet, notice

HELP = "generate task samples as JSONL (or --list the tasks, their parameters and ID/OOD presets)"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan data --list",
    "aspan data --task reversal -n 2",
    "aspan data --task addition --split ood -n 100 -o addition_ood.jsonl --param digits=5-8",
)


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """--task, --split, --seed and --param, shared by `data` and `show` (the positional TASK: the old spelling of
    --task, kept for one release; `task_of` resolves the two)."""
    parser.add_argument("--task", help=f"one of {', '.join(TASK_NAMES)}")
    parser.add_argument("old_task", nargs="?", metavar="TASK",
                        help="deprecated spelling of --task TASK (goes in the next release)")
    parser.add_argument("--split", choices=SPLITS, default="id", help="preset: in- or out-of-distribution")
    parser.add_argument("--seed", type=nonneg_int, default=0, help="sample seed (default 0)")
    parser.add_argument("--param", action="append", metavar="KEY=VALUE",
                        help="override a preset parameter (ints, ranges 5-10 or 5,10, booleans, strings); repeatable")


def task_of(args: argparse.Namespace) -> str | None:
    """--task, or the old positional TASK (after a one-line deprecation notice on stderr)."""
    if args.old_task is None:
        return args.task
    if args.task is not None:
        raise UsageError(f"give the task once: --task {args.task} (not also {args.old_task})")
    notice(f"aspan {args.command}", "the positional TASK", "--task TASK")
    return args.old_task


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options and arguments of `aspan data` to its parser."""
    add_task_arguments(parser)
    parser.add_argument("-n", type=nonneg_int, default=1000, help="number of samples")
    parser.add_argument("-o", "--output", type=output_file_or_stdout, default="-", action=Once,
                        help="JSONL file, '-' for stdout (default)")
    parser.add_argument("--list", action="store_true", help="list tasks, parameters and presets, then exit")
    add_quiet(parser, old=None)


def run(args: argparse.Namespace) -> int:
    """Run `aspan data` with the parsed arguments; the exit code."""
    if args.list:
        print(describe_tasks())
        return 0
    task = task_preset(task_of(args), args.split, args.param or [])
    write_samples(task, args.n, args.seed, args.output, desc=f"{task.name} {args.split}",
                  progress=not args.quiet)
    return 0
