"""Every command only parses: `aspan/commands/*` imports (at module level and inside functions, read by `ast`)
nothing but the standard library, the other command modules, the parsing and settings helpers and
`aspan.applications`, which does the work; and an application called from Python writes what its command writes."""
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from aspan import cli
from aspan.applications.abc import ABCRun, abc_run
from aspan.applications.eval import EvalRun, run_eval

from ..test_layering import GRAPH

PARSING = ("aspan.commands", "aspan.applications", "aspan.options", "aspan.errors", "aspan.config",
           "aspan.tasks",  # task facts for choices and parameters (torch-free; tasks import only themselves)
           "aspan.checks",  # the validators behind the argument types (aspan/commands/argtypes.py)
           "aspan.shipped")  # config names and model names, resolved and checked while parsing
# commands that still import more than that, and what (the settings dataclasses they build, or work not moved yet)
PENDING = {
    "aspan.commands.train": {"aspan.training", "aspan.curves"},  # TrainConfig, the curve settings
    "aspan.commands.rank": {"aspan.methods"},  # the edit methods' names and default strengths, for --help
    "aspan.commands.doctor": {"aspan.environment"},  # one library call: the environment record
    "aspan.commands.report": {"aspan.report"},  # one library call: the report page or its images
    "aspan.commands.parser": {"aspan"},  # the version `aspan --version` prints
    # not a command: the main module of a worker process (`aspan gpu slice`'s units at once), which runs `aspan.cli`
    # under a time budget
    "aspan.commands.gpu_worker": {"aspan.cli", "aspan.training.budget"},
}


def outside(module: str) -> set[str]:
    """What `module` imports beyond the standard library and `PARSING`."""
    return {d for d in GRAPH[module] if d.split(".")[0] not in sys.stdlib_module_names
            and not any(d == p or d.startswith(p + ".") for p in PARSING)}


def test_every_command_imports_only_parsing_helpers_and_its_application():
    commands = [m for m in GRAPH if m.startswith("aspan.commands.")]
    assert {"aspan.commands.eval", "aspan.commands.abc", "aspan.commands.data"} <= set(commands)
    assert {m: sorted(outside(m) - PENDING.get(m, set())) for m in commands if outside(m) - PENDING.get(m, set())} == {}


def test_a_notebook_evaluates_what_the_eval_command_evaluates(ckpt, tmp_path, capsys):
    argv = [str(ckpt), "--split", "id", "-n", "6", "--heads", "1.0", "--buckets", "1-2,3-4", "--threads", "1"]
    assert cli.main(["eval", *argv, "--out", str(tmp_path / "cli")]) == 0
    tables = run_eval(EvalRun(str(ckpt), split="id", samples=6, heads="1.0", buckets="1-2,3-4", threads=1,
                              run_dir=str(tmp_path / "call")))
    assert tables["by_bucket"].n.tolist() == [6, 6]
    records = [pd.read_json(tmp_path / d / "records.jsonl", lines=True) for d in ("cli", "call")]
    assert len(records[0]) > 12 and records[0].equals(records[1])
    summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("cli", "call")]
    assert summaries[0] == summaries[1]
    runs = [json.loads((tmp_path / d / "run.json").read_text()) for d in ("cli", "call")]
    assert runs[0] == runs[1] and runs[0]["heads"] == [[1, 0]]
    assert all((tmp_path / d / "figures" / "by_bucket.json").exists() for d in ("cli", "call"))


def test_a_notebook_biases_what_the_abc_command_biases(ckpt, tmp_path, capsys):
    argv = [str(ckpt), "--task", "reversal", "--abs", "anti:1:0", "--heads", "1.0,1.1", "--id-samples", "3",
            "--ood-samples", "3", "--ood-param", "length=11-12", "--device", "cpu", "--quiet"]
    assert cli.main(["abc", *argv, "--out", str(tmp_path / "cli")]) == 0
    summary = abc_run(ABCRun(str(ckpt), "reversal", abs="anti:1:0", heads="1.0,1.1", id_samples=3, ood_samples=3,
                             ood_params=("length=11-12",), device="cpu", out=str(tmp_path / "call"), progress=False))
    assert "bias ood exact" in summary and "baseline ood exact" in summary
    for name in ("abc.csv", "abc_lines.jsonl", "summary.json", "run.json", "figures/abc_bias_L1H1.json"):
        assert (tmp_path / "cli" / name).read_text() == (tmp_path / "call" / name).read_text(), name
    assert json.loads((tmp_path / "call" / "summary.json").read_text())["bias ood exact"] == summary["bias ood exact"]


def test_the_applications_hold_their_run_directory(ckpt, tmp_path):
    """`run_eval`, `abc_run`, `run_demo` and `run_pretrained` called from Python claim their run directory as their
    commands do: a directory another job holds is refused (one line naming the holder) before any work."""
    from aspan.applications.demo import DemoConfig, run_demo
    from aspan.applications.pretrained import PretrainedConfig, run_pretrained
    from aspan.config import load_config
    from aspan.io import LOCK, claim_run

    out = tmp_path / "run"
    smoke = Path(__file__).resolve().parents[2] / "configs" / "smollm2_smoke.toml"
    calls = [lambda: run_eval(EvalRun(str(ckpt), samples=2, run_dir=str(out))),
             lambda: abc_run(ABCRun(str(ckpt), "reversal", abs="anti:1:0", id_samples=2, ood_samples=2, device="cpu",
                                    out=str(out), progress=False)),
             lambda: run_demo(DemoConfig.quick_config(out=str(out)), log=lambda *a: None),
             lambda: run_pretrained(load_config(PretrainedConfig, toml_path=smoke, flags={"out": str(out)}),
                                    log=lambda *a: None)]
    with claim_run(out, command="holder job"):
        for call in calls:
            with pytest.raises(ValueError, match=f"run directory {out} is in use by 'holder job'"):
                call()
            assert sorted(p.name for p in out.iterdir()) == [LOCK]


def test_a_notebook_writes_and_shows_the_samples_data_and_show_do(tmp_path, capsys):
    from aspan.applications.data import show_samples, task_preset, write_samples

    flags = ["--task", "reversal", "--split", "ood", "--param", "length=11-13", "--seed", "4"]
    assert cli.main(["data", *flags, "-n", "5", "-o", str(tmp_path / "cli.jsonl")]) == 0
    task = task_preset("reversal", "ood", ["length=11-13"])
    write_samples(task, 5, seed=4, output=str(tmp_path / "call.jsonl"))
    lines = (tmp_path / "call.jsonl").read_text().splitlines()
    assert len(lines) == 5 and (tmp_path / "cli.jsonl").read_text().splitlines() == lines
    capsys.readouterr()
    assert cli.main(["show", *flags, "-n", "2", "--width", "60"]) == 0
    by_cli = capsys.readouterr().out
    shown = "\n".join(show_samples(task, 2, seed=4, width=60, split="ood")) + "\n"
    assert shown == by_cli and by_cli.count("## sample") == 2 and "[ood] seed=4" in by_cli
