"""The values a training step leaves on the device (its summed loss and gradient norm), kept there until a point
that needs them (a log row, an evaluation, a curve, a checkpoint) reads them all at once."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor


class Tally:
    """Each step's summed target loss and gradient norm since the last `read`, left on the device (a step reads
    nothing back), with the host-side counts they are divided by.

    After `read`, `loss` (mean loss per target token of the global batch) and `grad_norm` are the last step's, as
    floats; `tokens` counts the real tokens of every step added so far.
    """

    def __init__(self, world: int = 1):
        self.world = world  # processes whose loss sums are added up (DDP)
        self.steps: list[int] = []  # steps (1-based) not read yet
        self.losses: list[Tensor] = []  # their summed losses, 0-d on the device (this process's share)
        self.norms: list[Tensor] = []  # their gradient norms, 0-d on the device (none without clipping)
        self.n_target: list[int] = []  # their global target counts
        self.loss: float = math.nan
        self.grad_norm: float | None = None
        self.tokens = 0

    def add(self, step: int, loss_sum: Tensor, grad_norm: Tensor | None, n_target: int, n_tokens: int) -> None:
        """Record step `step` (1-based): its detached summed loss and gradient norm (None: not clipped)."""
        self.steps.append(step)
        self.losses.append(loss_sum)
        if grad_norm is not None:
            self.norms.append(grad_norm)
        self.n_target.append(n_target)
        self.tokens += n_tokens

    @property
    def pending(self) -> bool:
        """Whether steps were added since the last read."""
        return bool(self.steps)

    def read(self) -> None:
        """Fetch every pending value in one transfer (under DDP after one all-reduce of the loss sums, so every
        process must read at the same steps); FloatingPointError naming the first step whose loss is not finite."""
        if not self.steps:
            return
        losses = torch.stack(self.losses)
        if self.world > 1:
            dist.all_reduce(losses)
        values = (torch.cat([losses, torch.stack(self.norms).to(losses.dtype)]) if self.norms else losses).tolist()
        n = len(self.steps)
        for step, total, count in zip(self.steps, values[:n], self.n_target):
            if not math.isfinite(total / count):
                raise FloatingPointError(f"loss became {total / count} at step {step}; lower the learning rate")
        self.loss = values[n - 1] / self.n_target[-1]
        self.grad_norm = values[-1] if self.norms else None
        self.steps, self.losses, self.norms, self.n_target = [], [], [], []
