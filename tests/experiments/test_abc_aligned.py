"""The aligned direction and ABS windows defined by a task's references (Duan & Shi 2023, Section 4)."""
import pytest
import torch

from aspan import models, tasks
from aspan.batching import make_batch
from aspan.experiments.abc import (
    NEG,
    HeadLines,
    LineSums,
    abc_bias,
    abs_window,
    aligned_line,
    coords,
    every_head,
    extract_lines,
    reference_offsets,
)
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig, train


def test_coords_and_aligned_lines_by_hand():
    tok = CharTokenizer.for_alphabets("0123456789+=")
    s = tasks.get("addition", digits=(1, 3)).build([12, 345])  # "21+543=753"
    assert s.text == "21+543=753"
    c = coords(make_batch([s], tok))
    off = tok.offset
    assert c.segment[0, off:off + len(s.text)].tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert c.local[0, off:off + len(s.text)].tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2]
    assert c.segment[0, :off].tolist() == [-1] * off and int(c.sep[0]) == off + 6
    n = off + len(s.text) + 1
    idx = c.index("aligned", torch.arange(n), torch.arange(n))[0]
    q = int(c.sep[0]) + 1  # the row predicting sum digit 1 reads digit 1 of each operand on line offset 0
    assert int(idx[q, off + 1]) == aligned_line(0, 0) and int(idx[q, off + 4]) == aligned_line(1, 0)
    assert int(idx[q, off]) == aligned_line(0, -1)
    assert reference_offsets([s], tok) == {0: [-1, 0], 1: [-1, 0]}


@pytest.mark.parametrize("name", ["successor", "addition"])
def test_an_aligned_line_holds_the_same_digits_in_the_padded_layout(name):
    """Duan & Shi's padded layout writes the operands most significant digit first: the local index of a prompt digit
    is its significance there too, so every reference of a padded sample lies on the aligned line it lies on in the
    natural layout, and a window from natural samples keeps, on padded ones, exactly the digit of each operand of the
    answer digit's significance."""
    from aspan.applications.studies.abc_arms import padded_sample

    natural = tasks.get(name, **({"start": (1, 99999), "numbers": 2} if name == "successor" else {"digits": (1, 5)}))
    tok = CharTokenizer.for_alphabets(natural.alphabet)
    samples = natural.generate(12, seed=2)
    padded = [padded_sample(s, 8) for s in samples]
    assert padded[0].params["layout"] == "padded" and padded[0].text.index("," if name == "successor" else "+") == 8
    assert reference_offsets(padded, tok) == reference_offsets(samples, tok)
    window = abs_window(samples, tok, width=1)
    b = make_batch(padded, tok)
    c = coords(b)
    n = b.tokens.shape[1]
    kept = window.bias(c, n, n) == 0
    for i, s in enumerate(padded):
        sep, off = int(c.sep[i]), b.offset
        operands = s.text[: s.prompt_len - 1].replace("+", ",").split(",")
        for t in range(len(s.target)):
            q = sep + t
            want = {off + k * 9 + 7 - t for k in range(len(operands)) if t < 8}  # digit t of operand k (MSD first)
            got = set(kept[i, q, : q + 1].nonzero().flatten().tolist())
            assert got == (want or {q}), (i, t)


@pytest.mark.parametrize("name, params, segments", [
    ("parity", {"length": (3, 7), "format": "scratchpad"}, (0,)),
    ("successor", {"start": (1, 99999), "numbers": 2}, (0,)),
    ("addition", {"digits": (1, 5)}, (0, 1)),
])
def test_abs_window_keeps_the_aligned_digit_of_each_operand(name, params, segments):
    task = tasks.get(name, **params)
    tok = CharTokenizer.for_alphabets(task.alphabet)
    samples = task.generate(12, seed=0)
    window = abs_window(samples, tok, width=1)
    assert window.lines == {"aligned": tuple(aligned_line(s, 0) for s in segments)}
    assert window.prompt == {"diagonal": (0, 1)}
    b = make_batch(samples, tok)
    c = coords(b)
    n = b.tokens.shape[1]
    kept = window.bias(c, n, n) == 0
    for i, s in enumerate(samples):
        sep, off = int(c.sep[i]), b.offset
        for t in range(len(s.target)):
            q = sep + t
            want = {off + j for j, ch in enumerate(s.text[: s.prompt_len])
                    if int(c.segment[i, off + j]) in segments and int(c.local[i, off + j]) == t}
            got = set(kept[i, q, : q + 1].nonzero().flatten().tolist())
            assert got == (want or {q})  # the aligned digits; a row without one keeps itself
        for q in range(off, sep):  # prompt rows: themselves and their predecessor
            assert set(kept[i, q, : q + 1].nonzero().flatten().tolist()) == {max(q - 1, 0), q}


def test_aligned_lines_are_found_across_lengths():
    """A head that reads digit i of the first operand for sum digit i at every length gives one aligned line."""
    tok = CharTokenizer.for_alphabets("0123456789+=")
    samples = tasks.get("addition", digits=(1, 6)).generate(20, seed=1)
    b = make_batch(samples, tok)
    c = coords(b)
    n = b.tokens.shape[1]
    idx = c.index("aligned", torch.arange(n), torch.arange(n))
    attn = torch.zeros(len(samples), 1, n, n)
    attn[..., 0] = 1.0  # BOS by default
    hit = (idx == aligned_line(0, 0)) & b.target_rows[:, :, None]
    rows = hit.any(-1)
    attn[:, 0][rows] = hit[rows].float()
    stats = LineSums(1)
    stats.add(attn, c, b.target_rows)
    (head,) = extract_lines(stats, directions=("aligned",))
    assert head.lines == {"aligned": (aligned_line(0, 0),)}


def test_abs_window_of_neg_zeroes_attention_during_training():
    """Capture the pattern inside the training forwards (training mode, gradients on): with the ABS bias every
    key outside the window gets exactly zero attention, rows still sum to one, and the bias changes training."""
    task = tasks.get("parity", length=(2, 6), format="scratchpad")
    tok = CharTokenizer.for_alphabets(task.alphabet)
    model = models.tiny(tok, n_layers=2, n_heads=2, d_model=16, n_ctx=32, seed=0, device="cpu", positional="none")
    window = abs_window(task.generate(8, seed=0), tok, width=1)
    bias = abc_bias(every_head(model, window), model)
    seen = []

    def factory(batch):
        def grab(pattern, hook):
            assert model.training and pattern.requires_grad  # a training forward, not an evaluation
            seen.append((batch, pattern.detach().clone()))
        return bias(batch) + [("blocks.1.attn.hook_pattern", grab)]

    cfg = TrainConfig.scratch(steps=3, batch_size=8, warmup=1, log_every=1, device="cpu")
    train(model, tok, task, cfg, fwd_hooks=factory, progress=False)
    assert len(seen) == 3
    for batch, pattern in seen:
        n = batch.tokens.shape[1]
        kept = window.bias(coords(batch), n, n) == 0  # [batch, q, k]
        real = batch.attention_mask.bool()
        outside = ~kept[:, None] & real[:, None, :, None] & real[:, None, None, :]
        assert outside.any() and pattern[outside.expand_as(pattern)].abs().max() == 0
        sums = pattern.sum(-1)[real[:, None].expand(-1, pattern.shape[1], -1)]
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)
    assert NEG < -1e3
    with pytest.raises(ValueError, match="widths"):
        abs_window(task.generate(2, seed=0), tok, width=0)
    assert HeadLines({"aligned": ()}).prompt is None
