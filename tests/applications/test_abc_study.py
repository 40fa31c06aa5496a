"""`aspan study abc`: the protocol presets (contexts for 60 digits, uniform digit counts) and a complete quick run."""
import json
import random

import pandas as pd
import pytest

from aspan import models, tasks
from aspan.applications.studies.abc import (
    CONDITIONS,
    STUDY_TASKS,
    AbcStudyConfig,
    LengthMix,
    length_task,
    protocol_context,
    select_score,
    train_task,
    unavailable,
)
from aspan.batching import make_batch
from aspan.cli import main
from aspan.tokenization import CharTokenizer


@pytest.mark.parametrize("name", STUDY_TASKS)
def test_presets_fit_60_digit_samples_and_are_checked_up_front(name):
    tok = CharTokenizer.for_alphabets(train_task(name).alphabet)
    needed = protocol_context(name, (6, 10, 20, 60), tok.offset)
    longest = make_batch(length_task(name, 60).generate(20, seed=0), tok).tokens.shape[1]
    assert longest <= needed
    with pytest.raises(ValueError, match="context too short"):
        models.check_context(needed - 1, length_task(name, 60), tok.offset)
    for n in (6, 10, 20, 60):  # every test sample has exactly n digits (n bits)
        s = length_task(name, n).generate(5, seed=n)
        width = [len(x.text[: x.prompt_len - 1].split("+")[0]) for x in s]
        assert width == [n] * 5


def test_training_mix_draws_the_digit_count_uniformly():
    mix = train_task("successor", 6)
    counts = pd.Series([len(s.text.split(",")[0]) for s in mix.generate(1200, seed=3)]).value_counts()
    assert sorted(counts.index) == [1, 2, 3, 4, 5, 6] and counts.min() > 140  # uniform numbers: 90 % six-digit
    assert [s.text for s in mix.generate(5, seed=1)] == [s.text for s in train_task("successor", 6).generate(5, seed=1)]
    s = mix.generate(1, seed=4)[0]
    assert s.target == tasks.get("successor", start=(0, 9), numbers=2).solve_like(s.text[: s.prompt_len], s.target)
    with pytest.raises(ValueError):
        LengthMix([])
    assert isinstance(mix._sample(random.Random(0)).text, str)


def test_selection_rule_prefers_the_best_mean_and_rejects_missing_rows():
    assert select_score({"select_exact_6": 1.0, "select_exact_10": 0.5}, (6, 10)) == 0.75
    assert select_score({"status": "skipped"}, (6, 10)) == -1.0


def test_quick_study_writes_a_complete_table_and_resumes(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["study", "abc", "--quick", "--out", str(out), "--quiet"]) == 0
    cfg = AbcStudyConfig.quick()
    missing = unavailable(cfg)  # every encoding has a Hugging Face form at these sizes (ALiBi: Bloom, 2 heads)
    assert not missing
    assert capsys.readouterr().err.count(" not run: ") == len(missing)
    ran = [c for c in CONDITIONS if c not in missing]
    table = pd.read_csv(out / "table.csv")
    assert len(table) == len(STUDY_TASKS) * len(ran) * len(cfg.buckets)
    assert set(zip(table.task, table.condition)) == {(t, c) for t in STUDY_TASKS for c in ran}
    assert table.exact_mean.notna().all() and table.exact_mean.between(0, 1).all()
    assert (table[table.condition == "abc"].steps == cfg.steps + cfg.retrain_steps).all()
    runs = pd.read_json(out / "runs.jsonl", lines=True)
    assert len(runs) == len(STUDY_TASKS) * len(ran) and runs.key.is_unique
    assert set(runs.positional[runs.condition == "abs"]) <= {"none"}
    for name in STUDY_TASKS:
        assert json.loads((out / "figures" / f"abc_{name}.json").read_text())["data"]
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["steps"] == cfg.steps and "selection_rule" in run and run["not_run"] == missing
    assert json.loads((out / "summary.json").read_text())["not_run"] == missing
    # a rerun into the same directory trains nothing new
    before = (out / "runs.jsonl").read_text()
    assert main(["study", "abc", "--quick", "--out", str(out), "--quiet"]) == 0
    assert (out / "runs.jsonl").read_text() == before


@pytest.mark.parametrize("argv, msg", [
    (["--tasks", "reversal"], "tasks"),
    (["--conditions", "abc"], "rotary"),
    (["--lrs", "x"], "--lrs: expected a comma-separated list of numbers, got 'x'"),
    (["--steps", "0"], "steps"),
])
def test_bad_settings_fail_before_any_work(tmp_path, capsys, argv, msg):
    out = tmp_path / "bad"
    assert main(["study", "abc", "--quick", "--out", str(out), *argv]) == 2
    assert msg in capsys.readouterr().err and not out.exists()


def test_a_condition_the_bridge_cannot_build_is_named_before_any_training(monkeypatch):
    monkeypatch.setenv("ASPAN_BACKEND", "bridge")
    missing = unavailable(AbcStudyConfig.quick(n_heads=3, d_model=24))  # ALiBi as Bloom needs 2^k heads
    assert list(missing) == ["alibi"] and "power-of-two head count" in missing["alibi"]
