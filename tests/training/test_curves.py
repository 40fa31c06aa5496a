"""Learning curves and stop rules: the pure rules (on lists of values and rows), and a tiny model trained on reversal
that writes its curves at the right steps, stops where its rule fires, and resumes without repeating a row."""
import json
import math
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from aspan import models, tasks
from aspan.curves import (
    CURVES_FILE,
    Stop,
    auto_every,
    curve_cost,
    curve_sets,
    first_reaching,
    parse_curve_sets,
    plateau_index,
    steps_to_target,
    stop_point,
)
from aspan.report import CURVE_FIGURE, build_report, curve_figures
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig, train

warnings.filterwarnings("ignore", message=r"HookedTransformer(\.from_pretrained)? is deprecated",
                        category=DeprecationWarning)
TOK = CharTokenizer()
TASK = tasks.get("reversal", length=(1, 3), charset="abcd")
SETS = curve_sets({"train": TASK}, parse_curve_sets("1-1,2-3"), 16, seed=0)
FIELDS = {"kind", "step", "bucket", "n", "exact", "partial", "loss", "eval_s", "train_s", "wall_s"}


def tiny(seed=0):
    torch.set_num_threads(1)
    return models.tiny(TOK, n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=32, seed=seed, device="cpu")


def cfg(**kw):
    return TrainConfig.scratch(**{"steps": 25, "batch_size": 8, "lr": 1e-2, "warmup": 2, "log_every": 5,
                                  "curve_every": 5, **kw})


def rows_of(out) -> list[dict]:
    return [json.loads(line) for line in (out / CURVES_FILE).read_text().splitlines()]


def points(values):
    return [{"step": 10 * i, "bucket": "id", "exact": v} for i, v in enumerate(values)]


# ------------------------------------------------------------------------------------------- the rules, pure
unit = st.floats(0, 1, allow_nan=False)


@given(st.lists(st.floats(0.01, 0.2), max_size=12), unit)
def test_plateau_never_fires_while_every_evaluation_gains_a_point(gains, start):
    values = [start]
    for g in gains:
        values.append(values[-1] + g)
    assert plateau_index(values, gain=0.01, window=3) is None


@given(st.lists(unit, max_size=15), st.integers(1, 4))
def test_plateau_fires_at_the_first_window_without_a_new_best(values, window):
    i = plateau_index(values, gain=0.01, window=window)
    no_gain = [k >= window and max(values[k - window + 1 : k + 1]) < max(values[: k - window + 1]) + 0.01
               for k in range(len(values))]
    assert i == (no_gain.index(True) if any(no_gain) else None)
    if i is not None:  # decided by the rows up to it: later rows never move it
        assert plateau_index(values[: i + 1], 0.01, window) == i


@given(st.lists(unit, max_size=15), unit)
def test_target_fires_at_the_first_value_reaching_it(values, target):
    i = first_reaching(values, target)
    if i is None:
        assert all(v < target for v in values)
    else:
        assert values[i] >= target and all(v < target for v in values[:i])
    rows = points(values)
    assert steps_to_target(rows, "id", target) == (None if i is None else 10 * i)
    after = first_reaching(values[1:], target)  # the rule fires after step 0 only: a run trains at least a little
    assert stop_point(rows, Stop("target", "id", target)) == (None if after is None else (10 * (after + 1), "target"))


def test_plateau_and_none_on_rows():
    flat = points([0.0, 0.0, 0.0, 0.0, 0.0])
    assert stop_point(flat, Stop("plateau", "id")) == (30, "plateau")  # three evaluations after the first
    assert stop_point(flat, Stop("none", "id")) is None
    assert stop_point(flat, Stop("plateau", "ood")) is None  # another set has no rows
    rising = points([0.0, 0.2, 0.4, 0.403, 0.406, 0.409])  # under a point above 0.4 for three evaluations
    assert stop_point(rising, Stop("plateau", "id")) == (50, "plateau")


