"""Sweep config validation, grid and sharding (pure; no model)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aspan.experiments.sweep import SweepConfig, grid, parse_shard, shard_points
from aspan.io import settings_key

BASE = {"model": "smollm2", "task": "reversal", "strengths": [0.5, 1.0], "heads": {"top": [1, 2]}}


def cfg(**kw):
    return SweepConfig.from_dict({**BASE, **kw})


def test_defaults_and_grid_size():
    c = cfg(thresholds=["none", 0.1], deltas=[0, 2], seeds=[0, 1], heads={"top": [1, 2], "list": [[0, 1]]})
    pts = grid(c)
    assert len(pts) == 3 * 2 * 2 * 1 * 2 * 1 * 2
    keys = [settings_key(p) for p in pts]
    assert len(set(keys)) == len(keys)
    assert grid(c) == pts  # deterministic
    assert {p["heads"] for p in pts} == {"top:1", "top:2", "list:0.1"}
    assert all(("rank" in p) == p["heads"].startswith("top") for p in pts)


@pytest.mark.parametrize(
    "bad, key",
    [
        ({"strenghts": [1.0]}, "strenghts"),
        ({"heads": {"top": [1], "topp": 2}}, "heads.topp"),
        ({"heads": {"list": [[0, -1]]}}, "heads.list"),
        ({"heads": {"list": [[0, 1, 2]]}}, "heads.list"),
        ({"heads": {"top": [0]}}, "heads.top"),
        ({"heads": {"fraction": [1.5]}}, "heads.fraction"),
        ({"heads": {}}, "heads"),
        ({"thresholds": [-0.1]}, "thresholds"),
        ({"strengths": []}, "strengths"),
        ({"strengths": ["x"]}, "strengths"),
        ({"mode": ["beam"]}, "mode"),
        ({"renormalize": ["yes"]}, "renormalize"),
        ({"n_samples": 0}, "n_samples"),
        ({"task": "sorting"}, "task"),
        ({"split": "test"}, "split"),
        ({"task_params": {"length": [5, 2]}}, "task_params"),
        ({"task_params": {"colour": 1}}, "task_params"),
        ({"model": "/nonexistent/ckpt"}, "model"),
        ({"delta": 1, "deltas": [1]}, "delta"),
        ({"heads": {"top": [1], "by": "max"}}, "heads.by"),
        ({"heads": {"top": [1], "convention": "row"}}, "heads.convention"),
    ],
)
def test_bad_configs_name_the_key(bad, key):
    raw = {**BASE, **bad}
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        SweepConfig.from_dict(raw)


def test_missing_required_key():
    raw = dict(BASE)
    del raw["task"]
    with pytest.raises(ValueError, match="'task'"):
        SweepConfig.from_dict(raw)


def test_ranking_convention_goes_into_the_top_points_only_when_sample():
    """`sample` is the default, as everywhere; `raw` points keep the keys they had before the option existed."""
    raw_pts = grid(cfg(heads={"top": [1], "list": [[0, 1]], "convention": "raw"}))
    sample_pts = grid(cfg(heads={"top": [1], "list": [[0, 1]]}))
    assert cfg().convention == "sample"
    assert all("convention" not in p["rank"] for p in raw_pts if "rank" in p)
    assert [p["rank"].get("convention") for p in sample_pts if "rank" in p] == ["sample"] * len(
        [p for p in sample_pts if "rank" in p]) != []
    assert [p for p in raw_pts if "rank" not in p] == [p for p in sample_pts if "rank" not in p]


def test_check_heads_against_model():
    c = cfg(heads={"list": [[1, 7]], "top": [3]})
    assert c.check_heads(2, 8) is None  # fits a 2 x 8 model
    with pytest.raises(ValueError, match=r"heads\.list.*\(1, 7\)"):
        c.check_heads(1, 8)
    with pytest.raises(ValueError, match=r"heads\.top"):
        cfg(heads={"top": [17]}).check_heads(2, 8)


def test_toml_file(tmp_path):
    ck = tmp_path / "ckpt"
    ck.mkdir()
    p = tmp_path / "s.toml"
    p.write_text('model = "ckpt"\ntask = "reversal"\nstrengths = [1.0]\nthresholds = ["none", 0.05]\n'
                 '[heads]\nfraction = [0.1]\n')
    c = SweepConfig.from_toml(p)
    assert c.model == str(ck) and c.thresholds == (None, 0.05) and c.fractions == (0.1,)
    p.write_text('model = "ckpt"\ntask = [\n')
    with pytest.raises(ValueError, match="invalid TOML"):
        SweepConfig.from_toml(p)
    with pytest.raises(FileNotFoundError):
        SweepConfig.from_toml(tmp_path / "missing.toml")


def test_shipped_configs_parse():
    """Every sweep config in configs/ (a top-level `strengths` and a [heads] table) parses to the grid it states."""
    from pathlib import Path

    from aspan.io import read_toml

    root = Path(__file__).resolve().parents[2] / "configs"
    files = [f for f in sorted(root.glob("*.toml")) if {"strengths", "heads"} <= set(read_toml(f))]
    assert {f.name for f in files} >= {"reversal_reinforce.toml", "assign_smollm2_threshold.toml"}
    for f in files:
        raw = read_toml(f)
        c = SweepConfig.from_toml(f, check_model=False)
        assert (c.task, c.strengths) == (raw["task"], tuple(float(x) for x in raw["strengths"]))
        heads = raw["heads"]
        n = len(heads.get("top", [])) + len(heads.get("fraction", [])) + bool(heads.get("list"))
        for axis in (c.methods, c.strengths, c.thresholds, c.renormalize, c.deltas, c.modes, c.seeds):
            n *= len(axis)
        assert len(grid(c)) == n == len({settings_key(p) for p in grid(c)})


@given(st.integers(1, 40), st.integers(1, 7))
def test_shards_partition_the_grid(n_points, n):
    pts = [{"i": i} for i in range(n_points)]
    parts = [shard_points(pts, (i, n)) for i in range(n)]
    flat = [p["i"] for part in parts for p in part]
    assert sorted(flat) == list(range(n_points))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_parse_shard():
    assert parse_shard("2/5") == (2, 5)
    for bad in ("5/5", "-1/3", "a/b", "1"):
        with pytest.raises(ValueError):
            parse_shard(bad)
