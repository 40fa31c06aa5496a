"""`aspan study parity`: the command line of `aspan.applications.studies.parity` (does the format decide length
generalization?)."""
from __future__ import annotations

import argparse

from ...config import load_config
from ...tasks.parity import FORMATS
from ..argtypes import output_dir
from ..grammar import add_quiet
from . import flag_list, preset

HELP = "parity formats (Ebrahimi et al. 2024): train each from scratch, test at 1x/2x/5x/10x the training length"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan study parity --quick --out runs/parity",
    "aspan study parity --config configs/parity_study_gpu.toml --out runs/parity --device cuda",
    "aspan study parity --quick --out runs/parity --launcher slurm --time 30",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of `aspan study parity` to its parser."""
    parser.add_argument("--out", type=output_dir, help="run directory (created; a rerun resumes it); required, except "
                                                       "with --list-units and --print-config")
    parser.add_argument("--quick", action="store_true", help="tiny settings (< 1 min), for tests")
    parser.add_argument("--config", help="TOML file with ParityStudyConfig settings (a [parity] table), e.g. a GPU run")
    parser.add_argument("--formats", help=f"comma-separated subset of {','.join(FORMATS)}")
    parser.add_argument("--train-length", type=int, help="longest training input in bits (default 8)")
    parser.add_argument("--steps", type=int, help="optimiser steps per run (default 800)")
    parser.add_argument("--seeds", type=int, help="training seeds per format (default 3)")
    parser.add_argument("--lrs", help="comma-separated learning-rate grid (default 1e-3,3e-3)")
    parser.add_argument("--protocol", choices=("budget", "curves"),
                        help="budget (default): every run trains --steps steps; curves: until ID exact >= fit_exact "
                             "(0.99) on held-out training-length inputs, or --cap steps (defaults: up to 20 bits, "
                             "tested at 1x/2x/5x)")
    parser.add_argument("--cap", type=int, help="curves protocol: the most steps a run trains (default 10000)")
    parser.add_argument("--positional", help="positional encoding of the models (default rotary)")
    parser.add_argument("--device", help="cpu (default), cuda or auto")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default 1)")
    parser.add_argument("--no-report", action="store_true", help="skip report.html")
    add_quiet(parser)


def config_from_args(args: argparse.Namespace):
    """ParityStudyConfig: the defaults (or --quick's), then --config (its [parity] table), then the flags given;
    checked."""
    from ...applications.studies.parity import ParityStudyConfig

    flags = {name: getattr(args, name) for name in ("train_length", "steps", "seeds", "device", "threads",
                                                    "positional", "protocol", "cap")}
    flags.update(formats=flag_list(args, "formats", str), lrs=flag_list(args, "lrs", float))
    return load_config(ParityStudyConfig, toml_path=args.config, flags=flags, base=preset(ParityStudyConfig, args),
                       name="parity study")


def registered(args: argparse.Namespace) -> str:
    """The study of `aspan.applications.studies.REGISTRY` this subcommand runs."""
    return "parity"


def run_options(args: argparse.Namespace) -> dict:
    """What `run` takes besides the settings: the command line run.json records, whether to write report.html."""
    return {"command": command(args), "report": not args.no_report}


def show(args: argparse.Namespace, config, table) -> int:
    """Nothing more: the study writes its tables and report."""
    return 0


def command(args: argparse.Namespace) -> str:
    """The command line, as run.json records it."""
    parts = ["aspan study parity", f"--out {args.out}"]
    if args.quick:
        parts.append("--quick")
    for name in ("config", "formats", "train_length", "steps", "seeds", "lrs", "positional", "device", "threads",
                 "protocol", "cap"):
        value = getattr(args, name)
        if value is not None:
            parts.append(f"--{name.replace('_', '-')} {value}")
    return " ".join(parts)
