"""The command line of the studies in `aspan.applications.studies` (`aspan study NAME`): one module per subcommand
(`STUDIES`), defining `HELP` (one line), `EXAMPLES` (the command lines that end its `--help`),
`add_arguments(parser)`, `config_from_args(args)` (the study's settings through `aspan.config.load_config`, checked
before its run directory is claimed), `registered(args)` (the study of `REGISTRY` it runs), `run_options(args)` (what
that study's `run` takes besides settings, output and progress) and `show(args, config, result) -> int` (what it
prints once the study is done). `aspan.commands.study` runs the study through the registry between the two."""
from __future__ import annotations

import argparse

from ...errors import UsageError
from ...options import comma_list


def flag_list(args: argparse.Namespace, name: str, kind: type) -> tuple | None:
    """The comma-separated value of the flag `--name` as a tuple of `kind`, or None when it was not given;
    UsageError naming the flag."""
    text = getattr(args, name)
    if not text:
        return None
    try:
        return comma_list(text, kind)
    except ValueError as e:
        raise UsageError(f"--{name.replace('_', '-')}: {e}") from None


def preset(cls: type, args: argparse.Namespace):
    """The settings a study starts from before its config file and flags: the curves protocol's defaults (tiny
    with --quick) under `--protocol curves`, else the --quick preset, else None (the dataclass's defaults)."""
    if getattr(args, "protocol", None) == "curves":
        return cls.curves(quick=args.quick)
    return cls.quick() if args.quick else None
