"""PASTA steering on hook_attn_scores == scaling and renormalising the pattern; batched, padded, KV-cached."""
import pytest
import torch

import hooks
from tests.conftest import hooked_model, padded_batch

from .brute_edits import brute_rows, kv_generate, last_layer_by_hand, layer_hooks, steered_row

HEADS = [(0, 1), (1, 3), (2, 0), (2, 2)]


@pytest.mark.parametrize("mode", ["exclude", "include"])
def test_steer_equals_scaled_renormalised_pattern(any_model, mode):
    model = any_model
    tokens, am, mask = padded_batch([10, 7], seed=31)
    for alpha, delta in [(0.01, 0), (0.3, 2)]:
        m = hooks.shift_mask(mask, delta)
        fwd = hooks.steer(HEADS, mask, alpha=alpha, delta=delta, model=model, options=hooks.SteerOptions(mode=mode))
        got = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=fwd)
        brute = layer_hooks(HEADS, lambda P, hs, m=m, a=alpha: brute_rows(P, m, hs, steered_row(m, a)))
        want = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=brute)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert (got - model(tokens, attention_mask=am)).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["rotary", "standard"])
def test_steered_cached_pattern_recomputed_by_hand(kind):
    model = hooked_model(kind)
    L = model.cfg.n_layers - 1
    tokens, _, mask = padded_batch([11, 11], seed=32)
    _, cache = model.run_with_cache(tokens)
    P = cache["pattern", L].clone()
    scale = torch.where(mask, 1.0, 0.05)
    for h in (0, 3):
        edited = P[:, h] * scale
        P[:, h] = torch.where(mask.any(-1, keepdim=True), edited / edited.sum(-1, keepdim=True), P[:, h])
    with torch.no_grad():
        want = last_layer_by_hand(model, cache, P)
        got = model.run_with_hooks(tokens, fwd_hooks=hooks.steer([(L, 0), (L, 3)], mask, alpha=0.05))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_alpha_one_changes_nothing_and_modes_agree(model):
    tokens, am, mask = padded_batch([12, 9], seed=33)
    plain = model(tokens, attention_mask=am)
    same = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=hooks.steer(HEADS, mask, alpha=1.0))
    assert torch.equal(same, plain)
    ex, inc = (model.run_with_hooks(tokens, attention_mask=am,
                                    fwd_hooks=hooks.steer(HEADS, mask, options=hooks.SteerOptions(mode=mode)))
               for mode in ("exclude", "include"))
    torch.testing.assert_close(ex, inc, atol=1e-5, rtol=1e-5)


def test_batched_padded_equals_one_by_one(model):
    lengths = [12, 6, 9]
    tokens, am, mask = padded_batch(lengths, seed=34)
    batched = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=hooks.steer(HEADS, mask, alpha=0.1, delta=1))
    for i, n in enumerate(lengths):
        one = model.run_with_hooks(tokens[i : i + 1, :n],
                                   fwd_hooks=hooks.steer(HEADS, mask[i : i + 1, :n, :n], alpha=0.1, delta=1))
        torch.testing.assert_close(batched[i, :n], one[0], atol=1e-5, rtol=1e-5)


def test_left_padded_batch_equals_one_by_one(model):
    lengths = [12, 7]
    tokens, am, mask = padded_batch(lengths, seed=35, left=True)
    batched = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=hooks.steer(HEADS, mask, alpha=0.1))
    for i, n in enumerate(lengths):
        sl = slice(12 - n, 12)
        fwd = hooks.steer(HEADS, mask[i : i + 1, sl, sl], alpha=0.1)
        one = model.run_with_hooks(tokens[i : i + 1, sl], fwd_hooks=fwd)
        torch.testing.assert_close(batched[i, sl], one[0], atol=1e-4, rtol=1e-4)


def test_kv_cached_generation_equals_teacher_forcing(any_model):
    model = any_model
    tokens, _, mask = padded_batch([14, 14], seed=36)
    for fwd in (hooks.steer(HEADS, mask, alpha=0.05),
                hooks.steer(HEADS, mask, alpha=0.2, delta=1,
                            options=hooks.SteerOptions(mode="include", rows=hooks.rows_beyond(tokens, 9))),
                hooks.steer(HEADS, mask, options=hooks.SteerOptions(gate_below=0.3))):
        steps, full, seq = kv_generate(model, tokens[:, :6], 8, fwd)
        for j, lg in enumerate(steps):
            torch.testing.assert_close(lg, full[:, 5 + j], atol=1e-5, rtol=1e-5)
        assert (model(seq) - full).abs().max() > 1e-3


def test_bad_arguments_fail_clearly():
    _, _, mask = padded_batch([6], seed=37)
    for alpha in (0, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="alpha"):
            hooks.steer(HEADS, mask, alpha=alpha)
    with pytest.raises(ValueError, match="mode"):
        hooks.steer(HEADS, mask, options=hooks.SteerOptions(mode="boost"))
