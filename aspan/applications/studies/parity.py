"""`aspan study parity`: does the format decide length generalization? (Ebrahimi, Panchal & Memisevic 2024, §3-4)

For each parity format (plain, scratchpad, interleaved, mnemonic) a tiny model is trained from scratch on inputs
of 1..L bits, then tested on held-out samples of exactly 1x, 2x, 5x and 10x L bits: exact accuracy (every
scored character and EOS right, teacher-forced, which for these prompt-fixed targets equals greedy generation with
the given characters supplied) and per-token accuracy. Every format gets the same step budget; its learning rate
is chosen from a small grid on a separate selection set (seed 0's run; largest exact accuracy at 2x L, ties
broken by exact at 1x L, then by per-token accuracy at 2x L); the other seeds are trained at the chosen rate and
every number reported is a mean over seeds with its 95 % interval on the held-out test samples. One head's
attention (the head with the highest AttnScore on the references in distribution) is drawn on an ID sample and at
the failure.

    aspan study parity --out runs/parity            # ~25 min on one CPU thread
    aspan study parity --quick --out /tmp/pq        # < 1 min, for tests
    aspan study parity --config configs/parity_study_gpu.toml --out runs/parity_gpu
    aspan study parity --protocol curves --out runs/parity_curves   # every run until it fits (or a cap)

With `protocol = "curves"` every run trains until its learning curve on held-out training-length inputs reaches
`fit_exact` (or `cap` steps); a format that did not fit claims no accuracy beyond its training length.

Outputs (RUN_DIR): rows.jsonl (one row per run x evaluation set, keyed by its settings; a rerun skips finished
runs), selection.csv, summary.csv, summary.json, `figures/*.json`, `views/*.html`, `models/*`, run.json, report.html;
with the curves protocol also learning_curves.jsonl (one row per run, step and curve set) and convergence.csv.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...environment import run_environment, torch_threads
from ...intervals import mean_sd, seed_interval, t_interval
from ...io import RowWriter, read_rows, save_figure, settings_key, write_csv, write_json
from ...models.tiny import POSITIONAL, Positional
from ...tasks.parity import FORMATS, Parity
from ...tasks.split import SplitTask, distinct, part_of
from ...tokenization import CharTokenizer
from . import Study, Unit, study_rows, unit_file, unit_index

PROTOCOLS = ("budget", "curves")
SET_DRAWS = ("disjoint", "with_replacement")  # `ParityStudyConfig.set_draw`
ID_PARTS = ("select", "curve", "test")  # the thirds of the held-out side the ID sets draw from (`part_of`)
ENUMERATED_BITS = 16  # pools of inputs up to this many bits are counted, so a set can take a whole small pool
CURVES_ROWS = "learning_curves.jsonl"  # the curves protocol's learning curves: one row per (run, step, set)
FIT_SET = "train"  # the curve set of the training lengths, whose exact accuracy decides the fit


@dataclass
class ParityStudyConfig:
    """Settings of one parity study; every field can come from a TOML file (`--config`) or a flag."""

    formats: tuple[str, ...] = FORMATS  # parity formats compared
    train_length: int = 8  # training inputs have 1..train_length bits
    multiples: tuple[int, ...] = (1, 2, 5, 10)  # test inputs have exactly multiple * train_length bits
    select_multiple: int = 2  # the selection set's length, as a multiple of train_length
    seeds: int = 3  # training seeds per format (>= 3 for a mean ± sd)
    lrs: tuple[float, ...] = (1e-3, 3e-3)  # learning-rate grid, chosen per format on the selection set
    steps: int = 800  # optimiser steps per run (the same for every format)
    batch_size: int = 32  # samples per step
    warmup: int = 50  # linear warm-up steps
    n_layers: int = 2  # model depth
    n_heads: int = 4  # attention heads per layer
    d_model: int = 64  # residual width
    positional: Positional = "rotary"  # positional encoding of the models (models.tiny's `positional`)
    anchors: int = 100  # mnemonic anchor symbols (>= the longest test input)
    # share of the inputs of 1..train_length bits held out of training (aspan.tasks.split, by a hash of the bits):
    # the held-out sets at the training lengths (selection 1x, test 1x, the fit curve set) draw only from them, so no
    # held-out ID input is a training input; 0: no split (training then covers every short input)
    held_out_share: float = 0.2
    # how the held-out sets are drawn. "disjoint": every set without repeats (by the input bits), and the selection,
    # test and curve sets pairwise disjoint at every length: at the training lengths each draws from its own third
    # of the held-out inputs (selection, curve, test, by the same hash of the bits: `ID_PARTS`), at longer lengths
    # each excludes the inputs of the sets drawn before it (selection, tests, curves, in that order); a set whose
    # pool holds fewer inputs than asked is that whole pool, and its rows record the n it has (10 bits at share 0.2:
    # about 68 inputs per third, so n_test 200 gives about 68 at 1x). "with_replacement": the former independent
    # draws, which repeat and overlap where the pool is small; rows written before this setting existed carry no
    # such key and were drawn so
    set_draw: str = "disjoint"
    n_select: int = 100  # selection samples per selection length
    n_test: int = 200  # held-out test samples per test length
    eval_batch_size: int = 50  # samples per evaluation forward
    device: str = "cpu"  # "cpu", "cuda" or "auto"
    threads: int = 1  # torch CPU threads
    # protocol "budget": every run trains `steps` steps; "curves": every run trains until its learning curve on
    # held-out training-length inputs (1..train_length bits, `n_curve` samples) reaches `fit_exact` exact (the target
    # stop rule), scored every `curve_every` steps, or `cap` steps; a format whose runs do not all get there "did
    # not fit" and claims no accuracy beyond its training length
    protocol: str = "budget"
    cap: int = 10_000
    curve_every: int = 200
    n_curve: int = 200
    fit_exact: float = 0.99

    @classmethod
    def quick(cls, **kw: Any) -> "ParityStudyConfig":
        """Tiny settings that finish in well under a minute (for the tests), same code path: half of the 30 inputs
        of 1-4 bits held out, so each held-out third has a few (3 or 4 of exactly 4 bits)."""
        base = dict(train_length=4, seeds=2, lrs=(1e-3, 3e-3), steps=8, warmup=2, n_layers=1, n_heads=2, d_model=16,
                    anchors=40, held_out_share=0.5, n_select=8, n_test=8, eval_batch_size=16)
        return cls(**{**base, **kw})

    @classmethod
    def curves(cls, quick: bool = False, **kw: Any) -> "ParityStudyConfig":
        """The curves protocol's defaults (`--protocol curves`): inputs of up to 20 bits, tested at 1x, 2x and 5x
        (100 bits: within the mnemonic anchors), a 3-point grid; with `quick`, the tiny settings of the tests."""
        if quick:
            return cls.quick(**{"protocol": "curves", "cap": 12, "curve_every": 4, "n_curve": 8, "fit_exact": 0.99,
                                **kw})
        base = dict(protocol="curves", train_length=20, multiples=(1, 2, 5), lrs=(3e-4, 1e-3, 3e-3))
        return cls(**{**base, **kw})

    def check(self) -> None:
        """ValueError on impossible settings, before any work."""
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        for name in ("cap", "curve_every", "n_curve"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.fit_exact <= 1:
            raise ValueError(f"fit_exact must be in (0, 1], got {self.fit_exact}")
        if not self.formats or any(f not in FORMATS for f in self.formats):
            raise ValueError(f"formats must be a non-empty subset of {', '.join(FORMATS)}, got {self.formats}")
        if len(set(self.formats)) != len(self.formats):
            raise ValueError(f"formats repeat: {self.formats}")
        for name in ("train_length", "seeds", "steps", "batch_size", "n_layers", "n_heads", "d_model", "n_select",
                     "n_test", "eval_batch_size", "threads", "select_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if not 0 <= self.held_out_share < 1:
            raise ValueError(f"held_out_share must be in [0, 1), got {self.held_out_share}")
        if self.set_draw not in SET_DRAWS:
            raise ValueError(f"set_draw must be one of {', '.join(SET_DRAWS)}, got {self.set_draw!r}")
        if not self.multiples or any(m < 1 for m in self.multiples) or 1 not in self.multiples:
            raise ValueError(f"multiples must be positive and include 1 (the training length), got {self.multiples}")
        if not self.lrs or any(not lr > 0 for lr in self.lrs):
            raise ValueError(f"lrs must be positive, got {self.lrs}")
        if self.positional not in POSITIONAL:
            raise ValueError(f"positional must be one of {', '.join(POSITIONAL)}, got {self.positional!r}")
        if "mnemonic" in self.formats:
            Parity(length=self.longest, format="mnemonic", anchors=self.anchors)  # enough anchors for 10x

    @classmethod
    def toml_fields(cls, raw: dict[str, Any], path: Any = None) -> dict[str, Any]:
        """The settings of a parsed config file (`aspan.config.load_config`'s hook): its `[parity]` table, or the
        whole file less a `[slurm]` table (the resources of `--launcher slurm`, `aspan.applications.launch`)."""
        return raw.get("parity", {k: v for k, v in raw.items() if k != "slurm"})

    @property
    def longest(self) -> int:
        """The longest evaluated length: the largest multiple of the training length."""
        return max(max(self.multiples), self.select_multiple) * self.train_length


def choose_lr(rows: pd.DataFrame) -> float:
    """The selection rule: largest exact at the selection length, then exact at 1x, then per-token at the
    selection length."""
    sel = rows[rows.split == "select"].pivot_table(index="lr", columns="which", values=["exact", "partial"])
    order = sel.sort_values([("exact", "ood"), ("exact", "id"), ("partial", "ood")], ascending=False)
    if "fitted" in rows:  # curves protocol: a rate whose run fit its training lengths comes first
        fitted = rows.groupby("lr").fitted.all()
        return float(next((lr for lr in order.index if fitted[lr]), order.index[0]))
    return float(order.index[0])



# ----------------------------------------------------------------------------------------------- the runs
def make_task(config: ParityStudyConfig, fmt: str, length: int | tuple[int, int], side: str | None = None,
              part: tuple[int, int] = (0, 1)):
    """The parity task of `fmt` (mnemonic tasks share one anchor set, so train and test symbols agree); with `side`
    ("train" or "held_out") and a `held_out_share`, restricted to that side of the split of the inputs by their
    bits (`aspan.tasks.split`; `part`: a slice of the held-out side)."""
    task = Parity(length=length, format=fmt, **({"anchors": config.anchors} if fmt == "mnemonic" else {}))
    if side is None or not config.held_out_share:
        return task
    return SplitTask(task, side, config.held_out_share, key=_bits_key(task), part=part)


def _bits_key(task: Parity):
    """A sample's input bits: the key of the split and of the sets' disjointness (mnemonic anchors aside)."""
    return lambda s: task.bits(s.text[: s.prompt_len])


@lru_cache(maxsize=64)
def _pool(lo: int, hi: int, share: float, part: int | None) -> frozenset[str] | None:
    """Every input of lo..hi bits in third `part` of the held-out side (None: every input); None when there are
    too many to count (more than `ENUMERATED_BITS` bits)."""
    if hi > ENUMERATED_BITS:
        return None
    every = ("".join(b) for n in range(lo, hi + 1) for b in product("01", repeat=n))
    return frozenset(b for b in every if part is None or part_of(b, share, len(ID_PARTS)) == part)


def draw_set(config: ParityStudyConfig, fmt: str, length: int | tuple[int, int], which: str, spec: tuple[int, int],
             taken: set[str]) -> list:
    """Held-out set `which` (one of `ID_PARTS`) of `spec` = (n, seed) samples of `length` bits (`set_draw`
    "disjoint"): no repeats, no input in `taken` (the bits of the sets drawn before; this set's are added); at the
    training lengths only inputs of its third of the held-out side, so never a training input. Fewer than n where
    the pool holds fewer."""
    n, seed = spec
    lo, hi = (length, length) if isinstance(length, int) else length
    inside = hi <= config.train_length and bool(config.held_out_share)
    part = ID_PARTS.index(which) if inside else None
    task = make_task(config, fmt, length, *(("held_out", (part, len(ID_PARTS))) if part is not None else ()))
    pool = _pool(lo, hi, config.held_out_share, part)
    left = None if pool is None else sum(b not in taken for b in pool)
    if left == 0:
        raise ValueError(f"the held-out {which} set of {lo}-{hi} bits has no input to draw from (train_length "
                         f"{config.train_length}, held_out_share {config.held_out_share:g}): raise either")
    key = _bits_key(task if isinstance(task, Parity) else task.task)
    out = distinct(task, n, seed, key=key, exclude=taken, pool=left)
    taken.update(key(s) for s in out)
    return out


def eval_sets(config: ParityStudyConfig, fmt: str) -> dict[tuple[str, str], list]:
    """Selection samples (1x and the selection length) and held-out test samples (every multiple), disjoint seeds;
    with `set_draw` "disjoint" (`draw_set`) also disjoint inputs, none repeated."""
    L = config.train_length
    if config.set_draw == "with_replacement":
        return _eval_sets_with_replacement(config, fmt)
    taken: set[str] = set()
    sets = {("select", "id"): draw_set(config, fmt, L, "select", (config.n_select, 10_001), taken),
            ("select", "ood"): draw_set(config, fmt, config.select_multiple * L, "select",
                                        (config.n_select, 10_000 + config.select_multiple), taken)}
    for m in config.multiples:
        sets[("test", str(m))] = draw_set(config, fmt, m * L, "test", (config.n_test, 20_000 + m), taken)
    return sets


def _eval_sets_with_replacement(config: ParityStudyConfig, fmt: str) -> dict[tuple[str, str], list]:
    """`eval_sets` as drawn before `set_draw` (independent draws: repeats, and overlaps between the sets)."""
    L = config.train_length
    sets = {("select", "id"): make_task(config, fmt, L, "held_out").generate(config.n_select, seed=10_001),
            ("select", "ood"): make_task(config, fmt, config.select_multiple * L).generate(
                config.n_select, seed=10_000 + config.select_multiple)}
    for m in config.multiples:
        side = "held_out" if m == 1 else None  # longer inputs are never trained on
        sets[("test", str(m))] = make_task(config, fmt, m * L, side).generate(config.n_test, seed=20_000 + m)
    return sets


def run_settings(config: ParityStudyConfig, fmt: str, lr: float, seed: int) -> dict[str, Any]:
    """What a run's rows depend on (their key): changing any of it reruns, changing nothing resumes."""
    keep = ("train_length", "multiples", "select_multiple", "steps", "batch_size", "warmup", "n_layers", "n_heads",
            "d_model", "positional", "anchors", "n_select", "n_test")
    curves = {"protocol": "curves", "steps": config.cap, "curve_every": config.curve_every, "n_curve": config.n_curve,
              "fit_exact": config.fit_exact} if config.protocol == "curves" else {}
    split = {"held_out_share": config.held_out_share} if config.held_out_share else {}  # rows before it: no split
    draw = {} if config.set_draw == "with_replacement" else {"set_draw": config.set_draw}  # rows before it: none
    return {"format": fmt, "lr": lr, "seed": seed, **{k: getattr(config, k) for k in keep}, **curves, **split,
            **draw}


def curve_sets(config: ParityStudyConfig, fmt: str) -> dict[str, list]:
    """The curves protocol's held-out sets: the training lengths (`FIT_SET`, which decides the fit) and the
    selection length, from seeds apart from the selection and test sets; with `set_draw` "disjoint" also from
    inputs apart from theirs (`draw_set`)."""
    L = config.train_length
    if config.set_draw == "with_replacement":
        return {FIT_SET: make_task(config, fmt, (1, L), "held_out").generate(config.n_curve, seed=30_001),
                f"{config.select_multiple}x": make_task(config, fmt, config.select_multiple * L).generate(
                    config.n_curve, seed=30_000 + config.select_multiple)}
    taken = {_bits_key(make_task(config, fmt, 1))(s) for samples in eval_sets(config, fmt).values() for s in samples}
    return {FIT_SET: draw_set(config, fmt, (1, L), "curve", (config.n_curve, 30_001), taken),
            f"{config.select_multiple}x": draw_set(config, fmt, config.select_multiple * L, "curve",
                                                   (config.n_curve, 30_000 + config.select_multiple), taken)}


def run_id(fmt: str, lr: float, seed: int) -> str:
    """A run's identifier, `FORMAT-lrLR-seedSEED` (e.g. `scratchpad-lr0.001-seed0`)."""
    return f"{fmt}-lr{lr:g}-seed{seed}"


@dataclass(frozen=True)
class Run:
    """One training run of the study."""

    format: str  # parity format
    lr: float  # learning rate
    seed: int  # training seed (model initialisation and data order)

    @property
    def id(self) -> str:
        """The run's identifier, `FORMAT-lrLR-seedSEED` (see `run_id`)."""
        return run_id(self.format, self.lr, self.seed)


def train_and_evaluate(config: ParityStudyConfig, tok, n_ctx: int, spec: Run, out: Path,
                       index: int | None = None) -> list[dict]:
    """Train one model from scratch, save it under RUN_DIR/models, and return its evaluation rows (`index`: the
    unit whose files its learning-curve rows go to, `unit_file`)."""
    fmt, lr, seed = spec.format, spec.lr, spec.seed
    from ... import models
    from ...evaluation import evaluate
    from ...training import TrainConfig, train_resumable

    settings = run_settings(config, fmt, lr, seed)
    model = models.tiny(tok, n_layers=config.n_layers, n_heads=config.n_heads, d_model=config.d_model, n_ctx=n_ctx,
                        seed=seed, device=_device(config), positional=config.positional)
    by_curves = config.protocol == "curves"
    steps = config.cap if by_curves else config.steps
    cfg = TrainConfig.scratch(steps=steps, batch_size=config.batch_size, lr=lr, warmup=config.warmup, seed=seed,
                              device=_device(config), log_every=max(1, steps // 10),
                              curve_every=config.curve_every if by_curves else 0,
                              stop="target" if by_curves else "none", stop_bucket=FIT_SET,
                              target=config.fit_exact if by_curves else None)
    t0 = time.perf_counter()
    # in RUN_DIR/scratch/ID until it ends: a run paused by a time budget (aspan.training.time_budget) continues there
    train_task = make_task(config, fmt, (1, config.train_length), "train")
    result = train_resumable(out / "scratch" / spec.id, model, tok, train_task, cfg, progress=False,
                             curve_data=curve_sets(config, fmt) if by_curves else None)
    curves = [r for r in result.history if r.get("kind") == "curve"]
    seconds = time.perf_counter() - t0
    # the last logged training loss (None when the stop rule ended the run before its first log row)
    loss = next((r["loss"] for r in reversed(result.history) if r.get("kind") == "train"), None)
    models.save(model, out / "models" / spec.id, tok, task="parity", study="parity", **settings)
    run_key = settings_key(settings)
    outcome = write_curves(config, spec, run_key, curves, result.stop, unit_file(out, CURVES_ROWS, index)) \
        if by_curves else {}
    rows = []
    for (split, which), samples in eval_sets(config, fmt).items():
        res = evaluate(model, tok, samples, attn=False, batch_size=config.eval_batch_size).summary()
        bits = sum(c in "01" for c in samples[0].prompt)
        row = {**settings, **outcome, "run": run_key, "split": split, "which": which, "bits": bits,
               "multiple": bits // config.train_length, "exact": res["exact"], "partial": res["partial"],
               "n": res["n"], "train_seconds": seconds, "final_loss": loss}
        rows.append({"key": settings_key({**settings, "split": split, "which": which}), **row})
    return rows


def write_curves(config: ParityStudyConfig, spec: Run, run_key: str, curves: list[dict], stop: dict,
                 path: Path) -> dict:
    """Append a run's learning-curve rows (keyed by run, step and set) to `path` (`CURVES_ROWS` or its unit file),
    before the run's own rows (a run is done, never retrained, once those are written); returns where and why it
    stopped and its fit."""
    writer = RowWriter(path)
    for r in curves:
        writer.write({"key": f"{run_key}/{r['step']}/{r['bucket']}", "run": run_key, "format": spec.format,
                      "lr": spec.lr, "seed": spec.seed,
                      **{k: r[k] for k in ("step", "bucket", "n", "exact", "partial", "loss")}})
    fit = [r["exact"] for r in curves if r["bucket"] == FIT_SET and r["step"] == stop["step"]][-1]
    return {"stop_reason": stop["reason"], "stop_step": stop["step"], "fit_curve_exact": fit,
            "fitted": fit >= config.fit_exact}


def _device(config: ParityStudyConfig) -> str:
    from ...training import resolve_device

    return str(resolve_device(config.device))


def _done(rows: list[dict], config: ParityStudyConfig, fmt: str, lr: float, seed: int) -> list[dict]:
    key = settings_key(run_settings(config, fmt, lr, seed))
    mine = [r for r in rows if r.get("run") == key]
    return mine if len(mine) == 2 + len(config.multiples) else []


def run_study(config: ParityStudyConfig, out: Path, command: str = "", report: bool = True,
              progress: bool = True, unit: str | None = None) -> pd.DataFrame | None:
    """Every run (grid on seed 0, then the other seeds at each format's chosen rate), tables, figures, report; torch
    on `config.threads` CPU threads meanwhile (the caller's number restored afterwards). With `unit` (a key of
    `units`): only that unit's run, its rows into its unit files; returns None."""

    config.check()
    with torch_threads(config.threads):
        return _run_study(config, out, command, report, progress, unit)


def unit_key(config: ParityStudyConfig, fmt: str, lr: float, seed: int) -> str:
    """The unit of a run: "FORMAT/lr LR" (a rate of the grid, on seed 0) or "FORMAT/seed S" (at the chosen rate)."""
    return f"{fmt}/lr {lr:g}" if seed == 0 else f"{fmt}/seed {seed}"


def units(config: ParityStudyConfig) -> list[Unit]:
    """One unit per run: each format's learning-rate grid on seed 0 (stage 1, one unit per rate), then each other
    seed at the format's chosen rate (stage 2)."""
    return [*(Unit(unit_key(config, f, lr, 0), 1) for f in config.formats for lr in config.lrs),
            *(Unit(unit_key(config, f, 0.0, s), 2) for f in config.formats for s in range(1, config.seeds))]


def _chosen(config: ParityStudyConfig, out: Path, fmt: str) -> float:
    """The learning rate the grid of `fmt` on seed 0 chose; ValueError naming a unit of it still to run."""
    rows = study_rows(out, "rows.jsonl")
    for lr in config.lrs:
        if not _done(rows, config, fmt, lr, 0):
            raise ValueError(f"format {fmt}'s seeds need the learning rate its grid chooses: run unit "
                             f"{unit_key(config, fmt, lr, 0)!r} first")
    return choose_lr(pd.DataFrame([r for lr in config.lrs for r in _done(rows, config, fmt, lr, 0)]))


def _run_study(config: ParityStudyConfig, out: Path, command: str, report: bool, progress: bool,
               unit: str | None) -> pd.DataFrame | None:
    from tqdm.auto import tqdm

    from ... import models

    start = time.time()
    index = unit_index(units(config), unit)
    tok = CharTokenizer.for_alphabets(*(make_task(config, f, config.longest).alphabet for f in config.formats))
    n_ctx = max(models.check_context(10**9, make_task(config, f, config.longest), tok.offset) for f in config.formats)
    for f in config.formats:  # every test sample fits, and every held-out set has inputs, checked before training
        models.check_context(n_ctx, make_task(config, f, config.longest), tok.offset)
        if config.protocol == "curves":
            curve_sets(config, f)  # draws the evaluation sets too
        else:
            eval_sets(config, f)
    out.mkdir(parents=True, exist_ok=True)
    writer = RowWriter(unit_file(out, "rows.jsonl", index))
    plan = [(f, lr, 0) for f in config.formats for lr in config.lrs]
    bar = tqdm(total=len(plan) + len(config.formats) * (config.seeds - 1), desc="parity study runs",
               disable=not progress or unit is not None)

    def do(fmt: str, lr: float, seed: int) -> None:
        bar.set_postfix_str(run_id(fmt, lr, seed))
        if unit in (None, unit_key(config, fmt, lr, seed)) and \
                not _done(study_rows(out, "rows.jsonl"), config, fmt, lr, seed):
            for row in train_and_evaluate(config, tok, n_ctx, Run(fmt, lr, seed), out, index):
                writer.write(row)
        bar.update(1)

    for fmt, lr, seed in plan:
        do(fmt, lr, seed)
    chosen = {}
    for fmt in config.formats:
        mine = unit in (unit_key(config, fmt, 0.0, s) for s in range(1, config.seeds))
        if unit is None or mine:
            chosen[fmt] = _chosen(config, out, fmt)
            for seed in range(1, config.seeds):
                do(fmt, chosen[fmt], seed)
    bar.close()
    if unit is not None:
        return None
    rows = pd.DataFrame([r for f in config.formats for lr in config.lrs for s in range(config.seeds)
                         for r in _done(study_rows(out, "rows.jsonl"), config, f, lr, s)])
    tables = write_tables(rows, chosen, config, out)
    write_figures(tables["summary"], config, out)
    if config.protocol == "curves":
        write_curve_figures(config, chosen, out)
    write_views(config, chosen, tok, out, n_ctx)
    wall = time.time() - start
    write_json(out / "run.json", {"command": command, "config": asdict(config), "chosen_lr": chosen,
                                  "wall_seconds": wall, "torch_threads": config.threads,
                                  **run_environment(device=_device(config))})
    write_json(out / "summary.json", {"study": "parity", "wall_seconds": round(wall, 1),
                                      "tables": {k: v.to_dict("records") for k, v in tables.items()}})
    if report:
        from ...report import write_report

        write_report(out, title="aspan study parity")
    return tables["summary"]


# ----------------------------------------------------------------------------------------------- outputs
def write_tables(
    rows: pd.DataFrame, chosen: dict[str, float], config: ParityStudyConfig, out: Path
) -> dict[str, pd.DataFrame]:
    """selection.csv (the grid on seed 0), results.csv (every test row of the chosen rates), summary.csv (mean, sd and
    95 % intervals: exact accuracy `intervals.seed_interval`, the union of t over seeds and Wilson with every seed's
    answers pooled; per-token t over seeds)."""

    sel = rows[(rows.split == "select") & (rows.seed == 0)]
    selection = sel.pivot_table(index=["format", "lr"], columns="which", values=["exact", "partial"]).reset_index()
    selection.columns = ["format", "lr", "exact_1x", "exact_select", "partial_1x", "partial_select"]
    selection["chosen"] = [chosen[f] == lr for f, lr in zip(selection.format, selection.lr)]
    test = rows[(rows.split == "test") & (rows.lr == rows.format.map(chosen))]
    by_curves = config.protocol == "curves"
    stops = ["stop_reason", "stop_step", "fit_curve_exact", "fitted"] if by_curves else []
    results = test[["format", "lr", "seed", "multiple", "bits", "exact", "partial", "n", "train_seconds", "final_loss",
                    *stops]]
    results = results.sort_values(["format", "multiple", "seed"]).reset_index(drop=True)
    summary = []
    for (fmt, m), g in results.groupby(["format", "multiple"], sort=False):
        (em, es), (pm, ps) = mean_sd(g.exact.tolist()), mean_sd(g.partial.tolist())
        elo, ehi = seed_interval(g.exact.tolist(), int(g.n.iloc[0]))
        plo, phi = t_interval(g.partial.tolist())
        row = {"format": fmt, "multiple": int(m), "bits": int(g.bits.iloc[0]), "lr": chosen[fmt], "seeds": len(g),
               "exact_mean": em, "exact_sd": es, "partial_mean": pm, "partial_sd": ps, "exact_lo": elo,
               "exact_hi": ehi, "partial_lo": plo, "partial_hi": phi,
               "exact": f"{100 * em:.1f} [{100 * elo:.1f}, {100 * ehi:.1f}]",
               "per_token": f"{100 * pm:.1f} [{100 * plo:.1f}, {100 * phi:.1f}]"}
        if by_curves:
            row["fit"] = "fit" if g.fitted.all() else "did not fit"
            if row["fit"] != "fit" and m > 1:  # no extrapolation claimed for a format that did not fit
                row |= {k: math.nan for k in ("exact_mean", "exact_sd", "partial_mean", "partial_sd", "exact_lo",
                                              "exact_hi", "partial_lo", "partial_hi")}
                row |= {"exact": "did not fit", "per_token": "did not fit"}
        summary.append(row)
    order = {f: i for i, f in enumerate(config.formats)}
    summary = pd.DataFrame(summary).sort_values(["format", "multiple"], key=lambda c: c.map(order) if c.name == "format"
                                                else c).reset_index(drop=True)
    tables = {"summary": summary, "selection": selection, "results": results}
    if by_curves:
        tables["convergence"] = convergence(results[results.multiple == 1], config)
    for name, df in tables.items():
        write_csv(out / f"{name}.csv", df)
    return tables


def rewrite_outputs(out: Path) -> dict[str, pd.DataFrame]:
    """Write the tables, summary.json and the accuracy figures of the finished study in `out` again from its
    rows.jsonl and run.json (its settings and chosen rates), training and evaluating nothing: a study's outputs
    redrawn by newer code. Rows count only when their key is the one those settings give (settings the run.json
    lacks take the values of the code that wrote it: no held-out split, sets drawn with replacement). run.json and
    the head figures stay."""
    import json

    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    known = {f.name for f in fields(ParityStudyConfig)}
    before = {"held_out_share": 0.0, "set_draw": "with_replacement"}  # what rows without these settings had
    config = ParityStudyConfig(**{**before, **{k: tuple(v) if isinstance(v, list) else v
                                               for k, v in run["config"].items() if k in known}})
    chosen = run["chosen_lr"]
    rows = read_rows(out / "rows.jsonl")
    mine = [r for f in config.formats for lr in config.lrs for s in range(config.seeds)
            for r in _done(rows, config, f, lr, s)]
    if not all(_done(rows, config, f, chosen[f], s) for f in config.formats for s in range(config.seeds)):
        raise ValueError(f"{out / 'rows.jsonl'}: not every run of the chosen rates has its rows; run the study")
    tables = write_tables(pd.DataFrame(mine), chosen, config, out)
    write_figures(tables["summary"], config, out)
    old = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    write_json(out / "summary.json", {**old, "tables": {k: v.to_dict("records") for k, v in tables.items()}})
    return tables


def convergence(runs: pd.DataFrame, config: ParityStudyConfig) -> pd.DataFrame:
    """Curves protocol, per format at its chosen rate: the stop reasons (e.g. "target 2, cap 1"), the mean stop step,
    the mean training-length exact on the curve set where the runs stopped, how many seeds fit, "fit" only when all
    did, and the mean steps to `fit_exact` (None unless every seed reached it)."""
    out = []
    for fmt, g in runs.groupby("format", sort=False):
        reasons = g.stop_reason.value_counts().sort_index()
        out.append({"format": fmt, "lr": g.lr.iloc[0], "seeds": len(g),
                    "stop_reason": ", ".join(f"{k} {n}" for k, n in reasons.items()),
                    "stop_step": g.stop_step.mean(), "fit_curve_exact": g.fit_curve_exact.mean(),
                    "n_fit": int(g.fitted.sum()), "fit": "fit" if g.fitted.all() else "did not fit",
                    "steps_to_target": g.stop_step.mean() if g.fitted.all() else None,
                    "target": config.fit_exact})
    return pd.DataFrame(out)


def write_figures(summary: pd.DataFrame, config: ParityStudyConfig, out: Path) -> None:
    """Exact and per-token accuracy against the input length, one line per format, the mean over seeds with its 95 %
    interval."""
    from ...viz.studies import parity_length_figure

    for col in ("exact", "partial"):
        fig = parity_length_figure(summary, col, config.train_length, config.seeds)
        save_figure(fig, out / "figures" / f"{col}_vs_length.json")


def write_curve_figures(config: ParityStudyConfig, chosen: dict[str, float], out: Path) -> None:
    """Curves protocol: per format, the learning curves (exact per curve set) of every seed at the chosen rate; and
    every format's mean curve on the training lengths on one figure (`curves_fit`)."""
    from ...viz.curves import learning_curves

    rows = pd.DataFrame(study_rows(out, CURVES_ROWS))
    for fmt in config.formats:
        mine = rows[(rows.format == fmt) & (rows.lr == chosen[fmt])]
        fig = learning_curves({f"seed {seed}": d for seed, d in mine.groupby("seed")},
                              title=f"{fmt}: exact accuracy on held-out sets while training (lr {chosen[fmt]:g}; "
                                    f"target {config.fit_exact:g} on {FIT_SET})")
        save_figure(fig, out / "figures" / f"curves_{fmt}.json")
    fit = rows[rows.bucket == FIT_SET]  # every format on one figure: mean over the seeds still training
    means = {fmt: fit[(fit.format == fmt) & (fit.lr == chosen[fmt])].groupby("step", as_index=False)["exact"].mean()
             .assign(bucket=f"1-{config.train_length} bits") for fmt in config.formats}
    fig = learning_curves(means, title=f"exact accuracy on held-out 1-{config.train_length} bit inputs while training "
                                       "(mean of the seeds still training)")
    save_figure(fig, out / "figures" / "curves_fit.json")


def _pattern(model, tok, sample, head: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """One head's [query, key] pattern on `sample` (BOS + text) and the sample's reference mask, as arrays."""
    import torch

    import hooks

    ids = torch.tensor([tok.prefix_ids() + tok.encode(sample.text)])
    a = hooks.capture(model, ids, [head])[head][0].float().cpu().numpy()
    return np.round(a, 3), sample.mask(tok.offset).numpy()


def first_failure(model, tok, samples, batch: int) -> tuple[Any, int] | None:
    """(sample, target index) of the first wrong scored character among `samples` (teacher-forced), or None."""
    from ...evaluation import evaluate

    rec = evaluate(model, tok, samples, attn=False, batch_size=batch).records
    wrong = rec[~rec.correct & ~rec.eos]
    if wrong.empty:
        return None
    first = wrong.iloc[0]
    return samples[int(first.sample_id)], int(first.target_index)


def write_views(config: ParityStudyConfig, chosen: dict[str, float], tok, out: Path, n_ctx: int) -> None:
    """Per format: the head reading the references most in distribution, drawn on an ID sample and at the failure.

    The drawn model is seed 0's at the chosen rate; when its checkpoint is gone (results committed without
    `models/`), that one run is trained again (same seed, same data: the rows already written are kept)."""
    import hooks

    from ... import models
    from ...batching import make_batch
    from ...viz import pattern_across_lengths

    rows = []
    for fmt in config.formats:
        path = out / "models" / run_id(fmt, chosen[fmt], 0)
        if not path.exists():
            train_and_evaluate(config, tok, n_ctx, Run(fmt, chosen[fmt], 0), out)
        model = models.load(path, device=_device(config)).model
        sets = eval_sets(config, fmt)
        ids = sets[("test", "1")][: config.eval_batch_size]
        b = make_batch(ids, tok, n_ctx=model.cfg.n_ctx)
        scores = hooks.head_scores(model, b.tokens, b.ref_mask, reduce="row", attention_mask=b.attention_mask)
        head = tuple(int(i) for i in np.unravel_index(int(scores.argmax()), tuple(scores.shape)))
        fail, where = None, None
        for m in sorted(config.multiples):
            found = first_failure(model, tok, sets[("test", str(m))], config.eval_batch_size)
            if found is not None:
                (fail, j), where = found, m
                break
        panels = [(f"{config.train_length} bits (ID)", *_pattern(model, tok, ids[0], head))]
        if fail is not None:
            a, mask = _pattern(model, tok, fail, head)
            q = tok.offset + fail.prompt_len - 1
            panels.append((f"{where}x: first error at target {j}", a[q:], mask[q:]))
        fig = pattern_across_lengths(panels, title=f"{fmt}: head L{head[0]}H{head[1]} (highest ID AttnScore)"
                                     + ("" if fail is not None else ", no error at any test length"))
        save_figure(fig, out / "figures" / f"head_{fmt}.json")
        rows.append({"format": fmt, "layer": head[0], "head": head[1], "id_attnscore": float(scores.max()),
                     "failure_multiple": where, "failure_target_index": j if fail is not None else None,
                     "failure_text": fail.text if fail is not None else None})
    write_csv(out / "heads.csv", pd.DataFrame(rows))


StudyConfig = ParityStudyConfig  # its former name


def run(config: ParityStudyConfig, out: Path, *, progress: bool = True, unit: str | None = None, command: str = "",
        report: bool = True) -> pd.DataFrame | None:
    """The parity study's runner (`Study`): `run_study` (`command`: the command line run.json records; `report`:
    write report.html too); returns the summary table."""
    return run_study(config, Path(out), command=command, report=report, progress=progress, unit=unit)


STUDY = Study("parity", ParityStudyConfig, run, units, ("rows.jsonl", CURVES_ROWS))
