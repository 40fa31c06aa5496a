"""`aspan demo`: end to end on the shipped checkpoint (quick sizes), numbers consistent with the files it writes."""
import json
from types import SimpleNamespace

import pandas as pd
import pytest

from aspan import tasks
from aspan.applications import demo
from aspan.cli import main
from aspan.experiments.engine import Data, select
from aspan.io import read_rows


def _offsets(values):
    """A long offset table {(delta, layer, head): score_row}."""
    return pd.DataFrame([{"delta": d, "layer": l, "head": h, "score_row": v} for (d, l, h), v in values.items()])


def test_best_delta():
    off = _offsets({(0, 0, 0): 0.30, (0, 0, 1): 0.10, (0, 1, 0): 0.05, (0, 1, 1): 0.02,
                    (2, 0, 0): 0.01, (2, 0, 1): 0.02, (2, 1, 0): 0.60, (2, 1, 1): 0.40,
                    (-1, 0, 0): 0.9, (-1, 0, 1): 0.0, (-1, 1, 0): 0.0, (-1, 1, 1): 0.0})
    assert demo.best_delta(off, 2) == 2  # top-2 mean 0.50 beats -1 (0.45) and 0 (0.20)
    assert demo.best_delta(off, 1) == -1
    tie = _offsets({(0, 0, 0): 0.5, (1, 0, 0): 0.5, (-1, 0, 0): 0.5})
    assert demo.best_delta(tie, 1) == 0


def test_held_out_id_set_shares_no_sample_with_the_id_set():
    """The demo's held-out ID set is drawn apart from the engine's ID set (which ranks heads and prices ID cost),
    sample for sample, where the ID preset's draws repeat (here the 14 strings of 1-3 letters over "ab")."""
    data = Data("reversal", id_params={"length": [1, 3], "charset": "ab"}, n=6)
    s, cfg = SimpleNamespace(engine=SimpleNamespace(data=data)), SimpleNamespace(seed=3, samples=6)
    held = demo.id_held_out(s, cfg)
    seen = {x.text for x in data.samples("id", cfg.seed)}
    assert len(held) == 6 and not {x.text for x in held} & seen
    plain = tasks.preset("reversal", "id", length=[1, 3], charset="ab").generate(6, seed=cfg.seed + 4)
    assert {x.text for x in plain} & seen  # the seed-only draw would have shared samples with the ID set


def test_config_errors_come_first(tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        demo.run_demo(demo.DemoConfig(task="sorting", out=str(tmp_path)))
    with pytest.raises(ValueError, match="samples"):
        demo.run_demo(demo.DemoConfig(samples=1, out=str(tmp_path)))
    with pytest.raises(ValueError, match="convention"):
        demo.run_demo(demo.DemoConfig(convention="row", out=str(tmp_path)))
    assert not any(tmp_path.iterdir())
    assert main(["demo", "--task", "nope", "--out", str(tmp_path)]) == 2


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["demo", "--quick", "--out", str(out)]) == 0
    return out, buf.getvalue()


def test_quick_demo_end_to_end(quick_run):
    out, printed = quick_run
    for text in ("ID per-token", "OOD per-token", "ID cost", "Welch t", "rollout (ref, sample)", "rollout (ref, raw)",
                 "baseline", "reinforce", "Selection rule: largest OOD exact gain", str(out / "report.html")):
        assert text in printed
    summary = json.loads((out / "summary.json").read_text())
    run = json.loads((out / "run.json").read_text())
    assert run["model"].startswith("shipped checkpoint") and run["quick"] and run["task"] == "reversal"  # no training
    assert set(pd.read_csv(out / "ranking.csv").convention) == {"sample"}  # the default --convention
    assert run["convention"] == "sample"
    # headline numbers agree with the per-token records written beside them (recomputed independently)
    rec = pd.read_json(out / "records_ood.jsonl", lines=True)
    chars = rec[~rec.eos]
    assert summary["ood_partial"] == pytest.approx(chars.groupby("sample_id").correct.mean().mean())
    assert summary["ood_exact"] == pytest.approx(rec.groupby("sample_id").correct.all().mean())
    assert summary["baseline"]["ood_partial"] == summary["ood_partial"]
    scored = rec[rec.scored]
    want = scored[scored.correct].attn_rollout_sample.mean()
    assert summary["attn_rollout_sample_correct"] == pytest.approx(want, nan_ok=True)


