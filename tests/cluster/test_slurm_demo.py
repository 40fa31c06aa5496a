"""`aspan demo --quick --launcher slurm` on a real one-node Slurm (tests/cluster/conftest.py): its grid as two array
tasks, merged, writes the run directory a one-machine `aspan demo --quick` writes: the same rows in the same order,
the same summary (its wall time aside) and the same files."""
from __future__ import annotations

import json
from pathlib import Path

from aspan import io
from aspan.cli import main


def rows(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (out / "sweep.jsonl").read_text().splitlines()]


def summary(out: Path) -> dict:
    return {k: v for k, v in json.loads((out / "summary.json").read_text()).items() if k != "wall_seconds"}


def files(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*")}


def test_the_quick_demo_through_slurm_equals_a_local_run(slurm, tmp_path, capsys, monkeypatch):
    on_slurm, local = tmp_path / "slurm", tmp_path / "local"
    written = []  # grid rows this process writes: none, the tasks computed them all
    write = io.RowWriter.write
    monkeypatch.setattr(io.RowWriter, "write", lambda self, row: written.append(self.path.name) or write(self, row))
    assert main(["demo", "--quick", "--out", str(on_slurm), "--launcher", "slurm", "--array-tasks", "2",
                 "--poll", "0.5", "--time", "10", "--quiet"]) == 0
    assert not [name for name in written if name.startswith("sweep")], written
    monkeypatch.undo()
    assert main(["demo", "--quick", "--out", str(local), "--quiet"]) == 0
    capsys.readouterr()
    assert len(rows(local)) > 2 and rows(on_slurm) == rows(local)  # every row once, in grid order
    assert summary(on_slurm) == summary(local)
    assert files(on_slurm) == files(local)  # no shard file, no submitit folder left
