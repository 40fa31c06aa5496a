"""The demo over model seeds: per model and over the models, the held-out numbers of each condition of `aspan demo`
(baseline, the paper's recipe, the selected edit, the patching upper bound), recomputed from each run's per-sample
held-out records (`held_out_samples.csv`), with 95 % intervals: Wilson for one model's exact accuracy on its
held-out samples; over the models, for exact accuracy the wider of Student's t over the models and the Wilson
interval of every model's answers pooled (`aspan.intervals.seed_interval`), for per-token accuracy and the ID cost
Student's t over the models.

    python results/causal_demo/model_seeds/aggregate.py RUN_DIR... OUT_DIR   # each RUN_DIR an `aspan demo` run

Writes OUT_DIR/by_model.csv (one row per model and condition), OUT_DIR/over_models.csv (one row per condition),
OUT_DIR/summary.json and OUT_DIR/figures/selected_by_model.json (plotly).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from aspan.intervals import seed_interval, t_interval, wilson
from aspan.io import RunDir

CONDITIONS = ("baseline", "paper_recipe", "selected", "upper_bound")


def by_model(run_dirs: list[Path]) -> pd.DataFrame:
    """One row per (model, condition): held-out OOD exact (with its Wilson interval) and per-token accuracy (with the
    t interval over the samples), held-out ID exact and the ID cost (the baseline's held-out ID exact minus the
    edit's), the edit chosen."""
    out = []
    for run in run_dirs:
        info = json.loads((run / "run.json").read_text())
        summary = json.loads((run / "summary.json").read_text())
        rows = pd.read_csv(run / "held_out_samples.csv")
        seed = info["model_meta"]["seed"]
        base_id = rows[(rows.condition == "baseline") & (rows.set == "id_held_out")].exact.mean()
        for name in CONDITIONS:
            ood = rows[(rows.condition == name) & (rows.set == "ood_held_out")]
            held_id = rows[(rows.condition == name) & (rows.set == "id_held_out")]
            if ood.empty:
                continue
            k, n = int(ood.exact.sum()), len(ood)
            lo, hi = wilson(k, n)
            plo, phi = t_interval(list(ood.partial))
            out.append({"model_seed": seed, "model": info["model"], "condition": name,
                        "edit": summary[name]["method"], "n": n, "ood_exact": k / n, "ood_exact_lo": lo,
                        "ood_exact_hi": hi, "ood_partial": ood.partial.mean(), "ood_partial_lo": plo,
                        "ood_partial_hi": phi, "id_exact": held_id.exact.mean(),
                        "id_cost": base_id - held_id.exact.mean(),
                        "id_model": info["model_meta"]["eval"]["id"]["exact"]})
    return pd.DataFrame(out)


def over_models(table: pd.DataFrame) -> pd.DataFrame:
    """One row per condition: means over the models with their 95 % intervals."""
    out = []
    for name in CONDITIONS:
        g = table[table.condition == name].sort_values("model_seed")
        if g.empty:
            continue
        n = int(g.n.iloc[0])
        row = {"condition": name, "models": len(g), "seeds": " ".join(map(str, g.model_seed)), "n_each": n}
        for col in ("ood_exact", "ood_partial", "id_exact", "id_cost"):
            vals = list(g[col])
            row[col] = sum(vals) / len(vals)
            bounds = (-1.0, 1.0) if col == "id_cost" else (0.0, 1.0)
            row[f"{col}_lo"], row[f"{col}_hi"] = (seed_interval(vals, n) if col == "ood_exact" else
                                                  t_interval(vals, bounds=bounds))
        out.append(row)
    return pd.DataFrame(out)


def figure(table: pd.DataFrame, over: pd.DataFrame):
    """The selected edit's held-out OOD exact and per-token accuracy per model and their mean over the models, beside
    the baseline, with 95 % intervals and the demo's goal (exact 0.50, per-token 0.95) dashed."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("held-out OOD exact", "held-out OOD per-token"))
    for name, colour in (("baseline", "#7f7f7f"), ("selected", "#d62728")):
        g = table[table.condition == name].sort_values("model_seed")
        m = over[over.condition == name].iloc[0]
        x = [f"model seed {s}" for s in g.model_seed] + ["mean of the models"]
        for col, metric in enumerate(("ood_exact", "ood_partial"), 1):
            y = [*g[metric], m[metric]]
            lo, hi = [*g[f"{metric}_lo"], m[f"{metric}_lo"]], [*g[f"{metric}_hi"], m[f"{metric}_hi"]]
            fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name=name, showlegend=col == 1,
                                     marker={"color": colour, "size": 10},
                                     error_y={"type": "data", "symmetric": False,
                                              "array": [h - v for h, v in zip(hi, y)],
                                              "arrayminus": [v - l for v, l in zip(y, lo)]}), row=1, col=col)
    fig.add_hline(y=0.5, line_dash="dash", row=1, col=1)
    fig.add_hline(y=0.95, line_dash="dash", row=1, col=2)
    fig.update_yaxes(range=[0, 1.02])
    fig.update_layout(title="aspan demo --samples 200 on four reversal models (the shipped recipe, model seeds 0-3)"
                            "<br><sup>the selected edit on each model's held-out OOD set; 95 % intervals (one model: "
                            "Wilson / t over samples; the mean: over the models); the goal dashed</sup>",
                      width=1100, height=480)
    return fig


def main(*args: str) -> int:
    *runs, out_dir = args
    table = by_model([Path(r) for r in runs])
    over = over_models(table)
    out = RunDir(out_dir)
    out.write_csv("by_model.csv", table)
    out.write_csv("over_models.csv", over)
    out.figure(figure(table, over), "selected_by_model")
    out.write_json("summary.json", {"runs": [str(r) for r in runs], "over_models": over.to_dict("records")})
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
