"""The settings of `aspan study qk` (`aspan.applications.studies.qk`): `QKStudyConfig`, the base model a study may
train first (`BaseSpec`), the conditions (which attention parameters train) it compares, and what one study run
shares (`Setup`: the model and the sets `qk.setup` builds from these settings)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...buckets import Bucket, parse_buckets
from ...models.tiny import POSITIONAL
from ...options import CURVE_METRICS, check_option


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
    # seeds of the held-out sets (training batches use seeds with bit 62 set); the report sets skip the texts of
    # the selection set (`qk.held_out_sets`)
    select_seed: int = 1_000_003
    report_seed: int = 2_000_003
    eval_batch_size: int = 100
    # protocol "budget": every run trains `steps` steps; "curves": every run trains until its stop rule (`stop`)
    # fires on the learning curve of the fine-tuned lengths, or `cap` steps (one schedule over `cap`), scored every
    # `curve_every` steps on `n_curve` held-out samples per bucket (seed `curve_seed`; the draw skips the texts of
    # the selection and report sets). Whatever stopped it, a run fits when its fine-tuned exact at its last
    # evaluation reaches `fit_exact`, and not otherwise: the label never depends on the rule
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
    def toml_fields(cls, raw: dict[str, Any], path: Any = None) -> dict[str, Any]:
        """The fields a `--config` file sets (`aspan.config.load_config`'s hook): its keys, less a `[slurm]` table
        (the resources of `--launcher slurm`, `aspan.applications.launch`)."""
        return {k: v for k, v in raw.items() if k != "slurm"}

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
        if not 0 <= self.weight_decay < math.inf:
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay}")
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
            if not grid or any(not 0 < lr < math.inf for lr in grid):
                raise ValueError(f"learning-rate grids must be non-empty, finite and positive, got {grid}")


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
