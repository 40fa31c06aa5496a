"""Samples -> padded token ids, target rows, labels and the `[batch, pos, pos]` reference mask (`make_batch`), or
token ids, labels and padding mask only (`lean_batch`: one tensor per field, for training and accuracy).

Layout per sample (right padding): `prefix_ids` (BOS, instruction, few-shot; length = offset), the text, then
EOS when the tokenizer has one. Target char `j` is predicted at row `offset + prompt_len + j - 1` (`Sample`);
the EOS row is a target row with an empty reference set. Every other row is ignored by every score.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from hooks import shift_mask  # noqa: F401  re-exported: shifted references, one implementation

from . import tasks
from .tasks.base import Sample
from .tokenization import Tokenizer, require_tokenizer

IGNORE = -100


def scores_eos(sample: Sample) -> bool:
    """Whether the EOS after the target is a target: not for an open-ended task (successor's series has no end)."""
    return sample.task not in tasks.NAMES or not tasks.task_class(sample.task).open_ended


@dataclass
class Batch:
    """A padded batch of samples and its reference masks, as tensors (one row per sample; see `make_batch`)."""
    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]  # 1 on real tokens, 0 on padding
    labels: Int[Tensor, "batch pos"]  # next-token id on target rows, IGNORE elsewhere
    target_rows: Bool[Tensor, "batch pos"]  # rows that predict a target token (EOS included)
    scored_rows: Bool[Tensor, "batch pos"]  # target rows with a non-empty reference set
    ref_mask: Bool[Tensor, "batch pos pos"]  # row = query position, col = key position
    target_index: Int[Tensor, "batch pos"]  # j of the target char predicted at a row, -1 elsewhere
    lengths: Int[Tensor, "batch"]  # real tokens per sample
    offset: int
    samples: list[Sample]

    @property
    def sample_columns(self) -> Bool[Tensor, "batch pos"]:
        """The sample's own columns (its text and EOS; not BOS, instruction, few-shot examples or padding): the
        denominator of the `sample` AttnScore convention (Spiegel et al. 2025, Appendix B)."""
        pos = torch.arange(self.tokens.shape[1], device=self.tokens.device)
        return (pos >= self.offset)[None, :] & self.attention_mask.bool()

    def to(self, device: torch.device | str) -> "Batch":
        """The batch with every tensor moved to `device` (a new `Batch`)."""
        moved = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in self.__dict__.items()}
        return Batch(**moved)

    def __len__(self) -> int:
        return len(self.samples)


def encode_sample(sample: Sample, tokenizer: Tokenizer, eos: bool = True) -> list[int]:
    """A sample's token ids: the tokenizer's prefix, its text, then EOS when `eos` and the tokenizer has one."""
    ids = tokenizer.prefix_ids() + tokenizer.encode(sample.text)
    if eos and tokenizer.eos_id is not None:
        ids.append(tokenizer.eos_id)
    return ids


def make_batch(
    samples: Sequence[Sample],
    tokenizer: Tokenizer,
    eos: bool = True,
    pad_to: int | None = None,
    n_ctx: int | None = None,
) -> Batch:
    """Tokenise `samples` with right padding; ValueError if one is not a `Sample` or does not fit `n_ctx`."""
    if not samples:
        raise ValueError("make_batch needs at least one sample")
    require_tokenizer(tokenizer, "make_batch: tokenizer")
    bad = next((i for i, s in enumerate(samples) if not isinstance(s, Sample)), None)
    if bad is not None:  # a string or dict here failed deep inside with an AttributeError
        raise ValueError(f"make_batch: sample {bad} is a {type(samples[bad]).__name__}, not an aspan Sample (make "
                         f"samples with task.generate(n) or read them with aspan.tasks.read_samples)")
    offset = tokenizer.offset
    seqs = [encode_sample(s, tokenizer, eos) for s in samples]
    longest = max(len(s) for s in seqs)
    if n_ctx is not None and longest > n_ctx:
        raise ValueError(f"a sample needs {longest} tokens but the model's context n_ctx={n_ctx} is shorter")
    pos = max(longest, pad_to or 0)
    b = len(samples)
    tokens = torch.full((b, pos), tokenizer.pad_id, dtype=torch.long)
    attention_mask = torch.zeros(b, pos, dtype=torch.long)
    labels = torch.full((b, pos), IGNORE, dtype=torch.long)
    target_index = torch.full((b, pos), -1, dtype=torch.long)
    scored = torch.zeros(b, pos, dtype=torch.bool)
    ref_mask = torch.zeros(b, pos, pos, dtype=torch.bool)
    for i, (s, ids) in enumerate(zip(samples, seqs)):
        n = len(ids)
        tokens[i, :n] = torch.tensor(ids)
        attention_mask[i, :n] = 1
        first = offset + s.prompt_len - 1  # row predicting target char 0
        last = n - 2  # row predicting the final token (EOS or the last target char)
        rows = torch.arange(first, last + 1)
        labels[i, rows] = tokens[i, rows + 1]
        target_index[i, rows] = rows - first
        if s.given:  # input interleaved into the target: supplied, never predicted
            given = torch.tensor(s.given) + first
            labels[i, given] = IGNORE
            target_index[i, given] = -1
        r, c = s.ref_pairs(offset)
        if r:
            ref_mask[i, torch.tensor(r), torch.tensor(c)] = True
            scored[i, torch.tensor(sorted(set(r)))] = True
    return Batch(
        tokens=tokens,
        attention_mask=attention_mask,
        labels=labels,
        target_rows=labels != IGNORE,
        scored_rows=scored,
        ref_mask=ref_mask,
        target_index=target_index,
        lengths=attention_mask.sum(1),
        offset=offset,
        samples=list(samples),
    )


