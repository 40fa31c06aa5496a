"""The attention biases of `aspan study abc --protocol paper` (`aspan.applications.studies.abc_paper`): ABC
(Duan & Shi 2023, Algorithm 1) calibrated from a trained base model's averaged attention on the padded layout, and
ABS (their Appendix A.4), each a `[head, pos, pos]` or `[pos, pos]` bias added to every layer's scores."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ...tasks.base import SEPARATORS, Sample


def layout_batch(samples: Sequence[Sample], tokenizer):
    """A batch of samples of one padded layout (`padded_blocks` checks that they share it)."""
    from ...batching import make_batch

    return make_batch(list(samples), tokenizer)


@dataclass
class Calibration:
    """ABC of one base model: the averaged attention of the layer it reads, the blocks, the `[head, pos, pos]` bias."""

    attn: Any  # [head, pos, pos], averaged over the calibration samples used
    bias: Any  # [head, pos, pos], what every layer's scores get
    rows: Any
    prompt_cols: Any
    target_cols: Any
    n_samples: int


def mean_layer_attention(model, tokenizer, samples: Sequence[Sample], layer: int = -1, batch_size: int = 64):
    """One layer's attention `[head, pos, pos]` (-1: the last layer's) averaged over `samples` (one padded layout:
    no padding)."""
    import torch

    import hooks

    layer = layer % model.cfg.n_layers
    total = None
    for i in range(0, len(samples), batch_size):
        batch = layout_batch(samples[i : i + batch_size], tokenizer).to(model.cfg.device)
        pats = hooks.capture(model, batch.tokens, [layer], attention_mask=batch.attention_mask)
        summed = torch.stack([pats[(layer, h)] for h in range(model.cfg.n_heads)], 1).sum(0).float().cpu()
        total = summed if total is None else total + summed
    return total / len(samples)


def training_rows(name: str, number_bits: int) -> int:
    """How many target rows the training numbers reach: the digits (parity: bits) of the largest training answer
    (successor 2^bits + 1, addition 2 x 2^bits, parity's running parity of bits + 1 bits). The rows below are the
    zero padding of a longer width, which no training answer reaches."""
    largest = {"successor": 2**number_bits + 1, "addition": 2 * 2**number_bits, "parity": 2**number_bits}[name]
    return len(format(largest, "b")) if name == "parity" else len(str(largest))


def calibrate_padded(attn, batch, calib_rows: int | None = None) -> Calibration:
    """Algorithm 1 on the two blocks of an averaged attention map: the cross block with kappa 4.5 and the self block
    with 0.87. The lines are measured on the first `calib_rows` target rows (the rows the training numbers reach:
    the paper's m x n block, as its authors' code masks the target rows past the number's digits; all rows when
    None) and extended to every target row (the paper's M x N); -inf becomes NEG; prompt rows, the BOS column and
    every cell outside the blocks stay 0."""
    import torch

    from ...experiments.abc import NEG
    from ...experiments.calibration import CROSS_KAPPA, SELF_KAPPA, calibrate, padded_blocks

    rows, prompt_cols, target_cols = padded_blocks(batch)
    m = len(rows) if calib_rows is None else min(calib_rows, len(rows))
    bias = torch.zeros_like(attn)
    for cols, kappa in ((prompt_cols, CROSS_KAPPA), (target_cols, SELF_KAPPA)):
        block = attn[:, rows][:, :, cols]
        bias[:, rows[:, None], cols[None, :]] = calibrate(block[:, :m], tuple(block.shape[1:]), kappa=kappa)
    return Calibration(attn, bias.clamp(min=NEG), rows, prompt_cols, target_cols, len(batch.samples))


def abc_calibration(base, tokenizer, samples: Sequence[Sample], correct_only: bool = True,
                    calib_rows: int | None = None, layer: int = -1) -> Calibration:
    """ABC from a trained base model: the attention of its `layer` (-1: the last, the paper's) averaged over the
    `samples` it answers correctly (all of them with `correct_only=False`), calibrated on its first `calib_rows`
    target rows (`calibrate_padded`). ValueError when it answers none."""
    from ...experiments.abc import correct_samples

    used = correct_samples(base, tokenizer, list(samples)) if correct_only else list(samples)
    if not used:
        raise ValueError("the base model answers none of the calibration samples: ABC needs a model that interpolates")
    attn = mean_layer_attention(base, tokenizer, used, layer)
    return calibrate_padded(attn, layout_batch(used, tokenizer), calib_rows)


def abs_bias(sample: Sample, tokenizer, width: int = 1):
    """ABS (w = `width`) for one padded layout, `[pos, pos]`: target row t reads, in each operand, the digit on the
    line through its first two rows' aligned digits (the leftmost reference of rows 0 and 1 in that operand: digit t
    of a number written most significant digit first, bit t for the running parity) and `width` digits either side,
    and itself and the `width` target rows before it; every other cell of its blocks gets NEG, prompt rows and the
    BOS column nothing. Cells past an operand's ends are dropped, as in the paper's bias matrices."""
    import torch

    from ...experiments.abc import NEG
    from ...experiments.calibration import padded_blocks

    batch = layout_batch([sample], tokenizer)
    rows, prompt_cols, target_cols = padded_blocks(batch)
    n, off, sep = batch.tokens.shape[1], batch.offset, int(rows[0])
    bias = torch.zeros(n, n)
    bias[rows[:, None], torch.cat([prompt_cols, target_cols])[None, :]] = NEG
    segment = [-1] * n  # operand index of each operand digit's column (-1: not an operand digit)
    for p in prompt_cols.tolist():
        seps = sum(c in SEPARATORS for c in sample.text[: p - off])
        segment[p] = -1 if sample.text[p - off] in SEPARATORS else seps

    def aligned(t: int) -> dict[int, int]:  # operand -> leftmost prompt reference of target row t
        refs = [off + k for k in sample.references[t] if off + k < sep]
        return {seg: min(k for k in refs if segment[k] == seg) for seg in {segment[k] for k in refs}}

    first, second = aligned(0), aligned(1)
    for r in rows.tolist():
        t = r - sep
        for seg, start in first.items():
            centre = start + (second[seg] - start) * t
            for c in range(centre - width, centre + width + 1):
                if off <= c < sep and segment[c] == seg:
                    bias[r, c] = 0.0
        bias[r, max(sep, r - width) : r + 1] = 0.0
    return bias


def hooks_for_bias(bias, model) -> list:
    """The same bias on every head of every layer (`hooks.attn_bias`)."""
    import hooks

    return hooks.attn_bias(bias, model=model)
