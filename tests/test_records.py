"""Every run.json records what produced it: the versions of the stack, the backend (hooked or bridge), the dtype and
the device actually used (never "auto"); `aspan doctor` prints the same (`aspan --version`: the version alone). One
quick run per command; a run directory of one backend refuses the other."""
import json
import platform
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from aspan import models
from aspan.tokenization import CharTokenizer

from . import cli
from .models.hf_fixtures import save_random_model

ENV = {k: v for k, v in cli.ENV.items() if k != "ASPAN_BACKEND"}  # the default backend: hooked on TransformerLens 3
STACK = {"aspan": version("aspan"), "python": platform.python_version(), "torch": version("torch"),
         "transformer_lens": version("transformer-lens"), "transformers": version("transformers")}
SMALL = ["--task", "reversal", "--param", "length=1-3", "--param", "charset=abcd", "--d-model", "16", "--n-heads", "2",
         "--n-layers", "1", "--batch-size", "4", "--eval-samples", "0", "--quiet", "--threads", "1"]


def auto_device() -> str:
    """What "auto" must become: the GPU (index and name) when there is one, else the CPU."""
    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{torch.cuda.current_device()} ({torch.cuda.get_device_name(torch.cuda.current_device())})"


def aspan(*args: str, cwd: Path, env: dict | None = None, code: int = 0) -> subprocess.CompletedProcess:
    r = cli.aspan(*args, cwd=cwd, env=env or ENV, timeout=600)
    assert r.returncode == code, r.stderr[-2000:]
    return r


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("records") / "ckpt"
    models.save(models.tiny(CharTokenizer(), n_layers=1, n_heads=2, d_model=16, n_ctx=64, device="cpu"), path,
                CharTokenizer(), task="reversal")
    return path


def sweep_args(d: Path, ckpt: Path) -> list[str]:
    (d / "s.toml").write_text(f'model = "{ckpt}"\ntask = "reversal"\nn_samples = 2\nbatch_size = 2\n'
                              'task_params = {length = [2, 3]}\nstrengths = [1.0]\n[heads]\nlist = [[0, 0]]\n')
    return ["sweep", "--config", str(d / "s.toml"), "--out", str(d / "run"), "--quiet"]


def pretrained_args(d: Path, ckpt: Path) -> list[str]:
    save_random_model("llama", d / "hf")
    (d / "c.toml").write_text(
        f'model = "{d / "hf"}"\ntask = "reversal"\ndevice = "cpu"\n[prompt]\nshots = [1]\n'
        '[data]\nood_params = { length = [11, 12] }\neval_samples = 4\ngen_samples = 2\nbatch_size = 4\n'
        '[finetune]\nsteps = 1\n[analysis]\nrank_samples = 2\ntop = [1]\nstrengths = [1.0]\n')
    return ["pretrained", "--config", str(d / "c.toml"), "--out", str(d / "run"), "--threads", "1"]


# command -> (its arguments in directory d with checkpoint ckpt, the device its run must record)
COMMANDS = {
    "train": (lambda d, c: ["train", *SMALL, "--steps", "1", "--device", "cpu", "--out", str(d / "run")], "cpu"),
    "eval": (lambda d, c: ["eval", str(c), "--split", "id", "-n", "2", "--no-attn", "--out", str(d / "run")],
             "auto"),
    "rank": (lambda d, c: ["rank", str(c), "--task", "reversal", "-n", "2", "--quiet", "--device", "cpu",
                           "--out", str(d / "run")], "cpu"),
    "abc": (lambda d, c: ["abc", str(c), "--task", "reversal", "--abs", "anti:1:0", "--id-samples", "2",
                          "--ood-samples", "2", "--ood-param", "length=11-12", "--device", "cpu", "--quiet",
                          "--out", str(d / "run")], "cpu"),
    "explain": (lambda d, c: ["explain", str(c), "--task", "reversal", "--split", "id", "--heads", "0.1", "--device",
                              "cpu", "--out", str(d / "run")], "cpu"),
    "sweep": (sweep_args, "auto"),
    "demo": (lambda d, c: ["demo", "--quick", "--device", "cpu", "--out", str(d / "run")], "cpu"),
    "pretrained": (pretrained_args, "cpu"),
    "study qk": (lambda d, c: ["study", "qk", "--quick", "--quiet", "--out", str(d / "run")], "cpu"),
    "study abc": (lambda d, c: ["study", "abc", "--quick", "--quiet", "--out", str(d / "run")], "cpu"),
    "study parity": (lambda d, c: ["study", "parity", "--quick", "--no-report", "--out", str(d / "run")], "cpu"),
    "study abc paper": (lambda d, c: ["study", "abc", "--protocol", "paper", "--quick", "--quiet",
                                       "--out", str(d / "run")], "cpu"),
}


# command -> the rows file that a second run on the other backend must leave alone
BACKEND_ROWS = {"demo": "sweep.jsonl", "study qk": "runs.jsonl", "study abc": "runs.jsonl", "sweep": "sweep.jsonl"}


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_run_json_records_versions_backend_and_the_device_used(command, ckpt, tmp_path):
    """... and, for the commands that resume a run directory (`BACKEND_ROWS`), the same command on the other backend
    is refused in one line, leaving every file as it was (no row of the other backend mixed in)."""
    make_args, device = COMMANDS[command]
    aspan(*make_args(tmp_path, ckpt), cwd=tmp_path)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert {k: run["versions"].get(k) for k in STACK} == STACK
    assert run["backend"] == "hooked"  # TransformerLens 3 without ASPAN_BACKEND
    assert run["dtype"] == "float32"  # the default precision (`--dtype` changes it: tests/models/test_dtype.py)
    assert run["device"] == (auto_device() if device == "auto" else device)
    # the CPU kernels torch chose: the same training rounds differently, and can end differently, under others
    assert run["machine"]["cpu_kernels"] == torch.backends.cpu.get_cpu_capability()
    if command in BACKEND_ROWS:
        assert (tmp_path / "run" / BACKEND_ROWS[command]).stat().st_size > 0
        before = files_of(tmp_path / "run")
        second = aspan(*make_args(tmp_path, ckpt), cwd=tmp_path, env={**ENV, "ASPAN_BACKEND": "bridge"}, code=2)
        cli.one_line(second.stderr, "another configuration", "backend = 'hooked' there, 'bridge' now")
        assert files_of(tmp_path / "run") == before


def test_the_backend_recorded_is_the_one_used(ckpt, tmp_path):
    aspan("eval", str(ckpt), "--split", "id", "-n", "2", "--no-attn", "--device", "cpu", "--out",
          str(tmp_path / "run"), cwd=tmp_path, env={**ENV, "ASPAN_BACKEND": "bridge"})
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (run["backend"], run["device"]) == ("bridge", "cpu")


def test_doctor_prints_the_record_and_version_the_version(tmp_path):
    doctor = aspan("doctor", cwd=tmp_path, env={**ENV, "ASPAN_BACKEND": "bridge"}).stdout.splitlines()
    expected = [*(f"{k}: {v}" for k, v in STACK.items()), "backend: bridge", f"device: {auto_device()}"]
    assert doctor == expected
    assert aspan("--version", cwd=tmp_path).stdout == f"aspan {STACK['aspan']}\n"  # the rest is doctor's
