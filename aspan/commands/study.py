"""`aspan study NAME`: run one of the studies of `aspan.applications.studies.REGISTRY` (each writes a run
directory) through the registry; each subcommand's options are parsed by its module in `aspan.commands.studies`."""
from __future__ import annotations

import argparse
from importlib import import_module

from ..applications.studies import STUDIES, study, use_threads
from ..config import to_toml
from .grammar import PRINT_CONFIG_HELP, HelpFormatter, epilog

HELP = "run a study that tests a paper's claim (qk, abc, parity); each writes tables, figures and a report"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan study qk --quick --out runs/qk",
    "aspan study parity --quick --out runs/parity",
    "aspan study abc --protocol paper --quick --out runs/abc-paper",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one subcommand per study (`aspan study NAME`) to the parser."""
    sub = parser.add_subparsers(dest="study", metavar="STUDY", required=True)
    for name in STUDIES:
        mod = import_module(f"aspan.commands.studies.{name}")
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP, formatter_class=HelpFormatter,
                           epilog=epilog(mod.EXAMPLES))
        mod.add_arguments(p)
        p.add_argument("--print-config", action="store_true", help=PRINT_CONFIG_HELP)
        p.set_defaults(_study_config=mod.config_from_args, _study_module=mod)


# Options that change how a study runs, not what it computes: they may differ between a run and its resumption.
RUNTIME = ("out", "device", "threads", "quiet", "verbose", "print_config", "no_report", "command", "study")


def run(args: argparse.Namespace) -> int:
    """Build the study's settings (every one checked), then run it holding its run directory: one job at a time, one
    configuration (the study's options)."""
    from ..applications.claims import claim_study  # loads torch: not at start-up

    config = args._study_config(args)  # bad settings are refused before the run directory is touched
    if args.print_config:
        print(to_toml(config), end="")
        return 0
    given = {k: v for k, v in vars(args).items() if k not in RUNTIME and not k.startswith("_") and not callable(v)}
    with claim_study(args.out, args.study, given, getattr(args, "config", None)):
        return run_registered(args, config)


def run_registered(args: argparse.Namespace, config) -> int:
    """Run the registered study the subcommand names (`registered(args)` of its options module) with `config`, then
    let that module show what it found."""
    mod = args._study_module
    use_threads(getattr(args, "threads", None))
    result = study(mod.registered(args)).run(config, args.out, progress=not args.quiet, **mod.run_options(args))
    return int(mod.show(args, config, result) or 0)
