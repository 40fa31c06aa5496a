"""results/qk_study/spectrum_peak: its README's table and answer recomputed from the committed rows (runs.jsonl,
table.csv, learning_curves.jsonl) and from the spectrum run's rows it compares with."""
from __future__ import annotations

import math
from pathlib import Path

from aspan.intervals import seed_interval
from aspan.tokenization import CharTokenizer
from tests.results_rows import chosen, flat, jsonl, run_rows
from tests.test_results_spectrum import _report_texts

ROOT = Path(__file__).resolve().parent.parent
QK = ROOT / "results" / "qk_study"
RUN = QK / "spectrum_peak"
N_REPORT = 500  # report strings per bucket and seed
PAIRS = (16, 18, 20, 22, 24, 26, 28)


ROWS, TABLE = run_rows(RUN)
S_ROWS, S_TABLE = run_rows(QK / "spectrum")
README, FLAT = (RUN / "README.md").read_text(encoding="utf-8"), flat(RUN / "README.md")


def _seeds(pair: int) -> list[dict]:
    found = sorted((r for r in ROWS if r["condition"] == f"qk-pair:{pair}"), key=lambda r: r["seed"])
    assert [r["seed"] for r in found] == [0, 1, 2], pair
    return found


def _spectrum(condition: str) -> list[dict]:
    return chosen(S_ROWS, S_TABLE, condition)


def _values(rows: list[dict], key: str = "exact_21-40") -> list[float]:
    return [r[key] for r in rows]


def _mean(rows: list[dict], key: str = "exact_21-40") -> float:
    return sum(_values(rows, key)) / len(rows)


def _cell(values: list[float], digits: int = 2) -> str:
    lo, hi = seed_interval(values, N_REPORT)
    return f"{sum(values) / len(values):.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def test_every_pair_trained_to_the_cap_at_one_rate_on_the_spectrums_sets():
    assert set(TABLE.index) == {"none"} | {f"qk-pair:{p}" for p in PAIRS} and len(ROWS) == 1 + 3 * len(PAIRS)
    for p in PAIRS:
        assert {(r["lr"], r["stop"], r["stop_reason"], r["stop_step"]) for r in _seeds(p)} == {(0.003, "none", "cap",
                                                                                                2000)}
    assert {r["report"][1] for r in ROWS} == {N_REPORT}
    (mine,), (theirs,) = ([r for r in rows if r["condition"] == "none"] for rows in (ROWS, S_ROWS))
    assert mine["report"] == theirs["report"] and mine["exact_21-40"] == theirs["exact_21-40"]


def test_labels_come_from_accuracy_at_the_last_evaluation():
    curves = jsonl(RUN / "learning_curves.jsonl")
    for p in PAIRS:
        last = [max((c for c in curves if c["condition"] == f"qk-pair:{p}" and c["seed"] == seed
                     and c["bucket"] == "length 21-40"), key=lambda c: c["step"]) for seed in (0, 1, 2)]
        assert {c["step"] for c in last} == {2000}
        fits = sum(c["exact"] >= 0.9 for c in last)
        assert fits == TABLE.loc[f"qk-pair:{p}", "n_fit"] == 0 and TABLE.loc[f"qk-pair:{p}", "fit"] == "did not fit"


def test_readme_table_rows():
    for p in PAIRS:
        rows = _seeds(p)
        before = _spectrum(f"qk-pair:{p}") if f"qk-pair:{p}" in S_TABLE.index else []
        cells = [f"{10000 ** (-p / 64):.2g}", _cell(_values(rows, "exact_1-20")), _cell(_values(rows), 3),
                 f"{_mean(rows, 'partial_21-40'):.3f}", f"{_mean(rows, 'exact_41-60'):.3f}",
                 _cell(_values(before)) if before else "–"]
        line = next(line for line in README.splitlines() if line.startswith(f"| {p} |"))
        assert line == f"| {p} | " + " | ".join(cells) + " |", (line, cells)


