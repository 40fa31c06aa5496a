"""A task split in two fixed, disjoint halves: samples for training and held-out samples for selection and report
sets, so that no held-out input is ever a training input, even where training covers a task's whole input space
(parity inputs of 1-10 bits: 2,046 strings).

A sample's side is a pure function of its key (by default its prompt): the first 8 bytes of the SHA-256 of the key,
as a fraction of 2^64, below `share` means held out. So every process, seed and Python version agrees on it, and a
task's training stream (`side="train"`) and its held-out sets (`side="held_out"`) are disjoint by construction.
Draws on the other side are redrawn from the same random stream; lengths with no input on a side are thereby never
drawn on it (a length of 1 bit has two inputs: both may fall on one side).

The held-out side can be cut further into `parts` equal slices of the same hash fraction (`part`), so that
several held-out sets (selection, learning curve, report) draw from disjoint pools; `distinct` draws a set without
repeats and outside given keys; `unseen` filters a stream of the texts of sets drawn before."""
from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Collection
from typing import Any, Iterator, Literal

from .base import Sample, Task

Side = Literal["train", "held_out"]
SIDES = ("train", "held_out")
MAX_REDRAWS = 100_000  # draws in a row on the other side before giving up (a split that leaves a side empty)


def fraction(key: str) -> float:
    """The key's place in [0, 1): the first 8 bytes of its SHA-256 as a fraction of 2^64 (the same in every process
    and Python version; no use of Python's salted `hash`)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64


def held_out(key: str, share: float) -> bool:
    """Whether the input with this key belongs to the held-out side of a split holding out `share` of inputs."""
    return fraction(key) < share


def part_of(key: str, share: float, parts: int) -> int | None:
    """Which of `parts` equal slices of the held-out side (by the same hash fraction) the key falls in; None on the
    training side."""
    f = fraction(key)
    return None if f >= share else min(int(f / share * parts), parts - 1)


def prompt_key(sample: Sample) -> str:
    """The key two samples share when they have the same prompt (its text before the target)."""
    return sample.text[: sample.prompt_len]


class SplitTask(Task):
    """`task` restricted to one side of the split: its stream skips every sample on the other side. Everything
    else (alphabet, solver, references, parameters of the samples) is `task`'s. `part` (index, count): on the
    held-out side, only the index-th of `count` equal slices of it (`part_of`); (0, 1) is the whole side."""

    def __init__(self, task: Task, side: Side, share: float, key: Callable[[Sample], str] = prompt_key,
                 part: tuple[int, int] = (0, 1)):
        if side not in SIDES:
            raise ValueError(f"side must be one of {', '.join(SIDES)}, got {side!r}")
        if not 0 < share < 1:
            raise ValueError(f"held-out share must be in (0, 1), got {share!r}")
        if not 0 <= part[0] < part[1] or (side == "train" and part != (0, 1)):
            raise ValueError(f"part must be (index, count) with 0 <= index < count, on the held-out side only; got "
                             f"{part!r} on the {side} side")
        self.task, self.side, self.share, self.key, self.part = task, side, share, key, tuple(part)
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

    def keeps(self, key: str) -> bool:
        """Whether an input with this key is on this task's side (and part)."""
        if self.side == "train":
            return not held_out(key, self.share)
        return part_of(key, self.share, self.part[1]) == self.part[0]

    def _stream(self, rng: random.Random) -> Iterator[Sample]:
        misses = 0
        for sample in self.task._stream(rng):
            if self.keeps(self.key(sample)):
                misses = 0
                yield sample
            else:
                misses += 1
                if misses > MAX_REDRAWS:
                    raise ValueError(f"{self.task!r}: no input on the {self.side} side of a {self.share:g} split "
                                     f"in {MAX_REDRAWS:,} draws")

    def __repr__(self) -> str:
        part = "" if self.part == (0, 1) else f", part={self.part!r}"
        return f"SplitTask({self.task!r}, side={self.side!r}, share={self.share:g}{part})"


def distinct(task: Task, n: int, seed: int, key: Callable[[Sample], str] = prompt_key,
             exclude: Collection[str] = (), pool: int | None = None) -> list[Sample]:
    """The first `n` samples of `task.stream(seed)` whose keys are new and not in `exclude`: a set without repeats,
    disjoint from `exclude`, sample for sample the stream's own draw where that has neither. `pool`: how many such
    keys the stream can yield at all (where the caller can count them); the set then stops there, short of `n`.
    ValueError after `MAX_REDRAWS` draws in a row that add nothing (a pool smaller than `n` nobody counted)."""
    out: list[Sample] = []
    seen, misses = set(exclude), 0
    want = n if pool is None else min(n, pool)
    stream = task.stream(seed)
    while len(out) < want:
        sample = next(stream)
        k = key(sample)
        if k in seen:
            misses += 1
            if misses > MAX_REDRAWS:
                raise ValueError(f"{task!r}: only {len(out)} distinct inputs of the {n} asked for in "
                                 f"{MAX_REDRAWS:,} draws in a row")
            continue
        seen.add(k)
        out.append(sample)
        misses = 0
    return out


def unseen(stream: Iterator[Sample], seen: Collection[str], this: str, other: str,
           hint: str = "lower the samples per set") -> Iterator[Sample]:
    """The samples of `stream` whose text is not in `seen` (the texts of the sets `other` names): a set drawn
    apart from those sets by construction, sample for sample the stream's own draw where none of its samples falls
    in them (repeats within the stream are kept). ValueError naming `this` (the set being drawn) and `other` once
    `MAX_REDRAWS` draws in a row fell in `seen` (a preset with too few distinct samples for both), ending in `hint`."""
    misses = 0
    for sample in stream:
        if sample.text not in seen:
            misses = 0
            yield sample
            continue
        misses += 1
        if misses > MAX_REDRAWS:
            raise ValueError(f"too few distinct samples for {this} apart from the {len(seen)} texts of {other} "
                             f"({MAX_REDRAWS:,} draws in a row fell among them): {hint}")
