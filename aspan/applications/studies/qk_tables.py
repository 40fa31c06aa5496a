"""The tables and findings of `aspan study qk` (`aspan.applications.studies.qk`): the learning-rate grid and its
choice, one row per (condition, replay) over the seeds with 95 % intervals, the curves protocol's fit and stop
columns, the findings summary.json reports, and the table as text."""
from __future__ import annotations

from typing import Any

from ...buckets import bucket_name
from ...curves import steps_to_target
from ...intervals import pooled_wilson, seed_interval, t_interval
from .qk_config import Condition, QKStudyConfig, Setup


# ----------------------------------------------------------------------------------------------- the study
def lr_grid(rows: list[dict], cond: Condition, replay: float, seed: int) -> tuple[tuple[float, ...], float | None]:
    """(the grid tried so far, its chosen rate or None while a rate of it is still to run). The grid starts as the
    condition's; while the best rate sits at an edge and fewer than `cond.extend` rates were added on that side, the
    next rate past that edge (the grid's own ratio) joins it, so a finished grid brackets its optimum unless the
    extension budget ran out (`lr_edge` in the table says so)."""
    if not cond.lrs:
        return (), None
    got = {r["lr"]: r for r in rows if r["condition"] == cond.name and r["replay"] == replay and r["seed"] == seed}
    grid = tuple(sorted(cond.lrs))
    while True:
        if any(lr not in got for lr in grid):
            return grid, None
        best = max(grid, key=lambda lr: (got[lr]["partial_select"], got[lr]["exact_select"], -lr))
        ratio = (grid[-1] / grid[0]) ** (1 / (len(grid) - 1)) if len(grid) > 1 else 1.0
        low, high = grid.index(min(cond.lrs)), len(grid) - 1 - grid.index(max(cond.lrs))
        if best == grid[0] and len(grid) > 1 and low < cond.extend:
            grid = (_past(grid[0], 1 / ratio), *grid)
        elif best == grid[-1] and len(grid) > 1 and high < cond.extend:
            grid = (*grid, _past(grid[-1], ratio))
        else:
            return grid, best


def _past(edge: float, ratio: float) -> float:
    """The rate one grid step (`ratio`) past `edge`, put on the 1-3-10 ladder (3e-4 below 1e-3 in a half-decade
    grid, not 3.16e-4) unless that would not move it."""
    import math

    raw = edge * ratio
    k = math.floor(math.log10(raw))
    snapped = min((m * 10.0 ** e for e in (k - 1, k, k + 1) for m in (1, 3)),
                  key=lambda v: abs(math.log10(v) - math.log10(raw)))
    snapped = float(f"{snapped:.3g}")
    return snapped if (snapped - edge) * (ratio - 1) > 0 else float(f"{raw:.3g}")


def _select_lr(rows: list[dict], cond: Condition, replay: float, seed: int) -> float | None:
    """The grid's learning rate with the best selection-set per-token accuracy at `seed` (the first seed; ties:
    exact, then the smaller rate; the grid extended past an edge as `lr_grid` says); None for the untrained
    condition or while the grid is incomplete."""
    return lr_grid(rows, cond, replay, seed)[1]


def lr_edge(rows: list[dict], cond: Condition, replay: float, seed: int) -> str:
    """"bottom" or "top" when the chosen rate is still at that edge of its (extended) grid, else ""."""
    grid, chosen = lr_grid(rows, cond, replay, seed)
    if chosen is None or len(grid) < 2:
        return ""
    return "bottom" if chosen == grid[0] else "top" if chosen == grid[-1] else ""


def selection_table(s: Setup, rows: list[dict]):
    """The grid at seed 0 on the selection set, with the chosen rate marked."""
    import pandas as pd

    out = []
    for replay in s.cfg.replays:
        for cond in s.conds:
            chosen = _select_lr(rows, cond, replay, s.cfg.seeds[0])
            for r in rows:
                if r["condition"] == cond.name and r["replay"] == replay and r["seed"] == s.cfg.seeds[0]:
                    out.append({"condition": cond.name, "replay": replay, "lr": r["lr"], "chosen": r["lr"] == chosen,
                                "partial_select": r["partial_select"], "exact_select": r["exact_select"]})
    return pd.DataFrame(out)


