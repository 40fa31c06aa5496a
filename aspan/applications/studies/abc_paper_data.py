"""The data of `aspan study abc --protocol paper` (`aspan.applications.studies.abc_paper`), as Duan & Shi (2023) draw
it: a permutation of [0, 2^number_bits] split 7:1 into training and held-out numbers, the padded layout of each task,
and the check, calibration and test sets of exactly-L-digit held-out numbers."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Sequence

from ... import tasks
from ...tasks.base import Sample, Task
from ...tasks.draws import OPERANDS, NumberDraw, build
from ...tokenization import CharTokenizer

if TYPE_CHECKING:
    from .abc_paper import PaperConfig

PAPER_TASKS = ("successor", "addition", "parity")
DATA_SEED, CHECK_SEED, TEST_SEED, CALIB_SEED = 2023, 40_000, 50_000, 60_000


@lru_cache(maxsize=2)
def number_split(bits: int, seed: int = DATA_SEED) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(training, check, test) numbers: a permutation of [0, 2^bits] split 7:1, the held-out eighth halved."""
    perm = list(range(2**bits + 1))
    random.Random(seed).shuffle(perm)
    cut = len(perm) * 7 // 8
    return tuple(perm[:cut]), tuple(perm[cut::2]), tuple(perm[cut + 1 :: 2])


def exact_length_numbers(length: int, k: int, pool: Sequence[int], limit: int, rng: random.Random) -> list[int]:
    """min(k, available) distinct numbers of exactly `length` digits: those of `pool` (held-out numbers of the
    permutation) and those above `limit` (outside the permutation), drawn uniformly from both together."""
    lo, hi = 10 ** (length - 1), 10**length
    inside = sorted(x for x in pool if lo <= x < hi)
    above = max(lo, limit + 1)
    total = len(inside) + max(0, hi - above)
    picked: set[int] = set()
    out = []
    while len(out) < min(k, total):
        i = rng.randrange(total)
        if i not in picked:
            picked.add(i)
            out.append(inside[i] if i < len(inside) else above + i - len(inside))
    return out


def padded_task(name: str, width: int) -> Task:
    """The study's task in the padded layout of `width` digits (parity: bits)."""
    if name == "successor":
        return tasks.get("successor", start=(0, 10**width - 1), numbers=2, layout="padded", width=width)
    if name == "addition":
        return tasks.get("addition", operands=2, digits=(1, width), layout="padded", width=width)
    if name == "parity":
        return tasks.get("parity", length=(1, width), format="scratchpad", layout="padded", width=width)
    raise ValueError(f"the paper protocol has no task {name!r}; choose from {', '.join(PAPER_TASKS)}")


def task_width(name: str, buckets: Sequence[int]) -> int:
    """The padded width that fits the longest test length: its digits, or for parity the bits of its numbers."""
    return len(format(10 ** max(buckets) - 1, "b")) if name == "parity" else max(buckets)


def held_out_samples(task: Task, length: int, k: int, pool: Sequence[int], limit: int, seed: int) -> list[Sample]:
    """Samples whose operands each have exactly `length` digits, drawn from held-out numbers (`exact_length_numbers`;
    the first operands distinct)."""
    rng = random.Random(seed)
    columns = [exact_length_numbers(length, k, pool, limit, rng) for _ in range(OPERANDS[task.name])]
    return [build(task, xs) for xs in zip(*columns)]


@dataclass
class PaperData:
    """Tokenizer, context and data of one task: the training draw, the check, calibration and test sets."""

    tokenizer: Any
    n_ctx: int
    train: NumberDraw
    check: list[Sample]
    calib: list[Sample]
    test: dict[int, list[Sample]]
    numbers: dict[str, tuple[int, ...]] = field(repr=False, default_factory=dict)


def paper_data(name: str, cfg: PaperConfig) -> PaperData:
    """Every set of one task, drawn from the number split (the same for every seed)."""
    from ... import models

    task = padded_task(name, task_width(name, cfg.buckets))
    train_numbers, check_numbers, test_numbers = number_split(cfg.number_bits)
    tok = CharTokenizer.for_alphabets(task.alphabet)
    limit = 2**cfg.number_bits
    draw = NumberDraw(task, train_numbers)
    return PaperData(
        tok, models.check_context(10**9, task, tok.offset), draw,
        held_out_samples(task, cfg.id_digits, cfg.n_check, check_numbers, 10**cfg.id_digits, CHECK_SEED),
        draw.generate(cfg.n_calib, seed=CALIB_SEED),
        {n: held_out_samples(task, n, cfg.n_test, test_numbers, limit, TEST_SEED + n) for n in cfg.buckets},
        {"train": train_numbers, "check": check_numbers, "test": test_numbers},
    )
