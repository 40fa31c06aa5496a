"""`aspan study abc --protocol paper`: Duan & Shi (2023, arXiv 2310.11984), Sections 3.4, 5 and 6 and Algorithm 1,
as the paper runs them, in a decoder-only model.

Point by point (the README of the committed run says which points are adapted and why):

- Data: a random permutation of the numbers of [0, 2^number_bits] (2^20 in the paper) split 7:1 into training and
  held-out numbers; operands drawn independently from the training numbers (so mostly 6-digit); parity writes the
  same numbers in binary. The held-out numbers are split in two disjoint halves: one for the ID check (numbers of
  exactly `id_digits` digits), one for the test sets. Test sets: for each length L, min(10^L - 10^(L-1), n_test)
  distinct numbers of exactly L digits that are not training or check numbers (lengths past 2^number_bits are
  outside the permutation, so any number of that length is held out).
- Layout: the padded layout (`tasks.get(..., layout="padded", width=W)`), operands zero-padded on the left to W
  digits, most significant digit first, the answer reversed; W fits the longest test length (parity: its bits), so
  every sample of a task has the same positions and the attention blocks are fixed sub-matrices.
- Vanilla base: trained until ID exact >= `fit_exact` on the check set, checked every `check_every` steps (one
  schedule over `max_steps`, the cap); a base that never gets there is reported "did not fit" and gets no ABC row.
- ABC (Algorithm 1): the attention of the base's last layer (or the layer `calib_layer` names) averaged over the
  calibration samples (training numbers) it answers correctly; `calibrate` on the cross block (target rows x
  operand columns) with kappa 4.5 and on the self block (target rows x target columns) with 0.87 (`padded_blocks`);
  -inf becomes -1e4. The same `[head, pos, pos]` bias is added to the pre-softmax scores of every layer of a fresh
  model, trained on the training numbers for floor(retrain_fraction x the base's steps) steps (the paper: 1/100 to
  1/10 of the base's time).
- ABS (Appendix A.4, w = 1): every head of every layer; target row t reads, in each operand, its aligned digit
  (digit t, or bit t for the running parity: the line through the first two target rows' references) and the
  `abs_width` digits either side, and itself and the `abs_width` target rows before it; trained like the base.
- Prompt rows and the BOS column are left unbiased in both (the paper's encoder self-attention carries no bias).
- Exact accuracy is teacher-forced (equal to greedy generation's exact match), with a Wilson 95 % interval per
  length; 3 seeds; rows keyed by their settings in `runs.jsonl` (a rerun computes only missing rows); every ID
  check of every training appended to `checks.jsonl` as it happens (interrupted trainings included).
"""
from __future__ import annotations

import logging
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ...findings.tables import ABC_PAPER_TABLE
from ...intervals import wilson  # noqa: F401 (re-exported: part of this module's public names)
from ...io import RowWriter, RunDir, append_line, settings_key
from ...tasks.base import Sample
from ...training import TrainConfig
from . import Study, Unit, study_rows, unit_file, unit_index
from .abc_outputs import AbcOutputs, write_abc_outputs
from .abc_paper_bias import (  # noqa: F401 (re-exported: the biases were defined here)
    Calibration,
    abc_calibration,
    abs_bias,
    calibrate_padded,
    hooks_for_bias,
    layout_batch,
    mean_layer_attention,
    training_rows,
)
from .abc_paper_data import (  # noqa: F401 (re-exported: the data were defined here)
    CALIB_SEED,
    CHECK_SEED,
    DATA_SEED,
    DEFAULT_PLAN,
    PAPER_CONDITIONS,
    PAPER_TASKS,
    TEST_SEED,
    PaperConfig,
    PaperData,
    exact_length_numbers,
    held_out_samples,
    number_split,
    padded_task,
    paper_data,
    task_width,
)

if TYPE_CHECKING:
    import pandas as pd

