"""results/abc_study/arms: every number its README states, and those the abc READMEs and the study page quote from
it, recomputed from the committed rows (runs.jsonl, table.csv, run.json, time.txt, recheck.jsonl) and from the rows
of the runs it is compared with (results/abc_study, results/abc_paper, results/gpu_campaign)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from aspan.applications.studies.abc_arms import AbcArm
from aspan.intervals import seed_interval

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
ARMS = RESULTS / "abc_study" / "arms"
README = (ARMS / "README.md").read_text(encoding="utf-8")
FLAT = re.sub(r"\s+", " ", README)
LAYERS = {None: "each layer", 0: "layer 0", -1: "last layer"}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _flat(path: Path) -> str:
    return re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))


def _name(row: dict) -> str:
    """The condition as table.csv names it: "rotary", "abc" (the study's arm) or "abc[...]" (what differs)."""
    return row["condition"] if row["condition"] == "rotary" else AbcArm.of_row(row, "none").variant("none")


ROWS = _jsonl(ARMS / "runs.jsonl")
RUNS = pd.DataFrame(ROWS).assign(condition=[_name(r) for r in ROWS])
CONDITIONS = list(dict.fromkeys(RUNS.condition))  # in the order the rows were written
EXACT = {(c, d): RUNS[RUNS.condition == c].sort_values("seed")[f"test_exact_{d}"].tolist()
         for c in CONDITIONS for d in (6, 10, 20, 60)}


def _mean(cond: str, d: int) -> float:
    return sum(EXACT[cond, d]) / len(EXACT[cond, d])


def _cell(cond: str, d: int) -> str:
    lo, hi = seed_interval(EXACT[cond, d], 100)
    return f"{_mean(cond, d):.3f} [{lo:.3f}, {hi:.3f}]"


def _arm(row: dict) -> tuple[str, str, str]:
    """(layout, bias from, retrained positions) of a row as the README's table names them."""
    if row["condition"] == "rotary":
        return "natural", "–", "rotary"
    return row.get("abc_layout", "natural"), LAYERS[row.get("abc_layer")], row.get("abc_positional", "none")


LEARNED = [c for c in CONDITIONS if "learned" in c]


def test_the_rows_are_every_arm_at_three_seeds_on_the_same_settings():
    assert len(ROWS) == 39 and all(r["status"] == "ok" and r["task"] == "successor" for r in ROWS)
    assert {r["condition"] for r in ROWS} == {"rotary", "abc"}
    assert len(CONDITIONS) == 13 and all(sorted(RUNS[RUNS.condition == c].seed) == [0, 1, 2] for c in CONDITIONS)
    arms = {_arm(r) for r in ROWS if r["condition"] != "rotary"}
    assert arms == {(lay, src, pos) for lay in ("natural", "padded") for src in LAYERS.values()
                    for pos in ("none", "learned")}
    for key in ("lr", "retrain_steps", "n_test", "n_layers", "d_model", "n_heads", "lam", "n_calib",
                "batch_size", "set_draw"):
        assert RUNS[key].nunique() == 1, key
    assert (RUNS.lr == 0.003).all() and (RUNS.retrain_steps == 200).all()
    base = RUNS.condition == "rotary"
    assert set(RUNS[base].steps) == {800} and set(RUNS[~base].steps) == {1000}  # an ABC row counts 800 + 200
    assert (RUNS.n_test == 100).all() and (RUNS.d_model == 64).all() and (RUNS.n_layers == 2).all()
    run = json.loads((ARMS / "run.json").read_text(encoding="utf-8"))
    assert set(run["chosen_lr"]) == {f"successor/{c}" for c in CONDITIONS} and set(run["chosen_lr"].values()) == {0.003}
    assert run["machine"]["cpu_kernels"] == "AVX512" and run["machine"]["torch_threads"] == 1
    v = run["versions"]
    assert (f"torch {v['torch'].split('+')[0]} CPU, Python {v['python']}, TransformerLens {v['transformer_lens']}"
            in FLAT)
    # the first invocation was stopped during the last arm, whose three seeds the resumed one trained
    assert {RUNS.condition.iloc[i] for i in (36, 37, 38)} == {"abc[padded, last layer, learned]"}
    assert "wrote 36 rows and was stopped during the last arm (abc[padded, last layer, learned])" in FLAT


def test_the_table_and_table_csv():
    table = pd.read_csv(ARMS / "table.csv")
    for cond in CONDITIONS:
        layout, src, pos = _arm(next(r for r in ROWS if _name(r) == cond))
        name = {"rotary": "rotary (the base)", "abc": "abc (the study's)"}.get(cond, cond)
        line = f"| {name} | {layout} | {src} | {pos} | " + " | ".join(_cell(cond, d) for d in (6, 10, 20, 60)) + " |"
        assert line in README, line
        for d in (6, 10, 20, 60):
            t = table[(table.condition == cond) & (table.digits == d)].iloc[0]
            lo, hi = seed_interval(EXACT[cond, d], 100)
            assert t.exact_mean == pytest.approx(_mean(cond, d)) and (t.exact_lo, t.exact_hi) == pytest.approx((lo, hi))
            assert t.n_test == 100 and t.seeds == 3


def test_the_answer_and_the_per_seed_sentence():
    answer = FLAT.split("| condition |")[0]
    worst10 = max(_mean(c, 10) for c in LEARNED)
    assert all(_mean(c, 60) == 0 for c in LEARNED) and all(x == 0 for c in LEARNED for x in EXACT[c, 60])
    top = max(x for c in LEARNED for x in EXACT[c, 10])
    assert f"every arm scores at most {worst10:.3f} exact at 10 digits (mean over seeds; one seed reaches {top:.2f})" \
           " and 0.000 at 60" in answer
    assert f"the study's arm scores {_mean('abc', 10):.3f} at 10 and {_mean('abc', 60):.3f} at 60" in answer
    assert (f"keeps 10 and 20 digits ({_mean('abc[padded]', 10):.3f}, {_mean('abc[padded]', 20):.3f}) and loses 60 "
            f"digits ({_mean('abc[padded]', 60):.3f})") in answer
    assert f"lower the natural layout's 60 digits to {_mean('abc[layer 0]', 60):.3f}" in answer
    assert f"do as well as each layer's own ({_mean('abc[last layer]', 60):.3f})" in answer
    assert _mean("abc[padded, learned]", 10) == 0 and "give 0.000 at 10 digits here too" in answer
    assert (f"give {_mean('abc[padded, layer 0]', 10):.3f} at 10 digits and "
            f"{_mean('abc[padded, layer 0]', 60):.3f} at 60 here") in answer
    for cond in CONDITIONS:
        sixty = EXACT[cond, 60]
        if any(sixty):
            assert f"{cond} {', '.join(f'{x:.2f}' for x in sixty)}" in FLAT, cond
    best = max((x, c, s) for c in LEARNED for s, x in enumerate(EXACT[c, 10]))
    assert best == (0.49, "abc[learned]", 0)
    assert "the best seed at 10 digits is abc[learned]'s seed 0 at 0.49" in FLAT
    assert sorted(EXACT["rotary", 6]) == [0.68, 0.73, 1.0] and "(their 6-digit exact is 0.73, 0.68, 1.00)" in FLAT
    assert [min(EXACT[c, 6]) < 0.99 for c in ("abc[layer 0]", "abc[padded, layer 0]")] == [True, True]


def test_the_three_results_it_explains_are_the_committed_ones():
    study = pd.read_csv(RESULTS / "abc_study" / "table.csv")
    low = study[(study.task == "successor") & (study.condition == "abc") & (study.digits == 60)].exact_mean.iloc[0]
    (long,) = [r for r in _jsonl(RESULTS / "abc_study" / "long_successor" / "runs.jsonl") if r["condition"] == "abc"]
    assert f"{low:.2f}-{long['test_exact_60']:.2f} exact at 60 digits" in FLAT
    paper = [r for r in _jsonl(RESULTS / "abc_paper" / "runs.jsonl") if r["task"] == "successor"
             and r["condition"] == "abc"]
    assert len(paper) == 3 and all(r[f"correct_{d}"] == 0 for r in paper for d in (10, 20, 60))
    assert json.loads((RESULTS / "abc_paper" / "run.json").read_text())["config"]["abc_positional"] == "learned"
    gpu = [r for r in _jsonl(RESULTS / "gpu_campaign" / "state" / "abc_paper" / "runs.jsonl")
           if r["task"] == "successor" and r["condition"] == "abc"]
    ten = sorted(r["exact_10"] for r in gpu)
    assert len(gpu) == 3 and all(r["exact_60"] == 0 for r in gpu)
    assert f"gives {ten[0]:.2f}-{ten[-1]:.2f} at 10 digits and 0 at 60" in FLAT
    cfg = json.loads((RESULTS / "gpu_campaign" / "state" / "abc_paper" / "run.json").read_text())["config"]
    assert (cfg["calib_layer"], cfg["abc_positional"], cfg["n_layers"], cfg["d_model"]) == (0, "none", 6, 128)
    assert "(d_model 64 and 2 layers against 128 and 6)" in FLAT


def test_wall_time_and_the_recheck():
    timed = (ARMS / "time.txt").read_text(encoding="utf-8")
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", timed)[1])
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\d+):([\d.]+)", timed)
    assert "configs/abc_arms_cpu.toml --tasks successor" in timed and "Exit status: 0" in timed
    assert f"{wall[1]} min {round(float(wall[2]))} s wall, {user:,.0f} s of user CPU" in FLAT
    run = json.loads((ARMS / "run.json").read_text(encoding="utf-8"))
    total = sum(r["wall_s"] for r in ROWS)
    assert total == pytest.approx(run["train_eval_s_all_rows"]) and f"sum to {total:,.0f} s" in FLAT
    per = {c: sum(RUNS[RUNS.condition == c].wall_s) for c in CONDITIONS}
    natural = [per[c] for c in CONDITIONS if c.startswith("abc") and "padded" not in c]
    padded = [per[c] for c in CONDITIONS if "padded" in c]
    assert (f"{min(natural):.0f}-{max(natural):.0f} s for a natural arm's three seeds, {min(padded):,.0f}-"
            f"{max(padded):,.0f} s for a padded one's, {per['rotary']:.0f} s for the three bases") in FLAT
    (again,) = [r for r in _jsonl(ARMS / "recheck.jsonl") if r["condition"] == "abc"]
    (row,) = [r for r in ROWS if r["key"] == again["key"]]
    assert again["seed"] == 0 and _name(again) == "abc"
    values = [k for k in row if k.startswith(("test_", "select_"))] + ["lines", "kept_lines"]
    assert all(again[k] == row[k] for k in values if k in row)
    assert "equals its row here in every selection and test value" in FLAT


