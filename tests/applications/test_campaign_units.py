"""Several units of a study at once inside a slice (`aspan.applications.slice_units`), on the CPU: with K = 2 the
units run two at a time in processes of their own, and the run ends with the rows and weights of a one-process run;
the probe measures 1, 2, ... processes and stops where the throughput stops rising."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aspan.applications import campaign as c
from aspan.applications import slice_units as su
from aspan.cli import main
from aspan.commands.gpu import study_units

RUN = {"name": "abc", "command": ["study", "abc", "--protocol", "paper", "--quick", "--tasks", "successor",
                                  "--conditions", "vanilla", "--seeds", "0,1", "--quiet"]}
PLAN = c.CampaignPlan(runs=(RUN,), budget_s=10_000, reserve_s=0, checkpoint_s=1_000, checks=())
WORKER = (sys.executable, "-m", "aspan.commands.gpu_worker")
TIMING = ("wall_s", "seconds", "train_s", "time", "train_seconds", "eval_s", "wall")


def _rows(path: Path) -> list[dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    rows = [{k: v for k, v in r.items() if k not in TIMING} for r in rows]
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def test_two_units_at_once_give_the_rows_of_one_process(tmp_path):
    one = c.run_slice(PLAN, c.Slice(tmp_path / "one", tmp_path / "out1", main, "cpu"))
    assert [r["status"] for r in one["runs"]] == ["done"] and "units" not in one["runs"][0]
    two = c.run_slice(PLAN, c.Slice(tmp_path / "two", tmp_path / "out2", main, "cpu", worker=WORKER,
                                    list_units=study_units, units_at_once=2))
    run = two["runs"][0]
    assert run["status"] == "done" and run["units_at_once"] == 2, run
    units = run["units"]
    assert sorted(u["key"] for u in units) == ["successor/vanilla/seed 0", "successor/vanilla/seed 1"]
    assert all(u["status"] == "done" for u in units)
    assert max(u["start_s"] for u in units) < min(u["start_s"] + u["seconds"] for u in units), "both at once"
    for name in ("runs.jsonl", "checks.jsonl", "positions.jsonl"):
        assert _rows(tmp_path / "two" / "abc" / name) == _rows(tmp_path / "one" / "abc" / name), name
    assert not list((tmp_path / "two" / "abc").glob("*.unit-*")), "the unit files were merged"
    assert not (tmp_path / "two" / "abc" / su.UNITS_DONE).exists(), "a finished run keeps no unit record"
    for p in sorted((tmp_path / "one" / "abc").rglob("model.safetensors")):
        got = load_file(str(tmp_path / "two" / "abc" / p.relative_to(tmp_path / "one" / "abc")))
        want = load_file(str(p))
        assert all(torch.equal(got[k], want[k]) for k in want), p
    assert json.loads((tmp_path / "out2" / "run.json").read_text())["runs"][0]["units_at_once"] == 2


FAKE = """
import json, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # as aspan's command line: stopped, exit 143
args = sys.argv[1:]
until, unit = float(args[args.index("--until") + 1]), int(args[args.index("--unit") + 1])
log = args[args.index("--out") + 1] + "/log.jsonl"
open(args[args.index("--out") + 1] + f"/started-{unit}", "w").close()
t0 = time.time()
time.sleep(0.6)
with open(log, "a") as f:
    f.write(json.dumps({"unit": unit, "start": t0, "end": time.time()}) + "\\n")
