"""`aspan data TASK`: write task samples as JSONL (one `Sample.to_dict()` per line), atomically; `--list` the tasks."""
from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from aspan import tasks
from aspan.io import write_lines
from aspan.tasks.params import parse_params, task_defaults

from .argtypes import nonneg_int, output_file_or_stdout

HELP = "generate task samples as JSONL (or --list the tasks, their parameters and ID/OOD presets)"

def task_from_args(args: argparse.Namespace) -> tasks.Task:
    """The task named by `args.task` with its `args.split` preset and `args.param` overrides."""
    if not args.task:
        raise ValueError(f"a TASK is required; choose one of {', '.join(tasks.NAMES)}")
    tasks.task_class(args.task)  # unknown task: clear error before parsing parameters
    return tasks.preset(args.task, args.split, **parse_params(args.task, args.param or []))


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """TASK, --split, --seed, -n and --param, shared by `data` and `show`."""
    parser.add_argument("task", nargs="?", metavar="TASK", help=f"one of {', '.join(tasks.NAMES)}")
    parser.add_argument("--split", choices=tasks.SPLITS, default="id", help="preset: in- or out-of-distribution")
    parser.add_argument("--seed", type=nonneg_int, default=0)
    parser.add_argument("--param", action="append", metavar="KEY=VALUE",
                        help="override a preset parameter (ints, ranges 5-10 or 5,10, booleans, strings); repeatable")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_task_arguments(parser)
    parser.add_argument("-n", type=nonneg_int, default=1000, help="number of samples")
    parser.add_argument("-o", "--output", type=output_file_or_stdout, default="-",
                        help="JSONL file, '-' for stdout (default)")
    parser.add_argument("--list", action="store_true", help="list tasks, parameters and presets, then exit")


def describe_tasks() -> str:
    """Every task with its parameters (constructor defaults) and the full ID/OOD preset parameters."""
    out = []
    for name in tasks.NAMES:
        fmt = lambda d: "  ".join(f"{k}={v!r}" for k, v in d.items())  # noqa: E731
        doc = (sys.modules[tasks.task_class(name).__module__].__doc__ or "").strip()
        out += [f"{name}: {doc.splitlines()[0]}" if doc else name,
                f"  parameters: {fmt(task_defaults(name))}"]
        out += [f"  {split:<3}: {fmt(tasks.preset(name, split).params())}" for split in tasks.SPLITS]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(describe_tasks())
        return 0
    if args.n < 0:
        raise ValueError(f"-n must be >= 0, got {args.n}")
    task = task_from_args(args)
    stream = task.stream(args.seed)
    bar = tqdm(range(args.n), desc=f"{task.name} {args.split}", disable=True if args.output == "-" else None)
    lines = (next(stream).to_json() for _ in bar)
    if args.output == "-":
        for line in lines:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
    else:
        write_lines(args.output, lines)
    return 0
