"""Head ranking matches hooks.head_scores; selection and offset scan."""
import pandas as pd
import pytest
import torch

import hooks
from aspan.batching import make_batch, shift_mask
from aspan.experiments.ranking import heatmap, n_selected, offset_heatmap, offset_table, rank_heads, select_heads


def test_rank_matches_head_scores(tiny_model, tok, id_samples):
    b = make_batch(id_samples, tok)
    ref_sum = hooks.head_scores(tiny_model, b.tokens, b.ref_mask, "sum", b.attention_mask)
    ref_row = hooks.head_scores(tiny_model, b.tokens, b.ref_mask, "row", b.attention_mask)
    one = rank_heads(tiny_model, tok, id_samples, batch_size=len(id_samples), convention="raw")
    one = one.sort_values(["layer", "head"])
    assert torch.equal(torch.tensor(one.score_sum.values, dtype=torch.float32), ref_sum.flatten().cpu())
    assert torch.allclose(
        torch.tensor(one.score_row.values, dtype=torch.float64), ref_row.flatten().double(), rtol=1e-6
    )
    batched = rank_heads(tiny_model, tok, id_samples, batch_size=3, convention="raw").sort_values(["layer", "head"])
    assert torch.allclose(torch.tensor(batched.score_sum.values), ref_sum.flatten().double(), rtol=1e-5)
    assert torch.allclose(torch.tensor(batched.score_row.values), ref_row.flatten().double(), rtol=1e-5)
    # rank 1 = the head with the largest summed score
    top = one.sort_values("rank").iloc[0]
    assert top.score_sum == one.score_sum.max()
    assert sorted(one["rank"]) == list(range(1, 9))


def test_offset_scan_matches_shifted_head_scores(tiny_model, tok, id_samples):
    b = make_batch(id_samples, tok)
    long = offset_table(tiny_model, tok, id_samples, deltas=[-1, 0, 2], batch_size=4, convention="raw")
    rows = hooks.target_rows(b.ref_mask, b.attention_mask)
    for d in (-1, 0, 2):
        row = hooks.head_row_scores(tiny_model, b.tokens, shift_mask(b.ref_mask, d), attention_mask=b.attention_mask)
        want = row[rows].mean(0).flatten().double()  # mean over the unshifted target rows
        got = long[long.delta == d].sort_values(["layer", "head"]).score_row.values
        assert torch.allclose(torch.tensor(got), want, rtol=1e-5, atol=1e-7)
    r = rank_heads(tiny_model, tok, id_samples, deltas=[-1, 2], batch_size=4)
    cols = ["score_row_d-1", "score_row_d0", "score_row_d2"]
    assert (r.best_delta_score == r[cols].max(axis=1)).all()
    assert all(r.loc[i, f"score_row_d{r.best_delta[i]}"] == r.best_delta_score[i] for i in r.index)


def _brute_sample_scores(model, b, delta: int = 0):
    """(sum, mean per row) [layer, head] of the `sample` AttnScore from run_with_cache patterns, by loops: each target
    row's mass on its (shifted) references over its mass on the sample's own columns (prefix and padding dropped)."""
    _, cache = model.run_with_cache(b.tokens, attention_mask=b.attention_mask)
    mask = shift_mask(b.ref_mask, delta)
    cfg = model.cfg
    total = torch.zeros(cfg.n_layers, cfg.n_heads, dtype=torch.float64)
    n = 0
    for i in range(b.tokens.shape[0]):
        for q in range(b.tokens.shape[1]):
            if not bool(b.ref_mask[i, q].any()):
                continue  # rows are the unshifted target rows with references
            n += 1
            own = [k for k in range(q + 1) if k >= b.offset and bool(b.attention_mask[i, k])]
            refs = [k for k in range(q + 1) if bool(mask[i, q, k])]
            for layer in range(cfg.n_layers):
                pat = cache[f"blocks.{layer}.attn.hook_pattern"][i, :, q].double()
                total[layer] += pat[:, refs].sum(-1) / pat[:, own].sum(-1)  # [head]
    return total, total / n


