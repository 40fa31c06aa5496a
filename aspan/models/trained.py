"""The task a model was trained on, kept on the model object itself (`models.load` records it from the checkpoint's
metadata, `training.train` from its data), so that scoring it on another task's samples is refused instead of
reported as a number: a model whose characters happen to cover every task (the shipped reversal model) would
otherwise "evaluate" addition samples. Pretrained models name no training task and are never restricted."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from .. import tasks
from ..errors import UsageError

ATTRIBUTE = "aspan_trained_task"


@dataclass(frozen=True)
class TrainedTask:
    """A model's training task: its name and, where its checkpoint records them, the parameters it was trained on
    (lengths, layout, ...)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def layout(self) -> str | None:
        """The number layout ("padded"; None for the default, which tasks leave out of their parameters)."""
        return self.params.get("layout")

    @property
    def lengths(self) -> tuple[int, int] | None:
        """The training range of the task's length parameter (`Task.length_param`), when recorded."""
        key = tasks.task_class(self.name).length_param if self.name in tasks.NAMES else None
        value = self.params.get(key) if key else None
        if isinstance(value, (list, tuple)) and len(value) == 2:
            return int(value[0]), int(value[1])
        return None


def from_meta(meta: dict[str, Any]) -> TrainedTask | None:
    """The training task a checkpoint's free metadata names (`task`, with `params` or, in older checkpoints,
    `task_params`); None when it names none."""
    name = meta.get("task") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        return None
    params = meta.get("params", meta.get("task_params"))
    return TrainedTask(name, dict(params) if isinstance(params, dict) else {})


def trained_task(model) -> TrainedTask | None:
    """The task recorded on `model`; None for a model that names none (pretrained, or built here untrained)."""
    return getattr(model, ATTRIBUTE, None)


def record_task(model, task: TrainedTask | None) -> None:
    """Record `task` on `model` (None: the model no longer names a task)."""
    setattr(model, ATTRIBUTE, task)


def task_of(samples: Iterable[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(task name, parameters) of each sample, for `other_task`."""
    return ((s.task, s.params or {}) for s in samples)


def other_task(mine: TrainedTask | None, tasks: Iterable[tuple[str, dict[str, Any]]]) -> str | None:
    """Why `tasks` ((name, parameters) pairs: a task's, or each sample's through `task_of`) are not the training task
    `mine`, in one phrase naming both; None when they are, when there is no training task (a pretrained model), or
    for a pair with no name (samples built by hand). Tasks with a number layout must also match in their `layout`."""
    if mine is None:
        return None
    for name, params in tasks:
        if not name:
            continue
        if name != mine.name:
            return f"samples of task {name!r}, but the model was trained on task {mine.name!r}"
        if mine.params and params and params.get("layout") != mine.layout:
            return (f"samples of task {name!r} in layout {params.get('layout') or 'lsd'!r}, but the model was "
                    f"trained on {name!r} in layout {mine.layout or 'lsd'!r}")
    return None


def check_task(mine: TrainedTask | None, tasks: Iterable[tuple[str, dict[str, Any]]], what: str, hint: str) -> None:
    """UsageError in one line (`what`, both tasks, and `hint`: how to ask for it anyway) when `tasks` are not the
    training task `mine` (`other_task`); `mine` is `trained_task(model)`, or `models.checkpoint.saved_task(path)`
    before loading."""
    reason = other_task(mine, tasks)
    if reason is not None:
        raise UsageError(f"{what}: {reason} ({hint})")