def _labels_row(sample: Sample, ids: list[int], offset: int, width: int, scored_eos: bool) -> list[int]:
    """One sample's labels row of `width`: `make_batch`'s labels, the EOS label dropped unless `scored_eos`."""
    labels = [IGNORE] * width
    first, last = offset + sample.prompt_len - 1, len(ids) - 2  # rows predicting target char 0 and the last token
    if first >= 0:
        labels[first : last + 1] = ids[first + 1 : last + 2]
    else:  # no prefix and no prompt: the row before the first token wraps to the last column, as in make_batch
        for r in range(first, last + 1):
            labels[r] = ids[r + 1]
    for g in sample.given:  # input interleaved into the target: supplied, never predicted
        labels[first + g] = IGNORE
    if not scored_eos:
        labels[len(ids) - 2] = IGNORE
    return labels


def lean_batch(samples: Sequence[Sample], tokenizer: Tokenizer, n_ctx: int | None = None,
               shape: tuple[int, int] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(tokens, labels, mask) of `samples`, each [batch, pos]: `make_batch`'s tokens, labels and attention mask, an
    EOS label the task does not score (`scores_eos`) left out (`aspan.training.train_batch`'s labels); with `shape`
    (rows, width) padded to that fixed shape (extra rows are all padding, labelled IGNORE). ValueError if a sample
    does not fit `n_ctx` or the width."""
    eos = tokenizer.eos_id is not None
    seqs = [encode_sample(s, tokenizer) for s in samples]
    longest = max((len(ids) for ids in seqs), default=0)
    if n_ctx is not None and longest > n_ctx:
        raise ValueError(f"a sample needs {longest} tokens but the model's context n_ctx={n_ctx} is shorter")
    rows, width = shape or (len(samples), longest)
    if longest > width or len(samples) > rows:
        raise ValueError(f"a batch of {len(samples)} x {longest} tokens does not fit the fixed shape {rows} x {width}")
    pad, offset = tokenizer.pad_id, tokenizer.offset
    tokens = [ids + [pad] * (width - len(ids)) for ids in seqs] + [[pad] * width] * (rows - len(seqs))
    mask = [[1] * len(ids) + [0] * (width - len(ids)) for ids in seqs] + [[0] * width] * (rows - len(seqs))
    labels = [_labels_row(s, ids, offset, width, not eos or scores_eos(s)) for s, ids in zip(samples, seqs)]
    labels += [[IGNORE] * width] * (rows - len(seqs))
    return tuple(torch.tensor(x, dtype=torch.long) for x in (tokens, labels, mask))  # type: ignore[return-value]


def target_count(samples: Sequence[Sample], tokenizer: Tokenizer) -> int:
    """The rows `target_loss` scores in `samples`: every target character not `given`, plus EOS where scored."""
    eos = tokenizer.eos_id is not None
    return sum(len(s.target) - len(s.given) + (eos and scores_eos(s)) for s in samples)


def token_count(samples: Sequence[Sample], tokenizer: Tokenizer) -> int:
    """Real (non-padding) tokens of `samples`: the prefix, one token per character, and EOS."""
    return sum(tokenizer.offset + len(s.text) + (tokenizer.eos_id is not None) for s in samples)
