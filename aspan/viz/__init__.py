"""Figures (plotly, pure functions of data returning `go.Figure`) and circuitsvis head views (offline HTML).

    fig = viz.rollout_heatmap(R[0], batch.ref_mask[0], tokens)      # paper Fig. 1
    viz.save_figure(fig, run_dir / "figures" / "rollout.json")
    viz.save_view(viz.head_view(patterns, tokens, names), run_dir / "views" / "heads.html")
"""
from ..io import save_figure  # one writer for every file (re-exported for figure users)
from .anatomy import anatomy_figure, anatomy_leave_figure, anatomy_length_figure, reference_view
from .buckets import accuracy_by_bucket, accuracy_vs_frequency
from .figures import (
    accuracy_vs_length,
    accuracy_vs_strength,
    correct_vs_error,
    layer_head_heatmap,
    offset_heatmap,
    pattern_across_lengths,
    rollout_heatmap,
)
from .pareto import pareto_figure, pareto_front
from .sweep import length_figure, strength_figure
from .views import head_view, save_view

__all__ = [
    "anatomy_figure",
    "anatomy_leave_figure",
    "anatomy_length_figure",
    "reference_view",
    "accuracy_by_bucket",
    "accuracy_vs_frequency",
    "accuracy_vs_length",
    "accuracy_vs_strength",
    "correct_vs_error",
    "layer_head_heatmap",
    "length_figure",
    "offset_heatmap",
    "pareto_figure",
    "pareto_front",
    "pattern_across_lengths",
    "rollout_heatmap",
    "save_figure",
    "strength_figure",
    "head_view",
    "save_view",
]
