"""`aspan show --task TASK`: print samples with, for every target character, the positions it references
(`aspan.applications.data.show_samples`)."""
from __future__ import annotations

import argparse
import shutil

from aspan.applications.data import show_samples, task_preset

from .argtypes import nonneg_int
from .data import add_task_arguments, task_of

HELP = "print task samples with each target character's reference positions marked"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan show --task reversal -n 2",
    "aspan show --task flipflop --param instructions=6 --seed 3",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options and arguments of `aspan show` to its parser."""
    add_task_arguments(parser)
    parser.add_argument("-n", type=nonneg_int, default=1, help="number of samples")
    parser.add_argument("--width", type=nonneg_int, default=0, help="line width (default: the terminal's)")


def run(args: argparse.Namespace) -> int:
    """Run `aspan show` with the parsed arguments; the exit code."""
    task = task_preset(task_of(args), args.split, args.param or [])
    width = args.width or shutil.get_terminal_size((100, 24)).columns
    for block in show_samples(task, args.n, args.seed, width, split=args.split):
        print(block)
    return 0
