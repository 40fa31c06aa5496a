"""A resume continues only the run its checkpoint holds: a checkpoint whose settings or step were edited after it was
written is refused (a digest saved with the training state), non-finite weights or optimiser moments are named as a
corrupt checkpoint (not blamed on the learning rate), the settings a resume may change still change, and
`train_resumable` never clears a directory it did not make."""
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from aspan import cli, models, tasks
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig, latest_checkpoint, read_state, train, train_resumable
from aspan.training.state import SCRATCH_MARKER
from tests.cli import SMALL, aspan, one_line

STEP4 = "step-00000004"


def tree(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("base") / "run"
    assert cli.main(["train", *SMALL, "--steps", "4", "--out", str(out)]) == 0
    return out


@pytest.fixture
def run(finished, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2))


# ------------------------------------------------------------------------------------ edited settings or step
TOK = CharTokenizer()
TASK = tasks.get("reversal", length=(1, 3), charset="abcd")


def tiny():
    return models.tiny(TOK, n_layers=1, n_heads=2, d_model=16, n_ctx=32, seed=0, device="cpu")


def cfg(**kw):
    return TrainConfig.scratch(**{"steps": 3, "batch_size": 4, "warmup": 0, "device": "cpu", **kw})


@pytest.fixture(scope="module")
def paused_base(tmp_path_factory) -> Path:
    """A 6-step run paused (checkpointed) after step 4, made once through the library; tests work on copies."""
    out = tmp_path_factory.mktemp("paused") / "run"
    train(tiny(), TOK, TASK, cfg(steps=6), out_dir=out, progress=False, stop_after=4)
    return out


@pytest.fixture
def paused(paused_base, tmp_path) -> Path:
    out = tmp_path / "paused"
    shutil.copytree(paused_base, out)
    return out


@pytest.mark.parametrize("file,change,settings", [
    # the checkpoint's recorded training settings edited to match new ones (the check against them then passes)
    ("config.json", lambda d: d["meta"]["train_config"].update(lr=0.5), {"lr": 0.5}),
    ("config.json", lambda d: d["meta"]["train_config"].update(weight_decay=0.0), {"weight_decay": 0.0}),
    ("config.json", lambda d: d["meta"].update(step=2), {}),
    # the training state's own copy of the settings, its schedule or its step rewritten
    ("train_state.json", lambda d: d["state"]["config"].update(lr=0.5), {"lr": 0.5}),
    ("train_state.json", lambda d: d["state"]["scheduler"].update(last_epoch=1), {}),
    ("train_state.json", lambda d: d["state"].update(step=2), {}),
])
def test_an_edited_checkpoint_is_refused(paused, file, change, settings):
    ckpt = paused / "checkpoints" / STEP4
    edit_json(ckpt / file, change)
    before = tree(paused)
    with pytest.raises(ValueError) as e:
        train(tiny(), TOK, TASK, cfg(steps=6, **settings), out_dir=paused, resume=True, progress=False)
    message = str(e.value)
    assert str(ckpt) in message and "\n" not in message
    assert "changed after it was written" in message or "an edited step" in message, message
    assert tree(paused) == before


