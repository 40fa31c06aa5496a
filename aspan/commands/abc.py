"""`aspan abc MODEL --task T`: attention bias calibration / scaffolding (Duan & Shi 2023), OOD accuracy with/without."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aspan.options import MODES

from .argtypes import device, nonneg_float, nonneg_int, output_dir, positive_float, positive_int

RUN_DIR = "out"  # held for the job by the dispatcher (one job per run directory)
HELP = ("ABC/ABS: extract pre-softmax attention biases from ID attention (or a fixed window) and evaluate/fine-tune "
        "OOD with them")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="aspan checkpoint dir, HF checkpoint dir, .gguf file, or 'smollm2'")
    p.add_argument("--task", required=True)
    p.add_argument("--id-param", action="append", default=[], metavar="KEY=VALUE",
                   help="override an ID preset parameter")
    p.add_argument("--ood-param", action="append", default=[], metavar="KEY=VALUE",
                   help="override an OOD preset parameter")
    p.add_argument("--id-samples", type=positive_int, default=64,
                   help="ID samples to calibrate on (only correctly solved ones count)")
    p.add_argument("--ood-samples", type=positive_int, default=100)
    p.add_argument("--seed", type=nonneg_int, default=0)
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
    p.add_argument("--mode", default="teacher", choices=MODES)
    p.add_argument("--finetune-steps", type=nonneg_int, default=0,
                   help="also fine-tune under the bias for this many steps")
    p.add_argument("--finetune-split", default="ood", choices=("id", "ood"),
                   help="task preset fine-tuned on (default ood)")
    p.add_argument("--lr", type=positive_float, default=1e-4, help="fine-tuning learning rate")
    p.add_argument("--finetune-batch-size", type=positive_int, default=16)
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--device", type=device, default=None)
    p.add_argument("--out", type=output_dir, default="runs/abc")
    p.add_argument("--no-progress", action="store_true")


def parse_heads(text: str) -> list[tuple[int, int]]:
    try:
        return [tuple(int(x) for x in h.split(".")) for h in text.split(",") if h.strip()]  # type: ignore[misc]
    except ValueError:
        raise ValueError(f"--heads must look like 1.3,0.2, got {text!r}") from None


def parse_abs(text: str) -> tuple[str, int, int]:
    from aspan.experiments.abc import DIRECTIONS

    parts = text.split(":")
    try:
        direction, line, width = parts[0], int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        raise ValueError(f"--abs must look like DIRECTION:LINE:WIDTH (e.g. anti:1:0), got {text!r}") from None
    if direction not in DIRECTIONS or width < 0 or len(parts) != 3:
        raise ValueError(f"--abs: direction must be one of {', '.join(DIRECTIONS)} and width >= 0, got {text!r}")
    return direction, line, width


@dataclass
class _Plan:
    """The validated settings of one `aspan abc` run (everything checked before the model loads)."""

    id_task: Any  # the ID task preset (calibration samples, optional fine-tuning data)
    ood_task: Any  # the OOD task preset (evaluation samples, default fine-tuning data)
    directions: list[str]  # ABC line directions kept
    window: tuple[str, int, int] | None  # the ABS window (direction, line, width), or None for ABC
    heads: list[tuple[int, int]] | None  # the heads to bias, or None for every head


def _plan(args: argparse.Namespace) -> _Plan:
    """Validate every option (one-line ValueError) before the model loads."""
    from aspan import tasks
    from aspan.checks import check_offsets
    from aspan.experiments.abc import DIRECTIONS
    from aspan.tasks.params import parse_params

    id_task = tasks.preset(args.task, "id", **parse_params(args.task, args.id_param))
    ood_task = tasks.preset(args.task, "ood", **parse_params(args.task, args.ood_param))
    directions = [d.strip() for d in args.directions.split(",") if d.strip()]
    bad = [d for d in directions if d not in DIRECTIONS]
    if bad or not directions:
        raise ValueError(f"--directions: choose from {', '.join(DIRECTIONS)}, got {args.directions!r}")
    if args.lam < 0:
        raise ValueError(f"--lambda must be >= 0, got {args.lam}")
    for name in ("id_samples", "ood_samples", "batch_size", "finetune_batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.finetune_steps < 0:
        raise ValueError("--finetune-steps must be >= 0")
    window = parse_abs(args.abs) if args.abs else None
    if window:
        n = ood_task.max_text_len() + 2  # the longest sequence: prefix + text + EOS (anti-diagonals span 2n lines)
        check_offsets(window[1], 2 * n if window[0] == "anti" else n, f"--abs {args.abs}: line")
    heads = parse_heads(args.heads) if args.heads else None
    if heads:
        from aspan.experiments.sweep import checkpoint_dims
        from hooks import check_heads

        heads = check_heads(heads, *(checkpoint_dims(args.model) or (None, None)))
    return _Plan(id_task, ood_task, directions, window, heads)


def _lines(args: argparse.Namespace, plan: _Plan, model, tokenizer, id_samples) -> dict:
    """The biased lines: the ABS window, or the ABC lines from the ID samples (restricted to `plan.heads`)."""
    from aspan.experiments.abc import ABCSettings, abc_lines, abs_lines

    if plan.window:
        return abs_lines(model, *plan.window, heads=plan.heads)
    settings = ABCSettings(lam=args.lam, directions=plan.directions, rows=args.rows, pooled=not args.per_direction,
                           batch_size=args.batch_size, progress=not args.no_progress)
    lines = abc_lines(model, tokenizer, id_samples, settings)
    if plan.heads:
        lines = {h: lines[h] for h in plan.heads}
    return lines


def _finetune(args: argparse.Namespace, plan: _Plan) -> tuple:
    """The fine-tuning TrainConfig and data (both None without --finetune-steps)."""
    from aspan.training import TrainConfig

    if not args.finetune_steps:
        return None, None
    finetune = TrainConfig.scratch(steps=args.finetune_steps, lr=args.lr, batch_size=args.finetune_batch_size,
                                   warmup=min(10, args.finetune_steps // 10), seed=args.seed + 1,
                                   device=args.device or "auto")
    return finetune, plan.id_task if args.finetune_split == "id" else plan.ood_task


def _write(args: argparse.Namespace, plan: _Plan, res, model, tokenizer, ood_samples) -> dict:
    """Write the table, lines, figures, run.json and summary.json to --out; the flat summary."""
    from aspan.environment import run_environment
    from aspan.experiments.abc import abc_figure, bias_figure, lines_table
    from aspan.io import RunDir

    lines, window = res.lines, plan.window
    run = RunDir(Path(args.out))
    run.write_csv("abc.csv", res.table)
    run.records("abc_lines.jsonl", lines_table(lines))
    for split in ("ood", "id"):
        run.figure(abc_figure(res.table, split), f"abc_length_{split}")
    l, h = sorted(lines)[-1]
    s = ood_samples[0]
    run.figure(bias_figure(lines[(l, h)], s, tokenizer.offset,
                           f"{'ABS' if window else 'ABC'} bias of head {l}.{h} on an OOD sample (kept cells)"),
               f"abc_bias_L{l}H{h}")
    run.write_json("run.json", {
        "command": "abc", "model": str(args.model), "task": args.task, "method": "ABS" if window else "ABC",
        "params": {"id": plan.id_task.params(), "ood": plan.ood_task.params()}, "seed": args.seed,
        "lambda": args.lam, "directions": plan.directions, "rows": args.rows, "pooled": not args.per_direction,
        "window": window, "mode": args.mode, "finetune_steps": args.finetune_steps,
        **run_environment(model),
    })
    flat = {f"{v} {split} {k}": x for v, d in res.summary.items() for split, m in d.items() for k, x in m.items()
            if k in ("exact", "partial")}
    run.write_json("summary.json", {**flat, "tables": {"accuracy by length": res.table.to_dict("records")}})
    return flat


def run(args: argparse.Namespace) -> int:
    from aspan import models
    from aspan.experiments.abc import ABCSettings, run_abc
    from aspan.models.checkpoint import saved_task
    from aspan.models.trained import check_task

    plan = _plan(args)  # validate everything before loading the model
    check_task(saved_task(args.model), [(t.name, t.params()) for t in (plan.id_task, plan.ood_task)],
               f"--task {args.task}", "ABC calibrates a model on the task it was trained on")
    model, tokenizer, _ = models.load(args.model, device=args.device)
    models.check_context(model, plan.ood_task, tokenizer.offset)
    if plan.heads:
        from hooks import check_heads

        plan.heads = check_heads(plan.heads, model.cfg.n_layers, model.cfg.n_heads)
    id_samples = plan.id_task.generate(args.id_samples, seed=args.seed)
    ood_samples = plan.ood_task.generate(args.ood_samples, seed=args.seed)
    lines = _lines(args, plan, model, tokenizer, id_samples)
    finetune, finetune_data = _finetune(args, plan)
    settings = ABCSettings(mode=args.mode, batch_size=args.batch_size, finetune=finetune, finetune_data=finetune_data,
                           progress=not args.no_progress)
    res = run_abc(model, tokenizer, id_samples, ood_samples, settings, lines=lines)
    flat = _write(args, plan, res, model, tokenizer, ood_samples)
    for k, v in flat.items():
        print(f"{k:32s} {v:.3f}")
    print(f"wrote {Path(args.out) / 'abc.csv'}", file=sys.stderr)
    return 0
