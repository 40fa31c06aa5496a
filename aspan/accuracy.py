"""Teacher-forced accuracy without per-token records: exact and partial accuracy per sample, and the mean training
loss, from forwards in large batches, counted on the model's device and read back once per set.

`aspan.evaluation.evaluate` keeps one record per target token (the predicted character, its AttnScores), which
analysis reads. A training run's learning curves and a study's test sets need exact and partial accuracy only, on
thousands of samples, and building those records costs more than the forwards. `accuracy` gives the same numbers
without them:

    acc = accuracy(model, tokenizer, samples, fwd_hooks=bias)
    acc.summary()    # {"exact", "partial", "n"}: those of evaluate(..., attn=False).summary()
    acc.exact        # per sample, evaluate's `exact` (`aspan.evaluation.exact_flags`)
    acc.loss         # mean cross-entropy per scored token (`aspan.training.heldout_loss`)

The forward is `aspan.models.fused.logits`: the fused forward where it covers the model and hooks (additive
attention biases included), else the hooked one. Samples go in order, `batch_size` per forward or more: as many as
fill `tokens` token positions (padding included; by default `EVAL_TOKENS` of the model's device), while their logits
stay under `LOGITS` values. A GPU runs a forward of tens of thousands of tokens in about the time of a small one
(each kernel's launch costs the same); a CPU gains nothing from larger batches, whose activations leave its caches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Int
from torch import Tensor

from . import stopping
from .batching import IGNORE, Batch, lean_batch, make_batch
from .models import fused
from .tasks.base import Sample
from .tokenization import Tokenizer

EVAL_TOKENS = {"cuda": 1 << 16, "cpu": 1 << 12}  # token positions per forward (padding included), by device type
LOGITS = 1 << 27  # at most this many logits per forward (a large vocabulary keeps batches smaller)
HookList = Sequence[tuple[str, Callable]]
FwdHooks = HookList | Callable[[Batch], HookList]  # (name, fn) pairs, or a factory f(batch) -> pairs


@dataclass(frozen=True)
class Accuracy:
    """What `accuracy` counted, per sample (in the order given)."""

    exact: Bool[Tensor, " n"]  # every scored row right (EOS included where the task scores it)
    right: Int[Tensor, " n"]  # target characters right (EOS and `given` characters left out)
    chars: Int[Tensor, " n"]  # target characters scored
    rows: Int[Tensor, " n"]  # scored rows, EOS included (0: nothing scored, and `evaluate` leaves the sample out)
    loss_sum: float  # summed cross-entropy over every scored row

    @property
    def partial(self) -> np.ndarray:
        """Per sample, the fraction of its target characters right (NaN where it has none), as float64."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.right.numpy().astype(np.float64) / self.chars.numpy()

    @property
    def loss(self) -> float:
        """Mean cross-entropy per scored row (the training loss on these samples)."""
        return self.loss_sum / max(int(self.rows.sum()), 1)

    def table(self, samples: Sequence[Sample]) -> pd.DataFrame:
        """`evaluate`'s per-sample table without AttnScores, for the `samples` counted: one row per sample with a
        scored row (sample_id, length: its target characters, exact, partial)."""
        counted = (self.rows > 0).numpy()
        ids = np.flatnonzero(counted)
        return pd.DataFrame({"sample_id": ids, "length": [len(samples[i].target) for i in ids],
                             "exact": self.exact.numpy()[counted], "partial": self.partial[counted]})

    def summary(self) -> dict:
        """exact, partial and n as `evaluate(..., attn=False).summary()` computes them from its per-sample table
        (the samples with a scored row; partial's mean skips samples without target characters)."""
        counted = (self.rows > 0).numpy()
        exact, partial = pd.Series(self.exact.numpy()[counted]), pd.Series(self.partial[counted])
        nan = float("nan")
        return {"exact": float(exact.mean()) if len(exact) else nan,
                "partial": float(partial.mean()) if len(partial) else nan, "n": int(counted.sum())}


