"""`aspan study parity`: complete tables from --quick, the selection rule, resumption, bad settings refused early."""
import json
import math
import os
import subprocess
import sys
from itertools import product

import pandas as pd
import plotly.io as pio
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan.applications.studies import parity as study
from aspan.cli import main
from aspan.config import load_config
from aspan.tasks.parity import FORMATS
from aspan.tasks.split import held_out, part_of


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity") / "run"
    assert main(["study", "parity", "--quick", "--out", str(out)]) == 0
    return out


def test_quick_writes_complete_tables(quick_run):
    cfg = study.ParityStudyConfig.quick()
    summary = pd.read_csv(quick_run / "summary.csv")
    assert len(summary) == len(FORMATS) * len(cfg.multiples)
    assert set(summary.format) == set(FORMATS) and set(summary.multiple) == set(cfg.multiples)
    assert (summary.bits == summary.multiple * cfg.train_length).all() and (summary.seeds == cfg.seeds).all()
    assert summary[["exact_mean", "partial_mean"]].apply(lambda c: c.between(0, 1)).all().all()
    results = pd.read_csv(quick_run / "results.csv")
    for (fmt, m), g in results.groupby(["format", "multiple"]):  # the summary is the mean over the seed rows
        row = summary[(summary.format == fmt) & (summary.multiple == m)].iloc[0]
        assert math.isclose(row.exact_mean, g.exact.mean()) and math.isclose(row.partial_mean, g.partial.mean())
        # every test set n long, but at 1x the whole test third of the held-out 4-bit inputs (3 of them)
        assert sorted(g.seed) == list(range(cfg.seeds)) and (g.n == (3 if m == 1 else cfg.n_test)).all()
    selection = pd.read_csv(quick_run / "selection.csv")
    assert len(selection) == len(FORMATS) * len(cfg.lrs)
    assert (selection.groupby("format").chosen.sum() == 1).all()
    run = json.loads((quick_run / "run.json").read_text())
    for fmt, lr in run["chosen_lr"].items():
        assert selection[(selection.format == fmt) & selection.chosen].lr.item() == lr
        assert (summary[summary.format == fmt].lr == lr).all()
    names = {p.stem for p in (quick_run / "figures").glob("*.json")}
    assert names == {"exact_vs_length", "partial_vs_length", *(f"head_{f}" for f in FORMATS)}
    for p in (quick_run / "figures").glob("*.json"):
        pio.from_json(p.read_text())
    heads = pd.read_csv(quick_run / "heads.csv")
    assert list(heads.format) == list(FORMATS)
    assert "Parity" in (quick_run / "report.html").read_text()
    assert run["command"].startswith("aspan study parity") and run["wall_seconds"] > 0


def test_rows_match_the_saved_models(quick_run):
    """A result row is what the saved model scores on the regenerated held-out samples (independent re-evaluation)."""
    from aspan import models
    from aspan.evaluation import evaluate

    cfg = study.ParityStudyConfig.quick()
    results = pd.read_csv(quick_run / "results.csv")
    row = results[(results.format == "scratchpad") & (results.seed == 1)].sort_values("multiple").iloc[-1]
    loaded = models.load(quick_run / "models" / study.run_id("scratchpad", row.lr, 1), device="cpu")
    samples = study.make_task(cfg, "scratchpad", int(row.bits)).generate(cfg.n_test, seed=20_000 + int(row.multiple))
    res = evaluate(loaded.model, loaded.tokenizer, samples, attn=False).summary()
    assert math.isclose(res["exact"], row.exact) and math.isclose(res["partial"], row.partial)


