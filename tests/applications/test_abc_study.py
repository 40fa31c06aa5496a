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
    _task_sets,
    inputs_of_length,
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


# ----------------------------------------------------------------------------------------------- disjoint sets
def _prompts(samples):
    return [s.text[: s.prompt_len] for s in samples]


@pytest.mark.parametrize("cfg", [AbcStudyConfig.quick(), AbcStudyConfig(), AbcStudyConfig(n_select=200, n_test=1000)],
                         ids=["quick", "default", "gpu-sized"])
@pytest.mark.parametrize("name", ["successor", "addition", "parity"])
def test_selection_and_test_sets_repeat_nothing_and_never_share_an_input(cfg, name):
    """Built only (no training): every set without repeats, each test set apart from the selection set of its
    length; a length whose inputs cannot fill both (parity at 6 bits: 64) shares them in proportion."""
    sets = _task_sets(name, cfg)
    for table in (sets.select, sets.test):
        for n, samples in table.items():
            assert samples and len(set(_prompts(samples))) == len(samples), n
    for n in set(sets.select) & set(sets.test):
        assert not set(_prompts(sets.select[n])) & set(_prompts(sets.test[n])), n
        total = inputs_of_length(name, n)
        if total < cfg.n_select + cfg.n_test:  # the whole length, shared n_select : n_test
            assert len(sets.select[n]) + len(sets.test[n]) == total
            assert len(sets.select[n]) == round(total * cfg.n_select / (cfg.n_select + cfg.n_test))
        else:
            assert (len(sets.select[n]), len(sets.test[n])) == (cfg.n_select, cfg.n_test)


def test_the_former_draw_repeats_and_overlaps_where_the_disjoint_one_does_not():
    """Parity at 6 bits under the defaults: the independent draws share inputs (what rows written before
    `set_draw` were drawn with); the default draw is the former one wherever that had neither repeat nor overlap."""
    old = _task_sets("parity", AbcStudyConfig(set_draw="with_replacement"))
    assert set(_prompts(old.select[6])) & set(_prompts(old.test[6]))
    for name in ("successor", "addition"):
        a, b = _task_sets(name, AbcStudyConfig()), _task_sets(name, AbcStudyConfig(set_draw="with_replacement"))
        assert all(_prompts(a.test[n]) == _prompts(b.test[n]) for n in a.test)


def test_inputs_of_length_counts_every_prompt_a_length_task_draws():
    for name, n in (("successor", 1), ("successor", 2), ("addition", 1), ("parity", 4)):
        seen = {p for p in _prompts(length_task(name, n).generate(4000, seed=1))}
        assert len(seen) == inputs_of_length(name, n), (name, n)


def test_summary_intervals_count_the_answers_each_test_set_holds():
    """Parity at 6 bits has 64 inputs, so its disjoint test set holds 43 (the selection set 21): the table's n_test
    and the Wilson part of its interval count those, not the n_test setting (100) the longer lengths get."""
    from types import SimpleNamespace

    from aspan.applications.studies.abc import summary_table
    from aspan.intervals import wilson

    cfg = AbcStudyConfig(tasks=("parity",), conditions=("abs",), lrs=(1e-3,))
    sets = {"parity": _task_sets("parity", cfg)}
    assert (len(sets["parity"].select[6]), len(sets["parity"].test[6]), len(sets["parity"].test[10])) == (21, 43, 100)
    rows = {str(seed): {"task": "parity", "condition": "abs", "lr": 1e-3, "seed": seed, "status": "ok", "steps": 160,
                        **{f"test_{m}_{n}": 1.0 for m in ("exact", "partial") for n in cfg.buckets}}
            for seed in cfg.seeds}
    ctx = SimpleNamespace(cfg=cfg, sets=sets, rows=rows, chosen={("parity", "abs"): 1e-3})
    table = summary_table(ctx).set_index("digits")
    assert table.n_test.to_dict() == {6: 43, 10: 100, 20: 100, 60: 100}
    assert table.exact_lo[6] == pytest.approx(wilson(129, 129)[0])  # 0.971: every answer of the 3 seeds right
    assert table.exact_lo[60] == pytest.approx(wilson(300, 300)[0])  # 0.987


