"""The sweep figures live in aspan.viz and draw what aspan.experiments.sweep computes; the pick's ID budget default is
the engine's selection budget."""
import inspect

from aspan.experiments.engine import ID_BUDGET
from aspan.experiments.sweep import selected_curves
from aspan.viz import length_figure


def test_the_picked_curves_default_to_the_engines_id_budget():
    assert inspect.signature(selected_curves).parameters["id_budget"].default == ID_BUDGET


def _row(gate, eos, exact, by_length_exact):
    metrics = {m: 0.5 for m in ("attn_rollout_sample", "attn_rollout_raw", "attn_heads_sample", "attn_heads_raw",
                                "baseline_attn_rollout_sample", "baseline_attn_rollout_raw", "id_partial",
                                "id_baseline_partial", "partial", "baseline_partial")}
    row = {"set": "selection", "mode": "teacher", "method": "reinforce", "heads": "list:1.0", "n_heads": 1,
           "strength": 1.0, "threshold": None, "renormalize": False, "delta": 0, "seed": 0, "n": 4, **metrics,
           "exact": exact, "baseline_exact": 0.0, "id_exact": 1.0, "id_baseline_exact": 1.0,
           "by_length": [{"length": 11, "n": 4, "exact": by_length_exact, "partial": 0.5}],
           "baseline_by_length": [{"length": 11, "n": 4, "exact": 0.0, "partial": 0.5}]}
    return {**row, **({"gate": gate} if gate else {}), **({"eos": eos} if eos != "none" else {})}


def test_length_figure_shows_only_the_selected_gate_and_eos():
    """Rows that differ only in gate or eos are other settings: the selected curve is the chosen one's alone."""
    import pandas as pd

    rows = pd.DataFrame([_row(None, "none", 0.25, 0.25), _row("beyond", "none", 0.75, 0.75),
                         _row("beyond", "extrapolate", 0.5, 0.5), _row(None, "extrapolate", 0.0, 0.0)])
    fig = length_figure(selected_curves(rows))
    chosen = next(t for t in fig.data if t.name.startswith("intervention") and t.name.endswith("exact"))
    assert list(chosen.y) == [0.75] and "(gate beyond)" in chosen.name and "EOS" not in chosen.name
