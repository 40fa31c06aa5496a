"""argparse `type=` functions: nonsense numbers, unusable devices and unusable output paths are refused while the
command line is parsed, before any model is loaded or any work starts (one line, exit 2)."""
from __future__ import annotations

import argparse
import math
from typing import Callable

from ..checks import check_device, check_output_dir, check_output_file, parse_shard


def _int(text: str) -> int:
    """An integer in ASCII digits (not `²` or `٣`, which `int` reads), of at most 30 characters."""
    try:
        if not text.isascii() or len(text) > 30:
            raise ValueError
        return int(text)
    except ValueError:
        shown = repr(text) if len(text) <= 30 else f"{text[:30]!r}... ({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"expected an integer, got {shown}") from None


def _float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return x


def positive_int(text: str) -> int:
    """An int >= 1."""
    n = _int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def nonneg_int(text: str) -> int:
    """An int >= 0."""
    n = _int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def finite_float(text: str) -> float:
    """Any finite float (no nan, no inf)."""
    return _float(text)


def nonneg_float(text: str) -> float:
    """A finite float >= 0."""
    x = _float(text)
    if x < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return x


def positive_float(text: str) -> float:
    """A finite float > 0."""
    x = _float(text)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return x


def unit_float(text: str) -> float:
    """A finite float in [0, 1] (an accuracy)."""
    x = _float(text)
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return x


def points_fraction(text: str) -> float:
    """Percentage points (a finite float >= 0, as `--id-budget PP` takes them) as a fraction: `1.5` -> 0.015."""
    return nonneg_float(text) / 100


def _wrap(check: Callable[[str], object], doc: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            check(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text

    parse.__name__ = check.__name__.removeprefix("check_")
    parse.__doc__ = doc
    return parse


device = _wrap(check_device, "A device this machine has (`cpu`, `cuda[:N]`, `mps`) or `auto`.")
output_file = _wrap(check_output_file, "A writable file path (not a directory).")
output_dir = _wrap(check_output_dir, "A writable directory path (not a file).")


def shard(text: str) -> tuple[int, int]:
    """`I/N`: shard I of N of a grid (0 <= I < N), as the tuple (I, N)."""
    try:
        return parse_shard(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def output_file_or_stdout(text: str) -> str:
    """`-` (standard output) or a writable file path."""
    return text if text == "-" else output_file(text)
