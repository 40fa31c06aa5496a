"""The training objective: batches whose target and EOS rows are labelled, and the summed cross-entropy on them."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..accuracy import accuracy
from ..batching import IGNORE, Batch, make_batch, scores_eos
from ..tasks.base import Sample
from ..tokenization import Tokenizer


def train_batch(samples: Sequence[Sample], tokenizer: Tokenizer, n_ctx: int | None = None) -> Batch:
    """`make_batch` with successor's EOS label dropped: its series has no natural end, so EOS is not a target."""
    batch = make_batch(samples, tokenizer, n_ctx=n_ctx)
    if tokenizer.eos_id is not None:
        for i, s in enumerate(samples):
            if not scores_eos(s):
                batch.labels[i, batch.lengths[i] - 2] = IGNORE
        batch.target_rows = batch.labels != IGNORE
    return batch


def target_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy over target + EOS rows (labels != IGNORE); every other row is left out."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="sum")


def heldout_loss(model, tokenizer: Tokenizer, samples: Sequence[Sample], fwd_hooks=(), batch_size: int = 64) -> float:
    """The training loss (mean cross-entropy per target + EOS token, `target_loss`) on `samples`, in eval mode, in
    forwards of at least `batch_size` samples (`aspan.accuracy.accuracy`, which counts accuracy in the same pass)."""
    return accuracy(model, tokenizer, samples, fwd_hooks, batch_size).loss
