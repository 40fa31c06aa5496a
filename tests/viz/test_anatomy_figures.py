"""The anatomy's pictures: the plotly figure (tokens x heads, mass, errors marked, selected heads first, the edit
side by side), the circuitsvis view with the references as patterns of their own (offline), the per-length figures."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from aspan import viz
from aspan.viz.anatomy import shown_heads


def tables(after: bool = False):
    tokens = pd.DataFrame({"expected": list("cba") + ["<eos>"], "predicted": list("cxa") + ["<eos>"],
                           "correct": [True, False, True, True]}, index=pd.Index(range(4), name="j"))
    rows = []
    for j in range(4):
        for layer, head, mass in ((0, 0, 0.1), (1, 1, 0.9), (1, 0, 0.5)):
            rows.append({"j": j, "name": f"L{layer}H{head}", "layer": layer, "head": head,
                         "selected": (layer, head) == (1, 1), "mass": mass if j < 3 else np.nan, "top": j,
                         "offset": 2.0 if j < 3 else np.nan})
    heads = pd.DataFrame(rows)
    if after:
        tokens = tokens.assign(predicted_after=list("cba") + ["<eos>"], correct_after=True)
        heads = heads.assign(mass_after=heads.mass + 0.05, top_after=heads.top, offset_after=heads.offset)
    return tokens, heads


def test_the_figure_shows_tokens_by_heads_with_the_errors_marked():
    tokens, heads = tables()
    fig = viz.anatomy_figure(tokens, heads, delta=2)
    mark, heat = fig.data
    assert list(mark.y) == ["0: c", "1: b", "2: a", "3: <eos>"] and mark.z.tolist() == [[1.0], [0.0], [1.0], [1.0]]
    assert mark.text.tolist() == [["c"], ["x"], ["a"], ["<eos>"]]
    assert list(heat.x) == ["★ L1H1", "L0H0", "L1H0"]  # the selected head first, then layer and head order
    assert np.allclose(np.array(heat.z, float)[:3], [[0.9, 0.1, 0.5]] * 3) and np.isnan(heat.z[3]).all()
    first = [s for s in fig.layout.shapes if s.name == "first error"]
    assert len(first) == 1 and first[0].y0 == "1: b"
    assert "ref+2" in fig.layout.title.text and json.loads(fig.to_json())  # serialisable for a report


def test_the_edit_goes_side_by_side():
    tokens, heads = tables(after=True)
    fig = viz.anatomy_figure(tokens, heads, delta=2)
    assert len(fig.data) == 4 and fig.data[2].z.tolist() == [[1.0]] * 4
    assert np.allclose(np.array(fig.data[3].z, float)[0], [0.95, 0.15, 0.55])
    assert [s.name for s in fig.layout.shapes] == ["first error"]  # nothing is wrong after the edit


def test_past_max_heads_the_others_are_those_with_the_most_mass():
    _, heads = tables()
    assert shown_heads(heads, max_heads=2) == ["L1H1", "L1H0"]
    assert shown_heads(heads, selected=["L1H1"]) == ["L1H1", "L0H0", "L1H0"]
    with pytest.raises(ValueError, match="no output tokens"):
        viz.anatomy_figure(tables()[0].iloc[:0], heads)


def test_the_view_highlights_the_references_offline():
    mask = torch.zeros(5, 5, dtype=torch.bool)
    mask[3, 1] = mask[4, 0] = True
    view = viz.reference_view({"L1H7": torch.eye(5)}, mask, list("<ab=b"), delta=2)
    html = view.local_src
    props = json.loads(html[html.index("CircuitsVis.AttentionHeads,") + len("CircuitsVis.AttentionHeads,"):
                            html.rindex(")")].strip().rstrip(")").strip())
    assert props["attentionHeadNames"] == ["L1H7", "references", "references ref+2"]
    refs, shifted = np.array(props["attention"][1]), np.array(props["attention"][2])
    assert refs[3, 1] == refs[4, 0] == 1 and refs.sum() == 2
    assert shifted[3, 3] == 1 and shifted[4, 2] == 1 and shifted.sum() == 2  # ref+2, inside the causal part
    assert "unpkg.com" not in html and view._repr_html_() == html  # the notebook display is the offline page
    with pytest.raises(ValueError, match="mask must be"):
        viz.reference_view({"x": torch.eye(3)}, torch.zeros(3, 2), list("abc"))


def test_the_length_figures():
    by_length = pd.DataFrame({"length": [11, 12], "exact": [0.5, 0.0], "partial": [0.9, 0.4], "mass": [0.8, 0.2],
                              "on_ref": [0.9, 0.3], "offset": [2.0, 4.5]})
    fig = viz.anatomy_length_figure(by_length, delta=2)
    assert [t.name for t in fig.data][-1] == "mean offset of the top position" and len(fig.data) == 5
    by_token = pd.DataFrame({"length": [11, 11, 12, 12], "name": "L1H7", "j": [0, 1, 0, 1],
                             "mass": [0.9, 0.8, 0.9, 0.1]})
    leaves = pd.DataFrame({"name": ["L1H7", "L1H7"], "length": [11, 12], "first_token": [np.nan, 1.0]})
    fig = viz.anatomy_leave_figure(by_token, leaves, delta=2)
    assert fig.data[0].z.tolist() == [[0.9, 0.8], [0.9, 0.1]]
    assert list(fig.data[1].x) == [1.0] and list(fig.data[1].y) == [12]
