"""Failure-gated edits: `rows` (e.g. beyond a training length) and `gate_below` touch only the gated rows."""
import pytest
import torch

import hooks
from tests.conftest import hooked_model, padded_batch

from .brute_edits import brute_rows, layer_hooks, steered_row, uniform_row
from .test_reinforce import brute_edit

HEADS = [(0, 1), (1, 3), (2, 0), (2, 2)]


def _edits(mask, **gate):
    return {
        "reinforce": hooks.reinforce(HEADS, mask, 1.0, options=hooks.ReinforceOptions(renormalize=True, **gate)),
        "patch": hooks.patch_pattern(HEADS, mask, options=hooks.EditOptions(**gate)),
        "steer": hooks.steer(HEADS, mask, alpha=0.05, options=hooks.SteerOptions(**gate)),
    }


def test_rows_beyond_a_position_leave_earlier_rows_bit_identical(model):
    tokens, am, mask = padded_batch([14, 14], seed=41)
    plain = model(tokens)
    rows = hooks.rows_beyond(tokens, 9)
    assert rows.shape == (2, 14) and rows[:, 9:].all() and not rows[:, :9].any()
    for name, fwd in _edits(mask, rows=rows).items():
        got = model.run_with_hooks(tokens, fwd_hooks=fwd)
        assert torch.equal(got[:, :9], plain[:, :9]), name  # causal: nothing before row 9 sees an edit
        assert (got[:, 9:] - plain[:, 9:]).abs().max() > 1e-3, name
        full = model.run_with_hooks(tokens, fwd_hooks=_edits(mask)[name])
        assert (full[:, :9] - plain[:, :9]).abs().max() > 1e-3, name  # ungated, the early rows do change


def _reinforce_row(mask):
    def new(i, h, r, old):
        P = old[None, None, None].clone()
        return brute_edit(P, mask[i : i + 1, r : r + 1], [0], 1.0, renorm=True)[0, 0, 0]

    return new


@pytest.mark.parametrize("name", ["reinforce", "patch", "steer"])
def test_gate_below_equals_brute_force(any_model, name):
    model = any_model
    tokens, am, mask = padded_batch([12, 9], seed=42)
    rows = torch.zeros(2, 12, dtype=torch.bool)
    rows[:, 4:] = True
    tau = 0.3
    row_fn = {"reinforce": _reinforce_row, "patch": uniform_row, "steer": lambda m: steered_row(m, 0.05)}[name]
    brute = layer_hooks(HEADS, lambda P, hs: brute_rows(P, mask, hs, row_fn(mask), rows=rows, below=tau))
    want = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=brute)
    got = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=_edits(mask, rows=rows, gate_below=tau)[name])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    ungated = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=_edits(mask, rows=rows)[name])
    assert (got - ungated).abs().max() > 1e-4  # the gate really skipped some rows


def test_gate_skips_rows_that_already_attend(model):
    """A head whose rows already put more than τ on the references is left alone: logits bit-identical."""
    tokens, _, mask = padded_batch([10], seed=43)
    plain = model(tokens)
    for fwd in _edits(mask, gate_below=1e-9).values():  # no row has less than 1e-9 on its references
        assert torch.equal(model.run_with_hooks(tokens, fwd_hooks=fwd), plain)


def test_bad_gates_fail_clearly():
    tokens, _, mask = padded_batch([6], seed=44)
    for bad in (0, -0.1, 2.0, float("inf")):
        with pytest.raises(ValueError, match="gate_below"):
            hooks.reinforce(HEADS, mask, 1.0, options=hooks.ReinforceOptions(gate_below=bad))
    with pytest.raises(ValueError, match="position"):
        hooks.rows_beyond(tokens, -1)
    with pytest.raises(ValueError, match="rows has batch"):
        torch.manual_seed(0)
        m = hooked_model("standard", n_layers=1)
        three = hooks.SteerOptions(rows=torch.ones(3, 6, dtype=torch.bool))
        m.run_with_hooks(tokens, fwd_hooks=hooks.steer([(0, 0)], mask, options=three))
