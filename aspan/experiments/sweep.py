"""Intervention sweeps (Spiegel et al. 2025, Appendix F and Fig. 2): a TOML grid of attention interventions.

Every grid point (method x head selection x strength C x threshold tau x renormalisation x key offset delta x mode
x seed) runs through the experiment engine (`aspan.experiments.engine`): evaluated on the OOD selection set and the
ID set against matched baselines, appended as one JSONL row keyed by a hash of its settings, so a killed run
resumes where it stopped and `shard=(i, n)` splits the grid for job arrays. The selection rule then picks one
setting within the ID budget, and `report_selection` evaluates it on the held-out OOD set.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, NamedTuple

import pandas as pd
import torch

from hooks import check_fits, check_heads

from .. import tasks
from ..checks import check_device, check_eval_memory, check_offsets, parse_shard
from ..config import _toml_value, load_config
from ..evaluation import CHUNK
from ..io import settings_key
from ..methods import RULES
from ..options import CONVENTIONS, EOS_REFS, MODEL_DTYPES, MODES, RANK_KEYS
from .edit import Edit, parse_gate, setting_label, setting_of
from .engine import (
    ID_BUDGET,
    Data,
    Engine,
    Job,
    Ranking,
    Selection,
    on_set,
    point,
    run_grid,
    select,
    shard_points,
)

__all__ = ["SweepConfig", "grid", "parse_shard", "report_selection", "run_sweep", "shard_points", "summary_table",
           "toml_document"]

TOP_KEYS = {
    "model", "task", "split", "task_params", "id_params", "n_samples", "seeds", "batch_size", "mode", "method",
    "strengths", "thresholds", "renormalize", "deltas", "delta", "device", "dtype", "heads", "gates", "eos", "any_task",
}
HEAD_KEYS = {"top", "fraction", "list", "by", "rank_samples", "rank_seed", "rank_delta", "rank_params", "convention"}
BUILTIN_MODELS = ("smollm2",)


def _named_model(model: str) -> bool:
    """A model given by name (SmolLM2, or a checkpoint shipped in the package) rather than by path."""
    from ..models import shipped

    return model in BUILTIN_MODELS or (not Path(model).exists() and model in shipped())


@dataclass(frozen=True)
class SweepConfig:
    """A validated sweep: what to load, what to evaluate, and the grid of interventions."""

    model: str | None  # checkpoint path or name ("reversal", "smollm2"); None: the model object given to run_sweep
    task: str
    strengths: tuple[float, ...]  # C of reinforce (alpha of steer; unused by patch)
    split: str = "ood"  # preset of the selection and held-out sets
    task_params: dict[str, Any] = field(default_factory=dict)  # overrides of that preset
    id_params: dict[str, Any] = field(default_factory=dict)  # overrides of the ID preset (the ID-cost set)
    n_samples: int = 100  # samples per evaluation set
    seeds: tuple[int, ...] = (0,)  # data seeds: each draws its own ID, selection and held-out sets
    batch_size: int = 32
    modes: tuple[str, ...] = ("teacher",)
    methods: tuple[str, ...] = ("reinforce",)  # intervention methods of the engine's registry
    gates: tuple[str | None, ...] = (None,)  # failure gates: None, "beyond", "below:TAU" (edit.parse_gate)
    eos: tuple[str, ...] = ("none",)  # end-of-sequence row: left alone, or "extrapolate" (`Edit.eos`)
    thresholds: tuple[float | None, ...] = (None,)
    renormalize: tuple[bool, ...] = (False,)
    deltas: tuple[int, ...] = (0,)
    device: str | None = None
    dtype: str = "float32"  # precision the model is loaded in: float32, bfloat16 or float16
    top: tuple[int, ...] = ()
    fractions: tuple[float, ...] = ()
    explicit: tuple[tuple[int, int], ...] = ()
    rank_by: str = "score_sum"
    rank_samples: int = 64
    rank_seed: int = 10_000
    rank_delta: int | None = None  # None: rank at each grid point's own delta
    rank_params: dict[str, Any] = field(default_factory=dict)
    rank_convention: str = "raw"  # AttnScore convention of the ranking's attention share (sample or raw)
    any_task: bool = False  # evaluate a model on another task than its training task (refused otherwise)

    @classmethod
    def from_toml(cls, path: str | Path, check_model: bool = True) -> "SweepConfig":
        """Read and fully validate a TOML sweep config (`aspan.config.load_config`); UsageError naming the file and
        the offending key."""
        return load_config(cls, toml_path=path, name="sweep config", check=lambda c: c.check(check_model))

    @classmethod
    def toml_fields(cls, raw: dict[str, Any], path: Path) -> dict[str, Any]:
        """The fields a parsed config file sets (`load_config`'s hook): a relative checkpoint path may be relative
        to the file. A `[slurm]` table holds the resources of `--launcher slurm` (`aspan.applications.launch`),
        not sweep settings."""
        raw = {k: v for k, v in raw.items() if k != "slurm"}
        if "model" not in raw:  # a file is run by `aspan sweep`, which has no model object
            raise ValueError("sweep config: missing required key 'model' (a checkpoint path or name)")
        model = raw.get("model")
        if isinstance(model, str) and not _named_model(model) and not Path(model).is_absolute():
            rel = path.parent / model
            if not Path(model).exists() and rel.exists():
                raw = {**raw, "model": str(rel)}
        return cls.parse(raw)

    def toml_text(self) -> str:
        """These settings as a sweep config file of `configs/*.toml`'s shape (top-level keys and a [heads] table: the
        inverse of `toml_fields`), which `from_toml` reads back to equal settings (`aspan sweep --print-config`)."""
        top = {"model": self.model, "task": self.task, "split": self.split, "task_params": self.task_params,
               "id_params": self.id_params, "n_samples": self.n_samples, "seeds": self.seeds,
               "batch_size": self.batch_size, "mode": self.modes, "method": self.methods, "strengths": self.strengths,
               "thresholds": tuple("none" if t is None else t for t in self.thresholds),
               "renormalize": self.renormalize, "deltas": self.deltas, "device": self.device, "dtype": self.dtype,
               "gates": tuple("none" if g is None else g for g in self.gates), "eos": self.eos,
               "any_task": self.any_task}
        heads = {"top": self.top, "fraction": self.fractions, "list": [list(h) for h in self.explicit],
                 "by": self.rank_by, "rank_samples": self.rank_samples, "rank_seed": self.rank_seed,
                 "rank_delta": "same" if self.rank_delta is None else self.rank_delta,
                 "rank_params": self.rank_params, "convention": self.rank_convention}
        return toml_document(top, {"heads": heads})

    @classmethod
    def from_dict(cls, raw: dict[str, Any], check_model: bool = True) -> "SweepConfig":
        """Validate a parsed config dict (see `configs/*.toml`); ValueError naming the offending key."""
        cfg = cls(**cls.parse(raw))
        cfg.check(check_model)
        return cfg

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> dict[str, Any]:
        """The fields of a parsed config dict (the file's keys and its [heads] table), each key's type and range
        checked; ValueError naming the offending key."""
        unknown = sorted(set(raw) - TOP_KEYS)
        if unknown:
            raise ValueError(f"sweep config: unknown key {unknown[0]!r} (known: {', '.join(sorted(TOP_KEYS))})")
        for key in ("task", "strengths"):
            if key not in raw:
                raise ValueError(f"sweep config: missing required key {key!r}")
        heads = _head_settings(_table(raw.get("heads", {}), "heads"), raw["task"])
        model = _str(raw["model"], "model") if "model" in raw else None  # None: a model object goes to run_sweep
        return {"model": model, **_data_settings(raw), **_grid_settings(raw), **heads}

    def check(self, check_model: bool = True) -> None:
        """What the settings must satisfy together, before any model loads: the checkpoint exists, the offsets and
        strengths fit the longest sample, the evaluation sets fit in memory; ValueError naming the key."""
        if check_model and self.model is not None and not _named_model(self.model) and not Path(self.model).exists():
            raise ValueError(f"sweep config: model: checkpoint {self.model!r} does not exist")
        longest = tasks.preset(self.task, self.split, **self.task_params).max_text_len()
        check_offsets(list(self.deltas), longest + 1, "sweep config: deltas")
        _check_strengths_fit(self.strengths, longest + 2)
        longest_id = tasks.preset(self.task, "id", **self.id_params).max_text_len()
        # the engine evaluates every set as a stream: one chunk of samples at a time, and a per-sample row each
        check_eval_memory(self.n_samples, max(longest, longest_id), CHUNK, "sweep config: n_samples")

    def data(self) -> Data:
        """The engine's evaluation sets for this sweep."""
        return Data(self.task, self.task_params, self.id_params, self.n_samples, self.split)

    def selections(self) -> list[str]:
        """Head selections as stable labels: `top:N`, `fraction:F`, `list:L.H,L.H`."""
        out = [f"top:{n}" for n in self.top] + [f"fraction:{f:g}" for f in self.fractions]
        if self.explicit:
            out.append("list:" + ",".join(f"{l}.{h}" for l, h in self.explicit))
        return out

    def check_heads(self, n_layers: int, n_heads: int) -> None:
        """ValueError naming an explicit head or a top count the model does not have."""
        if self.explicit:
            try:
                check_heads(self.explicit, n_layers, n_heads)
            except ValueError as e:
                raise ValueError(f"sweep config: heads.list: {e} (the model has {n_layers} layers x {n_heads} "
                                 "heads)") from None
        for n in self.top:
            if n > n_layers * n_heads:
                raise ValueError(f"sweep config: heads.top: {n} exceeds the model's {n_layers * n_heads} heads")


def toml_document(top: dict[str, Any], tables: dict[str, dict[str, Any]]) -> str:
    """A TOML file: `key = value` lines of `top` (a dict value is an inline table), then each of `tables` as a
    `[name]` table; None values are left out (TOML has no null: a file that leaves a key out gets its default)."""
    def lines(values: dict[str, Any], prefix: str) -> list[str]:
        return [f"{k} = {_toml_value(v, prefix + k)}" for k, v in values.items() if v is not None]

    out = lines(top, "")
    for name, values in tables.items():
        out += ["", f"[{name}]", *lines(values, f"{name}.")]
    return "\n".join(out) + "\n"


def _data_settings(raw: dict[str, Any]) -> dict[str, Any]:
    """Task, split, preset overrides, sizes and device of a raw config, validated."""
    task = _str(raw["task"], "task")
    if task not in tasks.NAMES:
        raise ValueError(f"sweep config: task: unknown task {task!r}; choose one of {', '.join(tasks.NAMES)}")
    split = _str(raw.get("split", "ood"), "split")
    if split not in tasks.SPLITS:
        raise ValueError(f"sweep config: split: must be 'id' or 'ood', got {split!r}")
    out = {"task": task, "split": split}
    for key, preset in (("task_params", split), ("id_params", "id")):
        out[key] = _table(raw.get(key, {}), key)
        try:
            tasks.preset(task, preset, **out[key])
        except (TypeError, ValueError) as e:
            raise ValueError(f"sweep config: {key}: {e}") from None
    device, any_task = raw.get("device"), raw.get("any_task", False)
    if not isinstance(any_task, bool):
        raise _fail("any_task", "true or false", any_task)
    dtype = raw.get("dtype", "float32")
    if dtype not in MODEL_DTYPES:
        raise _fail("dtype", " or ".join(map(repr, MODEL_DTYPES)), dtype)
    return {**out, "any_task": any_task, "n_samples": _int(raw.get("n_samples", 100), "n_samples", minimum=1),
            "seeds": _ints(raw.get("seeds", [0]), "seeds", minimum=0),
            "batch_size": _int(raw.get("batch_size", 32), "batch_size", minimum=1),
            "device": None if device is None else check_device(_str(device, "device"), "sweep config: device"),
            "dtype": dtype}


def _grid_settings(raw: dict[str, Any]) -> dict[str, Any]:
    """The intervention axes of a raw config (strengths, thresholds, offsets, modes, methods), validated."""
    if "delta" in raw and "deltas" in raw:
        raise ValueError("sweep config: give either 'delta' or 'deltas', not both")
    key = "deltas" if "deltas" in raw else "delta"
    deltas = _ints(_nonempty(raw.get("deltas", raw.get("delta", [0])), key), key)
    thresholds = tuple(None if t == "none" else _number(t, "thresholds", minimum=0.0)
                       for t in _list(raw.get("thresholds", ["none"]), "thresholds"))
    for t in thresholds:
        if t is not None and t >= 1:
            raise _fail("thresholds", "below 1 (attention weights are at most 1: the edit, where A > tau, would "
                        "never fire)", t)
    modes = tuple(_str(m, "mode") for m in _list(raw.get("mode", ["teacher"]), "mode"))
    for m in modes:
        if m not in MODES:
            raise ValueError(f"sweep config: mode: must be 'teacher' or 'generate', got {m!r}")
    methods = tuple(_str(m, "method") for m in _list(raw.get("method", ["reinforce"]), "method"))
    for m in methods:
        if m not in RULES:
            raise ValueError(f"sweep config: method: must be one of {', '.join(RULES)}, got {m!r}")
    renorm = _list(raw.get("renormalize", [False]), "renormalize")
    for r in renorm:
        if not isinstance(r, bool):
            raise ValueError(f"sweep config: renormalize: must be true/false, got {r!r}")
    gates = tuple(_str(g, "gates") for g in _list(raw.get("gates", ["none"]), "gates"))
    for g in gates:
        try:
            parse_gate(g)
        except ValueError as e:
            raise ValueError(f"sweep config: gates: {e}") from None
    eos = tuple(_str(e, "eos") for e in _list(raw.get("eos", ["none"]), "eos"))
    for e in eos:
        if e not in EOS_REFS:
            raise ValueError(f"sweep config: eos: must be one of {', '.join(EOS_REFS)}, got {e!r}")
    strengths = tuple(_number(c, "strengths", minimum=0.0) for c in _nonempty(raw["strengths"], "strengths"))
    _check_method_strengths(_dedup(methods), strengths)
    return {"strengths": strengths, "deltas": deltas, "thresholds": _dedup(thresholds), "modes": _dedup(modes),
            "methods": _dedup(methods),
            "renormalize": _dedup(tuple(renorm)), "gates": _dedup(tuple(None if g == "none" else g for g in gates)),
            "eos": _dedup(eos)}


def _check_method_strengths(methods: tuple[str, ...], strengths: tuple[float, ...]) -> None:
    """Every strength a method is crossed with must be one that method takes (`Edit`'s rules: steer's alpha is in
    (0, 1], reinforce's C >= 0): refused here, before any model loads, naming the key and the method."""
    for method in methods:
        for strength in method_axes(method, strengths)[0]:
            try:
                Edit(method, strength=strength)
            except ValueError as e:
                raise ValueError(f"sweep config: strengths: method {method}: {e}") from None


def _check_strengths_fit(strengths: tuple[float, ...], n_keys: int) -> None:
    """Every C must leave an edited attention row finite in float32 (rows of up to `n_keys` keys: BOS, the longest
    text, EOS); a model in a narrower dtype is checked again when its hooks are built."""
    for c in strengths:
        try:
            check_fits(c, torch.float32, n_keys)
        except ValueError as e:
            raise ValueError(f"sweep config: strengths: {e}") from None


def _head_settings(heads: dict[str, Any], task: str) -> dict[str, Any]:
    """The [heads] table: selections (top / fraction / list) and how the ranking is computed, validated."""
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
    if by not in RANK_KEYS:
        raise ValueError(f"sweep config: heads.by: must be one of {', '.join(RANK_KEYS)}, got {by!r}")
    convention = _str(heads.get("convention", "raw"), "heads.convention")
    if convention not in CONVENTIONS:
        raise ValueError(f"sweep config: heads.convention: must be one of {', '.join(CONVENTIONS)}, got {convention!r}")
    rank_delta = heads.get("rank_delta", "same")
    rank_params = _table(heads.get("rank_params", {}), "heads.rank_params")
    try:
        tasks.preset(task, "id", **rank_params)
    except (TypeError, ValueError) as e:
        raise ValueError(f"sweep config: heads.rank_params: {e}") from None
    return {"top": top, "fractions": _dedup(fractions), "explicit": explicit, "rank_by": by,
            "rank_samples": _int(heads.get("rank_samples", 64), "heads.rank_samples", minimum=1),
            "rank_seed": _int(heads.get("rank_seed", 10_000), "heads.rank_seed", minimum=0),
            "rank_delta": None if rank_delta == "same" else _int(rank_delta, "heads.rank_delta"),
            "rank_params": rank_params, "rank_convention": convention}


def method_axes(method: str, strengths: tuple, thresholds: tuple = (None,), renormalize: tuple = (False,)
                ) -> tuple[tuple, tuple, tuple]:
    """(strengths, thresholds, renormalize) as `method` crosses them: each axis the method takes (`methods.RULES`:
    reinforce all three, steer the strengths, its alpha, patch none), else that axis's one unset value."""
    rule = RULES[method]
    return (strengths if rule.takes_strength else (None,),
            thresholds if "threshold" in rule.options else (None,),
            renormalize if "renormalize" in rule.options else (False,))


def grid(config: SweepConfig) -> list[dict[str, Any]]:
    """Every grid point as an engine settings dict on the selection set (deterministic order); each row's key is
    `settings_key(point)`. Each method crosses only the axes it takes: patch no strengths, thresholds or
    renormalisation; steer no thresholds or renormalisation (so no edit is evaluated twice under two keys)."""
    data = config.data()
    rank = Ranking(config.rank_by, config.rank_samples, config.rank_seed, config.rank_params, config.rank_convention)
    rest = (config.deltas, config.modes, config.seeds, config.gates, config.eos)
    out = []
    for sel, method in itertools.product(config.selections(), config.methods):
        axes = method_axes(method, config.strengths, config.thresholds, config.renormalize)
        for strength, thr, renorm, delta, mode, seed, gate, eos in itertools.product(*axes, *rest):
            out.append(point(data, config.model, sel, strength, method=method, threshold=thr, renormalize=renorm,
                             delta=delta, mode=mode, seed=seed, rank=rank, rank_delta=config.rank_delta, gate=gate,
                             eos=eos))
    return out


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
        if not (isinstance(h, list) and len(h) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in h)):
            raise _fail("heads.list", "a list of [layer, head] pairs of non-negative integers", h)
        if tuple(h) in out:
            raise ValueError(f"sweep config: heads.list: head {h} listed twice")
        out.append(tuple(h))
    return tuple(out)


