"""Figures of accuracy per length bucket: grouped bars per condition, and accuracy against RoPE pair frequency."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go


def _need(rows: pd.DataFrame, cols: list[str], what: str) -> None:
    for col in cols:
        if col not in rows:
            raise ValueError(f"{what}: rows have no column {col!r} (columns: {list(rows.columns)})")


def accuracy_by_bucket(
    rows: pd.DataFrame,
    y: str = "exact",
    group: str | None = None,
    error: str | tuple[str, str] | None = None,
    title: str = "Accuracy by length bucket",
) -> go.Figure:
    """Bars of `y` per `bucket` (in row order), one bar group per value of `group`; `error` gives error bars: one
    column (symmetric) or (plus, minus) columns (an asymmetric interval, e.g. Wilson)."""
    _need(rows, ["bucket", y, *([group] if group else []), *_error_columns(error)], "accuracy_by_bucket")
    fig = go.Figure()
    parts = rows.groupby(group, sort=False) if group else [(y, rows)]
    for name, d in parts:
        fig.add_bar(error_y=_error_bars(d, error), x=d["bucket"].tolist(), y=d[y].tolist(), name=str(name))
    fig.update_layout(title=title, barmode="group", xaxis_title="length bucket", yaxis_title=y,
                      yaxis_range=[0, 1.05])
    return fig


def accuracy_vs_frequency(
    rows: pd.DataFrame,
    y: str = "exact",
    error: str | tuple[str, str] | None = None,
    baselines: dict[str, float] | None = None,
    title: str = "Accuracy against the RoPE pair's rotation frequency",
) -> go.Figure:
    """`y` against `frequency` (radians per position, log axis), one line per `bucket`; dashed `baselines` per bucket
    (e.g. full fine-tuning) in the same colour order; `error` as in `accuracy_by_bucket`."""
    _need(rows, ["bucket", "frequency", y, *_error_columns(error)], "accuracy_vs_frequency")
    fig = go.Figure()
    for name, d in rows.groupby("bucket", sort=False):
        d = d.sort_values("frequency")
        fig.add_scatter(x=d["frequency"].tolist(), y=d[y].tolist(), mode="lines+markers", name=str(name),
                        error_y=_error_bars(d, error),
                        text=d["condition"].tolist() if "condition" in d else None)
    for name, value in (baselines or {}).items():
        fig.add_hline(y=value, line_dash="dash", annotation_text=name)
    fig.update_layout(title=title, xaxis_type="log", xaxis_title="rotation frequency base^(-2i/rotary_dim) (rad/token)",
                      yaxis_title=y, yaxis_range=[0, 1.05])
    return fig


def _error_columns(error: str | tuple[str, str] | None) -> list[str]:
    return [] if not error else [error] if isinstance(error, str) else list(error)


def _error_bars(d: pd.DataFrame, error: str | tuple[str, str] | None) -> dict | None:
    """plotly error bars from one column (symmetric) or (plus, minus) columns; missing values draw no bar."""
    if not error:
        return None
    if isinstance(error, str):
        return dict(type="data", array=d[error].fillna(0).tolist())
    plus, minus = error
    return dict(type="data", symmetric=False, array=d[plus].fillna(0).tolist(), arrayminus=d[minus].fillna(0).tolist())