def test_an_edited_checkpoint_is_one_line_on_the_command_line(run, tmp_path):
    ckpt = run / "checkpoints" / STEP4
    edit_json(ckpt / "train_state.json", lambda d: d["state"]["optimizer"]["param_groups"][0].update(lr=0.5))
    before = tree(run)
    r = aspan("train", *SMALL, "--steps", "6", "--out", str(run), "--resume", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    one_line(r.stderr, str(ckpt), "changed after it was written")
    assert tree(run) == before


def test_a_rewritten_step_is_refused_even_with_its_digest_recomputed(paused):
    """The step is also checked against the checkpoint's name (which the digest does not cover)."""
    from aspan.training.state import _digest

    ckpt = paused / "checkpoints" / STEP4
    doc = json.loads((ckpt / "train_state.json").read_text())
    doc["state"]["step"] = 3
    doc["digest"] = _digest(doc["state"], ckpt)
    (ckpt / "train_state.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"says step 3, but its checkpoint is step-00000004 \(an edited step\)"):
        read_state(ckpt)


def test_a_state_written_before_the_digest_still_resumes_and_a_removed_digest_is_refused(paused):
    ckpt = paused / "checkpoints" / STEP4
    edit_json(ckpt / "train_state.json", lambda d: d.pop("digest"))
    with pytest.raises(ValueError, match="changed after it was written"):
        read_state(ckpt)
    edit_json(ckpt / "train_state.json", lambda d: d.update(version=1))  # as an earlier version wrote it
    resumed = train(tiny(), TOK, TASK, cfg(steps=6), out_dir=paused, resume=True, progress=False).model
    straight = train(tiny(), TOK, TASK, cfg(steps=6), progress=False).model
    assert all(torch.equal(p, q) for p, q in zip(straight.parameters(), resumed.parameters(), strict=True))


def test_the_settings_a_resume_may_change_still_change(paused):
    """Steps, logging, evaluation and checkpoint intervals (RESUME_FREE) change on resume, to the same weights as an
    uninterrupted run; the new checkpoint carries its own digest and resumes again."""
    free = {"log_every": 1, "ckpt_every": 5, "eval_every": 3, "eval_batch_size": 2}
    resumed = train(tiny(), TOK, TASK, cfg(steps=6, **free), out_dir=paused, resume=True, progress=False).model
    straight = train(tiny(), TOK, TASK, cfg(steps=6), progress=False).model
    assert all(torch.equal(p, q) for p, q in zip(straight.parameters(), resumed.parameters(), strict=True))
    assert latest_checkpoint(paused).name == "step-00000006"
    assert json.loads((latest_checkpoint(paused) / "train_state.json").read_text())["version"] == 2
    train(tiny(), TOK, TASK, cfg(steps=8), out_dir=paused, resume=True, progress=False)
    assert latest_checkpoint(paused).name == "step-00000008"


# ------------------------------------------------------------------------------------ non-finite weights
@pytest.mark.parametrize("where", ["weights", "optimiser"])
def test_non_finite_values_are_a_corrupt_checkpoint_not_a_learning_rate(run, tmp_path, where):
    ckpt = run / "checkpoints" / STEP4
    file = ckpt / ("model.safetensors" if where == "weights" else "train_state.safetensors")
    tensors = load_file(str(file))
    name = next(k for k, v in tensors.items() if v.is_floating_point() and v.numel() > 1)
    tensors[name][0] = float("nan")
    save_file(tensors, str(file))
    r = aspan("train", *SMALL, "--steps", "6", "--out", str(run), "--resume", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    one_line(r.stderr, str(file), "corrupt checkpoint", name)
    assert "learning rate" not in r.stderr
    if where == "weights":
        with pytest.raises(ValueError, match="corrupt checkpoint"):
            models.load(ckpt, device="cpu")


def test_a_checkpoint_in_the_hugging_face_form_with_inf_is_corrupt(tmp_path):
    tok = CharTokenizer()
    model = models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=32, device="cpu")
    models.save(model, tmp_path / "m", tok)
    assert (tmp_path / "m" / "tokenizer.json").is_file()  # the Hugging Face form
    tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name] = torch.full_like(tensors[name], float("inf"))
    save_file(tensors, str(tmp_path / "m" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"corrupt checkpoint: {name} holds nan or inf"):
        models.load(tmp_path / "m", device="cpu")


# ------------------------------------------------------------------------------------ train_resumable's directory
@pytest.mark.parametrize("content", ["a file", "a run directory", "a directory"])
def test_train_resumable_refuses_a_directory_it_did_not_make(tmp_path, content):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    if content == "a file":
        (scratch / "notes.txt").write_text("mine")
    elif content == "a run directory":  # an `aspan train` run (its run.json) is not a scratch directory
        (scratch / "run.json").write_text("{}")
        (scratch / "log.jsonl").write_text("")
    else:
        (scratch / "data").mkdir()
    before = tree(scratch), sorted(p.name for p in scratch.iterdir())
    with pytest.raises(ValueError, match=rf"^train_resumable: {scratch} is not empty and is not a scratch directory "
                                         rf"of train_resumable \(it has no {SCRATCH_MARKER}\)"):
        train_resumable(scratch, tiny(), TOK, TASK, cfg(), progress=False)
    assert (tree(scratch), sorted(p.name for p in scratch.iterdir())) == before


def test_train_resumable_uses_an_empty_or_its_own_directory(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    straight = train_resumable(empty, tiny(), TOK, TASK, cfg(), progress=False).model
    assert not empty.exists()
    own = tmp_path / "own"  # its own, killed before the first checkpoint: cleared and started again
    own.mkdir()
    (own / SCRATCH_MARKER).write_text("")
    (own / "log.jsonl").write_text('{"kind": "train", "step": 1}\n')
    again = train_resumable(own, tiny(), TOK, TASK, cfg(), progress=False).model
    assert not own.exists()
    assert all(torch.equal(p, q) for p, q in zip(straight.parameters(), again.parameters(), strict=True))
    with pytest.raises(ValueError, match="a file, not a directory"):
        (tmp_path / "f").write_text("x")
        train_resumable(tmp_path / "f", tiny(), TOK, TASK, cfg(), progress=False)
    assert (tmp_path / "f").read_text() == "x"


def test_train_resumable_continues_a_paused_run_made_before_the_marker(tmp_path):
    """A paused run directory of an earlier version (a checkpoint and the logs, no marker) is still continued."""
    straight = train_resumable(tmp_path / "a", tiny(), TOK, TASK, cfg(steps=4), progress=False).model
    paused = tmp_path / "b"
    train(tiny(), TOK, TASK, cfg(steps=4), out_dir=paused, progress=False, stop_after=2)
    assert SCRATCH_MARKER not in {p.name for p in paused.iterdir()}
    resumed = train_resumable(paused, tiny(), TOK, TASK, cfg(steps=4), progress=False).model
    assert all(torch.equal(p, q) for p, q in zip(straight.parameters(), resumed.parameters(), strict=True))
    assert not paused.exists()


def test_train_resumable_checks_the_settings_before_touching_the_directory(tmp_path):
    scratch = tmp_path / "scratch"
    with pytest.raises(ValueError, match="lr must be a finite number"):
        train_resumable(scratch, tiny(), TOK, TASK, cfg(lr=float("inf")), progress=False)
    assert not scratch.exists()
