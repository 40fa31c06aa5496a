"""`aspan eval`: tables printed, records and run directory written, clear errors before loading or running."""
import json

import pandas as pd
import pytest

from aspan import cli, models
from aspan.evaluation import SCORE_COLUMNS


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tok):
    path = tmp_path_factory.mktemp("eval") / "model"
    model = models.tiny(tok, n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=128, seed=0, device="cpu")
    models.save(model, path, tok, task="reversal")
    return path


def test_eval_writes_records_and_run_dir(ckpt, tmp_path, capsys):
    rec, run = tmp_path / "r.jsonl", tmp_path / "run"
    argv = ["eval", str(ckpt), "--split", "id", "-n", "12", "--heads", "1.0,1.2", "--mode", "generate",
            "-o", str(rec), "--out", str(run), "--threads", "1"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "reversal id (generate, n=12): exact" in out and "length" in out and "attn_rollout_sample" in out
    records = pd.read_json(rec, lines=True)
    assert records.sample_id.nunique() == 12 and {*SCORE_COLUMNS, "correct"} <= set(records.columns)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["n"] == 12 and {"by_length", "correct_vs_error"} <= set(summary["tables"])
    table3 = pd.DataFrame(summary["tables"]["correct_vs_error"])  # Table 3 in both conventions, rollout and heads
    pairs = {(s, c) for s in ("rollout", "heads") for c in ("sample", "raw")}
    assert set(zip(table3.source, table3.convention)) <= pairs
    assert "sample convention" in out and set(SCORE_COLUMNS) <= set(summary)
    assert json.loads((run / "run.json").read_text())["mode"] == "generate"
    assert (run / "records.jsonl").exists()


def test_task_from_checkpoint_and_buckets(ckpt, capsys):
    assert cli.main(["eval", str(ckpt), "-n", "20", "--no-attn", "--bucket", "10", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "reversal ood (teacher, n=20)" in out and "length_bucket" in out and "AttnScore" not in out


@pytest.mark.parametrize("extra, message", [
    (["--task", "nope"], "unknown task"),
    (["--task", "reversal", "--param", "length=70-80"], "context too short"),
    (["--heads", "x"], "--heads"),
    (["--task", "reversal", "--heads", "5.0"], "layer 5 out of range"),
])
def test_errors(ckpt, capsys, extra, message):
    assert cli.main(["eval", str(ckpt), "-n", "2", *extra]) == 2
    assert message in capsys.readouterr().err


def test_missing_checkpoint(tmp_path, capsys):
    assert cli.main(["eval", str(tmp_path / "none"), "--task", "reversal"]) == 2
    assert "no model at" in capsys.readouterr().err
