"""LSD-first number helpers shared by the arithmetic tasks (addition, multiplication, successor)."""
from __future__ import annotations

import random
from typing import Literal, get_args

DIGITS = "0123456789"


def lsd(x: int, width: int = 0) -> str:
    """`x` written least-significant digit first, zero padded to `width` digits."""
    return str(x).zfill(width)[::-1]


def parse_lsd(s: str, canonical: bool = True) -> int:
    """Value of an LSD-first digit string; ValueError if empty, not digits, or (canonical) with a leading zero."""
    if not s or any(c not in DIGITS for c in s):
        raise ValueError(f"{s!r} is not a number")
    if canonical and len(s) > 1 and s[-1] == "0":
        raise ValueError(f"{s!r} has a leading zero (it is written LSD-first)")
    return int(s[::-1])


def random_number(rng: random.Random, n_digits: int) -> int:
    """A uniform number with exactly `n_digits` digits (0 counts as a one-digit number)."""
    return rng.randint(0 if n_digits == 1 else 10 ** (n_digits - 1), 10**n_digits - 1)


def digit_swaps(c: str) -> str:
    """The other digits if `c` is a digit, else "" (sufficiency perturbations: a digit for a digit)."""
    return DIGITS.replace(c, "") if c in DIGITS else ""


Layout = Literal["lsd", "padded"]
LAYOUTS: tuple[str, ...] = get_args(Layout)


def check_layout(layout: str, width: int | None, longest: int) -> int | None:
    """The width of a valid layout: "lsd" (the default: every number LSD-first, canonical) takes no width; "padded"
    (Duan & Shi 2023, Section 4: operands zero-padded on the left to `width` digits and written most significant
    digit first, the answer least significant digit first, so every digit keeps its position at every length)
    needs a width of at least `longest`, the most digits an operand can have."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    if layout == "lsd":
        if width is not None:
            raise ValueError(f"width is a parameter of layout='padded' only, got width={width!r}")
        return None
    if isinstance(width, bool) or not isinstance(width, int) or width < longest:
        raise ValueError(f"layout='padded' needs an int width >= {longest} (the longest operand), got {width!r}")
    return width


def padded_digits(s: str, width: int) -> int:
    """The value of a most-significant-first number zero-padded to exactly `width` digits; ValueError otherwise."""
    if len(s) != width or any(c not in DIGITS for c in s):
        raise ValueError(f"{s!r} is not a {width}-digit zero-padded number")
    return int(s)
