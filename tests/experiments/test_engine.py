"""The experiment engine: the selection rule on synthetic rows, rows against brute force, resume and shards, the
held-out sets apart from the sets they report beside."""
import random
from functools import lru_cache
from itertools import islice
from unittest import mock

import pandas as pd
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import hooks
from aspan import tasks
from aspan.evaluation import evaluate
from aspan.experiments import engine
from aspan.experiments.engine import Data, Engine, Job, point, run_grid, select
from aspan.io import read_rows, settings_key

DATA = Data("reversal", ood_params={"length": [11, 12]}, n=4)


def _row(i, gain_exact, gain_partial, id_cost, set_name="selection"):
    return {"key": str(i), "set": set_name, "gain_exact": gain_exact, "gain_partial": gain_partial, "id_cost": id_cost}


def test_rule_respects_the_budget_and_prefers_exact_then_partial():
    rows = [_row(0, 0.40, 0.30, 0.35),  # best OOD gain, but it costs 35 pp of ID
            _row(1, 0.10, 0.05, 0.0),
            _row(2, 0.10, 0.20, 0.01),  # ties on exact gain, better per-token gain, cost exactly at the budget
            _row(3, 0.20, 0.10, 0.02),
            _row(4, 0.90, 0.90, -0.1, "held_out")]  # a held-out row is never chosen from
    sel = select(rows, id_budget=0.01)
    assert sel.row["key"] == "2" and sel.candidates == 2
    assert "1 pp" in sel.rule and "selection set" in sel.rule and "held-out" in sel.rule
    assert select(rows, id_budget=None).row["key"] == "0"
    assert select(rows, id_budget=0.05).row["key"] == "3"
    assert select(rows, id_budget=0.01, metric="partial").row["key"] == "2"


def test_rule_chooses_nothing_when_no_edit_helps():
    rows = [_row(0, 0.0, 0.0, 0.0), _row(1, -0.1, 0.2, 0.0), _row(2, 0.5, 0.5, 0.2)]
    assert select(rows, id_budget=0.01).row is None
    assert select(pd.DataFrame(rows), id_budget=None).row["key"] == "2"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.integers(-3, 3), st.integers(-3, 3)), max_size=12),
       st.integers(0, 3))
def test_rule_equals_brute_force(triples, budget):
    rows = [_row(i, g / 10, p / 10, c / 100) for i, (g, p, c) in enumerate(triples)]
    sel = select(rows, id_budget=budget / 100)
    ok = [r for r in rows if r["id_cost"] <= budget / 100 + 1e-12 and (r["gain_exact"], r["gain_partial"]) > (0, 0)]
    if not ok:
        assert sel.row is None
        return
    best = max(r["gain_exact"] for r in ok)
    ok = [r for r in ok if r["gain_exact"] == best]
    best = max(r["gain_partial"] for r in ok)
    ok = [r for r in ok if r["gain_partial"] == best]
    best = min(r["id_cost"] for r in ok)
    assert sel.row is [r for r in ok if r["id_cost"] == best][0]


def test_sets_are_disjoint_draws_and_reproducible():
    sel, held, ids = (DATA.samples(name, 0) for name in ("selection", "held_out", "id"))
    assert sel != held and {s.text for s in sel}.isdisjoint({s.text for s in held})
    assert DATA.samples("selection", 0) == sel and all(len(s.target) <= 10 for s in ids)
    with pytest.raises(ValueError, match="unknown evaluation set"):
        DATA.samples("test", 0)
    small = Data("reversal", id_params={"length": [1, 1]}, n=30)  # 62 one-character strings: draws collide
    ids, report = small.samples("id", 0), small.samples("id_report", 0)
    assert len(report) == 30 and {x.text for x in ids}.isdisjoint({x.text for x in report})
    tiny = Data("reversal", id_params={"length": [1, 1], "charset": "ab"}, n=40)  # both strings are in the ID set
    with pytest.raises(ValueError, match="too few distinct samples"):
        tiny.samples("id_report", 0)


@lru_cache(maxsize=None)
def _every_text(charset: str, length: tuple[int, int]) -> frozenset[str]:
    """Every text of a small reversal preset (20,000 draws: each of its at most 39 texts has p >= 1/81)."""
    task = tasks.preset("reversal", "id", length=length, charset=charset)
    return frozenset(x.text for x in islice(task.stream(99), 20_000))