FRESH_INIT = 1000  # the ABC model's initialisation seed is the base's + this: a fresh model, not the base's twin
# Duan & Shi 2023, exact accuracy % at 6 / 10 / 20 / 60 digits: Table 1 (ABC, vanilla with sinusoidal positions) and
# Table 3 (ABS: NoPE + w = 1; parity "vanilla" is the Transformer + scratchpad row)
PAPER_TABLE = {
    ("successor", "vanilla"): (100.0, 0.0, 0.0, 0.0), ("successor", "abc"): (100.0, 100.0, 100.0, 100.0),
    ("successor", "abs"): (100.0, 100.0, 100.0, 100.0), ("addition", "vanilla"): (100.0, 0.0, 0.0, 0.0),
    ("addition", "abc"): (100.0, 100.0, 99.9, 99.8), ("addition", "abs"): (99.95, 99.81, 99.76, 99.35),
    ("parity", "vanilla"): (29.23, 0.29, 0.0, 0.0), ("parity", "abs"): (100.0, 100.0, 100.0, 100.0),
}
PAPER_LENGTHS = (6, 10, 20, 60)
SUMMARY_TABLE = ABC_PAPER_TABLE  # summary.json's table, by which the findings know this study


logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------- training
def exact_count(model, tokenizer, samples: Sequence[Sample], bias_hooks, batch_size: int) -> int:
    """How many `samples` the model answers exactly (teacher-forced) under `bias_hooks` (`evaluate`'s exact, without
    its per-token table: the test sets hold up to 10,000 numbers per length)."""
    from ...evaluation import exact_flags

    return int(exact_flags(model, tokenizer, samples, bias_hooks, batch_size).sum())


CHECK = "id check"  # the name of the check set among the learning curves