def _dedup(t: tuple) -> tuple:
    return tuple(dict.fromkeys(t))


# --- running -----------------------------------------------------------------------------------------------

def checkpoint_dims(model: str) -> tuple[int, int] | None:
    """(n_layers, n_heads) read from a checkpoint's config.json without loading weights; None when unknown."""
    import json

    from ..models import resolve

    file = resolve(model) / "config.json"
    if not file.is_file():
        return None
    try:
        c = json.loads(file.read_text())
        if "model" in c and isinstance(c["model"], dict):  # aspan checkpoint
            return int(c["model"]["n_layers"]), int(c["model"]["n_heads"])
        if "n_layer" in c:  # a GPT-2 config (learned-position tiny models) keeps GPT-2's own names
            return int(c["n_layer"]), int(c["n_head"])
        return int(c["num_hidden_layers"]), int(c["num_attention_heads"])  # Hugging Face config
    except (ValueError, KeyError, TypeError, RecursionError):
        return None  # the loader reports a corrupt checkpoint with its own clear error


def _engine(config: SweepConfig, model=None, tokenizer=None) -> Callable[[], Engine]:
    """A function building the engine (loading the model only when called)."""

    def build() -> Engine:
        nonlocal model, tokenizer
        if model is None:
            from .. import models

            dims = checkpoint_dims(config.model)
            if dims:
                config.check_heads(*dims)  # before the (possibly slow) load
            model, tokenizer, _ = models.load(config.model, device=config.device, dtype=config.dtype)
        elif tokenizer is None:
            raise ValueError("run_sweep: pass the tokenizer along with the model")
        config.check_heads(model.cfg.n_layers, model.cfg.n_heads)
        return Engine(model, tokenizer, config.data(), config.batch_size, any_task=config.any_task)

    return build