LENGTHS = st.tuples(st.integers(1, 3), st.integers(0, 2)).map(lambda t: (t[0], min(t[0] + t[1], 3)))


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["ab", "abc"]), LENGTHS, LENGTHS, st.integers(1, 30), st.integers(0, 10**6))
def test_held_out_sets_are_apart_from_the_sets_they_skip_or_refused(charset, ood_len, id_len, n, seed):
    """Small presets, where seed-only draws collide: each held-out set (held_out, id_report) has its n samples and
    shares no text with the set it skips (selection, id), and is the seed-only draw wherever that shared none; a
    one-line error naming both sets exactly when the set it skips holds every text of the preset."""
    data = Data("reversal", ood_params={"length": list(ood_len), "charset": charset},
                id_params={"length": list(id_len), "charset": charset}, n=n)
    for skipped, name, length, offset in (("selection", "held_out", ood_len, 3), ("id", "id_report", id_len, 4)):
        seen = {x.text for x in data.samples(skipped, seed)}
        task = tasks.preset("reversal", "id", length=length, charset=charset)
        if seen >= _every_text(charset, length):
            with mock.patch("aspan.tasks.split.MAX_REDRAWS", 2_000), pytest.raises(ValueError) as err:
                data.samples(name, seed)
            message = str(err.value)
            assert "\n" not in message and f"({name})" in message and f"({skipped})" in message, message
            event(f"{name}: refused")
            continue
        with mock.patch("aspan.tasks.split.MAX_REDRAWS", 2_000):  # a left text has p >= 1/81: never 2,000 misses
            got = data.samples(name, seed)
        assert len(got) == n and seen.isdisjoint(x.text for x in got)
        old = list(islice(task.stream(seed + offset), n))  # the seed-only draw, computed here
        if seen.isdisjoint(x.text for x in old):
            assert got == old
        event(f"{name}: " + ("seed-only draw" if got == old else "overlapping draws skipped"))


@pytest.mark.parametrize("seed", [0, 1, 5, 1_000])
def test_held_out_set_of_large_presets_is_the_seed_only_draw(seed):
    """Where the selection and held-out draws of a preset never share a text (the reversal OOD preset: strings of
    11-20 of 62 symbols), the held-out set is the first n of its seed's stream, so points and rows keep their
    samples."""
    data = Data("reversal", n=300)
    ood = tasks.preset("reversal", "ood")
    assert data.samples("selection", seed) == list(islice(ood.stream(seed + 2), 300))
    assert data.samples("held_out", seed) == list(islice(ood.stream(seed + 3), 300))


def test_row_equals_brute_force_evaluation(tiny_model, tok):
    eng = Engine(tiny_model, tok, DATA, batch_size=3)
    p = point(DATA, "m", "list:1.0,1.2", 2.0, delta=1)
    row = eng.row(p)
    heads = [(1, 0), (1, 2)]

    def edit(b):
        return hooks.reinforce(heads, b.ref_mask, 2.0, delta=1, model=tiny_model)

    for name, prefix in (("selection", ""), ("id", "id_")):
        samples = DATA.samples(name, 0)
        base = evaluate(tiny_model, tok, samples, attn=False).summary()
        ed = evaluate(tiny_model, tok, samples, fwd_hooks=edit, attn=False).summary()
        assert row[f"{prefix}exact"] == ed["exact"] and row[f"{prefix}partial"] == pytest.approx(ed["partial"])
        b = "baseline_" if not prefix else "id_baseline_"
        assert row[f"{b}exact"] == base["exact"] and row[f"{b}partial"] == pytest.approx(base["partial"])
    assert row["id_cost"] == pytest.approx(row["id_baseline_exact"] - row["id_exact"])
    assert row["key"] == settings_key(p) and row["heads_list"] == [[1, 0], [1, 2]]
    held = eng.row(engine.on_set(row, "held_out"))
    assert held["set"] == "held_out" and held["key"] != row["key"]
    held_base = evaluate(tiny_model, tok, DATA.samples("held_out", 0), attn=False).summary()
    assert held["baseline_exact"] == held_base["exact"]
    # the held-out row's ID cost comes from ID samples the selection row (and so the ID budget) never saw
    report_ids = DATA.samples("id_report", 0)
    assert row["id_set"] == "id" and held["id_set"] == "id_report"
    assert {x.text for x in report_ids}.isdisjoint({x.text for x in DATA.samples("id", 0)})
    assert len(report_ids) == DATA.n
    id_base = evaluate(tiny_model, tok, report_ids, attn=False).summary()
    id_ed = evaluate(tiny_model, tok, report_ids, fwd_hooks=edit, attn=False).summary()
    assert held["id_baseline_exact"] == id_base["exact"] and held["id_exact"] == id_ed["exact"]
    assert held["id_cost"] == pytest.approx(id_base["exact"] - id_ed["exact"])


