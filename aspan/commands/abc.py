"""`aspan abc MODEL --task T`: attention bias calibration / scaffolding (Duan & Shi 2023), OOD accuracy with/without
(`aspan.applications.abc.abc_run`)."""
from __future__ import annotations

import argparse

from aspan.options import MODES

from .argtypes import device, nonneg_float, nonneg_int, output_dir, positive_float, positive_int
from .grammar import add_quiet

HELP = ("ABC/ABS: extract pre-softmax attention biases from ID attention (or a fixed window) and evaluate/fine-tune "
        "OOD with them")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="aspan checkpoint dir, HF checkpoint dir, .gguf file, or 'smollm2'")
    p.add_argument("--task", required=True, help="task name (see `aspan data --list`)")
    p.add_argument("--id-param", action="append", default=[], metavar="KEY=VALUE",
                   help="override an ID preset parameter")
    p.add_argument("--ood-param", action="append", default=[], metavar="KEY=VALUE",
                   help="override an OOD preset parameter")
    p.add_argument("--id-samples", type=positive_int, default=64,
                   help="ID samples to calibrate on (only correctly solved ones count)")
    p.add_argument("--ood-samples", type=positive_int, default=100,
                   help="OOD samples evaluated with and without the bias")
    p.add_argument("--seed", type=nonneg_int, default=0, help="sample (and fine-tuning) seed")
    p.add_argument("--lambda", dest="lam", type=nonneg_float, default=0.87,
                   help="keep lines with sum >= mean + lambda*std (default 0.87)")
    p.add_argument("--directions", default="diagonal,anti,vertical,aligned",
                   help="comma-separated subset of diagonal,anti,vertical,aligned")
    p.add_argument("--rows", default="target", choices=("target", "all"),
                   help="query rows the lines are computed and applied on")
    p.add_argument("--per-direction", action="store_true",
                   help="threshold each direction on its own statistics (default: pooled)")
    p.add_argument("--abs", default=None, metavar="DIRECTION:LINE:WIDTH",
                   help="ABS instead of ABC: a fixed window, e.g. anti:1:0 (reversal) or diagonal:0:1")
    p.add_argument("--heads", default=None, metavar="L.H,...", help="bias only these heads (default: every head)")
    p.add_argument("--mode", default="teacher", choices=MODES, help="teacher forcing or greedy generation")
    p.add_argument("--finetune-steps", type=nonneg_int, default=0,
                   help="also fine-tune under the bias for this many steps")
    p.add_argument("--finetune-split", default="ood", choices=("id", "ood"),
                   help="task preset fine-tuned on (default ood)")
    p.add_argument("--lr", type=positive_float, default=1e-4, help="fine-tuning learning rate")
    p.add_argument("--finetune-batch-size", type=positive_int, default=16, help="fine-tuning batch size")
    p.add_argument("--batch-size", type=positive_int, default=32, help="evaluation batch size")
    p.add_argument("--device", type=device, default=None, help="cpu, cuda, cuda:N (default: CUDA when present)")
    p.add_argument("--out", type=output_dir, default="runs/abc", help="run directory (default runs/abc)")
    add_quiet(p)


def run(args: argparse.Namespace) -> int:
    from aspan.applications.abc import ABCRun, abc_run

    abc_run(ABCRun(args.model, args.task, id_params=tuple(args.id_param), ood_params=tuple(args.ood_param),
                   id_samples=args.id_samples, ood_samples=args.ood_samples, seed=args.seed, lam=args.lam,
                   directions=args.directions, rows=args.rows, per_direction=args.per_direction, abs=args.abs,
                   heads=args.heads, mode=args.mode, finetune_steps=args.finetune_steps,
                   finetune_split=args.finetune_split, lr=args.lr, finetune_batch_size=args.finetune_batch_size,
                   batch_size=args.batch_size, device=args.device, out=args.out, progress=not args.quiet))
    return 0
