"""`aspan study abc --protocol paper --quick --launcher slurm` on a real one-node Slurm (tests/cluster/conftest.py):
its units as two job arrays (vanilla and ABS, then ABC on the vanilla models), merged, write the run directory a
one-machine run writes: the same rows (timings aside), the same table and the same files."""
from __future__ import annotations

import json
from pathlib import Path

from aspan.cli import main

ARGV = ["study", "abc", "--protocol", "paper", "--quick", "--threads", "1", "--quiet"]
TIMING = ("wall_s", "time")


def rows(out: Path, name: str) -> list[dict]:
    found = [{k: v for k, v in json.loads(line).items() if k not in TIMING}
             for line in (out / name).read_text().splitlines() if line.strip()]
    return sorted(found, key=lambda r: json.dumps(r, sort_keys=True))


def files(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*")}


def test_the_quick_paper_study_through_slurm_equals_a_local_run(slurm, tmp_path, capsys):
    on_slurm, local = tmp_path / "slurm", tmp_path / "local"
    assert main([*ARGV, "--out", str(on_slurm), "--launcher", "slurm", "--poll", "0.5", "--time", "10"]) == 0
    assert main([*ARGV, "--out", str(local)]) == 0
    capsys.readouterr()
    for name in ("runs.jsonl", "checks.jsonl", "positions.jsonl"):
        assert len(rows(local, name)) >= 3 and rows(on_slurm, name) == rows(local, name), name
    assert (on_slurm / "table.csv").read_text() == (local / "table.csv").read_text()
    assert files(on_slurm) == files(local)  # no unit file, no submitit folder left