def test_the_abc_readmes_and_the_study_page_quote_the_arms():
    """The abc READMEs, the study page and the GPU campaign README say what the arms show, with the arms' numbers,
    and no longer what the rows contradict ("the gap to the paper is budget"; "rotary" bases learning addition)."""
    study = _flat(RESULTS / "abc_study" / "README.md")
    page = _flat(ROOT / "docs" / "studies" / "abc_study.md")
    paper, addition = _flat(RESULTS / "abc_paper" / "README.md"), _flat(RESULTS / "abc_paper_addition" / "README.md")
    gpu = _flat(RESULTS / "gpu_campaign" / "README.md")
    worst10 = max(_mean(c, 10) for c in LEARNED)
    pad = {d: f"{_mean('abc[padded]', d):.3f}" for d in (10, 20, 60)}
    gpu_arm = f"{_mean('abc[padded, layer 0]', 10):.3f} at 10 digits and {_mean('abc[padded, layer 0]', 60):.3f} at 60"
    assert "gap to the paper is budget" not in study and "rotary bases do learn addition" not in study
    assert "plain 2-layer bases do learn addition" not in page
    paper_page = _flat(ROOT / "docs" / "studies" / "abc_paper.md")
    assert (f"the retrained model's learned positions (at most {worst10:.3f} exact at 10 digits, 0.000 at 60, in "
            f"either layout and from any layer's lines); the padded layout alone loses 60 digits only ({pad[60]}); "
            f"and there the last layer's lines on every layer do as well as each layer's own "
            f"({_mean('abc[last layer]', 60):.3f} at 60 digits), layer 0's worse "
            f"({_mean('abc[layer 0]', 60):.3f})") in paper_page
    for text in (study, page):
        assert f"at most {worst10:.3f} exact at 10 digits, 0.000 at 60" in text
        assert f"keeps 10 and 20 digits ({pad[10]}, {pad[20]}) and loses 60 ({pad[60]})" in text
    assert f"give its pattern, {gpu_arm}" in study
    assert f"give the same pattern: {gpu_arm.replace(' and ', ', ')}" in gpu
    # results/abc_paper_addition: its bases use learned positions in the padded layout, and its ABC models score 0
    cfg = json.loads((RESULTS / "abc_paper_addition" / "run.json").read_text())["config"]
    assert (cfg["positional"], cfg["abc_positional"], cfg["n_layers"]) == ("learned", "learned", 2)
    rows = [r for r in _jsonl(RESULTS / "abc_paper_addition" / "runs.jsonl") if r["condition"] == "abc"]
    assert len(rows) == 3 and all(r[f"correct_{d}"] == 0 for r in rows for d in (10, 20, 60))
    assert "2-layer bases with learned absolute positions, in Duan & Shi's padded layout, do learn addition" in study
    assert "that study's ABC models, calibrated and retrained by the paper's protocol (padded layout, learned " \
           "positions), score 0 too at 10, 20 and 60 digits" in study
    assert "learned positions in Duan & Shi's padded layout do learn addition in 3,600–7,000 steps, and their ABC " \
           "models score 0 at 10, 20 and 60 digits" in page
    assert "(`results/abc_study/arms`: there, the retrained model's learned positions), not on addition" in addition
    assert (f"ABC scores {_mean('abc[padded, learned]', 10):.3f} at 10 digits there too; retrained with no positions "
            f"in the padded layout, the same calibration gives {pad[10]} at 10 digits and {pad[20]} at 20, and "
            f"{pad[60]} at 60") in paper


def test_the_project_readme_line_on_abc():
    """The project README's ABC line: the study's arm at 60 digits, and every arm with learned positions at 0 there,
    from the rows."""
    project = re.sub(r"\s+", " ", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert all(_mean(c, 60) == 0 for c in LEARNED) and len(LEARNED) >= 3
    assert {_arm(r)[0] for r in ROWS if _name(r) in LEARNED} >= {"natural", "padded"}  # either layout
    assert (f"ABC scores {_mean('abc', 60):.3f} exact at 60 digits when the model it retrains has no positional "
            f"encoding, and 0.000 at 60 digits when that model has learned positions") in project
