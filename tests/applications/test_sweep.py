"""`aspan.applications.sweep.run_sweep_dir`: the sweep a notebook calls is the one `aspan sweep` runs, and the
command only parses its flags and calls it."""
import ast
import json
from pathlib import Path

from aspan.applications.sweep import SweepRun, format_selection, run_sweep_dir
from aspan.cli import main
from aspan.experiments.sweep import SweepConfig, grid

ROOT = Path(__file__).resolve().parents[2]
# what the run-time work needs; a command that only parses and calls an application imports none of it
WORK = ("aspan.io", "aspan.models", "aspan.environment", "aspan.viz", "aspan.evaluation", "aspan.experiments.engine",
        "aspan.experiments.ranking")


def imported(path: Path) -> set[str]:
    """The absolute module names `path` imports anywhere (relative imports from aspan/commands resolved)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = {0: "", 1: "aspan.commands", 2: "aspan"}[node.level]
            found.add(".".join(filter(None, (base, node.module))))
    return found


def test_the_sweep_and_rank_commands_only_parse_and_call_their_application():
    for name in ("sweep", "rank"):
        mods = imported(ROOT / "aspan" / "commands" / f"{name}.py")
        assert f"aspan.applications.{name}" in mods
        assert sorted(m for m in mods if m.startswith(WORK)) == [], name


def test_a_notebook_runs_the_sweep_the_command_runs(ckpt, tmp_path, capsys):
    raw = {"model": str(ckpt), "task": "reversal", "split": "ood", "task_params": {"length": [11, 12]},
           "n_samples": 2, "seeds": [0], "batch_size": 2, "strengths": [0.5, 3.0], "device": "cpu",
           "heads": {"list": [[0, 0]]}}
    config = SweepConfig.from_dict(raw)
    summary = run_sweep_dir(config, tmp_path / "api", SweepRun(id_budget=1.0, progress=False))
    assert summary["complete"] and summary["rows"] == len(grid(config)) == 2
    assert summary["selection"]["rule"] and capsys.readouterr().out == ""  # a library call prints nothing
    assert json.loads((tmp_path / "api" / "summary.json").read_text())["selection"] == json.loads(
        json.dumps(summary["selection"]))
    toml = tmp_path / "c.toml"
    toml.write_text(f'model = "{ckpt}"\ntask = "reversal"\nsplit = "ood"\ntask_params = {{length = [11, 12]}}\n'
                    'n_samples = 2\nseeds = [0]\nbatch_size = 2\nstrengths = [0.5, 3.0]\ndevice = "cpu"\n'
                    '[heads]\nlist = [[0, 0]]\n')
    assert main(["sweep", "--config", str(toml), "--out", str(tmp_path / "cli"), "--id-budget", "100", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == format_selection(summary["selection"])  # the command prints the choice
    assert format_selection(summary["selection"]).startswith("selection rule: ")
    rows = {p: [{k: v for k, v in json.loads(line).items() if k != "seconds"}
                for line in (tmp_path / p / "sweep.jsonl").read_text().splitlines()] for p in ("api", "cli")}
    assert rows["api"] == rows["cli"]
    again = run_sweep_dir(config, tmp_path / "cli", SweepRun(id_budget=1.0, progress=False))  # resumed: no new row
    assert again["rows"] == 2 and again["selection"] == summary["selection"]
