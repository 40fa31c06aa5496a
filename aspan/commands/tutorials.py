"""`aspan tutorials DIR`: copy the tutorial notebooks aspan ships into DIR, to open with JupyterLab
(`aspan.shipped.copy_tutorials`; from a checkout they are the repository's notebooks/)."""
from __future__ import annotations

import argparse
import sys

from ..shipped import copy_tutorials

HELP = "copy the tutorial notebooks into a directory, to run them in JupyterLab (pip install 'aspan[notebooks]')"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan tutorials my-tutorials",
    "aspan tutorials my-tutorials --force",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options and arguments of `aspan tutorials` to its parser."""
    parser.add_argument("dir", metavar="DIR", help="directory to copy the notebooks into (created)")
    parser.add_argument("--force", action="store_true", help="overwrite notebooks already there (edits are lost)")


def run(args: argparse.Namespace) -> int:
    """Run `aspan tutorials` with the parsed arguments; the exit code."""
    for path in copy_tutorials(args.dir, overwrite=args.force):
        print(path)
    print(f"open them with: jupyter lab {args.dir}", file=sys.stderr)
    return 0
