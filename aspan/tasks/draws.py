"""Tasks that draw their samples from other tasks: `LengthMix` (the length first, uniformly, then the sample) and
`NumberDraw` (the operands of a padded-layout task from a fixed pool of numbers), as the ABC studies train and test
on them."""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from .base import Sample, Task


class LengthMix(Task):
    """Samples whose length (digit count) is drawn uniformly from `parts` first, then the sample from that part:
    uniform numbers up to 999999 would be 90 % six-digit."""

    def __init__(self, parts: Sequence[Task]):
        if not parts:
            raise ValueError("LengthMix needs at least one task")
        self.parts = list(parts)
        self.name = self.parts[0].name
        self.open_ended = self.parts[0].open_ended

    def params(self) -> dict[str, Any]:
        return {"mix": [p.params() for p in self.parts]}

    @property
    def alphabet(self) -> str:
        return "".join(sorted(set("".join(p.alphabet for p in self.parts))))

    def max_text_len(self) -> int:
        return max(p.max_text_len() for p in self.parts)

    def _sample(self, rng: random.Random) -> Sample:
        return self.parts[rng.randrange(len(self.parts))]._sample(rng)

    def solve(self, prompt: str, *args: Any) -> str:
        return self.parts[0].solve(prompt, *args)

    def solve_like(self, prompt: str, target: str) -> str:
        return self.parts[0].solve_like(prompt, target)

    def legal_swaps(self, prompt: str, pos: int) -> str:
        return self.parts[0].legal_swaps(prompt, pos)


OPERANDS = {"successor": 1, "addition": 2, "parity": 1}  # the numbers one sample of each such task is built from


def build(task: Task, xs: Sequence[int]) -> Sample:
    """The sample of the numbers `xs` (one per operand, OPERANDS) in `task`'s padded layout (successor: `xs[0]` and
    its successor)."""
    if task.name == "successor":
        return task.build(xs[0], 2)
    return task.build(list(xs)) if task.name == "addition" else task.build(xs[0])


class NumberDraw(Task):
    """Samples of a padded task (successor, addition, parity) whose operands are drawn uniformly and independently
    from `numbers`."""

    def __init__(self, base: Task, numbers: Sequence[int]):
        if base.name not in OPERANDS:
            raise ValueError(f"NumberDraw builds {', '.join(OPERANDS)} samples, not {base.name}")
        self.base, self.numbers = base, list(numbers)
        self.name, self.open_ended = base.name, base.open_ended

    def params(self) -> dict[str, Any]:
        return {**self.base.params(), "numbers": len(self.numbers)}

    @property
    def alphabet(self) -> str:
        return self.base.alphabet

    def max_text_len(self) -> int:
        return self.base.max_text_len()

    def _sample(self, rng: random.Random) -> Sample:
        return build(self.base, [rng.choice(self.numbers) for _ in range(OPERANDS[self.name])])

    def solve(self, prompt: str, *args: Any) -> str:
        return self.base.solve(prompt, *args)

    def solve_like(self, prompt: str, target: str) -> str:
        return self.base.solve_like(prompt, target)

    def legal_swaps(self, prompt: str, pos: int) -> str:
        return self.base.legal_swaps(prompt, pos)
