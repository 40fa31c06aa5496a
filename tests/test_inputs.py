"""Every file and value the toolkit reads is checked before it is trusted: a file that is not what it should be ends in
one line naming the file and line (or key), exit code 2, no traceback, before any model work and without a partial
file. Each CLI case runs the real command in a subprocess."""
import json
from pathlib import Path

from aspan.experiments.sweep import SweepConfig, grid
from aspan.io import settings_key

from .test_hardening import aspan, leftovers, one_line

SWEEP = """model = "reversal"
task = "reversal"
task_params = { length = [11, 12] }
n_samples = 2
strengths = [1.0]
deltas = [0]

[heads]
list = [[1, 0]]
"""


def sweep_config(tmp_path: Path, text: str = SWEEP) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------ sweep and study rows
def test_sweep_config_not_utf8_names_the_file(tmp_path):
    cfg = tmp_path / "latin1.toml"
    cfg.write_bytes(SWEEP.encode() + b'# caf\xe9\n')
    r = aspan("sweep", str(cfg), "--out", str(tmp_path / "run"), "--no-progress", cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "run").exists()
    one_line(r.stderr, str(cfg), "UTF-8")


def test_sweep_rows_file_with_a_foreign_row_names_file_and_line(tmp_path):
    cfg = sweep_config(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "sweep.jsonl").write_text('{"x": 1}\n')
    r = aspan("sweep", str(cfg), "--out", str(run), "--no-progress", cwd=tmp_path)
    assert r.returncode == 2
    one_line(r.stderr, f"{run / 'sweep.jsonl'} line 1: not a sweep row", "'key'")
    assert sorted(p.name for p in run.iterdir()) == ["sweep.jsonl"] and not leftovers(run)


def test_sweep_row_without_mode_names_file_and_line(tmp_path):
    cfg = sweep_config(tmp_path)
    point = grid(SweepConfig.from_toml(cfg))[0]
    row = {k: v for k, v in point.items() if k != "mode"}
    run = tmp_path / "run"
    run.mkdir()
    (run / "sweep.jsonl").write_text("\n" + json.dumps({**row, "key": settings_key(point)}) + "\n")
    r = aspan("sweep", str(cfg), "--out", str(run), "--no-progress", cwd=tmp_path)
    assert r.returncode == 2
    one_line(r.stderr, f"{run / 'sweep.jsonl'} line 2: not a sweep row", "'mode'")
    assert sorted(p.name for p in run.iterdir()) == ["sweep.jsonl"]


def test_qk_study_row_without_key_or_condition_names_file_and_line(tmp_path):
    for i, row in enumerate(({"condition": "qk", "replay": 0.0, "seed": 0, "lr": 0.01},
                             {"key": "0123456789abcdef", "replay": 0.0, "seed": 0, "lr": 0.01})):
        run = tmp_path / f"qk{i}"
        run.mkdir()
        (run / "runs.jsonl").write_text(json.dumps(row) + "\n")
        r = aspan("study", "qk", "--quick", "--out", str(run), "--no-progress", cwd=tmp_path)
        assert r.returncode == 2
        one_line(r.stderr, f"{run / 'runs.jsonl'} line 1: not a qk study row", "'key'" if i == 0 else "'condition'")
        assert {p.name for p in run.iterdir()} <= {"runs.jsonl", ".aspan.lock", "run.json"}
