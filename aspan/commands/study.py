"""`aspan study NAME`: run one of the studies of `aspan.applications.studies.REGISTRY` (each writes a run
directory) through the registry; each subcommand's options are parsed by its module in `aspan.commands.studies`.
Every subcommand also lists the study's units (`--list-units`), runs one alone (`--unit K`), or runs them all as
Slurm job arrays (`--launcher slurm`, `aspan.applications.launch.launch_study`)."""
from __future__ import annotations

import argparse
import sys
from importlib import import_module
from pathlib import Path

from ..applications.studies import STUDIES, study, study_threads
from ..config import to_toml
from ..errors import UsageError
from .grammar import PRINT_CONFIG_HELP, HelpFormatter, epilog
from .launcher_options import RESOURCE_FLAGS, add_launcher_options, check_launcher, print_job_ids, resource_flags

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
        add_unit_options(p)
        add_launcher_options(p)
        p.set_defaults(_study_config=mod.config_from_args, _study_module=mod)


def add_unit_options(p: argparse.ArgumentParser) -> None:
    """`--list-units` and `--unit` (`aspan.applications.studies.Unit`)."""
    g = p.add_argument_group("units", "the study's independent pieces of work (a learning-rate grid on the first "
                                      "seed, then each other seed at the chosen rate), in stages")
    g.add_argument("--list-units", action="store_true",
                   help="print the study's units (index, stage, key) and exit")
    g.add_argument("--unit", metavar="K", default=None,
                   help="run only unit K (its index or key, see --list-units) into its own row files, beside "
                        "other units running at once; a run without --unit then merges them and writes every output")


# Options that change how a study runs, not what it computes: they may differ between a run and its resumption.
RUNTIME = ("out", "device", "threads", "quiet", "verbose", "print_config", "no_report", "command", "study",
           "list_units", "unit", "launcher", "sbatch", "no_wait", *RESOURCE_FLAGS)


def run(args: argparse.Namespace) -> int:
    """Build the study's settings (every one checked), then run it holding its run directory: one job at a time, one
    configuration (the study's options); or one unit of it, holding that unit's lock; or every unit as Slurm job
    arrays, then the whole study in this process."""
    from ..applications.claims import claim_study  # loads torch: not at start-up

    config = args._study_config(args)  # bad settings are refused before the run directory is touched
    if args.print_config:
        printer = getattr(args._study_module, "print_config", None)  # a module may add what selects its study
        print(printer(args, config) if printer else to_toml(config), end="")
        return 0
    check_launcher(args)
    found = study(args._study_module.registered(args))
    if args.list_units:  # writes nothing: no --out needed
        for i, u in enumerate(found.units(config)):
            print(f"{i}\t{u.stage}\t{u.key}")
        return 0
    if args.out is None:
        raise UsageError("--out DIR is required: the study's run directory (not needed with --list-units or "
                         "--print-config)")
    given = {k: v for k, v in vars(args).items() if k not in RUNTIME and not k.startswith("_") and not callable(v)}
    config_file = getattr(args, "config", None)
    if args.unit is not None:
        return run_unit(args, config, given)
    with claim_study(args.out, args.study, given, config_file):
        if args.launcher == "slurm":
            return run_launched(args, config, given)
        return run_registered(args, config)


def run_unit(args: argparse.Namespace, config, given: dict) -> int:
    """`--unit K`: that unit alone, holding its own lock (`claim_study` with the unit as shard)."""
    from ..applications.claims import claim_study

    if args.launcher == "slurm":
        raise UsageError("--unit and --launcher slurm: the launcher submits every unit")
    found = study(args._study_module.registered(args))
    units = found.units(config)
    try:
        i, unit = found.unit(config, args.unit)
    except KeyError as e:
        raise UsageError(f"--unit: {e.args[0]}") from None
    with claim_study(args.out, args.study, given, getattr(args, "config", None), shard=(i, len(units))), \
            study_threads(getattr(args, "threads", None)):
        found.run(config, args.out, progress=not args.quiet, unit=unit.key)
    print(f"unit {i} ({unit.key}) done in {args.out}; run the command without --unit to merge the units and write "
          "the study's outputs", file=sys.stderr)
    return 0


def run_launched(args: argparse.Namespace, config, given: dict) -> int:
    """`--launcher slurm`, inside the hold on the run directory: every unit as Slurm job arrays (one per stage),
    then the whole study in this process (it merges the units' rows and trains nothing again); with `--no-wait`,
    the job ids of the stage just submitted."""
    from ..applications.launch import StudyJob, finish, launch_study, load_resources

    config_file = getattr(args, "config", None)
    resources = load_resources(config_file, resource_flags(args))
    job = StudyJob(args._study_module.registered(args), args.study, config, str(args.out), given, config_file,
                   getattr(args, "threads", None))
    ids = launch_study(job, resources, wait=not args.no_wait, progress=not args.quiet)
    if ids is not None:
        print_job_ids(ids)
        return 0
    code = run_registered(args, config)
    finish(Path(args.out))
    return code


def run_registered(args: argparse.Namespace, config) -> int:
    """Run the registered study the subcommand names (`registered(args)` of its options module) with `config`, then
    let that module show what it found."""
    mod = args._study_module
    with study_threads(getattr(args, "threads", None)):  # the caller's thread count restored afterwards
        result = study(mod.registered(args)).run(config, args.out, progress=not args.quiet, **mod.run_options(args))
    return int(mod.show(args, config, result) or 0)
