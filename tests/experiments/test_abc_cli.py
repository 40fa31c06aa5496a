"""`aspan abc` end to end on a tiny checkpoint (ABS, since a random model interpolates nothing) and its input checks."""
import json

import pandas as pd
import pytest

from aspan.cli import main


def test_abs_cli_with_finetune(ckpt, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["abc", str(ckpt), "--task", "reversal", "--abs", "anti:1:0", "--id-samples", "3", "--ood-samples", "3",
               "--ood-param", "length=11-12", "--finetune-steps", "2", "--finetune-batch-size", "2", "--device", "cpu",
               "--out", str(out), "--quiet"])
    assert rc == 0
    table = pd.read_csv(out / "abc.csv")
    assert set(table.variant) == {"baseline", "bias", "bias+finetune", "finetune (no bias)"}
    lines = pd.read_json(out / "abc_lines.jsonl", lines=True)
    assert len(lines) == 8 and (lines.direction == "anti").all() and all(l == [1] for l in lines.lines)
    s = json.loads((out / "summary.json").read_text())
    assert "bias ood exact" in s and json.loads((out / "run.json").read_text())["method"] == "ABS"
    assert (out / "figures" / "abc_length_ood.json").exists()


def test_abc_cli_refuses_a_model_that_does_not_interpolate(ckpt, tmp_path, capsys):
    rc = main(
        [
            "abc",
            str(ckpt),
            "--task",
            "reversal",
            "--id-samples",
            "3",
            "--ood-samples",
            "2",
            "--ood-param",
            "length=11-12",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "r"),
            "--quiet",
        ]
    )
    assert rc == 2 and "interpolates" in capsys.readouterr().err


@pytest.mark.parametrize("argv, msg", [
    (["--abs", "up:1:0"], "--abs"),
    (["--abs", "anti:x"], "--abs"),
    (["--directions", "diagonal,sideways"], "--directions"),
    (["--lambda", "-1"], "--lambda"),
    (["--heads", "9.0"], "layer 9"),
    (["--ood-param", "length=5-2"], "length"),
])
def test_abc_cli_bad_input(ckpt, tmp_path, capsys, argv, msg):
    assert main(["abc", str(ckpt), "--task", "reversal", *argv, "--device", "cpu", "--out", str(tmp_path / "r")]) == 2
    assert msg in capsys.readouterr().err
