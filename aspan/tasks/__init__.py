"""The seven AttentionSpan tasks (Spiegel et al. 2025, Appendix A) and their ID/OOD presets (Appendix E).

    task = tasks.get("addition", operands=3, digits=(1, 4))
    task = tasks.preset("addition", "ood")
    samples = task.generate(1000, seed=0)
"""
from __future__ import annotations

import json
import os
from importlib import import_module
from pathlib import Path
from typing import Any

from .base import SEPARATORS, Sample, Task, check_range

NAMES: tuple[str, ...] = ("reversal", "addition", "multiplication", "flipflop", "assign", "successor", "parity")
SPLITS: tuple[str, ...] = ("id", "ood")


def _module(name: str):
    if name not in NAMES:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(NAMES)}")
    return import_module(f"{__name__}.{name}")


def task_class(name: str) -> type[Task]:
    """The Task subclass for `name`."""
    return _module(name).TASK


def get(name: str, **params: Any) -> Task:
    """A task by name with explicit parameters (defaults: the ID preset's)."""
    return task_class(name)(**params)


def presets(name: str) -> dict[str, dict[str, Any]]:
    """{"id": params, "ood": params} of a task (paper, Appendix E)."""
    return _module(name).PRESETS


def preset(name: str, split: str = "id", **overrides: Any) -> Task:
    """A task with its ID or OOD preset parameters (Spiegel et al. 2025, Appendix E); keyword overrides win."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose 'id' or 'ood'")
    return get(name, **{**presets(name)[split], **overrides})


def from_params(name: str, params: dict[str, Any]) -> Task:
    """Rebuild a task from `task.params()` (as stored in JSONL and checkpoints)."""
    return get(name, **params)


def checked_sample(d: Any, known: dict[str, Task] | None = None) -> Sample:
    """The sample of a parsed JSON line, trusted only when its task's own solver and reference builder agree with it
    (`Task.rebuild`): ValueError starting "field 'NAME': ". A sample without a task is only checked for its form.
    `known`: tasks already built, by (name, params) JSON (a cache shared over a file)."""
    sample = Sample.from_dict(d)
    if not sample.task:
        return sample
    known = {} if known is None else known
    key = json.dumps([sample.task, sample.params], sort_keys=True)
    if key not in known:
        try:
            known[key] = from_params(sample.task, sample.params)
        except (TypeError, ValueError) as e:
            raise ValueError(f"field {'task' if sample.task not in NAMES else 'params'!r}: {e}") from None
    task = known[key]
    try:
        want = task.rebuild(sample.prompt, sample.target)
    except ValueError as e:
        raise ValueError(f"field 'text': {e}") from None
    try:
        task.admits(sample.prompt, sample.target)
    except ValueError as e:
        raise ValueError(f"field 'params': {e}") from None
    for name in ("references", "given"):
        got, expected = getattr(sample, name), getattr(want, name)
        if got != expected:
            j = next((j for j, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            raise ValueError(f"field {name!r}: entry {j} is {_entry(got, j)}, but the {task.name} task's rule gives "
                             f"{_entry(expected, j)}")
    return sample


def check_sample(sample: Sample) -> Sample:
    """`sample`, when its task (if it names one) built with its `params` gives the same text, references and given
    characters, and can generate it (`checked_sample`, as for samples read from a file); ValueError naming the first
    field that disagrees otherwise. For hand-built samples before scoring them (`evaluate` and `rank_heads` run it)."""
    if not isinstance(sample, Sample):
        raise ValueError(f"not an aspan Sample: a {type(sample).__name__}")
    checked_sample(sample.to_dict())
    return sample


def _entry(values: tuple, j: int) -> str:
    return json.dumps(values[j]) if j < len(values) else "nothing"


def read_samples(path: str | os.PathLike) -> list[Sample]:
    """Samples of an `aspan data` JSONL file (one `Sample.to_dict()` per line), each checked (`checked_sample`);
    ValueError naming the file, line and field of the first bad one (FileNotFoundError when absent)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no data file at {path}")
    out: list[Sample] = []
    known: dict[str, Task] = {}
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
                if line.strip():
                    out.append(checked_sample(json.loads(line), known))
            except UnicodeDecodeError as e:
                raise ValueError(f"{path} line {n}: not UTF-8 text (byte {raw[e.start]:#04x} at column "
                                 f"{e.start + 1})") from None
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {n}: not valid JSON ({e.msg} at column {e.colno})") from None
            except RecursionError:
                raise ValueError(f"{path} line {n}: not a sample (a value is nested too deeply to read)") from None
            except ValueError as e:
                raise ValueError(f"{path} line {n}: {e}") from None
    if not out:
        raise ValueError(f"{path}: no samples")
    return out


__all__ = [
    "SEPARATORS",
    "NAMES",
    "SPLITS",
    "Sample",
    "Task",
    "check_range",
    "get",
    "preset",
    "presets",
    "task_class",
    "from_params",
    "checked_sample",
    "check_sample",
    "read_samples",
]
