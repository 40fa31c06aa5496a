"""The position rows of the paper-protocol ABC study, counted on the device (`abc_paper.row_counts`), equal those
`evaluate`'s per-token records give (what the study computed before), with and without an attention bias."""
from __future__ import annotations

import pytest

from aspan import models
from aspan.applications.studies import abc_paper as ap
from aspan.evaluation import evaluate
from aspan.training import TrainConfig, train


def _records_rows(model, tok, samples, bias, batch_size):
    rec = evaluate(model, tok, samples, fwd_hooks=bias, batch_size=batch_size, attn=False).records
    rec = rec[rec.scored]
    out = {}
    for row, g in rec.groupby("target_index"):
        wrong_zero = (g.pred_char == "0") & (g.target_char != "0")
        out[int(row)] = (float(g.correct.mean()), float(wrong_zero.sum() / max(1, (g.target_char != "0").sum())))
    return out


@pytest.mark.parametrize("task", ["successor", "addition", "parity"])
@pytest.mark.parametrize("biased", [False, True])
def test_row_counts_equal_the_per_token_records(task, biased):
    cfg = ap.PaperConfig.quick(n_test=40)
    data = ap.paper_data(task, cfg)
    model = models.tiny(data.tokenizer, n_layers=1, n_heads=2, d_model=16, n_ctx=data.n_ctx, seed=3,
                        positional="learned")
    train(model, data.tokenizer, data.train, TrainConfig.scratch(steps=60, batch_size=16, lr=1e-2, seed=0),
          progress=False)  # part-trained: some rows right, some wrong
    bias = ap.hooks_for_bias(ap.abs_bias(data.check[0], data.tokenizer, 1), model) if biased else ()
    samples = data.test[max(cfg.buckets)]
    want = _records_rows(model, data.tokenizer, samples, bias, 16)
    counts = ap.row_counts(model, data.tokenizer, samples, bias, 16)
    got = {row: (c[1] / c[0], c[2] / max(1, c[3])) for row, c in counts.items()}
    assert got == want and len(want) > 2
    assert any(a > 0 for a, _ in want.values()) and any(a < 1 for a, _ in want.values()), "a real mix"
