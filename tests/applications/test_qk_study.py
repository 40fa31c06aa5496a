"""`aspan study qk --quick`: a complete table (every condition and replay, every bucket, seeds, trainable counts),
the learning rate chosen on the selection set, figures and report, exact resumption, bad input before any work."""
import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from aspan import cli, models
from aspan.applications.studies.qk import QKStudyConfig, conditions
from aspan.param_groups import trainable_count


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("qk") / "run"
    assert cli.main(["study", "qk", "--quick", "--out", str(out), "--quiet"]) == 0
    return out


def test_quick_study_writes_a_complete_table(study):
    cfg = QKStudyConfig.quick()
    table = pd.read_csv(study / "table.csv")
    model = models.load("reversal", device="cpu").model
    conds = conditions(cfg, model)
    want = {("none", "nan")} | {(c.name, "0.0") for c in conds if c.lrs}
    want |= {(c, "0.5") for c in cfg.replay_conditions}
    assert set(zip(table.condition, table.replay.fillna(-1).astype(str).replace("-1.0", "nan"))) == want
    buckets = ["1-10", "11-20", "21-30"]
    for col in [f"{m}_{b}{sd}" for m in ("exact", "partial") for b in buckets for sd in ("", "_sd")]:
        assert table[col].between(0, 1).all(), col
    for _, r in table.iterrows():
        spec = None if r.condition in ("none", "all") else r.condition
        expect = 0 if r.condition == "none" else trainable_count(model, spec)[0]
        assert r.trainable == expect, r.condition
        assert r.n_seeds == (0 if r.condition == "none" else len(cfg.seeds))
    assert table.loc[table.condition == "qk-column:0", "trainable"].item() == 2 * 2 * 8 * 128  # W_Q, W_K columns
    rows = [json.loads(line) for line in (study / "runs.jsonl").read_text().splitlines()]
    assert len({r["key"] for r in rows}) == len(rows)
    # the chosen rate is the grid's best per-token accuracy on the selection set (first seed)
    sel = pd.read_csv(study / "selection.csv")
    for (cond, replay), g in sel.groupby(["condition", "replay"]):
        assert g.chosen.sum() == 1
        assert g.loc[g.chosen, "partial_select"].item() == g.partial_select.max()
        assert table[(table.condition == cond) & (table.replay == replay)].lr.item() == g.loc[g.chosen, "lr"].item()
    summary = json.loads((study / "summary.json").read_text())
    assert set(summary["findings"]["by_replay"]) == {"0.0", "0.5"}
    assert {p.name for p in (study / "figures").iterdir()} >= {"by_bucket_exact_replay0.json",
                                                              "pair_frequency_replay0.json"}
    assert (study / "report.html").stat().st_size > 10_000


def test_killed_study_resumes_to_the_same_rows(study, tmp_path):
    out = tmp_path / "resumed"
    shutil.copytree(study, out)
    lines = (out / "runs.jsonl").read_text().splitlines(keepends=True)
    (out / "runs.jsonl").write_text("".join(lines[:5]) + lines[5][:40])  # killed mid-write of row 6
    assert cli.main(["study", "qk", "--quick", "--out", str(out), "--quiet"]) == 0
    again = {r["key"]: r for r in map(json.loads, (out / "runs.jsonl").read_text().splitlines())}
    first = {r["key"]: r for r in map(json.loads, lines)}
    assert again.keys() == first.keys()
    for key, r in first.items():  # deterministic: recomputed rows equal the original ones
        assert {k: v for k, v in again[key].items() if not k.endswith("_s")} == \
               {k: v for k, v in r.items() if not k.endswith("_s")}


@pytest.mark.parametrize("extra, message", [(["--replays", "1.5"], "replay"), (["--columns", "99"], "out of range"),
                                            (["--seeds", "a"], "integers"), (["--steps", "0"], "steps"),
                                            (["--protocol", "curves", "--cap", "0"], "cap")])
