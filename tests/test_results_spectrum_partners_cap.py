"""results/qk_study/spectrum_partners_cap: its README's table and answer recomputed from the committed rows
(runs.jsonl, table.csv, learning_curves.jsonl) and from the rows of the runs it compares with."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from aspan.intervals import seed_interval
from tests.results_rows import chosen, flat, jsonl, run_rows

ROOT = Path(__file__).resolve().parent.parent
QK = ROOT / "results" / "qk_study"
RUN = QK / "spectrum_partners_cap"
N_REPORT = 500
SPECTRUM = (0, 8, 16, 24, 32, 40, 48, 56, 63)
ROWS, TABLE = run_rows(RUN)
P_ROWS, P_TABLE = run_rows(QK / "spectrum_partners")
S_ROWS, S_TABLE = run_rows(QK / "spectrum")
README, FLAT = (RUN / "README.md").read_text(encoding="utf-8"), flat(RUN / "README.md")


def _cell(rows: list[dict], key: str = "exact_21-40") -> str:
    values = [r[key] for r in rows]
    lo, hi = seed_interval(values, N_REPORT)
    return f"{sum(values) / 3:.2f} [{lo:.2f}, {hi:.2f}]"


def _mean(rows: list[dict], key: str = "exact_21-40") -> float:
    return sum(r[key] for r in rows) / len(rows)


def _here(i: int) -> list[dict]:
    return chosen(ROWS, TABLE, f"qk-column:{i + 64}")


def test_every_partner_trained_to_the_cap_at_the_partner_runs_rate():
    assert set(TABLE.index) == set(P_TABLE.index) and len(ROWS) == 28
    for i in SPECTRUM:
        c = f"qk-column:{i + 64}"
        assert TABLE.loc[c, "lr"] == P_TABLE.loc[c, "lr"] and TABLE.loc[c, "n_fit"] == 0
        assert {(r["stop"], r["stop_reason"], r["stop_step"]) for r in _here(i)} == {("none", "cap", 2000)}
    curves = jsonl(RUN / "learning_curves.jsonl")
    assert {c["step"] for c in curves if c["condition"] != "none"} >= {2000}
    (mine,), (theirs,) = ([r for r in rows if r["condition"] == "none"] for rows in (ROWS, S_ROWS))
    assert mine["report"] == theirs["report"] and mine["exact_21-40"] == theirs["exact_21-40"]


def test_readme_table_rows():
    for i in SPECTRUM:
        c, here = f"qk-column:{i + 64}", _here(i)
        cells = [str(i + 64), f"{10000 ** (-i / 64):.2g}", _cell(here), _cell(chosen(P_ROWS, P_TABLE, c)),
                 _cell(chosen(S_ROWS, S_TABLE, f"qk-column:{i}")), _cell(chosen(S_ROWS, S_TABLE, f"qk-pair:{i}")),
                 _cell(here, "exact_1-20"), f"{_mean(here, 'partial_21-40'):.3f}", f"{_mean(here, 'exact_41-60'):.3f}"]
        line = next(line for line in README.splitlines() if line.startswith(f"| {i} | {i + 64} |"))
        assert line == f"| {i} | " + " | ".join(cells) + " |", (line, cells)


def test_the_answer():
    exact = {i: _mean(_here(i)) for i in SPECTRUM}
    assert max(exact, key=exact.get) == 24
    full = _mean(chosen(S_ROWS, S_TABLE, "all"))
    assert all(full - v > 0.05 for v in exact.values())
    assert f"ends at {_cell(_here(24))}" in FLAT and f"{round(100 * (full - exact[24]))} pp short" in FLAT
    rising = _here(32)
    assert (f"to {rising[0]['exact_21-40']:.3f} and {rising[1]['exact_21-40']:.3f} exact on 21–40 (seed 2 ends at "
            f"{rising[2]['exact_21-40']:.3f} and loses 1–20: {rising[2]['exact_1-20']:.3f})") in FLAT
    assert f"so {_cell(rising)} against {_mean(chosen(P_ROWS, P_TABLE, 'qk-column:96')):.2f}" in FLAT
    stuck = _here(16)
    assert f"seed 1 stays at {stuck[1]['exact_21-40']:.3f} to the end" in FLAT
    assert f"(its other two seeds: {stuck[0]['exact_21-40']:.3f}, {stuck[2]['exact_21-40']:.3f})" in FLAT
    others = [round(exact[i], 2) for i in SPECTRUM if i not in (16, 24, 32)]
    assert f"level ({min(others):.2f}–{max(others):.2f} against 0.144)" in FLAT


def test_wall_time():
    walls = [r["wall_s"] for r in ROWS if r["condition"] != "none"]
    assert (f"The {len(walls)} trained runs' own wall times sum to {sum(walls):,.0f} s "
            f"({min(walls):.0f}–{max(walls):.0f} s each)") in FLAT


def test_the_partner_run_and_the_spectrum_point_here():
    cell = _cell(_here(32))
    assert f"column 96 rises on two seeds of three, to {cell}" in flat(QK / "spectrum_partners" / "README.md")
    assert f"`../spectrum_partners_cap/`, {_cell(_here(24))}" in flat(QK / "spectrum" / "README.md")
    assert "results/qk_study/spectrum_partners_cap/README.md" in flat(ROOT / "docs" / "studies" / "qk_study.md")


def test_the_runner_runs_this_config_unit_by_unit_then_whole():
    """run.sh is the partner runner with this run's config and run directory: 28 units, then the merging command."""
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "CONFIG")} | {"ASPAN": "echo"}
    lines = subprocess.run(["bash", str(RUN / "run.sh")], cwd=ROOT, env=env, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    want = "study qk --config configs/qk_spectrum_partners_cap_cpu.toml --out runs/qk_spectrum_partners_cap_cpu"
    assert len(lines) == 29 and all(line.startswith(want) for line in lines)
    assert [line.split("--unit ")[-1] for line in lines[:2]] == ["none", "qk-column:88/replay 0/select"]
    assert "--unit" not in lines[-1]