def test_sets_without_attnscores_are_counted_without_records(tiny_model, tok, monkeypatch):
    """Teacher-forced sets scored without AttnScores go through `aspan.accuracy` (no per-token records): the row's
    numbers and per-length tables are those of `evaluate`, edited and not."""
    from aspan.evaluation import summarize

    eng = Engine(tiny_model, tok, DATA, batch_size=3, attn=False)
    from aspan import evaluation

    def records(*a, **k):
        raise AssertionError("per-token records built")

    monkeypatch.setattr(evaluation, "evaluate_stream", records)
    row = eng.row(point(DATA, "m", "list:1.0,1.2", 2.0, delta=1))
    heads = [(1, 0), (1, 2)]

    def edit(b):
        return hooks.reinforce(heads, b.ref_mask, 2.0, delta=1, model=tiny_model)

    samples = DATA.samples("selection", 0)
    for prefix, fwd in (("", edit), ("baseline_", ())):
        ref = evaluate(tiny_model, tok, samples, fwd_hooks=fwd, attn=False)
        assert (row[f"{prefix}exact"], row[f"{prefix}partial"], row["n"]) == tuple(ref.summary()[k] for k in
                                                                                  ("exact", "partial", "n"))
        want = summarize(ref, by="length")[["length", "n", "exact", "partial"]].to_dict("records")
        assert row[f"{prefix}by_length"] == want
    ids = DATA.samples("id", 0)
    assert row["id_exact"] == evaluate(tiny_model, tok, ids, fwd_hooks=edit, attn=False).summary()["exact"]


def test_top_heads_come_from_the_ranking(tiny_model, tok):
    from aspan import tasks
    from aspan.experiments.ranking import offset_table, select_heads

    eng = Engine(tiny_model, tok, DATA, batch_size=4)
    rank = engine.Ranking(by="score_row", samples=5, seed=7)
    p = point(DATA, "m", "top:3", 1.0, delta=2, rank=rank)
    samples = tasks.preset("reversal", "id").generate(5, seed=7)
    table = offset_table(tiny_model, tok, samples, [2], convention="raw")  # the engine ranks in the raw convention
    assert eng.heads(p) == select_heads(table, top=3, by="score_row")


def test_ranking_convention_reaches_the_offset_scan_and_keys(tiny_model, tok):
    from aspan import tasks
    from aspan.experiments.ranking import offset_table

    eng = Engine(tiny_model, tok, DATA, batch_size=4)
    raw, sample = engine.Ranking(samples=5, seed=7), engine.Ranking(samples=5, seed=7, convention="sample")
    assert "convention" not in raw.settings(0)  # raw points keep the keys they had before the option existed
    assert point(DATA, "m", "top:2", 1.0, rank=raw) != point(DATA, "m", "top:2", 1.0, rank=sample)
    samples = tasks.preset("reversal", "id").generate(5, seed=7)
    for rank, convention in ((raw, "raw"), (sample, "sample")):
        got = eng.offsets(rank.settings(0)).sort_values(["layer", "head"]).reset_index(drop=True)
        want = offset_table(tiny_model, tok, samples, [0], convention=convention)
        want = want.sort_values(["layer", "head"]).reset_index(drop=True)
        assert (got.convention == convention).all()
        pd.testing.assert_series_equal(got.score_sum, want.score_sum)
    a, b = (eng.offsets(r.settings(0)).sort_values(["layer", "head"]) for r in (raw, sample))
    assert not (a.score_row.values == b.score_row.values).all()  # the BOS column leaves the denominator
    with pytest.raises(ValueError, match="ranking convention"):
        engine.Ranking(convention="row")


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown intervention method"):
        point(DATA, "m", "list:0.1", 1.0, method="noop-test")


class Killed(Exception):
    pass


def test_run_grid_resumes_and_shards_partition(tiny_model, tok, tmp_path):
    points = [point(DATA, "m", "list:1.1", c) for c in (0.5, 1.0, 3.0)]
    built = []

    def build():
        built.append(1)
        return Engine(tiny_model, tok, DATA)

    def kill(row):
        raise Killed

    path = tmp_path / "rows.jsonl"
    with pytest.raises(Killed):
        run_grid(points, Job(path, progress=False, on_row=kill), build)
    assert len(read_rows(path)) == 1
    full = run_grid(points, Job(path, progress=False), build)
    assert [r["strength"] for r in full] == [0.5, 1.0, 3.0] and len(path.read_text().splitlines()) == 3
    n_built = len(built)
    assert run_grid(points, Job(path, progress=False), build) == full and len(built) == n_built  # no model load
    parts = [run_grid(points, Job(tmp_path / f"s{i}.jsonl", (i, 2), progress=False), build) for i in range(2)]
    union = {r["key"]: r for part in parts for r in part}
    assert sorted(union) == sorted(r["key"] for r in full)
    for r in full:
        assert union[r["key"]]["exact"] == r["exact"] and union[r["key"]]["id_cost"] == r["id_cost"]
    random.shuffle(points)
    assert {r["key"] for r in run_grid(points, Job(path, progress=False), build)} == set(union)