def train_config(cfg: PaperConfig, seed: int, steps: int):
    """One schedule over `steps` that stops at the first check (every `check_every` steps and at the cap) where ID
    exact on the check set reaches `fit_exact` (the `target` stop rule of `aspan.curves`)."""
    return TrainConfig.scratch(steps=steps, batch_size=cfg.batch_size, lr=cfg.lr, warmup=min(cfg.warmup, steps // 4),
                               seed=seed, device=cfg.device, log_every=max(1, min(cfg.check_every, steps)),
                               eval_batch_size=cfg.eval_batch_size, curve_every=cfg.check_every, stop="target",
                               stop_bucket=CHECK, target=cfg.fit_exact)


@dataclass(frozen=True)
class FitRun:
    """One training of `train_until_fit`: its seed, where it runs, its biases, its check log and its cap."""

    seed: int  # the schedule's seed (data order)
    scratch: Path  # its run directory until it ends (`aspan.training.train_resumable`)
    bias_hooks: Sequence = ()  # attention-bias hooks on every forward pass (ABC, ABS); () for a vanilla model
    log: tuple[Path, dict] | None = None  # (JSONL file, fields) to append every check to as it happens
    cap: int | None = None  # the step cap (None: the config's `max_steps`)


def train_until_fit(model, data: PaperData, cfg: PaperConfig, run: FitRun) -> dict:
    """Train on the training numbers until ID exact on the check set reaches `fit_exact`, checked every
    `check_every` steps (and at the cap): one schedule over `run.cap` steps (`max_steps` when None) whose learning
    curve on the check set drives the target stop rule (`train_config`); its run directory `run.scratch` holds it
    until it ends (`aspan.training.train_resumable`). `run.log`: (JSONL file, fields) to append every check to as it
    happens (a long run shows how far it got). Returns steps, fitted, the last ID exact and every check (the curve
    before training, step 0, is not a check)."""
    from ...training import train_resumable

    def logged(rows: list[dict]) -> None:
        for r in rows:
            if run.log is not None and r["step"] > 0:
                append_line(run.log[0], {**run.log[1], "step": r["step"], "id_exact": r["exact"], "time": time.time()})

    cap = cfg.max_steps if run.cap is None else run.cap
    # in `scratch` (removed at the end): a run paused by a time budget (aspan.training.time_budget) continues exactly
    result = train_resumable(run.scratch, model, data.tokenizer, data.train, train_config(cfg, run.seed, cap),
                             fwd_hooks=run.bias_hooks, progress=False, curve_data={CHECK: data.check}, on_curve=logged)
    checks = [[r["step"], r["exact"]] for r in result.history if r.get("kind") == "curve" and r["step"] > 0]
    return {"steps": result.stop["step"], "fitted": checks[-1][1] >= cfg.fit_exact, "id_exact": checks[-1][1],
            "checks": checks}


def test_results(model, data: PaperData, bias_hooks, batch_size: int) -> dict[str, Any]:
    """Per test length: n, correct, exact and its Wilson 95 % interval."""
    out: dict[str, Any] = {}
    for n, samples in data.test.items():
        correct = exact_count(model, data.tokenizer, samples, bias_hooks, batch_size)
        lo, hi = wilson(correct, len(samples))
        out |= {f"n_{n}": len(samples), f"correct_{n}": correct, f"exact_{n}": correct / len(samples),
                f"wilson_low_{n}": lo, f"wilson_high_{n}": hi}
    return out


# ----------------------------------------------------------------------------------------------- rows
@dataclass
class _Ctx:
    """State of one run: settings, output directory, each task's data, rows so far, what was not run and why."""

    cfg: PaperConfig
    out: Path
    data: dict[str, PaperData]
    writer: Any
    rows: dict[str, dict]
    shared: dict[str, Any]
    skipped: list[str] = field(default_factory=list)
    index: int | None = None  # the index of the unit running alone (`unit_file`), or None: every run

    def file(self, name: str) -> Path:
        """Where this run appends the rows of row file `name`: the study's own, or its unit's (`unit_file`)."""
        return unit_file(self.out, name, self.index)

    def key(self, name: str, condition: str, seed: int) -> tuple[dict, str]:
        settings = {"protocol": "paper", "task": name, "condition": condition, "seed": seed, **self.shared}
        layer = calibration_layer(self.cfg)
        if condition == "abc" and layer != self.cfg.n_layers - 1:  # only ABC reads it; the last layer keeps old keys
            settings["calib_layer"] = layer
        if condition == "abc" and name in self.cfg.bf16_bases:  # ABC calibrates on the base as saved
            settings["base_dtype"] = "bfloat16"
        return settings, settings_key(settings)

    def write(self, row: dict) -> dict:
        self.writer.write(row)
        self.rows[row["key"]] = row
        return row


def calibration_layer(cfg: PaperConfig) -> int:
    """The layer (0-based) whose attention ABC calibrates on: the last by default, as Duan & Shi's Algorithm 1 reads
    the last decoder layer. Their decoder reads the encoder's input through cross-attention in every layer, so its
    last layer can read the operands; in a decoder-only model the operand lookup may sit in an earlier layer, which
    `calib_layer` names."""
    return cfg.calib_layer % cfg.n_layers


def _model(ctx: _Ctx, name: str, positional: str, seed: int):
    from ... import models

    cfg, data = ctx.cfg, ctx.data[name]
    return models.tiny(data.tokenizer, n_layers=cfg.n_layers, n_heads=cfg.n_heads, d_model=cfg.d_model,
                       n_ctx=data.n_ctx, seed=seed, device=cfg.device, positional=positional)


def model_dir(out: Path, name: str, condition: str, seed: int) -> Path:
    """Where a run saves the model of one task, condition and seed (vanilla and ABC)."""
    return out / "models" / f"{name}-{condition}-seed{seed}"


def calibration_file(out: Path, name: str, seed: int) -> Path:
    """Where a run saves the ABC calibration (averaged attention, bias, blocks) of one task and seed."""
    return out / "calibration" / f"{name}-seed{seed}.pt"


def run_trained(ctx: _Ctx, name: str, condition: str, seed: int) -> dict:
    """A vanilla or ABS row: a model trained until it fits (or the cap), then tested; the vanilla model is saved for
    ABC (in bfloat16 for the tasks of `bf16_bases`)."""
    from ... import models

    cfg, data = ctx.cfg, ctx.data[name]
    settings, key = ctx.key(name, condition, seed)
    t0 = time.perf_counter()
    model = _model(ctx, name, cfg.positional if condition == "vanilla" else cfg.abs_positional, seed)
    if condition == "vanilla" and name in cfg.bf16_bases:
        _bf16_copy(model)  # a model that cannot be copied is refused before its training, not after
    bias = () if condition == "vanilla" else hooks_for_bias(abs_bias(data.check[0], data.tokenizer, cfg.abs_width),
                                                           model)
    fit = train_until_fit(model, data, cfg, FitRun(
        seed, ctx.out / "scratch" / f"{name}-{condition}-seed{seed}", bias,
        (ctx.file("checks.jsonl"), {"task": name, "condition": condition, "seed": seed})))
    if condition == "vanilla":
        saved = model if name not in cfg.bf16_bases else _bf16_copy(model)
        models.save(saved, model_dir(ctx.out, name, "vanilla", seed), data.tokenizer, task=name, seed=seed,
                    steps=fit["steps"])  # loaded back in float32: the bfloat16 values, exactly
    status = "fitted" if fit["fitted"] else "did not fit"
    row = {**settings, "key": key, "status": status, **fit, "positional": models.positional_of(model),
           **test_results(model, data, bias, cfg.eval_batch_size), "wall_s": time.perf_counter() - t0}
    return ctx.write(row)


def _bf16_copy(model):
    """A bfloat16 copy of `model` (the base `bf16_bases` saves); ValueError in one line when the model cannot be
    copied (a TransformerBridge holds tensors `copy.deepcopy` refuses)."""
    import copy

    import torch

    try:
        return copy.deepcopy(model).to(torch.bfloat16)
    except RuntimeError as e:
        raise ValueError(f"bf16_bases: a {type(model).__name__} cannot be copied to save its base in bfloat16 "
                         f"({str(e).splitlines()[0]}); leave bf16_bases empty or use a HookedTransformer") from None


def run_abc(ctx: _Ctx, name: str, seed: int, base_row: dict) -> dict | None:
    """The ABC row of a fitted base: calibrate on its `calibration_layer`, retrain a fresh model under the bias in
    every layer until it fits, at most floor(retrain_fraction x its steps), test. None (and a stderr line) when the
    base did not fit."""
    import torch

    from ... import models
    from ...experiments.abc import NEG

    cfg, data = ctx.cfg, ctx.data[name]
    settings, key = ctx.key(name, "abc", seed)
    if base_row["status"] != "fitted":
        why = (f"{name} seed {seed}: no ABC row, its vanilla base did not fit (ID exact {base_row['id_exact']:.3f} "
               f"after {base_row['steps']} steps, below {cfg.fit_exact})")
        ctx.skipped.append(why)
        logger.warning("abc study (paper): %s", why)
        return None
    t0 = time.perf_counter()
    base = models.load(model_dir(ctx.out, name, "vanilla", seed), device=cfg.device).model
    try:
        cal = abc_calibration(base, data.tokenizer, data.calib, cfg.correct_only, training_rows(name, cfg.number_bits),
                              calibration_layer(cfg))
    except ValueError as e:  # a fitted base that answers no calibration sample (training numbers): stated, not fatal
        ctx.skipped.append(f"{name} seed {seed}: no ABC row, {e}")
        return ctx.write({**settings, "key": key, "status": f"skipped: {e}"})  # no "steps": not in the table
    saved = calibration_file(ctx.out, name, seed)
    saved.parent.mkdir(parents=True, exist_ok=True)
    torch.save(asdict(cal), saved)
    model = _model(ctx, name, cfg.abc_positional, seed + FRESH_INIT)
    bias = hooks_for_bias(cal.bias, model)
    cap = max(1, math.floor(base_row["steps"] * cfg.retrain_fraction))
    fit = train_until_fit(model, data, cfg, FitRun(
        seed, ctx.out / "scratch" / f"{name}-abc-seed{seed}", bias,
        (ctx.file("checks.jsonl"), {"task": name, "condition": "abc", "seed": seed}), cap))
    models.save(model, model_dir(ctx.out, name, "abc", seed), data.tokenizer, task=name, seed=seed,
                steps=fit["steps"])  # run it under calibration_file's bias
    cross = cal.bias[:, cal.rows[:, None], cal.prompt_cols[None, :]]
    with_lines = (cross <= NEG).flatten(1).any(1)  # a head with no kept line is transparent: no NEG cell
    row = {**settings, "key": key, "status": "ok" if fit["fitted"] else "did not fit", **fit, "retrain_cap": cap,
           "base_steps": base_row["steps"], "calibration_samples": cal.n_samples,
           "positional": models.positional_of(model),
           "cross_heads_with_lines": int(with_lines.sum()), **test_results(model, data, bias, cfg.eval_batch_size),
           "wall_s": time.perf_counter() - t0}
    return ctx.write(row)


def unit_key(name: str, condition: str, seed: int) -> str:
    """The unit of a run: "TASK/CONDITION/seed S"."""
    return f"{name}/{condition}/seed {seed}"


def units(cfg: PaperConfig) -> list[Unit]:
    """One unit per planned task, condition and seed: vanilla and ABS (stage 1), then ABC (stage 2: it calibrates
    on the vanilla model of its task and seed)."""
    return [Unit(unit_key(t, c, seed), 2 if c == "abc" else 1) for t, c in cfg.runs() for seed in cfg.seeds]


def run_paper_study(cfg: PaperConfig, out: str | Path, progress: bool = True,
                    unit: str | None = None) -> "pd.DataFrame | None":
    """Run (or resume) every planned task x condition x seed (vanilla before ABC) and write every output. With
    `unit` (a key of `units`): only that unit's run, its rows into its unit files; returns None."""
    from tqdm.auto import tqdm

    cfg.check()
    out = Path(out)
    runs = cfg.runs()
    names = list(dict.fromkeys(t for t, _ in runs))
    if unit is not None:  # a unit draws its own task's sets only (a unit process of a GPU slice starts sooner)
        names = [t for t in names if any(unit == unit_key(t, c, s) for c in PAPER_CONDITIONS for s in cfg.seeds)]
    data = {name: paper_data(name, cfg) for name in names}  # every set drawn and checked before any training
    shared = {k: v for k, v in asdict(cfg).items()
              if k not in ("plan", "seeds", "device", "eval_batch_size", "calib_layer", "keep_models", "bf16_bases")}
    index = unit_index(units(cfg), unit)
    writer = RowWriter(unit_file(out, "runs.jsonl", index), ("key",), "abc study")
    rows = {r["key"]: r for r in study_rows(out, "runs.jsonl", ("key",), "abc study")}
    ctx = _Ctx(cfg, out, data, writer, rows, shared, index=index)
    order = [(t, c) for t in names for c in PAPER_CONDITIONS if (t, c) in runs]
    t0 = time.perf_counter()
    table = None
    with tqdm(total=len(order) * len(cfg.seeds), desc="abc study (paper)", disable=not progress or unit is not None) \
            as bar:
        for name, condition in order:
            for seed in cfg.seeds:
                if unit in (None, unit_key(name, condition, seed)):
                    _run_one(ctx, name, condition, seed)
                bar.update(1)
            if unit is None:
                table = write_paper_outputs(ctx, time.perf_counter() - t0)  # a cut run still reports
    if unit is None:
        shutil.rmtree(out / "scratch", ignore_errors=True)
        write_position_table(ctx)
    return table


def _run_one(ctx: _Ctx, name: str, condition: str, seed: int) -> None:
    """The row of one task, condition and seed, unless it is on disk; then its model's position rows."""
    row = ctx.rows.get(ctx.key(name, condition, seed)[1])
    if row is None and condition == "abc":
        base = ctx.rows.get(ctx.key(name, "vanilla", seed)[1])
        if base is None:
            raise ValueError(f"unit {unit_key(name, condition, seed)!r} calibrates on the vanilla model that unit "
                             f"{unit_key(name, 'vanilla', seed)!r} trains: run it first")
        run_abc(ctx, name, seed, base)
    elif row is None:
        run_trained(ctx, name, condition, seed)
    elif row["status"].startswith("skipped"):  # resumed: still said in summary.json
        ctx.skipped.append(f"{name} seed {seed}: no ABC row, {row['status'].split(': ', 1)[-1]}")
    record_positions(ctx, name, condition, seed)


def position_rows(ctx: _Ctx, name: str, condition: str, seed: int, digits: int) -> list[dict]:
    """Per target row of the `digits`-digit test set that has references: how often the saved model (under its ABC
    bias) gets the row right, and how often it writes 0 where the answer is not 0 (the padding every training answer
    has there). Counted from the predictions at the target rows (`aspan.accuracy.target_predictions`), as
    `evaluate`'s records would give them."""
    import torch

    from ... import models
    from ...accuracy import target_predictions
    from ...batching import IGNORE

    data = ctx.data[name]
    samples = data.test[digits]
    model = models.load(model_dir(ctx.out, name, condition, seed), device=ctx.cfg.device).model
    bias = ()
    if condition == "abc":
        cal = torch.load(calibration_file(ctx.out, name, seed), weights_only=True)
        bias = hooks_for_bias(cal["bias"], model)
    pred, gold = target_predictions(model, data.tokenizer, samples, bias, ctx.cfg.eval_batch_size)
    refs = torch.zeros_like(gold, dtype=torch.bool)  # the rows `evaluate` scores: target rows with references
    for i, s in enumerate(samples):
        refs[i, : len(s.references)] = torch.tensor([bool(r) for r in s.references])
    zero = data.tokenizer.encode("0")[0]
    out = []
    for row in range(gold.shape[1]):
        keep = refs[:, row] & (gold[:, row] != IGNORE)
        if not keep.any():
            continue
        p, g = pred[keep, row], gold[keep, row]
        nonzero = g != zero
        out.append({"task": name, "condition": condition, "seed": seed, "digits": digits, "row": row,
                    "accuracy": int((p == g).sum()) / int(keep.sum()),
                    "zero_for_nonzero": int(((p == zero) & nonzero).sum()) / max(1, int(nonzero.sum()))})
    return out


POSITIONS = "positions.jsonl"  # position_rows of every saved vanilla and ABC model, recorded as soon as it exists


def _position_key(name: str, condition: str, seed: int, digits: int) -> str:
    return f"{name}/{condition}/{seed}/{digits}"


def record_positions(ctx: _Ctx, name: str, condition: str, seed: int) -> None:
    """Append `position_rows` of one saved model (at the first test length past the ID one) to positions.jsonl
    unless they are there; then, without `keep_models`, delete the models nothing needs any more."""
    past = [n for n in ctx.cfg.buckets if n > ctx.cfg.id_digits]
    if condition != "abs" and past and model_dir(ctx.out, name, condition, seed).exists():
        key = _position_key(name, condition, seed, past[0])
        if not any(r["key"] == key for r in study_rows(ctx.out, POSITIONS, ("key",), "abc study positions")):
            for r in position_rows(ctx, name, condition, seed, past[0]):
                append_line(ctx.file(POSITIONS), {"key": key, **r})
    if not ctx.cfg.keep_models:
        prune_models(ctx)


def prune_models(ctx: _Ctx) -> None:
    """Delete every saved model whose position rows are recorded and, for a vanilla base whose task has ABC in the
    plan, whose ABC row (or its skip) is written."""
    done = {r["key"].rsplit("/", 1)[0] for r in study_rows(ctx.out, POSITIONS, ("key",), "abc study positions")}
    runs = ctx.cfg.runs()
    for name, condition in runs:
        for seed in ctx.cfg.seeds:
            path = model_dir(ctx.out, name, condition, seed)
            if not path.exists() or f"{name}/{condition}/{seed}" not in done:
                continue
            waits = condition == "vanilla" and (name, "abc") in runs and ctx.key(name, "abc", seed)[1] not in ctx.rows
            if not waits:
                shutil.rmtree(path)


def write_position_table(ctx: _Ctx) -> None:
    """positions.csv: the recorded `position_rows` of every vanilla and ABC model of the plan (where extrapolation
    breaks: which rows fail, and whether they fail by writing 0); models saved before positions.jsonl existed are
    recorded first."""
    import pandas as pd

    for name, condition in ctx.cfg.runs():
        for seed in ctx.cfg.seeds:
            record_positions(ctx, name, condition, seed)
    wanted = {f"{n}/{c}/{s}" for n, c in ctx.cfg.runs() for s in ctx.cfg.seeds}
    rows = [{k: v for k, v in r.items() if k != "key"}
            for r in study_rows(ctx.out, POSITIONS, ("key",), "abc study positions", unique=False)
            if r["key"].rsplit("/", 1)[0] in wanted]  # every answer row of a model: one line each, one key
    if rows:
        RunDir(ctx.out).write_csv("positions.csv", pd.DataFrame(rows))


# ----------------------------------------------------------------------------------------------- outputs
def paper_table(ctx: _Ctx) -> "pd.DataFrame":
    """One row per task, condition and test length over the seeds that have a row: exact mean ± sd over seeds, the
    pooled count with its Wilson 95 % interval, how many seeds fitted, and the paper's number where it has one."""
    import pandas as pd

    out = []
    for name, condition in ctx.cfg.runs():
        rows = [r for r in ctx.rows.values() if r.get("protocol") == "paper" and r["task"] == name
                and r["condition"] == condition and r["seed"] in ctx.cfg.seeds and "steps" in r]
        if not rows:
            continue
        paper = PAPER_TABLE.get((name, condition))
        for n in ctx.cfg.buckets:
            exact = pd.Series([r[f"exact_{n}"] for r in rows], dtype=float)
            correct, total = sum(r[f"correct_{n}"] for r in rows), sum(r[f"n_{n}"] for r in rows)
            lo, hi = wilson(correct, total)
            out.append({
                "task": name, "condition": condition, "digits": n, "seeds": len(rows),
                "fitted": sum(r["status"] in ("fitted", "ok") for r in rows),
                "steps_mean": sum(r["steps"] for r in rows) / len(rows), "n_per_seed": rows[0][f"n_{n}"],
                "exact_mean": exact.mean(), "exact_sd": exact.std(ddof=1) if len(exact) > 1 else 0.0,
                "correct": correct, "n": total, "wilson_low": lo, "wilson_high": hi,
                "paper_exact": paper[PAPER_LENGTHS.index(n)] / 100 if paper and n in PAPER_LENGTHS else None,
            })
    return pd.DataFrame(out)


def write_paper_outputs(ctx: _Ctx, wall_s: float) -> "pd.DataFrame":
    """table.csv, summary.json (wide table beside the paper's), figures, run.json (`write_abc_outputs`); runs.jsonl
    is already written."""
    import torch

    from ...viz.studies import abc_accuracy_figure as accuracy_figure
    from ...viz.studies import abc_bias_figure as bias_figure

    table = paper_table(ctx)
    wide = []
    for (name, condition), g in (table.groupby(["task", "condition"], sort=False) if len(table) else ()):
        row = {"task": name, "condition": condition, "seeds": int(g.seeds.iloc[0]), "fitted": int(g.fitted.iloc[0]),
               "steps_mean": float(g.steps_mean.iloc[0])}
        for n, m, lo, hi, p in zip(g.digits, g.exact_mean, g.wilson_low, g.wilson_high, g.paper_exact):
            paper = "" if p is None or math.isnan(p) else f" (paper {p:.3f})"
            row[f"{n} digits"] = f"{m:.3f} [{lo:.3f}, {hi:.3f}]{paper}"
        wide.append(row)
    figures = {}
    for name in dict.fromkeys(t for t, _ in ctx.cfg.runs()):
        if len(table) and (table.task == name).any():
            figures[f"abc_paper_{name}"] = accuracy_figure(table, name)
        first = calibration_file(ctx.out, name, ctx.cfg.seeds[0])
        if first.exists():
            cal = torch.load(first, weights_only=True)  # tensors and an int: no pickled objects
            figures[f"abc_bias_{name}"] = bias_figure(cal, f"{name}, seed {ctx.cfg.seeds[0]}: layer "
                                                           f"{calibration_layer(ctx.cfg)} attention and ABC bias "
                                                           "(cross block)")
    return write_abc_outputs(ctx.out, AbcOutputs(
        "study abc --protocol paper", ctx.cfg, table, SUMMARY_TABLE, wide, ctx.skipped, figures,
        {"widths": {t: task_width(t, ctx.cfg.buckets) for t in ctx.data},
         "test_samples": {t: {n: len(s) for n, s in d.test.items()} for t, d in ctx.data.items()}}),
        ctx.rows.values(), wall_s)


def run(config: PaperConfig, out: Path, *, progress: bool = True, unit: str | None = None) -> "pd.DataFrame | None":
    """The runner (`Study`) of the abc study under Duan & Shi's protocol: `run_paper_study`; returns table.csv's
    table."""
    return run_paper_study(config, out, progress=progress, unit=unit)


STUDY = Study("abc-paper", PaperConfig, run, units, ("runs.jsonl", "checks.jsonl", POSITIONS))