def test_quick_demo_grid_and_selection(quick_run):
    out, printed = quick_run
    summary = json.loads((out / "summary.json").read_text())
    rows = read_rows(out / "sweep.jsonl")
    d_star = summary["best_offset"]
    offsets = [d_star, 0] if d_star else [0]
    grid = [r for r in rows if r["method"] == "reinforce"]
    assert sorted((r["delta"], r["heads"], r["strength"]) for r in grid) == sorted(
        (d, f"top:{k}", c) for d in offsets for k in (1, 2) for c in (1.0, 4.0))  # quick grid: tops x strengths
    assert {r["method"] for r in rows} == {"reinforce", "atoms"}  # and the causal search's proposals
    # the search offers every edit both ways at the end-of-sequence row; the rule chooses among all of them
    assert summary["eos"] == json.loads((out / "run.json").read_text())["eos"] == ["none", "extrapolate"]
    atoms = [r["atoms"] for r in rows if r["method"] == "atoms"]
    plain = {json.dumps(x) for x in atoms if all("eos" not in a for a in x)}
    extrapolated = [x for x in atoms if all(a.get("eos") == "extrapolate" for a in x)]
    assert plain and extrapolated and len(extrapolated) <= len(plain)
    for x in extrapolated:  # each has its twin that leaves the EOS row alone
        assert json.dumps([{k: v for k, v in a.items() if k != "eos"} for a in x]) in plain
    assert len(pd.read_csv(out / "sweep.csv")) == len(rows)
    sel = select(rows, id_budget=0.01)
    assert summary["rule"] == sel.rule and sel.rule in printed
    if sel.row is None:
        assert summary["selected"] is None and "No intervention improves OOD" in printed
        return
    chosen, detail = summary["selected"], summary["details"]["selected"]
    assert (detail["heads"], detail["strength"], detail["delta"]) == (sel.row["heads"], sel.row["strength"],
                                                                      sel.row["delta"])
    assert detail["grid_key"] != sel.row["key"]  # reported on the held-out set, not the selection set
    assert chosen["heads"] == sel.row["heads_list"]
    assert sel.row["id_cost"] <= 0.01
    assert sel.row["gain_exact"] > 0 or sel.row["gain_partial"] > 0
    # reported on the held-out set: its numbers are those of the records written for it
    rec = pd.read_json(out / "records_ood_reinforced.jsonl", lines=True)
    assert chosen["ood_partial"] == pytest.approx(rec[~rec.eos].groupby("sample_id").correct.mean().mean())
    assert set(rec.sample_id) == set(pd.read_json(out / "records_ood.jsonl", lines=True).sample_id)


def test_quick_demo_report_holds_every_figure(quick_run):
    out, _ = quick_run
    summary = json.loads((out / "summary.json").read_text())
    edited = summary["selected"] is not None or summary["upper_bound"] is not None
    figures = sorted(f.stem for f in (out / "figures").glob("*.json"))
    expect = {"01_rollout_ood", "03_head_across_lengths", "04_correct_vs_error", "05_offset_scan", "06_heads_ref",
              "08_accuracy_vs_length", "09_accuracy_vs_strength", "10_pareto"}
    expect |= {"02_rollout_ood_reinforced"} if edited else set()
    expect |= {"07_heads_best_offset"} if summary["best_offset"] else set()
    records = pd.read_json(out / "records_ood.jsonl", lines=True)
    failing = not records.groupby("sample_id").correct.all().all()
    assert (out / "anatomy.json").exists() == failing
    expect |= {"anatomy"} if failing else set()
    assert set(figures) == expect
    views = sorted(v.stem for v in (out / "views").glob("*.html"))
    expect_views = ["id_sample_baseline", "ood_sample_baseline"] + (["ood_sample_reinforced"] if edited else [])
    assert views == sorted(expect_views + (["anatomy"] if failing else []))
    page = (out / "report.html").read_text()
    for f in figures:
        assert f'id="figure-{f}"' in page
    for v in views:
        assert f'id="view-{v}"' in page
    assert 'src="http' not in page and "unpkg.com" not in page
    if failing:  # the first held-out OOD sample with a wrong token, before and after the shown edit
        anatomy = json.loads((out / "anatomy.json").read_text())
        first = records[~records.correct].sample_id.min()
        mine = records[records.sample_id == first]
        text, prompt_len = anatomy["sample"]["text"], anatomy["sample"]["prompt_len"]
        assert text[prompt_len:] == "".join(mine[~mine.eos].target_char)
        assert [r["expected"] for r in anatomy["table"]] == list(mine.target_char)
        assert [r["correct"] for r in anatomy["table"]] == list(mine.correct)
        assert anatomy["first_error"] == int(mine[~mine.correct].target_index.min())
        assert (anatomy["edit"] is not None) == edited and ("correct_after" in anatomy["table"][0]) == edited
        assert '<h2 id="anatomy-of-a-failure">Anatomy of a failure</h2>' in page


