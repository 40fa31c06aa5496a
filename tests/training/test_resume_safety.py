"""Resuming a training run is safe and consistent: nothing read back runs code (`test_security_*`: a pickle in the
training state, a `checkpoints/latest` that leads out of the run), a missing or unreadable pointer never restarts a
run over its checkpoints, inputs changed under the same name and a shorter run are refused, a full disk leaves no
half checkpoint, and an empty `--out` is refused by every command. CLI cases run the real command in a subprocess
(the full-disk case in-process: a write is made to fail there)."""
import errno
import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from aspan import cli, models, tasks
from aspan.io import sha256_of
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig, latest_checkpoint, read_state, train
from tests.cli import SMALL, aspan, one_line

ROOT = Path(__file__).resolve().parents[2]
STEP4 = "step-00000004"


def tree(directory: Path) -> dict[str, str]:
    """Every file below `directory` (hidden ones included) with the sha256 of its content."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 4-step run (checkpoint step-00000004), made once; tests work on copies (`run`)."""
    out = tmp_path_factory.mktemp("base") / "run"
    assert cli.main(["train", *SMALL, "--steps", "4", "--out", str(out)]) == 0
    return out


@pytest.fixture
def run(finished, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


class RunsShell:
    """Unpickling it calls os.system, which creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# ------------------------------------------------------------------------------------ security: no code is run
@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_security_pickle_in_train_state_is_never_run(run, tmp_path, writer):
    marker = tmp_path / "pwned"
    ckpt = run / "checkpoints" / STEP4
    for f in ckpt.glob("train_state.*"):
        f.unlink()
    evil = ckpt / "train_state.pt"  # where an earlier aspan kept the state, so it is still read (without pickle's code)
    if writer == "pickle":
        evil.write_bytes(pickle.dumps({"step": RunsShell(marker)}))
    else:
        torch.save({"step": RunsShell(marker)}, evil)
    before = tree(run)
    r = aspan("train", *SMALL, "--steps", "6", "--out", str(run), "--resume", cwd=tmp_path)
    assert not marker.exists()
    assert r.returncode == 2, r.stderr
    one_line(r.stderr, str(evil), "refused")
    with pytest.raises(ValueError, match="refused, nothing was run"):
        read_state(ckpt)
    assert not marker.exists() and tree(run) == before


def test_legacy_train_state_still_resumes_exactly(tmp_path):
    """A checkpoint of an earlier version (the state as one `torch.save` file of tensors and plain data) resumes to the
    same weights as an uninterrupted run."""
    tok, task = CharTokenizer(), tasks.get("reversal", length=(1, 3), charset="abcd")
    torch.set_num_threads(1)
    make = lambda: models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=32, seed=0, device="cpu")  # noqa: E731
    cfg = TrainConfig.scratch(steps=6, batch_size=4, warmup=2, lr=3e-3, device="cpu")
    straight = train(make(), tok, task, cfg, out_dir=tmp_path / "a", progress=False).model
    train(make(), tok, task, cfg, out_dir=tmp_path / "b", progress=False, stop_after=3)
    ckpt = latest_checkpoint(tmp_path / "b")
    torch.save(read_state(ckpt), ckpt / "train_state.pt")
    for name in ("train_state.json", "train_state.safetensors"):
        (ckpt / name).unlink()
    resumed = train(make(), tok, task, cfg, out_dir=tmp_path / "b", resume=True, progress=False).model
    assert all(torch.equal(p, q) for p, q in zip(straight.parameters(), resumed.parameters(), strict=True))


@pytest.mark.parametrize("pointer", ["../../outside/" + STEP4, "absolute", "symlink"])
def test_security_latest_leading_out_of_the_run_is_refused(run, tmp_path, pointer):
    outside = tmp_path / "outside" / STEP4  # another run's checkpoint
    shutil.copytree(run / "checkpoints" / STEP4, outside)
    latest = run / "checkpoints" / "latest"
    if pointer == "absolute":
        pointer = str(outside)
    elif pointer == "symlink":
        (run / "checkpoints" / "step-00000009").symlink_to(outside, target_is_directory=True)
        pointer = "step-00000009"
    latest.write_text(pointer)
    before = tree(run)
    r = aspan("train", *SMALL, "--steps", "6", "--out", str(run), "--resume", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    one_line(r.stderr, str(latest), STEP4)
    assert tree(run) == before


# ------------------------------------------------------------------------------------ no silent restart
@pytest.mark.parametrize("content", ["", "garbage\n", None])
def test_missing_or_unreadable_pointer_names_the_checkpoints(run, tmp_path, content):
    latest = run / "checkpoints" / "latest"
    if content is None:
        latest.unlink()
    else:
        latest.write_text(content)
    before = tree(run)
    r = aspan("train", *SMALL, "--steps", "6", "--out", str(run), "--resume", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    one_line(r.stderr, str(latest), STEP4)
    assert tree(run) == before  # the intact checkpoint and the logs are kept


@pytest.mark.parametrize("checkpoints", ["absent", "empty"])
def test_resume_without_a_checkpoint_is_refused(run, tmp_path, checkpoints):
    shutil.rmtree(run / "checkpoints")
    if checkpoints == "empty":
        (run / "checkpoints").mkdir()
    before = tree(run)
    r = aspan("train", *SMALL, "--steps", "6", "--out", str(run), "--resume", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    one_line(r.stderr, "no checkpoint", str(run / "checkpoints" / "latest"))
    assert tree(run) == before  # log rows of the earlier run not replaced


# ------------------------------------------------------------------------------------ the same run, or none
def test_resume_on_changed_data_is_refused(tmp_path, capsys):
    data, out = tmp_path / "train.jsonl", tmp_path / "run"
    write = lambda seed: data.write_text("".join(  # noqa: E731
        s.to_json() + "\n" for s in tasks.get("reversal", length=(1, 3), charset="abcd").generate(16, seed=seed)))
    write(0)
    first = sha256_of(data)
    args = [a for a in SMALL if a not in ("--task", "reversal")]
    assert cli.main(["train", *args, "--data", str(data), "--steps", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert json.loads((out / "run.json").read_text())["data_sha256"] == first
    write(1)  # regenerated: other samples, same name
    second = sha256_of(data)
    before = tree(out)
    r = aspan("train", *args, "--data", str(data), "--steps", "4", "--out", str(out), "--resume", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    one_line(r.stderr, f"--data {data}", first[:12], second[:12])
    assert tree(out) == before


def test_resume_on_a_changed_init_checkpoint_is_refused(finished, tmp_path, capsys):
    base, out = tmp_path / "base", tmp_path / "ft"
    shutil.copytree(finished, base)
    assert cli.main(["train", *SMALL, "--init", str(base), "--steps", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    first = sha256_of(base)
    assert json.loads((out / "run.json").read_text())["init_sha256"] == first
    loaded = models.load(base, device="cpu")
    with torch.no_grad():
        next(loaded.model.parameters()).add_(1.0)
    models.save(loaded.model, base, loaded.tokenizer, **loaded.meta)  # retrained under the same name
    code = cli.main(["train", *SMALL, "--init", str(base), "--steps", "4", "--out", str(out), "--resume"])
    err = capsys.readouterr().err
    assert code == 2
    one_line(err, f"--init {base}", first[:12], sha256_of(base)[:12])


def test_resume_with_fewer_steps_is_refused(run, tmp_path):
    before = tree(run)
    r = aspan("train", *SMALL, "--steps", "2", "--out", str(run), "--resume", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    one_line(r.stderr, "already has 4", "2 steps")
    assert tree(run) == before  # run.json still says 4 steps


# ------------------------------------------------------------------------------------ a full disk
def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.hooked  # counts HookedTransformer's safetensors writes (a bridge saves its weights through transformers)
@pytest.mark.parametrize("failing", ["weights", "train state"])
def test_full_disk_keeps_no_half_checkpoint_and_resume_continues(tmp_path, capsys, monkeypatch, failing):
    """The 2nd checkpoint (step 4) fails with ENOSPC while writing its weights, or its training state: the message
    names the checkpoint, no part of it is kept, the logs end at step 2, and a resume gives the uninterrupted run."""
    import safetensors.torch

    args = [*SMALL, "--steps", "6", "--ckpt-every", "2", "--eval-every", "1", "--eval-samples", "2"]
    assert cli.main(["train", *args, "--out", str(tmp_path / "straight")]) == 0
    out = tmp_path / "run"
    real, calls = safetensors.torch.save_file, []
    fail_at = 3 if failing == "weights" else 4  # step 2: weights, state; step 4: weights, state

    def save_file(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == fail_at:
            Path(filename).write_bytes(b"\0" * 100)  # half a file, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    capsys.readouterr()
    assert cli.main(["train", *args, "--out", str(out)]) == 2
    one_line(capsys.readouterr().err, str(out / "checkpoints" / STEP4), "No space left on device")
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    assert sorted(os.listdir(out / "checkpoints")) == ["latest", "step-00000002"]
    assert (out / "checkpoints" / "latest").read_text() == "step-00000002"
    assert max(r["step"] for r in rows(out / "log.jsonl") + rows(out / "eval.jsonl")) == 2
    assert cli.main(["train", *args, "--out", str(out), "--resume"]) == 0
    straight, resumed = (models.load(tmp_path / d, device="cpu").model for d in ("straight", "run"))
    assert all(torch.equal(p, q) for p, q in zip(straight.parameters(), resumed.parameters(), strict=True))
    for name in ("log.jsonl", "eval.jsonl"):  # the same rows as the uninterrupted run, none twice
        key = lambda r: (r["step"], r["kind"], r.get("split"))  # noqa: E731
        assert [key(r) for r in rows(out / name)] == [key(r) for r in rows(tmp_path / "straight" / name)]
    assert [r.get("exact") for r in rows(out / "eval.jsonl")] == [
        r.get("exact") for r in rows(tmp_path / "straight" / "eval.jsonl")]


# ------------------------------------------------------------------------------------ --out ""
def test_empty_out_is_refused(tmp_path, capsys):
    r = aspan("train", *SMALL, "--steps", "2", "--out", "", cwd=tmp_path)
    assert r.returncode == 2
    one_line(r.stderr, "--out", "empty path")
    assert os.listdir(tmp_path) == []
    cfg = tmp_path / "s.toml"
    cfg.write_text('model = "reversal"\ntask = "reversal"\nstrengths = [1.0]\n[heads]\ntop = [1]\n')
    for argv in (["rank", "reversal", "--task", "reversal", "--out", ""], ["sweep", "--config", str(cfg), "--out", ""],
                 ["abc", "reversal", "--task", "reversal", "--out", ""], ["demo", "--out", ""],
                 ["pretrained", "--config", str(cfg), "--out", ""], ["study", "qk", "--quick", "--out", ""],
                 ["study", "abc", "--quick", "--out", ""], ["study", "parity", "--quick", "--out", ""],
                 ["eval", "reversal", "-o", ""], ["data", "--task", "reversal", "-o", ""],
                 ["report", str(tmp_path), "-o", ""]):
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code == 2, argv
        one_line(err, "empty path")
    assert sorted(os.listdir(tmp_path)) == ["s.toml"]
