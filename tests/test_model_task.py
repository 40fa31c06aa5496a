"""A model knows the task it was trained on: `models.load` records it on the model, and `evaluate`, `aspan eval` and
the experiment engine (`aspan sweep`) refuse samples of another task in one line naming both tasks, unless asked
(`any_task=True`, `--any-task`, `any_task = true`). Fine-tuning on another task makes that task the model's."""
import json

import pytest

from aspan import models, tasks
from aspan.errors import UsageError
from aspan.evaluation import evaluate
from aspan.experiments.engine import Data, Engine
from aspan.models.checkpoint import saved_task
from aspan.models.trained import TrainedTask, record_task, trained_task
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig, train

from .cli import aspan, one_line

SWEEP = """model = "reversal"
task = "addition"
n_samples = 2
strengths = [1.0]

[heads]
list = [[1, 0]]
"""


def test_a_loaded_checkpoint_records_its_training_task_and_an_unnamed_one_none(tmp_path):
    model = models.load("reversal", device="cpu").model
    assert trained_task(model) == TrainedTask("reversal")
    assert trained_task(model).lengths == (1, 10) and trained_task(model).layout is None
    assert saved_task("reversal") == TrainedTask("reversal")  # from the metadata, without loading
    tok = CharTokenizer(tasks.get("addition").alphabet)
    tiny = models.tiny(tok, n_layers=1, d_model=16, n_heads=2, n_ctx=64)
    assert trained_task(tiny) is None  # built here, trained on nothing
    padded = tasks.get("addition", digits=(1, 3), layout="padded", width=3)
    for hf, meta, want in ((None, {}, None), (False, {"task": "addition", "params": padded.params()}, "padded")):
        models.save(tiny, tmp_path / str(hf), tok, hf=hf, **meta)
        loaded = trained_task(models.load(tmp_path / str(hf), device="cpu").model)
        assert (loaded and loaded.layout) == want and saved_task(tmp_path / str(hf)) == loaded
    assert trained_task(models.load(tmp_path / "False", device="cpu").model).lengths == (1, 3)


def test_evaluate_refuses_samples_of_another_task_or_layout_before_any_forward():
    model, tok, _ = models.load("reversal", device="cpu")
    forwards = []
    model.blocks[0].attn.hook_pattern.add_hook(lambda x, hook: forwards.append(1))
    addition = tasks.get("addition", digits=(1, 2)).generate(4, seed=0)
    with pytest.raises(UsageError, match=r"evaluate: samples of task 'addition', but the model was trained on task "
                                         r"'reversal' \(pass any_task=True"):
        evaluate(model, tok, tasks.get("reversal").generate(3, seed=0) + addition)
    assert not forwards
    assert evaluate(model, tok, addition, any_task=True, attn=False).summary()["n"] == 4 and forwards
    record_task(model, TrainedTask("addition", tasks.get("addition").params()))  # lsd, the default layout
    padded = tasks.get("addition", digits=(1, 2), layout="padded", width=2).generate(2, seed=0)
    with pytest.raises(UsageError, match=r"layout 'padded', but the model was trained on 'addition' in layout 'lsd'"):
        evaluate(model, tok, padded)
    assert evaluate(model, tok, addition, attn=False).summary()["n"] == 4
    record_task(model, None)  # a model naming no task (pretrained) is never restricted
    assert evaluate(model, tok, padded, attn=False).summary()["n"] == 2


def test_eval_command_refuses_another_task_unless_asked(tmp_path):
    out, run = tmp_path / "records.jsonl", tmp_path / "run"
    r = aspan("eval", "reversal", "--task", "addition", "-n", "4", "-o", str(out), "--out", str(run), cwd=tmp_path)
    assert r.returncode == 2 and not out.exists() and not run.exists()
    one_line(r.stderr, "--task addition", "'addition'", "'reversal'", "--any-task")
    r = aspan("eval", "reversal", "--task", "addition", "-n", "4", "--no-attn", "--any-task", "--out", str(run),
              cwd=tmp_path)
    assert r.returncode == 0 and "addition ood (teacher, n=4)" in r.stdout, r.stderr
    recorded = json.loads((run / "run.json").read_text())
    assert (recorded["task"], recorded["any_task"]) == ("addition", True)  # the run says it was another task


def test_sweep_refuses_another_task_before_touching_the_run_directory(tmp_path):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(SWEEP)
    r = aspan("sweep", "--config", str(cfg), "--out", str(tmp_path / "run"), "--quiet", cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "run").exists()
    one_line(r.stderr, str(cfg), "'addition'", "'reversal'", "any_task = true")
    model, tok, _ = models.load("reversal", device="cpu")
    with pytest.raises(UsageError, match="experiment engine: samples of task 'addition'"):
        Engine(model, tok, Data("addition", n=2))
    assert Engine(model, tok, Data("addition", n=2), any_task=True).data.task == "addition"
    cfg.write_text("any_task = 1\n" + SWEEP)
    r = aspan("sweep", "--config", str(cfg), "--out", str(tmp_path / "run"), "--quiet", cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "run").exists()
    one_line(r.stderr, "sweep config: any_task: must be true or false")


def test_fine_tuning_on_another_task_makes_it_the_models_task(tmp_path):
    model, tok, _ = models.load("reversal", device="cpu")
    addition = tasks.get("addition", digits=(1, 2))
    train(model, tok, addition, TrainConfig.finetune(steps=1, batch_size=2, eval_samples=0), progress=False)
    assert trained_task(model) == TrainedTask("addition") and trained_task(model).lengths == (1, 2)
    out = tmp_path / "ft"
    r = aspan("train", "--init", "reversal", "--task", "addition", "--param", "digits=1-2", "--steps", "1",
              "--batch-size", "2", "--eval-samples", "0", "--quiet", "--threads", "1", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert saved_task(out) == TrainedTask("addition") and saved_task(out).lengths == (1, 2)
    r = aspan("eval", str(out), "--task", "reversal", "-n", "2", cwd=tmp_path)
    assert r.returncode == 2
    one_line(r.stderr, "'reversal'", "trained on task 'addition'")
    r = aspan("eval", str(out), "-n", "2", "--no-attn", cwd=tmp_path)
    assert r.returncode == 0 and "addition ood" in r.stdout, r.stderr


def test_rank_and_abc_refuse_another_task_before_loading(tmp_path):
    for args, words in ((["rank", "reversal", "--task", "addition", "-n", "4"], ["--any-task"]),
                        (["abc", "reversal", "--task", "addition", "--id-samples", "4", "--ood-samples", "4"],
                         ["ABC calibrates"])):
        r = aspan(*args, "--out", str(tmp_path / "out"), "--quiet", cwd=tmp_path)
        assert r.returncode == 2 and not (tmp_path / "out").exists(), r.stderr
        one_line(r.stderr, "--task", "'addition'", "trained on task 'reversal'", *words)
    r = aspan("rank", "reversal", "--task", "addition", "-n", "4", "--any-task", "--out", str(tmp_path / "out"),
              "--quiet", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "out" / "ranking.csv").is_file(), r.stderr
