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
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from ... import tasks
from ...environment import run_environment
from ...findings.tables import ABC_PAPER_TABLE
from ...intervals import wilson  # noqa: F401 (re-exported: part of this module's public names)
from ...io import RowWriter, RunDir, append_line, read_rows, settings_key
from ...tasks.base import SEPARATORS, Sample, Task
from ...tasks.draws import OPERANDS, NumberDraw, build
from ...tokenization import CharTokenizer

PAPER_TASKS = ("successor", "addition", "parity")
PAPER_CONDITIONS = ("vanilla", "abc", "abs")
DEFAULT_PLAN = ("successor:vanilla", "successor:abc", "addition:vanilla", "addition:abc", "parity:abs")
DATA_SEED, CHECK_SEED, TEST_SEED, CALIB_SEED = 2023, 40_000, 50_000, 60_000
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


@dataclass(frozen=True)
class PaperConfig:
    """Settings of the paper-protocol study (defaults: the CPU size; `quick()` for tests; configs/ for others)."""

    plan: tuple[str, ...] = DEFAULT_PLAN  # "task:condition" runs (abc needs the task's vanilla run)
    seeds: tuple[int, ...] = (0, 1, 2)
    lr: float = 1e-3
    max_steps: int = 3000  # cap of every training until fit (vanilla and ABS)
    check_every: int = 100  # ID check interval (steps)
    fit_exact: float = 0.99  # ID exact on the check set that counts as "interpolates"
    retrain_fraction: float = 0.1  # ABC retrains until it fits, at most floor(fraction x the base's steps)
    batch_size: int = 64
    warmup: int = 100
    n_layers: int = 2
    calib_layer: int = -1  # the layer Algorithm 1 reads (-1: the last, the paper's; see `calibration_layer`)
    n_heads: int = 4
    d_model: int = 64
    positional: str = "learned"  # vanilla and ABC models (absolute positions, as the paper's sinusoidal ones)
    abc_positional: str = "learned"  # ABC's retrained models ("none": the bias alone says where to read)
    abs_positional: str = "none"  # ABS models (the paper's NoPE + w = 1)
    abs_width: int = 1  # ABS window half-width w
    number_bits: int = 20  # numbers of [0, 2^number_bits]
    id_digits: int = 6  # length of the held-out ID check set
    buckets: tuple[int, ...] = (6, 10, 20, 60)  # test lengths (decimal digits; parity: those numbers in binary)
    n_test: int = 1000  # at most this many samples per test length
    n_check: int = 500  # ID check samples
    n_calib: int = 512  # ABC calibration samples (training numbers; only the correctly answered ones count)
    correct_only: bool = True  # ABC averages over correctly answered samples only (False: all, for --quick)
    eval_batch_size: int = 100
    device: str = "cpu"
    # False: delete a saved model once nothing in the study needs it (its position rows recorded and, for a vanilla
    # base, its ABC row written), so a run directory carried between machines stays small (configs/gpu)
    keep_models: bool = True

    @classmethod
    def quick(cls, **kw: Any) -> "PaperConfig":
        """A tiny run for tests (seconds): numbers of [0, 64], widths 4, every base counts as fitted."""
        base = dict(seeds=(0,), lr=3e-3, max_steps=8, check_every=4, fit_exact=0.0, batch_size=8, warmup=2,
                    n_layers=2, n_heads=2, d_model=16, number_bits=6, id_digits=2, buckets=(2, 3, 4), n_test=6,
                    n_check=8, n_calib=8, correct_only=False, eval_batch_size=32)
        return cls(**{**base, **kw})

    def runs(self) -> list[tuple[str, str]]:
        """The plan as (task, variant) pairs, from its `TASK:VARIANT` entries."""
        return [tuple(p.split(":", 1)) for p in self.plan]  # type: ignore[misc]

    def check(self) -> None:
        """ValueError on impossible settings, before any work."""
        runs = self.runs()
        bad = [p for p, (t, c) in zip(self.plan, runs) if ":" not in p or t not in PAPER_TASKS
               or c not in PAPER_CONDITIONS]
        if bad or not runs:
            raise ValueError(f"plan must be a non-empty list of TASK:CONDITION with TASK in {', '.join(PAPER_TASKS)} "
                             f"and CONDITION in {', '.join(PAPER_CONDITIONS)}, got {list(self.plan)}")
        for t, c in runs:
            if c == "abc" and (t, "vanilla") not in runs:
                raise ValueError(f"{t}:abc calibrates on the vanilla model: add {t}:vanilla to the plan")
        for name in ("max_steps", "check_every", "batch_size", "n_layers", "n_heads", "d_model", "abs_width",
                     "number_bits", "id_digits", "n_test", "n_check", "n_calib", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.seeds or not self.lr > 0 or self.warmup < 0:
            raise ValueError("seeds must be non-empty, lr > 0 and warmup >= 0")
        if not -self.n_layers <= self.calib_layer < self.n_layers:
            raise ValueError(f"calib_layer must name one of the {self.n_layers} layers (-1: the last), "
                             f"got {self.calib_layer}")
        if not 0 <= self.fit_exact <= 1 or not 0 < self.retrain_fraction <= 10:
            raise ValueError("fit_exact must be in [0, 1] and retrain_fraction in (0, 10]")
        longest = len(str(2**self.number_bits))
        if not self.buckets or min(self.buckets) < 1 or max(self.buckets) < longest:
            raise ValueError(f"buckets must be lengths >= 1 whose longest fits the training numbers ({longest} "
                             f"digits for 2^{self.number_bits}), got {list(self.buckets)}")
        if self.id_digits > longest:
            raise ValueError(f"id_digits must be at most {longest} (the digits of 2^{self.number_bits})")
        for name in ("positional", "abc_positional", "abs_positional"):
            if getattr(self, name) not in ("rotary", "learned", "alibi", "none"):
                raise ValueError(f"{name} must be rotary, learned, alibi or none, got {getattr(self, name)!r}")


# ----------------------------------------------------------------------------------------------- data
@lru_cache(maxsize=2)
def number_split(bits: int, seed: int = DATA_SEED) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(training, check, test) numbers: a permutation of [0, 2^bits] split 7:1, the held-out eighth halved."""
    perm = list(range(2**bits + 1))
    random.Random(seed).shuffle(perm)
    cut = len(perm) * 7 // 8
    return tuple(perm[:cut]), tuple(perm[cut::2]), tuple(perm[cut + 1 :: 2])


def exact_length_numbers(length: int, k: int, pool: Sequence[int], limit: int, rng: random.Random) -> list[int]:
    """min(k, available) distinct numbers of exactly `length` digits: those of `pool` (held-out numbers of the
    permutation) and those above `limit` (outside the permutation), drawn uniformly from both together."""
    lo, hi = 10 ** (length - 1), 10**length
    inside = sorted(x for x in pool if lo <= x < hi)
    above = max(lo, limit + 1)
    total = len(inside) + max(0, hi - above)
    picked: set[int] = set()
    out = []
    while len(out) < min(k, total):
        i = rng.randrange(total)
        if i not in picked:
            picked.add(i)
            out.append(inside[i] if i < len(inside) else above + i - len(inside))
    return out


def padded_task(name: str, width: int) -> Task:
    """The study's task in the padded layout of `width` digits (parity: bits)."""
    if name == "successor":
        return tasks.get("successor", start=(0, 10**width - 1), numbers=2, layout="padded", width=width)
    if name == "addition":
        return tasks.get("addition", operands=2, digits=(1, width), layout="padded", width=width)
    if name == "parity":
        return tasks.get("parity", length=(1, width), format="scratchpad", layout="padded", width=width)
    raise ValueError(f"the paper protocol has no task {name!r}; choose from {', '.join(PAPER_TASKS)}")


def task_width(name: str, buckets: Sequence[int]) -> int:
    """The padded width that fits the longest test length: its digits, or for parity the bits of its numbers."""
    return len(format(10 ** max(buckets) - 1, "b")) if name == "parity" else max(buckets)


def held_out_samples(task: Task, length: int, k: int, pool: Sequence[int], limit: int, seed: int) -> list[Sample]:
    """Samples whose operands each have exactly `length` digits, drawn from held-out numbers (`exact_length_numbers`;
    the first operands distinct)."""
    rng = random.Random(seed)
    columns = [exact_length_numbers(length, k, pool, limit, rng) for _ in range(OPERANDS[task.name])]
    return [build(task, xs) for xs in zip(*columns)]


@dataclass
class PaperData:
    """Tokenizer, context and data of one task: the training draw, the check, calibration and test sets."""

    tokenizer: Any
    n_ctx: int
    train: NumberDraw
    check: list[Sample]
    calib: list[Sample]
    test: dict[int, list[Sample]]
    numbers: dict[str, tuple[int, ...]] = field(repr=False, default_factory=dict)


def paper_data(name: str, cfg: PaperConfig) -> PaperData:
    """Every set of one task, drawn from the number split (the same for every seed)."""
    from ... import models

    task = padded_task(name, task_width(name, cfg.buckets))
    train_numbers, check_numbers, test_numbers = number_split(cfg.number_bits)
    tok = CharTokenizer.for_alphabets(task.alphabet)
    limit = 2**cfg.number_bits
    draw = NumberDraw(task, train_numbers)
    return PaperData(
        tok, models.check_context(10**9, task, tok.offset), draw,
        held_out_samples(task, cfg.id_digits, cfg.n_check, check_numbers, 10**cfg.id_digits, CHECK_SEED),
        draw.generate(cfg.n_calib, seed=CALIB_SEED),
        {n: held_out_samples(task, n, cfg.n_test, test_numbers, limit, TEST_SEED + n) for n in cfg.buckets},
        {"train": train_numbers, "check": check_numbers, "test": test_numbers},
    )


# ----------------------------------------------------------------------------------------------- biases
def layout_batch(samples: Sequence[Sample], tokenizer):
    """A batch of samples of one padded layout (`padded_blocks` checks that they share it)."""
    from ...batching import make_batch

    return make_batch(list(samples), tokenizer)


@dataclass
class Calibration:
    """ABC of one base model: the averaged attention of the layer it reads, the blocks, the `[head, pos, pos]` bias."""

    attn: Any  # [head, pos, pos], averaged over the calibration samples used
    bias: Any  # [head, pos, pos], what every layer's scores get
    rows: Any
    prompt_cols: Any
    target_cols: Any
    n_samples: int


def mean_layer_attention(model, tokenizer, samples: Sequence[Sample], layer: int = -1, batch_size: int = 64):
    """One layer's attention `[head, pos, pos]` (-1: the last layer's) averaged over `samples` (one padded layout:
    no padding)."""
    import torch

    import hooks

    layer = layer % model.cfg.n_layers
    total = None
    for i in range(0, len(samples), batch_size):
        batch = layout_batch(samples[i : i + batch_size], tokenizer).to(model.cfg.device)
        pats = hooks.capture(model, batch.tokens, [layer], attention_mask=batch.attention_mask)
        summed = torch.stack([pats[(layer, h)] for h in range(model.cfg.n_heads)], 1).sum(0).float().cpu()
        total = summed if total is None else total + summed
    return total / len(samples)


def training_rows(name: str, number_bits: int) -> int:
    """How many target rows the training numbers reach: the digits (parity: bits) of the largest training answer
    (successor 2^bits + 1, addition 2 x 2^bits, parity's running parity of bits + 1 bits). The rows below are the
    zero padding of a longer width, which no training answer reaches."""
    largest = {"successor": 2**number_bits + 1, "addition": 2 * 2**number_bits, "parity": 2**number_bits}[name]
    return len(format(largest, "b")) if name == "parity" else len(str(largest))


def calibrate_padded(attn, batch, calib_rows: int | None = None) -> Calibration:
    """Algorithm 1 on the two blocks of an averaged attention map: the cross block with kappa 4.5 and the self block
    with 0.87. The lines are measured on the first `calib_rows` target rows (the rows the training numbers reach:
    the paper's m x n block, as its authors' code masks the target rows past the number's digits; all rows when
    None) and extended to every target row (the paper's M x N); -inf becomes NEG; prompt rows, the BOS column and
    every cell outside the blocks stay 0."""
    import torch

    from ...experiments.abc import NEG
    from ...experiments.calibration import CROSS_KAPPA, SELF_KAPPA, calibrate, padded_blocks

    rows, prompt_cols, target_cols = padded_blocks(batch)
    m = len(rows) if calib_rows is None else min(calib_rows, len(rows))
    bias = torch.zeros_like(attn)
    for cols, kappa in ((prompt_cols, CROSS_KAPPA), (target_cols, SELF_KAPPA)):
        block = attn[:, rows][:, :, cols]
        bias[:, rows[:, None], cols[None, :]] = calibrate(block[:, :m], tuple(block.shape[1:]), kappa=kappa)
    return Calibration(attn, bias.clamp(min=NEG), rows, prompt_cols, target_cols, len(batch.samples))


def abc_calibration(base, tokenizer, samples: Sequence[Sample], correct_only: bool = True,
                    calib_rows: int | None = None, layer: int = -1) -> Calibration:
    """ABC from a trained base model: the attention of its `layer` (-1: the last, the paper's) averaged over the
    `samples` it answers correctly (all of them with `correct_only=False`), calibrated on its first `calib_rows`
    target rows (`calibrate_padded`). ValueError when it answers none."""
    from ...experiments.abc import correct_samples

    used = correct_samples(base, tokenizer, list(samples)) if correct_only else list(samples)
    if not used:
        raise ValueError("the base model answers none of the calibration samples: ABC needs a model that interpolates")
    attn = mean_layer_attention(base, tokenizer, used, layer)
    return calibrate_padded(attn, layout_batch(used, tokenizer), calib_rows)


def abs_bias(sample: Sample, tokenizer, width: int = 1):
    """ABS (w = `width`) for one padded layout, `[pos, pos]`: target row t reads, in each operand, the digit on the
    line through its first two rows' aligned digits (the leftmost reference of rows 0 and 1 in that operand: digit t
    of a number written most significant digit first, bit t for the running parity) and `width` digits either side,
    and itself and the `width` target rows before it; every other cell of its blocks gets NEG, prompt rows and the
    BOS column nothing. Cells past an operand's ends are dropped, as in the paper's bias matrices."""
    import torch

    from ...experiments.abc import NEG
    from ...experiments.calibration import padded_blocks

    batch = layout_batch([sample], tokenizer)
    rows, prompt_cols, target_cols = padded_blocks(batch)
    n, off, sep = batch.tokens.shape[1], batch.offset, int(rows[0])
    bias = torch.zeros(n, n)
    bias[rows[:, None], torch.cat([prompt_cols, target_cols])[None, :]] = NEG
    segment = [-1] * n  # operand index of each operand digit's column (-1: not an operand digit)
    for p in prompt_cols.tolist():
        seps = sum(c in SEPARATORS for c in sample.text[: p - off])
        segment[p] = -1 if sample.text[p - off] in SEPARATORS else seps

    def aligned(t: int) -> dict[int, int]:  # operand -> leftmost prompt reference of target row t
        refs = [off + k for k in sample.references[t] if off + k < sep]
        return {seg: min(k for k in refs if segment[k] == seg) for seg in {segment[k] for k in refs}}

    first, second = aligned(0), aligned(1)
    for r in rows.tolist():
        t = r - sep
        for seg, start in first.items():
            centre = start + (second[seg] - start) * t
            for c in range(centre - width, centre + width + 1):
                if off <= c < sep and segment[c] == seg:
                    bias[r, c] = 0.0
        bias[r, max(sep, r - width) : r + 1] = 0.0
    return bias


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
    from ...training import TrainConfig

    return TrainConfig.scratch(steps=steps, batch_size=cfg.batch_size, lr=cfg.lr, warmup=min(cfg.warmup, steps // 4),
                               seed=seed, device=cfg.device, log_every=max(1, min(cfg.check_every, steps)),
                               eval_batch_size=cfg.eval_batch_size, curve_every=cfg.check_every, stop="target",
                               stop_bucket=CHECK, target=cfg.fit_exact)


def train_until_fit(model, data: PaperData, cfg: PaperConfig, seed: int, scratch: Path, bias_hooks=(),
                    log: tuple[Path, dict] | None = None, cap: int | None = None) -> dict:
    """Train on the training numbers until ID exact on the check set reaches `fit_exact`, checked every
    `check_every` steps (and at the cap): one schedule over `cap` steps (`max_steps` when None) whose learning curve
    on the check set drives the target stop rule (`train_config`); its run directory `scratch` holds it until it
    ends (`aspan.training.train_resumable`). `log`: (JSONL file, fields) to append every check to as it happens (a
    long run shows how far it got). Returns steps, fitted, the last ID exact and every check (the curve before
    training, step 0, is not a check)."""
    from ...training import train_resumable

    def logged(rows: list[dict]) -> None:
        for r in rows:
            if log is not None and r["step"] > 0:
                append_line(log[0], {**log[1], "step": r["step"], "id_exact": r["exact"], "time": time.time()})

    cap = cfg.max_steps if cap is None else cap
    # in `scratch` (removed at the end): a run paused by a time budget (aspan.training.time_budget) continues exactly
    result = train_resumable(scratch, model, data.tokenizer, data.train, train_config(cfg, seed, cap),
                             fwd_hooks=bias_hooks, progress=False, curve_data={CHECK: data.check}, on_curve=logged)
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

    def key(self, name: str, condition: str, seed: int) -> tuple[dict, str]:
        settings = {"protocol": "paper", "task": name, "condition": condition, "seed": seed, **self.shared}
        layer = calibration_layer(self.cfg)
        if condition == "abc" and layer != self.cfg.n_layers - 1:  # only ABC reads it; the last layer keeps old keys
            settings["calib_layer"] = layer
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


def hooks_for_bias(bias, model) -> list:
    """The same bias on every head of every layer (`hooks.attn_bias`)."""
    import hooks

    return hooks.attn_bias(bias, model=model)


def run_trained(ctx: _Ctx, name: str, condition: str, seed: int) -> dict:
    """A vanilla or ABS row: a model trained until it fits (or the cap), then tested; the vanilla model is saved for
    ABC."""
    from ... import models

    cfg, data = ctx.cfg, ctx.data[name]
    settings, key = ctx.key(name, condition, seed)
    t0 = time.perf_counter()
    model = _model(ctx, name, cfg.positional if condition == "vanilla" else cfg.abs_positional, seed)
    bias = () if condition == "vanilla" else hooks_for_bias(abs_bias(data.check[0], data.tokenizer, cfg.abs_width),
                                                           model)
    fit = train_until_fit(model, data, cfg, seed, ctx.out / "scratch" / f"{name}-{condition}-seed{seed}", bias,
                          (ctx.out / "checks.jsonl", {"task": name, "condition": condition, "seed": seed}))
    if condition == "vanilla":
        models.save(model, model_dir(ctx.out, name, "vanilla", seed), data.tokenizer, task=name, seed=seed,
                    steps=fit["steps"])
    status = "fitted" if fit["fitted"] else "did not fit"
    row = {**settings, "key": key, "status": status, **fit, "positional": models.positional_of(model),
           **test_results(model, data, bias, cfg.eval_batch_size), "wall_s": time.perf_counter() - t0}
    return ctx.write(row)


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
    fit = train_until_fit(model, data, cfg, seed, ctx.out / "scratch" / f"{name}-abc-seed{seed}", bias,
                          (ctx.out / "checks.jsonl", {"task": name, "condition": "abc", "seed": seed}), cap=cap)
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


def run_paper_study(cfg: PaperConfig, out: str | Path, progress: bool = True) -> "pd.DataFrame":
    """Run (or resume) every planned task x condition x seed (vanilla before ABC) and write every output."""
    from tqdm.auto import tqdm

    cfg.check()
    out = Path(out)
    runs = cfg.runs()
    names = list(dict.fromkeys(t for t, _ in runs))
    data = {name: paper_data(name, cfg) for name in names}  # every set drawn and checked before any training
    shared = {k: v for k, v in asdict(cfg).items()
              if k not in ("plan", "seeds", "device", "eval_batch_size", "calib_layer", "keep_models")}
    writer = RowWriter(out / "runs.jsonl", ("key",), "abc study")
    rows = {r["key"]: r for r in read_rows(out / "runs.jsonl", ("key",), "abc study")}
    ctx = _Ctx(cfg, out, data, writer, rows, shared)
    order = [(t, c) for t in names for c in PAPER_CONDITIONS if (t, c) in runs]
    t0 = time.perf_counter()
    with tqdm(total=len(order) * len(cfg.seeds), desc="abc study (paper)", disable=not progress) as bar:
        for name, condition in order:
            for seed in cfg.seeds:
                row = ctx.rows.get(ctx.key(name, condition, seed)[1])
                if row is None and condition == "abc":
                    run_abc(ctx, name, seed, ctx.rows[ctx.key(name, "vanilla", seed)[1]])
                elif row is None:
                    run_trained(ctx, name, condition, seed)
                elif row["status"].startswith("skipped"):  # resumed: still said in summary.json
                    ctx.skipped.append(f"{name} seed {seed}: no ABC row, {row['status'].split(': ', 1)[-1]}")
                record_positions(ctx, name, condition, seed)
                bar.update(1)
            table = write_paper_outputs(ctx, time.perf_counter() - t0)  # a cut run still reports
    shutil.rmtree(out / "scratch", ignore_errors=True)
    write_position_table(ctx)
    return table


def position_rows(ctx: _Ctx, name: str, condition: str, seed: int, digits: int) -> list[dict]:
    """Per target row of the `digits`-digit test set: how often the saved model (under its ABC bias) gets the row
    right, and how often it writes 0 where the answer is not 0 (the padding every training answer has there)."""
    import torch

    from ... import models
    from ...evaluation import evaluate

    data = ctx.data[name]
    model = models.load(model_dir(ctx.out, name, condition, seed), device=ctx.cfg.device).model
    bias = ()
    if condition == "abc":
        cal = torch.load(calibration_file(ctx.out, name, seed), weights_only=True)
        bias = hooks_for_bias(cal["bias"], model)
    rec = evaluate(model, data.tokenizer, data.test[digits], fwd_hooks=bias, batch_size=ctx.cfg.eval_batch_size,
                   attn=False).records
    rec = rec[rec.scored]
    out = []
    for row, g in rec.groupby("target_index"):
        wrong_zero = (g.pred_char == "0") & (g.target_char != "0")
        out.append({"task": name, "condition": condition, "seed": seed, "digits": digits, "row": int(row),
                    "accuracy": float(g.correct.mean()),
                    "zero_for_nonzero": float(wrong_zero.sum() / max(1, (g.target_char != "0").sum()))})
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
        if not any(r["key"] == key for r in read_rows(ctx.out / POSITIONS, ("key",), "abc study positions")):
            for r in position_rows(ctx, name, condition, seed, past[0]):
                append_line(ctx.out / POSITIONS, {"key": key, **r})
    if not ctx.cfg.keep_models:
        prune_models(ctx)


def prune_models(ctx: _Ctx) -> None:
    """Delete every saved model whose position rows are recorded and, for a vanilla base whose task has ABC in the
    plan, whose ABC row (or its skip) is written."""
    done = {r["key"].rsplit("/", 1)[0] for r in read_rows(ctx.out / POSITIONS, ("key",), "abc study positions")}
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
            for r in read_rows(ctx.out / POSITIONS, ("key",), "abc study positions")
            if r["key"].rsplit("/", 1)[0] in wanted]
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
    """table.csv, summary.json (wide table beside the paper's), figures, run.json; runs.jsonl is already written."""
    import torch

    from ...viz.studies import abc_accuracy_figure as accuracy_figure
    from ...viz.studies import abc_bias_figure as bias_figure

    table = paper_table(ctx)
    run = RunDir(ctx.out)
    run.write_csv("table.csv", table)
    wide = []
    for (name, condition), g in (table.groupby(["task", "condition"], sort=False) if len(table) else ()):
        row = {"task": name, "condition": condition, "seeds": int(g.seeds.iloc[0]), "fitted": int(g.fitted.iloc[0]),
               "steps_mean": float(g.steps_mean.iloc[0])}
        for n, m, lo, hi, p in zip(g.digits, g.exact_mean, g.wilson_low, g.wilson_high, g.paper_exact):
            paper = "" if p is None or math.isnan(p) else f" (paper {p:.3f})"
            row[f"{n} digits"] = f"{m:.3f} [{lo:.3f}, {hi:.3f}]{paper}"
        wide.append(row)
    run.write_json("summary.json", {"tables": {SUMMARY_TABLE: wide},
                                    "not_run": ctx.skipped})
    for name in dict.fromkeys(t for t, _ in ctx.cfg.runs()):
        if len(table) and (table.task == name).any():
            run.figure(accuracy_figure(table, name), f"abc_paper_{name}")
        first = calibration_file(ctx.out, name, ctx.cfg.seeds[0])
        if first.exists():
            cal = torch.load(first, weights_only=True)  # tensors and an int: no pickled objects
            run.figure(bias_figure(cal, f"{name}, seed {ctx.cfg.seeds[0]}: layer {calibration_layer(ctx.cfg)} "
                                        "attention and ABC bias (cross block)"), f"abc_bias_{name}")
    run.write_json("run.json", {
        "command": "study abc --protocol paper", "argv": sys.argv, "config": asdict(ctx.cfg),
        "wall_s_this_invocation": wall_s, "train_eval_s_all_rows": sum(r.get("wall_s", 0.0) for r in ctx.rows.values()),
        "not_run": ctx.skipped, "widths": {t: task_width(t, ctx.cfg.buckets) for t in ctx.data},
        "test_samples": {t: {n: len(s) for n, s in d.test.items()} for t, d in ctx.data.items()},
        **run_environment(device=ctx.cfg.device),
    })
    return table


class AbcPaperStudy:
    """The abc study under Duan & Shi's protocol as a `Study` (`aspan.applications.studies`): `run_paper_study`."""

    name = "abc-paper"
    config = PaperConfig

    def run(self, config: PaperConfig, out: str | Path, *, progress: bool = True) -> "pd.DataFrame":
        """Run or resume the study in `out`; returns table.csv's table."""
        return run_paper_study(config, out, progress=progress)


STUDY = AbcPaperStudy()
