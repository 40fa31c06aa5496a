"""A campaign's plan and slice refuse what would run without a deadline, recurse, import code to check a package,
write where nothing ships back, or share a campaign with another slice; a SIGTERM stops a slice with its record and
archive written (exit 143); `aspan gpu status` counts the rows a run writes; log lines are printed once."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from aspan.applications import campaign as c
from aspan.applications import slice_archive
from aspan.cli import main
from aspan.errors import UsageError
from aspan.training import TimeBudget
from tests.cli import ENV, SMALL, aspan
from tests.test_signals import bomb

TRAIN = ["train", *SMALL, "--steps", "6"]


def plan_file(tmp_path: Path, body: str, runs: str = '[[runs]]\nname = "a"\ncommand = ["doctor"]\n') -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(body + "\n" + runs)
    return path


@pytest.mark.parametrize("body, key", [
    ("budget_s = inf", "budget_s"), ("budget_s = nan", "budget_s"), ("budget_s = 1e400", "budget_s"),
    ("budget_s = " + "1" + "0" * 400, "budget_s"), ("checkpoint_s = nan", "checkpoint_s"),
    ("checkpoint_s = inf", "checkpoint_s"), ("reserve_s = -inf", "reserve_s"), ("budget_s = true", "budget_s"),
])
def test_a_plan_without_a_finite_budget_is_refused_naming_the_key(tmp_path, body, key):
    with pytest.raises(UsageError, match=f"{key}") as got:
        c.load_plan(plan_file(tmp_path, body))
    assert "\n" not in str(got.value) and len(str(got.value)) < 300


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_a_budget_flag_without_a_deadline_is_refused(tmp_path, capsys, value):
    plan = plan_file(tmp_path, "budget_s = 100\nreserve_s = 0")
    assert main(["gpu", "slice", "--plan", str(plan), "--campaign", str(tmp_path / "c"), "--out",
                 str(tmp_path / "o"), "--device", "cpu", f"--budget={value}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--budget" in err and "finite" in err, err
    assert not (tmp_path / "c").exists() and not (tmp_path / "o").exists()


@pytest.mark.parametrize("kwargs", [{"deadline": float("nan")}, {"deadline": float("inf")}, {"deadline": 10**400},
                                    {"deadline": 5, "checkpoint_s": float("nan")}, {"deadline": 5, "checkpoint_s": 0},
                                    {"deadline": "5"}])
def test_a_time_budget_needs_finite_numbers(kwargs):
    with pytest.raises(ValueError, match="TimeBudget"):
        TimeBudget(**kwargs)


@pytest.mark.parametrize("run, message", [
    ('command = ["gpu", "slice"]', "must not be `aspan gpu`"),
    ('command = ["-v", "gpu", "status"]', "must not be `aspan gpu`"),
    ('command = ["doctor"]\nrequires = "gguf"', "requires must be a list of module names"),
    ('command = ["doctor"]\nrequires = 5', "requires must be a list of module names"),
    ('command = ["doctor"]\nrequires = [5]', "requires must be a list of module names"),
    ('command = ["doctor"]\nrequires = ["a b"]', "requires must be a list of module names"),
    ('command = ["doctor"]\nclaim = 5', "claim must be text"),
])
def test_bad_runs_are_refused_by_key(tmp_path, run, message):
    with pytest.raises(UsageError, match=f"runs\\[0\\].*{message}"):
        c.load_plan(plan_file(tmp_path, "budget_s = 100", f'[[runs]]\nname = "a"\n{run}\n'))


def test_a_required_package_is_looked_up_without_importing_it(tmp_path, monkeypatch):
    """`importlib.util.find_spec("pkg.sub")` imports `pkg`; the campaign's check imports nothing."""
    pkg = tmp_path / "sideeffect_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').write('x')\n")
    (pkg / "sub" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert c.installed("sideeffect_pkg") and c.installed("sideeffect_pkg.sub")
    assert not c.installed("sideeffect_pkg.nope") and not c.installed("no_such_top_level_package.x")
    assert not c.installed("json.decoder.x") and c.installed("json.decoder")  # a module is not a package
    assert not (tmp_path / "imported").exists() and "sideeffect_pkg" not in sys.modules
    had_this = "this" in sys.modules
    assert not c.installed("this.x")
    assert ("this" in sys.modules) == had_this


def test_out_inside_the_campaign_is_refused(tmp_path, capsys):
    plan = plan_file(tmp_path, "budget_s = 100\nreserve_s = 0\nchecks = []")
    camp = tmp_path / "camp"
    (camp / "a").mkdir(parents=True)
    (camp / "a" / "run.json").write_text("{}")
    for out in (camp, camp / "a", camp / "x" / ".." / "a"):
        assert main(["gpu", "slice", "--plan", str(plan), "--campaign", str(camp), "--out", str(out),
                     "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "inside the campaign directory" in err, err
        with pytest.raises(UsageError, match="inside the campaign"):
            c.run_slice(c.load_plan(plan), c.Slice(camp, out, main, "cpu"))
    assert sorted(p.relative_to(camp).as_posix() for p in camp.rglob("*")) == ["a", "a/run.json"]
    assert (camp / "a" / "run.json").read_text() == "{}"


@pytest.mark.parametrize("command, message", [
    (["eval", "m", "-o", "/tmp/elsewhere.jsonl"], "-o/--output /tmp/elsewhere.jsonl writes outside the campaign"),
    (["data", "--task", "reversal"], "is not a command line the slice can run (aspan: error: unrecognized"),
    (["train", "--no-such-option"], "is not a command line the slice can run"),
    (["train", "--help"], "is not a command line the slice can run"),
])
def test_a_command_that_writes_outside_the_campaign_is_refused(tmp_path, capsys, command, message):
    plan = plan_file(tmp_path, "budget_s = 100\nreserve_s = 0\nchecks = []",
                     f'[[runs]]\nname = "a"\ncommand = {json.dumps(command)}\n')
    assert main(["gpu", "slice", "--plan", str(plan), "--campaign", str(tmp_path / "c"), "--out",
                 str(tmp_path / "o"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs[0].command" in err and message in err, err
    assert not (tmp_path / "c").exists() and not (tmp_path / "o").exists()


def test_an_output_inside_the_campaign_is_allowed(tmp_path):
    from argparse import Namespace

    from aspan.commands.gpu import check_commands

    camp = tmp_path / "c"
    plan = c.CampaignPlan(runs=({"name": "a", "command": ["eval", "m", "-o", str(camp / "a" / "r.jsonl")]},))
    check_commands(plan, Namespace(plan="p.toml", campaign=str(camp), device="cpu"))


def test_a_second_slice_on_a_campaign_is_refused_at_once(tmp_path):
    plan = c.CampaignPlan(runs=({"name": "a", "command": ["doctor"]},), checks=())
    camp = tmp_path / "camp"
    camp.mkdir()
    with slice_archive.campaign_lock(camp, "aspan gpu slice --out first"):
        with pytest.raises(ValueError, match="in use by 'aspan gpu slice --out first'"):
            c.run_slice(plan, c.Slice(camp, tmp_path / "out", main, "cpu"))
    assert not (tmp_path / "out").exists() and list(camp.iterdir()) == []


def test_status_counts_the_rows_each_study_writes(tmp_path):
    """Parity writes rows.jsonl (and its units rows.unit-K.jsonl), the QK and ABC studies runs.jsonl."""
    plan = c.CampaignPlan(runs=(
        {"name": "parity", "command": ["study", "parity", "--quick"]},
        {"name": "qk", "command": ["study", "qk", "--quick"]},
        {"name": "abc", "command": ["--quiet", "study", "abc", "--protocol", "paper"]},
        {"name": "other", "command": ["pretrained", "x.toml"]},
    ))
    for run, files in {"parity": {"rows.jsonl": 2, "rows.unit-1.jsonl": 3, "runs.jsonl": 7},
                       "qk": {"runs.jsonl": 4, "learning_curves.jsonl": 9}, "abc": {"runs.jsonl": 1}}.items():
        (tmp_path / run).mkdir()
        for name, n in files.items():
            (tmp_path / run / name).write_text('{"k": 1}\n' * n + "\n")
    rows = {r["name"]: r["rows"] for r in c.status(plan, tmp_path)}
    assert rows == {"parity": 5, "qk": 4, "abc": 1, "other": 0}


def test_sigterm_stops_a_slice_checkpointed_with_its_record_and_archive(tmp_path):
    """The signal arrives in the first run's third training step: that run saves its step and stops, the second run
    never starts, run.json and the archive are written, and the slice exits 143."""
    runs = "".join(f'[[runs]]\nname = "{n}"\ncommand = {json.dumps(TRAIN)}\n' for n in ("t1", "t2"))
    plan = plan_file(tmp_path, "budget_s = 10000\nreserve_s = 0\nchecks = []", runs)
    r = aspan("gpu", "slice", "--plan", str(plan), "--campaign", "camp", "--out", "out", "--device", "cpu",
              cwd=tmp_path, code=bomb("aspan.training.loop._train_step", at=3))
    assert r.returncode == 143, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "aspan gpu: terminated (SIGTERM)" in r.stderr, r.stderr[-3000:]
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["stopped"] == "SIGTERM"
    assert [(x["name"], x["status"], x["signal"]) for x in record["runs"]] == [("t1", "stopped", "SIGTERM")]
    archive = slice_archive.read_archive(tmp_path / "out", slice_archive.read_record(tmp_path / "out"))
    assert archive.latest == {"t1": 3} and not any(n.startswith("t2/") for n in archive.files)
    c.merge_slice(tmp_path / "out", tmp_path / "here")
    assert (tmp_path / "here" / "t1" / "checkpoints" / "latest").read_text().strip() == "step-00000003"
    assert not (tmp_path / "here" / "t1" / c.DONE).exists()


def test_python_m_aspan_cli_prints_each_log_line_once(tmp_path):
    """`make gpu` runs `python -m aspan.cli gpu slice`: the commands it runs log through the same one handler."""
    train = [a for a in TRAIN if a != "--quiet"]
    plan = plan_file(tmp_path, "budget_s = 10000\nreserve_s = 0\nchecks = []",
                     f'[[runs]]\nname = "t"\ncommand = {json.dumps(train)}\n')
    r = aspan("gpu", "slice", "--plan", str(plan), "--campaign", "camp", "--out", "out", "--device", "cpu",
              cwd=tmp_path, env={**ENV, "ASPAN_TEST_FRESH": "1"})  # a fresh `python -m aspan.cli`
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.strip() and "%|" not in line]  # not the progress bar
    assert any(line.startswith("trainable parameters") for line in lines), lines
    assert any(line == "aspan gpu slice: t: done" for line in lines), lines
    assert len(lines) == len(set(lines)), f"a line printed twice: {lines}"


def test_the_shipped_plan_passes_the_command_checks():
    from argparse import Namespace

    from aspan.commands.gpu import CAMPAIGN, PLAN, check_commands

    check_commands(c.load_plan(PLAN), Namespace(plan=PLAN, campaign=CAMPAIGN, device="cpu"))
