"""Training data as deterministic batches: a task, samples or an `aspan data` JSONL file, optionally mixed with
replayed samples (`Replay`); batch `s` depends only on (data, seed, batch size, s)."""
from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass
from typing import Sequence

from ..tasks import read_samples
from ..tasks.base import Sample, Task


def batch_seed(seed: int, index: int) -> int:
    """A hash-free seed for batch (or epoch) `index` of run `seed`: the same on every Python version and hash seed.

    Bit 62 keeps training seeds apart from the small seeds evaluation sets are drawn with (`task.generate(n, seed)`).
    """
    return (1 << 62) | (seed << 32) | index


def read_jsonl(path: str | os.PathLike) -> list[Sample]:
    """Samples from an `aspan data` JSONL file, each checked against its task (`aspan.tasks.read_samples`)."""
    return read_samples(path)


Data = Task | Sequence[Sample] | str | os.PathLike  # a task (generated on the fly), samples, or a JSONL file
REPLAY_STREAM = 1 << 31  # batch_seed index offset of the replay stream (steps stay far below 2**31)


@dataclass(frozen=True)
class Replay:
    """Fine-tuning data that keeps old lengths: each batch holds round(share * batch_size) samples of `replay`
    (e.g. the ID preset) and the rest from `data` (e.g. longer strings), so forgetting and extrapolation can be
    told apart. Both streams are deterministic functions of (seed, step), independent of each other."""

    data: Data  # the fine-tuning stream
    replay: Data  # the old distribution mixed back in
    share: float  # fraction of every batch drawn from `replay`, in [0, 1)

    def __post_init__(self):
        if not 0 <= self.share < 1:
            raise ValueError(f"replay share must be in [0, 1), got {self.share}")


def replay_count(share: float, batch_size: int) -> int:
    """Replay samples per batch: round(share * batch_size), at most batch_size - 1 (every batch keeps new data)."""
    return min(batch_size - 1, int(math.floor(share * batch_size + 0.5)))


class _Source:
    """One deterministic source of samples: `take(n, key)` depends only on (data, seed, n, key)."""

    def __init__(self, data: Data, batch_size: int, seed: int, index_offset: int = 0):
        if isinstance(data, (str, os.PathLike)):
            data = read_jsonl(data)
        self.task = data if isinstance(data, Task) else None
        self.samples = None if self.task else list(data)
        if self.samples is not None and not self.samples:
            raise ValueError("no training samples")
        bad = next((i for i, x in enumerate(self.samples or ()) if not isinstance(x, Sample)), None)
        if bad is not None:
            raise ValueError(f"training data: sample {bad} is a {type(self.samples[bad]).__name__}, not an aspan "
                             f"Sample (give a task, samples from task.generate(n), or an `aspan data` JSONL file)")
        self.batch_size, self.seed, self.index_offset = batch_size, seed, index_offset

    @property
    def steps_per_epoch(self) -> int | None:
        return None if self.samples is None or not self.batch_size else math.ceil(len(self.samples) / self.batch_size)

    def batch(self, step: int) -> list[Sample]:
        if not self.batch_size:
            return []
        if self.task is not None:
            return self.task.generate(self.batch_size, seed=batch_seed(self.seed, self.index_offset + step))
        epoch, k = divmod(step, self.steps_per_epoch)
        order = list(range(len(self.samples)))
        random.Random(batch_seed(self.seed, self.index_offset + epoch)).shuffle(order)
        return [self.samples[i] for i in order[k * self.batch_size : (k + 1) * self.batch_size]]

    def max_text_len(self) -> int:
        return self.task.max_text_len() if self.task else max(len(s.text) for s in self.samples)

    def alphabet(self) -> str:
        return self.task.alphabet if self.task else "".join(sorted({c for s in self.samples for c in s.text}))


class DataStream:
    """Deterministic batches: `batch(step)` depends only on (data, seed, batch_size, step); with a `Replay` the
    first batch_size - k samples come from its data and the last k from its replay set (k = `replay_count`)."""

    def __init__(self, data: Data | Replay, batch_size: int, seed: int):
        k = replay_count(data.share, batch_size) if isinstance(data, Replay) else 0
        main = data.data if isinstance(data, Replay) else data
        self.sources = [_Source(main, batch_size - k, seed)]
        if isinstance(data, Replay):
            self.sources.append(_Source(data.replay, k, seed, REPLAY_STREAM))
        self.task = self.sources[0].task
        self.samples = self.sources[0].samples
        self.batch_size, self.seed, self.n_replay = batch_size, seed, k

    @property
    def steps_per_epoch(self) -> int | None:
        """Steps per pass over a file source, or None for generated data."""
        return self.sources[0].steps_per_epoch

    def batch(self, step: int) -> list[Sample]:
        """The samples of training step `step`, from every source."""
        return [s for src in self.sources for s in src.batch(step)]

    def max_text_len(self) -> int:
        """The longest text any source produces."""
        return max(src.max_text_len() for src in self.sources)

    def alphabet(self) -> str:
        """Every character the stream's sources can produce, sorted."""
        return "".join(sorted(set("".join(src.alphabet() for src in self.sources))))
