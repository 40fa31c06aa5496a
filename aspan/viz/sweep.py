"""Figures of an intervention sweep's rows (`aspan sweep`): accuracy vs length for the pick of the selection rule
(Spiegel et al. 2025, Fig. 2) and accuracy vs strength C per head selection.

The experiment helpers (`summary_table`, `select`) are imported inside the functions so `import aspan.viz` stays
light (no torch); `id_budget` defaults to the engine's `ID_BUDGET` (1 percentage point of ID exact accuracy).
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go


def _by_length(rows: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per-length accuracy (mean over the rows' seeds, weighted by samples) from the nested `column`."""
    flat = [dict(d) for lst in rows[column] for d in lst]
    df = pd.DataFrame(flat)
    df["exact_n"], df["partial_n"] = df.exact * df.n, df.partial * df.n
    g = df.groupby("length").sum(numeric_only=True)
    return pd.DataFrame({"exact": g.exact_n / g.n, "partial": g.partial_n / g.n, "n": g.n}).reset_index()


def length_figure(rows: pd.DataFrame, mode: str | None = None, id_budget: float | None = 0.01) -> go.Figure:
    """Accuracy vs length for the baseline and the intervention the selection rule picks (paper Fig. 2), one mode
    (without a pick within the ID budget: the pick at any ID cost, so the figure always shows an intervention)."""
    from ..experiments.edit import setting_label, setting_of
    from ..experiments.engine import select
    from ..experiments.sweep import summary_table

    mode = mode or rows["mode"].iloc[0]
    rows = rows[rows["set"] == "selection"]
    table = summary_table(rows[rows["mode"] == mode])
    best = select(table, id_budget).row or select(table, None).row or table.iloc[0].to_dict()
    chosen = setting_of(best)  # the one setting: every seed's row of it, and no row of a neighbouring gate or eos
    sel = rows[[setting_of(r) == chosen for r in rows.to_dict("records")]]
    base, inter = _by_length(sel, "baseline_by_length"), _by_length(sel, "by_length")
    label = f"{setting_label(best)}, ID cost {best['id_cost']:+.3f}"
    fig = go.Figure()
    for name, df, color in (("baseline", base, "#888"), (f"intervention ({label})", inter, "#d62728")):
        fig.add_scatter(x=df.length, y=df.exact, mode="lines+markers", name=f"{name}: exact", line={"color": color})
        fig.add_scatter(x=df.length, y=df.partial, mode="lines+markers", name=f"{name}: partial",
                        line={"color": color, "dash": "dot"})
    fig.update_layout(title=f"Accuracy vs length, baseline vs best intervention ({mode})", xaxis_title="target length",
                      yaxis_title="accuracy", yaxis={"range": [0, 1.02]})
    return fig


def strength_figure(rows: pd.DataFrame, mode: str | None = None, metric: str = "exact") -> go.Figure:
    """Accuracy vs strength C, one line per head selection (and per other setting that varies), baseline dashed."""
    from ..experiments.sweep import summary_table

    mode = mode or rows["mode"].iloc[0]
    table = summary_table(rows[rows["mode"] == mode])
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
