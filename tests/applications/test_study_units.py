"""Studies split into units (`aspan.applications.studies.Unit`): every study's `--quick` units, a unit that runs
before the stage it needs refused in one line, the merge of unit files, `aspan study --unit` and `--list-units`,
and `--launcher slurm` against an in-process stand-in for the job arrays. Running every unit alone, then the study,
writes the rows a one-process run writes (those recorded in `data/study_quick_rows.json`). The real Slurm runs are in
tests/cluster."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from aspan.applications import launch
from aspan.applications.studies import REGISTRY, merge_units, study, unit_file
from aspan.cli import main
from aspan.environment import torch_threads
from aspan.io import claim_run

from .study_rows import by_key, rows

RECORDED = json.loads((Path(__file__).parent / "data" / "study_quick_rows.json").read_text(encoding="utf-8"))


def quick(name: str):
    return study(name).config.quick(**({"threads": 1} if name == "parity" else {}))


@pytest.mark.parametrize("name", REGISTRY)
def test_every_quick_study_splits_into_staged_units_with_stable_unique_keys(name):
    s = study(name)
    units = s.units(quick(name))
    assert len(units) >= 5 and [u.key for u in units] == [u.key for u in s.units(quick(name))]
    assert len({u.key for u in units}) == len(units)
    assert [u.stage for u in units] == sorted(u.stage for u in units) and len({u.stage for u in units}) >= 2
    assert s.unit(quick(name), "0") == (0, units[0]) and s.unit(quick(name), units[-1].key)[1] == units[-1]
    with pytest.raises(KeyError, match="no unit 'nope'"):
        s.unit(quick(name), "nope")


@pytest.mark.parametrize("name, first_stage, later", [("parity", 10, "plain/seed 1"),
                                                      ("abc-paper", 3, "successor/abc/seed 0")])
def test_the_units_of_a_quick_study(name, first_stage, later):
    units = study(name).units(quick(name))
    assert sum(u.stage == min(x.stage for x in units) for u in units) == first_stage
    assert later in [u.key for u in units if u.stage > units[0].stage]


def test_a_unit_before_the_stage_it_needs_is_refused_in_one_line_and_leaves_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["study", "parity", "--quick", "--out", str(out), "--unit", "plain/seed 1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("aspan study: error: format plain's seeds need the learning rate its grid chooses: run unit "
                   "'plain/lr 0.001' first")
    assert not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["--unit", "99"], "--unit: no unit '99' in study parity: 0-14 or a key of --list-units"),
    (["--unit", "0", "--launcher", "slurm"], "--unit and --launcher slurm: the launcher submits every unit"),
    (["--time", "5"], "--time needs --launcher slurm"),
    (["--launcher", "slurm", "--array-tasks", "2"], "--array-tasks: a study's array has one task per unit"),
])
def test_unit_and_launcher_flags_out_of_place_are_refused(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    assert main(["study", "parity", "--quick", "--out", str(out), "--quiet", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_list_units_prints_index_stage_and_key(tmp_path, capsys):
    assert main(["study", "abc", "--protocol", "paper", "--quick", "--out", str(tmp_path / "r"), "--list-units"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "0\t1\tsuccessor/vanilla/seed 0" and lines[-1] == "4\t2\taddition/abc/seed 0"
    assert not (tmp_path / "r").exists()


def test_the_merge_appends_unit_rows_in_unit_order_once_per_key_and_waits_for_a_running_unit(tmp_path):
    units = study("parity").units(quick("parity"))
    lines = {None: [{"key": "a", "v": 0}], 3: [{"key": "b", "v": 3}, {"key": "a", "v": 9}, {"v": "log"}],
             1: [{"key": "c", "v": 1}, {"key": "c", "v": 2}, {"key": "b", "v": 8}]}  # one file may repeat a key
    for i, rs in lines.items():
        unit_file(tmp_path, "rows.jsonl", i).write_text("".join(json.dumps(r) + "\n" for r in rs))
    with claim_run(tmp_path, shard=(3, len(units)), command="aspan study parity --unit 3"):
        with pytest.raises(ValueError, match="in use by 'aspan study parity --unit 3'"):
            merge_units(tmp_path, units, ("rows.jsonl",))
    assert merge_units(tmp_path, units, ("rows.jsonl", "learning_curves.jsonl")) == 2
    merged = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert merged == [{"key": "a", "v": 0}, {"key": "c", "v": 1}, {"key": "c", "v": 2}, {"key": "b", "v": 8},
                      {"v": "log"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


def _same_rows(out: Path, name: str) -> None:
    """The recorded rows, floats to 1e-6 relative (another CPU's kernels round a quick run's loss in its 7th digit)."""
    got, want = rows(out, name), by_key(RECORDED[name])  # recorded in another order before the rows gained fields
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in w:
            assert g[k] == (pytest.approx(w[k], rel=1e-6, abs=1e-12) if isinstance(w[k], float) else w[k]), k


@pytest.mark.hooked  # the rows were recorded on HookedTransformer
def test_qk_units_one_by_one_then_the_study_write_the_rows_of_a_one_process_run(tmp_path):
    s, config, out = study("qk"), quick("qk"), tmp_path / "qk"
    with torch_threads(1):
        for u in s.units(config):
            assert s.run(config, out, progress=False, unit=u.key) is None
        assert not (out / "runs.jsonl").exists() and not (out / "table.csv").exists()  # units write rows only
        assert len(list(out.glob("runs.unit-*.jsonl"))) == len(s.units(config))
        result = s.run(config, out, progress=False)
    assert not list(out.glob("*.unit-*")) and (out / "table.csv").exists() and (out / "report.html").exists()
    assert result.summary["runs"] == len(RECORDED["qk"])
    _same_rows(out, "qk")


@pytest.mark.hooked
def test_parity_through_the_launcher_runs_each_stage_as_an_array_then_merges_to_a_one_process_run(tmp_path,
                                                                                                    monkeypatch):
    """`--launcher slurm` with an in-process stand-in for Slurm: each stage's array runs its tasks (the real
    `study_task`, each unit holding its lock while the launcher holds the run directory) in stage order; then the
    launching process merges and writes the study's outputs."""
    submitted = []

    def arrays(array, resources, wait=True, progress=True):
        assert wait and resources.array_tasks == array.default_tasks
        submitted.append((array.folder, array.default_tasks))
        for i in range(array.default_tasks):
            array.task((i, array.default_tasks), *array.args)
        return []

    monkeypatch.setattr(launch, "run_array", arrays)
    out = tmp_path / "parity"
    assert main(["study", "parity", "--quick", "--threads", "1", "--no-report", "--out", str(out), "--quiet",
                 "--launcher", "slurm"]) == 0
    assert submitted == [(".slurm/stage-1", 10), (".slurm/stage-2", 5)]
    assert not list(out.glob("*.unit-*")) and not (out / ".slurm").exists() and (out / "summary.json").exists()
    _same_rows(out, "parity")


