"""Captured per-head patterns equal the cached ones, cropped to the requested rows and columns."""
import torch

import hooks
from tests.conftest import padded_batch


def test_capture_matches_cache(model):
    tokens, am, mask = padded_batch([12, 10], seed=1)
    _, cache = model.run_with_cache(tokens, attention_mask=am)
    got = hooks.capture(model, tokens, [(2, 1), (0, 3)], attention_mask=am)
    assert list(got) == [(0, 3), (2, 1)]
    for (layer, h), p in got.items():
        assert torch.equal(p, cache["pattern", layer][:, h])
    rows, cols = [11, 4, 7], slice(2, 9)
    crop = hooks.CaptureOptions(rows=rows, cols=cols)
    cropped = hooks.capture(model, tokens, [(1, 2)], attention_mask=am, options=crop)[(1, 2)]
    assert torch.equal(cropped, cache["pattern", 1][:, 2][:, rows][:, :, cols])
    whole = hooks.capture(model, tokens, [1], rows=slice(5, None))
    assert sorted(whole) == [(1, h) for h in range(model.cfg.n_heads)]
    assert whole[(1, 0)].shape == (2, 7, 12)


def test_capture_after_an_edit_sees_the_edit(model):
    tokens, _, mask = padded_batch([10, 10], seed=2)
    edited = hooks.capture(model, tokens, [(1, 0)], fwd_hooks=hooks.reinforce([(1, 0)], mask, 1.0))[(1, 0)]
    # Oracle written here, independent of hooks.reinforce: layer 0 is untouched, so layer 1's input and its
    # unedited pattern are those of a plain cached run; the edit adds C = 1 on the referenced cells of head 0.
    _, cache = model.run_with_cache(tokens)
    expected = cache["pattern", 1][:, 0] + mask.to(cache["pattern", 1].dtype)
    torch.testing.assert_close(edited, expected)
    assert not torch.equal(edited, cache["pattern", 1][:, 0])  # the mask is not empty: the edit is visible


def test_reinforce_equals_a_hand_written_pattern_hook(model):
    tokens, _, mask = padded_batch([10, 10], seed=3)

    def by_hand(pattern, hook):  # [batch, head, q, k]: add 1 on head 0's references, leave the other heads
        out = pattern.clone()
        out[:, 0] = out[:, 0] + mask.to(out.dtype)
        return out

    want = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_pattern", by_hand)])
    got = model.run_with_hooks(tokens, fwd_hooks=hooks.reinforce([(1, 0)], mask, 1.0))
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, model(tokens))  # the edit reaches the logits