# ----------------------------------------------------------------------------------------------- ABC arms
def test_arm_names_and_key_settings_leave_the_studys_own_abc_as_it_was():
    from aspan.applications.studies.abc_arms import AbcArm

    own = AbcArm()
    assert own.variant("none") == "abc" and own.settings("none") == {}
    arm = AbcArm("padded", 0, "learned")
    assert arm.variant("none") == "abc[padded, layer 0, learned]"
    assert arm.settings("none") == {"abc_layout": "padded", "abc_layer": 0, "abc_positional": "learned"}
    assert AbcArm(layer=-1).variant("none") == "abc[last layer]" and AbcArm(positional="none").variant("learned") \
        == "abc[none]"
    assert AbcArm.of_row({"abc_layer": -1}, "none") == AbcArm(layer=-1)
    cfg = AbcStudyConfig(abc_layouts=("natural", "padded"), abc_layers=("each", 0, -1), tasks=("successor",))
    assert len(cfg.arms()) == 6 and cfg.variants("rotary") == [("rotary", None)]
    assert [v for v, _ in cfg.variants("abc")][:3] == ["abc", "abc[layer 0]", "abc[last layer]"]


def test_one_layers_lines_go_to_every_layer():
    from aspan.applications.studies.abc_arms import layer_lines

    lines = {(layer, h): f"L{layer}H{h}" for layer in range(3) for h in range(2)}
    assert layer_lines(lines, "each", 3) is lines
    assert layer_lines(lines, -1, 3) == {(layer, h): f"L2H{h}" for layer in range(3) for h in range(2)}
    assert layer_lines(lines, 0, 3) == {(layer, h): f"L0H{h}" for layer in range(3) for h in range(2)}


@pytest.mark.parametrize("kw, msg", [
    ({"abc_layouts": ("padded",), "tasks": ("parity",)}, "successor, addition only"),
    ({"abc_layouts": ("sideways",)}, "abc_layouts"),
    ({"abc_layers": (2,)}, "abc_layers"),
    ({"abc_layers": ("first",)}, "abc_layers"),
    ({"abc_positionals": ("sinusoidal",)}, "abc_positionals"),
])
def test_bad_arm_settings_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        AbcStudyConfig.quick(**kw).check()


def test_padded_sets_hold_the_same_numbers_in_the_padded_layout():
    from aspan.applications.studies.abc import padded_sets
    from aspan.applications.studies.abc_arms import numbers_of

    cfg = AbcStudyConfig(tasks=("addition",), abc_layouts=("natural", "padded"))
    sets = _task_sets("addition", cfg)
    padded = padded_sets(sets, "addition", cfg)
    for n in cfg.buckets:
        assert [[int(p) for p in s.text[: s.prompt_len - 1].split("+")] for s in padded.test[n]] == \
            [numbers_of(s) for s in sets.test[n]]
        assert all(s.target == tasks.get("addition", digits=(1, 60), layout="padded", width=60).solve(s.prompt)
                   for s in padded.test[n][:5])
    drawn = padded.train.generate(50, seed=3)
    assert {len(s.text) for s in drawn} == {183} and padded.calib is sets.calib  # calibrated on the natural base
    assert [numbers_of(s) for s in train_task("addition").generate(50, seed=3)] == \
        [[int(p) for p in s.text[: s.prompt_len - 1].split("+")] for s in drawn]