def test_rerun_resumes_without_training(quick_run, monkeypatch):
    before = (quick_run / "rows.jsonl").read_text()

    def boom(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(study, "train_and_evaluate", boom)
    assert main(["study", "parity", "--quick", "--out", str(quick_run), "--no-report"]) == 0
    assert (quick_run / "rows.jsonl").read_text() == before


def _values(array) -> list[float]:
    """A figure JSON's numbers: a list, or plotly's typed array ({"dtype", "bdata": base64})."""
    import base64

    import numpy as np

    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def test_rewrite_outputs_draws_the_tables_again_from_the_rows_alone(quick_run, monkeypatch, tmp_path):
    """`rewrite_outputs`: the summary and the accuracy figures again from rows.jsonl and run.json, nothing trained;
    the figures' error bars reach the summary's 95 % interval; a directory missing a chosen run's rows is refused."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(quick_run, out, ignore=shutil.ignore_patterns("models", "scratch"))
    before = pd.read_csv(out / "summary.csv")
    for name in ("summary.csv", "figures/exact_vs_length.json", "figures/partial_vs_length.json"):
        (out / name).unlink()

    def boom(*a, **k):
        raise AssertionError("rewrite_outputs trained or evaluated")

    monkeypatch.setattr(study, "train_and_evaluate", boom)
    monkeypatch.setattr("aspan.evaluation.evaluate", boom)
    tables = study.rewrite_outputs(out)
    pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv"), before)
    written = pd.DataFrame(json.loads((out / "summary.json").read_text())["tables"]["summary"])
    pd.testing.assert_frame_equal(written, tables["summary"].reset_index(drop=True))
    fig = json.loads((out / "figures" / "exact_vs_length.json").read_text())
    assert "95 % intervals" in fig["layout"]["title"]["text"]
    for trace in fig["data"]:
        g = before[before.format == trace["name"]]
        assert _values(trace["error_y"]["array"]) == pytest.approx(list(g.exact_hi - g.exact_mean))
        assert _values(trace["error_y"]["arrayminus"]) == pytest.approx(list(g.exact_mean - g.exact_lo))
    rows = (out / "rows.jsonl").read_text().splitlines()
    (out / "rows.jsonl").write_text("\n".join(r for r in rows if '"seed": 1,' not in r) + "\n")
    with pytest.raises(ValueError, match="rows.jsonl"):
        study.rewrite_outputs(out)


def test_missing_checkpoint_is_retrained_for_the_views(quick_run):
    """Results committed without models/: the drawn run is trained again, the rows stay as they were."""
    import shutil

    run = json.loads((quick_run / "run.json").read_text())
    path = quick_run / "models" / study.run_id("interleaved", run["chosen_lr"]["interleaved"], 0)
    shutil.rmtree(path)
    before = (quick_run / "rows.jsonl").read_text()
    assert main(["study", "parity", "--quick", "--out", str(quick_run), "--no-report"]) == 0
    assert path.exists() and (quick_run / "rows.jsonl").read_text() == before


def test_choose_lr_rule():
    rows = pd.DataFrame([
        dict(lr=1e-3, split="select", which="id", exact=1.0, partial=1.0),
        dict(lr=1e-3, split="select", which="ood", exact=0.2, partial=0.5),
        dict(lr=3e-3, split="select", which="id", exact=0.9, partial=0.9),
        dict(lr=3e-3, split="select", which="ood", exact=0.4, partial=0.6),
        dict(lr=1e-2, split="select", which="id", exact=1.0, partial=1.0),
        dict(lr=1e-2, split="select", which="ood", exact=0.4, partial=0.7),
        dict(lr=3e-2, split="test", which="1", exact=1.0, partial=1.0),  # test rows never choose
    ])
    assert study.choose_lr(rows) == 1e-2  # ties on OOD exact broken by ID exact
    assert study.choose_lr(rows[rows.lr != 1e-2]) == 3e-3


def test_mean_sd():
    assert study.mean_sd([1.0, 0.0]) == (0.5, pytest.approx(math.sqrt(0.5)))
    m, s = study.mean_sd([0.25])
    assert m == 0.25 and math.isnan(s)


@pytest.mark.parametrize("argv, words", [
    (["--formats", "plain,tape"], "formats"),
    (["--lrs", "0.001,x"], "lrs"),
    (["--lrs", "0"], "lrs"),
    (["--seeds", "0"], "seeds"),
    (["--positional", "sinus"], "positional"),
    (["--train-length", "20"], "anchors"),  # 10x = 200 bits needs more mnemonic anchors than exist
])
def test_bad_settings_one_line_before_any_work(tmp_path, capsys, argv, words):
    out = tmp_path / "run"
    assert main(["study", "parity", "--quick", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_toml_config(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[parity]\nformats = ["plain", "mnemonic"]\nsteps = 5\nlrs = [0.001]\n')
    cfg = load_config(study.ParityStudyConfig, toml_path=good)
    assert (cfg.formats, cfg.steps, cfg.lrs, cfg.seeds) == (("plain", "mnemonic"), 5, (0.001,), 3)
    bad = tmp_path / "bad.toml"
    bad.write_text("[parity]\nstepz = 5\n")
    with pytest.raises(ValueError, match=f"{bad}: unknown key 'stepz'"):
        load_config(study.ParityStudyConfig, toml_path=bad)


def test_gpu_config_is_valid():
    from pathlib import Path

    gpu = Path(__file__).parents[2] / "configs" / "parity_study_gpu.toml"
    cfg = load_config(study.ParityStudyConfig, toml_path=gpu)
    assert cfg.seeds >= 3 and cfg.steps >= 800


# ----------------------------------------------------------------------------------------------- curves protocol
@pytest.fixture(scope="module")
def curves_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity_curves") / "run"
    assert main(["study", "parity", "--quick", "--protocol", "curves", "--out", str(out)]) == 0
    return out


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_curves_protocol_writes_curves_stops_and_fits(curves_run):
    cfg = study.ParityStudyConfig.curves(quick=True)
    rows = _jsonl(curves_run / "rows.jsonl")
    curves = _jsonl(curves_run / "learning_curves.jsonl")
    assert len({c["key"] for c in curves}) == len(curves)
    runs = {r["run"]: r for r in rows}
    assert len(runs) == len(FORMATS) * len(cfg.lrs) + len(FORMATS) * (cfg.seeds - 1)
    for key, r in runs.items():
        assert r["protocol"] == "curves" and r["stop_reason"] in ("target", "cap") and 0 < r["stop_step"] <= cfg.cap
        mine = [c for c in curves if c["run"] == key]
        assert {c["bucket"] for c in mine} == {"train", "2x"}
        assert sorted({c["step"] for c in mine}) == sorted({*range(0, r["stop_step"], cfg.curve_every),
                                                            r["stop_step"]})
        at_stop = [c["exact"] for c in mine if c["bucket"] == "train" and c["step"] == r["stop_step"]]
        assert at_stop == [r["fit_curve_exact"]] and r["fitted"] == (r["fit_curve_exact"] >= cfg.fit_exact)
        assert (r["stop_reason"] == "target") == r["fitted"]
    conv = pd.read_csv(curves_run / "convergence.csv")
    assert set(conv.format) == set(FORMATS) and conv.stop_reason.str.fullmatch(r"(cap|target) \d").all()
    summary = pd.read_csv(curves_run / "summary.csv")
    for fmt, fit in zip(conv.format, conv.fit):  # this tiny budget fits nothing: no claim past 1x
        beyond = summary[(summary.format == fmt) & (summary.multiple > 1)]
        assert fit == "did not fit" and (beyond.fit == "did not fit").all()
        assert beyond.exact_mean.isna().all() and (beyond.exact == "did not fit").all()
    assert summary[summary.multiple == 1].exact_mean.notna().all()
    assert {f"curves_{f}.json" for f in FORMATS} <= {p.name for p in (curves_run / "figures").iterdir()}
    overview = json.loads((curves_run / "figures" / "curves_fit.json").read_text())  # every format, one figure
    assert [t["name"] for t in overview["data"]] == [f"{f}: 1-{cfg.train_length} bits" for f in FORMATS]
    from aspan.report import key_figures

    assert "curves_fit" in {p.stem for p in key_figures(curves_run)}


def test_curves_rerun_retrains_nothing(curves_run, monkeypatch):
    from aspan import training

    before = (curves_run / "rows.jsonl").read_text(), (curves_run / "learning_curves.jsonl").read_text()

    def boom(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(training, "train", boom)
    monkeypatch.setattr(training.loop, "train", boom)  # what train_resumable calls
    assert main(["study", "parity", "--quick", "--protocol", "curves", "--out", str(curves_run), "--no-report"]) == 0
    assert ((curves_run / "rows.jsonl").read_text(), (curves_run / "learning_curves.jsonl").read_text()) == before


def test_curves_lr_prefers_a_rate_that_fit_and_never_reads_test_rows():
    rows = pd.DataFrame([
        dict(lr=1e-3, split="select", which="id", exact=1.0, partial=1.0, fitted=True),
        dict(lr=1e-3, split="select", which="ood", exact=0.2, partial=0.5, fitted=True),
        dict(lr=3e-3, split="select", which="id", exact=0.9, partial=0.9, fitted=False),
        dict(lr=3e-3, split="select", which="ood", exact=0.6, partial=0.6, fitted=False),
        dict(lr=1e-3, split="test", which="5", exact=0.0, partial=0.0, fitted=True),
        dict(lr=3e-3, split="test", which="5", exact=1.0, partial=1.0, fitted=False),
    ])
    assert study.choose_lr(rows) == 1e-3  # 3e-3 selects better but did not fit its training lengths
    both = rows.assign(fitted=True)
    assert study.choose_lr(both) == 3e-3
    # the test rows favour 1e-3 here; the selection set still decides
    assert study.choose_lr(both.assign(exact=lambda d: d.exact.where(d.split == "select", 1 - d.exact))) == 3e-3


def test_a_format_that_fit_keeps_its_extrapolation_numbers(tmp_path):
    cfg = study.ParityStudyConfig.curves(quick=True, formats=("scratchpad", "mnemonic"), seeds=2)
    rows = []
    for fmt, fitted in (("scratchpad", True), ("mnemonic", False)):
        for seed in (0, 1):
            for m in cfg.multiples:
                rows.append(dict(format=fmt, lr=1e-3, seed=seed, split="test", which=str(m), multiple=m,
                                 bits=m * cfg.train_length, exact=0.5, partial=0.75, n=8, train_seconds=1.0,
                                 final_loss=0.1, stop_reason="target" if fitted else "cap",
                                 stop_step=8 if fitted else 12, fit_curve_exact=1.0 if fitted else 0.5, fitted=fitted))
            rows += [dict(format=fmt, lr=1e-3, seed=seed, split="select", which=w, multiple=1, bits=3, exact=0.5,
                          partial=0.5, n=8) for w in ("id", "ood")]
    tables = study.write_tables(pd.DataFrame(rows), {"scratchpad": 1e-3, "mnemonic": 1e-3}, cfg, tmp_path)
    s = tables["summary"].set_index(["format", "multiple"])
    assert (s.loc["scratchpad"].exact_mean == 0.5).all() and (s.loc["scratchpad"].fit == "fit").all()
    assert s.loc[("mnemonic", 1)].exact_mean == 0.5 and s.loc["mnemonic"].loc[2:].exact_mean.isna().all()
    conv = tables["convergence"].set_index("format")
    assert conv.loc["scratchpad", "steps_to_target"] == 8 and conv.loc["scratchpad", "n_fit"] == 2
    assert pd.isna(conv.loc["mnemonic", "steps_to_target"]) and conv.loc["mnemonic", "fit"] == "did not fit"


def test_bad_curves_settings_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["study", "parity", "--quick", "--protocol", "curves", "--cap", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "cap" in err and len(err.splitlines()) == 1 and not out.exists()


def test_finding_says_did_not_fit_instead_of_a_number(curves_run):
    from aspan.findings.studies import parity

    finding = parity(json.loads((curves_run / "summary.json").read_text()),
                     json.loads((curves_run / "run.json").read_text()))
    assert "at 5x the training length: plain did not fit" in finding.answer and "–" not in finding.answer
    beyond = finding.headline[[c for c in finding.headline if " 1x" not in c and c != "format"]]
    assert (beyond == "did not fit").all().all()
    assert not (finding.headline["per-token 1x"] == "did not fit").any()  # the training lengths are reported


def test_a_run_that_fits_before_its_first_loss_row_still_gets_its_rows(tmp_path):
    """The target stop rule can fire at a curve check before training logged any loss (here step 8; the loss is
    logged every cap / 10 = 40 steps): the run still writes its rows, with no final loss (it raised IndexError)."""
    cfg = study.ParityStudyConfig.curves(quick=True, formats=("plain",), lrs=(3e-3,), seeds=1, cap=400, curve_every=4,
                                   fit_exact=0.3)
    study.run_study(cfg, tmp_path, report=False, progress=False)
    rows = _jsonl(tmp_path / "rows.jsonl")
    assert rows and {(r["stop_reason"], r["final_loss"]) for r in rows} == {("target", None)}
    assert {r["stop_step"] for r in rows} < set(range(1, 40))


# ----------------------------------------------------------------------------------------------- disjoint ID sets
def _bits(task, samples):
    from aspan.tasks.parity import Parity

    parse = task if isinstance(task, Parity) else task.task
    return {parse.bits(s.text[: s.prompt_len]) for s in samples}


@pytest.mark.parametrize("fmt", ["plain", "mnemonic"])
def test_held_out_id_inputs_are_never_training_inputs(fmt):
    """Training draws 1..L-bit inputs from one side of a fixed split of the inputs; every held-out set at the
    training lengths (selection 1x, test 1x, the fit curve set) draws from the other side only."""
    cfg = study.ParityStudyConfig.curves(train_length=10, n_select=100, n_test=200, n_curve=200)
    L = cfg.train_length
    train = study.make_task(cfg, fmt, (1, L), "train")
    seen = set()
    for step in range(300):  # 9,600 training inputs, as a run of 300 steps x batch 32 draws them
        seen |= _bits(train, train.generate(32, seed=2**62 + step))
    held = {}
    for (split, which), samples in study.eval_sets(cfg, fmt).items():
        held[split, which] = _bits(train, samples)
    held["curve"] = _bits(train, study.curve_sets(cfg, fmt)[study.FIT_SET])
    assert len(seen) > 1_000  # training still covers most inputs...
    for name in (("select", "id"), ("test", "1"), "curve"):
        assert held[name] and not held[name] & seen, name  # ...but none of the held-out ID inputs
    assert all(len(b) == 2 * L for b in held["test", "2"])  # longer inputs are outside training anyway
    # 200 test inputs asked for at 1x, but the test third of the held-out 10-bit inputs is smaller: it is taken whole
    third = [b for b in map("".join, product("01", repeat=L)) if part_of(b, cfg.held_out_share, 3) == 2]
    assert sorted(held["test", "1"]) == sorted(third) and len(study.eval_sets(cfg, fmt)["test", "1"]) == len(third)
    assert 50 < len(third) < cfg.n_test


def test_with_replacement_is_the_old_sampling_and_keys_record_the_split_and_the_draw():
    old = study.ParityStudyConfig.quick(held_out_share=0.0, set_draw="with_replacement")
    assert [s.text for s in study.eval_sets(old, "plain")["select", "id"]] == \
        [s.text for s in study.Parity(length=old.train_length, format="plain").generate(old.n_select, seed=10_001)]
    assert "held_out_share" not in study.run_settings(old, "plain", 1e-3, 0)
    assert "set_draw" not in study.run_settings(old, "plain", 1e-3, 0)  # the keys of rows drawn so before
    new = study.run_settings(study.ParityStudyConfig.quick(), "plain", 1e-3, 0)
    assert new["held_out_share"] == 0.5 and new["set_draw"] == "disjoint"


def _all_sets(cfg, fmt):
    key = study._bits_key(study.make_task(cfg, fmt, 1))
    named = {f"{a} {b}": v for (a, b), v in study.eval_sets(cfg, fmt).items()}
    if cfg.protocol == "curves":
        named |= {f"curve {k}": v for k, v in study.curve_sets(cfg, fmt).items()}
    return {name: [key(s) for s in samples] for name, samples in named.items()}


@settings(max_examples=25, deadline=None)
@given(L=st.integers(4, 9), share=st.sampled_from([0.0, 0.2, 0.35, 0.5, 0.7]), fmt=st.sampled_from(FORMATS),
       n=st.tuples(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40)),
       multiples=st.sampled_from([(1, 2), (1, 2, 3), (1, 3)]), select_multiple=st.sampled_from([1, 2]))
def test_held_out_sets_are_distinct_pairwise_disjoint_and_never_training_inputs(L, share, fmt, n, multiples,
                                                                               select_multiple):
    """Every set without repeats; selection, test and curve sets pairwise disjoint at every length; every set at the
    training lengths on the held-out side (training draws only the other side); each set n long unless its pool is
    smaller, and then that whole pool."""
    cfg = study.ParityStudyConfig.curves(quick=True, train_length=L, held_out_share=share, n_select=n[0],
                                         n_test=n[1], n_curve=n[2], multiples=multiples,
                                         select_multiple=select_multiple, anchors=3 * L)
    try:
        sets = _all_sets(cfg, fmt)
    except ValueError as e:  # a third of the held-out side without an input is refused, never an empty set
        assert "has no input to draw from" in str(e)
        return
    names = list(sets)
    for name, bits in sets.items():
        assert bits and len(set(bits)) == len(bits), name
        assert len(bits) <= {"select": n[0], "test": n[1], "curve": n[2]}[name.split()[0]]
        inside = [b for b in bits if len(b) <= L]
        assert not share or all(held_out(b, share) for b in inside), name  # share 0: no split, training sees all
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not set(sets[a]) & set(sets[b]), (a, b)
    wanted = {"select id": (0, n[0]), "curve train": (1, n[2]), "test 1": (2, n[1])}  # the first in each third
    for name, (part, want) in wanted.items() if share else ():
        if name not in sets:
            continue
        lengths = range(1, L + 1) if name == "curve train" else [L]
        pool = {b for k in lengths for b in map("".join, product("01", repeat=k)) if part_of(b, share, 3) == part}
        assert set(sets[name]) <= pool and len(sets[name]) == min(want, len(pool)), name


def test_held_out_sets_are_the_same_in_every_process():
    """The sets depend on SHA-256 of the bits and seeded streams only: two processes with different hash seeds
    draw the same texts."""
    code = ("from aspan.applications.studies import parity as s; import hashlib; "
            "c = s.ParityStudyConfig.curves(quick=True, train_length=6, held_out_share=0.4, n_select=20, n_test=20, "
            "n_curve=20, anchors=60); t = [x.text for f in ('plain', 'mnemonic') "
            "for d in (s.eval_sets(c, f), s.curve_sets(c, f)) for v in d.values() for x in v]; "
            "print(len(t), hashlib.sha256(repr(t).encode()).hexdigest())")
    outs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join(sys.path)}
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout)
    assert len(outs) == 1 and int(outs.pop().split()[0]) > 100


def test_a_held_out_third_without_inputs_is_refused_before_training(tmp_path, monkeypatch):
    from aspan import training

    monkeypatch.setattr(training, "train_resumable", lambda *a, **k: pytest.fail("trained"))
    cfg = study.ParityStudyConfig.quick(train_length=3, held_out_share=0.2)  # no 3-bit input in the selection third
    with pytest.raises(ValueError, match=r"^the held-out select set of 3-3 bits has no input to draw from "
                                         r"\(train_length 3, held_out_share 0.2\): raise either$"):
        study.run_study(cfg, tmp_path / "run", report=False, progress=False)
    assert not (tmp_path / "run" / "rows.jsonl").exists()


# ----------------------------------------------------------------------------------------------- model formats
def test_model_formats_train_the_models_of_the_run_with_those_formats(tmp_path):
    """The formats studied together size the vocabulary and the context, and with them every model's
    initialisation: a run of one format trains other models than the same format in a run of two, unless
    `model_formats` names the two; the rows record the vocabulary and context either way."""
    def rows(out, **kw) -> dict:
        cfg = study.ParityStudyConfig.quick(seeds=1, lrs=(3e-3,), anchors=100, **kw)  # as many anchors as the CPU run
        study.run_study(cfg, out, report=False, progress=False)
        return {(r["format"], r["split"], r["which"]): r for r in study.read_rows(out / "rows.jsonl")}

    both = rows(tmp_path / "both", formats=("scratchpad", "mnemonic"))
    alone = rows(tmp_path / "alone", formats=("scratchpad",))
    sized = rows(tmp_path / "sized", formats=("scratchpad",), model_formats=("scratchpad", "mnemonic"))
    mine = [k for k in both if k[0] == "scratchpad"]
    assert mine and set(sized) == set(alone) == set(mine)

    def scores(table):
        return [(table[k]["exact"], table[k]["partial"], table[k]["key"]) for k in mine]

    assert scores(sized) == scores(both) and [s[2] for s in scores(alone)] == [s[2] for s in scores(both)]

    def weights(out):  # a weight whose shape depends on neither the vocabulary nor the context
        from aspan import models

        return models.load(out / "models" / study.run_id("scratchpad", 3e-3, 0), device="cpu").model.blocks[0].attn.W_Q

    assert torch.equal(weights(tmp_path / "sized"), weights(tmp_path / "both"))
    assert not torch.equal(weights(tmp_path / "alone"), weights(tmp_path / "both"))  # same key, another model
    assert {(r["n_ctx"], r["vocab"]) for r in sized.values()} == {(r["n_ctx"], r["vocab"]) for r in both.values()}
    assert alone[mine[0]]["vocab"] < both[mine[0]]["vocab"]
    with pytest.raises(ValueError, match="model_formats"):
        study.ParityStudyConfig.quick(formats=("scratchpad", "plain"), model_formats=("scratchpad",)).check()
