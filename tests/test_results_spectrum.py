"""results/qk_study/spectrum: its README's table, answer and labels, and the pages that quote it, recomputed from the
committed rows (runs.jsonl, learning_curves.jsonl, table.csv)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from aspan.intervals import seed_interval, wilson

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "results" / "qk_study" / "spectrum"
N_REPORT = 500  # report strings per bucket and seed
FIT = 0.9  # the study's target: exact on the 21-40 curve set at the last evaluation


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _cell(values: list[float]) -> str:
    lo, hi = seed_interval(values, N_REPORT)
    return f"{sum(values) / len(values):.2f} [{lo:.2f}, {hi:.2f}]"


TABLE = pd.read_csv(RUN / "table.csv")
ROWS = _jsonl(RUN / "runs.jsonl")
README = (RUN / "README.md").read_text(encoding="utf-8")


def _chosen(condition: str) -> list[dict]:
    """The three seeds' rows of `condition` at its chosen learning rate."""
    lr = TABLE.set_index("condition").loc[condition, "lr"]
    rows = sorted((r for r in ROWS if r["condition"] == condition and r["lr"] == lr), key=lambda r: r["seed"])
    assert [r["seed"] for r in rows] == [0, 1, 2], condition
    return rows


def _exact(condition: str, bucket: str = "21-40") -> float:
    return sum(r[f"exact_{bucket}"] for r in _chosen(condition)) / 3


def test_every_condition_of_the_design_ran_with_three_seeds_and_bracketing_grids():
    spectrum = [0, 8, 16, 24, 32, 40, 48, 56, 63]
    want = {"none", "all", "attn", "qk"} | {f"qk-{kind}:{i}" for kind in ("pair", "column") for i in spectrum}
    assert set(TABLE.condition) == want
    assert TABLE.lr_edge.isna().all()  # no chosen rate at an edge of its (extended) grid
    for condition in want - {"none"}:
        _chosen(condition)
    assert {r["report"][1] for r in ROWS} == {N_REPORT}  # [buckets, strings per bucket, seed]


def test_labels_come_from_accuracy_at_the_last_evaluation():
    curves = _jsonl(RUN / "learning_curves.jsonl")
    for t in TABLE[TABLE.condition != "none"].itertuples():
        last = []
        for seed in (0, 1, 2):
            mine = [c for c in curves if c["condition"] == t.condition and c["lr"] == t.lr and c["seed"] == seed
                    and c["bucket"] == "length 21-40"]
            last.append(max(mine, key=lambda c: c["step"])["exact"])
        fits = sum(v >= FIT for v in last)
        assert int(t.n_fit) == fits and t.fit == ("fit" if fits == 3 else "did not fit"), t.condition


def test_readme_table_rows():
    for t in TABLE[TABLE.condition != "none"].itertuples():
        rows = _chosen(t.condition)
        reasons = "/".join(sorted({r["stop_reason"] for r in rows}))
        cells = [f"{t.fit} ({int(t.n_fit)}/3)", f"{reasons} ({sum(r['stop_step'] for r in rows) / 3:,.0f})",
                 _cell([r["exact_1-20"] for r in rows]), _cell([r["exact_21-40"] for r in rows]),
                 f"{sum(r['partial_21-40'] for r in rows) / 3:.2f}",
                 _cell([r["exact_41-60"] for r in rows]) if t.fit == "fit" else "–"]
        line = next(line for line in README.splitlines() if line.startswith(f"| {t.condition} |"))
        assert all(f"| {c} |" in line + " |" for c in cells), (t.condition, cells, line)
        assert line.split(" | ")[3].startswith(f"{t.lr:g} ({t.lr_grid})"), line


