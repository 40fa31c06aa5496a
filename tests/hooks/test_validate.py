"""Bad input fails with a clear error before any forward pass."""
import pytest
import torch

import hooks
from tests.conftest import padded_batch


@pytest.fixture
def counted(model):
    """The model plus a counter of forward passes that reached the embedding."""
    calls = []
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: calls.append(1))]):
        yield model, calls


def test_errors_before_the_forward(counted):
    model, calls = counted
    tokens, am, mask = padded_batch([8, 8], seed=1)
    cases = [
        (lambda: hooks.reinforce([(3, 0)], mask, 1.0, model=model), "layer 3 out of range"),
        (lambda: hooks.reinforce([(0, 4)], mask, 1.0, model=model), "head 4 out of range"),
        (lambda: hooks.reinforce([(0, -1)], mask, 1.0), "out of range"),
        (lambda: hooks.reinforce([0], mask, 1.0), "pair"),
        (lambda: hooks.reinforce([], mask, 1.0), "empty"),
        (lambda: hooks.reinforce([(0, 0)], mask.int(), 1.0), "boolean"),
        (lambda: hooks.reinforce([(0, 0)], mask, 1.0, options=hooks.ReinforceOptions(threshold=-0.1)),
         "threshold must be >= 0"),
        (lambda: hooks.reinforce([(0, 0)], mask, float("nan")), "strength"),
        (lambda: hooks.reinforce([(0, 0)], mask[:, :, :5], 1.0), "shape"),
        (lambda: hooks.head_scores(model, tokens, mask[:, :7, :7]), "does not match tokens"),
        (lambda: hooks.head_scores(model, tokens, mask[:1]), "does not match tokens"),
        (lambda: hooks.head_scores(model, tokens, mask.float()), "boolean"),
        (lambda: hooks.head_scores(model, tokens, mask, reduce="max"), "reduce"),
        (lambda: hooks.head_scores(model, tokens, torch.zeros_like(mask)), "no reference"),
        (lambda: hooks.head_row_scores(model, tokens, mask, heads=[(0, 9)]), "out of range"),
        (lambda: hooks.rollout_scores(model, tokens, mask[0, :5, :5]), "does not match tokens"),
        (lambda: hooks.rollout(model, tokens, attention_mask=am[:, :4]), "attention_mask"),
        (lambda: hooks.capture(model, tokens, [(5, 0)]), "out of range"),
        (lambda: hooks.offset_scores(model, tokens, mask, deltas=[]), "empty"),
    ]
    for fn, msg in cases:
        with pytest.raises(ValueError, match=msg):
            fn()
    assert not calls


def test_errors_at_the_first_hook_call_without_a_model(model):
    tokens, _, mask = padded_batch([8, 8], seed=2)
    with pytest.raises(ValueError, match=r"head \(0, 6\) out of range"):
        model.run_with_hooks(tokens, fwd_hooks=hooks.reinforce([(0, 6)], mask, 1.0))
    with pytest.raises(ValueError, match="batch"):
        model.run_with_hooks(tokens[:1], fwd_hooks=hooks.reinforce([(0, 0)], mask, 1.0))
    with pytest.raises(ValueError, match="full"):
        model.run_with_hooks(torch.cat([tokens, tokens], 1), fwd_hooks=hooks.reinforce([(0, 0)], mask, 1.0))
    assert all(not hp._forward_hooks for hp in model.hook_dict.values())