def naming_model(config: SweepConfig, model=None, tokenizer=None, where: str = "run_sweep") -> SweepConfig:
    """`config` with the model its rows name: its own `model`, or for a config that names none the model object
    `model`, as `in-memory:` and a hash of its weights and its tokenizer's settings, so that rows of another model
    (or of this one trained further, or with another prompt) are never taken for its own when a rows file is
    resumed."""
    if config.model is not None:
        return config
    if model is None:
        raise ValueError(f"{where}: the sweep config names no model: set its model (a checkpoint path or name) or "
                         "pass the model object (model=..., tokenizer=...)")
    import hashlib

    from ..models.checkpoint import weights_hash

    settings = tokenizer.to_dict() if hasattr(tokenizer, "to_dict") else type(tokenizer).__name__
    label = hashlib.sha256(f"{weights_hash(model)} {settings_key(settings)}".encode()).hexdigest()[:16]
    return replace(config, model=f"in-memory:{label}")


def run_sweep(config: SweepConfig, out_path: str | Path, shard: tuple[int, int] = (0, 1), model=None, tokenizer=None,
              **job: Any) -> pd.DataFrame:
    """Evaluate this shard's missing grid points on the selection set (one JSONL row each, resumable); return the
    shard's rows. `model`, `tokenizer`: a model object to run (the config then needs no `model`, see
    `naming_model`), else the config's model is loaded, only if a point is missing. `job`: `progress`, `limit` (new
    rows at most), `on_row` (see `engine.Job`)."""
    config = naming_model(config, model, tokenizer)
    rows = run_grid(grid(config), Job(out_path, shard, **job), _engine(config, model, tokenizer))
    return pd.DataFrame(rows)


