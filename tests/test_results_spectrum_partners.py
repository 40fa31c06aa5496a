"""results/qk_study/spectrum_partners: its README's table and answer recomputed from the committed rows
(runs.jsonl, table.csv, learning_curves.jsonl) and from the spectrum run's rows it compares with."""
from __future__ import annotations

from pathlib import Path

from aspan.intervals import seed_interval
from tests.results_rows import chosen, flat, jsonl, run_rows

ROOT = Path(__file__).resolve().parent.parent
QK = ROOT / "results" / "qk_study"
RUN = QK / "spectrum_partners"
N_REPORT = 500  # report strings per bucket and seed
SPECTRUM = (0, 8, 16, 24, 32, 40, 48, 56, 63)  # the pairs; column i and its partner i + 64


ROWS, TABLE = run_rows(RUN)
S_ROWS, S_TABLE = run_rows(QK / "spectrum")
README, FLAT = (RUN / "README.md").read_text(encoding="utf-8"), flat(RUN / "README.md")


def _values(rows: list[dict], key: str = "exact_21-40") -> list[float]:
    return [r[key] for r in rows]


def _cell(values: list[float]) -> str:
    lo, hi = seed_interval(values, N_REPORT)
    return f"{sum(values) / len(values):.2f} [{lo:.2f}, {hi:.2f}]"


def _partner(i: int) -> list[dict]:
    return chosen(ROWS, TABLE, f"qk-column:{i + 64}")


def _column(i: int) -> list[dict]:
    return chosen(S_ROWS, S_TABLE, f"qk-column:{i}")


def test_every_partner_ran_three_seeds_at_its_partners_chosen_rate_on_the_spectrums_sets():
    assert set(TABLE.index) == {"none"} | {f"qk-column:{i + 64}" for i in SPECTRUM} and len(ROWS) == 28
    for i in SPECTRUM:
        assert TABLE.loc[f"qk-column:{i + 64}", "lr"] == S_TABLE.loc[f"qk-column:{i}", "lr"], i
        assert {r["stop_reason"] for r in _partner(i)} == {"plateau"} and {r["steps"] for r in _partner(i)} == {2000}
    assert {tuple(map(tuple, r["report"][0])) for r in ROWS} == {((1, 20), (21, 40), (41, 60))}
    assert {r["report"][1] for r in ROWS} == {N_REPORT}
    (mine,), (theirs,) = ([r for r in rows if r["condition"] == "none"] for rows in (ROWS, S_ROWS))
    assert mine["report"] == theirs["report"] and mine["exact_21-40"] == theirs["exact_21-40"] == 0.144
    assert "The untrained model's row equals the spectrum's (0.144 exact on 21–40)" in FLAT


def test_labels_come_from_accuracy_at_the_last_evaluation():
    curves = jsonl(RUN / "learning_curves.jsonl")
    for i in SPECTRUM:
        condition = f"qk-column:{i + 64}"
        last = [max((c for c in curves if c["condition"] == condition and c["seed"] == seed
                     and c["bucket"] == "length 21-40"), key=lambda c: c["step"])["exact"] for seed in (0, 1, 2)]
        fits = sum(v >= 0.9 for v in last)
        assert fits == TABLE.loc[condition, "n_fit"] == 0 and TABLE.loc[condition, "fit"] == "did not fit"
    assert "0 of 3 seeds for every column" in FLAT


def test_readme_table_rows():
    for i in SPECTRUM:
        mine, column, pair = _partner(i), _column(i), chosen(S_ROWS, S_TABLE, f"qk-pair:{i}")
        partial = (S_TABLE.loc[f"qk-column:{i}", "partial_21-40"], TABLE.loc[f"qk-column:{i + 64}", "partial_21-40"])
        reasons = "/".join(sorted({r["stop_reason"] for r in mine}))
        cells = [f"{10000 ** (-i / 64):.2g}", _cell(_values(column)), _cell(_values(mine)), _cell(_values(pair)),
                 f"{TABLE.loc[f'qk-column:{i + 64}', 'lr']:g}", f"{partial[0]:.3f} / {partial[1]:.3f}",
                 _cell(_values(mine, "exact_1-20")), f"{reasons} ({sum(r['stop_step'] for r in mine) / 3:,.0f})"]
        line = next(line for line in README.splitlines() if line.startswith(f"| {i} |"))
        assert line == f"| {i} | " + " | ".join(cells) + " |", (line, cells)


def test_the_answer():
    for i in SPECTRUM:  # the two columns of every pair overlap
        (a_lo, a_hi), (b_lo, b_hi) = (seed_interval(_values(rows), N_REPORT) for rows in (_column(i), _partner(i)))
        assert a_lo <= b_hi and b_lo <= a_hi, i
    exact = {i: sum(_values(_partner(i))) / 3 for i in SPECTRUM}
    assert max(exact, key=exact.get) == 24
    assert (f"column 88 (pair 24's), reaches {_cell(_values(_partner(24)))} against column 24's "
            f"{_cell(_values(_column(24)))} and pair 24's") in FLAT
    seeds = _partner(16)
    assert [r["stop_step"] for r in seeds][1] == 300 and "seed 1 stopped at step 300 at 0.002 (1–20: 0.52)" in FLAT
    assert (seeds[1]["exact_21-40"], round(seeds[1]["exact_1-20"], 2)) == (0.002, 0.52)
    assert f"seeds 0 and 2 reached {seeds[0]['exact_21-40']:.3f} and {seeds[2]['exact_21-40']:.3f}" in FLAT
    full = S_TABLE.loc["all", "partial_21-40"]
    close = [i for i in SPECTRUM if full - TABLE.loc[f"qk-column:{i + 64}", "partial_21-40"] <= 0.05]
    assert close == [24] and f"column 88 comes within 5 pp of full fine-tuning (0.982 against {full:.3f})" in FLAT
    elsewhere = [i for i in SPECTRUM if i not in (16, 24)]
    low = [round(exact[i], 2) for i in elsewhere]
    assert f"the partner column does nothing on 21–40 ({min(low):.2f}–{max(low):.2f}" in FLAT
    kept = {i: sum(_values(_partner(i), "exact_1-20")) / 3 for i in elsewhere}
    assert round(kept.pop(0), 2) == 0.92 and "column 64 (pair 0's: 1–20 exact 0.92)" in FLAT
    assert f"(1–20 exact {min(kept.values()):.2f}–{max(kept.values()):.2f})" in FLAT
    at300 = [i for i in SPECTRUM if all(r["stop_step"] == 300 for r in _partner(i))]
    assert len(at300) == 7 and "seven of them at step 300 on every seed" in FLAT


def test_wall_time():
    total = sum(r["wall_s"] for r in ROWS)
    assert f"{len(ROWS)} runs; their own wall times sum to {total:,.0f} s, about {total / 60:.0f} core-minutes" in \
        FLAT