def test_no_wait_submits_the_first_unfinished_stage_and_prints_its_job_id(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(launch, "run_array", lambda array, res, wait=True, progress=True:
                        calls.append((array.folder, wait)) or ["41_0", "41_1"])
    assert main(["study", "parity", "--quick", "--out", str(tmp_path / "p"), "--launcher", "slurm", "--no-wait",
                 "--quiet"]) == 0
    assert calls == [(".slurm/stage-1", False)] and capsys.readouterr().out.strip() == "41"


def test_a_qk_study_with_a_base_trains_it_in_its_first_stage_and_its_other_units_wait_for_it(tmp_path):
    from aspan.applications.studies.qk import QKStudyConfig

    config = QKStudyConfig.quick(protocol="curves", seeds=(0, 1), replays=(0.0,), columns=(), pairs=(0,),
                                 base={"n_layers": 1, "n_heads": 1, "d_model": 16, "length": [1, 4], "cap": 4,
                                       "batch_size": 8, "curve_every": 2})
    units = study("qk").units(config)
    assert units[0].key == "base" and units[0].stage == 0 and {u.stage for u in units[1:]} == {1, 2}
    assert "qk-pair:0/replay 0/seed 1" in [u.key for u in units if u.stage == 2]  # the base's own rotary pairs
    with pytest.raises(ValueError, match="fine-tunes the base that unit 'base' trains: run it first"):
        study("qk").run(config, tmp_path, progress=False, unit="qk/replay 0/select")
    assert not (tmp_path / "base").exists()
