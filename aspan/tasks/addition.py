"""Addition (Spiegel et al. 2025, Appendix A.3): LSD-first operands joined by `+`, then `=`, then their LSD-first sum.

Sum digit i references digit i and i-1 of every operand that has them and sum digit i-1 (the incoming carry is
`(prev_sum_digit - sum of prev operand digits) mod 10`, unique for <= 10 operands).

`layout="padded", width=W` writes the sample as Duan & Shi (2023, Section 4) do: every operand zero-padded on the
left to W digits, most significant digit first, and the sum least significant digit first, W + 1 digits
(`0123+0748=17800`); the references are the same digits, now at fixed positions.
"""
from __future__ import annotations

import random
from typing import Any

from .base import Sample, Task, check_range
from .numbers import DIGITS, Layout, check_layout, digit_swaps, lsd, padded_digits, parse_lsd, random_number


class Addition(Task):
    """Sum of `operands` (2..10) numbers of `digits` (min, max) digits each; `padding` zero pads to a common length.

    With padding every operand of a sample is zero padded to that sample's longest operand, L digits, and the sum
    to L + 1 digits.
    """

    name = "addition"
    instruction = "Add the numbers; digits are written least-significant first."
    length_param = "digits"

    def __init__(self, operands: int = 2, digits: tuple[int, int] | int = (1, 4), padding: bool = False,
                 layout: Layout = "lsd", width: int | None = None):
        if isinstance(operands, bool) or not isinstance(operands, int) or not 2 <= operands <= 10:
            raise ValueError(f"operands must be an int from 2 to 10, got {operands!r}")
        if not isinstance(padding, bool):
            raise ValueError(f"padding must be a bool, got {padding!r}")
        self.operands = operands
        self.digits = check_range("digits", digits, minimum=1)
        self.padding = padding
        self.layout, self.width = layout, check_layout(layout, width, self.digits[1])
        if self.width is not None and padding:
            raise ValueError("padding pads to each sample's longest operand; layout='padded' pads to width: pick one")

    def params(self) -> dict[str, Any]:
        p = {"operands": self.operands, "digits": list(self.digits), "padding": self.padding}
        return p if self.width is None else {**p, "layout": self.layout, "width": self.width}

    @property
    def alphabet(self) -> str:
        return "".join(sorted("+=" + DIGITS))

    def max_text_len(self) -> int:
        hi = self.digits[1] if self.width is None else self.width
        return self.operands * (hi + 1) + hi + 1

    def _sample(self, rng: random.Random) -> Sample:
        lens = [rng.randint(*self.digits) for _ in range(self.operands)]
        return self.build([random_number(rng, d) for d in lens])

    def realised(self, prompt: str, target: str) -> dict[str, list[int]]:
        parts = prompt[:-1].split("+")
        xs = [int(p) for p in parts] if self.width is not None else \
            [parse_lsd(p, canonical=not self.padding) for p in parts]
        return {"digits": [len(str(x)) for x in xs]}

    def _build(self, prompt: str, target: str) -> Sample:
        parts = prompt[:-1].split("+")
        if self.width is not None:  # MSD-first, zero-padded operands
            return self.build([int(p) for p in parts])
        return self.build([parse_lsd(p, canonical=not self.padding) for p in parts])

    def build(self, xs: list[int]) -> Sample:
        """The sample adding the `operands` numbers `xs` (any size; for hand-made examples)."""
        if len(xs) != self.operands or any(not isinstance(x, int) or x < 0 for x in xs):
            raise ValueError(f"build needs {self.operands} non-negative ints, got {xs!r}")
        if self.width is not None:
            return self._build_padded(xs)
        width = max(len(str(x)) for x in xs) if self.padding else 0
        parts = [lsd(x, width) for x in xs]
        total = lsd(sum(xs), width + 1 if self.padding else 0)
        starts = [sum(len(p) + 1 for p in parts[:k]) for k in range(len(parts))]
        prompt_len = starts[-1] + len(parts[-1]) + 1
        refs = []
        for i in range(len(total)):
            r = [st + d for st, p in zip(starts, parts) for d in (i - 1, i) if 0 <= d < len(p)]
            if i > 0:
                r.append(prompt_len + i - 1)
            refs.append(tuple(sorted(r)))
        text = "+".join(parts) + "=" + total
        return Sample(text, prompt_len, tuple(refs), task=self.name, params=self.params())

    def _build_padded(self, xs: list[int]) -> Sample:
        """Operands MSD-first, zero-padded to `width`; the sum LSD-first, `width + 1` digits. Digit d (0 = least
        significant) of operand k sits at `start_k + width - 1 - d`."""
        W = self.width
        if any(x >= 10**W for x in xs):
            raise ValueError(f"build: every operand must have at most width={W} digits, got {xs!r}")
        starts = [k * (W + 1) for k in range(self.operands)]
        prompt_len = self.operands * (W + 1)
        refs = []
        for i in range(W + 1):
            r = [st + W - 1 - d for st in starts for d in (i - 1, i) if 0 <= d < W]
            refs.append(tuple(sorted(r + ([prompt_len + i - 1] if i > 0 else []))))
        text = "+".join(str(x).zfill(W) for x in xs) + "=" + lsd(sum(xs), W + 1)
        return Sample(text, prompt_len, tuple(refs), task=self.name, params=self.params())

    def solve(self, prompt: str) -> str:
        """The LSD-first sum, added column by column with carries (independent of the generator's `int` sums).

        Operands must number `operands` and be canonical (with padding: of equal length, the sum one digit longer).
        """
        if not prompt.endswith("=") or prompt.count("=") != 1:
            raise ValueError(f"addition prompt must end with its only '=', got {prompt!r}")
        parts = prompt[:-1].split("+")
        if len(parts) != self.operands:
            raise ValueError(f"addition prompt has {len(parts)} operands, task has {self.operands}")
        if self.width is not None:  # MSD-first operands: reversed, they add as LSD-first columns
            for p in parts:
                padded_digits(p, self.width)
            return _add_columns([p[::-1] for p in parts]).ljust(self.width + 1, "0")
        for p in parts:
            if not p or any(c not in DIGITS for c in p):
                raise ValueError(f"{p!r} is not a number")
            if not self.padding and len(p) > 1 and p[-1] == "0":
                raise ValueError(f"{p!r} has a leading zero (it is written LSD-first)")
        if self.padding and len({len(p) for p in parts}) != 1:
            raise ValueError(f"padded addition operands must have equal length: {prompt!r}")
        digits = _add_columns(parts)
        if self.padding:
            return digits + "0" * (len(parts[0]) + 1 - len(digits))
        return digits.rstrip("0") or "0"

    def legal_swaps(self, prompt: str, pos: int) -> str:
        return digit_swaps(prompt[pos])


def _add_columns(parts: list[str]) -> str:
    """Schoolbook addition of LSD-first digit strings: column i sums digit i of each operand and the carry."""
    out, carry = [], 0
    for i in range(max(len(p) for p in parts)):
        column = carry + sum(DIGITS.index(p[i]) for p in parts if i < len(p))
        out.append(DIGITS[column % 10])
        carry = column // 10
    while carry:
        out.append(DIGITS[carry % 10])
        carry //= 10
    return "".join(out)


TASK = Addition
PRESETS: dict[str, dict[str, Any]] = {
    "id": {"operands": 2, "digits": (1, 4)},
    "ood": {"operands": 2, "digits": (5, 10)},
}
