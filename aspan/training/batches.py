"""Training batches off the step: `aspan.batching.lean_batch` (tokens, labels and mask only, built from Python lists
with one tensor per field) and `Prefetcher`, which makes the batches of the coming steps in a background thread.

Every batch stays a pure function of (data settings, seed, batch size, step): the prefetcher only makes them
earlier, so a resumed run sees the same batches whether or not batches were made ahead.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from ..batching import Batch, lean_batch, target_count, token_count  # noqa: F401 (lean_batch: defined there)
from ..tasks.base import Sample
from ..tokenization import Tokenizer
from .loss import train_batch

PREFETCH_THREAD = "aspan-prefetch"  # the name of the thread that makes batches ahead


class StepBatch(NamedTuple):
    """What one training step needs: this process's share of the batch, and the global counts the loss is divided
    by and the throughput counts (known on the host, so the step reads nothing back from the device)."""

    tokens: Int[Tensor, "batch pos"]  # token ids, right-padded with the tokenizer's pad id
    labels: Int[Tensor, "batch pos"]  # next-token id on target and scored EOS rows, IGNORE elsewhere
    mask: Int[Tensor, "batch pos"]  # 1 on real tokens, 0 on padding
    n_target: int  # target + scored EOS rows of the global batch (every process), the loss's denominator
    n_tokens: int  # real tokens of the global batch
    full: Batch | None = None  # `train_batch`'s whole batch, made only for a hook factory that reads it

    def to(self, device: torch.device) -> "StepBatch":
        """The batch with tokens and labels on `device`, copied without blocking (from pinned memory on CUDA); the
        mask stays on the host (the step does not need it). A hook factory's whole batch moves as `Batch.to` does."""
        if self.full is not None:
            full = self.full.to(device)
            return self._replace(tokens=full.tokens, labels=full.labels, mask=full.attention_mask, full=full)
        return self._replace(tokens=self.tokens.to(device, non_blocking=True),
                             labels=self.labels.to(device, non_blocking=True))


@dataclass(frozen=True)
class BatchPlan:
    """How a run turns the samples of a step into its `StepBatch`."""

    tokenizer: Tokenizer
    n_ctx: int | None = None  # the model's context (a longer sample is a ValueError)
    rank: int = 0  # this process takes samples[rank::world] of every global batch
    world: int = 1
    shape: tuple[int, int] | None = None  # fixed (rows, width) of this process's batch (a captured step); None: tight
    full: bool = False  # also make `train_batch`'s whole batch (a hook factory reads it)
    pin: bool = False  # tensors in pinned memory (CUDA: the copy to the device does not block)

    def make(self, samples: Sequence[Sample]) -> StepBatch:
        """The `StepBatch` of one global batch `samples`."""
        mine = samples[self.rank :: self.world]
        counts = target_count(samples, self.tokenizer), token_count(samples, self.tokenizer)
        if self.full:
            b = train_batch(mine, self.tokenizer, self.n_ctx)
            return StepBatch(b.tokens, b.labels, b.attention_mask, *counts, full=b)
        fields = lean_batch(mine, self.tokenizer, self.n_ctx, self.shape)
        if self.pin:
            fields = tuple(t.pin_memory() for t in fields)
        return StepBatch(*fields, *counts)


class Prefetcher:
    """`make(step)` for every step of `steps`, made ahead in a background thread (at most `depth` waiting); `get`
    hands them out in order. With `depth` 0 nothing runs ahead: `get` makes the batch itself. A failure of `make`
    is raised by the `get` of its step; `close` (or leaving the `with` block, an exception included) stops and
    joins the thread."""

    def __init__(self, make: Callable[[int], object], steps: range, depth: int = 2):
        self.make, self.steps, self.depth = make, steps, depth
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._thread = None
        if depth > 0 and len(steps):
            self._thread = threading.Thread(target=self._work, name=PREFETCH_THREAD, daemon=True)
            self._thread.start()

    def _work(self) -> None:
        for step in self.steps:
            try:
                item = (step, self.make(step), None)
            except BaseException as e:  # noqa: BLE001 (handed to the main thread, raised by get)
                item = (step, None, e)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set() or item[2] is not None:
                return

    def get(self, step: int):
        """The item of `step` (steps must be asked for in order)."""
        if self._thread is None:
            return self.make(step)
        got, item, error = self._queue.get()
        if got != step:
            raise RuntimeError(f"prefetcher out of order: asked for step {step}, made step {got}")
        if error is not None:
            raise error
        return item

    def close(self) -> None:
        """Stop making batches and wait for the thread to end."""
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                try:
                    self._queue.get_nowait()  # a worker blocked on a full queue sees the stop flag
                except queue.Empty:
                    pass
                self._thread.join(timeout=0.05)

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
