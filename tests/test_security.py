"""A run directory is never a way to write elsewhere: its files are not appended to, truncated or replaced through a
symbolic link someone else put there; the command refuses in one line naming the file and touches nothing."""
import os
import subprocess
import sys
from pathlib import Path

from aspan import models
from aspan.tokenization import CharTokenizer

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def aspan(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aspan.cli", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=300)


def sweep_config(tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    models.save(models.tiny(CharTokenizer(), n_layers=1, n_heads=2, d_model=16, n_ctx=64, device="cpu"), ckpt,
                CharTokenizer(), task="reversal")
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'model = "{ckpt}"\ntask = "reversal"\nn_samples = 2\nbatch_size = 2\n'
                   'task_params = {length = [2, 3]}\nstrengths = [1.0]\n[heads]\nlist = [[0, 0]]\n')
    return cfg


def test_security_sweep_rows_are_not_appended_through_a_symlink(tmp_path):
    cfg, out, victim = sweep_config(tmp_path), tmp_path / "run", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("not the sweep's\n")
    (out / "sweep.jsonl").symlink_to(victim)
    r = aspan("sweep", str(cfg), "--out", str(out), "--no-progress", cwd=tmp_path)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert f"{out / 'sweep.jsonl'} is a symbolic link" in r.stderr
    assert victim.read_text() == "not the sweep's\n" and (out / "sweep.jsonl").is_symlink()


def test_security_run_json_is_not_replaced_through_a_symlink(tmp_path):
    cfg, out, victim = sweep_config(tmp_path), tmp_path / "run", tmp_path / "victim.json"
    out.mkdir()
    victim.write_text("{}\n")
    (out / "run.json").symlink_to(victim)
    r = aspan("sweep", str(cfg), "--out", str(out), "--no-progress", cwd=tmp_path)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert f"{out / 'run.json'} is a symbolic link" in r.stderr
    assert victim.read_text() == "{}\n" and (out / "run.json").is_symlink()
    assert not (out / "sweep.jsonl").exists()  # refused before any row was computed
