"""Wall-clock budgets for training (e.g. a GPU slice of a few minutes): `time_budget` sets one for every `train`
call inside it, which pauses at the deadline, checkpointed, with `BudgetSpent`."""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator


@dataclass(frozen=True)
class TimeBudget:
    """A wall-clock limit on every `train` call made inside `time_budget(...)` (e.g. a GPU slice of a few minutes).

    A run checks the budget after every optimiser step (all DDP ranks agree): once `clock()` reaches `deadline` it
    writes a checkpoint at that step (when it has an `out_dir`) and raises `BudgetSpent`, so `train(...,
    resume=True)` later continues it exactly; while it runs, a run with an `out_dir` is checkpointed whenever
    `checkpoint_s` seconds passed since its last checkpoint, so a process killed from outside loses at most that
    much. A run without an `out_dir` is simply stopped (its caller reruns it whole)."""

    deadline: float  # clock() value at which training pauses
    checkpoint_s: float = 120.0  # the oldest a running checkpoint may get (seconds of clock())
    clock: Callable[[], float] = time.monotonic  # tests pass a step counter here

    def __post_init__(self):
        for key in ("deadline", "checkpoint_s"):  # NaN or infinity would mean no deadline or no checkpoint
            value = getattr(self, key)
            if not _finite(value):
                text = repr(value)
                raise ValueError(f"TimeBudget.{key} must be a finite number, got {text[:20]}")
        if self.checkpoint_s <= 0:
            raise ValueError(f"TimeBudget.checkpoint_s must be > 0, got {self.checkpoint_s!r}")

    def spent(self) -> bool:
        """Whether the deadline has passed."""
        return self.clock() >= self.deadline


def _finite(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond a float
        return False


class BudgetSpent(Exception):
    """The time budget ran out inside `train`: the run stopped after `step` steps (checkpointed if it had an
    `out_dir`)."""

    def __init__(self, step: int, out_dir: Path | None = None):
        where = f" (checkpointed in {out_dir})" if out_dir is not None else " (nothing new to save)"
        super().__init__(f"time budget spent after step {step}{where}; run again to continue")
        self.step, self.out_dir = step, out_dir


_BUDGET: ContextVar[TimeBudget | None] = ContextVar("aspan_time_budget", default=None)


@contextmanager
def time_budget(budget: TimeBudget | None) -> Iterator[TimeBudget | None]:
    """Every `train` call inside the block (this thread or task only) honours `budget` (None: no limit)."""
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def current_budget() -> TimeBudget | None:
    """The budget `time_budget` set for this context, if any."""
    return _BUDGET.get()
