"""Figures of an intervention sweep (`aspan sweep`): accuracy vs length for the pick of the selection rule
(Spiegel et al. 2025, Fig. 2) and accuracy vs strength C per head selection. They draw what the experiment layer
computed (`aspan.experiments.sweep.selected_curves`, `summary_table`) and import nothing from it.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go


def length_figure(curves) -> go.Figure:
    """Accuracy vs length of the baseline and of the intervention the selection rule picks (paper Fig. 2): `curves`
    holds `mode`, `baseline` and `intervention` (per-length exact and partial accuracy) and the setting's `label`
    (`aspan.experiments.sweep.selected_curves`)."""
    fig = go.Figure()
    for name, df, color in (("baseline", curves.baseline, "#888"),
                            (f"intervention ({curves.label})", curves.intervention, "#d62728")):
        fig.add_scatter(x=df.length, y=df.exact, mode="lines+markers", name=f"{name}: exact", line={"color": color})
        fig.add_scatter(x=df.length, y=df.partial, mode="lines+markers", name=f"{name}: partial",
                        line={"color": color, "dash": "dot"})
    fig.update_layout(title=f"Accuracy vs length, baseline vs best intervention ({curves.mode})",
                      xaxis_title="target length", yaxis_title="accuracy", yaxis={"range": [0, 1.02]})
    return fig


def strength_figure(table: pd.DataFrame, mode: str, metric: str = "exact") -> go.Figure:
    """Accuracy vs strength C, one line per head selection (and per other setting that varies), baseline dashed:
    `table` is the summary of one mode's rows (`aspan.experiments.sweep.summary_table`)."""
    vary = [c for c in ("method", "threshold", "renormalize", "delta", "gate", "eos")
            if table[c].astype(str).nunique() > 1]
    fig = go.Figure()
    for key, g in table.groupby(["n_heads", "heads", *vary], sort=True):
        g = g.sort_values("strength")
        name = f"{key[1]} ({key[0]} heads)" + "".join(f" {c}={v}" for c, v in zip(vary, key[2:]))
        fig.add_scatter(x=g.strength, y=g[metric], mode="lines+markers", name=name)
    fig.add_hline(y=float(table[f"baseline_{metric}"].mean()), line_dash="dash", line_color="#888",
                  annotation_text="baseline")
    fig.update_layout(title=f"{metric.capitalize()} accuracy vs strength C per head selection ({mode})",
                      xaxis_title="strength C", yaxis_title=f"{metric} accuracy")
    return fig
