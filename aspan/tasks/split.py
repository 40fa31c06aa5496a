"""A task split in two fixed, disjoint halves: samples for training and held-out samples for selection and report
sets, so that no held-out input is ever a training input, even where training covers a task's whole input space
(parity inputs of 1-10 bits: 2,046 strings).

A sample's side is a pure function of its key (by default its prompt): the first 8 bytes of the SHA-256 of the key,
as a fraction of 2^64, below `share` means held out. So every process, seed and Python version agrees on it, and a
task's training stream (`side="train"`) and its held-out sets (`side="held_out"`) are disjoint by construction.
Draws on the other side are redrawn from the same random stream; lengths with no input on a side are thereby never
drawn on it (a length of 1 bit has two inputs: both may fall on one side)."""
from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any, Iterator, Literal

from .base import Sample, Task

Side = Literal["train", "held_out"]
SIDES = ("train", "held_out")
MAX_REDRAWS = 100_000  # draws in a row on the other side before giving up (a split that leaves a side empty)


def held_out(key: str, share: float) -> bool:
    """Whether the input with this key belongs to the held-out side of a split holding out `share` of inputs."""
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    return h / 2**64 < share


def prompt_key(sample: Sample) -> str:
    """The key two samples share when they have the same prompt (its text before the target)."""
    return sample.text[: sample.prompt_len]


class SplitTask(Task):
    """`task` restricted to one side of the split: its stream skips every sample on the other side. Everything
    else (alphabet, solver, references, parameters of the samples) is `task`'s."""

    def __init__(self, task: Task, side: Side, share: float, key: Callable[[Sample], str] = prompt_key):
        if side not in SIDES:
            raise ValueError(f"side must be one of {', '.join(SIDES)}, got {side!r}")
        if not 0 < share < 1:
            raise ValueError(f"held-out share must be in (0, 1), got {share!r}")
        self.task, self.side, self.share, self.key = task, side, share, key
        self.name = task.name
        for attr in ("open_ended", "instruction", "length_param", "length_is_target", "demo_ood", "quick_ood"):
            setattr(self, attr, getattr(task, attr))

    def params(self) -> dict[str, Any]:
        return self.task.params()

    @property
    def alphabet(self) -> str:
        return self.task.alphabet

    def max_text_len(self) -> int:
        return self.task.max_text_len()

    def solve(self, prompt: str) -> str:
        return self.task.solve(prompt)

    def solve_like(self, prompt: str, target: str) -> str:
        return self.task.solve_like(prompt, target)

    def legal_swaps(self, prompt: str, pos: int) -> str:
        return self.task.legal_swaps(prompt, pos)

    def _build(self, prompt: str, target: str) -> Sample:
        return self.task._build(prompt, target)

    def _stream(self, rng: random.Random) -> Iterator[Sample]:
        want = self.side == "held_out"
        misses = 0
        for sample in self.task._stream(rng):
            if held_out(self.key(sample), self.share) == want:
                misses = 0
                yield sample
            else:
                misses += 1
                if misses > MAX_REDRAWS:
                    raise ValueError(f"{self.task!r}: no input on the {self.side} side of a {self.share:g} split "
                                     f"in {MAX_REDRAWS:,} draws")

    def __repr__(self) -> str:
        return f"SplitTask({self.task!r}, side={self.side!r}, share={self.share:g})"
