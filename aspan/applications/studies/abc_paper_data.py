"""The settings (`PaperConfig`) and the data of `aspan study abc --protocol paper`
(`aspan.applications.studies.abc_paper`), the data as Duan & Shi (2023) draw them: a permutation of
[0, 2^number_bits] split 7:1 into training and held-out numbers, the padded layout of each task, and the check,
calibration and test sets of exactly-L-digit held-out numbers."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

from ... import tasks
from ...tasks.base import Sample, Task
from ...tasks.draws import OPERANDS, NumberDraw, build
from ...tokenization import CharTokenizer
from . import protocol_fields

PAPER_TASKS = ("successor", "addition", "parity")
PAPER_CONDITIONS = ("vanilla", "abc", "abs")
DEFAULT_PLAN = ("successor:vanilla", "successor:abc", "addition:vanilla", "addition:abc", "parity:abs")
DATA_SEED, CHECK_SEED, TEST_SEED, CALIB_SEED = 2023, 40_000, 50_000, 60_000


@dataclass(frozen=True)
class PaperConfig:
    """Settings of the paper-protocol study (defaults: the CPU size; `quick()` for tests; configs/ for others)."""

    plan: tuple[str, ...] = DEFAULT_PLAN  # "task:condition" runs (abc needs the task's vanilla run)
    seeds: tuple[int, ...] = (0, 1, 2)
    lr: float = 1e-3
    max_steps: int = 3000  # cap of every training until fit (vanilla and ABS)
    check_every: int = 100  # ID check interval (steps)
    fit_exact: float = 0.99  # ID exact on the check set that counts as "interpolates"
    retrain_fraction: float = 0.1  # ABC retrains until it fits, at most floor(fraction x the base's steps)
    batch_size: int = 64
    warmup: int = 100
    n_layers: int = 2
    calib_layer: int = -1  # the layer Algorithm 1 reads (-1: the last, the paper's; see `calibration_layer`)
    n_heads: int = 4
    d_model: int = 64
    positional: str = "learned"  # vanilla and ABC models (absolute positions, as the paper's sinusoidal ones)
    abc_positional: str = "learned"  # ABC's retrained models ("none": the bias alone says where to read)
    abs_positional: str = "none"  # ABS models (the paper's NoPE + w = 1)
    abs_width: int = 1  # ABS window half-width w
    number_bits: int = 20  # numbers of [0, 2^number_bits]
    id_digits: int = 6  # length of the held-out ID check set
    buckets: tuple[int, ...] = (6, 10, 20, 60)  # test lengths (decimal digits; parity: those numbers in binary)
    n_test: int = 1000  # at most this many samples per test length
    n_check: int = 500  # ID check samples
    n_calib: int = 512  # ABC calibration samples (training numbers; only the correctly answered ones count)
    correct_only: bool = True  # ABC averages over correctly answered samples only (False: all, for --quick)
    eval_batch_size: int = 100
    device: str = "cpu"
    # False: delete a saved model once nothing in the study needs it (its position rows recorded and, for a vanilla
    # base, its ABC row written), so a run directory carried between machines stays small (configs/gpu)
    keep_models: bool = True

    @classmethod
    def toml_fields(cls, raw: dict[str, Any], path: Any = None) -> dict[str, Any]:
        """The fields a `--config` file sets (`aspan.config.load_config`'s hook): its keys, less a `[slurm]` table
        (the resources of `--launcher slurm`, `aspan.applications.launch`) and a `protocol = "paper"` line
        (`protocol_fields`)."""
        return protocol_fields(raw, "paper")

    @classmethod
    def quick(cls, **kw: Any) -> "PaperConfig":
        """A tiny run for tests (seconds): numbers of [0, 64], widths 4, every base counts as fitted."""
        base = dict(seeds=(0,), lr=3e-3, max_steps=8, check_every=4, fit_exact=0.0, batch_size=8, warmup=2,
                    n_layers=2, n_heads=2, d_model=16, number_bits=6, id_digits=2, buckets=(2, 3, 4), n_test=6,
                    n_check=8, n_calib=8, correct_only=False, eval_batch_size=32)
        return cls(**{**base, **kw})

    def runs(self) -> list[tuple[str, str]]:
        """The plan as (task, variant) pairs, from its `TASK:VARIANT` entries."""
        return [tuple(p.split(":", 1)) for p in self.plan]  # type: ignore[misc]

    def check(self) -> None:
        """ValueError on impossible settings, before any work."""
        runs = self.runs()
        bad = [p for p, (t, c) in zip(self.plan, runs) if ":" not in p or t not in PAPER_TASKS
               or c not in PAPER_CONDITIONS]
        if bad or not runs:
            raise ValueError(f"plan must be a non-empty list of TASK:CONDITION with TASK in {', '.join(PAPER_TASKS)} "
                             f"and CONDITION in {', '.join(PAPER_CONDITIONS)}, got {list(self.plan)}")
        for t, c in runs:
            if c == "abc" and (t, "vanilla") not in runs:
                raise ValueError(f"{t}:abc calibrates on the vanilla model: add {t}:vanilla to the plan")
        for name in ("max_steps", "check_every", "batch_size", "n_layers", "n_heads", "d_model", "abs_width",
                     "number_bits", "id_digits", "n_test", "n_check", "n_calib", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.seeds or not 0 < self.lr < math.inf or self.warmup < 0:
            raise ValueError("seeds must be non-empty, lr finite and > 0, and warmup >= 0")
        if not -self.n_layers <= self.calib_layer < self.n_layers:
            raise ValueError(f"calib_layer must name one of the {self.n_layers} layers (-1: the last), "
                             f"got {self.calib_layer}")
        if not 0 <= self.fit_exact <= 1 or not 0 < self.retrain_fraction <= 10:
            raise ValueError("fit_exact must be in [0, 1] and retrain_fraction in (0, 10]")
        longest = len(str(2**self.number_bits))
        if not self.buckets or min(self.buckets) < 1 or max(self.buckets) < longest:
            raise ValueError(f"buckets must be lengths >= 1 whose longest fits the training numbers ({longest} "
                             f"digits for 2^{self.number_bits}), got {list(self.buckets)}")
        if self.id_digits > longest:
            raise ValueError(f"id_digits must be at most {longest} (the digits of 2^{self.number_bits})")
        for name in ("positional", "abc_positional", "abs_positional"):
            if getattr(self, name) not in ("rotary", "learned", "alibi", "none"):
                raise ValueError(f"{name} must be rotary, learned, alibi or none, got {getattr(self, name)!r}")


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
