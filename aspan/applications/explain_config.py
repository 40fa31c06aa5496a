"""The settings of `aspan explain` (`ExplainRun`), in a module of their own that imports nothing heavy: `aspan explain
--help` shows their defaults without loading torch (the command runs through `aspan.applications.explain`)."""
from __future__ import annotations

from dataclasses import dataclass

from ..options import Convention


@dataclass
class ExplainRun:
    """The settings of `aspan explain` (its flags, by the same names)."""

    checkpoint: str  # aspan checkpoint or training run directory, HF checkpoint dir, .gguf file, or 'smollm2'
    task: str | None = None  # default: the checkpoint's training task
    any_task: bool = False  # explain a model on another task than the one it was trained on
    split: str = "ood"  # the task preset the sample comes from
    params: tuple[str, ...] = ()  # key=value task parameter overrides
    seed: int = 0  # the sample: the first of this seed's stream
    failing: bool = False  # the first sample of the seed's stream the model gets wrong (teacher-forced) instead
    heads: str | None = None  # heads to follow, e.g. "1.7,1.0" (default: the ranking's on ID samples)
    delta: int | None = None  # key offset the heads read at (default: the ranking's, or 0 with --heads)
    top: int = 2  # heads the ranking selects
    convention: Convention = "raw"  # mass over the whole row (raw) or over the sample's own columns (sample)
    edit: str | None = None  # a TOML file of an edit: the same rows after it, side by side
    device: str = "auto"
    dtype: str = "float32"  # precision the model is loaded in (float32, bfloat16, float16)
    out: str = "runs/explain"  # run directory: anatomy.json, figures/, views/, run.json and the page
    output: str | None = None  # the page (default: OUT/report.html)
