"""`aspan study qk --quick`: a complete table (every condition and replay, every bucket, seeds, trainable counts),
the learning rate chosen on the selection set, figures and report, exact resumption, bad input before any work."""
import json
import shutil

import pandas as pd
import pytest

from aspan import cli, models
from aspan.applications.studies.qk import QKStudyConfig, conditions
from aspan.param_groups import trainable_count


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("qk") / "run"
    assert cli.main(["study", "qk", "--quick", "--out", str(out), "--no-progress"]) == 0
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
    assert cli.main(["study", "qk", "--quick", "--out", str(out), "--no-progress"]) == 0
    again = {r["key"]: r for r in map(json.loads, (out / "runs.jsonl").read_text().splitlines())}
    first = {r["key"]: r for r in map(json.loads, lines)}
    assert again.keys() == first.keys()
    for key, r in first.items():  # deterministic: recomputed rows equal the original ones
        assert {k: v for k, v in again[key].items() if not k.endswith("_s")} == \
               {k: v for k, v in r.items() if not k.endswith("_s")}


@pytest.mark.parametrize("extra, message", [(["--replays", "1.5"], "replay"), (["--columns", "99"], "out of range"),
                                            (["--seeds", "a"], "integers"), (["--steps", "0"], "steps")])
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