def test_bad_input_fails_before_work(tmp_path, capsys, extra, message):
    out = tmp_path / "bad"
    assert cli.main(["study", "qk", "--quick", "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_gpu_config_parses_into_the_full_design():
    import argparse

    from aspan.commands.studies.qk import add_arguments, config_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(["--out", "x", "--config", "configs/qk_study_gpu.toml"]))
    model = models.load("reversal", device="cpu").model
    names = [c.name for c in conditions(cfg, model)]
    assert names[:4] == ["none", "all", "attn", "qk"] and len(names) == 4 + 8 + 16  # every pair and every column
    assert cfg.buckets[-1] == (31, 50) and cfg.replay_conditions == ("*",) and len(cfg.seeds) == 5


# ----------------------------------------------------------------------------------------------- curves protocol
CURVES = ["study", "qk", "--quick", "--protocol", "curves", "--quiet", "--out"]


@pytest.fixture(scope="module")
def curves_study(tmp_path_factory):
    out = tmp_path_factory.mktemp("qk_curves") / "run"
    assert cli.main([*CURVES, str(out)]) == 0
    return out


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_curves_protocol_trains_to_a_stop_and_tables_it(curves_study):
    from aspan.curves import Stop, stop_point

    cfg = QKStudyConfig.quick(protocol="curves")
    runs = [r for r in _jsonl(curves_study / "runs.jsonl") if r["condition"] != "none"]
    curves = _jsonl(curves_study / "learning_curves.jsonl")
    assert len({c["key"] for c in curves}) == len(curves)
    buckets = {"length 1-10", "length 11-20", "length 21-30"}
    for r in runs:
        assert r["protocol"] == "curves" and r["stop_reason"] in ("plateau", "cap") and 0 < r["stop_step"] <= cfg.cap
        assert r["stop_reason"] == "plateau" or r["stop_step"] == cfg.cap
        mine = [c for c in curves if c["run"] == r["key"]]
        steps = sorted({c["step"] for c in mine})
        assert steps == sorted({*range(0, r["stop_step"], cfg.curve_every), r["stop_step"]})  # 0, every 2, the stop
        assert {c["bucket"] for c in mine} == buckets and len(mine) == len(steps) * len(buckets)
        # the run stopped where the plateau rule on the fine-tuned lengths' per-token accuracy fires, or at the cap
        fired = stop_point(mine, Stop("plateau", "length 11-20", metric="partial"))
        assert (fired[0] if fired else cfg.cap) == r["stop_step"] and r["stop_metric"] == "partial"
        assert (fired is not None) == (r["stop_reason"] == "plateau")
    table = pd.read_csv(curves_study / "table.csv")
    trained = table[table.condition != "none"]
    assert trained.stop_reason.str.fullmatch(r"(cap \d|plateau \d)(, plateau \d)?").all()
    assert trained.fit.isin(["fit", "did not fit"]).all() and trained.stop_step.between(1, cfg.cap).all()
    for _, t in trained.iterrows():  # the plateau value is the fine-tuned bucket's exact where the runs stopped
        finals = [c["exact"] for r in runs if (r["condition"], r["replay"], r["lr"]) == (t.condition, t.replay, t.lr)
                  for c in curves if c["run"] == r["key"] and c["bucket"] == "length 11-20"
                  and c["step"] == r["stop_step"]]
        assert len(finals) == len(cfg.seeds) and t.plateau_exact == pytest.approx(sum(finals) / len(finals))
    figs = {p.name for p in (curves_study / "figures").iterdir()}
    assert {"curves_all_replay0.json", "curves_qk-pair0_replay0.5.json", "curves_qk-column0_replay0.json"} <= figs
    assert "curves_all_replay0" in (curves_study / "report.html").read_text()
    # every condition's mean curve on the fine-tuned lengths on one figure: one line per trained condition, the
    # mean over seeds of the curve rows at each step; it is the first figure of the finding's learning-curve claim
    overview = json.loads((curves_study / "figures" / "curves_finetuned_exact_replay0.json").read_text())
    lines = {t["name"]: t for t in overview["data"]}
    assert set(lines) == {f"{c}: length 11-20" for c in trained[trained.replay == 0].condition}
    mine = [c for r in runs if (r["condition"], r["replay"]) == ("all", 0.0) and r["lr"] == trained.set_index(
        ["condition", "replay"]).loc[("all", 0.0), "lr"] for c in curves if c["run"] == r["key"]
            and c["bucket"] == "length 11-20" and c["step"] == 0]
    y = lines["all: length 11-20"]["y"]  # plotly stores arrays as base64 (dtype, bdata)
    y = np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]) if isinstance(y, dict) else y
    assert y[0] == pytest.approx(sum(c["exact"] for c in mine) / len(mine))
    from aspan.report import key_figures

    assert "curves_finetuned_exact_replay0" in {p.stem for p in key_figures(curves_study)}