def aggregate(s: Setup, rows: list[dict], curves: list[dict] = ()):
    """One row per (condition, replay): chosen rate, trainable parameters, mean and sd over seeds per bucket; under
    the curves protocol also where and why the runs stopped, their fit and steps to targets (`curve_columns`)."""
    import pandas as pd

    names = [bucket_name(b).removeprefix("length ") for b in s.cfg.buckets]
    none = [r for r in rows if r["condition"] == "none"]
    base_id = none[0][f"exact_{names[0]}"] if none else float("nan")
    out = []
    for replay in s.cfg.replays:
        for cond in s.conds:
            lr = _select_lr(rows, cond, replay, s.cfg.seeds[0])
            runs = none if not cond.lrs else [r for r in rows if r["condition"] == cond.name
                                               and r["replay"] == replay and r["lr"] == lr and lr is not None]
            if not runs:
                continue
            grid = lr_grid(rows, cond, replay, s.cfg.seeds[0])[0]
            row = {"condition": cond.name, "replay": replay if cond.lrs else None, "lr": lr, "pair": cond.pair,
                   "lr_grid": " ".join(f"{g:g}" for g in grid), "lr_edge": lr_edge(rows, cond, replay, s.cfg.seeds[0]),
                   "frequency": cond.frequency, "trainable": runs[0]["trainable"], "fraction": runs[0]["fraction"],
                   "n_seeds": len(runs) if cond.lrs else 0}
            for name in names:
                row |= bucket_columns([r[f"exact_{name}"] for r in runs], [r[f"partial_{name}"] for r in runs],
                                      name, s.cfg.n_report)
            row["id_cost"] = base_id - row[f"exact_{names[0]}"]
            if s.cfg.protocol == "curves" and cond.lrs:
                row.update(curve_columns(s.cfg, runs, curves))
            out.append(row)
    table = pd.DataFrame(out).drop_duplicates(subset=["condition", "replay"])
    return within_full(s.cfg, table, curves) if s.cfg.protocol == "curves" and len(table) else table


