"""The settings of the applications the command line runs (`aspan eval`, `rank`, `abc` and `demo`: their flags, by
the same names), in a module that loads no torch, pandas or TransformerLens: a command builds its parser, shows each
flag's default (`--help`) and checks what it was given against them before it imports anything heavy. Each
application's module imports its settings from here (`aspan.applications.eval.EvalRun` is this `EvalRun`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import tasks
from ..buckets import parse_buckets
from ..checks import check_device, check_output_dir
from ..config import renamed_key
from ..experiments.edit import Edit
from ..options import (
    CONVENTIONS,
    DIRECTIONS,
    EOS_REFS,
    ID_BUDGET,
    MODES,
    RANK_BY,
    ROWS,
    Convention,
    EosRefs,
    check_option,
)
from ..tasks.params import parse_params


@dataclass
class EvalRun:
    """The settings of one evaluation (those of `aspan eval`'s flags, named after them)."""

    checkpoint: str  # checkpoint or training run directory, .gguf file, or 'smollm2'
    task: str | None = None  # default: the checkpoint's training task
    any_task: bool = False  # score a model on another task than the one it was trained on
    split: str = "ood"  # the task preset
    params: tuple[str, ...] = ()  # key=value task parameter overrides
    samples: int = 500  # samples (per bucket with buckets)
    mode: str = "teacher"  # teacher forcing or greedy generation
    seed: int = 0
    batch_size: int = 32
    heads: str | None = None  # heads for attn_heads_sample/_raw, e.g. "1.3,1.5"
    delta: int = 0  # score references shifted by this key offset
    attn: bool = True  # False: accuracy only (no AttnScore forwards)
    buckets: str | None = None  # length ranges each evaluated on its own samples, e.g. "1-10,11-20"
    bucket: int | None = None  # length bucket width of the table (default: 1, or 5 beyond 15 lengths)
    device: str = "auto"
    dtype: str = "float32"  # precision the model is loaded in (float32, bfloat16, float16)
    threads: int | None = None
    output: str | None = None  # per-token records JSONL
    run_dir: str | None = None  # also run.json, summary.json and records.jsonl here
    progress: bool = True  # a progress bar over the samples

    def check(self) -> None:
        """ValueError naming the flag of the first setting that cannot run, before anything is loaded."""
        if self.samples < 1 or self.batch_size < 1:
            raise ValueError(f"-n and --batch-size must be >= 1, got {self.samples} and {self.batch_size}")
        check_option("--mode", self.mode, MODES)
        if self.task is not None:
            parse_params(self.task, list(self.params))  # an unknown task or parameter, by name
        parse_heads(self.heads)
        parse_buckets(self.buckets)


def parse_heads(text: str | None) -> list[tuple[int, int]] | None:
    """`"1.3,0.5"` (or `1:3`) -> [(1, 3), (0, 5)]; None -> None; ValueError naming --heads on any other form, an
    empty one included (`--heads ""`: leave the flag out for no head records)."""
    if text is None:
        return None
    out = []
    for item in text.split(","):
        found = re.fullmatch(r"\s*([0-9]{1,9})[.:]([0-9]{1,9})\s*", item)
        if found is None:
            shown = repr(item) if len(item) <= 60 else f"{item[:60]!r}... ({len(item)} characters)"
            raise ValueError(f"--heads: expected layer.head pairs like 1.3,0.5, got {shown}")
        out.append((int(found[1]), int(found[2])))
    return out


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

    def check(self) -> None:
        """ValueError naming the flag of the first setting that cannot run, before anything is loaded (what needs
        the model, e.g. the heads' range or the ABS line's, is checked once its shape is known)."""
        for split, params in (("id", self.id_params), ("ood", self.ood_params)):
            tasks.preset(self.task, split, **parse_params(self.task, list(params)))
        directions = [d.strip() for d in self.directions.split(",") if d.strip()]
        if not directions or any(d not in DIRECTIONS for d in directions):
            raise ValueError(f"--directions: choose from {', '.join(DIRECTIONS)}, got {self.directions!r}")
        check_option("--rows", self.rows, ROWS)
        check_option("--mode", self.mode, MODES)
        if self.lam < 0:
            raise ValueError(f"--lambda must be >= 0, got {self.lam}")
        for name in ("id_samples", "ood_samples", "batch_size", "finetune_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.finetune_steps < 0:
            raise ValueError("--finetune-steps must be >= 0")
        if self.abs:
            parse_abs(self.abs)
        if self.heads is not None:
            parse_bias_heads(self.heads)


def parse_bias_heads(text: str) -> list[tuple[int, int]]:
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


CAUSAL = ("effect", "estimate")  # the `by` values of `RankConfig` that profile the heads with an edit


@dataclass
class RankConfig:
    """What `aspan rank` is asked (its flags, by the same names). `deltas` always includes 0; a causal ranking
    (`by` in CAUSAL) adds the edit's offset and profiles on `profile_split` with `profile_params`."""

    model: str  # aspan checkpoint dir, HF checkpoint dir, .gguf file, or 'smollm2'
    task: str
    split: str = "id"
    params: dict[str, Any] = field(default_factory=dict)  # task parameter overrides
    samples: int = 64
    seed: int = 0
    deltas: list[int] = field(default_factory=lambda: [0])
    top: int | None = None
    fraction: float | None = None
    by: str = "score_sum"
    convention: str = "sample"
    batch_size: int = 32
    device: str | None = None
    dtype: str = "float32"  # precision the model is loaded in (float32, bfloat16, float16)
    out: str = "runs/rank"
    progress: bool = True
    any_task: bool = False
    edit: Edit = field(default_factory=lambda: Edit("reinforce"))  # the causal ranking's edit
    metric: str = "logprob"
    candidates: int | None = None
    greedy: int | None = None
    profile_split: str = "ood"
    profile_params: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """ValueError naming the flag of the first setting that cannot run, before anything is loaded (the offsets
        against the samples' length and the task against the checkpoint's are `check_rank`'s)."""
        tasks.preset(self.task, self.split, **self.params)
        check_option("--by", self.by, RANK_BY)
        check_option("--convention", self.convention, CONVENTIONS)
        if self.samples < 1 or self.batch_size < 1:
            raise ValueError("--samples and --batch-size must be >= 1")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"--fraction must be in (0, 1], got {self.fraction}")
        for name in ("top", "candidates", "greedy"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.by in CAUSAL:
            tasks.preset(self.task, self.profile_split, **self.profile_params)


@dataclass
class DemoConfig:
    """What `aspan demo` runs; `quick_config()` gives tiny sizes for tests."""

    task: str = "reversal"
    out: str = "runs/demo"
    samples: int = 100  # per evaluation set (ID, OOD selection, OOD held-out, ID held-out)
    gen_samples: int = 32  # greedy generation is run on this many samples per split
    seed: int = 0
    train: bool = False
    # a checkpoint directory to load instead of the shipped model (e.g. one `scripts/train_default.py --seed N`
    # wrote); None: the shipped checkpoint, or a model trained here (`train`)
    model: str | None = None
    steps: int | None = None
    quick: bool = False
    device: str | None = None
    threads: int | None = 1  # torch CPU threads: 1 is several times faster than 2 for a tiny model on busy cores
    tops: tuple[int, ...] = (1, 2, 4)
    strengths: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0)
    deltas: tuple[int, ...] = (-2, -1, 0, 1, 2, 3)
    ood: dict = field(default_factory=dict)  # overrides of the OOD preset (reversal: lengths 11-20)
    id_budget: float = ID_BUDGET  # the selection rule's budget on the drop of ID exact accuracy (a fraction)
    shard: tuple[int, int] | None = None  # only this shard of the grid (sweep.shard-I-of-N.jsonl), then stop
    convention: Convention = "sample"  # AttnScore convention of the attention-share ranking (sample or raw)
    eos: tuple[EosRefs, ...] = EOS_REFS  # the search tries each treatment of the end-of-sequence row (Edit.eos)

    @classmethod
    def toml_fields(cls, raw: dict[str, Any], path: Any = None) -> dict[str, Any]:
        """The fields a `--config` file sets (`aspan.config.load_config`'s hook): its keys, less a `[slurm]` table
        (the resources of `--launcher slurm`, `aspan.applications.launch`); `rank_convention`, the old spelling of
        `convention`, read as it (with a warning)."""
        return renamed_key({k: v for k, v in raw.items() if k != "slurm"}, "rank_convention", "convention",
                           path or "demo config")

    @classmethod
    def quick_config(cls, **kw: Any) -> "DemoConfig":
        """The `--quick` configuration (fewer samples, a smaller grid), `kw` overriding it."""
        base = dict(samples=24, gen_samples=8, tops=(1, 2), strengths=(1.0, 4.0), deltas=(-1, 0, 1, 2), quick=True)
        return cls(**{**base, **kw})

    def check(self) -> None:
        """ValueError on impossible settings, before any work."""
        tasks.task_class(self.task)  # unknown task -> ValueError naming the choices
        if self.samples < 4 or self.gen_samples < 1:
            raise ValueError(f"--samples must be >= 4 and gen_samples >= 1, got {self.samples}, {self.gen_samples}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {self.steps}")
        if self.model is not None:
            if self.train:
                raise ValueError("--model loads a checkpoint and --train trains one: give one of them")
            if not (Path(self.model) / "config.json").is_file():
                raise ValueError(f"--model: no checkpoint at {self.model} (a directory with config.json, as "
                                 "aspan.models.save writes it)")
        if not self.tops or min(self.tops) < 1 or not self.strengths or 0 not in self.deltas:
            raise ValueError("tops must be >= 1, strengths non-empty and deltas must contain 0")
        if not self.id_budget >= 0:
            raise ValueError(f"--id-budget must be >= 0, got {self.id_budget}")
        check_option("--convention", self.convention, CONVENTIONS)
        if not self.eos or any(e not in EOS_REFS for e in self.eos):
            raise ValueError(f"eos must be a non-empty tuple of {', '.join(map(repr, EOS_REFS))}, got {self.eos!r}")
        check_device(self.device, "--device")
        check_output_dir(self.out, "--out")
