"""Does the paper-shaped model's failure at new lengths rest on its fast-rotating RoPE pairs? An inference-time test of
the attribution in the TL;DR of Spiegel et al., "Attend or Perish" (ICLR 2026 submission): no training, only the
rotation of chosen pairs changed at test time (`hooks.rotary_pairs`), in every layer's queries and keys.

The model is the base of results/qk_study/paper_shape (4 layers x 1 head, d_model 128, one rotary head of width 128:
64 pairs, pair i turning 10000^(-i/64) rad per position; trained on reversal lengths 1-20). The sets are the
spectrum study's report sets (configs/qk_spectrum_cpu.toml: 500 held-out strings per bucket, 1-20, 21-40, 41-60),
drawn by the study's own code, so the untouched model scores here what the spectrum's row `none` says. Each
condition edits a band of k consecutive pairs (k = 4, 8, 16, 32): the fastest (0..k-1), the middle
(32-k/2..32+k/2-1) or the slowest (64-k..63), or all 64, in one of three modes:

- `clamp`: past the last position training scored (the row predicting EOS after a 20-character string), each chosen
  pair's angle is held at its value there, so queries and keys past it meet, on those pairs, only angles of training;
- `remove-beyond`: past that position the chosen pairs do not turn at all;
- `remove`: the chosen pairs never turn, at any position (this one also touches the training lengths: its ID cost).

Teacher-forced, as the study scores. Per condition and bucket, one row with the per-sample results (length,
target characters right, EOS right), from which exact and per-token accuracy, their intervals and the paired
differences from the untouched model are computed (`table.csv`). Resumable: a condition already in rows.jsonl is
not measured again.

    python results/qk_study/rotary_attribution/measure.py OUT_DIR
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import hooks
from aspan import evaluation, models
from aspan.applications.studies.qk import QKStudyConfig, held_out_sets, study_tasks
from aspan.batching import make_batch
from aspan.config import load_config
from aspan.environment import run_environment
from aspan.intervals import t_interval, wilson
from aspan.io import RowWriter, RunDir, read_rows

ROOT = Path(__file__).resolve().parents[3]
BASE = ROOT / "results" / "qk_study" / "paper_shape" / "base"
SETS_CONFIG = ROOT / "configs" / "qk_spectrum_cpu.toml"
SIZES = (4, 8, 16, 32)
MODES = ("clamp", "remove-beyond", "remove")
N_PAIRS = 64


def bands(k: int) -> dict[str, list[int]]:
    """The fastest, middle and slowest k consecutive pairs."""
    mid = N_PAIRS // 2
    return {"fast": list(range(k)), "mid": list(range(mid - k // 2, mid + k // 2)),
            "slow": list(range(N_PAIRS - k, N_PAIRS))}


def conditions() -> list[dict]:
    """The untouched model, then every mode x band x size, and every mode on all 64 pairs."""
    out = [{"condition": "none", "mode": None, "band": None, "k": 0, "pairs": []}]
    for mode in MODES:
        for k in SIZES:
            for band, pairs in bands(k).items():
                out.append({"condition": f"{mode} {band} {k}", "mode": mode, "band": band, "k": k, "pairs": pairs})
        out.append({"condition": f"{mode} all 64", "mode": mode, "band": "all", "k": N_PAIRS,
                    "pairs": list(range(N_PAIRS))})
    return out


def last_trained_position(tokenizer, id_task) -> int:
    """The last position whose prediction training scored: the row predicting EOS after the longest ID string."""
    longest = max(id_task.generate(200, seed=0), key=lambda x: len(x.text))
    batch = make_batch([longest], tokenizer)
    return int(batch.target_rows[0].nonzero().max())


def edit_for(model, cond: dict, beyond: int) -> list:
    """The hooks of one condition ([] for the untouched model)."""
    if cond["mode"] is None:
        return []
    mode, past = {"clamp": ("clamp", beyond), "remove-beyond": ("remove", beyond), "remove": ("remove", None)}[
        cond["mode"]]
    return hooks.rotary_pairs(model, cond["pairs"], mode=mode, beyond=past)


def per_sample(model, tokenizer, samples, fwd) -> dict:
    """Exact and per-token accuracy and, per sample, its length, target characters right and whether EOS is right."""
    res = evaluation.evaluate(model, tokenizer, samples, fwd_hooks=fwd, attn=False, batch_size=100)
    rec = res.records
    chars = rec[~rec.eos].groupby("sample_id").correct.sum()
    eos = rec[rec.eos].groupby("sample_id").correct.all()
    s = res.samples
    return {"n": len(s), "exact": float(s.exact.mean()), "partial": float(s.partial.mean()),
            "length": [int(v) for v in s.length], "chars_right": [int(chars[i]) for i in s.sample_id],
            "eos_right": "".join("1" if eos[i] else "0" for i in s.sample_id)}


# ----------------------------------------------------------------------------------------------- tables
def sample_values(row: dict) -> tuple[list[int], list[float]]:
    """Per sample of a row: exact (0/1: every target character and EOS right) and per-token accuracy."""
    exact = [int(c == n and e == "1") for c, n, e in zip(row["chars_right"], row["length"], row["eos_right"])]
    return exact, [c / n for c, n in zip(row["chars_right"], row["length"])]


def cells(row: dict, none: dict) -> dict:
    """One condition on one bucket: exact (Wilson 95 %), per-token (t over samples), and the paired differences
    from the untouched model on the same samples (t over the per-sample differences), in the table's columns."""
    exact, partial = sample_values(row)
    e0, p0 = sample_values(none)
    tag = row["bucket"].removeprefix("length ")
    d_exact = [a - b for a, b in zip(exact, e0)]
    d_partial = [a - b for a, b in zip(partial, p0)]
    out = {f"exact_{tag}": sum(exact) / len(exact), f"partial_{tag}": sum(partial) / len(partial),
           f"d_exact_{tag}": sum(d_exact) / len(d_exact), f"d_partial_{tag}": sum(d_partial) / len(d_partial)}
    out[f"exact_{tag}_lo"], out[f"exact_{tag}_hi"] = wilson(sum(exact), len(exact))
    out[f"partial_{tag}_lo"], out[f"partial_{tag}_hi"] = t_interval(partial)
    for name, vals in (("d_exact", d_exact), ("d_partial", d_partial)):
        out[f"{name}_{tag}_lo"], out[f"{name}_{tag}_hi"] = t_interval(vals, bounds=None)
    out[f"made_exact_{tag}"] = sum(d == 1 for d in d_exact)
    out[f"lost_exact_{tag}"] = sum(d == -1 for d in d_exact)
    return out


