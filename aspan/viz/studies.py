"""The studies' own figures (`aspan.applications.studies`): pure functions of the tables and calibrations the studies
computed, each returning a plotly figure."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def _interval_bars(mean, lo, hi) -> dict:
    """Plotly's asymmetric error bars from the mean to the ends of an interval (none where an end is NaN)."""
    return {"type": "data", "symmetric": False, "array": (hi - mean).fillna(0), "arrayminus": (mean - lo).fillna(0)}


def abc_study_figure(table: "pd.DataFrame", name: str):
    """`aspan study abc`: exact accuracy vs number of digits of task `name`, one line per condition (mean over seeds
    with its 95 % interval, the table's `exact_lo` / `exact_hi`)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for condition, g in table[table.task == name].groupby("condition", sort=False):
        fig.add_scatter(x=g.digits, y=g.exact_mean, error_y=_interval_bars(g.exact_mean, g.exact_lo, g.exact_hi),
                        mode="lines+markers", name=condition)
    fig.update_layout(title=f"{name}: exact accuracy vs length (trained on 1-6 digits; Duan & Shi 2023 protocol; "
                            "95 % intervals)",
                      xaxis={"title": "digits (bits for parity)", "type": "log"},
                      yaxis={"title": "exact", "range": [0, 1.02]})
    return fig


def abc_bias_figure(cal: dict, title: str):
    """`aspan study abc --protocol paper`, per head: the cross block of the averaged attention beside the bias
    calibrated from it (-1e4 shown blank)."""
    import torch
    from plotly.subplots import make_subplots

    rows, cols = cal["rows"], cal["prompt_cols"]
    attn = cal["attn"][:, rows][:, :, cols]
    bias = cal["bias"][:, rows][:, :, cols]
    n_heads = attn.shape[0]
    fig = make_subplots(rows=n_heads, cols=2, subplot_titles=[f"head {h} {w}" for h in range(n_heads)
                                                              for w in ("attention", "bias")])
    for h in range(n_heads):
        shown = torch.where(bias[h] > -1, bias[h], torch.tensor(float("nan")))
        fig.add_heatmap(z=attn[h].tolist(), row=h + 1, col=1, coloraxis="coloraxis")
        fig.add_heatmap(z=shown.tolist(), row=h + 1, col=2, coloraxis="coloraxis2")
    fig.update_yaxes(autorange="reversed", title_text="target row")
    fig.update_xaxes(title_text="operand column")
    fig.update_layout(title=title, height=260 * n_heads, coloraxis={"colorscale": "Viridis", "colorbar": {"x": 0.45}},
                      coloraxis2={"colorscale": "Reds_r"})
    return fig


def abc_accuracy_figure(table: "pd.DataFrame", name: str):
    """`aspan study abc --protocol paper`: exact accuracy vs digits of task `name` per condition, with the pooled
    Wilson 95 % interval."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for condition, g in table[table.task == name].groupby("condition", sort=False):
        fig.add_scatter(x=g.digits, y=g.exact_mean, mode="lines+markers", name=condition,
                        error_y={"type": "data", "symmetric": False, "array": g.wilson_high - g.exact_mean,
                                 "arrayminus": g.exact_mean - g.wilson_low})
    fig.update_layout(title=f"{name}: exact accuracy vs length (Duan & Shi 2023 protocol, padded layout)",
                      xaxis={"title": "digits", "type": "log"}, yaxis={"title": "exact", "range": [0, 1.02]})
    return fig


def parity_length_figure(summary: "pd.DataFrame", metric: str, train_length: int, seeds: int):
    """`aspan study parity`: `metric` ("exact" or "partial") against the input length, one line per format, the
    mean over `seeds` seeds with its 95 % interval (the summary's `METRIC_lo` / `METRIC_hi`), a dotted line past the
    training lengths (1 to `train_length` bits)."""
    import plotly.graph_objects as go

    name = {"exact": "exact accuracy", "partial": "per-token accuracy"}[metric]
    fig = go.Figure()
    for fmt, g in summary.groupby("format", sort=False):
        mean = g[f"{metric}_mean"]
        fig.add_scatter(x=g.bits, y=mean, error_y=_interval_bars(mean, g[f"{metric}_lo"], g[f"{metric}_hi"]),
                        mode="lines+markers", name=fmt)
    fig.add_vline(x=train_length + 0.5, line_dash="dot", annotation_text="training lengths | longer")
    fig.update_layout(title=f"Parity: {name} vs input length (trained on 1-{train_length} bits; "
                            f"mean over {seeds} seeds, 95 % intervals)", xaxis_title="input bits", yaxis_title=name,
                      yaxis_range=[-0.02, 1.02])
    return fig
