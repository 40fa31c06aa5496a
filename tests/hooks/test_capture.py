"""Captured per-head patterns equal the cached ones, cropped to the requested rows and columns."""
import torch

import hooks

from .conftest import padded_batch


def test_capture_matches_cache(model):
    tokens, am, mask = padded_batch([12, 10], seed=1)
    _, cache = model.run_with_cache(tokens, attention_mask=am)
    got = hooks.capture(model, tokens, [(2, 1), (0, 3)], attention_mask=am)
    assert list(got) == [(0, 3), (2, 1)]
    for (layer, h), p in got.items():
        assert torch.equal(p, cache["pattern", layer][:, h])
    rows, cols = [11, 4, 7], slice(2, 9)
    cropped = hooks.capture(model, tokens, [(1, 2)], rows=rows, cols=cols, attention_mask=am)[(1, 2)]
    assert torch.equal(cropped, cache["pattern", 1][:, 2][:, rows][:, :, cols])
    whole = hooks.capture(model, tokens, [1], rows=slice(5, None))
    assert sorted(whole) == [(1, h) for h in range(model.cfg.n_heads)]
    assert whole[(1, 0)].shape == (2, 7, 12)


def test_capture_after_an_edit_sees_the_edit(model):
    tokens, _, mask = padded_batch([10], seed=2)
    plain = hooks.capture(model, tokens, [(1, 0)])[(1, 0)]
    edited = hooks.capture(model, tokens, [(1, 0)], fwd_hooks=hooks.reinforce([(1, 0)], mask, 1.0))[(1, 0)]
    expected = hooks.edit_pattern(plain[:, None], mask, 1.0)[:, 0]  # layer 0 untouched, so layer 1's input is the same
    torch.testing.assert_close(edited, expected)
