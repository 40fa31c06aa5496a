"""`aspan.viz.studies`: the ABC studies' figures draw one line per condition of the task asked for."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from aspan.viz.studies import abc_accuracy_figure, abc_bias_figure, abc_study_figure, parity_length_figure

TABLE = pd.DataFrame([{"task": t, "condition": c, "digits": d, "exact_mean": m, "exact_sd": 0.1, "wilson_low": m - 0.1,
                       "wilson_high": min(1.0, m + 0.1), "exact_lo": m - 0.2, "exact_hi": min(1.0, m + 0.05)}
                      for t in ("addition", "parity") for c in ("vanilla", "abc") for d, m in ((6, 0.9), (60, 0.2))])


def test_accuracy_figures_draw_each_condition_of_one_task():
    for figure in (abc_study_figure, abc_accuracy_figure):
        fig = figure(TABLE, "addition")
        assert [t.name for t in fig.data] == ["vanilla", "abc"]
        assert list(fig.data[0].x) == [6, 60] and list(fig.data[0].y) == [0.9, 0.2]
    assert list(abc_accuracy_figure(TABLE, "parity").data[1].error_y.arrayminus) == pytest.approx([0.1, 0.1])
    bars = abc_study_figure(TABLE, "parity").data[1].error_y  # the 95 % interval of the mean over seeds, not ± sd
    assert list(bars.arrayminus) == pytest.approx([0.2, 0.2]) and list(bars.array) == pytest.approx([0.05, 0.05])


def test_bias_figure_shows_attention_beside_the_bias_per_head():
    attn = torch.rand(2, 5, 5)
    bias = torch.where(attn > 0.5, torch.zeros(2, 5, 5), torch.full((2, 5, 5), -1e4))
    fig = abc_bias_figure({"attn": attn, "bias": bias, "rows": [3, 4], "prompt_cols": [0, 1, 2]}, "t")
    assert len(fig.data) == 4 and len(fig.data[0].z) == 2 and len(fig.data[0].z[0]) == 3


def test_parity_figure_draws_each_format_against_the_bits():
    summary = pd.DataFrame([{"format": f, "bits": b, "exact_mean": 0.5, "exact_sd": float("nan"), "partial_mean": 0.7,
                             "partial_sd": 0.1, "exact_lo": float("nan"), "exact_hi": float("nan"), "partial_lo": 0.4,
                             "partial_hi": 0.8} for f in ("plain", "scratchpad") for b in (3, 6, 15)])
    fig = parity_length_figure(summary, "partial", 3, 2)
    assert [t.name for t in fig.data] == ["plain", "scratchpad"] and list(fig.data[1].y) == [0.7] * 3
    assert "1-3 bits" in fig.layout.title.text and "over 2 seeds" in fig.layout.title.text
    assert "95 % intervals" in fig.layout.title.text
    assert list(fig.data[0].error_y.arrayminus) == pytest.approx([0.3] * 3)
    assert list(fig.data[0].error_y.array) == pytest.approx([0.1] * 3)
    assert list(parity_length_figure(summary, "exact", 3, 2).data[0].error_y.array) == [0, 0, 0]  # no interval
