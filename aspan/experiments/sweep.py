"""Intervention sweeps (SPEC 6, paper Appendix F and Fig. 2): a TOML grid of reinforcement settings.

Every grid point (head selection x strength C x threshold tau x renormalisation x key offset delta x mode x seed)
is evaluated against a matched baseline (same samples, no intervention) and appended as one JSONL row keyed by
a hash of its settings: a killed run resumes where it stopped, and `shard=(i, n)` splits the grid for job arrays.
"""
from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import plotly.graph_objects as go

from .store import RowWriter, read_rows, settings_key

MODES = ("teacher", "generate")
RANK_BY = ("score_sum", "score_row")
TOP_KEYS = {
    "model", "task", "split", "task_params", "n_samples", "seeds", "batch_size", "mode", "strengths",
    "thresholds", "renormalize", "deltas", "delta", "device", "heads",
}
HEAD_KEYS = {"top", "fraction", "list", "by", "rank_samples", "rank_seed", "rank_delta", "rank_params"}
BUILTIN_MODELS = ("smollm2",)


@dataclass(frozen=True)
class SweepConfig:
    """A validated sweep: what to load, what to evaluate, and the grid of interventions."""

    model: str
    task: str
    strengths: tuple[float, ...]
    split: str = "ood"
    task_params: dict[str, Any] = field(default_factory=dict)
    n_samples: int = 100
    seeds: tuple[int, ...] = (0,)
    batch_size: int = 32
    modes: tuple[str, ...] = ("teacher",)
    thresholds: tuple[float | None, ...] = (None,)
    renormalize: tuple[bool, ...] = (False,)
    deltas: tuple[int, ...] = (0,)
    device: str | None = None
    top: tuple[int, ...] = ()
    fractions: tuple[float, ...] = ()
    explicit: tuple[tuple[int, int], ...] = ()
    rank_by: str = "score_sum"
    rank_samples: int = 64
    rank_seed: int = 10_000
    rank_delta: int | None = None  # None: rank at each grid point's own delta
    rank_params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_toml(cls, path: str | Path, check_model: bool = True) -> "SweepConfig":
        """Read and fully validate a TOML sweep config; ValueError naming the offending key."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"sweep config not found: {path}")
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: invalid TOML: {e}") from None
        model = raw.get("model")
        if isinstance(model, str) and model not in BUILTIN_MODELS and not Path(model).is_absolute():
            rel = path.parent / model  # a relative checkpoint path may be relative to the config file
            if not Path(model).exists() and rel.exists():
                raw = {**raw, "model": str(rel)}
        return cls.from_dict(raw, check_model=check_model)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], check_model: bool = True) -> "SweepConfig":
        """Validate a parsed config dict (see `configs/*.toml`); ValueError naming the offending key."""
        from .. import tasks

        unknown = sorted(set(raw) - TOP_KEYS)
        if unknown:
            raise ValueError(f"sweep config: unknown key {unknown[0]!r} (known: {', '.join(sorted(TOP_KEYS))})")
        for key in ("model", "task", "strengths"):
            if key not in raw:
                raise ValueError(f"sweep config: missing required key {key!r}")
        model = _str(raw["model"], "model")
        if check_model and model not in BUILTIN_MODELS and not Path(model).exists():
            raise ValueError(f"sweep config: model: checkpoint {model!r} does not exist")
        task = _str(raw["task"], "task")
        if task not in tasks.NAMES:
            raise ValueError(f"sweep config: task: unknown task {task!r}; choose one of {', '.join(tasks.NAMES)}")
        split = _str(raw.get("split", "ood"), "split")
        if split not in tasks.SPLITS:
            raise ValueError(f"sweep config: split: must be 'id' or 'ood', got {split!r}")
        task_params = _table(raw.get("task_params", {}), "task_params")
        try:
            tasks.preset(task, split, **task_params)
        except (TypeError, ValueError) as e:
            raise ValueError(f"sweep config: task_params: {e}") from None
        if "delta" in raw and "deltas" in raw:
            raise ValueError("sweep config: give either 'delta' or 'deltas', not both")
        deltas = _ints(raw.get("deltas", raw.get("delta", [0])), "deltas" if "deltas" in raw else "delta")
        thresholds = tuple(
            None if t == "none" else _number(t, "thresholds", minimum=0.0) for t in _list(raw.get("thresholds", ["none"]), "thresholds")
        )
        modes = tuple(_str(m, "mode") for m in _list(raw.get("mode", ["teacher"]), "mode"))
        for m in modes:
            if m not in MODES:
                raise ValueError(f"sweep config: mode: must be 'teacher' or 'generate', got {m!r}")
        renorm = _list(raw.get("renormalize", [False]), "renormalize")
        for r in renorm:
            if not isinstance(r, bool):
                raise ValueError(f"sweep config: renormalize: must be true/false, got {r!r}")
        device = raw.get("device")
        if device is not None:
            device = _str(device, "device")

        heads = _table(raw.get("heads", {}), "heads")
        unknown = sorted(set(heads) - HEAD_KEYS)
        if unknown:
            raise ValueError(f"sweep config: unknown key 'heads.{unknown[0]}' (known: {', '.join(sorted(HEAD_KEYS))})")
        top = _ints(heads.get("top", []), "heads.top", minimum=1)
        fractions = tuple(_number(f, "heads.fraction") for f in _list(heads.get("fraction", []), "heads.fraction"))
        for f in fractions:
            if not 0 < f <= 1:
                raise ValueError(f"sweep config: heads.fraction: must be in (0, 1], got {f}")
        explicit = _heads(heads.get("list", []))
        if not (top or fractions or explicit):
            raise ValueError("sweep config: heads: give at least one of heads.top, heads.fraction or heads.list")
        by = _str(heads.get("by", "score_sum"), "heads.by")
        if by not in RANK_BY:
            raise ValueError(f"sweep config: heads.by: must be one of {', '.join(RANK_BY)}, got {by!r}")
        rank_delta = heads.get("rank_delta", "same")
        rank_delta = None if rank_delta == "same" else _int(rank_delta, "heads.rank_delta")
        rank_params = _table(heads.get("rank_params", {}), "heads.rank_params")
        try:
            tasks.preset(task, "id", **rank_params)
        except (TypeError, ValueError) as e:
            raise ValueError(f"sweep config: heads.rank_params: {e}") from None

        return cls(
            model=model,
            task=task,
            strengths=tuple(_number(c, "strengths") for c in _nonempty(raw["strengths"], "strengths")),
            split=split,
            task_params=task_params,
            n_samples=_int(raw.get("n_samples", 100), "n_samples", minimum=1),
            seeds=_ints(raw.get("seeds", [0]), "seeds"),
            batch_size=_int(raw.get("batch_size", 32), "batch_size", minimum=1),
            modes=_dedup(modes),
            thresholds=_dedup(thresholds),
            renormalize=_dedup(tuple(renorm)),
            deltas=deltas,
            device=device,
            top=top,
            fractions=_dedup(fractions),
            explicit=explicit,
            rank_by=by,
            rank_samples=_int(heads.get("rank_samples", 64), "heads.rank_samples", minimum=1),
            rank_seed=_int(heads.get("rank_seed", 10_000), "heads.rank_seed"),
            rank_delta=rank_delta,
            rank_params=rank_params,
        )

    def selections(self) -> list[str]:
        """Head selections as stable labels: `top:N`, `fraction:F`, `list:L.H,L.H`."""
        out = [f"top:{n}" for n in self.top] + [f"fraction:{f:g}" for f in self.fractions]
        if self.explicit:
            out.append("list:" + ",".join(f"{l}.{h}" for l, h in self.explicit))
        return out

    def needs_ranking(self) -> bool:
        return bool(self.top or self.fractions)

    def check_heads(self, n_layers: int, n_heads: int) -> None:
        """ValueError naming an explicit head or a top count the model does not have."""
        for l, h in self.explicit:
            if not (0 <= l < n_layers and 0 <= h < n_heads):
                raise ValueError(f"sweep config: heads.list: head ({l}, {h}) does not exist in a model with {n_layers} layers x {n_heads} heads")
        for n in self.top:
            if n > n_layers * n_heads:
                raise ValueError(f"sweep config: heads.top: {n} exceeds the model's {n_layers * n_heads} heads")


def grid(config: SweepConfig) -> list[dict[str, Any]]:
    """Every grid point as a settings dict (deterministic order); each row's key is `settings_key(point)`."""
    common = {
        "model": config.model,
        "task": config.task,
        "split": config.split,
        "task_params": config.task_params,
        "n_samples": config.n_samples,
    }
    points = []
    for sel, strength, thr, renorm, delta, mode, seed in itertools.product(
        config.selections(), config.strengths, config.thresholds, config.renormalize, config.deltas, config.modes, config.seeds
    ):
        p = {**common, "heads": sel, "strength": strength, "threshold": thr, "renormalize": renorm, "delta": delta, "mode": mode, "seed": seed}
        if not sel.startswith("list:"):
            p["rank"] = {
                "by": config.rank_by, "samples": config.rank_samples, "seed": config.rank_seed,
                "delta": delta if config.rank_delta is None else config.rank_delta, "params": config.rank_params,
            }
        points.append(p)
    return points


