"""Multiplication (Spiegel et al. 2025, Appendix A.2): `a*b=` -> partial products `p_0+...+p_{m-1}=r`, all LSD-first.

`p_j = a * b_j * 10^j` zero padded to width len(a)+len(b); `r = a*b` canonical. Digit k of p_j (i = k-j):
i < 0 (shift zero) or i > len(a) (padding past the last carry) -> no references; i = 0 -> {a_0, b_j};
otherwise {a_i (if it exists), a_{i-1}, b_j, p_j[k-1]}. Digit k of r references digits k and k-1 of every
partial product and r[k-1]. The factor-b range is capped at 10 digits: the carry of summing up to 10 partial
products is at most 9, so r[k-1] determines it.
"""
from __future__ import annotations

import random
from typing import Any

from .base import Sample, Task, check_range
from .numbers import DIGITS, digit_swaps, lsd, parse_lsd, random_number


class Multiplication(Task):
    """Long multiplication of a factor with `digits` (min, max) digits by one with `digits_b` (default: `digits`)."""

    name = "multiplication"
    instruction = ("Multiply the numbers; digits are written least-significant first. "
                   "Write every partial product, then their sum.")
    length_param = "digits"

    def __init__(self, digits: tuple[int, int] | int = (1, 3), digits_b: tuple[int, int] | int | None = None):
        self.digits = check_range("digits", digits, minimum=1)
        self.digits_b = self.digits if digits_b is None else check_range("digits_b", digits_b, minimum=1)
        if self.digits_b[1] > 10:
            raise ValueError(
                f"digits_b (defaults to digits) allows at most 10 digits, got {self.digits_b}: "
                "the carry of more than 10 partial products does not follow from the previous product digit"
            )

    def params(self) -> dict[str, Any]:
        return {"digits": list(self.digits), "digits_b": list(self.digits_b)}

    @property
    def alphabet(self) -> str:
        return "".join(sorted("*+=" + DIGITS))

    def max_text_len(self) -> int:
        la, lb = self.digits[1], self.digits_b[1]
        width = la + lb
        return la + lb + 2 + lb * (width + 1) + width

    def _sample(self, rng: random.Random) -> Sample:
        a = random_number(rng, rng.randint(*self.digits))
        b = random_number(rng, rng.randint(*self.digits_b))
        return self.build(a, b)

    def realised(self, prompt: str, target: str) -> dict[str, list[int]]:
        sa, sb = prompt[:-1].split("*")
        return {"digits": [len(str(parse_lsd(sa)))], "digits_b": [len(str(parse_lsd(sb)))]}

    def _build(self, prompt: str, target: str) -> Sample:
        sa, sb = prompt[:-1].split("*")
        return self.build(parse_lsd(sa), parse_lsd(sb))

    def build(self, a: int, b: int) -> Sample:
        """The sample for `a*b=` (any non-negative factors, b of at most 10 digits; for hand-made examples)."""
        if not all(isinstance(x, int) and x >= 0 for x in (a, b)) or len(str(b)) > 10:
            raise ValueError(f"build needs non-negative int factors, b of at most 10 digits, got {a!r}, {b!r}")
        sa, sb = lsd(a), lsd(b)
        la, lb, width = len(sa), len(sb), len(sa) + len(sb)
        prompt = f"{sa}*{sb}="
        partials = [lsd(a * int(d) * 10**j, width) for j, d in enumerate(sb)]
        result = lsd(a * b)
        plen = len(prompt)
        p_pos = [[plen + j * (width + 1) + k for k in range(width)] for j in range(lb)]
        r0 = plen + lb * (width + 1)
        refs: list[tuple[int, ...]] = []
        for j in range(lb):
            b_j = la + 1 + j
            for k in range(width):
                i = k - j
                if i < 0 or i > la:
                    r: list[int] = []
                elif i == 0:
                    r = [0, b_j]
                else:
                    r = [i - 1, b_j, p_pos[j][k - 1]] + ([i] if i < la else [])
                refs.append(tuple(sorted(r)))
            refs.append(())  # the '+' after p_j, or the '=' after the last one
        for k in range(len(result)):
            r = [p[d] for p in p_pos for d in (k - 1, k) if d >= 0] + ([r0 + k - 1] if k > 0 else [])
            refs.append(tuple(sorted(r)))
        text = prompt + "+".join(partials) + "=" + result
        return Sample(text, plen, tuple(refs), task=self.name, params=self.params())

    def solve(self, prompt: str) -> str:
        """Partial products and product of canonical LSD-first factors `a*b=` (any number of digits)."""
        if not prompt.endswith("=") or prompt.count("=") != 1 or prompt.count("*") != 1:
            raise ValueError(f"multiplication prompt must be 'a*b=', got {prompt!r}")
        sa, sb = prompt[:-1].split("*")
        a, b = parse_lsd(sa), parse_lsd(sb)
        width = len(sa) + len(sb)
        partials = []
        for j, d in enumerate(sb):
            digits, carry = [], 0  # schoolbook: a times one digit of b, shifted by j
            for x in sa:
                carry, digit = divmod(int(x) * int(d) + carry, 10)
                digits.append(str(digit))
            p = "0" * j + "".join(digits) + str(carry)
            partials.append(p.ljust(width, "0"))
        return "+".join(partials) + "=" + lsd(a * b)

    def legal_swaps(self, prompt: str, pos: int) -> str:
        return digit_swaps(prompt[pos])


TASK = Multiplication
PRESETS: dict[str, dict[str, Any]] = {
    "id": {"digits": (1, 3), "digits_b": (1, 3)},
    "ood": {"digits": (4, 6), "digits_b": (4, 6)},
}
