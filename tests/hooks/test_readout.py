"""The per-row readout (mass, top key, offset from the nearest reference) against a brute force over cached patterns,
in plain loops; the hooks read through edits listed before them and read every head in one forward."""
import math

import pytest
import torch

import hooks
from tests.conftest import padded_batch


def brute(model, tokens, mask, am, delta, columns=None):
    """{(layer, head): (mass, top, offset) lists of [batch][q]} from `run_with_cache`, one row at a time."""
    _, cache = model.run_with_cache(tokens, attention_mask=am)
    b, pos = tokens.shape
    out = {}
    for layer in range(model.cfg.n_layers):
        P = cache["pattern", layer]
        for head in range(model.cfg.n_heads):
            mass, top, offset = [], [], []
            for i in range(b):
                m_row, t_row, o_row = [], [], []
                for q in range(pos):
                    row = P[i, head, q]
                    t = max(range(pos), key=lambda k: (row[k].item(), -k))  # the first maximum
                    refs = [k for k in range(pos) if mask[i, q, k]]
                    shifted = [k + delta for k in refs if 0 <= k + delta <= q]
                    denom = 1.0 if columns is None else sum(row[k].item() for k in range(pos) if columns[i, k])
                    m = sum(row[k].item() for k in shifted) / denom if shifted else float("nan")
                    nearest = min(refs, key=lambda k: (abs(t - k), k)) if refs else None
                    m_row.append(m if refs else float("nan"))
                    t_row.append(t)
                    o_row.append(float(t - nearest) if refs else float("nan"))
                mass.append(m_row)
                top.append(t_row)
                offset.append(o_row)
            out[(layer, head)] = (mass, top, offset)
    return out


def _close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w, abs=1e-5), (got, want)


@pytest.mark.parametrize("delta", [0, 2, -1])
def test_readout_hooks_match_brute_force(any_model, delta):
    model = any_model
    tokens, am, mask = padded_batch([12, 9, 7], seed=4)
    store = {}
    fwd = hooks.readout_hooks(list(range(model.cfg.n_layers)), store, mask, delta=delta, model=model)
    with torch.no_grad():
        model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=fwd)
    want = brute(model, tokens, mask, am, delta)
    assert sorted(store) == sorted(want)
    for head, (mass, top, offset) in want.items():
        got = store[head]
        assert got["top"].shape == (3, 12) and got["top"].dtype == torch.long
        for i in range(3):
            n = int(am[i].sum())  # real rows only (padding rows read padding)
            assert got["top"][i, :n].tolist() == top[i][:n]
            _close(got["mass"][i, :n].tolist(), mass[i][:n])
            _close(got["offset"][i, :n].tolist(), offset[i][:n])


def test_the_sample_convention_and_selected_heads(model):
    tokens, am, mask = padded_batch([10, 10], seed=5)
    columns = torch.ones(2, 10, dtype=torch.bool)
    columns[:, 0] = False  # the first column out of the denominator, as the sample convention leaves BOS out
    store = {}
    with torch.no_grad():
        model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=hooks.readout_hooks(
            [(2, 1), (0, 3)], store, mask, delta=1, columns=columns, model=model))
    assert sorted(store) == [(0, 3), (2, 1)]
    want = brute(model, tokens, mask, am, 1, columns)
    for head in store:
        for i in range(2):
            _close(store[head]["mass"][i].tolist(), want[head][0][i])


def test_ties_take_the_reference_left_of_the_top_key():
    A = torch.zeros(1, 1, 6, 6)
    A[0, 0, 5, 3] = 1.0  # row 5 attends key 3, between references 2 and 4
    mask = torch.zeros(1, 6, 6, dtype=torch.bool)
    mask[0, 5, [2, 4]] = True
    out = hooks.row_readout(A, mask)
    assert out["top"][0, 0, 5] == 3 and out["offset"][0, 0, 5] == 1.0 and out["mass"][0, 0, 5] == 0.0
    assert math.isnan(out["mass"][0, 0, 4]) and math.isnan(out["offset"][0, 0, 4])  # no references on row 4


def test_a_shift_out_of_the_causal_part_leaves_nothing_to_read():
    A = torch.eye(4)[None, None]
    mask = torch.zeros(1, 4, 4, dtype=torch.bool)
    mask[0, 2, 1] = True  # ref 1 at row 2: +2 is key 3, after the row
    out = hooks.row_readout(A, mask, delta=2)
    assert math.isnan(out["mass"][0, 0, 2]) and out["offset"][0, 0, 2] == 1.0
    assert hooks.row_readout(A, mask, delta=1)["mass"][0, 0, 2] == 1.0  # key 2: the row itself


def test_readout_reads_through_an_edit_listed_before_it(model):
    tokens, am, mask = padded_batch([10], seed=6)
    store, plain = {}, {}
    edit = hooks.patch_pattern([(1, 2)], mask, delta=0)
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=edit + hooks.readout_hooks([(1, 2)], store, mask, model=model))
        model.run_with_hooks(tokens, fwd_hooks=hooks.readout_hooks([(1, 2)], plain, mask, model=model))
    rows = mask[0].any(-1)
    assert torch.allclose(store[(1, 2)]["mass"][0, rows], torch.ones(int(rows.sum())))
    assert not torch.allclose(plain[(1, 2)]["mass"][0, rows], torch.ones(int(rows.sum())))


def test_bad_heads_are_refused(model):
    tokens, am, mask = padded_batch([6], seed=7)
    with pytest.raises(ValueError, match="selecting whole layers needs a model"):
        hooks.readout_hooks([0, 1], {}, mask)
    with pytest.raises(ValueError, match="out of range"):
        with torch.no_grad():
            model.run_with_hooks(tokens, fwd_hooks=hooks.readout_hooks([(0, 9)], {}, mask))
