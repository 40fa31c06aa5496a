"""`aspan rank` writes CSV/JSONL that match hooks.head_scores, and a heatmap figure."""
import json

import pandas as pd
import pytest
import torch

import hooks
from aspan import models, tasks
from aspan.batching import make_batch
from aspan.cli import main


@pytest.mark.parametrize("convention", [None, "raw"])
def test_rank_cli_matches_head_scores(ckpt, tmp_path, capsys, convention):
    out = tmp_path / "run"
    flag = [] if convention is None else ["--convention", convention]
    rc = main(["rank", str(ckpt), "--task", "reversal", "-n", "12", "--seed", "5", "--deltas", "0..2",
               "--top", "3", "--out", str(out), "--device", "cpu", "--quiet", *flag])
    assert rc == 0
    convention = convention or "sample"  # the default: the paper's public code
    model, tok, _ = models.load(ckpt, device="cpu")
    samples = tasks.preset("reversal", "id").generate(12, seed=5)
    b = make_batch(samples, tok)
    cols = b.sample_columns if convention == "sample" else None
    want_sum = hooks.head_scores(model, b.tokens, b.ref_mask, "sum", b.attention_mask, columns=cols).flatten().double()
    want_row = hooks.head_scores(model, b.tokens, b.ref_mask, "row", b.attention_mask, columns=cols).flatten().double()
    for table in (pd.read_csv(out / "ranking.csv"), pd.read_json(out / "ranking.jsonl", lines=True)):
        t = table.sort_values(["layer", "head"])
        assert torch.allclose(torch.tensor(t.score_sum.values), want_sum, rtol=1e-6)
        assert torch.allclose(torch.tensor(t.score_row.values), want_row, rtol=1e-6)
        assert set(t.convention) == {convention}
    assert set(pd.read_csv(out / "offsets.csv").convention) == {convention}
    assert json.loads((out / "run.json").read_text())["convention"] == convention
    summary = json.loads((out / "summary.json").read_text())
    ranked = pd.read_csv(out / "ranking.csv")
    assert summary["selected_heads"] == [[int(l), int(h)] for l, h in zip(ranked["layer"][:3], ranked["head"][:3])]
    fig = json.loads((out / "figures" / "ranking_sum.json").read_text())
    assert fig["data"][0]["type"] == "heatmap"
    assert f"convention {convention}" in fig["layout"]["title"]["text"]
    assert (out / "figures" / "ranking_offsets.json").exists()
    assert set(pd.read_csv(out / "offsets.csv").delta) == {0, 1, 2}


@pytest.mark.parametrize("argv, msg", [
    (["--task", "nope"], "unknown task"),
    (["--task", "reversal", "--deltas", "3..1"], "--deltas"),
    (["--task", "reversal", "--fraction", "2"], "--fraction"),
    (["--task", "reversal", "--param", "colour=1"], "colour"),
    (["--task", "reversal", "--convention", "whole"], "--convention"),
])
def test_rank_cli_bad_input(ckpt, tmp_path, capsys, argv, msg):
    assert main(["rank", str(ckpt), *argv, "--out", str(tmp_path / "r")]) == 2
    assert msg in capsys.readouterr().err