def test_bad_rules_and_sets_are_refused():
    for bad, words in ((Stop("target", "id"), "needs a target"), (Stop("plateau", "id", 1.5), "[0, 1]"),
                       (Stop("soon", "id"), "stop rule"), (Stop("plateau", metric="loss"), "stop metric"),
                       (Stop("plateau", window=0), "window")):
        with pytest.raises(ValueError, match=words if "[" not in words else r"\[0, 1\]"):
            bad.check()
    for text in ("", "id,id", "1-10,5-12", "x"):
        with pytest.raises(ValueError, match="--curve-buckets"):
            parse_curve_sets(text)
    assert parse_curve_sets("id, 21-30") == ["id", (21, 30)]
    with pytest.raises(ValueError, match="no 'ood' set"):
        curve_sets({"train": TASK}, ["ood"], 2, 0)


def test_auto_every_keeps_the_evaluations_within_the_budget():
    # one evaluation costs 1.5 * 1000 / 100 = 15 steps; 10 % of 1500 steps is 150: ten evaluations, every 167 steps
    assert auto_every(1000, 100, 1500, budget=0.1, eval_cost=1.5) == 167
    assert auto_every(1000, 100, 40, budget=0.1, eval_cost=1.5) == 40  # too short for more than start and end
    for total in (50, 300, 1500, 10_000):
        k = auto_every(1000, 100, total, budget=0.1, eval_cost=1.5)
        evaluations = 1 + math.ceil(total / k)
        assert k == total or evaluations * 15 <= 0.1 * total
    assert curve_cost([{"step": 0, "eval_s": 1.0, "train_s": 0.0}, {"step": 5, "eval_s": 1.0, "train_s": 4.0},
                       {"step": 5, "eval_s": 1.0, "train_s": 4.0}]) == 0.75


# ------------------------------------------------------------------------------------------- training
def test_curves_are_written_at_step_zero_every_k_steps_and_at_the_end(tmp_path):
    res = train(tiny(), TOK, TASK, cfg(steps=12), out_dir=tmp_path, progress=False, curve_data=SETS)
    rows = rows_of(tmp_path)
    assert [(r["step"], r["bucket"]) for r in rows] == [
        (s, b) for s in (0, 5, 10, 12) for b in ("length 1-1", "length 2-3")]
    assert all(set(r) == FIELDS and r["n"] == 16 and math.isfinite(r["loss"]) and r["eval_s"] > 0 for r in rows)
    assert rows[0]["train_s"] == 0 and all(r["train_s"] > 0 for r in rows[2:])
    assert [r["wall_s"] for r in rows] == sorted(r["wall_s"] for r in rows)
    assert res.stop["reason"] == "cap" and res.stop["step"] == 12 and res.stop["curve_every"] == 5
    assert res.stop["curve_cost"] == pytest.approx(curve_cost(rows))
    assert json.loads((tmp_path / "log.jsonl").read_text().splitlines()[-1]) == res.stop
    # the report draws them: one line per curve set, accuracy against step
    fig = curve_figures(tmp_path, [tmp_path / CURVES_FILE])[CURVE_FIGURE]
    assert [(t.name, list(t.x)) for t in fig.data] == [(b, [0, 5, 10, 12]) for b in ("length 1-1", "length 2-3")]
    assert f'id="figure-{CURVE_FIGURE}"' in build_report(tmp_path)