def parse_shard(text: str) -> tuple[int, int]:
    """`"i/n"` (0 <= i < n) -> (i, n); ValueError otherwise."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard must look like i/n with integers, got {text!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"--shard {text}: need 0 <= i < n")
    return i, n


def shard_points(points: list[dict[str, Any]], shard: tuple[int, int] = (0, 1)) -> list[dict[str, Any]]:
    """Shard `i` of `n`: every n-th point from i (round robin keeps shards balanced); shards partition the grid."""
    i, n = shard
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"shard {i}/{n}: need 0 <= i < n")
    return points[i::n]


# --- small validators: every error names its key -------------------------------------------------------

def _fail(key: str, want: str, got: Any) -> ValueError:
    return ValueError(f"sweep config: {key}: must be {want}, got {got!r}")


def _str(v: Any, key: str) -> str:
    if not isinstance(v, str) or not v:
        raise _fail(key, "a non-empty string", v)
    return v


def _int(v: Any, key: str, minimum: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(key, "an integer", v)
    if minimum is not None and v < minimum:
        raise _fail(key, f"an integer >= {minimum}", v)
    return v


def _number(v: Any, key: str, minimum: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _fail(key, "a finite number", v)
    if minimum is not None and v < minimum:
        raise _fail(key, f"a number >= {minimum:g}", v)
    return float(v)


def _list(v: Any, key: str) -> list:
    return list(v) if isinstance(v, list) else [v]


def _nonempty(v: Any, key: str) -> list:
    v = _list(v, key)
    if not v:
        raise _fail(key, "a non-empty list", v)
    return v


def _ints(v: Any, key: str, minimum: int | None = None) -> tuple[int, ...]:
    return _dedup(tuple(_int(x, key, minimum) for x in _list(v, key)))


def _table(v: Any, key: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _fail(key, "a table", v)
    return dict(v)


def _heads(v: Any) -> tuple[tuple[int, int], ...]:
    out = []
    for h in _list(v, "heads.list"):
        if not (isinstance(h, list) and len(h) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in h)):
            raise _fail("heads.list", "a list of [layer, head] pairs of non-negative integers", h)
        if tuple(h) in out:
            raise ValueError(f"sweep config: heads.list: head {h} listed twice")
        out.append(tuple(h))
    return tuple(out)


def _dedup(t: tuple) -> tuple:
    return tuple(dict.fromkeys(t))
