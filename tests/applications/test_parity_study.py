"""`aspan study parity`: complete tables from --quick, the selection rule, resumption, bad settings refused early."""
import json
import math

import pandas as pd
import plotly.io as pio
import pytest

from aspan.applications.studies import parity as study
from aspan.cli import main
from aspan.config import load_config
from aspan.tasks.parity import FORMATS


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity") / "run"
    assert main(["study", "parity", "--quick", "--out", str(out)]) == 0
    return out


def test_quick_writes_complete_tables(quick_run):
    cfg = study.StudyConfig.quick_config()
    summary = pd.read_csv(quick_run / "summary.csv")
    assert len(summary) == len(FORMATS) * len(cfg.multiples)
    assert set(summary.format) == set(FORMATS) and set(summary.multiple) == set(cfg.multiples)
    assert (summary.bits == summary.multiple * cfg.train_length).all() and (summary.seeds == cfg.seeds).all()
    assert summary[["exact_mean", "partial_mean"]].apply(lambda c: c.between(0, 1)).all().all()
    results = pd.read_csv(quick_run / "results.csv")
    for (fmt, m), g in results.groupby(["format", "multiple"]):  # the summary is the mean over the seed rows
        row = summary[(summary.format == fmt) & (summary.multiple == m)].iloc[0]
        assert math.isclose(row.exact_mean, g.exact.mean()) and math.isclose(row.partial_mean, g.partial.mean())
        assert sorted(g.seed) == list(range(cfg.seeds)) and (g.n == cfg.n_test).all()
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

    cfg = study.StudyConfig.quick_config()
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
    cfg = load_config(study.StudyConfig, toml_path=good)
    assert (cfg.formats, cfg.steps, cfg.lrs, cfg.seeds) == (("plain", "mnemonic"), 5, (0.001,), 3)
    bad = tmp_path / "bad.toml"
    bad.write_text("[parity]\nstepz = 5\n")
    with pytest.raises(ValueError, match=f"{bad}: unknown key 'stepz'"):
        load_config(study.StudyConfig, toml_path=bad)


def test_gpu_config_is_valid():
    from pathlib import Path

    cfg = load_config(study.StudyConfig, toml_path=Path(__file__).parents[2] / "configs" / "parity_study_gpu.toml")
    assert cfg.seeds >= 3 and cfg.steps >= 800
