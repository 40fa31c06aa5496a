"""`aspan abc MODEL --task T`: attention bias calibration / scaffolding (Duan & Shi 2023), OOD accuracy with/without
(`aspan.applications.abc.abc_run`)."""
from __future__ import annotations

import argparse

from aspan.applications.settings import ABCRun
from aspan.config import load_config, to_toml
from aspan.errors import UsageError
from aspan.options import MODES
from aspan.shipped import check_model_name

from .argtypes import device, nonneg_float, nonneg_int, output_dir, positive_float, positive_int
from .grammar import add_config, add_quiet, from_settings, given

HELP = ("ABC/ABS: extract pre-softmax attention biases from ID attention (or a fixed window) and evaluate/fine-tune "
        "OOD with them")
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan abc reversal --task reversal --id-samples 16 --ood-samples 16 --ood-param length=11-16 --out runs/abc",
    "aspan abc reversal --task reversal --abs anti:1:0 --out runs/abs",
    "aspan abc reversal --task reversal --finetune-steps 100 --out runs/abc-ft",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `ABCRun`'s fields; none has an argparse default (a flag not given is None), so the defaults live
    on `ABCRun` alone and `--help` shows them from there."""
    p.add_argument("model", metavar="MODEL", nargs="?",
                   help="aspan checkpoint dir, HF checkpoint dir, .gguf file, or 'smollm2' (required unless the "
                        "--config file names it)")
    p.add_argument("--task", help="task name, see `aspan data --list` (required unless the --config file names it)")
    p.add_argument("--id-param", action="append", dest="id_params", metavar="KEY=VALUE",
                   help="override an ID preset parameter (repeatable)")
    p.add_argument("--ood-param", action="append", dest="ood_params", metavar="KEY=VALUE",
                   help="override an OOD preset parameter (repeatable)")
    p.add_argument("--id-samples", type=positive_int,
                   help="ID samples to calibrate on (only correctly solved ones count)")
    p.add_argument("--ood-samples", type=positive_int, help="OOD samples evaluated with and without the bias")
    p.add_argument("--seed", type=nonneg_int, help="sample (and fine-tuning) seed")
    p.add_argument("--lambda", dest="lam", type=nonneg_float, help="keep lines with sum >= mean + lambda*std")
    p.add_argument("--directions", help="comma-separated subset of diagonal,anti,vertical,aligned")
    p.add_argument("--rows", choices=("target", "all"), help="query rows the lines are computed and applied on")
    p.add_argument("--per-direction", action="store_true", default=None,
                   help="threshold each direction on its own statistics (else pooled)")
    p.add_argument("--abs", metavar="DIRECTION:LINE:WIDTH",
                   help="ABS instead of ABC: a fixed window, e.g. anti:1:0 (reversal) or diagonal:0:1")
    p.add_argument("--heads", metavar="L.H,...", help="bias only these heads (when not given: every head)")
    p.add_argument("--mode", choices=MODES, help="teacher forcing or greedy generation")
    p.add_argument("--finetune-steps", type=nonneg_int, help="also fine-tune under the bias for this many steps")
    p.add_argument("--finetune-split", choices=("id", "ood"), help="task preset fine-tuned on")
    p.add_argument("--lr", type=positive_float, help="fine-tuning learning rate")
    p.add_argument("--finetune-batch-size", type=positive_int, help="fine-tuning batch size")
    p.add_argument("--batch-size", type=positive_int, help="evaluation batch size")
    p.add_argument("--device", type=device, help="cpu, cuda, cuda:N (when not given: CUDA when present)")
    p.add_argument("--out", type=output_dir, help="run directory")
    add_quiet(p)
    add_config(p, "ABCRun")
    from_settings(p, "aspan.applications.settings:ABCRun")


FIELDS = ("model", "task", "id_samples", "ood_samples", "seed", "lam", "directions", "rows", "per_direction", "abs",
          "heads", "mode", "finetune_steps", "finetune_split", "lr", "finetune_batch_size", "batch_size", "device",
          "out")


def settings(args: argparse.Namespace):
    """`ABCRun` from its defaults, then --config, then the flags given, then its check."""
    required(args, "abc")
    flags = {**given(args, FIELDS), "id_params": args.id_params and tuple(args.id_params),
             "ood_params": args.ood_params and tuple(args.ood_params), "progress": False if args.quiet else None}
    return load_config(ABCRun, toml_path=args.config, flags=flags, name="abc")


def required(args: argparse.Namespace, command: str) -> None:
    """MODEL and --task, unless a --config file gives them (`load_config` then names a missing key)."""
    if args.config is None and (args.model is None or args.task is None):
        raise UsageError(f"{'MODEL' if args.model is None else '--task'} is required (or a --config file that names "
                         f"it): aspan {command} MODEL --task TASK")


def run(args: argparse.Namespace) -> int:
    """Run `aspan abc` with the parsed arguments; the exit code."""
    cfg = settings(args)  # every setting checked before the run's imports (torch, TransformerLens)
    if args.print_config:
        print(to_toml(cfg), end="")
        return 0
    check_model_name(cfg.model)
    from aspan.applications.abc import abc_run, format_summary

    print(format_summary(abc_run(cfg)))
    return 0
