"""results/qk_study/spectrum: its README's table, answer and labels, and the pages that quote it, recomputed from the
committed rows (runs.jsonl, learning_curves.jsonl, table.csv)."""
from __future__ import annotations

import json
import math
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


def _untrained(rows: list[dict]) -> dict:
    return next(r for r in rows if r["condition"] == "none")


def _report_texts(config: str) -> list[str]:
    """The 21-40 report strings `configs/<config>.toml` draws (the study's own `held_out_sets`)."""
    from aspan.applications.studies.qk import held_out_sets, study_tasks
    from aspan.applications.studies.qk_config import QKStudyConfig
    from aspan.config import load_config

    cfg = load_config(QKStudyConfig, toml_path=ROOT / "configs" / f"{config}.toml")
    return [x.text for x in held_out_sets(cfg, *study_tasks(cfg))[1]["length 21-40"]]


def test_the_paper_shaped_runs_untrained_model_on_its_100_strings_and_the_spectrums_500():
    """The qk README: the paper-shaped run's 100 report strings of 21-40 are the first 100 of the spectrum's 500 (the
    study's own `held_out_sets` on the two configs); the untrained model gets 26 of those 100 and 72 of the 500, so
    0.115 of the other 400, and the spectrum's pair 0 lies inside the untrained model's interval, not below it."""
    texts = {config: _report_texts(config) for config in ("qk_paper_shape_cpu", "qk_spectrum_cpu")}
    assert len(texts["qk_spectrum_cpu"]) == N_REPORT and texts["qk_paper_shape_cpu"] == texts["qk_spectrum_cpu"][:100]
    shaped, none = _untrained(_jsonl(RUN.parent / "paper_shape" / "runs.jsonl")), _untrained(ROWS)
    assert shaped["report"][1:] == [100, none["report"][2]] and none["report"][1] == N_REPORT  # same seed
    k100, k500 = round(shaped["exact_21-40"] * 100), round(none["exact_21-40"] * N_REPORT)
    lo100, hi100 = wilson(k100, 100)
    lo, hi = wilson(k500, N_REPORT)
    rest = (k500 - k100) / (N_REPORT - 100)
    flat = _flat((RUN.parent / "README.md").read_text(encoding="utf-8"))
    assert (f"the untrained model's {k100 / 100:.2f} [{lo100:.2f}, {hi100:.2f}] (Wilson, {k100} of 100)") in flat
    assert f"the untrained model scores {k500 / N_REPORT:.3f} [{lo:.3f}, {hi:.3f}] (the other 400: {rest:.3f})" in flat
    pair0 = _chosen("qk-pair:0")
    p_lo, p_hi = seed_interval([r["exact_21-40"] for r in pair0], N_REPORT)
    assert p_hi >= lo and p_lo <= hi  # overlaps the untrained model's interval
    assert f"the spectrum's pair 0 {_cell([r['exact_21-40'] for r in pair0])}: pair 0 stays at the untrained" in flat


def test_the_helpful_pairs_rotation_and_periods_against_the_sample_lengths():
    """The pairs that help (21-40 exact interval above the untrained model's) are 16-40; their rotation, period and
    turn across a 40-character sample, and the 21-40 samples' token counts, as the spectrum README, the qk README and
    the study page quote them."""
    from aspan.tokenization import CharTokenizer

    spectrum = [0, 8, 16, 24, 32, 40, 48, 56, 63]
    none = _untrained(ROWS)
    base_hi = wilson(round(none["exact_21-40"] * N_REPORT), N_REPORT)[1]
    helpful = [i for i in spectrum
               if seed_interval([r["exact_21-40"] for r in _chosen(f"qk-pair:{i}")], N_REPORT)[0] > base_hi]
    assert helpful == [16, 24, 32, 40]
    theta = {i: 10000 ** (-i / 64) for i in (helpful[0], helpful[-1])}  # pair i's rad per position
    period = {i: 2 * math.pi / t for i, t in theta.items()}
    fast, slow = helpful[0], helpful[-1]
    chars = 2 * 40 + 1  # a 40-character sample: input, "=", reversed output
    flat = _flat(README)
    assert (f"rotate between about {theta[slow]:.1g} and {theta[fast]:.1g} rad per position (periods of about "
            f"{period[fast]:.0f} to {round(period[slow], -3):,.0f} positions), that is by about "
            f"{theta[slow] * chars:.2f} to {theta[fast] * chars:.1f} rad across the {chars} characters") in flat
    tok = CharTokenizer()
    tokens = [tok.offset + len(tok.encode(text)) + 1 for text in _report_texts("qk_spectrum_cpu")]
    span = f"{min(tokens)}–{max(tokens)}"  # BOS, the characters, EOS
    assert span == "45–83"
    periods = f"periods of about {period[fast]:.0f}–{round(period[slow], -3):,.0f} positions"
    assert f"helpful pairs ({fast}–{slow} of 64) have {periods} against samples of {span} tokens" in \
        _flat((RUN.parent / "README.md").read_text(encoding="utf-8"))
    assert f"{periods}, against samples of {span} tokens at 21–40" in \
        _flat((ROOT / "docs" / "studies" / "qk_study.md").read_text(encoding="utf-8"))
