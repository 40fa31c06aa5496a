"""`aspan train`: a short run end to end, resume, fine-tuning from --data, and clear errors before any work."""
import json

import pandas as pd
import pytest
import torch

from aspan import cli, models, tasks
from aspan.param_groups import group_masks, live_parameters
from aspan.tokenization import CharTokenizer

SMALL = ["--task", "reversal", "--param", "length=1-3", "--param", "charset=abcd", "--d-model", "32", "--n-heads", "4",
         "--batch-size", "8", "--eval-samples", "8", "--quiet", "--threads", "1"]


def test_train_then_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", *SMALL, "--steps", "4", "--eval-every", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "step 4: loss" in text and "ood: exact" in text
    ev = pd.read_json(out / "eval.jsonl", lines=True)
    # the training distribution (lengths 1-3) is not the ID preset (1-10): both are evaluated, each by its name
    assert sorted(zip(ev.step, ev.split)) == [(2, "id"), (2, "ood"), (2, "train"), (4, "id"), (4, "ood"), (4, "train")]
    loaded = models.load(out, device="cpu")
    assert loaded.meta["task"] == "reversal" and loaded.meta["params"]["charset"] == "abcd"
    assert loaded.model.cfg.n_ctx >= models.check_context(10**6, tasks.preset("reversal", "ood"))
    run = json.loads((out / "run.json").read_text())
    assert run["command"] == "train" and run["config"]["steps"] == 4
    # resuming a finished run with more steps continues from step 4
    assert cli.main(["train", *SMALL, "--steps", "6", "--out", str(out), "--resume"]) == 0
    log = pd.read_json(out / "log.jsonl", lines=True)
    assert log.step.tolist()[-1] == 6 and models.load(out, device="cpu").meta["step"] == 6
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["steps"] == 6 and run["resumes"] == [
        {"from_step": 4, "steps_before": 4, "epochs_before": 1, "steps": 6, "epochs": 1}]


def test_named_evaluations_buckets_and_replay(tmp_path, capsys):
    """--param length=11-20 trains on 11-20; `id` still means the ID preset (1-10), buckets get their own samples."""
    base = tmp_path / "base"
    small = ["--task", "reversal", "--param", "charset=abcd", "--d-model", "32", "--n-heads", "4", "--batch-size", "8",
             "--quiet", "--threads", "1", "--eval-samples", "8"]
    assert cli.main(["train", *small, "--steps", "1", "--out", str(base)]) == 0
    ft = tmp_path / "ft"
    argv = ["train", *small, "--init", str(base), "--param", "length=11-20", "--steps", "2", "--replay", "0.5",
            "--buckets", "1-10,11-20,21-30", "--train-only", "qk-pair:1", "--out", str(ft)]
    assert cli.main(argv) == 0
    assert f"trainable parameters: {2 * 2 * 2 * 4 * 32:,} of" in capsys.readouterr().out  # printed even with --quiet
    ev = pd.read_json(ft / "eval.jsonl", lines=True)
    assert list(ev.split) == ["train", "id", "ood", "length 1-10", "length 11-20", "length 21-30"]
    meta = models.load(ft, device="cpu").meta
    assert meta["params"]["length"] == [11, 20] and meta["id_params"]["length"] == [1, 10] and meta["replay"] == 0.5
    assert meta["trainable_parameters"]["trainable"] == 2 * 2 * 2 * 4 * 32  # 2 columns of W_Q, W_K; 2 layers, 4 heads
    log = pd.read_json(ft / "log.jsonl", lines=True)
    assert log.kind.tolist()[0] == "params" and 0 < log.fraction[0] < 0.1
    fig = json.loads((ft / "figures" / "eval_exact.json").read_text())
    assert sorted(t["name"] for t in fig["data"]) == sorted(f"split={s}" for s in ev.split.unique())