def test_quick_demo_tells_the_causal_story(quick_run):
    """The four conditions with their fixed keys; each is the rule's choice among its rows; budgets hold."""
    out, printed = quick_run
    summary = json.loads((out / "summary.json").read_text())
    keys = {"id_exact", "id_partial", "ood_exact", "ood_partial", "method", "heads", "rule"}
    for name in ("baseline", "paper_recipe", "selected", "upper_bound"):
        assert summary[name] is not None and set(summary[name]) == keys, name
        assert 0 <= summary[name]["ood_exact"] <= summary[name]["ood_partial"] <= 1
    base, sel = summary["baseline"], summary["selected"]
    # "selected" respects its ID budget on the held-out ID set it reports (no choice saw that set)
    assert base["id_exact"] - sel["id_exact"] <= summary["id_budget"] + 1e-12
    assert (sel["ood_exact"], sel["ood_partial"]) > (base["ood_exact"], base["ood_partial"])
    rows = pd.DataFrame(read_rows(out / "sweep.jsonl"))
    paper = rows[(rows.method == "reinforce") & (rows.delta == 0)]
    want = select(paper, None).row  # the paper's recipe: ranking at the references, C at any ID cost
    assert summary["details"]["paper_recipe"]["heads"] == want["heads"]
    assert summary["details"]["paper_recipe"]["strength"] == want["strength"]
    patch = rows[[r["method"] == "atoms" and all(a["method"] == "patch" for a in r["atoms"])
                  for r in rows.to_dict("records")]]
    assert summary["upper_bound"]["heads"] == select(patch, None).row["heads_list"]
    assert "uniform attention on the shifted references" in summary["upper_bound"]["rule"]
    rec = pd.read_json(out / "records_ood_reinforced.jsonl", lines=True)  # the selected edit's held-out records
    detail = summary["details"]["selected"]
    assert detail["ood_eos_accuracy"] == pytest.approx(rec[rec.eos].correct.mean())
    assert detail["ood_all_chars_right"] == pytest.approx(rec[~rec.eos].groupby("sample_id").correct.all().mean())
    assert sel["ood_exact"] <= min(detail["ood_all_chars_right"], detail["ood_eos_accuracy"]) + 1e-12
    for text in ("paper's recipe", "selected (within budget)", "patching upper bound", "paper's rank", "Spearman",
                 "end-of-sequence"):
        assert text in printed
    compared = pd.read_csv(out / "rankings_compared.csv")
    ranking = pd.read_csv(out / "ranking.csv")
    merged = compared.merge(ranking, on=["layer", "head"])
    assert len(compared) == len(ranking) and (merged.paper_rank == merged["rank"]).all()
    assert list(compared.causal_rank) == list(range(1, len(compared) + 1))
    assert compared.estimate.is_monotonic_decreasing
    fig = json.loads((out / "figures" / "10_pareto.json").read_text())
    assert {"selected", "paper recipe", "upper bound", "Pareto front"} <= {t.get("name") for t in fig["data"]}


def test_sweep_reproduces_a_demo_row(quick_run, tmp_path):
    """The same grid point through `aspan sweep` and through the demo: the same key and the same numbers."""
    out, _ = quick_run
    run = json.loads((out / "run.json").read_text())
    demo_row = [r for r in read_rows(out / "sweep.jsonl") if r["heads"] == "top:2" and r["strength"] == 4.0][0]
    params = ", ".join(f"{k} = {json.dumps(v)}" for k, v in run["ood_params"].items())
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'''model = "reversal"
task = "reversal"
task_params = {{ {params} }}
n_samples = {run["samples"]}
strengths = [4.0]
deltas = [{demo_row["delta"]}]
device = "cpu"
[heads]
top = [2]
by = "score_row"
rank_samples = {run["samples"]}
rank_seed = {run["seed"] + 1}
''')
    assert main(["sweep", "--config", str(cfg), "--out", str(tmp_path / "sw"), "--quiet", "--id-budget", "100"]) == 0
    (row,) = read_rows(tmp_path / "sw" / "sweep.jsonl")
    assert row["key"] == demo_row["key"]
    assert row["heads_list"] == demo_row["heads_list"] and row["n"] == demo_row["n"]
    for col in ("exact", "partial", "baseline_exact", "baseline_partial", "id_exact", "id_partial", "id_cost"):
        assert row[col] == pytest.approx(demo_row[col]), col


def test_shards_and_resume_reuse_rows(quick_run, tmp_path):
    """Two shards of the grid, then a run without --shard: it computes nothing again and gets the same rows."""
    out, _ = quick_run
    full = {r["key"]: r for r in read_rows(out / "sweep.jsonl")}
    run = tmp_path / "run"
    for i in range(2):
        assert main(["demo", "--quick", "--out", str(run), "--shard", f"{i}/2"]) == 0
    parts = [read_rows(run / f"sweep.shard-{i}-of-2.jsonl") for i in range(2)]
    assert sorted(r["key"] for p in parts for r in p) == sorted(full) and all(parts)
    assert main(["demo", "--quick", "--out", str(run)]) == 0
    assert read_rows(run / "sweep.jsonl") == []  # every grid point came from the shards
    assert json.loads((run / "summary.json").read_text())["selected"] == json.loads(
        (out / "summary.json").read_text())["selected"]
    for p in parts:
        for r in p:
            assert r["exact"] == full[r["key"]]["exact"] and r["id_cost"] == full[r["key"]]["id_cost"]