def test_the_answer():
    exact = {p: _mean(_seeds(p)) for p in PAIRS}
    best = max(exact, key=exact.get)
    full = _spectrum("all")
    gap = round(100 * (_mean(full) - exact[best]))
    assert best == 20 and gap > 5
    assert f"Pair 20, the best, reaches {_cell(_values(_seeds(20)), 3)} exact on 21–40, {gap} pp short of full " \
           f"fine-tuning's {_cell(_values(full))}" in FLAT
    assert seed_interval(_values(_seeds(28)), N_REPORT)[1] < seed_interval(_values(_seeds(20)), N_REPORT)[0]
    overlap = [f"{exact[p]:.3f}" for p in (18, 22)]
    assert f"Pairs 18 and 22 overlap it ({', '.join(overlap)})" in FLAT
    assert all(seed_interval(_values(_seeds(p)), N_REPORT)[1] >= seed_interval(_values(_seeds(20)), N_REPORT)[0]
               for p in (18, 22))
    falling = [exact[p] for p in PAIRS[PAIRS.index(best):]]
    assert falling == sorted(falling, reverse=True)  # from the best pair on, each slower pair does worse
    assert " → ".join(f"{exact[p]:.3f}" for p in PAIRS[PAIRS.index(best):]) in FLAT
    assert f"pair 16 reaches {exact[16]:.2f} and pair 18 {exact[18]:.2f}" in FLAT
    partial = {p: _mean(_seeds(p), "partial_21-40") for p in PAIRS}
    close = [p for p in PAIRS if S_TABLE.loc["all", "partial_21-40"] - partial[p] <= 0.05]
    assert close == list(PAIRS)
    assert f"every pair here comes within 5 pp ({min(partial.values()):.3f}–{max(partial.values()):.3f}" \
           f" against {S_TABLE.loc['all', 'partial_21-40']:.3f})" in FLAT
    kept = [_mean(_seeds(p), "exact_1-20") for p in PAIRS]
    beyond = [_mean(_seeds(p), "exact_41-60") for p in PAIRS]
    assert f"(1–20 exact {min(kept):.2f}–{max(kept):.2f}, from 0.99)" in FLAT
    assert f"41–60 strings right ({min(beyond):.3f}–{max(beyond):.3f})" in FLAT
    period = {p: 2 * math.pi / 10000 ** (-p / 64) for p in (16, 18, 22)}
    tok = CharTokenizer()  # the longest 21-40 report sample in tokens: BOS, the characters, EOS
    longest = max(tok.offset + len(tok.encode(text)) + 1 for text in _report_texts("qk_spectrum_peak_cpu"))
    assert longest == 83 and period[16] < longest < period[18]
    assert (f"turn once in {period[18]:.0f}–{period[22]:.0f} positions, just longer than the longest 21–40 sample "
            f"({longest} tokens), and pair 16, which turns once in {period[16]:.0f}") in FLAT
    for p in (16, 24):  # the cap against the spectrum's plateau stop, at the same rate
        assert S_TABLE.loc[f"qk-pair:{p}", "lr"] == 0.003
        assert f"pair {p} {_mean(_spectrum(f'qk-pair:{p}')):.2f} → {exact[p]:.2f}" in FLAT


def test_wall_time():
    total = sum(r["wall_s"] for r in ROWS)
    assert f"all the rows' own wall times sum to {total:,.0f} s" in FLAT
    trained = [r["wall_s"] for r in ROWS if r["condition"] != "none"]
    shared, alone = [w for w in trained if w > 500], [w for w in trained if w <= 500]
    assert (len(shared), len(alone)) == (5, 16)
    assert f"(five runs, while other work shared the machine: {min(shared):.0f}–{max(shared):,.0f} s each)" in FLAT
    assert f"The 16 runs of this session took {min(alone):.0f}–{max(alone):.0f} s each" in FLAT


def test_the_pages_quote_the_peak_and_the_partners():
    """The project README, the spectrum and qk READMEs and the study page quote the peak's best pair (and all but the
    project README the best partner column), with the numbers of these rows; none still calls them unrun."""
    best = f"pair 20, reaches {_cell(_values(_seeds(20)), 3)}"
    partners = ROOT / "results" / "qk_study" / "spectrum_partners"
    column = [r["exact_21-40"] for r in jsonl(partners / "runs.jsonl") if r["condition"] == "qk-column:88"]
    names = ("README.md", "results/qk_study/spectrum/README.md", "results/qk_study/README.md",
             "docs/studies/qk_study.md")
    pages = {name: flat(ROOT / name) for name in names}
    assert f"the best, pair 20, {_cell(_values(_seeds(20)), 3)}" in pages.pop("README.md")
    for name, text in pages.items():
        assert best in text and "column 88" in text and _cell(column) in text, name
        assert "not yet run" not in text.lower(), name
