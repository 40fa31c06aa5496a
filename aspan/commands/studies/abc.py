"""`aspan study abc`: the command line of `aspan.applications.studies.abc` (the aligned variant) and, with
`--protocol paper`, of `aspan.applications.studies.abc_paper` (Duan & Shi 2023's protocol)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from ...applications.studies.abc import CONDITIONS, STUDY_TASKS, AbcStudyConfig
from ...applications.studies.abc_paper import PAPER_CONDITIONS, PAPER_TASKS, PaperConfig
from ...config import file_value, load_config, to_toml
from ...errors import UsageError
from ..argtypes import output_dir
from ..grammar import add_quiet
from . import flag_list

HELP = "ABC/ABS study (Duan & Shi 2023): successor, addition, parity; vanilla (rotary/learned/alibi/none), ABS, ABC"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan study abc --quick --out runs/abc_study",
    "aspan study abc --protocol paper --config configs/abc_paper_cpu.toml --out runs/abc_paper",
    "aspan study abc --quick --out runs/abc_study --list-units",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options of `aspan study abc` to its parser."""
    p.add_argument("--protocol", choices=PROTOCOLS, default=None,
                   help="aligned (default): this study's variant, lines in sample coordinates, unpadded numbers of 1-6 "
                        "digits; paper: Duan & Shi's protocol (numbers of [0, 2^20] split 7:1, the padded layout, a "
                        "base trained until it interpolates, Algorithm 1 from its last layer into every layer); when "
                        "not given, a --config file's `protocol` key (what --print-config writes) chooses")
    p.add_argument("--out", type=output_dir, default="runs/abc_study",
                   help="run directory (resumable: rows are keyed by settings)")
    p.add_argument("--quick", action="store_true", help="a tiny run for tests (well under a minute)")
    p.add_argument("--config", metavar="TOML", help="settings from a TOML file (keys: AbcStudyConfig fields)")
    p.add_argument("--tasks", help=f"comma-separated subset of {','.join(STUDY_TASKS)}")
    p.add_argument("--conditions", help=f"comma-separated subset of {','.join(CONDITIONS)} (paper protocol: of "
                                        "vanilla,abc,abs; both filter its plan)")
    p.add_argument("--seeds", help="comma-separated seeds (the first one chooses the learning rate)")
    p.add_argument("--lrs", help="comma-separated learning-rate grid (paper protocol: one learning rate)")
    for name, text in (("steps", "optimiser steps of every from-scratch training (paper protocol: the cap)"),
                       ("retrain-steps", "ABC: steps of the retraining under the calibrated bias"),
                       ("batch-size", "training batch size"), ("n-layers", "layers of every model"),
                       ("n-heads", "attention heads per layer"), ("d-model", "residual stream width"),
                       ("n-test", "samples per test bucket")):
        p.add_argument(f"--{name}", type=int, help=text)
    p.add_argument("--device", help="cpu or cuda (default cpu)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    add_quiet(p)


def config_from_args(args: argparse.Namespace):
    """The study settings (AbcStudyConfig, or PaperConfig with --protocol paper): --quick or the defaults, then
    --config, then the flags given; checked."""
    args.protocol = protocol(args)
    if args.protocol == "paper":
        return paper_config_from_args(args)

    flags = {name: flag_list(args, name, kind) for name, kind in
             (("tasks", str), ("conditions", str), ("seeds", int), ("lrs", float))}
    flags.update({name: getattr(args, name) for name in ("steps", "retrain_steps", "batch_size", "n_layers",
                                                         "n_heads", "d_model", "n_test", "device")})
    return load_config(AbcStudyConfig, toml_path=args.config, flags=flags,
                       base=AbcStudyConfig.quick() if args.quick else None, name="abc study")


PROTOCOLS = ("aligned", "paper")


def protocol(args: argparse.Namespace) -> str:
    """The protocol: --protocol, else the `--config` file's `protocol` key, else "aligned"; UsageError when the two
    differ or the key names no protocol."""
    named = file_value(args.config, "protocol", "abc study") if args.config else None
    if named is not None and named not in PROTOCOLS:
        raise UsageError(f"{args.config}: protocol must be one of {', '.join(PROTOCOLS)}, got {named!r}")
    if args.protocol is not None and named is not None and named != args.protocol:
        raise UsageError(f"--protocol {args.protocol}: {args.config} holds the settings of protocol {named!r}")
    return args.protocol or named or "aligned"


def print_config(args: argparse.Namespace, config) -> str:
    """`--print-config`: the settings as TOML, after a line naming their protocol (`protocol = "paper"`), so that
    `--config` alone reads them back as that protocol's."""
    return f'protocol = "{args.protocol}"\n' + to_toml(config)


def paper_config_from_args(args: argparse.Namespace):
    """PaperConfig: --quick or the defaults, then --config (PaperConfig keys), then the flags given: --lrs is the
    one learning rate, --steps the cap; then --tasks and --conditions filter the plan. --retrain-steps does not
    apply (ABC retrains for retrain_fraction of its base's steps). Checked."""
    if args.retrain_steps is not None:
        raise UsageError("--retrain-steps applies to the aligned protocol; the paper protocol retrains ABC for "
                         "retrain_fraction of its base's steps (set it in --config)")
    lrs = flag_list(args, "lrs", float)
    if lrs is not None and len(lrs) != 1:
        raise UsageError(f"the paper protocol trains at one learning rate: --lrs takes one value, got {args.lrs!r}")
    flags = {"lr": lrs and lrs[0], "seeds": flag_list(args, "seeds", int), "max_steps": args.steps}
    flags.update({name: getattr(args, name) for name in ("batch_size", "n_layers", "n_heads", "d_model", "n_test",
                                                         "device")})
    # the plan's entries are checked before the filters below can hide a bad one
    cfg = load_config(PaperConfig, toml_path=args.config, flags=flags,
                      base=PaperConfig.quick() if args.quick else None, name="abc paper study")
    tasks = flag_list(args, "tasks", str) or PAPER_TASKS
    conditions = flag_list(args, "conditions", str) or PAPER_CONDITIONS
    for what, values, allowed in (("tasks", tasks, PAPER_TASKS), ("conditions", conditions, PAPER_CONDITIONS)):
        if any(v not in allowed for v in values):
            raise UsageError(f"--{what} must be a subset of {', '.join(allowed)} here, got {list(values)}")
    cfg = replace(cfg, plan=tuple(p for p, (t, c) in zip(cfg.plan, cfg.runs()) if t in tasks and c in conditions))
    try:
        cfg.check()
    except ValueError as e:
        raise UsageError(f"--tasks/--conditions: {e}") from None
    return cfg


def registered(args: argparse.Namespace) -> str:
    """The study of `aspan.applications.studies.REGISTRY` this subcommand runs: "abc", or "abc-paper" under
    `--protocol paper`."""
    return "abc-paper" if args.protocol == "paper" else "abc"


def run_options(args: argparse.Namespace) -> dict:
    """Nothing besides the settings."""
    return {}


def show(args: argparse.Namespace, cfg, table) -> int:
    """Exact accuracy at the longest length per task and condition, on stdout; where the table is, on stderr."""
    for r in table[table.digits == max(cfg.buckets)].itertuples():
        if args.protocol == "paper":
            print(f"{r.task:10s} {r.condition:8s}: exact at {r.digits} digits {r.exact_mean:.3f} "
                  f"[{r.wilson_low:.3f}, {r.wilson_high:.3f}] ({r.fitted}/{r.seeds} seeds fitted, n {r.n})")
        else:
            print(f"{r.task:10s} {r.condition:8s} lr {r.lr:g}: exact at {r.digits} digits "
                  f"{r.exact_mean:.3f} [{r.exact_lo:.3f}, {r.exact_hi:.3f}]")
    print(f"wrote {Path(args.out) / 'table.csv'} (aspan report {args.out})", file=sys.stderr)
    return 0