def rows_per_forward(width: int, vocab: int, batch_size: int, tokens: int) -> int:
    """Samples per forward for samples of at most `width` tokens: `batch_size`, or more where `tokens` positions
    hold more, as long as their logits (`vocab` each) stay under `LOGITS`."""
    more = min(tokens // max(width, 1), LOGITS // max(width * vocab, 1))
    return max(batch_size, more)


@torch.no_grad()
def accuracy(model, tokenizer: Tokenizer, samples: Sequence[Sample], fwd_hooks: FwdHooks = (),
             batch_size: int = 64, tokens: int | None = None) -> Accuracy:
    """Teacher-forced exact and partial accuracy of `samples` under `fwd_hooks` (see the module's docstring), and
    their loss. In eval mode (the `training` flag restored); nothing is read from the device until every forward
    is queued. ValueError for no samples or a sample longer than the model's context."""
    samples = list(samples)
    eos = tokenizer.eos_id
    parts = [_count(logits, labels, eos) for _, logits, labels in
             _forwards(model, tokenizer, samples, fwd_hooks, batch_size, tokens)]
    exact, right, chars, rows = (torch.cat(x).cpu() for x in zip(*(p[:4] for p in parts)))
    loss = sum(torch.stack([p[4] for p in parts]).tolist())  # per-forward float32 sums, added as heldout_loss adds
    return Accuracy(exact, right, chars, rows, float(loss))


@torch.no_grad()
def target_predictions(model, tokenizer: Tokenizer, samples: Sequence[Sample], fwd_hooks: FwdHooks = (),
                       batch_size: int = 64, tokens: int | None = None) -> tuple[Tensor, Tensor]:
    """Teacher-forced (predicted ids, labels) of `samples` by target index, each [n, longest target + 1] on the
    host: index j is the row predicting target character j (index len(target): the EOS). Labels are IGNORE where a
    sample has no such row, at `given` characters and at an EOS the task does not score; the predictions there
    are -1. `accuracy`'s forwards and settings; `evaluate`'s records per target row, without building them."""
    samples = list(samples)
    span = max(len(s.target) for s in samples) + 1 if samples else 0
    preds, golds = [], []
    for part, logits, labels in _forwards(model, tokenizer, samples, fwd_hooks, batch_size, tokens):
        first = torch.tensor([tokenizer.offset + s.prompt_len - 1 for s in part])  # the row of target character 0
        past = torch.arange(span) > torch.tensor([len(s.target) for s in part])[:, None]  # no such target row
        idx = (first[:, None] + torch.arange(span)).remainder(labels.shape[1])  # -1 wraps, as in make_batch
        idx, past = idx.to(labels.device, non_blocking=True), past.to(labels.device, non_blocking=True)
        gold = labels.gather(1, idx).masked_fill(past, IGNORE)
        golds.append(gold)
        preds.append(logits.argmax(-1).gather(1, idx).masked_fill(gold == IGNORE, -1))
    return torch.cat(preds).cpu(), torch.cat(golds).cpu()


def _forwards(model, tokenizer: Tokenizer, samples: list[Sample], fwd_hooks: FwdHooks, batch_size: int,
              tokens: int | None):
    """(samples, logits, labels on the device) of each forward over `samples` (`accuracy`'s batches), in eval mode,
    the `training` flag restored at the end."""
    if not samples:
        raise ValueError("accuracy: no samples")
    cfg = model.cfg
    width = max(tokenizer.offset + len(s.text) + (tokenizer.eos_id is not None) for s in samples)
    if tokens is None:
        tokens = EVAL_TOKENS.get(torch.device(cfg.device).type, EVAL_TOKENS["cpu"])
    step = rows_per_forward(width, cfg.d_vocab_out, batch_size, tokens)
    was_training = model.training
    model.eval()
    try:
        for i in range(0, len(samples), step):
            part = samples[i : i + step]
            toks, labels, mask = (t.to(cfg.device, non_blocking=True)
                                  for t in lean_batch(part, tokenizer, n_ctx=cfg.n_ctx))
            hook_list = fwd_hooks
            if callable(fwd_hooks):  # a factory reads the whole batch (reference masks and all)
                hook_list = fwd_hooks(make_batch(part, tokenizer, n_ctx=cfg.n_ctx).to(cfg.device))
            yield part, fused.logits(model, toks, list(hook_list), attention_mask=mask), labels
            stopping.check()  # a safe point between batches
    finally:
        model.train(was_training)


def _count(logits: Tensor, labels: Int[Tensor, "b pos"], eos: int | None) -> tuple[Tensor, ...]:
    """Per sample of one forward: exact, right characters, characters, scored rows; and the summed loss."""
    scored = labels != IGNORE
    char = scored & (labels != eos) if eos is not None else scored
    ok = logits.argmax(-1) == labels
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="sum")
    return (ok | ~scored).all(-1), (ok & char).sum(-1), char.sum(-1), scored.sum(-1), loss