def test_curves_study_resumed_retrains_nothing(curves_study, tmp_path, monkeypatch):
    from aspan import training
    from aspan.applications.studies.qk import run_study

    out = tmp_path / "done"
    shutil.copytree(curves_study, out)
    before = (out / "runs.jsonl").read_text(), (out / "learning_curves.jsonl").read_text()

    def no_training(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(training, "train", no_training)
    monkeypatch.setattr(training.loop, "train", no_training)  # what train_resumable calls
    res = run_study(QKStudyConfig.quick(protocol="curves"), out, progress=False)
    assert ((out / "runs.jsonl").read_text(), (out / "learning_curves.jsonl").read_text()) == before
    assert len(res.rows) == len(before[0].splitlines())


def test_killed_curves_study_resumes_without_repeated_rows(curves_study, tmp_path):
    out = tmp_path / "killed"
    shutil.copytree(curves_study, out)
    runs = (out / "runs.jsonl").read_text().splitlines(keepends=True)
    (out / "runs.jsonl").write_text("".join(runs[:4]))  # killed after the 4th run (its later curves were written)
    assert cli.main([*CURVES, str(out)]) == 0
    first, again = _jsonl(curves_study / "runs.jsonl"), _jsonl(out / "runs.jsonl")
    assert [r["key"] for r in again[:4]] == [r["key"] for r in first[:4]]
    assert {r["key"] for r in again} == {r["key"] for r in first}
    curves = _jsonl(out / "learning_curves.jsonl")
    assert len({c["key"] for c in curves}) == len(curves) == len(_jsonl(curves_study / "learning_curves.jsonl"))


def _synthetic(lr_exact: dict, fit_lr: float | None = None):
    """A curves-protocol setup with one trained condition on two rates: per rate (selection per-token accuracy,
    report and curve exact); rows for seeds 0 and 1 at every rate."""
    from types import SimpleNamespace

    from aspan.applications.studies.qk import Condition

    cfg = QKStudyConfig.quick(protocol="curves", seeds=(0, 1), lr_small=tuple(lr_exact), fit_exact=0.9)
    conds = [Condition("none", None, ()), Condition("qk-column:0", "qk-column:0", tuple(lr_exact))]
    rows = [{"key": "none", "condition": "none", "replay": 0.0, "lr": None, "seed": None, "trainable": 0,
             "fraction": 0.0, **{f"{m}_{b}": 0.5 for m in ("exact", "partial") for b in ("1-10", "11-20", "21-30")}}]
    curves = []
    for lr, (select, test) in lr_exact.items():
        for seed in (0, 1):
            key = f"{lr}-{seed}"
            rows.append({"key": key, "condition": "qk-column:0", "replay": 0.0, "lr": lr, "seed": seed,
                         "trainable": 10, "fraction": 0.01, "partial_select": select, "exact_select": select,
                         "stop_reason": "plateau", "stop_step": 4,
                         **{f"{m}_{b}": test for m in ("exact", "partial") for b in ("1-10", "11-20", "21-30")}})
            curves += [{"key": f"{key}/{st}/{b}", "run": key, "condition": "qk-column:0", "replay": 0.0, "lr": lr,
                        "seed": seed, "step": st, "bucket": b, "exact": test * st / 4}
                       for st in (0, 2, 4) for b in ("length 11-20", "length 21-30")]
    return SimpleNamespace(cfg=cfg, conds=conds), rows, curves


def test_curves_lr_is_chosen_on_the_selection_set_only():
    from aspan.applications.studies.qk import aggregate

    # the selection set favours 0.001; the report buckets and the learning curves favour 0.01
    s, rows, curves = _synthetic({0.001: (0.8, 0.2), 0.01: (0.3, 1.0)})
    table = aggregate(s, rows, curves)
    row = table[table.condition == "qk-column:0"].iloc[0]
    assert row.lr == 0.001 and row.plateau_exact == pytest.approx(0.2)


def test_did_not_fit_claims_nothing_beyond_the_finetuned_lengths():
    from aspan.applications.studies.qk import aggregate

    s, rows, curves = _synthetic({0.001: (0.8, 0.5), 0.01: (0.3, 1.0)})  # chosen rate plateaus at 0.5 < 0.9
    row = aggregate(s, rows, curves).set_index("condition").loc["qk-column:0"]
    assert row.fit == "did not fit" and row.n_fit == 0 and pd.isna(row.steps_to_target)
    assert pd.isna(row["exact_21-30"]) and pd.isna(row["partial_21-30"]) and row["exact_11-20"] == 0.5
    s, rows, curves = _synthetic({0.001: (0.8, 1.0), 0.01: (0.3, 0.5)})  # chosen rate fits: its numbers stand
    row = aggregate(s, rows, curves).set_index("condition").loc["qk-column:0"]
    assert row.fit == "fit" and row["exact_21-30"] == 1.0 and row.steps_to_target == 4  # 0.9 first reached at 4


TINY_BASE = {"n_layers": 1, "n_heads": 1, "d_model": 16, "length": [1, 10], "cap": 4, "curve_every": 2,
             "n_curve": 4, "batch_size": 8, "warmup": 0}


def test_base_is_trained_first_once_and_fine_tuned(tmp_path, monkeypatch):
    from aspan import training
    from aspan.applications.studies.qk import run_study

    cfg = QKStudyConfig.quick(protocol="curves", base=TINY_BASE, seeds=(0,), replays=(0.0,))
    out = tmp_path / "run"
    res = run_study(cfg, out, progress=False)
    record = json.loads((out / "base" / "base.json").read_text())
    assert record["base"]["d_model"] == 16 and record["stop"]["reason"] in ("cap", "target")
    assert record["stop"]["step"] <= 4 and record["fitted"] == (record["id_exact"] >= 0.99)
    model = models.load(out / "base", device="cpu").model
    assert (model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_model) == (1, 1, 16)
    assert all(r["base"]["d_model"] == 16 for r in res.rows)  # the base is part of every row's key
    qk = res.table.set_index("condition").loc["qk-column:0", "trainable"]
    assert qk == 2 * 1 * 1 * 16  # one column of W_Q and of W_K in the single head of the base's one layer
    weights = (out / "base" / "model.safetensors").read_bytes()

    def no_training(*a, **k):
        raise AssertionError("the base or a finished run was trained again")

    monkeypatch.setattr(training, "train", no_training)
    monkeypatch.setattr(training.loop, "train", no_training)  # what train_resumable calls
    again = run_study(cfg, out, progress=False)
    assert len(again.rows) == len(res.rows)
    assert (out / "base" / "model.safetensors").read_bytes() == weights


def test_a_base_stopped_mid_training_resumes_to_the_same_weights(tmp_path, monkeypatch):
    """The base trains checkpointed (every curve_every steps, in RUN_DIR/base-training): a study killed after the
    base's step 2 of 4 resumes it from that checkpoint and ends with exactly the weights of an uninterrupted run."""
    from aspan import training
    from aspan.applications.studies.qk import base_training_dir, run_study

    cfg = QKStudyConfig.quick(protocol="curves", base=TINY_BASE, seeds=(0,), replays=(0.0,), columns=(),
                              pairs=(0,), lr_large=(1e-3,), lr_small=(1e-3,))
    whole = tmp_path / "whole"
    run_study(cfg, whole, progress=False)
    real = training.train

    def killed(*a, **k):
        real(*a, **{**k, "stop_after": 2})
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", killed)
    out = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        run_study(cfg, out, progress=False)
    assert not (out / "base").exists() and training.latest_checkpoint(base_training_dir(out / "base")) is not None
    monkeypatch.setattr(training, "train", real)
    run_study(cfg, out, progress=False)
    assert (out / "base" / "model.safetensors").read_bytes() == (whole / "base" / "model.safetensors").read_bytes()
    steps = [json.loads(line)["step"] for line in (base_training_dir(out / "base") / "curves.jsonl").open()
             if json.loads(line).get("kind") == "curve"]
    assert steps == sorted(steps) and len(steps) == len(set(steps))  # no curve row repeated by the resume


def test_bad_base_key_one_line_before_work(tmp_path, capsys):
    config = tmp_path / "bad.toml"
    config.write_text('protocol = "curves"\n[base]\nn_layerz = 2\n')
    out = tmp_path / "run"
    assert cli.main(["study", "qk", "--quick", "--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "n_layerz" in err and "base" in err and len(err.splitlines()) == 1 and not out.exists()


def test_paper_shape_config_holds_the_paper_model_and_lengths():
    import argparse

    from aspan.applications.studies.qk import base_spec
    from aspan.commands.studies.qk import add_arguments, config_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(["--out", "x", "--config", "configs/qk_paper_shape_gpu.toml"]))
    spec = base_spec(cfg)
    assert (spec.n_layers, spec.n_heads, spec.d_model, spec.positional) == (4, 1, 256, "rotary")
    assert spec.length == (1, 20) and spec.fit_exact == 0.99
    assert cfg.finetune == (21, 40) and cfg.buckets == ((1, 20), (21, 40), (41, 60))
    assert cfg.protocol == "curves" and cfg.cap >= 3000 and all(len(g) == 3 for g in (cfg.lr_large, cfg.lr_qk,
                                                                                      cfg.lr_small))


def test_curves_protocol_flag_brings_three_point_grids():
    import argparse

    from aspan.commands.studies.qk import add_arguments, config_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(["--out", "x", "--protocol", "curves"]))
    assert cfg.protocol == "curves" and cfg.cap == 3000
    assert all(len(g) == 3 for g in (cfg.lr_large, cfg.lr_qk, cfg.lr_small))
    assert config_from_args(p.parse_args(["--out", "x", "--protocol", "curves", "--quick"])) == \
        QKStudyConfig.quick(protocol="curves")
    assert config_from_args(p.parse_args(["--out", "x"])) == QKStudyConfig()  # the budget default stays


# ----------------------------------------------------------------------------------------------- labels, intervals
@pytest.mark.parametrize("reason", ["plateau", "target", "cap"])
def test_label_comes_from_accuracy_never_from_the_stop_rule(reason):
    """A run the plateau rule stopped (or the target rule, or the cap) whose exact accuracy at its last evaluation
    meets the target is "fit"; the same runs below the target are "did not fit", whichever rule stopped them."""
    from aspan.applications.studies.qk import aggregate

    for final, label in ((0.95, "fit"), (0.85, "did not fit")):
        s, rows, curves = _synthetic({0.001: (0.8, final), 0.01: (0.3, 0.2)})
        for r in rows:
            r["stop_reason"] = reason if "stop_reason" in r else None
        row = aggregate(s, rows, curves).set_index("condition").loc["qk-column:0"]
        assert row.fit == label and row.plateau_exact == pytest.approx(final)
        assert row.stop_reason == f"{reason} 2"


def test_table_reports_wilson_and_t_intervals():
    import math

    from scipy.stats import t

    from aspan.applications.studies.qk import aggregate
    from aspan.intervals import wilson

    s, rows, curves = _synthetic({0.001: (0.8, 1.0), 0.01: (0.3, 0.5)})
    picked = [r for r in rows if r["lr"] == 0.001]
    picked[1].update({"exact_11-20": 0.5, "partial_11-20": 0.5})  # seed 1 differs: the t-interval has width
    row = aggregate(s, rows, curves).set_index("condition").loc["qk-column:0"]
    vals = [1.0, 0.5]
    half = t.ppf(0.975, 1) * (sum((v - 0.75) ** 2 for v in vals) ** 0.5) / math.sqrt(2)
    assert (row["partial_11-20_lo"], row["partial_11-20_hi"]) == pytest.approx((max(0, 0.75 - half), 1.0))
    n = s.cfg.n_report  # pooled over both seeds: round(rate * n) correct answers each
    pooled = wilson(n + round(0.5 * n), 2 * n)
    assert (row["exact_11-20_wilson_lo"], row["exact_11-20_wilson_hi"]) == pytest.approx(pooled)
    # exact: the wider of the two (here the t-interval, as the seeds disagree; clipped to [0, 1])
    assert (row["exact_11-20_lo"], row["exact_11-20_hi"]) == pytest.approx((max(0, 0.75 - half), 1.0))
    assert row["exact_11-20_lo"] <= pooled[0] and row["exact_11-20_hi"] >= pooled[1]
    s0, rows0, curves0 = _synthetic({0.001: (0.8, 0.0), 0.01: (0.3, 0.5)})
    same = aggregate(s0, rows0, curves0).set_index("condition").loc["qk-column:0"]
    assert (same["exact_11-20_lo"], same["exact_11-20_hi"]) == pytest.approx(wilson(0, 2 * n))  # all seeds at 0


def test_grid_extends_past_an_edge_until_it_brackets_the_best_rate():
    from aspan.applications.studies.qk import Condition, lr_edge, lr_grid

    cond = Condition("qk-pair:0", "qk-pair:0", (1e-3, 3e-3, 1e-2), 0, 1.0, extend=2)
    score = {3e-4: 0.7, 1e-3: 0.8, 3e-3: 0.6, 1e-2: 0.5, 1e-4: 0.75}  # best below the given grid's bottom edge

    def rows_for(rates):
        return [{"condition": "qk-pair:0", "replay": 0.0, "seed": 0, "lr": r, "partial_select": score[r],
                 "exact_select": 0.0} for r in rates]

    assert lr_grid(rows_for([1e-3, 3e-3]), cond, 0.0, 0) == ((1e-3, 3e-3, 1e-2), None)  # incomplete
    grid, chosen = lr_grid(rows_for([1e-3, 3e-3, 1e-2]), cond, 0.0, 0)
    assert chosen is None and grid == (3e-4, 1e-3, 3e-3, 1e-2)  # 1e-3 won at the bottom edge: one more below
    grid, chosen = lr_grid(rows_for([3e-4, 1e-3, 3e-3, 1e-2]), cond, 0.0, 0)
    assert grid[0] == 3e-4 and chosen == 1e-3 and lr_edge(rows_for(grid), cond, 0.0, 0) == ""  # bracketed
    score[3e-4] = 0.9  # the new edge wins: one more (the second and last allowed), then it stops there
    grid, chosen = lr_grid(rows_for([3e-4, 1e-3, 3e-3, 1e-2]), cond, 0.0, 0)
    assert chosen is None and grid[0] == 1e-4
    score[grid[0]] = 0.95
    grid, chosen = lr_grid(rows_for(grid), cond, 0.0, 0)
    assert chosen == grid[0] and len(grid) == 5 and lr_edge(rows_for(grid), cond, 0.0, 0) == "bottom"
    assert lr_grid(rows_for([1e-3, 3e-3, 1e-2]), Condition("qk-pair:0", "qk-pair:0", (1e-3, 3e-3, 1e-2)), 0.0, 0) == (
        (1e-3, 3e-3, 1e-2), 1e-3)  # no extension budget: the grid as given


def _spectrum_config():
    import argparse

    from aspan.commands.studies.qk import add_arguments, config_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    return config_from_args(p.parse_args(["--out", "x", "--config", "configs/qk_spectrum_cpu.toml"]))


def test_spectrum_config_holds_the_design():
    from aspan.param_groups import pair_columns

    cfg = _spectrum_config()
    model = models.load(cfg.init, device="cpu").model
    conds = conditions(cfg, model)
    pairs = (0, 8, 16, 24, 32, 40, 48, 56, 63)
    assert cfg.pairs == pairs and len(conds) == 4 + 2 * len(pairs) and model.cfg.d_head == 128
    for c in cfg.columns:  # one column inside each pair, and its frequency is that pair's
        col = next(x for x in conds if x.name == f"qk-column:{c}")
        assert c in pair_columns(model, col.pair) and col.pair in pairs
        assert col.frequency == next(x.frequency for x in conds if x.name == f"qk-pair:{col.pair}")
    assert sorted(x.pair for x in conds if x.name.startswith("qk-column")) == list(pairs)
    assert cfg.n_report >= 500 and len(cfg.seeds) == 3 and cfg.cap == 2000 and cfg.lr_extend >= 1
    assert cfg.protocol == "curves" and (cfg.stop, cfg.stop_metric) in {("plateau", "exact"), ("target", "exact"),
                                                                         ("none", "exact"), ("none", "partial")}
    assert cfg.id_length == (1, 20) and cfg.finetune == (21, 40) and not cfg.base  # the committed base is reused
    first = (Path("configs/qk_spectrum_cpu.toml").read_text().splitlines()[0])
    assert first.startswith("# `aspan study qk --config configs/qk_spectrum_cpu.toml --out ")


def test_spectrum_design_runs_quick(tmp_path):
    """The spectrum's code path at test size: the committed paper-shaped base, the fastest and slowest pair and a
    column, the exact plateau rule, an extended grid, intervals and the frequency figures."""
    from dataclasses import replace

    from aspan.applications.studies.qk import run_study, write_outputs

    cfg = replace(_spectrum_config(), seeds=(0, 1), pairs=(0, 63), columns=(63,), cap=4, curve_every=2, n_curve=4,
                  n_select=4, n_report=6, batch_size=4, warmup=0, lr_large=(1e-4,), lr_qk=(3e-4,),
                  lr_small=(1e-3, 3e-3), lr_extend=1, eval_batch_size=8)
    out = tmp_path / "run"
    res = run_study(cfg, out, progress=False)
    write_outputs(cfg, res, out, "test")
    table = res.table.set_index("condition")
    assert set(table.index) == {"none", "all", "attn", "qk", "qk-pair:0", "qk-pair:63", "qk-column:63"}
    for cond in ("qk-pair:0", "qk-pair:63", "qk-column:63"):
        grid = table.loc[cond, "lr_grid"].split()
        assert len(grid) in (2, 3) and (len(grid) == 3) == (table.loc[cond, "lr"] != 3e-3 or len(grid) == 3)
        assert table.loc[cond, "fit"] == ("fit" if table.loc[cond, "plateau_exact"] >= 0.9 else "did not fit")
    assert table.loc["qk-column:63", "frequency"] == table.loc["qk-pair:63", "frequency"]
    rows = [r for r in res.rows if r["condition"] != "none"]
    assert all(r["stop_metric"] == "exact" and r["id_length"] == [1, 20] for r in rows)
    assert {"pair_frequency_replay0.json", "pair_frequency_exact_replay0.json", "column_frequency_replay0.json",
            "column_frequency_exact_replay0.json"} <= {p.name for p in (out / "figures").iterdir()}
    fig = json.loads((out / "figures" / "pair_frequency_exact_replay0.json").read_text())
    assert all(not d["error_y"]["symmetric"] for d in fig["data"])  # Wilson bars: asymmetric


@pytest.mark.parametrize("extra, message", [({"stop": "soon"}, "stop"), ({"lr_extend": -1}, "lr_extend"),
                                            ({"id_length": (5, 1)}, "id_length: a range needs")])
def test_bad_stop_and_grid_settings_are_refused(extra, message):
    with pytest.raises(ValueError, match=message):
        QKStudyConfig.quick(protocol="curves", **extra).check()


@pytest.mark.parametrize("curves", [False, True], ids=["budget", "curves"])
def test_quick_selection_report_and_curve_sets_share_no_prompt_and_repeat_none(curves):
    """The --quick sets as `setup` builds them (no training): no two share a prompt (by construction: each set's
    draw skips the texts of the sets drawn before it, test_qk_study_sets.py), and none repeats a prompt (on these
    settings, not by construction: a set may repeat a short string)."""
    from aspan.applications.studies.qk import setup

    cfg = QKStudyConfig.curves(quick=True) if curves else QKStudyConfig.quick()
    s = setup(cfg)
    named = {"select": s.select, **{f"report {b}": v for b, v in s.report.items()},
             **{f"curve {b}": v for b, v in s.curves.items()}}
    assert len(named) == 1 + len(cfg.buckets) * (2 if curves else 1)
    prompts = {k: [x.text[: x.prompt_len] for x in v] for k, v in named.items()}
    for k, v in prompts.items():
        assert v and len(set(v)) == len(v), k
    names = list(prompts)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not set(prompts[a]) & set(prompts[b]), (a, b)


def test_only_and_lr_of_from_a_config_file_choose_what_trains_and_at_which_rates(tmp_path):
    """From a TOML file, as the spectrum's peak and partner configs use them: `only` keeps the named conditions (the
    untrained model always runs), an `[lr_of]` table gives one condition its own grid (here one rate fixed
    beforehand) and every other condition keeps its kind's; the study trains exactly those, and a condition's own
    grid is checked like the kinds' grids."""
    from aspan.applications.studies.qk import run_study
    from aspan.config import load_config

    toml = tmp_path / "c.toml"
    toml.write_text('only = ["all", "qk-pair:0", "qk-pair:1", "qk-column:9"]\npairs = [0, 1]\ncolumns = [9]\n'
                    'lr_small = [0.001, 0.01]\n[lr_of]\n"qk-pair:1" = [0.003]\n')
    cfg = load_config(QKStudyConfig, toml_path=toml, base=QKStudyConfig.quick(replays=(0.0,)))
    model = models.load("reversal", device="cpu").model
    grids = {c.name: c.lrs for c in conditions(cfg, model)}
    assert grids == {"none": (), "all": (1e-3,), "qk-pair:0": (1e-3, 1e-2), "qk-pair:1": (3e-3,),
                     "qk-column:9": (1e-3, 1e-2)}
    res = run_study(cfg, tmp_path / "run", progress=False)
    ran = {(r["condition"], r["lr"]) for r in res.rows}
    assert {lr for c, lr in ran if c == "qk-pair:1"} == {3e-3}
    assert {lr for c, lr in ran if c == "qk-pair:0"} == {1e-3, 1e-2}
    assert not {c for c, _ in ran} & {"attn", "qk"}
    assert res.table.set_index("condition").loc["qk-pair:1", "lr_grid"] == "0.003"
    for bad in (float("inf"), float("nan"), 0.0):
        with pytest.raises(ValueError, match="finite and positive"):
            QKStudyConfig.quick(lr_of={"qk-pair:1": [bad]}).check()


def test_the_committed_paper_shaped_run_resumes_and_names_its_base():
    """A study with a base records init "base" (the model it trained into RUN_DIR/base), not the `init` it did not
    load; the committed paper_shape rows carry that label and their keys are the settings' hashes, so rerunning its
    command finds every row and plans nothing."""
    from aspan.applications.studies.qk import plan, run_settings, setup
    from aspan.config import load_config
    from aspan.io import settings_key

    root = Path(__file__).resolve().parents[2]
    run = root / "results" / "qk_study" / "paper_shape"
    cfg = load_config(QKStudyConfig, toml_path=root / "configs" / "qk_paper_shape_cpu.toml")
    rows = [json.loads(line) for line in (run / "runs.jsonl").read_text().splitlines()]
    assert {r["init"] for r in rows} == {"base"} and all("base" in r for r in rows)
    s = setup(cfg, out=run)  # loads the committed base (its base.json says it is trained)
    assert plan(s, rows) == []
    none = next(r for r in rows if r["condition"] == "none")
    assert none["key"] == settings_key(run_settings(s, s.conds[0], 0.0, None, None))


def test_a_run_without_full_fine_tuning_reports_its_single_groups(tmp_path):
    """`only` without `all`: no full fine-tuning to compare with, so the findings hold no comparison and the report says
    what the single groups reach, its key figures the frequency figure and the learning curves."""
    from aspan.applications.studies.qk import run_study, write_outputs
    from aspan.report import build_report, key_figures

    cfg = QKStudyConfig.quick(protocol="curves", replays=(0.0,), stop="none", pairs=(0, 1), columns=(),
                              only=("qk-pair:0", "qk-pair:1"), seeds=(0,), lr_small=(1e-3,))
    out = tmp_path / "run"
    summary = write_outputs(cfg, run_study(cfg, out, progress=False), out, "test")
    assert summary["findings"]["by_replay"] == {}
    table = pd.read_csv(out / "table.csv")
    assert set(table.condition) == {"none", "qk-pair:0", "qk-pair:1"}
    best = table[table.condition != "none"].sort_values(["exact_11-20", "partial_11-20"], ascending=False).iloc[0]
    page = (out / "report.html").read_text()
    assert "compares single groups only" in page and best.condition in page
    assert [p.stem for p in key_figures(out)] == ["pair_frequency_exact_replay0", "curves_finetuned_exact_replay0"]
    assert build_report(out)