sys.exit({3: 75, 4: 1}.get(unit, 0) if "--fail" in args else 0)
"""


def _fake_job(tmp_path, *extra: str) -> su.UnitJob:
    import time

    out = tmp_path / "run"
    out.mkdir(exist_ok=True)
    return su.UnitJob("fake", ("x", "--out", str(out), *extra), out, (sys.executable, "-c", FAKE),
                      time.time() + 600, 100.0)


def test_units_run_stage_by_stage_at_most_k_at_a_time(tmp_path):
    from aspan.applications.studies import Unit

    units = [Unit("a", 1), Unit("b", 1), Unit("c", 1), Unit("d", 2), Unit("e", 2)]
    got = su.run_units(_fake_job(tmp_path), units, 2)
    assert got["status"] == "done" and [u["status"] for u in got["units"]] == ["done"] * 5
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    for t in sorted({x["start"] + 0.3 for x in log}):  # never more than two at a time
        assert sum(x["start"] <= t <= x["end"] for x in log) <= 2
    first, second = [x for x in log if x["unit"] < 3], [x for x in log if x["unit"] >= 3]
    assert min(x["start"] for x in second) >= max(x["end"] for x in first), "stage 2 waits for stage 1"
    assert su.done_units(tmp_path / "run") == {"a", "b", "c", "d", "e"}
    again = su.run_units(_fake_job(tmp_path), units, 2)
    assert again == {"status": "done", "units": []}, "finished units are not run again"


def test_a_paused_or_failed_unit_stops_the_run_and_says_why(tmp_path):
    from aspan.applications.studies import Unit

    units = [Unit(k, 1) for k in "abcde"]
    got = su.run_units(_fake_job(tmp_path, "--fail"), units, 5)
    by = {u["key"]: u for u in got["units"]}
    assert got["status"] == "failed" and by["e"]["status"] == "failed" and by["d"]["status"] == "paused"
    assert su.done_units(tmp_path / "run") == {"a", "b", "c"}
    late = _fake_job(tmp_path)
    import time
    from dataclasses import replace

    assert su.run_units(replace(late, deadline_epoch=time.time() + 5), units, 2)["status"] == "paused", \
        "no unit starts with less time left than the 30 s a first unit is given"


def test_a_stop_signal_reaches_the_running_units_and_starts_no_other(tmp_path, monkeypatch):
    import signal

    from aspan import stopping
    from aspan.applications.studies import Unit

    def received():  # the slice gets SIGTERM once its first two units run (their handlers set)
        return signal.SIGTERM if len(list((tmp_path / "run").glob("started-*"))) >= 2 else None
    monkeypatch.setattr(stopping, "received", received)
    units = [Unit(k, 1) for k in "abcdef"]
    got = su.run_units(_fake_job(tmp_path), units, 2)
    assert got["status"] == "stopped"
    assert [u["status"] for u in got["units"]] == ["stopped", "stopped"], got["units"]
    assert not (tmp_path / "run" / "log.jsonl").exists() or len((tmp_path / "run" / "log.jsonl").read_text()
                                                              .splitlines()) == 0


def test_the_worker_pauses_at_the_deadline_with_its_own_exit_code(tmp_path, capsys):
    import time

    from aspan.commands import gpu_worker

    code = gpu_worker.main(["--until", str(time.time() - 1), "--checkpoint-s", "100", "--", *RUN["command"],
                            "--out", str(tmp_path / "abc"), "--device", "cpu", "--unit", "0"])
    assert code == su.PAUSED_EXIT and "paused" in capsys.readouterr().err
    assert gpu_worker.main(["--until", "1"]) == 2


def test_choose_k_stops_where_the_throughput_stops_rising():
    assert su.choose_k({1: 100.0, 2: 190.0, 4: 200.0}) == 2
    assert su.choose_k({1: 100.0, 2: 110.0}) == 1
    assert su.choose_k({1: 100.0, 2: 190.0, 4: 370.0}) == 4
    assert su.choose_k({1: 100.0}) == 1


def test_the_probe_measures_processes_on_the_cpu():
    got = su.probe("cpu", su.ProbeShape(n_layers=1, n_heads=2, d_model=16, batch_size=4, length=3), (1, 2), 0.5)
    assert "error" not in got, got
    assert set(got["throughput"]) <= {"1", "2"} and got["throughput"]["1"] > 0 and got["k"] in (1, 2)
    assert got["k"] == su.choose_k({int(k): v for k, v in got["throughput"].items()})


@pytest.mark.parametrize("table, message", [({"d_model": 0}, "probe.d_model"), ({"width": 3}, "unknown key")])
def test_bad_probe_shapes_are_refused(table, message):
    with pytest.raises(ValueError, match=message):
        su.ProbeShape.of(table)
