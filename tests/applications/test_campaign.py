"""The GPU campaign's slices on CPU: a slice stopped by its time budget, merged into a fresh directory and
continued, ends with exactly the rows and weights of an uninterrupted run; the budget is honoured; bad plans are
refused in one line."""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aspan.applications import campaign as c
from aspan.cli import main
from aspan.errors import UsageError

RUNS = (
    {"name": "abc", "command": ["study", "abc", "--protocol", "paper", "--quick", "--quiet"]},
    {"name": "qk", "command": ["study", "qk", "--quick", "--protocol", "curves", "--quiet"]},
)
PLAN = c.CampaignPlan(runs=RUNS, budget_s=10_000, reserve_s=0, checkpoint_s=1_000, checks=())
TIMING = ("wall_s", "seconds", "train_s", "time", "train_seconds", "eval_s", "wall")


class Ticks:
    """A clock that advances one second per reading: the budget then runs out at a fixed point of the work."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    rows = [{k: v for k, v in r.items() if k not in TIMING} for r in rows]
    # keyed rows as a set (a resumed study plans its remaining runs afresh, so their order may differ)
    return sorted(rows, key=lambda r: r["key"]) if rows and "key" in rows[0] else rows


def _weights(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {str(p.relative_to(run)): load_file(str(p)) for p in sorted(run.rglob("model.safetensors"))}


def _slice(campaign: Path, out: Path, plan=PLAN, clock=None) -> dict:
    s = c.Slice(campaign, out, main, "cpu", clock or c.time.monotonic)
    return c.run_slice(plan, s)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("whole")
    record = _slice(root / "campaign", root / "out")
    assert [r["status"] for r in record["runs"]] == ["done", "done"]
    return root / "campaign"


def test_paused_slices_add_up_to_one_run(uninterrupted, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = tmp_path / "device1"
    ticks = Ticks()
    record = _slice(first, tmp_path / "out1", replace(PLAN, budget_s=40), ticks)
    assert record["runs"][-1]["status"] == "paused", record["runs"]
    paused = [r for r in record["status"] if r["paused_trainings"]]
    assert paused, "the budget ran out inside a training, which left a checkpoint"
    # the next slice runs elsewhere: a fresh directory given what the first slice returned
    here = tmp_path / "here"
    c.merge_slice(tmp_path / "out1", here)
    assert c.snapshot(here).keys() - {".aspan.lock"} >= {k for k in c.snapshot(first) if not k.endswith(".aspan.lock")
                                                        and not k.endswith("report.html")}
    second = _slice(here, tmp_path / "out2")
    assert [r["status"] for r in second["runs"]][-1] == "done"
    assert all(r["state"] == "done" for r in second["status"])
    for name in ("abc", "qk"):
        for rows in ("runs.jsonl", "checks.jsonl", "learning_curves.jsonl"):
            assert _rows(here / name / rows) == _rows(uninterrupted / name / rows), (name, rows)
    got, want = _weights(here / "abc"), _weights(uninterrupted / "abc")
    assert got.keys() == want.keys() and got
    for k in want:
        for t in want[k]:
            assert torch.equal(got[k][t], want[k][t]), (k, t)
    assert not list(here.glob("*/scratch/*")), "no paused training is left once the runs are done"


def test_budget_stops_the_slice_and_status_says_where(tmp_path):
    ticks = Ticks()
    record = _slice(tmp_path / "camp", tmp_path / "out", replace(PLAN, budget_s=12), ticks)
    assert record["runs"] and record["runs"][0]["status"] == "paused"
    assert len(record["runs"]) == 1, "nothing starts after a run paused"
    text = c.format_status(c.status(PLAN, tmp_path / "camp"))
    assert text.splitlines()[0] == "0 of 2 runs done" and "started" in text
    out = json.loads((tmp_path / "out" / "run.json").read_text())
    assert out["parts"] == [c.STATE] and (tmp_path / "out" / c.STATE).is_file()
    assert out["environment"]["device"] == "cpu" and "versions" in out["environment"]


def test_a_run_needing_a_missing_package_is_skipped_with_the_reason(tmp_path):
    plan = replace(PLAN, runs=({"name": "x", "command": ["doctor"], "requires": ["no_such_package_here"]},))
    record = _slice(tmp_path / "camp", tmp_path / "out", plan)
    assert record["runs"] == [{"name": "x", "status": "skipped",
                               "why": "needs no_such_package_here, not installed here"}]


def test_archive_parts_and_hostile_members(tmp_path, monkeypatch):
    """A slice's archive in parts merges back to the campaign it came from; a member outside it is refused
    (tests/applications/test_slice_archive.py tries many more)."""
    from aspan.applications import slice_archive

    camp = tmp_path / "camp"
    (camp / "a").mkdir(parents=True)
    (camp / "a" / "big.bin").write_bytes(torch.randint(0, 255, (3000,), dtype=torch.uint8).numpy().tobytes())
    (camp / "old.txt").write_text("x")
    dest = tmp_path / "dest"
    shutil.copytree(camp, dest)
    before = c.snapshot(camp)
    (camp / "old.txt").unlink()
    (camp / "a" / "new.txt").write_text("new")
    (camp / "a" / "big.bin").write_bytes(b"changed")
    monkeypatch.setattr(slice_archive, "PART_BYTES", 100)
    names = c.pack(camp, before, tmp_path)
    assert len(names) > 1 and all(n.startswith(c.STATE + ".part") for n in names)
    (tmp_path / "run.json").write_text(json.dumps({"parts": names, "started": "2026-01-01T00:00:00Z"}))
    c.merge_slice(tmp_path, dest)
    assert c.snapshot(dest) == c.snapshot(camp)
    monkeypatch.undo()
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / c.STATE).write_bytes(buf.getvalue())
    (tmp_path / "evil" / "run.json").write_text(json.dumps({"parts": [c.STATE], "started": "2026-01-01T00:00:00Z"}))
    with pytest.raises(ValueError, match="not a plain file inside"):
        c.merge_slice(tmp_path / "evil", tmp_path / "dest2")
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "dest2").exists()


@pytest.mark.parametrize("runs, message", [
    ((), "at least one run"),
    (({"name": "a b", "command": ["doctor"]},), "runs\\[0\\].name"),
    (({"name": "a", "command": ["doctor"], "nope": 1},), "unknown key 'nope'"),
    (({"name": "a", "command": ["doctor", "--out", "x"]},), "must not set --out"),
    (({"name": "a", "command": ["doctor"]}, {"name": "a", "command": ["doctor"]}), "used twice"),
])
def test_bad_plans_are_refused_naming_the_key(tmp_path, runs, message):
    path = tmp_path / "plan.toml"
    body = "".join("[[runs]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in r.items()) for r in runs)
    path.write_text("budget_s = 100\n" + body)
    with pytest.raises(UsageError, match=message):
        c.load_plan(path)


def test_the_shipped_plan_loads_and_names_existing_configs():
    plan = c.load_plan("configs/gpu/campaign.toml")
    for e in plan.entries():
        for arg in e.command:
            if arg.endswith(".toml"):
                assert Path(arg).is_file(), (e.name, arg)
    assert [e.name for e in plan.entries()][0] == "abc_paper"
    assert plan.budget_s <= 480


def test_the_shipped_study_configs_resolve(tmp_path, capsys):
    """Every study the plan runs reads its TOML without error (its settings resolved and checked, nothing run)."""
    plan = c.load_plan("configs/gpu/campaign.toml")
    studies = [e for e in plan.entries() if e.command[0] == "study"]
    assert len(studies) >= 4
    for e in studies:
        assert main([*e.command, "--out", str(tmp_path / e.name), "--print-config"]) in (0, None), e.name
        assert "seeds = " in capsys.readouterr().out, e.name
        assert not (tmp_path / e.name).exists()


def test_device_checks_pass_on_cpu():
    from aspan.applications.device_checks import run_checks

    got = run_checks("cpu", ("hooks", "generation", "distributed"))
    assert got["all_ok"], got
    assert got["generation"]["compared_tokens"] > 0 and got["distributed"]["backend"] == "gloo"


def test_the_campaign_readme_quotes_its_rows():
    """Every number results/gpu_campaign/README.md states about the finished successor rows and the device checks
    is recomputed here from the committed rows and slice records."""
    import math

    from scipy import stats

    from aspan.applications.studies.abc_paper import wilson

    root = Path(__file__).resolve().parents[2] / "results" / "gpu_campaign"
    readme = (root / "README.md").read_text()
    rows = [json.loads(x) for x in (root / "state" / "abc_paper" / "runs.jsonl").read_text().splitlines()]
    succ = {(r["condition"], r["seed"]): r for r in rows if r["task"] == "successor"}
    assert len(succ) == 6
    for (condition, _), r in succ.items():
        assert r["n_10"] == 10_000 and f"{r['correct_6'] / 1e4:.4f}" in readme
        if condition == "abc":
            lo, hi = wilson(r["correct_10"], r["n_10"])
            assert f"{r['exact_10']:.4f} [{lo:.4f}, {hi:.4f}]" in readme
            assert f"{r['exact_20']:.4f}" in readme
    for condition in ("vanilla", "abc"):
        steps = ", ".join(str(succ[(condition, s)]["steps"]) for s in (0, 1, 2))
        assert f"| {steps} |" in readme
        for n in (10, 20, 60):
            total = sum(succ[(condition, s)][f"correct_{n}"] for s in (0, 1, 2))
            if total == 0:
                assert "0 / 30,000 [0, 0.0001]" in readme and wilson(0, 30_000)[1] < 0.00015
    ten = [succ[("abc", s)]["exact_10"] for s in (0, 1, 2)]
    mean, se = sum(ten) / 3, stats.sem(ten)
    low = mean - stats.t.ppf(0.975, 2) * se
    assert f"mean {mean:.2f}" in readme and f"[{low:.2f}, 1.0]" in readme and mean + 4.3 * se > 1
    project = (root.parents[1] / "docs" / "studies" / "gpu_campaign.md").read_text()  # its docs page quotes the claim
    six = sorted(succ[("vanilla", s)]["exact_6"] for s in (0, 1, 2))
    assert f"({six[0]:.4f}-{six[-1]:.4f} exact at 6 digits)" in project
    assert f"ABC reaches\n{min(ten):.2f}-{max(ten):.2f} at 10 digits" in project
    assert f"at most {max(succ[('abc', s)]['exact_20'] for s in (0, 1, 2)):.3f} at 20" in project
    checked = [json.loads(x) for x in (root / "state" / "abc_paper" / "checks.jsonl").read_text().splitlines()]
    flat = " ".join(readme.split())
    runs = {}  # per training, the wall time between consecutive ID checks (250 steps and one check each)
    for a, b in zip(checked, checked[1:]):
        if (a["task"], a["condition"], a["seed"]) == (b["task"], b["condition"], b["seed"]):
            runs.setdefault(a["task"], []).append(b["time"] - a["time"])
    positions = {"successor": 124, "addition": 185}  # BOS and the padded layout of 60 digits
    ms = {t: [1000 * d / 250 for d in v] for t, v in runs.items()}
    rate = {t: [128 * positions[t] * 250 / d for d in v] for t, v in runs.items()}
    assert ", ".join(f"{d:.1f}" for d in runs["successor"][:2]) + f" and {runs['successor'][2]:.1f} s" in flat
    assert f"({min(ms['successor']):.0f}-{max(ms['successor']):.0f} ms a step" in flat
    assert f"{round(min(rate['successor']), -3):,.0f}-{round(max(rate['successor']), -3):,.0f} tokens/s" in flat
    assert f"{runs['addition'][0]:.1f} s on the addition base ({ms['addition'][0]:.0f} ms a step" in flat
    assert f"{round(rate['addition'][0], -3):,.0f} tokens/s" in flat and "240,000" not in flat
    slice1 = json.loads((root / "slices" / "slice-2026-11-27T081839Z.json").read_text())
    checks = slice1["checks"]
    assert checks["all_ok"] and slice1["environment"]["device"] == "cuda:0 (NVIDIA H200)"
    assert f"{checks['hooks']['max_abs_diff']:.1e}" in readme and f"{checks['hooks']['rows']} rows" in readme
    assert f"{checks['generation']['compared_tokens']} tokens compared" in readme
    t = checks["training"]
    assert f"{t['aspan_tokens_per_s']:,.0f}" in readme and f"{t['plain_tokens_per_s']:,.0f}" in readme
    assert f"**{t['aspan_over_plain']:.2f}x**" in readme and checks["distributed"]["backend"] == "nccl"
    assert f"{slice1['wall_s']:.1f} s wall" in readme and math.isclose(slice1["checks_s"], 23.71)


def test_the_command_line_status_and_a_bad_budget(capsys, tmp_path):
    root = Path(__file__).resolve().parents[2]
    plan = c.load_plan(root / "configs" / "gpu" / "campaign.toml")
    assert main(["gpu", "status", "--plan", str(root / "configs/gpu/campaign.toml"),
                 "--campaign", str(root / "results/gpu_campaign/state")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(f"of {len(plan.runs)} runs done")
    assert [line.split()[0] for line in lines[1:-1]] == [e.name for e in plan.entries()]
    assert lines[-1].startswith("GPU minutes: ") and "loan(s)" in lines[-1]
    assert main(["gpu", "slice", "--out", str(tmp_path / "o"), "--budget", "10", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--budget must exceed the plan's reserve_s" in err[0]
    assert not (tmp_path / "o").exists()
