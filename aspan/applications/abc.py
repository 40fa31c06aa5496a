"""`aspan abc` as a function a notebook can call: attention bias calibration (ABC) or scaffolding (ABS) of Duan &
Shi 2023: the biased lines from correctly solved ID samples (or a fixed window), OOD and ID accuracy with and without
them, optionally after fine-tuning under the bias; the table, lines, figures, run.json and summary.json written to
the run directory.

    from aspan.applications.abc import ABCRun, abc_run
    summary = abc_run(ABCRun("runs/train", task="reversal", out="runs/abc"))
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hooks import check_heads

from .. import models, tasks
from ..checks import check_offsets
from ..environment import run_environment
from ..experiments.abc import (
    DIRECTIONS,
    ABCSettings,
    abc_figure,
    abc_lines,
    abs_lines,
    bias_figure,
    lines_table,
    run_abc,
)
from ..experiments.sweep import checkpoint_dims
from ..io import RunDir, claim_run
from ..models.checkpoint import saved_task
from ..models.trained import check_task
from ..tasks.params import parse_params
from ..training import TrainConfig

logger = logging.getLogger(__name__)


@dataclass
class ABCRun:
    """The settings of one `aspan abc` run (its flags, named after them; `lam` is --lambda, `abs` --abs)."""

    model: str  # aspan checkpoint dir, HF checkpoint dir, .gguf file, or 'smollm2'
    task: str
    id_params: tuple[str, ...] = ()  # key=value overrides of the ID preset
    ood_params: tuple[str, ...] = ()  # key=value overrides of the OOD preset
    id_samples: int = 64  # ID samples to calibrate on (only correctly solved ones count)
    ood_samples: int = 100
    seed: int = 0
    lam: float = 0.87  # keep lines with sum >= mean + lam * std
    directions: str = "diagonal,anti,vertical,aligned"
    rows: str = "target"  # query rows the lines are computed and applied on: target or all
    per_direction: bool = False  # threshold each direction on its own statistics (default: pooled)
    abs: str | None = None  # ABS window DIRECTION:LINE:WIDTH instead of ABC
    heads: str | None = None  # bias only these heads, e.g. "1.3,0.2" (default: every head)
    mode: str = "teacher"
    finetune_steps: int = 0  # also fine-tune under the bias for this many steps
    finetune_split: str = "ood"
    lr: float = 1e-4
    finetune_batch_size: int = 16
    batch_size: int = 32
    device: str | None = None
    out: str = "runs/abc"
    progress: bool = True


def parse_heads(text: str) -> list[tuple[int, int]]:
    """`--heads 1.3,0.2` as a list of (layer, head); ValueError naming --heads on any other form, no head at all
    included (`--heads ""`: leave the flag out to bias every head)."""
    found = [re.fullmatch(r"\s*([0-9]{1,9})\.([0-9]{1,9})\s*", h) for h in text.split(",") if h.strip()]
    if not found or not all(found):
        shown = repr(text) if len(text) <= 60 else f"{text[:60]!r}... ({len(text)} characters)"
        raise ValueError(f"--heads must look like 1.3,0.2 (layer.head, at least one; leave it out for every head), "
                         f"got {shown}")
    return [(int(m[1]), int(m[2])) for m in found]


def parse_abs(text: str) -> tuple[str, int, int]:
    """`--abs DIRECTION:LINE:WIDTH` (e.g. `anti:1:0`) as (direction, line, width); ValueError on any other form."""
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


def _plan(run: ABCRun) -> _Plan:
    """Validate every option (one-line ValueError) before the model loads."""
    id_task = tasks.preset(run.task, "id", **parse_params(run.task, list(run.id_params)))
    ood_task = tasks.preset(run.task, "ood", **parse_params(run.task, list(run.ood_params)))
    directions = [d.strip() for d in run.directions.split(",") if d.strip()]
    bad = [d for d in directions if d not in DIRECTIONS]
    if bad or not directions:
        raise ValueError(f"--directions: choose from {', '.join(DIRECTIONS)}, got {run.directions!r}")
    if run.lam < 0:
        raise ValueError(f"--lambda must be >= 0, got {run.lam}")
    for name in ("id_samples", "ood_samples", "batch_size", "finetune_batch_size"):
        if getattr(run, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if run.finetune_steps < 0:
        raise ValueError("--finetune-steps must be >= 0")
    window = parse_abs(run.abs) if run.abs else None
    if window:
        n = ood_task.max_text_len() + 2  # the longest sequence: prefix + text + EOS (anti-diagonals span 2n lines)
        check_offsets(window[1], 2 * n if window[0] == "anti" else n, f"--abs {run.abs}: line")
    heads = parse_heads(run.heads) if run.heads is not None else None
    if heads:
        heads = check_heads(heads, *(checkpoint_dims(run.model) or (None, None)))
    return _Plan(id_task, ood_task, directions, window, heads)


def _lines(run: ABCRun, plan: _Plan, model, tokenizer, id_samples) -> dict:
    """The biased lines: the ABS window, or the ABC lines from the ID samples (restricted to `plan.heads`)."""
    if plan.window:
        return abs_lines(model, *plan.window, heads=plan.heads)
    settings = ABCSettings(lam=run.lam, directions=plan.directions, rows=run.rows, pooled=not run.per_direction,
                           batch_size=run.batch_size, progress=run.progress)
    lines = abc_lines(model, tokenizer, id_samples, settings)
    if plan.heads:
        lines = {h: lines[h] for h in plan.heads}
    return lines


def _finetune(run: ABCRun, plan: _Plan) -> tuple:
    """The fine-tuning TrainConfig and data (both None without --finetune-steps)."""
    if not run.finetune_steps:
        return None, None
    finetune = TrainConfig.scratch(steps=run.finetune_steps, lr=run.lr, batch_size=run.finetune_batch_size,
                                   warmup=min(10, run.finetune_steps // 10), seed=run.seed + 1,
                                   device=run.device or "auto")
    return finetune, plan.id_task if run.finetune_split == "id" else plan.ood_task


def _write(run: ABCRun, plan: _Plan, res, model, tokenizer, ood_samples) -> dict:
    """Write the table, lines, figures, run.json and summary.json to `run.out`; the flat summary."""
    lines, window = res.lines, plan.window
    out = RunDir(Path(run.out))
    out.write_csv("abc.csv", res.table)
    out.records("abc_lines.jsonl", lines_table(lines))
    for split in ("ood", "id"):
        out.figure(abc_figure(res.table, split), f"abc_length_{split}")
    l, h = sorted(lines)[-1]
    s = ood_samples[0]
    out.figure(bias_figure(lines[(l, h)], s, tokenizer.offset,
                           f"{'ABS' if window else 'ABC'} bias of head {l}.{h} on an OOD sample (kept cells)"),
               f"abc_bias_L{l}H{h}")
    out.write_json("run.json", {
        "command": "abc", "model": str(run.model), "task": run.task, "method": "ABS" if window else "ABC",
        "params": {"id": plan.id_task.params(), "ood": plan.ood_task.params()}, "seed": run.seed,
        "lambda": run.lam, "directions": plan.directions, "rows": run.rows, "pooled": not run.per_direction,
        "window": window, "mode": run.mode, "finetune_steps": run.finetune_steps,
        **run_environment(model),
    })
    flat = {f"{v} {split} {k}": x for v, d in res.summary.items() for split, m in d.items() for k, x in m.items()
            if k in ("exact", "partial")}
    out.write_json("summary.json", {**flat, "tables": {"accuracy by length": res.table.to_dict("records")}})
    return flat


def abc_run(run: ABCRun) -> dict:
    """Calibrate (ABC) or place (ABS) the attention biases, evaluate OOD and ID with and without them (and after
    fine-tuning under them with `finetune_steps`) and write the run directory `run.out`. Every
    setting is checked (one-line ValueError) before the model loads. Returns the flat summary
    (`"<variant> <split> exact|partial"` -> accuracy). `run.out` is held for this job throughout (`claim_run`)."""
    with claim_run(run.out):
        return _abc_run(run)


def _abc_run(run: ABCRun) -> dict:
    plan = _plan(run)  # validate everything before loading the model
    check_task(saved_task(run.model), [(t.name, t.params()) for t in (plan.id_task, plan.ood_task)],
               f"--task {run.task}", "ABC calibrates a model on the task it was trained on")
    model, tokenizer, _ = models.load(run.model, device=run.device)
    models.check_context(model, plan.ood_task, tokenizer.offset)
    if plan.heads:
        plan.heads = check_heads(plan.heads, model.cfg.n_layers, model.cfg.n_heads)
    id_samples = plan.id_task.generate(run.id_samples, seed=run.seed)
    ood_samples = plan.ood_task.generate(run.ood_samples, seed=run.seed)
    lines = _lines(run, plan, model, tokenizer, id_samples)
    finetune, finetune_data = _finetune(run, plan)
    settings = ABCSettings(mode=run.mode, batch_size=run.batch_size, finetune=finetune, finetune_data=finetune_data,
                           progress=run.progress)
    res = run_abc(model, tokenizer, id_samples, ood_samples, settings, lines=lines)
    flat = _write(run, plan, res, model, tokenizer, ood_samples)
    logger.info("wrote %s", Path(run.out) / "abc.csv")
    return flat


def format_summary(flat: dict) -> str:
    """What `aspan abc` prints: one `<variant> <split> exact|partial  accuracy` line per number of the summary."""
    return "\n".join(f"{k:32s} {v:.3f}" for k, v in flat.items())
