"""`aspan.applications.rank.rank_heads`: the ranking a notebook asks for is the one `aspan rank` writes."""
import json

import pandas as pd
import pytest

from aspan.applications.rank import RankConfig, rank_heads
from aspan.cli import main
from aspan.experiments.profiling import Edit


def test_a_notebook_ranks_the_heads_the_command_ranks(ckpt, tmp_path, capsys):
    summary = rank_heads(RankConfig(str(ckpt), "reversal", samples=6, seed=2, deltas=[0, 1], top=2, device="cpu",
                                    out=str(tmp_path / "api"), progress=False))
    assert len(summary["selected_heads"]) == 2
    assert main(["rank", str(ckpt), "--task", "reversal", "-n", "6", "--seed", "2", "--deltas", "0,1", "--top", "2",
                 "--device", "cpu", "--out", str(tmp_path / "cli"), "--quiet"]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "api" / "ranking.csv"),
                                  pd.read_csv(tmp_path / "cli" / "ranking.csv"))
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["selected_heads"] == summary["selected_heads"]
    assert (tmp_path / "api" / "offsets.csv").exists()  # two offsets scanned


def test_a_causal_ranking_from_a_notebook_checks_before_loading(ckpt, tmp_path):
    summary = rank_heads(RankConfig(str(ckpt), "reversal", samples=4, by="effect", top=1, device="cpu",
                                    edit=Edit("reinforce", delta=1, strength=2.0), out=str(tmp_path / "r"),
                                    profile_params={"length": [11, 12]}, progress=False))
    assert summary["edit"] == Edit("reinforce", delta=1, strength=2.0).label and len(summary["selected_heads"]) == 1
    with pytest.raises(ValueError, match="--fraction"):
        rank_heads(RankConfig("no-such-model", "reversal", fraction=1.5, out=str(tmp_path / "bad")))
    assert not (tmp_path / "bad").exists()
