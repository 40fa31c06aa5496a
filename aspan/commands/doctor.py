"""`aspan doctor`: what results computed here would record (versions, backend, device), one `name: value` a line."""
from __future__ import annotations

import argparse

from aspan.environment import describe_environment

HELP = "print the versions, backend and device a run here would record (as in run.json)"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan doctor",
    "ASPAN_BACKEND=bridge aspan doctor",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No options: the backend follows ASPAN_BACKEND, the device is the one commands pick by default."""


def run(args: argparse.Namespace) -> int:
    """Run `aspan doctor` with the parsed arguments; the exit code."""
    print("\n".join(describe_environment()))
    return 0
