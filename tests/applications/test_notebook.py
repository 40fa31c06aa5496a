"""The notebooks' shared helpers (aspan.applications.notebook) on the shipped reversal model: one sample as a batch,
token labels, the rollout figure, summary tables without unmeasured columns, the checkpoint's evaluation in words and
the preset table."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hooks
from aspan import models, tasks
from aspan.applications.notebook import Inspector, checkpoint_eval, computed, preset_table, summaries
from aspan.evaluation import evaluate


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(1)
    model, tokenizer, meta = models.load("reversal")
    return model, tokenizer, meta


def test_one_sample_labels_and_rollout_figure(shipped):
    model, tokenizer, _ = shipped
    view = Inspector(model, tokenizer)
    sample = tasks.get("reversal", length=(6, 6)).generate(1, seed=0)[0]
    batch, n = view.one(sample)
    assert batch.tokens.shape[0] == 1 and n == len(sample.text) + 2  # BOS, the text, EOS
    names = view.labels(batch.tokens[0, :n].tolist())
    assert names == ["<bos>", *sample.text, "<eos>"]
    fig = view.rollout_figure(sample, "Rollout")
    heat = fig.data[0]
    assert len(heat.z) == len(sample.target) and len(heat.z[0]) == n  # the target rows x every position
    assert fig.layout.title.text == "Rollout"
    # measured through the edit: reinforcing every head on the references changes the rollout
    edit = hooks.reinforce([(0, h) for h in range(model.cfg.n_heads)], mask=batch.ref_mask, strength=4.0)
    edited = view.rollout_figure(sample, "Rollout", fwd_hooks=edit).data[0]
    assert not np.allclose(np.asarray(edited.z, dtype=float), np.asarray(heat.z, dtype=float))


def test_summaries_show_only_the_columns_measured(shipped):
    model, tokenizer, _ = shipped
    samples = tasks.preset("reversal", "id").generate(8, seed=0)
    plain, no_attn = evaluate(model, tokenizer, samples), evaluate(model, tokenizer, samples, attn=False)
    heads = evaluate(model, tokenizer, samples, heads=[(1, 0)])
    assert not any(k.startswith("attn_heads") for k in plain.summary())  # unmeasured heads: no column at all
    table = summaries({"plain": plain, "heads": heads})
    assert list(table.index) == ["plain", "heads"] and table.n.tolist() == [8, 8]
    assert {"attn_rollout_sample", "attn_rollout_raw", "attn_heads_sample", "attn_heads_raw"} <= set(table.columns)
    plain_only = summaries({"plain": plain})
    assert not any(c.startswith("attn_heads") for c in plain_only.columns)
    assert "attn_rollout_sample" in plain_only.columns
    bare = summaries({"no attention": no_attn.summary()})
    assert list(bare.columns) == ["exact", "partial", "n"] and bare.loc["no attention", "exact"] == 1.0
    assert list(computed(bare).columns) == list(bare.columns)


def test_checkpoint_eval_names_its_lengths(shipped):
    _, _, meta = shipped
    text = checkpoint_eval(meta)
    ood = meta["eval"]["ood"]
    assert text.startswith("ID 1-10: exact 1.000, per-token 1.000 (200 samples)")
    assert f"OOD 11-50: exact {ood['exact']:.3f}, per-token {ood['partial']:.3f} (200 samples)" in text
    assert checkpoint_eval({}) == "no evaluation recorded"


def test_preset_table_keeps_words_and_shortens_symbol_sets():
    table = preset_table()
    assert list(table.index) == list(tasks.NAMES)
    assert "format=scratchpad" in table.loc["parity", "ID preset"]
    assert "charset=abc..89 (62 symbols)" in table.loc["reversal", "ID preset"]
    assert "length=[11, 50]" in table.loc["reversal", "OOD preset"]