def test_other_task_trains_a_model_and_saves_it(tmp_path, capsys):
    out = tmp_path / "add"
    assert main(["demo", "--quick", "--task", "addition", "--steps", "2", "--samples", "8", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "no checkpoint ships for 'addition'" in printed.err  # a log record of the library, on stderr
    assert "trained here for 2 steps" in printed.out  # the result
    run = json.loads((out / "run.json").read_text())
    assert run["task"] == "addition" and run["model_meta"]["steps"] == 2
    from aspan import models

    model, tokenizer, meta = models.load(run["saved_model"], device="cpu")
    assert meta["task"] == "addition" and model.cfg.n_ctx >= 1 + 10 + 1 + 10 + 1 + 11 + 1  # fits the OOD preset
    assert (out / "report.html").is_file()


def test_held_out_samples_give_every_reported_number(quick_run):
    """held_out_samples.csv keeps the per-sample results of every condition on every set it was scored on, so the
    summary's held-out numbers (and the ID set's that priced the ID cost) are their means."""
    out, _ = quick_run
    summary = json.loads((out / "summary.json").read_text())
    rows = pd.read_csv(out / "held_out_samples.csv")
    run = json.loads((out / "run.json").read_text())

    def mean(condition, set_name, col):
        got = rows[(rows.condition == condition) & (rows.set == set_name)]
        n = run["gen_samples"] if set_name.endswith("generated") else run["samples"]
        assert len(got) == n and list(got.sample_id) == list(range(n)), (condition, set_name)
        return got[col].mean()

    assert summary["id_exact"] == pytest.approx(mean("baseline", "id", "exact"))
    assert summary["ood_generate_partial"] == pytest.approx(mean("baseline", "ood_held_out_generated", "partial"))
    for name in ("baseline", "paper_recipe", "selected", "upper_bound"):
        entry = summary[name]
        if entry is None:
            assert name not in set(rows.condition)
            continue
        assert entry["ood_exact"] == pytest.approx(mean(name, "ood_held_out", "exact"))
        assert entry["ood_partial"] == pytest.approx(mean(name, "ood_held_out", "partial"))
        assert entry["id_exact"] == pytest.approx(mean(name, "id_held_out", "exact"))
        assert entry["id_partial"] == pytest.approx(mean(name, "id_held_out", "partial"))
        detail = summary["details"][name]
        assert detail["ood_eos_accuracy"] == pytest.approx(mean(name, "ood_held_out", "eos_right"))
        if name != "baseline":
            assert detail["id_exact_engine_set"] == pytest.approx(mean(name, "id", "exact"))
            assert detail["ood_generate_exact"] == pytest.approx(mean(name, "ood_held_out_generated", "exact"))
    held = rows[(rows.condition == "selected") & (rows.set == "ood_held_out")]
    rec = pd.read_json(out / "records_ood_reinforced.jsonl", lines=True)  # the per-token records agree
    assert list(held.exact) == list(rec.groupby("sample_id").correct.all())
    assert (held.exact <= held.eos_right).all()


def test_model_loads_a_checkpoint_directory(quick_run, tmp_path):
    """--model DIR: the demo on a checkpoint of one's own (here the shipped weights from their directory): the same
    numbers as the shipped run, the grid keyed by the weights' digest, the source named."""
    out, _ = quick_run
    run = tmp_path / "own"
    assert main(["demo", "--quick", "--model", str(demo.CHECKPOINTS / "reversal"), "--out", str(run)]) == 0
    mine, shipped = (json.loads((d / "summary.json").read_text()) for d in (run, out))
    assert mine["selected"] == shipped["selected"] and mine["baseline"] == shipped["baseline"]
    assert json.loads((run / "run.json").read_text())["model"] == f"checkpoint {demo.CHECKPOINTS / 'reversal'}"
    keys = {r["key"] for r in read_rows(run / "sweep.jsonl")}
    assert keys and not keys & {r["key"] for r in read_rows(out / "sweep.jsonl")}  # another model id
    with pytest.raises(ValueError, match="--model: no checkpoint at"):
        demo.DemoConfig(model=str(tmp_path / "none"), out=str(tmp_path / "x")).check()
    with pytest.raises(ValueError, match="give one of them"):
        demo.DemoConfig(model=str(demo.CHECKPOINTS / "reversal"), train=True, out=str(tmp_path / "x")).check()
