"""results/qk_study/rotary_attribution: its README's table and answer recomputed from the per-sample rows
(rows.jsonl), independently of the script that wrote table.csv; and one condition re-measured on the committed
model, so the rows are what the hooks give."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from aspan.intervals import t_interval, wilson

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "results" / "qk_study" / "rotary_attribution"
README = (RUN / "README.md").read_text(encoding="utf-8")
FLAT = re.sub(r"\s+", " ", README)
ROWS = [json.loads(line) for line in (RUN / "rows.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
BY = {(r["condition"], r["bucket"].removeprefix("length ")): r for r in ROWS}


def _values(condition: str, bucket: str) -> tuple[list[int], list[float]]:
    """Per sample: exact (every character and EOS right) and per-token accuracy."""
    r = BY[condition, bucket]
    exact = [int(c == n and e == "1") for c, n, e in zip(r["chars_right"], r["length"], r["eos_right"])]
    return exact, [c / n for c, n in zip(r["chars_right"], r["length"])]


def _exact_cell(condition: str, bucket: str) -> str:
    exact, _ = _values(condition, bucket)
    lo, hi = wilson(sum(exact), len(exact))
    return f"{sum(exact) / len(exact):.3f} [{lo:.3f}, {hi:.3f}]"


def _delta(condition: str, bucket: str, metric: int = 1) -> tuple[float, float, float]:
    """Mean paired difference from the untouched model (percentage points) and its t interval."""
    mine, base = _values(condition, bucket)[metric], _values("none", bucket)[metric]
    d = [100 * (a - b) for a, b in zip(mine, base)]
    lo, hi = t_interval(d, bounds=None)
    return sum(d) / len(d), lo, hi


def _pp(x: float) -> str:
    return f"{x:+.1f}".replace("-", "−")


def _partial_cell(condition: str, bucket: str) -> str:
    mean = sum(_values(condition, bucket)[1]) / len(_values(condition, bucket)[1])
    if condition == "none":
        return f"{mean:.3f}"
    d, lo, hi = _delta(condition, bucket)
    return f"{mean:.3f} ({_pp(d)} [{_pp(lo)}, {_pp(hi)}])"


def test_the_design_ran_whole_on_the_spectrums_report_sets():
    conditions = {r["condition"] for r in ROWS}
    bands = {f"{mode} {band} {k}" for mode in ("clamp", "remove-beyond", "remove")
             for band in ("fast", "mid", "slow") for k in (4, 8, 16, 32)}
    bands |= {f"{mode} all 64" for mode in ("clamp", "remove-beyond", "remove")}
    assert conditions == bands | {"none"}
    assert all(len(r["length"]) == 500 for r in ROWS) and len(ROWS) == 3 * len(conditions)
    assert {r["beyond"] for r in ROWS} == {41}
    for r in ROWS:  # the bands as the README defines them
        k, band = r["k"], r["band"]
        want = {"fast": range(k), "mid": range(32 - k // 2, 32 + k // 2), "slow": range(64 - k, 64),
                "all": range(64), None: range(0)}[band]
        assert r["pairs"] == list(want), r["condition"]
    # the untouched model scores what the spectrum's `none` row says on the same sets
    spectrum = [json.loads(line) for line in (RUN.parent / "spectrum" / "runs.jsonl").read_text().splitlines()]
    none = next(r for r in spectrum if r["condition"] == "none")
    for bucket in ("1-20", "21-40", "41-60"):
        assert BY["none", bucket]["exact"] == none[f"exact_{bucket}"]
        assert BY["none", bucket]["partial"] == pytest.approx(none[f"partial_{bucket}"])


def test_readme_table_rows():
    for line in README.splitlines():
        m = re.match(r"\| (none|clamp [\w -]+?|remove-beyond [\w -]+?|remove [\w -]+?) \|", line)
        if not m:
            continue
        condition = m[1]
        r = BY[condition, "21-40"]
        pairs = f"{r['pairs'][0]}-{r['pairs'][-1]}" if r["pairs"] else "–"
        exact_id = sum(_values(condition, "1-20")[0]) / 500
        cells = [pairs, f"{exact_id:.3f}", _exact_cell(condition, "21-40"), _partial_cell(condition, "21-40"),
                 _partial_cell(condition, "41-60")]
        assert all(f"| {c} |" in line + " |" for c in cells), (condition, cells, line)
    assert all(sum(_values(c, "41-60")[0]) == 0 for c, _ in BY)  # "41–60 exact is 0.000 under every condition"


def test_readme_answer():
    base = _exact_cell("none", "21-40")
    assert f"from the untouched model's {base} to 0.008–0.020" in FLAT
    fast = [f"clamp fast {k}" for k in (4, 8, 16)]
    exact = [sum(_values(c, "21-40")[0]) / 500 for c in fast]
    assert f"{min(exact):.3f}–{max(exact):.3f}" == "0.008–0.020"
    base_exact = _values("none", "21-40")[0]
    lost = [sum(b and not a for a, b in zip(_values(c, "21-40")[0], base_exact)) for c in fast]
    made = [sum(a and not b for a, b in zip(_values(c, "21-40")[0], base_exact)) for c in fast]
    assert f"it loses {min(lost)}–{max(lost)} of its {sum(base_exact)} exact strings and makes at most {max(made)})" \
        in FLAT
    drops = [_delta(c, "21-40") for c in fast]
    assert f"by {-max(d for d, _, _ in drops):.1f}–{-min(d for d, _, _ in drops):.1f} pp" in FLAT
    assert f"between {_pp(min(lo for _, lo, _ in drops))} and {_pp(max(hi for _, _, hi in drops))} pp" in FLAT
    beyond = [sum(_values(c, "41-60")[1]) / 500 for c in fast]
    assert f"from {sum(_values('none', '41-60')[1]) / 500:.3f} to {min(beyond):.3f}–{max(beyond):.3f}" in FLAT
    mid = "clamp mid 32"
    made_mid = sum(a and not b for a, b in zip(_values(mid, "21-40")[0], base_exact))
    lost_mid = sum(b and not a for a, b in zip(_values(mid, "21-40")[0], base_exact))
    d, lo, hi = _delta(mid, "21-40")
    d2, lo2, hi2 = _delta(mid, "41-60")
    assert (f"raises 21–40 exact to {_exact_cell(mid, '21-40')} ({made_mid} strings made exact, none lost) and "
            f"per-token by {d:.1f} pp [{lo:.1f}, {hi:.1f}] to {sum(_values(mid, '21-40')[1]) / 500:.3f}, and 41–60 "
            f"per-token by {d2:.1f} pp [{lo2:.1f}, {hi2:.1f}] to {sum(_values(mid, '41-60')[1]) / 500:.3f}") in FLAT
    assert lost_mid == 0
    slow = [c for c, _ in BY if " slow " in c]
    worst = max(abs(_delta(c, b)[0]) for c in slow for b in ("21-40", "41-60"))
    assert worst < 0.45 and "every paired difference within ±0.4 pp" in FLAT
    small = {b: [_delta(f"clamp mid {k}", b)[0] for k in (4, 8, 16)] for b in ("21-40", "41-60")}
    assert (f"(per-token {_pp(min(small['21-40']))} to {_pp(max(small['21-40']))} pp on 21–40, "
            f"{_pp(min(small['41-60']))} to {_pp(max(small['41-60']))} pp on 41–60)") in FLAT
    removed = "remove mid 32"
    assert (f"while 21–40 per-token rises to {sum(_values(removed, '21-40')[1]) / 500:.3f} and 41–60 to "
            f"{sum(_values(removed, '41-60')[1]) / 500:.3f}") in FLAT
    others = [c for c, _ in BY if c.startswith("remove-beyond")]
    assert max(_delta(c, "21-40")[0] for c in others) <= 0  # no gain on 21-40 for any band
    assert f"at most {_pp(max(_delta(c, '41-60')[0] for c in others))} pp per token on 41–60" in FLAT
    fast_beyond = [sum(_values(f"remove-beyond fast {k}", "21-40")[0]) / 500 for k in (4, 8, 16, 32)]
    assert f"(21–40 exact {min(fast_beyond):.3f}–{max(fast_beyond):.3f})" in FLAT
    ids = {c: sum(_values(c, "1-20")[0]) / 500 for c, _ in BY}
    assert f"lengths 1–20 fall from {ids['none']:.3f} to {ids['remove fast 4']:.3f} exact" in FLAT
    assert f"1–20 keeps {ids['remove mid 32']:.3f} (ID cost {100 * (ids['none'] - ids['remove mid 32']):.1f} pp)" \
        in FLAT
    untouched = [c for c in ids if c.startswith(("clamp", "remove-beyond"))]
    assert {ids[c] for c in untouched} == {ids["none"]}  # held bands never reach a scored 1-20 position


def test_one_condition_remeasured_on_the_committed_model():
    """The first 40 strings of 21-40 under `clamp fast 4` and `clamp mid 32`, through `hooks.rotary_pairs` on the
    committed base: the rows' per-sample results."""
    import hooks
    from aspan import evaluation, models
    from aspan.applications.studies.qk import QKStudyConfig, held_out_sets, study_tasks
    from aspan.config import load_config

    cfg = load_config(QKStudyConfig, toml_path=ROOT / "configs" / "qk_spectrum_cpu.toml")
    model, tok, _ = models.load(ROOT / "results" / "qk_study" / "paper_shape" / "base", device="cpu")
    _, report, _ = held_out_sets(cfg, *study_tasks(cfg))
    for condition in ("clamp fast 4", "clamp mid 32"):
        row = BY[condition, "21-40"]
        edit = hooks.rotary_pairs(model, row["pairs"], mode="clamp", beyond=row["beyond"])
        res = evaluation.evaluate(model, tok, report["length 21-40"][:40], fwd_hooks=edit, attn=False)
        rec = res.records
        chars = rec[~rec.eos].groupby("sample_id").correct.sum()
        assert [int(chars[i]) for i in range(40)] == row["chars_right"][:40], condition
        assert list(res.samples.length) == row["length"][:40]


def test_the_bands_periods_as_quoted():
    """Pair i turns by 10000^(-i/64) rad per position: the periods the README gives for pair 0, the middle 32 pairs
    (16-47) and pair 63, from each pair's own rotation, not from the band names."""
    def period(i: int) -> float:
        return 2 * math.pi / 10000 ** (-i / 64)

    mid = BY["clamp mid 32", "21-40"]["pairs"]
    assert (mid[0], mid[-1]) == (16, 47)
    assert (f"the middle 32 pairs ({mid[0]}–{mid[-1]}, periods of about {period(mid[0]):.0f}–"
            f"{round(period(mid[-1]), -2):,.0f} positions)") in FLAT
    assert (f"the periods 2π/θ_i run from {period(0):.1f} positions (pair 0) to about {round(period(63), -3):,.0f} "
            "(pair 63)") in FLAT
