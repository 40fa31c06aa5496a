"""`aspan doctor` as a function: the record a run here would make (versions, backend, device), and, given a model,
whether it can run a task (`aspan.check_model`: hook points, one token per character, vocabulary, context)."""
from __future__ import annotations

from dataclasses import dataclass

from .. import tasks
from ..environment import describe_environment
from ..errors import UsageError
from ..tasks.params import parse_params


@dataclass(frozen=True)
class DoctorRun:
    """What `aspan doctor` checks."""

    model: str | None = None  # a model to check (checkpoint path or name, Hugging Face dir, .gguf file, smollm2)
    task: str | None = None  # the task it must run (None: the one it was trained on, else none)
    split: str = "ood"  # the task's preset: the longest samples it will be asked (OOD by default)
    params: tuple[str, ...] = ()  # key=value overrides of that preset
    device: str | None = None  # where to load the model (None: the default device)


def doctor(run: DoctorRun | None = None) -> list[str]:
    """`name: value` lines: this machine's record, then, with `run.model`, one line `model: ...` on what fits; a
    model that cannot run the task raises a one-line UsageError naming the fix (`aspan.check_model`)."""
    run = run or DoctorRun()
    return describe_environment() + ([] if run.model is None else [f"model: {check_model_line(run)}"])


def check_model_line(run: DoctorRun) -> str:
    """`aspan.check_model` on the model `run` names, loaded, and the task it asks (its training task by default)."""
    from .. import models
    from ..models.fit import check_fit, workload
    from ..models.trained import trained_task

    model, tokenizer, _ = models.load(run.model, device=run.device)
    name = run.task or getattr(trained_task(model), "name", None)
    if name is None:
        if run.params:
            raise UsageError("doctor: --param needs a task: give --task (this model names no training task)")
        return check_fit(model, tokenizer, None, f"--model {run.model}") + " (give --task to check a task's samples)"
    task = tasks.preset(name, run.split, **parse_params(name, list(run.params)))
    return check_fit(model, tokenizer, workload(task), f"--model {run.model}") + f" ({run.split} preset)"
