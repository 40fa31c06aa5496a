"""`aspan study qk`: which attention parameters must change for a model to work at longer lengths?

The later abstract of "Attend or Perish" (Spiegel et al., ICLR 2026 submission) claims that fine-tuning a single
column of the query and key projections in every head, on sequences longer than those seen in training, makes the
model perform well at those lengths (and not beyond), and blames fast-rotating RoPE dimensions. This study tests the
claim on a trained checkpoint (the shipped reversal model by default): it fine-tunes on the lengths of
`finetune` (11-20) under each condition (no training, everything, all attention weights, all of W_Q and W_K,
each RoPE rotation pair, a set of single columns), with and without a replay share of the ID preset, at an equal
step budget (protocol "budget"), or each run until its learning curve on the fine-tuned lengths plateaus or a cap
(protocol "curves"). With a `base` table the model is first trained here from scratch (`BaseSpec`). The learning
rate of every (condition, replay) is chosen from a small grid on a selection set (seed 0, per-token accuracy on
held-out strings of the fine-tuned lengths), then every seed is trained at that rate and reported on other
held-out samples of every length bucket (training lengths, fine-tuned lengths, beyond).

Outputs (RUN_DIR): `runs.jsonl` (one row per training run, keyed by its settings, so a killed study resumes),
`table.csv` (per condition and replay: trainable parameters, the learning-rate grid tried and the chosen rate, mean,
sd and 95 % intervals over seeds of exact and per-token accuracy per bucket, ID cost), `selection.csv`,
`summary.json` (the findings), `figures/` (accuracy by bucket per condition; exact and per-token accuracy against the
rotation frequency of the trained pair or of a single column's pair) and `report.html`; with the
curves protocol also `learning_curves.jsonl` (one row per run, step and bucket), the stop and fit columns of
`table.csv` and a learning-curve figure per condition; with a base, `base/` (its checkpoint and `base.json`).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ... import tasks
from ...buckets import Bucket, bucket_name, bucket_sets, parse_buckets
from ...curves import steps_to_target
from ...environment import run_environment
from ...intervals import pooled_wilson, seed_interval, t_interval
from ...io import RowWriter, RunDir, read_rows, settings_key, write_json
from ...models.tiny import POSITIONAL
from ...options import CURVE_METRICS, check_option
from ...tokenization import CharTokenizer, check_tokenizer


@dataclass
class QKStudyConfig:
    """Settings of one study; every field that changes a result is part of each row's key."""

    init: str = "reversal"  # checkpoint to fine-tune: a shipped name, a directory or a .gguf file
    task: str = "reversal"  # task whose `length` parameter the buckets set
    finetune: Bucket = (11, 20)  # lengths of the fine-tuning stream (the selection set uses the same)
    buckets: tuple[Bucket, ...] = ((1, 10), (11, 20), (21, 30))  # report buckets: training, fine-tuned, beyond
    steps: int = 50  # optimiser steps per run (the same for every condition)
    batch_size: int = 16
    warmup: int = 5  # linear warm-up steps, then cosine decay to 0.1 lr
    weight_decay: float = 0.1  # AdamW decoupled decay (frozen entries are restored after every step)
    seeds: tuple[int, ...] = (0, 1, 2)  # data-order seeds; seed 0 also runs the learning-rate grid
    replays: tuple[float, ...] = (0.0, 0.5)  # share of every batch drawn from the ID preset
    replay_conditions: tuple[str, ...] | None = ("all", "qk-pair:0")  # also run with replay; None or "*": all
    columns: tuple[int, ...] = (0,)  # single qk columns to try
    pairs: tuple[int, ...] | None = None  # rotary pairs to try; None: every pair of the model
    lr_large: tuple[float, ...] = (1e-3, 3e-3)  # learning-rate grid for `all` and `attn`
    lr_qk: tuple[float, ...] = (3e-3, 1e-2)  # for `qk`
    lr_small: tuple[float, ...] = (3e-3, 1e-2)  # for pairs and single columns
    lr_extend: int = 0  # rates a grid may add past each edge while its best rate sits there (0: the grid as given)
    n_select: int = 64  # selection samples (lengths `finetune`)
    n_report: int = 50  # report samples per bucket
    select_seed: int = 1_000_003  # seeds of the held-out sets (training batches use seeds with bit 62 set)
    report_seed: int = 2_000_003
    eval_batch_size: int = 100
    # protocol "budget": every run trains `steps` steps; "curves": every run trains until its stop rule (`stop`)
    # fires on the learning curve of the fine-tuned lengths, or `cap` steps (one schedule over `cap`), scored every
    # `curve_every` steps on `n_curve` held-out samples per bucket (seed `curve_seed`, apart from the selection and
    # report sets). Whatever stopped it, a run fits when its fine-tuned exact at its last evaluation reaches
    # `fit_exact`, and not otherwise: the label never depends on the rule
    protocol: str = "budget"
    cap: int = 3000
    curve_every: int = 100
    n_curve: int = 100
    curve_seed: int = 3_000_003
    fit_exact: float = 0.9
    stop_metric: str = "partial"  # what the plateau rule watches (per-token moves while exact still sits at 0)
    # "plateau": no gain of 1 pp on `stop_metric` over 3 evaluations (fires at once when that metric starts near
    # 1); "target": fine-tuned exact reaches `fit_exact`; "none": every run trains to the cap
    stop: str = "plateau"
    # the model's training lengths (replay and ID cost) when it is loaded from `init`; None: the task's ID preset
    # (with a `base`, the base's lengths)
    id_length: Bucket | None = None
    # a model to fine-tune trained here first, from scratch, instead of loading `init` (keys of `BaseSpec`, e.g.
    # the shape of the paper's public model); {}: load `init`
    base: dict = field(default_factory=dict)
    device: str = "cpu"  # where the models train: cpu, cuda, cuda:N (run.json records it)

    @classmethod
    def quick(cls, **kw: Any) -> "QKStudyConfig":
        """A complete study in well under a minute (for tests): few conditions, steps and samples."""
        base = dict(steps=3, batch_size=4, warmup=0, seeds=(0, 1), columns=(0,), pairs=(0,), lr_large=(1e-3,),
                    lr_qk=(1e-3,), lr_small=(1e-3, 1e-2), n_select=6, n_report=6,
                    replay_conditions=("all", "qk-pair:0"), cap=8, curve_every=2, n_curve=6)
        return cls(**{**base, **kw})

    @classmethod
    def curves(cls, quick: bool = False, **kw: Any) -> "QKStudyConfig":
        """The curves protocol's defaults (`--protocol curves`): 3-point learning-rate grids around the budget
        protocol's; with `quick`, the tiny settings of the tests."""
        if quick:
            return cls.quick(**{"protocol": "curves", **kw})
        base = dict(protocol="curves", lr_large=(3e-4, 1e-3, 3e-3), lr_qk=(1e-3, 3e-3, 1e-2),
                    lr_small=(3e-3, 1e-2, 3e-2))
        return cls(**{**base, **kw})

    def check(self) -> None:
        """ValueError on impossible settings, before the model is loaded."""
        parse_buckets([self.finetune])
        parse_buckets(list(self.buckets))
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        for name in ("steps", "batch_size", "n_select", "n_report", "cap", "curve_every", "n_curve"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and non-empty, got {self.seeds}")
        for r in self.replays:
            if not 0 <= r < 1:
                raise ValueError(f"replay shares must be in [0, 1), got {r}")
        if not 0 < self.fit_exact <= 1:
            raise ValueError(f"fit_exact must be in (0, 1], got {self.fit_exact}")
        check_option("stop_metric", self.stop_metric, CURVE_METRICS)
        check_option("stop", self.stop, STOPS)
        if self.id_length is not None:
            if self.base:
                raise ValueError("id_length is for a model loaded from `init`; with a base, set base.length")
            try:
                parse_buckets([self.id_length])
            except ValueError as e:
                raise ValueError(f"id_length: {str(e).removeprefix('--buckets: ')}") from None
        if self.base:
            base_spec(self)
        if isinstance(self.lr_extend, bool) or not isinstance(self.lr_extend, int) or self.lr_extend < 0:
            raise ValueError(f"lr_extend must be an int >= 0, got {self.lr_extend!r}")
        for grid in (self.lr_large, self.lr_qk, self.lr_small):
            if not grid or any(not lr > 0 for lr in grid):
                raise ValueError(f"learning-rate grids must be non-empty and positive, got {grid}")


@dataclass(frozen=True)
class BaseSpec:
    """The model `base` trains from scratch before the study (its checkpoint: RUN_DIR/base): a tiny model of this
    shape on the task's lengths `length`, until exact on held-out samples of those lengths reaches `fit_exact`
    (the target stop rule, checked every `curve_every` steps) or `cap` steps. Its lengths are the study's ID
    lengths (replay and `id_cost`)."""

    n_layers: int = 4
    n_heads: int = 1
    d_model: int = 256
    positional: str = "rotary"
    length: tuple[int, int] = (1, 20)
    cap: int = 20_000
    batch_size: int = 64
    lr: float = 1e-3
    warmup: int = 200
    fit_exact: float = 0.99
    curve_every: int = 250
    n_curve: int = 200
    seed: int = 0


def base_spec(cfg: "QKStudyConfig") -> BaseSpec:
    """The checked `BaseSpec` of `cfg.base`; ValueError naming an unknown key or a bad value."""
    from dataclasses import fields

    known = {f.name for f in fields(BaseSpec)}
    unknown = sorted(set(cfg.base) - known)
    if unknown:
        raise ValueError(f"base: unknown key {unknown[0]!r} (keys: {', '.join(sorted(known))})")
    spec = BaseSpec(**{k: tuple(v) if k == "length" else v for k, v in cfg.base.items()})
    parse_buckets([spec.length])
    for name in ("n_layers", "n_heads", "d_model", "cap", "batch_size", "curve_every", "n_curve"):
        if isinstance(getattr(spec, name), bool) or not isinstance(getattr(spec, name), int) or getattr(spec, name) < 1:
            raise ValueError(f"base.{name} must be an int >= 1, got {getattr(spec, name)!r}")
    if spec.positional not in POSITIONAL:
        raise ValueError(f"base.positional must be one of {', '.join(POSITIONAL)}, got {spec.positional!r}")
    if not spec.lr > 0 or not 0 < spec.fit_exact <= 1:
        raise ValueError(f"base.lr must be > 0 and base.fit_exact in (0, 1], got {spec.lr}, {spec.fit_exact}")
    return spec


PROTOCOLS = ("budget", "curves")
STOPS = ("plateau", "target", "none")  # the curves protocol's stop rules (`QKStudyConfig.stop`)
CURVES_ROWS = "learning_curves.jsonl"  # the curves protocol's learning curves: one row per (run, step, bucket)


@dataclass(frozen=True)
class Condition:
    """What trains: a `--train-only` value (None: everything) and the grid its learning rate is chosen from."""

    name: str  # "none", "all", "attn", "qk", "qk-pair:I" or "qk-column:C"
    train_only: str | None  # the parameter groups (aspan.param_groups); None with name "all"
    lrs: tuple[float, ...]  # learning-rate grid (empty for "none")
    pair: int | None = None  # the rotary pair the condition trains or belongs to (pairs and columns)
    frequency: float | None = None  # that pair's rotation frequency base^(-2i/rotary_dim), rad per position
    extend: int = 0  # rates the grid may add past each edge while its best rate sits there (`lr_grid`)


def conditions(cfg: QKStudyConfig, model) -> list[Condition]:
    """The study's conditions for a model of either backend (pairs default to every rotary pair; indices are
    range-checked)."""
    from ...param_groups import pair_columns, pair_frequency, rotary_of

    half = rotary_of(model).dim // 2
    pairs = range(half) if cfg.pairs is None else cfg.pairs
    ext = cfg.lr_extend
    out = [Condition("none", None, ()), Condition("all", None, cfg.lr_large, extend=ext),
           Condition("attn", "attn", cfg.lr_large, extend=ext), Condition("qk", "qk", cfg.lr_qk, extend=ext)]
    for i in pairs:
        pair_columns(model, i)
        out.append(Condition(f"qk-pair:{i}", f"qk-pair:{i}", cfg.lr_small, i, pair_frequency(model, i), ext))
    d_head = model.cfg.d_head
    for c in cfg.columns:
        if not 0 <= c < d_head:
            raise ValueError(f"column {c} out of range: d_head is {d_head}")
        i = next((i for i in range(half) if c in pair_columns(model, i)), None)
        freq = None if i is None else pair_frequency(model, i)
        out.append(Condition(f"qk-column:{c}", f"qk-column:{c}", cfg.lr_small, i, freq, ext))
    return out


@dataclass
class Setup:
    """The loaded model (and its initial weights), the data and the held-out sets one study run shares."""

    cfg: QKStudyConfig
    model: Any
    tokenizer: Any
    base: dict  # initial state dict, restored before every run
    finetune_task: Any
    id_task: Any
    select: list  # selection samples (lengths cfg.finetune)
    report: dict[str, list]  # report samples per bucket name
    conds: list[Condition] = field(default_factory=list)
    curves: dict[str, list] = field(default_factory=dict)  # curve sets per bucket name (curves protocol)
    out: Path | None = None  # the run directory: each run trains in its scratch/KEY there (resumable), if given


def setup(cfg: QKStudyConfig, device: str = "cpu", out: Path | None = None) -> Setup:
    """Load the checkpoint (with `base`: train it into `out`/base first), build the fine-tuning task and the
    selection and report sets (disjoint seeds)."""
    from ... import models

    cfg.check()
    if cfg.base:
        if out is None:
            raise ValueError("a study with a base trains it into its run directory: give one")
        model, tokenizer, _ = base_model(cfg, Path(out) / "base", device)
    else:
        model, tokenizer, _ = models.load(cfg.init, device=device)
    ft_task = tasks.preset(cfg.task, "id", length=cfg.finetune)
    id_length = base_spec(cfg).length if cfg.base else cfg.id_length
    id_task = tasks.preset(cfg.task, "id", **({"length": tuple(id_length)} if id_length else {}))
    report = bucket_sets(id_task, cfg.buckets, cfg.n_report, cfg.report_seed)
    for t in (ft_task, id_task, *(tasks.preset(cfg.task, "id", length=b) for b in cfg.buckets)):
        check_tokenizer(tokenizer, t.alphabet)
        models.check_context(model, t, tokenizer.offset)
    select = ft_task.generate(cfg.n_select, seed=cfg.select_seed)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    curves = bucket_sets(id_task, curve_buckets(cfg), cfg.n_curve, cfg.curve_seed) if cfg.protocol == "curves" else {}
    return Setup(cfg, model, tokenizer, base, ft_task, id_task, select, report, conditions(cfg, model), curves,
                 None if out is None else Path(out))


BASE_RECORD = "base.json"  # in RUN_DIR/base: the base's settings, where and why its training stopped, its fit


def base_training_dir(path: Path) -> Path:
    """Where the base model at `path` trains (log, curves, checkpoints every `curve_every` steps) until it is done."""
    return path.with_name(path.name + "-training")


def base_model(cfg: QKStudyConfig, path: Path, device: str):
    """The study's base model from `path`, trained there first (from scratch, `BaseSpec`) unless its record exists:
    a tiny model whose context holds the longest bucket, trained on the task at the base's lengths until exact on
    held-out samples of them reaches the base's `fit_exact`, or its cap."""
    from ... import models
    from ...training import TrainConfig, latest_checkpoint, train

    spec = base_spec(cfg)
    if not (path / BASE_RECORD).exists():
        task = tasks.preset(cfg.task, "id", length=spec.length)
        longest = max(spec.length[1], cfg.finetune[1], *(b[1] for b in cfg.buckets))
        tok = CharTokenizer.for_alphabets(task.alphabet)
        n_ctx = models.check_context(10**9, tasks.preset(cfg.task, "id", length=(1, longest)), tok.offset)
        model = models.tiny(tok, n_layers=spec.n_layers, n_heads=spec.n_heads, d_model=spec.d_model, n_ctx=n_ctx,
                            seed=spec.seed, device=device, positional=spec.positional)
        config = TrainConfig.scratch(steps=spec.cap, batch_size=spec.batch_size, lr=spec.lr, warmup=spec.warmup,
                                     seed=spec.seed, device=device, log_every=max(1, spec.cap // 20),
                                     curve_every=spec.curve_every, stop="target", stop_bucket="id",
                                     target=spec.fit_exact, ckpt_every=spec.curve_every)
        held_out = task.generate(spec.n_curve, seed=cfg.curve_seed + 1)  # apart from every set of the study
        work = base_training_dir(path)  # checkpointed as it trains: a study stopped mid-base resumes it exactly
        result = train(model, tok, task, config, out_dir=work, resume=latest_checkpoint(work) is not None,
                       progress=False, curve_data={"id": held_out})
        exact = [r["exact"] for r in result.history if r.get("kind") == "curve"][-1]
        models.save(model, path, tok, task=cfg.task, study="qk base")
        write_json(path / BASE_RECORD, {"base": asdict(spec), "stop": result.stop, "id_exact": exact,
                                        "fitted": exact >= spec.fit_exact})
    return models.load(path, device=device)


def curve_buckets(cfg: QKStudyConfig) -> list[Bucket]:
    """The buckets the curves protocol scores as it trains: the report buckets, with the fine-tuned one added."""
    return list(cfg.buckets) + ([] if tuple(cfg.finetune) in map(tuple, cfg.buckets) else [cfg.finetune])


# ----------------------------------------------------------------------------------------------- one run
def run_settings(s: Setup, cond: Condition, replay: float, lr: float | None, seed: int | None) -> dict:
    """Everything that determines one row (its key is a hash of this)."""
    c = s.cfg
    return {"study": "qk", "init": c.init, "task": c.task, "finetune": list(c.finetune), "condition": cond.name,
            "train_only": cond.train_only, "replay": replay, "lr": lr, "seed": seed, "steps": c.steps,
            "batch_size": c.batch_size, "warmup": c.warmup, "weight_decay": c.weight_decay,
            "select": [c.n_select, c.select_seed], "report": [[list(b) for b in c.buckets], c.n_report, c.report_seed],
            **(_curve_settings(c) if c.protocol == "curves" else {}),
            **({"base": asdict(base_spec(c))} if c.base else {}),
            **({"id_length": list(c.id_length)} if c.id_length is not None else {})}


def _curve_settings(c: QKStudyConfig) -> dict:
    """The curves protocol's part of a row's key (the budget protocol's keys stay those of before it existed)."""
    rule = {} if c.stop == "plateau" else {"stop": c.stop, **({"target": c.fit_exact} if c.stop == "target" else {})}
    return {"protocol": "curves", "steps": c.cap, "curve_every": c.curve_every, "stop_metric": c.stop_metric,
            "curve": [[list(b) for b in curve_buckets(c)], c.n_curve, c.curve_seed], **rule}


def _scores(s: Setup) -> dict[str, float]:
    """Exact and per-token accuracy on the selection set and on every report bucket (flat keys)."""
    from ...evaluation import evaluate

    out: dict[str, float] = {}
    for name, samples in {"select": s.select, **s.report}.items():
        summ = evaluate(s.model, s.tokenizer, samples, batch_size=s.cfg.eval_batch_size, attn=False).summary()
        tag = name.removeprefix("length ")
        out[f"exact_{tag}"], out[f"partial_{tag}"] = summ["exact"], summ["partial"]
    return out


def train_one(s: Setup, settings: dict) -> tuple[dict, list[dict]]:
    """Reset the model to its initial weights, fine-tune under `settings` (unless the condition is none), score it.
    Returns the run's row and (curves protocol) its learning-curve rows, each keyed by the run, step and bucket;
    the row records where and why the run stopped (cap or plateau)."""
    import torch

    from ...param_groups import trainable_count
    from ...training import Replay, TrainConfig, train, train_resumable

    with torch.no_grad():
        s.model.load_state_dict(s.base)
    t0 = time.perf_counter()
    n_train, n_all = trainable_count(s.model, settings["train_only"])
    curves, stop = [], {}
    if settings["condition"] == "none":
        n_train = 0
    else:
        data = Replay(s.finetune_task, s.id_task, settings["replay"]) if settings["replay"] else s.finetune_task
        by_curves = settings.get("protocol") == "curves"
        config = TrainConfig.scratch(steps=settings["steps"], batch_size=settings["batch_size"], lr=settings["lr"],
                                     warmup=settings["warmup"], weight_decay=settings["weight_decay"],
                                     seed=settings["seed"], train_only=settings["train_only"],
                                     device=str(s.model.cfg.device), log_every=max(1, settings["steps"]),
                                     curve_every=settings["curve_every"] if by_curves else 0,
                                     stop=settings.get("stop", "plateau") if by_curves else "none",
                                     target=settings.get("target"), stop_bucket=bucket_name(s.cfg.finetune),
                                     stop_metric="exact" if settings.get("stop") == "target"
                                     else settings.get("stop_metric", "exact"))
        options = dict(progress=False, curve_data=s.curves if by_curves else None)
        if s.out is None:
            result = train(s.model, s.tokenizer, data, config, **options)
        else:  # a run paused by a time budget (aspan.training.time_budget) continues from its checkpoint
            result = train_resumable(s.out / "scratch" / settings["key"], s.model, s.tokenizer, data, config,
                                     **options)
        curves = [r for r in result.history if r.get("kind") == "curve"]
        if by_curves:
            stop = {"stop_reason": result.stop["reason"], "stop_step": result.stop["step"]}
    train_s = time.perf_counter() - t0
    row = {**settings, "trainable": n_train, "total": n_all, "fraction": n_train / n_all, **stop, **_scores(s),
           "train_s": train_s, "wall_s": time.perf_counter() - t0}
    keyed = [{"key": f"{settings['key']}/{r['step']}/{r['bucket']}", "run": settings["key"],
              **{k: settings[k] for k in ("condition", "replay", "lr", "seed")},
              **{k: r[k] for k in ("step", "bucket", "n", "exact", "partial", "loss")}} for r in curves]
    return row, keyed


# ----------------------------------------------------------------------------------------------- the study
def lr_grid(rows: list[dict], cond: Condition, replay: float, seed: int) -> tuple[tuple[float, ...], float | None]:
    """(the grid tried so far, its chosen rate or None while a rate of it is still to run). The grid starts as the
    condition's; while the best rate sits at an edge and fewer than `cond.extend` rates were added on that side, the
    next rate past that edge (the grid's own ratio) joins it, so a finished grid brackets its optimum unless the
    extension budget ran out (`lr_edge` in the table says so)."""
    if not cond.lrs:
        return (), None
    got = {r["lr"]: r for r in rows if r["condition"] == cond.name and r["replay"] == replay and r["seed"] == seed}
    grid = tuple(sorted(cond.lrs))
    while True:
        if any(lr not in got for lr in grid):
            return grid, None
        best = max(grid, key=lambda lr: (got[lr]["partial_select"], got[lr]["exact_select"], -lr))
        ratio = (grid[-1] / grid[0]) ** (1 / (len(grid) - 1)) if len(grid) > 1 else 1.0
        low, high = grid.index(min(cond.lrs)), len(grid) - 1 - grid.index(max(cond.lrs))
        if best == grid[0] and len(grid) > 1 and low < cond.extend:
            grid = (_past(grid[0], 1 / ratio), *grid)
        elif best == grid[-1] and len(grid) > 1 and high < cond.extend:
            grid = (*grid, _past(grid[-1], ratio))
        else:
            return grid, best


def _past(edge: float, ratio: float) -> float:
    """The rate one grid step (`ratio`) past `edge`, put on the 1-3-10 ladder (3e-4 below 1e-3 in a half-decade
    grid, not 3.16e-4) unless that would not move it."""
    import math

    raw = edge * ratio
    k = math.floor(math.log10(raw))
    snapped = min((m * 10.0 ** e for e in (k - 1, k, k + 1) for m in (1, 3)),
                  key=lambda v: abs(math.log10(v) - math.log10(raw)))
    snapped = float(f"{snapped:.3g}")
    return snapped if (snapped - edge) * (ratio - 1) > 0 else float(f"{raw:.3g}")


def _select_lr(rows: list[dict], cond: Condition, replay: float, seed: int) -> float | None:
    """The grid's learning rate with the best selection-set per-token accuracy at `seed` (the first seed; ties:
    exact, then the smaller rate; the grid extended past an edge as `lr_grid` says); None for the untrained
    condition or while the grid is incomplete."""
    return lr_grid(rows, cond, replay, seed)[1]


def lr_edge(rows: list[dict], cond: Condition, replay: float, seed: int) -> str:
    """"bottom" or "top" when the chosen rate is still at that edge of its (extended) grid, else ""."""
    grid, chosen = lr_grid(rows, cond, replay, seed)
    if chosen is None or len(grid) < 2:
        return ""
    return "bottom" if chosen == grid[0] else "top" if chosen == grid[-1] else ""


def plan(s: Setup, rows: list[dict]) -> list[dict]:
    """Settings still to run, given the rows so far, for the first replay share not finished yet: its grid at seed 0,
    then (once the grid is complete) the other seeds at the chosen rate. A resumed study continues exactly."""
    have = {r["key"] for r in rows}
    for replay in s.cfg.replays:
        todo = []
        for cond in s.conds:
            if not cond.lrs:
                todo.append(run_settings(s, cond, 0.0, None, None))
            elif replay == 0 or s.cfg.replay_conditions is None or {"*", cond.name} & set(s.cfg.replay_conditions):
                grid, lr = lr_grid(rows, cond, replay, s.cfg.seeds[0])
                todo += [run_settings(s, cond, replay, rate, s.cfg.seeds[0]) for rate in grid]
                todo += [run_settings(s, cond, replay, lr, seed) for seed in s.cfg.seeds[1:]] if lr else []
        todo = [{**st, "key": k} for st in todo if (k := settings_key(st)) not in have]
        if todo:
            return list({t["key"]: t for t in todo}.values())
    return []


# What every row of runs.jsonl holds for planning and selection (a row lacking one is refused, naming its line).
RUN_FIELDS = ("key", "condition", "replay", "seed", "lr")
CURVE_FIELDS = ("key", "run", "step", "bucket", "exact")


def run_study(cfg: QKStudyConfig, out_dir: str | Path, progress: bool = True, device: str = "cpu") -> "StudyResult":
    """Run (or resume) the study into `out_dir`; returns the rows and the aggregated table."""
    from tqdm.auto import tqdm

    out = Path(out_dir)
    writer = RowWriter(out / "runs.jsonl", RUN_FIELDS, "qk study")  # a corrupt file is refused before any work
    curve_writer = RowWriter(out / CURVES_ROWS, CURVE_FIELDS, "qk study learning-curve")
    s = setup(cfg, device, out)
    t0 = time.perf_counter()
    bar = tqdm(desc="qk study", unit="run", disable=not progress, dynamic_ncols=True)
    while todo := plan(s, read_rows(out / "runs.jsonl", RUN_FIELDS, "qk study")):
        bar.total = bar.n + len(todo)
        for settings in todo:  # the grid runs first; the seeds at the chosen rate are planned once it is complete
            row, curve_rows = train_one(s, settings)
            for r in curve_rows:  # before the run's row: a run is done (never retrained) once its row is written
                curve_writer.write(r)
            writer.write(row)
            bar.update(1)
    bar.close()
    rows = read_rows(out / "runs.jsonl", RUN_FIELDS, "qk study")
    curves = read_rows(out / CURVES_ROWS, CURVE_FIELDS, "qk study learning-curve")
    return StudyResult(rows, aggregate(s, rows, curves), selection_table(s, rows), time.perf_counter() - t0, curves)


@dataclass
class StudyResult:
    """What the Q/K study returns: its rows, its tables, its wall time and its learning-curve rows."""
    rows: list[dict]  # one per training run (and one for the untrained model)
    table: Any  # pandas DataFrame: one row per (condition, replay)
    selection: Any  # pandas DataFrame: the learning-rate grid on the selection set
    wall_s: float  # wall time of this invocation
    curves: list[dict] = field(default_factory=list)  # learning-curve rows (curves protocol)
    summary: dict = field(default_factory=dict)  # summary.json as `write_outputs` wrote it


def selection_table(s: Setup, rows: list[dict]):
    """The grid at seed 0 on the selection set, with the chosen rate marked."""
    import pandas as pd

    out = []
    for replay in s.cfg.replays:
        for cond in s.conds:
            chosen = _select_lr(rows, cond, replay, s.cfg.seeds[0])
            for r in rows:
                if r["condition"] == cond.name and r["replay"] == replay and r["seed"] == s.cfg.seeds[0]:
                    out.append({"condition": cond.name, "replay": replay, "lr": r["lr"], "chosen": r["lr"] == chosen,
                                "partial_select": r["partial_select"], "exact_select": r["exact_select"]})
    return pd.DataFrame(out)


def aggregate(s: Setup, rows: list[dict], curves: list[dict] = ()):
    """One row per (condition, replay): chosen rate, trainable parameters, mean and sd over seeds per bucket; under
    the curves protocol also where and why the runs stopped, their fit and steps to targets (`curve_columns`)."""
    import pandas as pd

    names = [bucket_name(b).removeprefix("length ") for b in s.cfg.buckets]
    none = [r for r in rows if r["condition"] == "none"]
    base_id = none[0][f"exact_{names[0]}"] if none else float("nan")
    out = []
    for replay in s.cfg.replays:
        for cond in s.conds:
            lr = _select_lr(rows, cond, replay, s.cfg.seeds[0])
            runs = none if not cond.lrs else [r for r in rows if r["condition"] == cond.name
                                               and r["replay"] == replay and r["lr"] == lr and lr is not None]
            if not runs:
                continue
            grid = lr_grid(rows, cond, replay, s.cfg.seeds[0])[0]
            row = {"condition": cond.name, "replay": replay if cond.lrs else None, "lr": lr, "pair": cond.pair,
                   "lr_grid": " ".join(f"{g:g}" for g in grid), "lr_edge": lr_edge(rows, cond, replay, s.cfg.seeds[0]),
                   "frequency": cond.frequency, "trainable": runs[0]["trainable"], "fraction": runs[0]["fraction"],
                   "n_seeds": len(runs) if cond.lrs else 0}
            for name in names:
                row |= bucket_columns([r[f"exact_{name}"] for r in runs], [r[f"partial_{name}"] for r in runs],
                                      name, s.cfg.n_report)
            row["id_cost"] = base_id - row[f"exact_{names[0]}"]
            if s.cfg.protocol == "curves" and cond.lrs:
                row.update(curve_columns(s.cfg, runs, curves))
            out.append(row)
    table = pd.DataFrame(out).drop_duplicates(subset=["condition", "replay"])
    return within_full(s.cfg, table, curves) if s.cfg.protocol == "curves" and len(table) else table


def bucket_columns(exact: list[float], partial: list[float], name: str, n_report: int) -> dict:
    """One bucket's columns over the seeds of a condition: mean and sd of exact and per-token accuracy, their 95 %
    intervals (`_lo`, `_hi`: per-token the t-interval over seeds, NaN for one seed; exact `intervals.seed_interval`,
    the wider of that t-interval and the Wilson interval of every seed's `n_report` answers pooled) and the pooled
    Wilson interval alone (`exact_NAME_wilson_lo`, `_hi`)."""
    import statistics

    out: dict = {}
    for metric, vals in (("exact", exact), ("partial", partial)):
        out[f"{metric}_{name}"] = statistics.fmean(vals)
        out[f"{metric}_{name}_sd"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        out[f"{metric}_{name}_lo"], out[f"{metric}_{name}_hi"] = (
            seed_interval(vals, n_report) if metric == "exact" else t_interval(vals))
    out[f"exact_{name}_wilson_lo"], out[f"exact_{name}_wilson_hi"] = pooled_wilson(exact, n_report)
    return out


def _run_curves(curves: list[dict], key: str, bucket: str) -> list[dict]:
    return [r for r in curves if r["run"] == key and r["bucket"] == bucket]


def curve_columns(cfg: QKStudyConfig, runs: list[dict], curves: list[dict]) -> dict:
    """The curves protocol's columns of one (condition, replay): stop reasons (e.g. "plateau 2, cap 1") and mean stop
    step, the plateau (mean fine-tuned exact on the curve set at each run's last evaluation), how many seeds fit
    (reached `fit_exact` there) and "fit" only when all did, the mean steps to `fit_exact` (None unless every seed
    reached it). The label comes from that accuracy alone, whichever rule (plateau, target or cap) ended the run. A
    condition that did not fit claims nothing beyond its fine-tuned lengths: those columns are emptied."""
    from collections import Counter

    ft = bucket_name(cfg.finetune)
    finals = [max(_run_curves(curves, r["key"], ft), key=lambda c: c["step"])["exact"] for r in runs]
    reached = [steps_to_target(_run_curves(curves, r["key"], ft), ft, cfg.fit_exact) for r in runs]
    reasons = Counter(r["stop_reason"] for r in runs)
    n_fit = sum(v >= cfg.fit_exact for v in finals)
    out = {"stop_reason": ", ".join(f"{k} {n}" for k, n in sorted(reasons.items())),
           "stop_step": sum(r["stop_step"] for r in runs) / len(runs), "plateau_exact": sum(finals) / len(finals),
           "n_fit": n_fit, "fit": "fit" if n_fit == len(runs) else "did not fit",
           "steps_to_target": None if None in reached else sum(reached) / len(reached)}
    if out["fit"] != "fit":
        for b in cfg.buckets:
            if b[0] > cfg.finetune[1]:
                tag = bucket_name(b).removeprefix("length ")
                out |= {f"{m}_{tag}{sd}": float("nan") for m in ("exact", "partial")
                        for sd in ("", "_sd", "_lo", "_hi")}
                out |= {f"exact_{tag}_wilson_{end}": float("nan") for end in ("lo", "hi")}
    return out


def within_full(cfg: QKStudyConfig, table, curves: list[dict]):
    """`steps_to_full`: per (condition, replay), the mean steps to come within 5 pp of full fine-tuning's plateau at
    the same replay (fine-tuned exact on the curve set; None unless every seed got there)."""
    ft = bucket_name(cfg.finetune)
    table = table.copy()
    table["steps_to_full"] = None
    for i, row in table.iterrows():
        full = table[(table.condition == "all") & (table.replay == row.replay)]
        if row.condition == "none" or full.empty:
            continue
        target = float(full.iloc[0].plateau_exact) - 0.05
        keys = {c["run"] for c in curves if c["condition"] == row.condition and c["replay"] == row.replay
                and c["lr"] == row.lr}
        reached = [steps_to_target(_run_curves(curves, k, ft), ft, target) for k in sorted(keys)]
        if keys and None not in reached:
            table.at[i, "steps_to_full"] = sum(reached) / len(reached)
    return table


# ----------------------------------------------------------------------------------------------- findings
def findings(cfg: QKStudyConfig, table) -> dict:
    """Per replay share: full fine-tuning, the best single pair or column on the fine-tuned bucket and its gap, the
    smallest group within 5 pp of full fine-tuning (per metric; only where full fine-tuning gains >= 5 pp over the
    untrained model, else "within 5 pp" is vacuous), and how per-pair accuracy follows rotation frequency."""
    from scipy.stats import spearmanr

    ft, beyond = (bucket_name(b).removeprefix("length ") for b in (cfg.finetune, cfg.buckets[-1]))
    none = table[table.condition == "none"]
    out: dict[str, Any] = {"finetuned_bucket": ft, "beyond_bucket": beyond, "by_replay": {}}
    if not none.empty:
        out["baseline"] = _brief(none.iloc[0], ft, beyond)
    for replay in cfg.replays:
        t = table[(table.replay == replay)]
        full = t[t.condition == "all"]
        small = t[t.condition.str.startswith(("qk-pair", "qk-column"))]
        if full.empty or small.empty or none.empty:
            continue
        full = full.iloc[0]
        best = small.sort_values([f"exact_{ft}", f"partial_{ft}"], ascending=False).iloc[0]
        pairs = small[small.condition.str.startswith("qk-pair")]
        f = {"full": _brief(full, ft, beyond), "best_single": _brief(best, ft, beyond)}
        for metric in ("partial", "exact"):
            f[f"spearman_frequency_vs_{metric}"] = (spearmanr(pairs.frequency, pairs[f"{metric}_{ft}"]).statistic
                                                    if len(pairs) > 2 else float("nan"))
        for metric in ("exact", "partial"):
            col = f"{metric}_{ft}"
            gain = full[col] - none.iloc[0][col]
            close = t[t[col] >= full[col] - 0.05].sort_values("trainable")
            f[f"full_gain_{metric}_pp"] = 100 * gain
            f[f"gap_{metric}_pp"] = 100 * (full[col] - best[col])
            f[f"smallest_within_5pp_{metric}"] = _brief(close.iloc[0], ft, beyond) if gain >= 0.05 else None
        f["claim_met"] = bool(f["full_gain_exact_pp"] >= 5 and f["gap_exact_pp"] <= 5 and best.fraction <= 0.01)
        out["by_replay"][str(replay)] = f
    return out


def _brief(row, ft: str, beyond: str) -> dict:
    keys = ("condition", "trainable", "fraction", "lr", f"exact_{ft}", f"partial_{ft}", f"exact_{beyond}",
            f"partial_{beyond}", "id_cost", "fit", "stop_reason", "stop_step", "plateau_exact", "steps_to_target",
            "steps_to_full")
    return {k: row[k] for k in keys if k in row}


def headline_table(cfg: QKStudyConfig, table) -> str:
    """The study's table as text: each condition's exact and per-token accuracy per bucket (and, under the curves
    protocol, its fit, stop and steps-to-target columns)."""
    cols = ["condition", "replay", "trainable", "lr"] + [f"{m}_{bucket_name(b).removeprefix('length ')}"
                                                          for b in cfg.buckets for m in ("exact", "partial")]
    if cfg.protocol == "curves":
        cols += ["fit", "stop_reason", "stop_step", "plateau_exact", "steps_to_target", "steps_to_full"]
    return table[cols].to_string(index=False, float_format=lambda x: f"{x:.3g}")


def write_outputs(cfg: QKStudyConfig, res: StudyResult, out_dir: str | Path, command: str, device: str = "cpu") -> dict:
    """table.csv, selection.csv, summary.json, run.json, figures/ and report.html in `out_dir` (`device`: the one
    the study ran on)."""
    from ...report import write_report

    out = RunDir(out_dir)
    out.write_csv("table.csv", res.table)
    out.write_csv("selection.csv", res.selection)
    summary = {"findings": findings(cfg, res.table), "table": res.table.to_dict("records"), "runs": len(res.rows),
               "wall_s_this_invocation": res.wall_s, "train_s_total": sum(r["wall_s"] for r in res.rows)}
    if cfg.base:  # the model the study started from: where and why its training stopped, whether it fit
        summary["base"] = json.loads((Path(out_dir) / "base" / BASE_RECORD).read_text())
    out.write_json("summary.json", summary)
    out.write_json("run.json", {"command": command, "config": asdict(cfg), "selection_rule": SELECTION_RULE,
                                **run_environment(device=device)})
    for name, fig in {**figures(cfg, res.table), **curve_figures(cfg, res.table, res.curves)}.items():
        out.figure(fig, name)
    write_report(out.path, title="aspan study qk: which attention parameters must change for longer lengths")
    return summary


SELECTION_RULE = ("per (condition, replay): the learning rate of the grid with the highest per-token accuracy on "
                  "the selection set (held-out strings of the fine-tuned lengths, runs of the first seed; ties: "
                  "exact, then the smaller rate); every seed is then trained at that rate and reported on other "
                  "held-out samples of every bucket")


def _long(t, names: list[str], metric: str):
    """Rows (condition, bucket, frequency, metric, plus, minus) of the table `t`, one per condition and bucket:
    `plus`/`minus` reach the 95 % interval's ends (`bucket_columns`; a table written before the intervals existed
    falls back to ± sd)."""
    import pandas as pd

    def ends(r, n):
        lo, hi = f"{metric}_{n}_lo", f"{metric}_{n}_hi"
        if lo in r and r[lo] == r[lo]:
            return r[hi] - r[f"{metric}_{n}"], r[f"{metric}_{n}"] - r[lo]
        return r[f"{metric}_{n}_sd"], r[f"{metric}_{n}_sd"]

    return pd.DataFrame([{"condition": r.condition, "bucket": n, "frequency": r.frequency, metric: r[f"{metric}_{n}"],
                          **dict(zip(("plus", "minus"), ends(r, n)))} for _, r in t.iterrows() for n in names])


def figures(cfg: QKStudyConfig, table) -> dict:
    """Accuracy by bucket per condition (per replay share and metric) and exact and per-token accuracy against the
    rotation frequency of the trained pair (or of the pair a single column belongs to), with full fine-tuning as a
    dashed line; every error bar a 95 % interval (`bucket_columns`)."""
    from ... import viz

    names = [bucket_name(b).removeprefix("length ") for b in cfg.buckets]
    ft = bucket_name(cfg.finetune).removeprefix("length ")
    figs = {}
    for replay in cfg.replays:
        t = table[(table.replay == replay) | (table.condition == "none")]
        for metric in ("exact", "partial"):
            figs[f"by_bucket_{metric}_replay{replay:g}"] = viz.accuracy_by_bucket(
                _long(t, names, metric), y=metric, group="condition", error=("plus", "minus"),
                title=f"{metric} accuracy by length bucket (fine-tuned on {ft}, replay {replay:g}; 95 % intervals)")
        full = t[t.condition == "all"]
        for kind, prefix in (("pair", "qk-pair"), ("column", "qk-column")):
            rows = t[t.condition.str.startswith(prefix) & t.frequency.notna()]
            for metric, what in (("partial", "Per-token"), ("exact", "Exact")) if len(rows) else ():
                base = {} if full.empty else {f"full fine-tuning ({ft})": float(full.iloc[0][f"{metric}_{ft}"])}
                name = f"{kind}_frequency{'' if metric == 'partial' else '_exact'}_replay{replay:g}"
                figs[name] = viz.accuracy_vs_frequency(
                    _long(rows, names, metric), y=metric, error=("plus", "minus"), baselines=base,
                    title=f"{what} accuracy after training one RoPE {kind} vs its pair's rotation frequency "
                          f"(replay {replay:g}; 95 % intervals)")
    return figs


def curve_figures(cfg: QKStudyConfig, table, curves: list[dict]) -> dict:
    """Curves protocol: per (condition, replay), the learning curves (exact per bucket) of every seed at the chosen
    rate, one figure each (`viz.learning_curves`); per replay share, every condition's mean curve on the fine-tuned
    lengths, exact and per-token (`curves_finetuned_{exact,partial}_replayR`)."""
    import pandas as pd

    from ...viz.curves import learning_curves

    figs = {}
    rows = pd.DataFrame(curves)
    if rows.empty:
        return figs
    ft = bucket_name(cfg.finetune)
    means: dict[float, dict[str, pd.DataFrame]] = {}
    for _, t in table[table.condition != "none"].iterrows():
        mine = rows[(rows.condition == t.condition) & (rows.replay == t.replay) & (rows.lr == t.lr)]
        runs = {f"seed {seed}": d for seed, d in mine.groupby("seed")}
        if runs:
            figs[f"curves_{t.condition.replace(':', '')}_replay{t.replay:g}"] = learning_curves(
                runs, title=f"{t.condition}, replay {t.replay:g}, lr {t.lr:g}: exact accuracy on held-out buckets "
                            f"({t.get('fit', '')}; stopped: {t.get('stop_reason', '')})")
            on_ft = mine[mine.bucket == ft].groupby("step", as_index=False)[["exact", "partial"]].mean()
            means.setdefault(t.replay, {})[t.condition] = on_ft.assign(bucket=ft)
    for replay, by_condition in means.items():  # every condition on one figure: mean over the seeds still running
        for metric, what in (("exact", "exact"), ("partial", "per-token")):
            figs[f"curves_finetuned_{metric}_replay{replay:g}"] = learning_curves(
                by_condition, y=metric, title=f"{what}, held-out lengths {cfg.finetune[0]}-{cfg.finetune[1]}, "
                                              f"replay {replay:g} (mean of the seeds still training)")
    return figs


class QKStudy:
    """The qk study as a `Study` (`aspan.applications.studies`): `run` is `run_study` on `config.device`, then
    `write_outputs`."""

    name = "qk"
    config = QKStudyConfig

    def run(self, config: QKStudyConfig, out: str | Path, *, progress: bool = True, command: str = "") -> StudyResult:
        """Run or resume the study in `out` and write its outputs (`command`: the command line run.json records);
        the result carries summary.json."""
        result = run_study(config, out, progress=progress, device=config.device)  # checks `config` first
        result.summary = write_outputs(config, result, out, command, config.device)
        return result


STUDY = QKStudy()
