"""The figures of `aspan study qk`: accuracy by length bucket per condition, accuracy against a RoPE pair's rotation
frequency, and the curves protocol's learning curves; pure functions of the study's table and curve rows (the
settings `cfg`: a `QKStudyConfig`, read for its buckets, fine-tuned lengths and replay shares)."""
from __future__ import annotations

from typing import Any

from ..buckets import bucket_name


def _long(t, names: list[str], metric: str):
    """Rows (condition, bucket, frequency, metric, plus, minus) of the table `t`, one per condition and bucket:
    `plus`/`minus` reach the 95 % interval's ends (`bucket_columns`; a table written before the intervals existed
    falls back to ± sd)."""
    import pandas as pd

    def ends(r, n):
        lo, hi = f"{metric}_{n}_lo", f"{metric}_{n}_hi"
        if lo in r and r[lo] == r[lo]:
            return r[hi] - r[f"{metric}_{n}"], r[f"{metric}_{n}"] - r[lo]
        return r[f"{metric}_{n}_sd"], r[f"{metric}_{n}_sd"]

    return pd.DataFrame([{"condition": r.condition, "bucket": n, "frequency": r.frequency, metric: r[f"{metric}_{n}"],
                          **dict(zip(("plus", "minus"), ends(r, n)))} for _, r in t.iterrows() for n in names])


def qk_figures(cfg: Any, table) -> dict:
    """Accuracy by bucket per condition (per replay share and metric) and exact and per-token accuracy against the
    rotation frequency of the trained pair (or of the pair a single column belongs to), with full fine-tuning as a
    dashed line; every error bar a 95 % interval (`aspan.applications.studies.qk_tables.bucket_columns`)."""
    from .buckets import accuracy_by_bucket, accuracy_vs_frequency

    names = [bucket_name(b).removeprefix("length ") for b in cfg.buckets]
    ft = bucket_name(cfg.finetune).removeprefix("length ")
    figs = {}
    for replay in cfg.replays:
        t = table[(table.replay == replay) | (table.condition == "none")]
        for metric in ("exact", "partial"):
            figs[f"by_bucket_{metric}_replay{replay:g}"] = accuracy_by_bucket(
                _long(t, names, metric), y=metric, group="condition", error=("plus", "minus"),
                title=f"{metric} accuracy by length bucket (fine-tuned on {ft}, replay {replay:g}; 95 % intervals)")
        full = t[t.condition == "all"]
        for kind, prefix in (("pair", "qk-pair"), ("column", "qk-column")):
            rows = t[t.condition.str.startswith(prefix) & t.frequency.notna()]
            for metric, what in (("partial", "Per-token"), ("exact", "Exact")) if len(rows) else ():
                base = {} if full.empty else {f"full fine-tuning ({ft})": float(full.iloc[0][f"{metric}_{ft}"])}
                name = f"{kind}_frequency{'' if metric == 'partial' else '_exact'}_replay{replay:g}"
                figs[name] = accuracy_vs_frequency(
                    _long(rows, names, metric), y=metric, error=("plus", "minus"), baselines=base,
                    title=f"{what} accuracy after training one RoPE {kind} vs its pair's rotation frequency "
                          f"(replay {replay:g}; 95 % intervals)")
    return figs


def qk_curve_figures(cfg: Any, table, curves: list[dict]) -> dict:
    """Curves protocol: per (condition, replay), the learning curves (exact per bucket) of every seed at the chosen
    rate, one figure each (`viz.learning_curves`); per replay share, every condition's mean curve on the fine-tuned
    lengths, exact and per-token (`curves_finetuned_{exact,partial}_replayR`)."""
    import pandas as pd

    from .curves import learning_curves

    figs = {}
    rows = pd.DataFrame(curves)
    if rows.empty:
        return figs
    ft = bucket_name(cfg.finetune)
    means: dict[float, dict[str, pd.DataFrame]] = {}
    for _, t in table[table.condition != "none"].iterrows():
        mine = rows[(rows.condition == t.condition) & (rows.replay == t.replay) & (rows.lr == t.lr)]
        runs = {f"seed {seed}": d for seed, d in mine.groupby("seed")}
        if runs:
            figs[f"curves_{t.condition.replace(':', '')}_replay{t.replay:g}"] = learning_curves(
                runs, title=f"{t.condition}, replay {t.replay:g}, lr {t.lr:g}: exact accuracy on held-out buckets "
                            f"({t.get('fit', '')}; stopped: {t.get('stop_reason', '')})")
            on_ft = mine[mine.bucket == ft].groupby("step", as_index=False)[["exact", "partial"]].mean()
            means.setdefault(t.replay, {})[t.condition] = on_ft.assign(bucket=ft)
    for replay, by_condition in means.items():  # every condition on one figure: mean over the seeds still running
        for metric, what in (("exact", "exact"), ("partial", "per-token")):
            figs[f"curves_finetuned_{metric}_replay{replay:g}"] = learning_curves(
                by_condition, y=metric, title=f"{what}, held-out lengths {cfg.finetune[0]}-{cfg.finetune[1]}, "
                                              f"replay {replay:g} (mean of the seeds still training)")
    return figs