def report_selection(config: SweepConfig, rows: pd.DataFrame, out_path: str | Path, id_budget: float | None = ID_BUDGET,
                     loaded: tuple | None = None, progress: bool = True) -> tuple[Selection, pd.DataFrame]:
    """Apply the selection rule to the seed-averaged table of `rows` and evaluate the chosen setting on the
    held-out set (every seed; rows appended to `out_path`, resumable). `loaded`: (model, tokenizer), else the
    config's model is loaded when a held-out row is missing. Returns (selection, held-out rows)."""
    model, tokenizer = loaded or (None, None)
    config = naming_model(config, model, tokenizer, "report_selection")
    table = summary_table(rows)
    sel = select(table, id_budget)
    if sel.row is None:
        return sel, pd.DataFrame()
    chosen = [on_set(p, "held_out") for p in grid(config) if _same_setting(p, sel.row)]
    held = run_grid(chosen, Job(out_path, progress=progress), _engine(config, model, tokenizer))
    return sel, pd.DataFrame(held)


def _same_setting(p: dict[str, Any], row: dict[str, Any]) -> bool:
    """Whether grid point `p` is the setting of a `summary_table` row (`edit.setting_of`)."""
    return setting_of(p) == setting_of(row)


# --- tables and figures -------------------------------------------------------------------------------------