@pytest.mark.parametrize("delta", [0, 1])
def test_sample_convention_matches_brute_force(tiny_model, tok, id_samples, delta):
    b = make_batch(id_samples, tok)
    want_sum, want_row = _brute_sample_scores(tiny_model, b, delta)
    long = offset_table(tiny_model, tok, id_samples, deltas=[delta], batch_size=4)  # sample is the default
    got = long.sort_values(["layer", "head"])
    assert set(got.convention) == {"sample"}
    assert torch.allclose(torch.tensor(got.score_sum.values), want_sum.flatten(), rtol=1e-5)
    assert torch.allclose(torch.tensor(got.score_row.values), want_row.flatten(), rtol=1e-5)
    r = rank_heads(tiny_model, tok, id_samples, batch_size=4)
    assert set(r.convention) == {"sample"} and "sample" in heatmap(r).layout.title.text


def test_sample_differs_from_raw_only_by_bos(tiny_model, tok, id_samples):
    # the character tokenizer's prefix is BOS alone: raw = sample x (1 - the row's mass on BOS), row by row
    assert tok.offset == 1
    b = make_batch(id_samples, tok)
    rows = hooks.target_rows(b.ref_mask, b.attention_mask)
    _, cache = tiny_model.run_with_cache(b.tokens, attention_mask=b.attention_mask)
    bos = torch.stack([cache[f"blocks.{l}.attn.hook_pattern"][..., 0] for l in range(tiny_model.cfg.n_layers)], 1)
    raw = hooks.head_row_scores(tiny_model, b.tokens, b.ref_mask, attention_mask=b.attention_mask)  # [b, pos, l, h]
    want = (raw / (1 - bos.permute(0, 3, 1, 2)))[rows].double()
    got = offset_table(tiny_model, tok, id_samples, deltas=[0], convention="sample").sort_values(["layer", "head"])
    assert torch.allclose(torch.tensor(got.score_sum.values), want.sum(0).flatten(), rtol=1e-5)
    raw_t = offset_table(tiny_model, tok, id_samples, deltas=[0], convention="raw")
    assert set(raw_t.convention) == {"raw"}
    assert (got.score_sum.values > raw_t.sort_values(["layer", "head"]).score_sum.values).all()
    with pytest.raises(ValueError, match="convention"):
        offset_table(tiny_model, tok, id_samples, convention="whole")
    with pytest.raises(TypeError, match="offset_table\\(\\) got an unexpected keyword argument 'conventions'"):
        offset_table(tiny_model, tok, id_samples, conventions="raw")
    with pytest.raises(TypeError, match="rank_heads\\(\\) got an unexpected keyword argument 'progres'"):
        rank_heads(tiny_model, tok, id_samples, progres=True)


def test_select_heads():
    r = pd.DataFrame(
        {"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "score_sum": [1.0, 3.0, 3.0, 0.5], "score_row": [4, 3, 2, 1]}
    )
    assert select_heads(r, top=2) == [(0, 1), (1, 0)]  # tie broken by layer
    assert select_heads(r, top=1, by="score_row") == [(0, 0)]
    assert select_heads(r, fraction=0.1) == [(0, 1)]  # rounds up, at least one
    assert select_heads(r, fraction=0.5) == [(0, 1), (1, 0)]
    assert n_selected(80, fraction=0.1) == 8
    for kw in ({"top": 0}, {"top": 5}, {"fraction": 0.0}, {}, {"top": 1, "fraction": 0.5}):
        with pytest.raises(ValueError):
            select_heads(r, **kw)
    with pytest.raises(ValueError, match="nope"):
        select_heads(r, top=1, by="nope")


def test_figures(tiny_model, tok, id_samples):
    long = offset_table(tiny_model, tok, id_samples, deltas=[0, 1])
    r = rank_heads(tiny_model, tok, id_samples)
    fig = heatmap(r)
    z = fig.data[0].z
    assert len(z) == 2 and len(z[0]) == 4
    assert z[1][2] == r[(r["layer"] == 1) & (r["head"] == 2)].score_sum.item()
    assert len(offset_heatmap(long).data[0].y) == 8
