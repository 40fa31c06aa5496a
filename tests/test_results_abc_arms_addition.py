"""results/abc_study/arms_addition: its README's table, answer and per-seed sentence recomputed from the committed
rows (runs.jsonl, table.csv, run.json), and the rows it found from results/abc_study/arms_prompt checked equal."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from aspan.intervals import seed_interval
from tests.results_rows import abc_name, flat, jsonl

ROOT = Path(__file__).resolve().parent.parent
ABC = ROOT / "results" / "abc_study"
RUN = ABC / "arms_addition"
README, FLAT = (RUN / "README.md").read_text(encoding="utf-8"), flat(RUN / "README.md")
DIGITS = (6, 10, 20, 60)
LAYERS = {None: "each layer", 0: "layer 0", -1: "last layer"}


ROWS = jsonl(RUN / "runs.jsonl")
PROMPT = {r["key"]: r for r in jsonl(ABC / "arms_prompt" / "runs.jsonl")}
TABLE = pd.read_csv(RUN / "table.csv")
PLAN = list(dict.fromkeys(TABLE.condition))


def _exact(cond: str, d: int) -> list[float]:
    found = sorted((r for r in ROWS if r["task"] == "addition" and abc_name(r) == cond), key=lambda r: r["seed"])
    assert [r["seed"] for r in found] == [0, 1, 2], cond
    return [r[f"test_exact_{d}"] for r in found]


def _cell(cond: str, d: int) -> str:
    values = _exact(cond, d)
    lo, hi = seed_interval(values, 100)
    return f"{sum(values) / 3:.3f} [{lo:.3f}, {hi:.3f}]"


def test_every_arm_of_the_arms_run_on_addition_and_the_found_rows_are_the_prompt_runs():
    assert set(TABLE.task) == {"addition"} and len(PLAN) == 13
    arms = {(r.get("abc_layout", "natural"), LAYERS[r.get("abc_layer")], r.get("abc_positional", "none"))
            for r in ROWS if r["task"] == "addition" and abc_name(r) in PLAN and r["condition"] != "rotary"}
    assert arms == {(lay, src, pos) for lay in ("natural", "padded") for src in LAYERS.values()
                    for pos in ("none", "learned")}
    found = [r for r in ROWS if r["key"] in PROMPT]
    assert len(ROWS) == 102 and len(found) == 72 and all(r == PROMPT[r["key"]] for r in found)
    new = [r for r in ROWS if r["key"] not in PROMPT]
    assert len(new) == 30 and {r["task"] for r in new} == {"addition"}
    assert f"The 30 rows trained here took {sum(r['wall_s'] for r in new):,.0f} s of their own wall time" in FLAT
    run = json.loads((RUN / "run.json").read_text(encoding="utf-8"))
    assert run["train_eval_s_all_rows"] == pytest.approx(sum(r["wall_s"] for r in ROWS))
    assert f"`train_eval_s_all_rows` ({run['train_eval_s_all_rows']:,.0f} s)" in FLAT
    assert run["argv"][run["argv"].index("--tasks") + 1] == "addition"


def test_the_table():
    for cond in PLAN:
        row = next(r for r in ROWS if r["task"] == "addition" and abc_name(r) == cond)
        arm = (("natural", "–", "rotary") if cond == "rotary" else
               (row.get("abc_layout", "natural"), LAYERS[row.get("abc_layer")], row.get("abc_positional", "none")))
        name = {"rotary": "rotary (the base)", "abc": "abc (the study's)"}.get(cond, cond)
        line = f"| {name} | {' | '.join(arm)} | " + " | ".join(_cell(cond, d) for d in DIGITS) + " |"
        assert line in README, line
        for d in DIGITS:
            t = TABLE[(TABLE.condition == cond) & (TABLE.digits == d)].iloc[0]
            assert t.exact_mean == pytest.approx(sum(_exact(cond, d)) / 3) and t.seeds == 3 and t.n_test == 100


def test_the_answer_and_the_per_seed_sentence():
    assert all(x == 0 for d in DIGITS for x in _exact("rotary", d))
    study = _exact("abc", 60)
    assert study[0] == 0.80 and f"seed 0's study arm scores {_exact('abc', 6)[0]:.2f} at 6 digits and 0.80 at 60" \
        in FLAT
    others = [c for c in PLAN if c not in ("rotary", "abc")]
    assert max(x for c in others for x in _exact(c, 60)) <= 0.05  # every other arm, every seed
    for cond, words in (("abc[learned]", "learned positions ({0} at 6 digits, {1} at 10, {2} at 60)"),
                        ("abc[layer 0]", "layer 0's lines on every layer ({1} at 10, {2} at 60)"),
                        ("abc[padded]", "the padded layout ({0} at 6 digits, {2} at 60)")):
        seed0 = [f"{_exact(cond, d)[0]:.2f}" for d in (6, 10, 60)]
        assert words.format(*seed0) in FLAT, cond
    assert _exact("abc[last layer]", 6)[0] == 0 and max(_exact("abc[last layer]", 6)) < 0.05
    for cond in ("abc", "abc[learned]", "abc[layer 0]", "abc[last layer]", "abc[padded]"):
        six, sixty = (", ".join(f"{x:.2f}" for x in _exact(cond, d)) for d in (6, 60))
        sixty = "0.00 on every seed" if not any(_exact(cond, 60)) else sixty
        assert f"{cond} {six} and {sixty}" in FLAT, cond
    successor = pd.read_csv(ABC / "arms" / "table.csv")
    last = successor[(successor.condition == "abc[last layer]") & (successor.digits == 60)].exact_mean.iloc[0]
    assert f"(`../arms/`: {last:.3f} at 60 digits)" in FLAT


def test_the_pages_say_it():
    """The project README, the abc READMEs and the study page say what the addition arms show, with their numbers, and
    none says any longer that addition was not run in the arms."""
    names = ("README.md", "results/abc_study/README.md", "results/abc_study/arms/README.md",
             "results/abc_study/arms_prompt/README.md", "docs/studies/abc_study.md")
    pages = {name: flat(ROOT / name) for name in names}
    for name, text in pages.items():
        assert "arms_addition" in text and "each" in text, name
        assert "addition not tested this way" not in text and "Addition was not run" not in text, name
    worst = max(x for c in PLAN if c not in ("rotary", "abc") for x in _exact(c, 60))
    for name in ("README.md", "results/abc_study/README.md", "docs/studies/abc_study.md"):
        assert f"to {worst:.2f} or less" in pages[name], name
    assert f"({_exact('abc', 60)[0]:.2f} at 60 digits), and from that base each of the protocol's choices alone" in \
        pages["README.md"]