def test_finetune_from_data_file_with_qk_column(tmp_path, capsys):
    base = tmp_path / "base"
    assert cli.main(["train", *SMALL, "--steps", "2", "--out", str(base)]) == 0
    data = tmp_path / "d.jsonl"
    samples = tasks.get("reversal", length=(4, 5), charset="abcd").generate(6)
    data.write_text("".join(s.to_json() + "\n" for s in samples))
    ft = tmp_path / "ft"
    rc = cli.main(["train", "--data", str(data), "--init", str(base), "--finetune", "--train-only", "qk-column:1",
                   "--eval-samples", "0", "--quiet", "--out", str(ft)])
    assert rc == 0
    a, b = models.load(base, device="cpu").model, models.load(ft, device="cpu").model
    masks = group_masks(a, "qk-column:1")  # either backend (the bridge's masks are checked against W_Q/W_K elsewhere)
    live = live_parameters(b)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        if name in masks:
            assert torch.equal(p[~masks[name]], q[~masks[name]]) and (p != q)[masks[name]].float().mean() > 0.9
        elif name in live:
            assert torch.equal(p, q), name
    log = pd.read_json(ft / "log.jsonl", lines=True)
    assert log.step.max() == 2  # one epoch of 6 samples at the paper's batch size 4


@pytest.mark.parametrize("extra, message", [
    (["--task", "nope"], "unknown task"),
    (["--task", "reversal", "--n-ctx", "20"], "context too short"),
    (["--task", "reversal", "--init", "/no/such/ckpt"], "no model at"),
    (["--task", "reversal", "--param", "size=3"], "unknown parameter"),
    (["--task", "reversal", "--train-only", "mlp:3"], "takes no index"),
    (["--task", "reversal", "--train-only", "qk-pair:99"], "out of range"),
    (["--task", "reversal", "--finetune"], "needs --init"),
    (["--task", "reversal", "--finetune", "--init", "reversal"], "needs --steps"),
])
def test_errors_before_work(tmp_path, capsys, extra, message):
    argv = ["train", *extra, "--d-model", "32", "--n-heads", "4", "--quiet", "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_tokenizer_that_cannot_encode_the_task(tmp_path, capsys):
    tok = CharTokenizer("ab=")
    models.save(models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=128), tmp_path / "m", tok)
    assert cli.main(["train", "--task", "reversal", "--init", str(tmp_path / "m"), "--out", str(tmp_path / "o")]) == 2
    assert "cannot encode" in capsys.readouterr().err


def test_curves_by_default_and_a_plateau_stop_recorded_in_run_json(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", *SMALL, "--steps", "3", "--out", str(out)]) == 0
    curves = pd.read_json(out / "curves.jsonl", lines=True)  # the evaluation sets, at the start and the end
    assert sorted(zip(curves.step, curves.bucket)) == [(s, b) for s in (0, 3) for b in ("id", "ood", "train")]
    assert json.loads((out / "run.json").read_text())["stop"]["reason"] == "cap"
    stopped = tmp_path / "stopped"
    argv = ["train", *SMALL, "--steps", "40", "--lr", "1e-7", "--curve-every", "2", "--curve-buckets", "1-1,2-3",
            "--stop", "plateau", "--stop-bucket", "2-3", "--target", "0.9", "--out", str(stopped)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "learning curves every 2 steps in curves.jsonl, " in printed and "ended at step 6 (plateau)" in printed
    stop = json.loads((stopped / "run.json").read_text())["stop"]
    assert {k: stop[k] for k in ("reason", "step", "bucket", "curve_every", "steps_to_target")} == {
        "reason": "plateau", "step": 6, "bucket": "length 2-3", "curve_every": 2, "steps_to_target": None}
    assert pd.read_json(stopped / "curves.jsonl", lines=True).step.max() == 6
    assert models.load(stopped, device="cpu").meta["step"] == 6
    assert cli.main(["report", str(stopped)]) == 0
    assert 'id="figure-learning_curves"' in (stopped / "report.html").read_text()