def bucket_columns(exact: list[float], partial: list[float], name: str, n_report: int) -> dict:
    """One bucket's columns over the seeds of a condition: mean and sd of exact and per-token accuracy, their 95 %
    intervals (`_lo`, `_hi`: per-token the t-interval over seeds, NaN for one seed; exact `intervals.seed_interval`,
    the wider of that t-interval and the Wilson interval of every seed's `n_report` answers pooled) and the pooled
    Wilson interval alone (`exact_NAME_wilson_lo`, `_hi`)."""
    import statistics

    out: dict = {}
    for metric, vals in (("exact", exact), ("partial", partial)):
        out[f"{metric}_{name}"] = statistics.fmean(vals)
        out[f"{metric}_{name}_sd"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        out[f"{metric}_{name}_lo"], out[f"{metric}_{name}_hi"] = (
            seed_interval(vals, n_report) if metric == "exact" else t_interval(vals))
    out[f"exact_{name}_wilson_lo"], out[f"exact_{name}_wilson_hi"] = pooled_wilson(exact, n_report)
    return out


def _run_curves(curves: list[dict], key: str, bucket: str) -> list[dict]:
    return [r for r in curves if r["run"] == key and r["bucket"] == bucket]


def curve_columns(cfg: QKStudyConfig, runs: list[dict], curves: list[dict]) -> dict:
    """The curves protocol's columns of one (condition, replay): stop reasons (e.g. "plateau 2, cap 1") and mean stop
    step, the plateau (mean fine-tuned exact on the curve set at each run's last evaluation), how many seeds fit
    (reached `fit_exact` there) and "fit" only when all did, the mean steps to `fit_exact` (None unless every seed
    reached it). The label comes from that accuracy alone, whichever rule (plateau, target or cap) ended the run. A
    condition that did not fit claims nothing beyond its fine-tuned lengths: those columns are emptied."""
    from collections import Counter

    ft = bucket_name(cfg.finetune)
    finals = [max(_run_curves(curves, r["key"], ft), key=lambda c: c["step"])["exact"] for r in runs]
    reached = [steps_to_target(_run_curves(curves, r["key"], ft), ft, cfg.fit_exact) for r in runs]
    reasons = Counter(r["stop_reason"] for r in runs)
    n_fit = sum(v >= cfg.fit_exact for v in finals)
    out = {"stop_reason": ", ".join(f"{k} {n}" for k, n in sorted(reasons.items())),
           "stop_step": sum(r["stop_step"] for r in runs) / len(runs), "plateau_exact": sum(finals) / len(finals),
           "n_fit": n_fit, "fit": "fit" if n_fit == len(runs) else "did not fit",
           "steps_to_target": None if None in reached else sum(reached) / len(reached)}
    if out["fit"] != "fit":
        for b in cfg.buckets:
            if b[0] > cfg.finetune[1]:
                tag = bucket_name(b).removeprefix("length ")
                out |= {f"{m}_{tag}{sd}": float("nan") for m in ("exact", "partial")
                        for sd in ("", "_sd", "_lo", "_hi")}
                out |= {f"exact_{tag}_wilson_{end}": float("nan") for end in ("lo", "hi")}
    return out


def within_full(cfg: QKStudyConfig, table, curves: list[dict]):
    """`steps_to_full`: per (condition, replay), the mean steps to come within 5 pp of full fine-tuning's plateau at
    the same replay (fine-tuned exact on the curve set; None unless every seed got there)."""
    ft = bucket_name(cfg.finetune)
    table = table.copy()
    table["steps_to_full"] = None
    for i, row in table.iterrows():
        full = table[(table.condition == "all") & (table.replay == row.replay)]
        if row.condition == "none" or full.empty:
            continue
        target = float(full.iloc[0].plateau_exact) - 0.05
        keys = {c["run"] for c in curves if c["condition"] == row.condition and c["replay"] == row.replay
                and c["lr"] == row.lr}
        reached = [steps_to_target(_run_curves(curves, k, ft), ft, target) for k in sorted(keys)]
        if keys and None not in reached:
            table.at[i, "steps_to_full"] = sum(reached) / len(reached)
    return table


# ----------------------------------------------------------------------------------------------- findings
def findings(cfg: QKStudyConfig, table) -> dict:
    """Per replay share: full fine-tuning, the best single pair or column on the fine-tuned bucket and its gap, the
    smallest group within 5 pp of full fine-tuning (per metric; only where full fine-tuning gains >= 5 pp over the
    untrained model, else "within 5 pp" is vacuous), and how per-pair accuracy follows rotation frequency."""
    from scipy.stats import spearmanr

    ft, beyond = (bucket_name(b).removeprefix("length ") for b in (cfg.finetune, cfg.buckets[-1]))
    none = table[table.condition == "none"]
    out: dict[str, Any] = {"finetuned_bucket": ft, "beyond_bucket": beyond, "by_replay": {}}
    if not none.empty:
        out["baseline"] = _brief(none.iloc[0], ft, beyond)
    for replay in cfg.replays:
        t = table[(table.replay == replay)]
        full = t[t.condition == "all"]
        small = t[t.condition.str.startswith(("qk-pair", "qk-column"))]
        if full.empty or small.empty or none.empty:
            continue
        full = full.iloc[0]
        best = small.sort_values([f"exact_{ft}", f"partial_{ft}"], ascending=False).iloc[0]
        pairs = small[small.condition.str.startswith("qk-pair")]
        f = {"full": _brief(full, ft, beyond), "best_single": _brief(best, ft, beyond)}
        for metric in ("partial", "exact"):
            f[f"spearman_frequency_vs_{metric}"] = (spearmanr(pairs.frequency, pairs[f"{metric}_{ft}"]).statistic
                                                    if len(pairs) > 2 else float("nan"))
        for metric in ("exact", "partial"):
            col = f"{metric}_{ft}"
            gain = full[col] - none.iloc[0][col]
            close = t[t[col] >= full[col] - 0.05].sort_values("trainable")
            f[f"full_gain_{metric}_pp"] = 100 * gain
            f[f"gap_{metric}_pp"] = 100 * (full[col] - best[col])
            f[f"smallest_within_5pp_{metric}"] = _brief(close.iloc[0], ft, beyond) if gain >= 0.05 else None
        f["claim_met"] = bool(f["full_gain_exact_pp"] >= 5 and f["gap_exact_pp"] <= 5 and best.fraction <= 0.01)
        out["by_replay"][str(replay)] = f
    return out


def _brief(row, ft: str, beyond: str) -> dict:
    keys = ("condition", "trainable", "fraction", "lr", f"exact_{ft}", f"partial_{ft}", f"exact_{beyond}",
            f"partial_{beyond}", "id_cost", "fit", "stop_reason", "stop_step", "plateau_exact", "steps_to_target",
            "steps_to_full")
    return {k: row[k] for k in keys if k in row}


def headline_table(cfg: QKStudyConfig, table) -> str:
    """The study's table as text: each condition's exact and per-token accuracy per bucket (and, under the curves
    protocol, its fit, stop and steps-to-target columns)."""
    cols = ["condition", "replay", "trainable", "lr"] + [f"{m}_{bucket_name(b).removeprefix('length ')}"
                                                          for b in cfg.buckets for m in ("exact", "partial")]
    if cfg.protocol == "curves":
        cols += ["fit", "stop_reason", "stop_step", "plateau_exact", "steps_to_target", "steps_to_full"]
    return table[cols].to_string(index=False, float_format=lambda x: f"{x:.3g}")
