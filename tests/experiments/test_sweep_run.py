"""End to end: a 2-point sweep on a tiny random checkpoint, interrupted and resumed; shards; the CLI."""
import json

import pandas as pd
import pytest

import hooks
from aspan import models
from aspan.cli import main
from aspan.evaluation import evaluate
from aspan.experiments.sweep import SweepConfig, grid, run_sweep
from aspan.io import read_rows, settings_key

METRICS = ["exact", "partial", "attn_rollout_sample", "attn_rollout_raw", "attn_heads_sample", "attn_heads_raw",
           "baseline_exact", "baseline_partial"]


def config(ckpt, **kw):
    raw = {
        "model": str(ckpt), "task": "reversal", "split": "ood", "task_params": {"length": [11, 13]},
        "n_samples": 4, "seeds": [0], "batch_size": 4, "strengths": [0.5, 3.0], "device": "cpu",
        "heads": {"top": [2], "rank_samples": 6},
    }
    return SweepConfig.from_dict({**raw, **kw})


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def full(ckpt, tmp_path_factory):
    """The sweep run once, killed after its first row, then resumed."""
    c = config(ckpt)
    path = tmp_path_factory.mktemp("sweep") / "rows.jsonl"

    def kill(row):
        raise Killed

    with pytest.raises(Killed):
        run_sweep(c, path, on_row=kill, progress=False)
    assert len(read_rows(path)) == 1
    with open(path, "a") as f:  # and a torn half-line, as if killed while writing the second row
        f.write('{"key": "')
    seen = []
    df = run_sweep(c, path, on_row=seen.append, progress=False)
    assert len(seen) == 1  # only the missing row was computed
    return c, path, df


def test_resume_completes_without_duplicates(full):
    c, path, df = full
    keys = [settings_key(p) for p in grid(c)]
    assert sorted(df.key) == sorted(keys) and df.key.is_unique
    assert all(json.loads(line) for line in path.read_text().splitlines())  # torn line cut, all lines whole
    again = run_sweep(c, path, progress=False)  # nothing left: no model load, same rows
    pd.testing.assert_frame_equal(again, df)


def test_rows_have_matched_baseline_and_reinforcement_raises_head_attention(full, ckpt):
    c, _, df = full
    model, tok, _ = models.load(ckpt, device="cpu")
    samples = c.data().samples("selection", 0)
    id_samples = c.data().samples("id", 0)
    for _, r in df.iterrows():
        heads = [tuple(h) for h in r.heads_list]
        base = evaluate(model, tok, samples, heads=heads, batch_size=4).summary()
        assert r.baseline_exact == base["exact"] and r.baseline_partial == pytest.approx(base["partial"])
        assert r.n == 4 and r.n_heads == 2 and r.set == "selection"
        def edit(b, heads=heads, strength=r.strength):
            return hooks.reinforce(heads, b.ref_mask, strength, model=model)

        edited = evaluate(model, tok, id_samples, fwd_hooks=edit, attn=False)
        assert r.id_exact == edited.summary()["exact"] and r.id_partial == pytest.approx(edited.summary()["partial"])
        assert r.id_cost == pytest.approx(r.id_baseline_exact - r.id_exact)
        assert r.gain_exact == pytest.approx(r.exact - r.baseline_exact)
        for conv in ("sample", "raw"):
            assert r[f"baseline_attn_heads_{conv}"] == pytest.approx(base[f"attn_heads_{conv}"])
            assert r[f"attn_heads_{conv}"] > r[f"baseline_attn_heads_{conv}"]  # C added on the selected heads' refs
        assert sum(d["n"] for d in r.by_length) == 4
    strong, weak = df.set_index("strength").loc[3.0], df.set_index("strength").loc[0.5]
    assert strong.attn_heads_sample > weak.attn_heads_sample


def test_shards_union_is_the_full_grid(full, tmp_path):
    c, _, df = full
    parts = [run_sweep(c, tmp_path / f"s{i}.jsonl", shard=(i, 2), progress=False) for i in range(2)]
    union = pd.concat(parts)
    assert sorted(union.key) == sorted(df.key) and union.key.is_unique
    a = union.set_index("key").sort_index()[METRICS]
    b = df.set_index("key").sort_index()[METRICS]
    pd.testing.assert_frame_equal(a, b)


def test_sweep_cli_writes_table_and_figures(ckpt, tmp_path, capsys):
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'''model = "{ckpt}"
task = "reversal"
task_params = {{ length = [11, 12] }}
n_samples = 3
batch_size = 3
strengths = [1.0]
deltas = [0, 1]
mode = ["teacher", "generate"]
device = "cpu"
[heads]
list = [[1, 0], [1, 2]]
''')
    out = tmp_path / "run"
    assert main(["sweep", "--config", str(cfg), "--out", str(out), "--quiet", "--shard", "0/2"]) == 0
    assert json.loads((out / "summary.json").read_text())["complete"] is False
    assert main(["sweep", "--config", str(cfg), "--out", str(out), "--quiet", "--shard", "1/2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True and summary["rows"] == 4
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 4 and set(table["mode"]) == {"teacher", "generate"}
    for name in ("sweep_length_teacher", "sweep_strength_generate"):
        fig = json.loads((out / "figures" / f"{name}.json").read_text())
        assert fig["data"]
    assert json.loads((out / "run.json").read_text())["command"] == "sweep"


@pytest.mark.parametrize("text, msg", [
    ('task = "reversal"\nstrengths = [1.0]\n[heads]\ntop = [1]\n', "'model'"),
    ('model = "{ckpt}"\ntask = "reversal"\nstrengths = [1.0]\nthresholds = [-1]\n[heads]\ntop = [1]\n', "thresholds"),
    ('model = "{ckpt}"\ntask = "reversal"\nstrengths = [1.0]\n[heads]\nlist = [[5, 0]]\n', "heads.list"),
    ('model = "{ckpt}"\ntask = "reversal"\nstrengths = [1.0]\n[heads]\ntop = [1]\nbogus = 1\n', "heads.bogus"),
    ('model = "/no/such/dir"\ntask = "reversal"\nstrengths = [1.0]\n[heads]\ntop = [1]\n', "model"),
])
def test_sweep_cli_rejects_bad_configs_before_work(ckpt, tmp_path, capsys, text, msg):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text.replace("{ckpt}", str(ckpt)))
    out = tmp_path / "run"
    assert main(["sweep", "--config", str(cfg), "--out", str(out), "--quiet"]) == 2
    assert msg in capsys.readouterr().err
    assert not (out / "sweep.jsonl").exists()