def test_report_draws_one_line_per_condition_and_set(tmp_path):
    for name, rows in (("vanilla", points([0.0, 0.5])), ("abc", points([0.2, 0.9]))):
        (tmp_path / name).mkdir()
        rows = [*rows, *({**r, "bucket": "ood"} for r in rows)]
        (tmp_path / name / CURVES_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = build_report(tmp_path)
    assert page.count(f'id="figure-{CURVE_FIGURE}"') == 1
    fig = curve_figures(tmp_path, sorted(tmp_path.glob(f"*/{CURVES_FILE}")))[CURVE_FIGURE]
    assert sorted(t.name for t in fig.data) == ["abc: id", "abc: ood", "vanilla: id", "vanilla: ood"]
    (tmp_path / "abc" / CURVES_FILE).write_text('{"step": 0}\n')
    with pytest.raises(ValueError, match=r"abc/curves.jsonl line 1: not a learning-curve row \(no 'bucket'\)"):
        build_report(tmp_path)


def test_target_stops_at_the_first_evaluation_past_it(tmp_path):
    config = cfg(steps=200, stop="target", stop_bucket="length 1-1", target=0.5)
    res = train(tiny(), TOK, TASK, config, out_dir=tmp_path, progress=False, curve_data=SETS)
    rows = rows_of(tmp_path)
    ones = [r for r in rows if r["bucket"] == "length 1-1"]
    first = next(r["step"] for r in ones if r["exact"] >= 0.5)
    assert 0 < first < 200 and res.stop["reason"] == "target" and res.stop["step"] == first
    assert res.stop["steps_to_target"] == first and rows[-1]["step"] == first  # nothing trained or scored after it
    assert models.load(tmp_path, device="cpu").meta["step"] == first


def test_plateau_stops_after_window_evaluations_without_a_gain(tmp_path):
    config = cfg(steps=100, lr=1e-7, stop="plateau", stop_bucket="length 2-3")  # learns nothing: flat curves
    res = train(tiny(), TOK, TASK, config, out_dir=tmp_path, progress=False, curve_data=SETS)
    assert res.stop["reason"] == "plateau" and res.stop["step"] == 15  # evaluations at 0, 5, 10, 15
    assert max(r["step"] for r in rows_of(tmp_path)) == 15


def test_resume_continues_the_curves_without_repeating_a_step(tmp_path):
    straight = train(tiny(), TOK, TASK, cfg(), out_dir=tmp_path / "a", progress=False, curve_data=SETS)
    train(tiny(), TOK, TASK, cfg(), out_dir=tmp_path / "b", progress=False, curve_data=SETS, stop_after=12)
    with open(tmp_path / "b" / CURVES_FILE, "a") as f:  # a row written after the checkpoint, then a crash
        f.write(json.dumps({"kind": "curve", "step": 15, "bucket": "length 1-1", "exact": 1.0}) + "\n")
    resumed = train(tiny(seed=5), TOK, TASK, cfg(), out_dir=tmp_path / "b", resume=True, progress=False,
                    curve_data=SETS)
    a, b = rows_of(tmp_path / "a"), rows_of(tmp_path / "b")
    assert [(r["step"], r["bucket"]) for r in b] == [(r["step"], r["bucket"]) for r in a]
    for x, y in zip(a, b):
        assert (x["exact"], x["partial"]) == (y["exact"], y["partial"]) and x["loss"] == pytest.approx(y["loss"])
    assert resumed.stop == {**straight.stop, "curve_cost": resumed.stop["curve_cost"]}
    # a run its rule stopped is over: resuming it trains nothing and says so once
    stopped = cfg(steps=100, lr=1e-7, stop="plateau", stop_bucket="length 2-3")
    train(tiny(), TOK, TASK, stopped, out_dir=tmp_path / "c", progress=False, curve_data=SETS)
    before = rows_of(tmp_path / "c")
    again = train(tiny(), TOK, TASK, stopped, out_dir=tmp_path / "c", resume=True, progress=False, curve_data=SETS)
    log = pd.read_json(tmp_path / "c" / "log.jsonl", lines=True)
    assert again.stop["reason"] == "plateau" and again.stop["step"] == 15 and rows_of(tmp_path / "c") == before
    assert (log.kind == "stop").sum() == 1 and log.step.max() == 15


def test_a_stop_rule_needs_curves_on_a_set_they_have(tmp_path):
    with pytest.raises(ValueError, match="needs learning curves"):
        train(tiny(), TOK, TASK, cfg(stop="plateau"), progress=False)
    with pytest.raises(ValueError, match="stop bucket 'id' is not a curve set"):
        train(tiny(), TOK, TASK, cfg(stop="target", target=0.9), progress=False, curve_data=SETS)


def _ddp_worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    model = tiny(seed=rank)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        config = cfg(steps=100, lr=1e-7, stop="plateau", stop_bucket="length 2-3")
        res = train(model, TOK, TASK, config, progress=False, curve_data=SETS)  # rank 0 scores, both stop
        steps = [r["step"] for r in res.history if r.get("kind") == "train"]
        (Path(out) / f"rank{rank}.json").write_text(json.dumps({"stop": res.stop, "last": steps[-1]}))
    finally:
        dist.destroy_process_group()


def test_every_ddp_process_stops_where_the_rule_fires_on_rank_0(tmp_path):
    import torch.multiprocessing as mp

    mp.start_processes(_ddp_worker, args=(2, f"file://{tmp_path}/init", str(tmp_path)), nprocs=2, join=True,
                       start_method="fork")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["stop"]["reason"], r["stop"]["step"], r["last"]) for r in ranks] == [("plateau", 15, 15)] * 2