SETTING_COLUMNS = ["mode", "method", "heads", "n_heads", "strength", "threshold", "renormalize", "delta", "gate",
                   "eos"]
METRICS = ["exact", "partial", "attn_rollout_sample", "attn_rollout_raw", "attn_heads_sample", "attn_heads_raw",
           "baseline_exact", "baseline_partial", "baseline_attn_rollout_sample", "baseline_attn_rollout_raw",
           "id_exact", "id_partial", "id_baseline_exact", "id_baseline_partial"]


def summary_table(rows: pd.DataFrame, set_name: str = "selection") -> pd.DataFrame:
    """Mean over seeds per setting (`edit.setting_of`) of the rows on `set_name`: accuracy, AttnScores, baselines,
    OOD gains and the ID cost; ordered as the selection rule ranks them (exact gain, then per-token gain)."""
    if rows.empty or "set" not in rows:
        return pd.DataFrame(columns=SETTING_COLUMNS)
    rows = rows[rows["set"] == set_name]
    if rows.empty:
        return pd.DataFrame(columns=SETTING_COLUMNS)
    r = rows.assign(threshold=rows.threshold.astype(object).where(rows.threshold.notna(), "none"))
    gate = r["gate"] if "gate" in r else pd.Series(None, index=r.index, dtype=object)
    eos = r["eos"] if "eos" in r else pd.Series(None, index=r.index, dtype=object)
    # ungated points store no gate, and points that leave the EOS row alone no eos
    r = r.assign(gate=gate.astype(object).where(gate.notna(), "none"),
                 eos=eos.astype(object).where(eos.notna(), "none"))
    r = r.assign(setting=[settings_key(setting_of(x)) for x in r.to_dict("records")])
    g = r.groupby("setting", sort=False)
    extra = ["atoms"] if "atoms" in r else []
    out = g[[*SETTING_COLUMNS, *extra]].first().join(g[METRICS].mean()).join(g.seed.nunique().rename("seeds"))
    out = out.join(g.n.sum().rename("n")).reset_index(drop=True)
    out["gain_exact"] = out.exact - out.baseline_exact
    out["gain_partial"] = out.partial - out.baseline_partial
    out["id_cost"] = out.id_baseline_exact - out.id_exact
    out["set"] = set_name
    return out.sort_values(["mode", "gain_exact", "gain_partial"], ascending=[True, False, False],
                           kind="stable").reset_index(drop=True)