def test_answer_no_single_group_within_5pp_and_the_peak_in_the_middle():
    flat = _flat(README)
    singles = TABLE[TABLE.condition.str.startswith("qk-")].condition
    best = max(singles, key=_exact)
    full = _exact("all")
    assert best == "qk-pair:24" and full - _exact(best) > 0.05
    assert f"Full fine-tuning reaches {_cell([r['exact_21-40'] for r in _chosen('all')])} exact on 21–40" in flat
    gap = round(100 * (full - _exact(best)))
    assert f"reaches {_cell([r['exact_21-40'] for r in _chosen(best)])}: {gap} pp short" in flat
    columns = [c for c in singles if c.startswith("qk-column:")]
    best_column = max(columns, key=_exact)
    assert f"column 24, 0.13 %) reaches {_cell([r['exact_21-40'] for r in _chosen(best_column)])}" in flat
    pairs = [f"qk-pair:{i}" for i in (0, 8, 16, 24, 32, 40, 48, 56, 63)]  # fastest to slowest
    exact = [_exact(p) for p in pairs]
    peak = exact.index(max(exact))
    assert 0 < peak < len(pairs) - 1  # neither the fastest nor the slowest pair
    untrained = TABLE.set_index("condition").loc["none", "exact_21-40"]
    base_lo, base_hi = wilson(round(untrained * N_REPORT), N_REPORT)
    assert f"the untrained model {untrained:.3f} [{base_lo:.3f}, {base_hi:.3f}]" in flat
    assert f"0.{round(100 * min(exact[-3:])):02d}–0.{round(100 * max(exact[-3:])):02d} for the slowest quarter" in flat
    # of the slowest quarter only pair 48 lies below the untrained model's interval; 56 and 63 overlap it
    slow = {p: seed_interval([r["exact_21-40"] for r in _chosen(p)], N_REPORT) for p in pairs[-3:]}
    assert slow["qk-pair:48"][1] < base_lo and all(slow[p][1] >= base_lo for p in ("qk-pair:56", "qk-pair:63"))
    for p in pairs[-3:]:
        cell = f"{_exact(p):.3f} [{slow[p][0]:.3f}, {slow[p][1]:.3f}]"
        assert cell in flat, cell
    # per token the best pair and several others come within 5 pp of full fine-tuning
    partial = TABLE.set_index("condition")["partial_21-40"]
    close = sorted(c for c in singles if partial["all"] - partial[c] <= 0.05)
    assert close == ["qk-column:16", "qk-column:24", "qk-pair:16", "qk-pair:24", "qk-pair:32", "qk-pair:40"]
    assert f"it reaches {partial[best]:.3f} against full fine-tuning's {partial['all']:.3f}, within 5 pp" in flat
    assert (f"pairs 16, 32 and 40 ({partial['qk-pair:16']:.3f}, {partial['qk-pair:32']:.3f}, "
            f"{partial['qk-pair:40']:.3f}) and columns 16 and 24 ({partial['qk-column:16']:.3f}, "
            f"{partial['qk-column:24']:.3f})") in flat
    # column 32: the rate the per-token rule chose, against 0.003 at the same seed
    col = {r["lr"]: r for r in ROWS if r["condition"] == "qk-column:32" and r["seed"] == 0}
    chosen = TABLE.set_index("condition").loc["qk-column:32", "lr"]
    assert chosen == 0.03 and col[0.03]["partial_select"] > col[0.003]["partial_select"]
    assert (f"chose 0.03, where seed 0 ends at {col[0.03]['exact_21-40']:.3f} exact on 21–40 "
            f"({col[0.03]['exact_1-20']:.2f} on 1–20); at 0.003 the same seed reached {col[0.003]['exact_21-40']:.3f} "
            f"({col[0.003]['exact_1-20']:.2f} on 1–20)") in flat
    id_slow = [_exact(p, "1-20") for p in pairs[-3:]]
    assert f"(1–20 exact {min(id_slow):.2f}–{max(id_slow):.2f}, from 0.99)" in flat


def test_the_pages_quote_the_answer():
    best = _cell([r["exact_21-40"] for r in _chosen("qk-pair:24")])
    full = _cell([r["exact_21-40"] for r in _chosen("all")])
    for text in ((ROOT / "README.md").read_text(encoding="utf-8"),
                 (ROOT / "docs" / "studies" / "qk_study.md").read_text(encoding="utf-8"),
                 (ROOT / "results" / "qk_study" / "README.md").read_text(encoding="utf-8")):
        flat = _flat(text)
        assert "pair 24" in flat and best in flat and full in flat


def test_frequency_figures_are_key_figures_of_a_run_that_spans_the_spectrum():
    """The exact-accuracy frequency figures (pairs and columns) carry claims of the spectrum's finding, so its images
    show them; a run with three pairs and one column keeps its per-token pair figure only."""
    from aspan.report import key_figures

    spectrum = {p.stem for p in key_figures(RUN)}
    assert {"pair_frequency_exact_replay0", "column_frequency_exact_replay0", "pair_frequency_replay0"} <= spectrum
    shaped = {p.stem for p in key_figures(RUN.parent / "paper_shape")}
    assert "pair_frequency_replay0" in shaped and not {"pair_frequency_exact_replay0",
                                                       "column_frequency_exact_replay0"} & shaped


def _cap_curve(run: str) -> list[dict]:
    path = RUN.parent / "spectrum_cap" / run / "curves.jsonl"
    return [r for r in _jsonl(path) if r.get("kind") == "curve"]


def test_cap_supplement_table_and_reading():
    """The early-stopped conditions trained to the cap: every condition the plateau rule stopped at step 300 was run,
    at the study's chosen rate, to step 2,000; the README's table and its reading come from their curves."""
    stopped = TABLE[(TABLE.condition != "none") & (TABLE.stop_step == 300)]
    flat, rising, flat_max = _flat(README), [], []
    for t in stopped.itertuples():
        curve = _cap_curve(f"{t.condition.replace(':', '')}-seed0")
        run = json.loads((RUN.parent / "spectrum_cap" / f"{t.condition.replace(':', '')}-seed0" / "run.json")
                         .read_text(encoding="utf-8"))
        assert run["config"]["lr"] == t.lr and run["stop"]["reason"] == "cap" and run["stop"]["step"] == 2000

        def at(step: int, bucket: str = "length 21-40", metric: str = "exact", curve=curve) -> float:
            return next(r[metric] for r in curve if r["step"] == step and r["bucket"] == bucket)

        later = [r for r in curve if r["bucket"] == "length 21-40" and r["step"] > 0]
        best = max(later, key=lambda r: (r["exact"], -r["step"]))
        cells = [" / ".join(f"{at(s):.2f}" for s in (300, 1000, 2000)), f"{best['exact']:.2f} ({best['step']:,})",
                 f"{at(300, 'length 1-20'):.2f} / {at(2000, 'length 1-20'):.2f}",
                 f"{at(2000, metric='partial'):.3f}"]
        line = next(line for line in README.splitlines() if line.startswith(f"| {t.condition} | {t.lr:g} |"))
        assert all(f"| {c} |" in line + " |" for c in cells), (t.condition, cells, line)
        (rising if at(2000) > 0.2 else flat_max).append((t.condition, max(r["exact"] for r in later)))
    assert len(stopped) == 12 and [c for c, _ in rising] == ["qk-pair:48", "qk-column:32"]
    assert max(v for _, v in flat_max) <= 0.15 and "never exceed 0.15 on 21–40" in flat