def test_quick_arms_run_resumes_the_plain_study_and_trains_each_arm_in_its_layout(tmp_path):
    """A plain quick run, then the same directory with arms: the rotary and abc rows are found by their keys, and
    only the arms train; a padded arm's rows are scored on padded samples (their n_ctx fits), a learned arm has
    absolute positions, a one-layer arm keeps that layer's lines on both layers."""
    from aspan.applications.studies.abc import run_study, units

    out = tmp_path / "arms"
    plain = AbcStudyConfig.quick(tasks=("successor",), conditions=("rotary", "abc"), n_layers=2)
    run_study(plain, out, progress=False)
    before = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    arms = AbcStudyConfig.quick(tasks=("successor",), conditions=("rotary", "abc"), n_layers=2,
                                abc_layouts=("natural", "padded"), abc_layers=("each", -1),
                                abc_positionals=("none", "learned"))
    keys = [u.key for u in units(arms)]
    assert "successor/abc[padded, last layer, learned]/lr 0.003" in keys and len(keys) == 1 + 8
    table = run_study(arms, out, progress=False)
    rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert rows[: len(before)] == before and len(rows) == len(before) + 7  # 8 arms, the plain one resumed
    assert set(table.condition) == {"rotary", *(v for v, _ in arms.variants("abc"))}
    by = {arms.variant_of(r): r for r in rows}
    assert by["abc[learned]"]["positional"] == "learned" and by["abc[padded]"]["positional"] == "none"
    assert by["abc[padded]"]["abc_layout"] == "padded" and "abc_layout" not in by["abc"]
    last = [r for r in by["abc[last layer]"]["kept_lines"] if r["rows"] == "target"]
    each = [r for r in by["abc"]["kept_lines"] if r["rows"] == "target"]
    assert {(r["layer"], r["head"]): r["lines"] for r in last} == \
        {(layer, r["head"]): r["lines"] for r in each if r["layer"] == 1 for layer in (0, 1)}
    local = AbcStudyConfig.quick(tasks=("successor",), conditions=("rotary", "abc"), n_layers=2,
                                 abc_prompts=("local",))
    run_study(local, out, progress=False)
    row = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()][-1]
    assert local.variant_of(row) == "abc[prompt local]" and row["abc_prompt"] == "local"
    assert {r["direction"] for r in row["kept_lines"] if r["rows"] == "prompt"} == {"diagonal"}


def test_prompt_rows_keep_their_lines_the_local_ones_or_none():
    """"local" keeps a prompt row's diagonal lines (itself, its predecessor) and drops its vertical ones (fixed
    positions); "free" leaves prompt rows unbiased; target rows keep their lines either way."""
    import torch

    from aspan.applications.studies.abc_arms import AbcArm, prompt_lines
    from aspan.experiments.abc import HeadLines

    hl = HeadLines({"diagonal": (1,)}, prompt={"diagonal": (0,), "vertical": (0, 1)})
    lines = {(0, 0): hl}
    assert prompt_lines(lines, "calibrated") is lines
    local, free = prompt_lines(lines, "local")[(0, 0)], prompt_lines(lines, "free")[(0, 0)]
    assert local.prompt == {"diagonal": (0,)} and free.prompt is None and local.lines == free.lines == hl.lines
    sep = torch.tensor([5])
    n = 8
    kept = {name: (h.bias(sep, n, n)[0] == 0) for name, h in (("calibrated", hl), ("local", local), ("free", free))}
    for q in range(5):  # prompt rows
        assert kept["calibrated"][q, : q + 1].nonzero().flatten().tolist() == sorted({0, min(1, q), q})
        assert kept["local"][q, : q + 1].nonzero().flatten().tolist() == [q]
        assert kept["free"][q, : q + 1].all()
    for name in kept:  # target rows: their diagonal line alone, whatever the prompt rows keep
        assert all(kept[name][q, : q + 1].nonzero().flatten().tolist() == [q - 1] for q in range(5, n))
    assert AbcArm(prompt="free").variant("none") == "abc[prompt free]"
    assert AbcArm("padded", prompt="local").settings("none") == {"abc_layout": "padded", "abc_prompt": "local"}
    with pytest.raises(ValueError, match="abc_prompts"):
        AbcStudyConfig.quick(abc_prompts=("none",)).check()