class SelectedCurves(NamedTuple):
    """What the length figure draws (`aspan.viz.length_figure`): accuracy by target length of the baseline and of
    the picked setting's intervention (exact and partial, weighted by samples over seeds), and its label."""

    mode: str
    baseline: pd.DataFrame
    intervention: pd.DataFrame
    label: str


def by_length(rows: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per-length accuracy (mean over the rows' seeds, weighted by samples) from the nested `column`."""
    df = pd.DataFrame([dict(d) for lst in rows[column] for d in lst])
    df["exact_n"], df["partial_n"] = df.exact * df.n, df.partial * df.n
    g = df.groupby("length").sum(numeric_only=True)
    return pd.DataFrame({"exact": g.exact_n / g.n, "partial": g.partial_n / g.n, "n": g.n}).reset_index()


def selected_curves(rows: pd.DataFrame, mode: str | None = None, id_budget: float | None = ID_BUDGET) -> SelectedCurves:
    """The curves of the setting the selection rule picks among `rows` of `mode` on the selection set (without a
    pick within the ID budget: the pick at any ID cost, so the figure always shows an intervention); every seed's row
    of that setting (`edit.setting_of`) and no row of a neighbouring gate or eos."""
    mode = mode or rows["mode"].iloc[0]
    rows = rows[(rows["set"] == "selection") & (rows["mode"] == mode)]
    table = summary_table(rows)
    best = select(table, id_budget).row or select(table, None).row or table.iloc[0].to_dict()
    chosen = setting_of(best)
    picked = rows[[setting_of(r) == chosen for r in rows.to_dict("records")]]
    return SelectedCurves(mode, by_length(picked, "baseline_by_length"), by_length(picked, "by_length"),
                          f"{setting_label(best)}, ID cost {best['id_cost']:+.3f}")
