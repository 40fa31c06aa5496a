"""The pictures of a failure anatomy (`aspan.anatomy`): pure functions of its tables.

- `anatomy_figure`: output tokens x heads, each cell the head's attention mass on the token's (shifted) references,
  a column beside it marking each token right or wrong (the first error ruled across), and with an edit the same
  after it, side by side.
- `reference_view`: a circuitsvis view of the sample's attention whose references are highlighted: beside the heads'
  patterns, the reference map itself (and shifted by the heads' offset) as patterns of their own, so selecting one
  shows exactly where each row should read.
- `anatomy_length_figure`, `anatomy_leave_figure`: accuracy, mass and offset per length; where along each length
  each selected head's attention leaves its references.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .figures import _np
from .views import OfflineView, head_view

RIGHT, WRONG = "#2a9d8f", "#e76f51"
MAX_HEADS = 48  # heads a figure shows at most: the selected ones, then the others by mean mass


def ref_label(delta: int) -> str:
    """0 -> 'ref', 2 -> 'ref+2'."""
    return f"ref{delta:+d}" if delta else "ref"


def shown_heads(heads: pd.DataFrame, max_heads: int = MAX_HEADS, selected: Sequence[str] | None = None) -> list[str]:
    """The head names a figure shows: the selected heads first (in the order of `selected`, else the table's), then
    the others in layer and head order, or, past `max_heads`, those with the most mean mass on their references."""
    selected = list(selected or dict.fromkeys(heads.loc[heads.selected, "name"]))
    others = heads.loc[~heads.selected].groupby("name", sort=False).agg(layer=("layer", "first"),
                                                                         head=("head", "first"), mass=("mass", "mean"))
    room = max(0, max_heads - len(selected))
    if len(others) > room:
        others = others.sort_values("mass", ascending=False, kind="stable").head(room)
    return selected + list(others.sort_values(["layer", "head"]).index)


def _token_labels(tokens: pd.DataFrame) -> list[str]:
    return [f"{j}: {e}" for j, e in zip(tokens.index, tokens.expected)]


def _stage_traces(tokens: pd.DataFrame, heads: pd.DataFrame, names: list[str], suffix: str) -> list[go.BaseTraceType]:
    """The correctness column and the mass heatmap of one stage ("" before the edit, "_after" after it)."""
    ylab = _token_labels(tokens)
    correct = tokens[f"correct{suffix}"].astype(float).to_numpy()[:, None]
    predicted = tokens[f"predicted{suffix}"].astype(str).to_numpy()[:, None]
    mark = go.Heatmap(z=correct, x=["answer"], y=ylab, text=predicted, texttemplate="%{text}", zmin=0, zmax=1,
                      colorscale=[[0, WRONG], [1, RIGHT]], showscale=False,
                      hovertemplate="token %{y}<br>predicted %{text}<extra></extra>")
    wide = {c: heads.pivot(index="j", columns="name", values=f"{c}{suffix}").reindex(index=tokens.index,
                                                                                      columns=names)
            for c in ("mass", "top", "offset")}
    custom = np.dstack([wide["top"].to_numpy(float), wide["offset"].to_numpy(float)])
    selected = set(heads.loc[heads.selected, "name"])
    xlab = [f"★ {n}" if n in selected else n for n in names]
    heat = go.Heatmap(z=wide["mass"].to_numpy(float), x=xlab, y=ylab, customdata=custom, coloraxis="coloraxis",
                      hovertemplate="token %{y}, %{x}<br>mass %{z:.3f}<br>top position %{customdata[0]:.0f}, "
                                    "offset %{customdata[1]:+.0f} from the nearest reference<extra></extra>")
    return [mark, heat]


def anatomy_figure(tokens: pd.DataFrame, heads: pd.DataFrame, delta: int = 0, title: str | None = None,
                   max_heads: int = MAX_HEADS, selected: Sequence[str] | None = None) -> go.Figure:
    """Output tokens x heads: each head's attention mass on the token's references shifted by `delta`, the selected
    heads marked ★ and first; a column marking each token right (green) or wrong (red, with the predicted token), the
    first error ruled across; after an edit (columns `*_after`) the same panels again, to the right.

    `tokens`: one row per output token (index j; expected, predicted, correct), `heads`: one row per token and head
    (j, name, layer, head, selected, mass, top, offset), as `aspan.anatomy.Anatomy` holds them; `selected`: the
    selected heads' names in the order to show them."""
    if tokens.empty:
        raise ValueError("anatomy_figure: no output tokens")
    names = shown_heads(heads, max_heads, selected)
    stages = [""] + (["_after"] if "mass_after" in heads.columns else [])
    titles = []
    for s in stages:
        titles += ["answer" if not s else "answer after", "mass on " + ref_label(delta) + (" after the edit" if s
                                                                                            else "")]
    width = 1 / (len(stages) * (1 + max(4, len(names)) / 2))
    fig = make_subplots(rows=1, cols=2 * len(stages), shared_yaxes=True, subplot_titles=titles,
                        column_widths=[w for _ in stages for w in (width, (1 - len(stages) * width) / len(stages))],
                        horizontal_spacing=0.02)
    for i, s in enumerate(stages):
        mark, heat = _stage_traces(tokens, heads, names, s)
        fig.add_trace(mark, row=1, col=2 * i + 1)
        fig.add_trace(heat, row=1, col=2 * i + 2)
        wrong = tokens.index[~tokens[f"correct{s}"].astype(bool)]
        if len(wrong):
            y = _token_labels(tokens)[list(tokens.index).index(wrong[0])]
            fig.add_shape(type="line", x0=0, x1=1, y0=y, y1=y, xref="x domain", yref="y", row=1, col=2 * i + 2,
                          line=dict(color=WRONG, dash="dot", width=2), name="first error")
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="category", tickangle=-45)
    fig.update_layout(title=title or f"Attention on the references ({ref_label(delta)}) per output token and head",
                      coloraxis=dict(colorscale="Blues", cmin=0, cmax=1, colorbar_title="mass"),
                      height=max(380, 18 * len(tokens) + 220))  # the width follows the page
    return fig


