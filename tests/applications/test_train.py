"""`aspan.applications.train.train_run`: the training a notebook calls is the one `aspan train` runs, and the command
only parses its flags and calls it."""
import json
from pathlib import Path

import pandas as pd
import pytest

from aspan import cli, models
from aspan.applications.train import TrainRun, train_run
from aspan.training import TrainConfig

from .test_sweep import WORK, imported

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--task", "reversal", "--param", "length=1-3", "--param", "charset=abcd", "--d-model", "32", "--n-heads", "4",
         "--batch-size", "8", "--eval-samples", "8", "--quiet", "--threads", "1", "--steps", "3", "--seed", "2"]


def test_the_train_command_only_parses_and_calls_its_application():
    mods = imported(ROOT / "aspan" / "commands" / "train.py")
    assert "aspan.applications.train" in mods
    assert sorted(m for m in mods if m.startswith((*WORK, "aspan.buckets", "aspan.tokenization"))) == []
    # its ~45 flags, their examples, and two short functions: the settings (through the application) and the call
    assert (ROOT / "aspan" / "commands" / "train.py").read_text().count("\n") < 135


def test_a_notebook_trains_the_model_the_command_trains(tmp_path, capsys):
    by_cli, by_call = tmp_path / "cli", tmp_path / "call"
    assert cli.main(["train", *SMALL, "--out", str(by_cli)]) == 0
    run = TrainRun(train=TrainConfig.scratch(steps=3, batch_size=8, eval_samples=8, seed=2), task="reversal",
                   params=("length=1-3", "charset=abcd"), d_model=32, n_heads=4, threads=1, progress=False)
    result = train_run(run, str(by_call))
    assert result.history[-1]["step"] == 3
    logs = [pd.read_json(d / "log.jsonl", lines=True) for d in (by_cli, by_call)]
    losses = [log[log.kind == "train"].loss.tolist() for log in logs]
    assert losses[0] == losses[1] != []
    a, b = (json.loads((d / "run.json").read_text()) for d in (by_cli, by_call))
    assert {k: a[k] for k in ("task", "params", "config", "seed")} == {k: b[k] for k in ("task", "params", "config",
                                                                                         "seed")}
    assert models.load(by_call, device="cpu").meta["params"]["charset"] == "abcd"


@pytest.mark.parametrize("run, message", [
    (TrainRun(task="reversal", finetune=True), "needs --init"),
    (TrainRun(task="reversal", replay=1.0), "[0, 1)"),
    (TrainRun(task="reversal", buckets="5-1"), "5-1"),
    (TrainRun(task="reversal", params=("colour=red",)), "unknown parameter 'colour'"),
])
def test_bad_settings_are_refused_before_the_run_directory(tmp_path, run, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
        train_run(run, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
