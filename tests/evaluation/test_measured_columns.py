"""No unexplained NaN: a summary, a per-sample or per-length table and `aspan eval`'s summary.json hold the AttnScore
columns that were measured (the rollout's unless `attn=False`, the heads' only with `heads`), each a number; records
keep every column (a fixed schema for JSONL), NaN where not measured."""
import json
import math

import pytest

from aspan import evaluation as ev
from aspan.cli import main

ROLLOUT = ["attn_rollout_sample", "attn_rollout_raw"]
HEADS = ["attn_heads_sample", "attn_heads_raw"]


@pytest.mark.parametrize("kw,columns", [({}, ROLLOUT), ({"heads": [(1, 0)]}, ROLLOUT + HEADS),
                                        ({"attn": False}, []), ({"attn": False, "heads": [(1, 0)]}, [])])
def test_a_summary_holds_the_scores_measured_and_no_other(random_model, tok, mixed_samples, kw, columns):
    res = ev.evaluate(random_model, tok, mixed_samples[:6], **kw)
    summary = res.summary()
    assert [c for c in ev.SCORE_COLUMNS if c in summary] == columns == ev.measured_columns(ev.EvalOptions(**kw))
    assert all(math.isfinite(summary[c]) for c in columns)
    assert [c for c in ev.SCORE_COLUMNS if c in res.samples] == columns
    table = ev.summarize(res)
    assert [c for c in ev.SCORE_COLUMNS if c in table] == columns and table[columns].notna().all().all()
    assert list(res.records.columns) == ev.RECORD_COLUMNS  # records keep every column
    assert res.records[[c for c in ev.SCORE_COLUMNS if c not in columns]].isna().all().all()


def test_a_table_of_records_leaves_out_the_scores_they_lack(random_model, tok, mixed_samples):
    """`summarize` of a records frame (read back from JSONL, say) infers what was measured from the values."""
    records = ev.evaluate(random_model, tok, mixed_samples[:6]).records
    assert [c for c in ev.SCORE_COLUMNS if c in ev.summarize(records)] == ROLLOUT


def test_the_chunks_of_a_stream_add_up_to_the_same_columns(random_model, tok, mixed_samples):
    totals = ev.StreamTotals("teacher")
    for chunk in ev.evaluate_stream(random_model, tok, mixed_samples[:6], chunk=2, batch_size=2):
        totals.add(chunk)
    assert [c for c in ev.SCORE_COLUMNS if c in totals.result().summary()] == ROLLOUT


def test_eval_writes_no_head_scores_without_heads(ckpt, tmp_path, capsys):
    argv = ["eval", str(ckpt), "--split", "id", "-n", "4", "--threads", "1", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "plain")]) == 0
    assert "attn_heads" not in capsys.readouterr().out  # the per-length table has no head columns
    assert main([*argv, "--heads", "1.0", "--out", str(tmp_path / "heads")]) == 0
    assert "attn_heads_sample" in capsys.readouterr().out
    plain, heads = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("plain", "heads"))
    assert [c for c in ev.SCORE_COLUMNS if c in plain] == ROLLOUT
    assert [c for c in ev.SCORE_COLUMNS if c in heads] == ROLLOUT + HEADS
    for row in plain["tables"]["by_length"]:
        assert not set(HEADS) & set(row) and all(row[c] is not None for c in ROLLOUT)
