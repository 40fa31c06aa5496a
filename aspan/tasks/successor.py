"""Successor (Spiegel et al. 2025, Appendix E.5; Duan & Shi 2023): consecutive integers, LSD-first, joined by `,`.

The prompt is the first number and `,`; the target the rest of the series. Digit i of a number references
digits i and i-1 of the previous number (where they exist) and digit i-1 of the current one; `,` nothing.
The prompt does not fix the series length: `solve(prompt, length)` gives the first `length` target characters.

`layout="padded", width=W` is Duan & Shi's (2023, Section 4) successor: one number zero-padded on the left to W
digits, most significant digit first, then `,`, and its successor least significant digit first, W + 1 digits
(`0129,03100`); the references are the same digits as above, now at fixed positions.
"""
from __future__ import annotations

import random
from typing import Any

from .base import Sample, Task, check_range
from .numbers import DIGITS, Layout, check_layout, digit_swaps, lsd, padded_digits, parse_lsd


def _increment(s: str) -> str:
    """Add one to an LSD-first digit string (schoolbook carry)."""
    out = list(s)
    for i, c in enumerate(out):
        if c != "9":
            out[i] = str(int(c) + 1)
            return "".join(out)
        out[i] = "0"
    return "".join(out) + "1"


class Successor(Task):
    """Count on from a number in `start` (min, max); `numbers` (min, max) is the series length (first included)."""

    name = "successor"
    open_ended = True
    instruction = "Continue the series of consecutive numbers; digits are written least-significant first."
    length_param = "numbers"

    def __init__(self, start: tuple[int, int] | int = (1, 90), numbers: tuple[int, int] | int = (2, 4),
                 layout: Layout = "lsd", width: int | None = None):
        self.start = check_range("start", start, minimum=0)
        self.numbers = check_range("numbers", numbers, minimum=2)
        self.layout, self.width = layout, check_layout(layout, width, len(str(self.start[1])))
        if self.width is not None and self.numbers != (2, 2):
            raise ValueError(f"layout='padded' is one number and its successor: numbers must be 2, got {numbers!r}")

    def params(self) -> dict[str, Any]:
        p = {"start": list(self.start), "numbers": list(self.numbers)}
        return p if self.width is None else {**p, "layout": self.layout, "width": self.width}

    @property
    def alphabet(self) -> str:
        return "".join(sorted("," + DIGITS))

    def max_text_len(self) -> int:
        hi, count = self.start[1], self.numbers[1]
        if self.width is not None:
            return 2 * self.width + 2
        return sum(len(str(hi + m)) for m in range(count)) + count - 1

    def _sample(self, rng: random.Random) -> Sample:
        start = rng.randint(*self.start)
        return self.build(start, rng.randint(*self.numbers))

    def realised(self, prompt: str, target: str) -> dict[str, list[int]]:
        if self.width is not None:
            return {"start": [int(prompt[:-1])]}
        return {"start": [parse_lsd(prompt[:-1])], "numbers": [target.count(",") + 2]}

    def _build(self, prompt: str, target: str) -> Sample:
        if self.width is not None:  # the number MSD-first, zero-padded (read back from a file: `rebuild`)
            return self._build_padded(int(prompt[:-1]))
        return self.build(parse_lsd(prompt[:-1]), target.count(",") + 2)

    def build(self, start: int, count: int) -> Sample:
        """The sample for the series start, start+1, ..., of `count` (>= 2) numbers (for hand-made examples)."""
        if not isinstance(start, int) or start < 0 or not isinstance(count, int) or count < 2:
            raise ValueError(f"build needs start >= 0 and count >= 2, got {start!r}, {count!r}")
        if self.width is not None:
            return self._build_padded(start)
        parts = [lsd(start + m) for m in range(count)]
        starts = [sum(len(p) + 1 for p in parts[:m]) for m in range(count)]
        refs: list[tuple[int, ...]] = []
        for m in range(1, count):
            prev, cur = starts[m - 1], starts[m]
            if m > 1:
                refs.append(())  # the ',' before this number
            for i in range(len(parts[m])):
                r = [prev + d for d in (i - 1, i) if 0 <= d < len(parts[m - 1])] + ([cur + i - 1] if i > 0 else [])
                refs.append(tuple(sorted(r)))
        return Sample(",".join(parts), starts[1], tuple(refs), task=self.name, params=self.params())

    def _build_padded(self, x: int) -> Sample:
        """`x` MSD-first zero-padded to `width`, `,`, `x + 1` LSD-first in `width + 1` digits. Digit d of `x`
        (0 = least significant) sits at `width - 1 - d`."""
        W = self.width
        if x >= 10**W:
            raise ValueError(f"build: the number must have at most width={W} digits, got {x!r}")
        refs = [tuple(sorted([W - 1 - d for d in (i - 1, i) if 0 <= d < W] + ([W + i] if i > 0 else [])))
                for i in range(W + 1)]  # output digit i-1 sits at W + 1 + i - 1
        return Sample(str(x).zfill(W) + "," + lsd(x + 1, W + 1), W + 1, tuple(refs), task=self.name,
                      params=self.params())

    def solve(self, prompt: str, length: int | None = None) -> str:
        """The first `length` target characters after `prompt` (a canonical LSD-first number and ',').

        Without `length`: the longest target this task generates, the next `numbers[1] - 1` numbers.
        """
        if not prompt.endswith(",") or prompt.count(",") != 1:
            raise ValueError(f"successor prompt must be a number followed by ',', got {prompt!r}")
        if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 0):
            raise ValueError(f"length must be a non-negative int, got {length!r}")
        if self.width is not None:  # one successor: the MSD-first number reversed, incremented
            padded_digits(prompt[:-1], self.width)
            return _increment(prompt[-2::-1]).ljust(self.width + 1, "0")[:length]
        parse_lsd(prompt[:-1])
        x = prompt[:-1]
        if length is None:
            out = []
            for _ in range(self.numbers[1] - 1):
                x = _increment(x)
                out.append(x)
            return ",".join(out)
        text = ""
        while len(text) < length:
            x = _increment(x)
            text += ("," if text else "") + x
        return text[:length]

    def solve_like(self, prompt: str, target: str) -> str:
        """`solve` on the target's length: generated output is compared on that length."""
        return self.solve(prompt, len(target))

    def legal_swaps(self, prompt: str, pos: int) -> str:
        return digit_swaps(prompt[pos])


TASK = Successor
PRESETS: dict[str, dict[str, Any]] = {
    "id": {"start": (1, 90), "numbers": (2, 4)},
    "ood": {"start": (100, 900), "numbers": (5, 6)},
}