def reference_view(patterns: Mapping[str, Any], mask: Any, tokens: Sequence[str], delta: int = 0,
                   span: tuple[int, int] | None = None) -> OfflineView:
    """circuitsvis view of the heads' `[pos, pos]` patterns (`{name: pattern}`), with the references highlighted:
    the reference map `mask` (bool `[pos, pos]`, row = query) spread evenly over each row is added as a pattern
    named "references", and with `delta` the map shifted by it as "references ref+δ" (where the heads read), so
    selecting it shows each row's references; hovering a query token colours them."""
    m = _np(mask).astype(bool)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"mask must be [pos, pos], got shape {m.shape}")
    maps = {"references": m}
    if delta:
        shifted = np.zeros_like(m)
        lo, hi = max(delta, 0), m.shape[1] + min(delta, 0)
        shifted[:, lo:hi] = m[:, lo - delta:hi - delta]
        maps[f"references {ref_label(delta)}"] = shifted & np.tri(*m.shape, dtype=bool)  # the causal part
    stack = [_np(p) for p in patterns.values()]
    for ref in maps.values():
        rows = ref.sum(-1, keepdims=True)
        stack.append(np.where(rows > 0, ref / np.maximum(rows, 1), 0.0))
    return head_view(np.stack(stack), tokens, [*patterns, *maps], span=span)


# ----------------------------------------------------------------------------------------------- across lengths
def anatomy_length_figure(by_length: pd.DataFrame, delta: int = 0, title: str | None = None) -> go.Figure:
    """Per length: exact and per-token accuracy, the selected heads' mass on their references (`mass`) and the share
    of rows whose top position is at `ref+δ` (`on_ref`); the mean offset of their top positions on a second axis."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    lines = {"exact": "exact accuracy", "partial": "per-token accuracy", "mass": f"mass on {ref_label(delta)}",
             "on_ref": f"top position at {ref_label(delta)}"}
    for col, name in lines.items():
        fig.add_scatter(x=by_length.length, y=by_length[col], mode="lines+markers", name=name, secondary_y=False)
    fig.add_scatter(x=by_length.length, y=by_length.offset, mode="lines+markers", name="mean offset of the top "
                    "position", line=dict(dash="dot"), secondary_y=True)
    fig.update_yaxes(title_text="accuracy / share", range=[-0.02, 1.02], secondary_y=False)
    fig.update_yaxes(title_text="offset (positions)", secondary_y=True)
    fig.update_layout(title=title or "Accuracy and the selected heads' attention per length", xaxis_title="length")
    return fig


def anatomy_leave_figure(by_token: pd.DataFrame, leaves: pd.DataFrame, delta: int = 0, threshold: float = 0.5,
                 title: str | None = None) -> go.Figure:
    """One panel per selected head: length x output token, the head's mean mass on `ref+δ`; a marker at the first
    token of each length whose mean mass is below `threshold` (where the attention leaves the references)."""
    names = list(dict.fromkeys(by_token.name))
    if not names:
        raise ValueError("anatomy_leave_figure: no heads")
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names, shared_yaxes=True, horizontal_spacing=0.04)
    for i, name in enumerate(names, start=1):
        d = by_token[by_token.name == name].pivot(index="length", columns="j", values="mass").sort_index()
        fig.add_trace(go.Heatmap(z=d.to_numpy(float), x=list(d.columns), y=list(d.index), coloraxis="coloraxis",
                                 hovertemplate="length %{y}, token %{x}<br>mass %{z:.3f}<extra>" + name
                                 + "</extra>"), row=1, col=i)
        off = leaves[(leaves.name == name) & leaves.first_token.notna()]
        fig.add_scatter(x=off.first_token, y=off.length, mode="markers", marker=dict(symbol="x", color=WRONG,
                        size=8), name=f"first token below {threshold:g}", showlegend=i == 1,
                        hovertemplate="length %{y}: leaves at token %{x}<extra></extra>", row=1, col=i)
        fig.update_xaxes(title_text="output token", row=1, col=i)
    fig.update_yaxes(title_text="length", row=1, col=1)
    fig.update_layout(title=title or f"Where each selected head's attention leaves {ref_label(delta)}",
                      coloraxis=dict(colorscale="Blues", cmin=0, cmax=1, colorbar_title="mass"),
                      height=max(380, 16 * by_token.length.nunique() + 200), width=max(700, 380 * len(names)))
    return fig
