"""`aspan pretrained --launcher slurm` on a real one-node Slurm (tests/cluster/conftest.py), on a tiny random Llama
checkpoint: resources from the config's `[slurm]` table, the grid as two array tasks (each fine-tunes the same way),
merged: the same rows and summary as a one-machine run, and the same files."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from aspan.cli import main

from ..models.hf_fixtures import save_random_model


def rows(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (out / "sweep.jsonl").read_text().splitlines()]


def files(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*")}


def timeless(value):
    """`value` without its wall times (keys ending in `_s` or `seconds`)."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if not (k.endswith("_s") or k.endswith("seconds"))}
    return [timeless(v) for v in value] if isinstance(value, list) else value


def test_pretrained_through_slurm_equals_a_local_run(slurm, tmp_path, capsys):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        save_random_model("llama", tmp_path / "model")
    finally:
        torch.set_num_threads(threads)
    config = tmp_path / "c.toml"
    config.write_text(
        f'model = "{tmp_path / "model"}"\ntask = "reversal"\ndevice = "cpu"\n[prompt]\nshots = [1]\n'
        '[data]\nood_params = { length = [11, 12] }\neval_samples = 4\ngen_samples = 2\nbatch_size = 4\n'
        '[finetune]\nsteps = 1\n[analysis]\nrank_samples = 2\ntop = [1, 2]\nstrengths = [1.0, 2.0]\n'
        '[slurm]\narray_tasks = 2\ntime = 10\npoll = 0.5\n')
    on_slurm, local = tmp_path / "slurm", tmp_path / "local"
    assert main(["pretrained", str(config), "--out", str(on_slurm), "--threads", "1", "--launcher", "slurm",
                 "--quiet"]) == 0
    assert main(["pretrained", str(config), "--out", str(local), "--threads", "1", "--quiet"]) == 0
    capsys.readouterr()
    assert len(rows(local)) >= 4 and rows(on_slurm) == rows(local)
    summaries = [timeless(json.loads((p / "summary.json").read_text())) for p in (on_slurm, local)]
    assert summaries[0] == summaries[1]
    assert files(on_slurm) == files(local)