def table(rows: list[dict]):
    """One row per condition (in the order measured): what it edits, and `cells` per bucket."""
    import pandas as pd

    none = {r["bucket"]: r for r in rows if r["condition"] == "none"}
    out: dict[str, dict] = {}
    for r in rows:
        entry = out.setdefault(r["condition"], {k: r[k] for k in ("condition", "mode", "band", "k")} |
                               {"pairs": f"{r['pairs'][0]}-{r['pairs'][-1]}" if r["pairs"] else ""})
        entry |= cells(r, none[r["bucket"]])
    return pd.DataFrame(list(out.values()))


def figures(t) -> dict:
    """Exact and per-token accuracy against the number of pairs edited, per band, mode and bucket (95 % intervals;
    the untouched model dashed)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    buckets = ["21-40", "41-60", "1-20"]
    none = t[t.condition == "none"].iloc[0]
    colours = {"fast": "#d62728", "mid": "#2ca02c", "slow": "#1f77b4", "all": "#7f7f7f"}
    found = {}
    for metric, name in (("exact", "exact"), ("partial", "per-token")):
        fig = make_subplots(rows=len(buckets), cols=len(MODES), shared_xaxes=True,
                            subplot_titles=[f"{m}, lengths {b}" for b in buckets for m in MODES])
        for i, bucket in enumerate(buckets, 1):
            col = f"{metric}_{bucket}"
            for j, mode in enumerate(MODES, 1):
                for band, colour in colours.items():
                    g = t[(t["mode"] == mode) & (t.band == band)].sort_values("k")
                    fig.add_trace(go.Scatter(
                        x=g.k, y=g[col], mode="lines+markers", name=band, legendgroup=band,
                        showlegend=(i, j) == (1, 1), line={"color": colour},
                        error_y={"type": "data", "symmetric": False, "array": g[f"{col}_hi"] - g[col],
                                 "arrayminus": g[col] - g[f"{col}_lo"]}), row=i, col=j)
                fig.add_hline(y=float(none[col]), line_dash="dash", line_color="black", row=i, col=j)
        fig.update_xaxes(type="log", tickvals=[4, 8, 16, 32, 64], range=[0.5, 1.9])
        fig.update_xaxes(title_text="pairs edited (k)", row=len(buckets))
        fig.update_yaxes(range=[0, 1.02], title_text=name)
        fig.update_layout(title=f"{name} accuracy, the rotation of k pairs clamped or removed past the training "
                                "positions (remove: everywhere)<br><sup>fast: pairs 0..k-1; mid: 32-k/2..32+k/2-1; "
                                "slow: 64-k..63; dashed: the untouched model; 95 % intervals</sup>",
                          height=850, width=1100)
        found[f"{metric}_by_band"] = fig
    return found


def write_outputs(out_dir: str) -> None:
    """table.csv, summary.json and figures/ from rows.jsonl."""
    out = RunDir(out_dir)
    t = table(read_rows(Path(out_dir) / "rows.jsonl"))
    out.write_csv("table.csv", t)
    for name, fig in figures(t).items():
        out.figure(fig, name)
    out.write_json("summary.json", {"conditions": len(t), "table": t.to_dict("records")})


def main(out_dir: str) -> int:
    torch.set_num_threads(1)
    t0, cpu0 = time.perf_counter(), time.process_time()
    cfg = load_config(QKStudyConfig, toml_path=SETS_CONFIG)
    model, tokenizer, _ = models.load(BASE, device="cpu")
    ft_task, id_task = study_tasks(cfg)
    _, report, _ = held_out_sets(cfg, ft_task, id_task)
    beyond = last_trained_position(tokenizer, id_task)
    out = RunDir(out_dir)
    path = Path(out_dir) / "rows.jsonl"
    have = {r["key"] for r in read_rows(path)} if path.exists() else set()
    writer = RowWriter(path, ("key", "condition", "bucket"), "rotary attribution")  # a corrupt file: refused first
    todo = [c for c in conditions() if any(f"{c['condition']}/{b}" not in have for b in report)]
    for i, cond in enumerate(todo):
        started = time.perf_counter()
        rows = [{"key": f"{cond['condition']}/{bucket}", **cond, "beyond": beyond, "bucket": bucket,
                 **per_sample(model, tokenizer, samples, edit_for(model, cond, beyond))}
                for bucket, samples in report.items()]
        for row in rows:  # a condition is done once every bucket's row is written
            if row["key"] not in have:
                writer.write(row | {"seconds": time.perf_counter() - started})
        print(f"[{i + 1}/{len(todo)}] {cond['condition']}: " + ", ".join(
            f"{r['bucket']} {r['exact']:.3f}/{r['partial']:.3f}" for r in rows), flush=True)
    out.write_json("run.json", {"command": f"python results/qk_study/rotary_attribution/measure.py {out_dir}",
                                "model": str(BASE.relative_to(ROOT)), "sets": str(SETS_CONFIG.relative_to(ROOT)),
                                "beyond": beyond, "sizes": list(SIZES), "modes": list(MODES),
                                "wall_s_this_invocation": time.perf_counter() - t0,
                                "cpu_s_this_invocation": time.process_time() - cpu0,
                                **run_environment(model)})
    write_outputs(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
