"""Length buckets: parsing, each bucket's own samples inside its range, per-bucket tables equal to evaluating each
bucket alone, and `aspan eval --buckets` / `aspan train --buckets` outputs."""
import json
from unittest import mock

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan import cli, models, tasks
from aspan.buckets import bucket_name, bucket_of, bucket_sets, bucket_table, bucket_task, parse_buckets
from aspan.evaluation import evaluate


@st.composite
def disjoint_ranges(draw):
    cuts = sorted(draw(st.sets(st.integers(1, 60), min_size=2, max_size=8)))
    return [(lo, hi - 1) for lo, hi in zip(cuts, cuts[1:])]


@settings(max_examples=100, deadline=None)
@given(disjoint_ranges(), st.lists(st.integers(1, 70), max_size=30))
def test_parse_and_partition(ranges, lengths):
    text = ",".join(f"{lo}-{hi}" for lo, hi in ranges)
    assert parse_buckets(text) == ranges
    for n in lengths:  # every length falls in at most one bucket, the one whose range holds it
        holders = [b for b in ranges if b[0] <= n <= b[1]]
        assert len(holders) <= 1 and bucket_of(n, ranges) == (holders[0] if holders else None)


@pytest.mark.parametrize("text, message", [("1-10,5-12", "overlaps"), ("3-1", "lo <= hi"), ("0-4", "lo <= hi"),
                                           ("a-b", "expected ranges"), ("", "expected ranges")])
def test_bad_buckets(text, message):
    with pytest.raises(ValueError, match=message):
        parse_buckets(text)


def test_bucket_sets_hold_their_own_lengths():
    buckets = parse_buckets("1-3,4-6,7")
    for task in (tasks.preset("reversal", "ood"), tasks.preset("parity", "id")):
        sets = bucket_sets(task, buckets, n=40, seed=3)
        assert list(sets) == ["length 1-3", "length 4-6", "length 7-7"]
        for b in buckets:
            samples = sets[bucket_name(b)]
            assert len(samples) == 40 and all(b[0] <= len(s.target) <= b[1] for s in samples)
        assert bucket_sets(task, buckets, n=40, seed=3) == sets  # same seed, same samples
    assert bucket_task(tasks.preset("reversal", "ood", charset="ab"), (2, 2)).params()["charset"] == "ab"
    with pytest.raises(ValueError, match="length"):
        bucket_sets(tasks.preset("addition", "id"), buckets, n=2, seed=0)


def test_bucket_sets_skip_the_texts_they_exclude():
    task = tasks.preset("reversal", "id", charset="ab")
    taken = {x.text for v in bucket_sets(task, [(1, 2)], n=3, seed=0).values() for x in v}  # of 6 strings
    apart = bucket_sets(task, [(1, 2), (3, 3)], 10, 1, taken, ("curve set", "the report sets"))
    assert all(len(v) == 10 and taken.isdisjoint(x.text for x in v) for v in apart.values())
    alone = bucket_sets(task, [(1, 2), (3, 3)], n=10, seed=1)
    assert apart["length 3-3"] == alone["length 3-3"]  # no text of those lengths excluded: the seed-only draw
    assert apart["length 1-2"] != alone["length 1-2"]  # 10 draws of 6 strings: some were excluded
    with mock.patch("aspan.tasks.split.MAX_REDRAWS", 500), pytest.raises(
            ValueError, match="^too few distinct samples for the curve set of length 1-1 apart from the 2 texts of "
                              "the report sets .*: lower the samples per set$"):
        bucket_sets(task, [(1, 1)], 3, 0, {"a=a", "b=b"}, ("curve set", "the report sets"))


def test_bucket_table_equals_each_bucket_alone(trained, tok):
    model, task = trained
    sets = bucket_sets(task, [(1, 1), (2, 3)], n=12, seed=5)
    samples = [s for v in sets.values() for s in v]
    names = [k for k, v in sets.items() for _ in v]
    table = bucket_table(evaluate(model, tok, samples, attn=False), names).set_index("bucket")
    for name, part in sets.items():
        alone = evaluate(model, tok, part, attn=False).summary()
        assert table.loc[name, "n"] == 12
        assert table.loc[name, "exact"] == pytest.approx(alone["exact"])
        assert table.loc[name, "partial"] == pytest.approx(alone["partial"])


def test_eval_command_buckets(tmp_path, tok, capsys):
    path = tmp_path / "m"
    models.save(models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=128, seed=0, device="cpu"), path, tok,
                task="reversal")
    run = tmp_path / "run"
    argv = ["eval", str(path), "--buckets", "1-5,11-12", "-n", "6", "--no-attn", "--out", str(run),
            "--threads", "1"]
    assert cli.main(argv) == 0
    assert "length 11-12" in capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    assert [(r["bucket"], r["n"]) for r in summary["tables"]["by_bucket"]] == [("length 1-5", 6), ("length 11-12", 6)]
    records = pd.read_json(run / "records.jsonl", lines=True)
    for _, r in records.iterrows():  # every record sits in the bucket of its own length
        assert bucket_of(r.length, [(1, 5), (11, 12)]) == ((1, 5) if r.bucket == "length 1-5" else (11, 12))
    assert (run / "figures" / "by_bucket.json").exists()
    assert json.loads((run / "run.json").read_text())["buckets"] == [[1, 5], [11, 12]]
