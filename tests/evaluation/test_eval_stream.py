"""Samples are generated and evaluated a chunk at a time (`evaluation.evaluate_stream`) in `aspan eval` and the
experiment engine: memory does not grow with the sample count, and the streamed results are those of one `evaluate`
call on the same samples (same seed, same order)."""
import itertools
import json

import pandas as pd
import pytest

from aspan import models, tasks
from aspan.buckets import bucket_sets
from aspan.checks import RESULT_BYTES
from aspan.evaluation import StreamTotals, correct_vs_error_table, evaluate, evaluate_stream, write_records
from aspan.experiments.engine import Data, Engine, point
from tests.cli import aspan, aspan_peak

OOD = {"length": (11, 14)}


@pytest.fixture(scope="module")
def loaded():
    return models.load("reversal", device="cpu")


def test_streamed_chunks_equal_one_evaluate_exactly(loaded):
    model, tok, _ = loaded
    task = tasks.preset("reversal", "ood", **OOD)
    whole = evaluate(model, tok, task.generate(40, seed=3), batch_size=8, heads=[(1, 0)])
    drawn = []
    stream = (drawn.append(s) or s for s in itertools.islice(task.stream(3), 40))
    totals = StreamTotals("teacher")
    sizes = []
    for chunk in evaluate_stream(model, tok, stream, chunk=12, batch_size=8, heads=[(1, 0)]):
        sizes.append((len(chunk.samples), len(drawn)))  # drawn as they are evaluated, 16 at a time (whole batches)
        totals.add(chunk)
    assert sizes == [(16, 16), (16, 32), (8, 40)]
    streamed = pd.concat([c.records for c in evaluate_stream(model, tok, task.generate(40, seed=3), chunk=12,
                                                             batch_size=8, heads=[(1, 0)])], ignore_index=True)
    pd.testing.assert_frame_equal(streamed, whole.records, check_exact=True)
    pd.testing.assert_frame_equal(totals.result().samples, whole.samples, check_exact=True)
    kept = totals.result().samples.memory_usage(deep=True, index=True).sum()
    assert kept < 40 * RESULT_BYTES / 2, kept  # what the memory check counts per sample (twice while joined)
    assert totals.result().summary() == pytest.approx(whole.summary(), rel=0, abs=0, nan_ok=True)
    table, want = totals.correct_vs_error_table(), correct_vs_error_table(whole)
    assert list(table.score) == list(want.score) == ["attn_rollout_sample", "attn_rollout_raw", "attn_heads_sample",
                                                     "attn_heads_raw"]
    numbers = ["n_correct", "n_error", "mean_correct", "sem_correct", "mean_error", "sem_error", "t", "p"]
    pd.testing.assert_frame_equal(table[numbers], want[numbers], rtol=1e-12)  # moments merged across chunks
    generated = evaluate(model, tok, task.generate(24, seed=4), mode="generate", batch_size=8)
    chunks = evaluate_stream(model, tok, itertools.islice(task.stream(4), 24), mode="generate", batch_size=8)
    pd.testing.assert_frame_equal(pd.concat([c.records for c in chunks], ignore_index=True), generated.records,
                                  check_exact=True)


def test_evaluate_checks_each_sample_once_and_a_stream_checks_each_chunk(loaded, monkeypatch):
    """`evaluate` checks all its samples before the first forward and does not check its chunks again;
    `evaluate_stream`, which cannot see samples not drawn yet, checks each chunk."""
    import aspan.evaluation as evaluation

    model, tok, _ = loaded
    checked: list[int] = []
    real = evaluation._check

    def counted(m, t, samples, *rest):
        checked.append(len(samples))
        return real(m, t, samples, *rest)

    monkeypatch.setattr(evaluation, "_check", counted)
    monkeypatch.setattr(evaluation, "CHUNK", 16)
    samples = tasks.preset("reversal", "ood", **OOD).generate(40, seed=3)
    evaluate(model, tok, samples, batch_size=8, attn=False)
    assert checked == [40]
    checked.clear()
    list(evaluate_stream(model, tok, iter(samples), chunk=16, batch_size=8, attn=False))
    assert checked == [16, 16, 8]


def test_the_engine_streams_its_sets_with_the_results_of_whole_ones(loaded):
    model, tok, _ = loaded
    data = Data("reversal", ood_params=OOD, n=20)
    p = point(data, "reversal", "list:1.0", 2.0, delta=0)
    engine = Engine(model, tok, data, batch_size=8)
    row = engine.row(p)
    assert not engine._samples  # no set was held as a list
    whole = evaluate(model, tok, data.samples("selection", 0), fwd_hooks=engine.edit(p), batch_size=8,
                     heads=[(1, 0)])
    assert (row["exact"], row["partial"], row["attn_heads_sample"]) == \
        (whole.summary()["exact"], whole.summary()["partial"], whole.summary()["attn_heads_sample"])
    base = evaluate(model, tok, data.samples("id", 0), batch_size=8, attn=False).summary()
    assert (row["id_baseline_exact"], row["id_baseline_partial"]) == (base["exact"], base["partial"])


def test_eval_command_writes_the_records_of_one_evaluate_call(loaded, tmp_path):
    model, tok, _ = loaded
    task = tasks.preset("reversal", "ood", **OOD)
    r = aspan("eval", "reversal", "--param", "length=11-14", "-n", "10", "--seed", "3", "--batch-size", "4",
              "--heads", "1.0", "--buckets", "11-12,13-14", "-o", str(tmp_path / "streamed.jsonl"),
              "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    sets = bucket_sets(task, [(11, 12), (13, 14)], 10, 3)
    whole = evaluate(model, tok, [s for v in sets.values() for s in v], batch_size=4, heads=[(1, 0)])
    whole.records["bucket"] = [list(sets)[i // 10] for i in whole.records.sample_id]
    write_records(whole, tmp_path / "whole.jsonl")
    assert (tmp_path / "streamed.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes() == \
        (tmp_path / "run" / "records.jsonl").read_bytes()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["exact"], summary["partial"], summary["n"]) == \
        (whole.summary()["exact"], whole.summary()["partial"], 20)


def test_eval_command_memory_does_not_grow_with_the_sample_count(tmp_path):
    """20,000 samples: one list of them and their per-token records took ~0.1 GB more than 2,000 (about 3 records
    each, ~5 kB a sample); streamed, the per-sample rows kept take ~6 MB."""
    args = ["eval", "reversal", "--split", "id", "--param", "length=1-2", "--no-attn", "--batch-size", "512",
            "--threads", "1"]
    peaks = {}
    for n in (2000, 20000):
        code, err, peaks[n] = aspan_peak(*args, "-n", str(n), "-o", str(tmp_path / f"{n}.jsonl"), cwd=tmp_path)
        assert code == 0, err[-2000:]
    assert sum(1 for _ in open(tmp_path / "20000.jsonl")) > 3 * 20000 / 2
    assert peaks[20000] - peaks[2000] < 45 * 2**20, peaks
