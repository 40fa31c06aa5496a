"""Learning curves: accuracy against training step, one line per curve set (and per run when several are given)."""
from __future__ import annotations

from typing import Mapping

import pandas as pd
import plotly.graph_objects as go

from ..options import CurveMetric


def learning_curves(runs: pd.DataFrame | Mapping[str, pd.DataFrame], y: CurveMetric = "exact",
                    title: str | None = None) -> go.Figure:
    """`y` against `step` from `curves.jsonl` rows: one line per `bucket`, or per (run, bucket) when `runs` maps
    run (condition) names to their rows. ValueError naming a run whose rows lack a column."""
    runs = {"": runs} if isinstance(runs, pd.DataFrame) else dict(runs)
    if not runs:
        raise ValueError("learning_curves needs the rows of at least one run")
    fig = go.Figure()
    for name, rows in runs.items():
        missing = [c for c in ("step", "bucket", y) if c not in rows]
        if missing:
            raise ValueError(f"curve rows{f' of {name}' if name else ''} have no column {missing[0]!r} "
                             f"(columns: {list(rows.columns)})")
        for bucket, d in rows.groupby("bucket", sort=False):
            d = d.sort_values("step")
            fig.add_scatter(x=d["step"], y=d[y], mode="lines+markers", name=f"{name}: {bucket}" if name else bucket)
    what = "exact accuracy" if y == "exact" else "per-token accuracy"
    fig.update_layout(title=title or f"Learning curves: {what} on held-out sets during training", xaxis_title="step",
                      yaxis_title=y, yaxis_range=[-0.02, 1.02])
    return fig
