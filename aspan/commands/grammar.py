"""Options every command spells the same way (the command-line grammar of the CLI reference in the README).

- `--quiet`: no progress bars. `--no-progress`, its old spelling in `rank`, `sweep`, `abc` and the studies, still
  works for one release and says so in one line on stderr.
"""
from __future__ import annotations

import argparse
import sys

QUIET_HELP = "no progress bars"


class _Deprecated(argparse.Action):
    """An old spelling of a switch: sets `dest` to True like the new one, after one line on stderr naming both."""

    def __init__(self, option_strings, dest, new: str, help=None, **kw):
        super().__init__(option_strings, dest=dest, nargs=0, help=help, **kw)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: {option_string} is deprecated and goes in the next release; use {self.new}",
              file=sys.stderr)
        setattr(namespace, self.dest, True)


def add_quiet(parser: argparse.ArgumentParser, old: str | None = "--no-progress") -> None:
    """`--quiet` (dest `quiet`), and `old`, when given, as its deprecated alias."""
    parser.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    if old:
        parser.add_argument(old, action=_Deprecated, dest="quiet", new="--quiet", default=False,
                            help="deprecated spelling of --quiet (goes in the next release)")
