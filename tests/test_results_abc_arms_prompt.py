"""results/abc_study/arms_prompt: its README's table, answers and per-seed sentence recomputed from the committed rows
(runs.jsonl, table.csv, run.json), and the rows it shares with results/abc_study/arms checked equal."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from aspan.intervals import seed_interval
from tests.results_rows import abc_name, flat, jsonl

ROOT = Path(__file__).resolve().parent.parent
ABC = ROOT / "results" / "abc_study"
RUN = ABC / "arms_prompt"
README, FLAT = (RUN / "README.md").read_text(encoding="utf-8"), flat(RUN / "README.md")
DIGITS = (6, 10, 20, 60)


ROWS = jsonl(RUN / "runs.jsonl")
ARMS = {r["key"]: r for r in jsonl(ABC / "arms" / "runs.jsonl")}
TABLE = pd.read_csv(RUN / "table.csv")
PLAN = list(dict.fromkeys(TABLE.condition))  # this run's conditions, in the table's order


def _seeds(task: str, cond: str) -> list[dict]:
    found = sorted((r for r in ROWS if r["task"] == task and abc_name(r) == cond), key=lambda r: r["seed"])
    assert [r["seed"] for r in found] == [0, 1, 2], (task, cond)
    return found


def _exact(task: str, cond: str, d: int) -> list[float]:
    return [r[f"test_exact_{d}"] for r in _seeds(task, cond)]


def _mean(task: str, cond: str, d: int) -> float:
    return sum(_exact(task, cond, d)) / 3


def _cell(task: str, cond: str, d: int) -> str:
    lo, hi = seed_interval(_exact(task, cond, d), 100)
    return f"{_mean(task, cond, d):.3f} [{lo:.3f}, {hi:.3f}]"


def test_the_plan_ran_three_seeds_and_the_rows_shared_with_the_arms_run_are_its_rows():
    assert PLAN == ["rotary", "abc", "abc[prompt local]", "abc[prompt free]", "abc[padded]",
                    "abc[padded, prompt local]", "abc[padded, prompt free]"]
    for task in ("successor", "addition"):
        for cond in PLAN:
            _seeds(task, cond)
    shared = [r for r in ROWS if r["key"] in ARMS]
    assert len(ROWS) == 72 and len(shared) == 39 and all(r["task"] == "successor" for r in shared)
    assert all(r == ARMS[r["key"]] for r in shared)  # found by key, not retrained
    new = [r for r in ROWS if r["key"] not in ARMS]
    assert len(new) == 33 and {abc_name(r) for r in new if r["task"] == "successor"} == {
        "abc[prompt local]", "abc[prompt free]", "abc[padded, prompt local]", "abc[padded, prompt free]"}
    total = sum(r["wall_s"] for r in new)
    assert f"The {len(new)} rows trained here" in FLAT and f"took {total:,.0f} s of their own wall time" in FLAT
    run = json.loads((RUN / "run.json").read_text(encoding="utf-8"))
    assert run["train_eval_s_all_rows"] == pytest.approx(sum(r["wall_s"] for r in ROWS))
    assert f"`train_eval_s_all_rows` ({run['train_eval_s_all_rows']:,.0f} s)" in FLAT
    assert set(run["chosen_lr"].values()) == {0.003} and (pd.DataFrame(ROWS).lr == 0.003).all()


def test_the_table_and_table_csv():
    for task in ("successor", "addition"):
        for cond in PLAN:
            row = _seeds(task, cond)[0]
            name = {"rotary": "rotary (the base)", "abc": "abc (the study's)"}.get(cond, cond)
            prompt = "–" if cond == "rotary" else row.get("abc_prompt", "calibrated")
            partial = sum(r["test_partial_60"] for r in _seeds(task, cond)) / 3
            line = (f"| {task} | {name} | {row.get('abc_layout', 'natural')} | {prompt} | "
                    + " | ".join(_cell(task, cond, d) for d in DIGITS) + f" | {partial:.3f} |")
            assert line in README, line
            for d in DIGITS:
                t = TABLE[(TABLE.task == task) & (TABLE.condition == cond) & (TABLE.digits == d)].iloc[0]
                assert t.exact_mean == pytest.approx(_mean(task, cond, d)) and t.seeds == 3 and t.n_test == 100


def test_answer_one_the_prompt_rows():
    s = "successor"
    assert f"raises 60 digits from {_cell(s, 'abc[padded]', 60)} to {_cell(s, 'abc[padded, prompt local]', 60)}" \
           in FLAT
    local = sum(r["test_partial_60"] for r in _seeds(s, "abc[padded, prompt local]")) / 3
    assert f"(per token {local:.3f}), still far from the natural layout's {_mean(s, 'abc', 60):.3f}" in FLAT
    assert _mean(s, "abc[prompt free]", 60) == _mean(s, "abc[padded, prompt free]", 60) == 0
    assert (f"falls at 20 ({_mean(s, 'abc[prompt free]', 20):.3f} natural, "
            f"{_mean(s, 'abc[padded, prompt free]', 20):.3f} padded)") in FLAT
    per_seed = ", ".join(f"{x:.2f}" for x in _exact(s, "abc[prompt local]", 60))
    assert f"({_cell(s, 'abc[prompt local]', 60)} at 60 digits; per seed {per_seed})" in FLAT


def test_answer_two_addition_over_three_bases():
    a = "addition"
    assert all(x == 0 for d in DIGITS for x in _exact(a, "rotary", d))
    six, sixty = _exact(a, "abc", 6), _exact(a, "abc", 60)
    assert [x > 0.5 for x in sixty] == [True, False, False]
    assert f"(seed 0: {six[0]:.2f} at 6 digits, {sixty[0]:.2f} at 60)" in FLAT
    assert f"(seed 1 {six[1]:.2f}, seed 2 {six[2]:.2f})" in FLAT and all(x < 0.5 for x in six[1:])
    assert f"the mean is {_cell(a, 'abc', 60)} at 60 digits" in FLAT
    seed0 = [_exact(a, c, 60)[0] for c in ("abc", "abc[prompt local]", "abc[prompt free]")]
    assert f"(seed 0: {', '.join(f'{x:.2f}' for x in seed0)} at 60 digits, calibrated, local, free)" in FLAT
    padded = [c for c in PLAN if "padded" in c]
    assert all(x == 0 for c in padded for x in _exact(a, c, 60))
    assert f"fits 6 digits to {max(x for c in padded for x in _exact(a, c, 6)):.2f} at most" in FLAT
    (long,) = [r for r in jsonl(ABC / "long_addition" / "runs.jsonl") if r["condition"] == "abc"]
    assert f"(`long_addition/`: {long['test_exact_60']:.2f} exact at 60 digits)" in FLAT


def test_the_per_seed_sentence():
    for task in ("successor", "addition"):
        for cond in PLAN:
            sixty = _exact(task, cond, 60)
            if any(sixty):
                assert f"{cond} {', '.join(f'{x:.2f}' for x in sixty)}" in FLAT, (task, cond)


def test_the_abc_readme_and_the_study_page_quote_it():
    """The study README qualifies its one-seed addition result with this run's three bases, and the study page says
    both answers, with this run's numbers."""
    study, page = flat(ABC / "README.md"), flat(ROOT / "docs" / "studies" / "abc_study.md")
    seed0 = f"(seed 0: {_exact('addition', 'abc', 60)[0]:.2f})"
    for text in (study, page):
        assert f"ABC carries addition to 60 digits from one {seed0}" in text
    assert "`arms_prompt/`" in study and "results/abc_study/arms_prompt" in page
    assert f"without them {_cell('successor', 'abc[padded, prompt local]', 60)}" in page
