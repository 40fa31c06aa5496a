"""`aspan rank --by effect`: the causal ranking equals direct profiling; both rankings side by side."""
import json

import pandas as pd
import pytest

from aspan import models, tasks
from aspan.cli import main
from aspan.experiments import profiling as P


def test_rank_by_effect_matches_profiling(ckpt, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["rank", str(ckpt), "--task", "reversal", "-n", "10", "--seed", "4", "--by", "effect",
               "--method", "patch", "--delta", "1", "--profile-param", "length=11-13", "--candidates", "5",
               "--greedy", "2", "--top", "2",
               "--out", str(out), "--device", "cpu", "--quiet"])
    assert rc == 0
    model, tok, _ = models.load(ckpt, device="cpu")
    samples = tasks.preset("reversal", "ood", length=(11, 13)).generate(10, seed=5)  # profiling set: seed + 1
    batches = P.selection_batches(model, tok, samples)
    edit = P.Edit("patch", delta=1)
    prof = pd.read_csv(out / "profile.csv")
    profiled = prof[prof.effect.notna()]
    assert len(profiled) == 5
    want = P.exact_effects(model, batches, edit, list(zip(profiled.layer, profiled["head"])))
    for r in profiled.itertuples():
        assert r.effect == pytest.approx(want[(r.layer, r.head)], abs=1e-5)
    est = P.attribution(model, batches, edit)
    for r in prof.itertuples():
        assert r.estimate == pytest.approx(float(est[r.layer, r.head]), abs=1e-5)
    summary = json.loads((out / "summary.json").read_text())
    best = profiled.sort_values("effect", ascending=False)
    assert summary["selected_heads"] == [[int(l), int(h)] for l, h in zip(best.layer[:2], best["head"][:2])]
    assert summary["by"] == "effect" and summary["edit"] == "patch at ref+1"
    assert len(summary["greedy_heads"]) <= 2
    compared = pd.read_csv(out / "rankings_compared.csv")
    share = pd.read_csv(out / "ranking.csv")
    merged = compared.merge(share, on=["layer", "head"])
    assert (merged.paper_rank == merged["rank"]).all() and (merged.share == merged["score_row_d1"]).all()
    assert "rankings compared" in summary["tables"]
    assert (out / "figures" / "ranking_effect.json").exists()
    assert "Spearman" in capsys.readouterr().out


@pytest.mark.parametrize("argv, msg", [
    (["--by", "effect", "--candidates", "0"], "--candidates"),
    (["--by", "effect", "--method", "steer", "--strength", "2"], "alpha"),
    (["--by", "effect", "--greedy", "0"], "--greedy"),
    (["--by", "effect", "--profile-param", "colour=1"], "colour"),
    (["--by", "effect", "--candidates", "99", "--profile-param", "length=11-12"], "candidates=99"),
])
def test_rank_by_effect_bad_input(ckpt, tmp_path, capsys, argv, msg):
    out = tmp_path / "r"
    assert main(["rank", str(ckpt), "--task", "reversal", *argv, "--out", str(out), "--device", "cpu"]) == 2
    assert msg in capsys.readouterr().err
    assert not out.exists()
