"""docs/howto/slurm.md on a CPU-only cluster (the one-node Slurm of tests/cluster/conftest.py, which has no GPU and no
gres): the page's first command, as written, is accepted and its tasks can run there; its GPU form is refused with
exactly the line the page says it is."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from aspan.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "howto" / "slurm.md"
# Why a queued task may wait that is no fault of its request (anything else, e.g. PartitionConfig for more CPUs than
# a node has, means it would wait for ever).
WAITING = {"None", "Resources", "Priority", "JobArrayTaskLimit"}


def page_commands() -> list[list[str]]:
    """The `aspan` command lines of the page's shell blocks, in page order, as argument lists."""
    text = PAGE.read_text(encoding="utf-8")
    lines = [line.strip() for block in re.findall(r"```shell\n(.*?)```", text, re.S)
             for line in re.sub(r"\\\n\s*", " ", block).splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("aspan ")]


def run(argv: list[str], where: Path, monkeypatch, capfd) -> tuple[int, str, str]:
    """`aspan ARGV --no-wait` in `where` (which holds a copy of the config the command names)."""
    config = argv[argv.index("--config") + 1]
    (where / config).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ROOT / config, where / config)
    monkeypatch.chdir(where)
    capfd.readouterr()
    code = main([*argv, "--no-wait"])
    out, err = capfd.readouterr()
    return code, out, err


def _queue(job: str) -> list[tuple[str, str]]:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True, check=True)
    return [tuple(line.split(maxsplit=1)) for line in out.stdout.splitlines()]


def test_the_first_command_runs_on_a_cpu_only_cluster(slurm, tmp_path, monkeypatch, capfd):
    first = page_commands()[0]
    assert first[0] == "sweep" and not {"--gpus", "--partition"} & set(first), first
    assert not any("gres" in word or "gpu" in word for word in first), first
    code, out, err = run(first, tmp_path, monkeypatch, capfd)
    try:
        assert code == 0, err
        job = out.strip().splitlines()[-1]
        assert re.fullmatch(r"\d+", job), out
        states = _queue(job)
        assert states and all(state in ("PENDING", "RUNNING") and reason in WAITING for state, reason in states), \
            states
    finally:
        if code == 0:
            subprocess.run(["scancel", out.strip().splitlines()[-1]], capture_output=True)


def test_the_gpu_form_fails_there_with_the_line_the_page_quotes(slurm, tmp_path, monkeypatch, capfd):
    gpu = next(argv for argv in page_commands() if "--gpus" in argv)
    assert gpu[0] == "sweep" and "--partition" in gpu
    quoted = re.findall(r"`(aspan sweep: error: sbatch failed: [^`]*gres[^`]*)`",
                        PAGE.read_text(encoding="utf-8").replace("\n  ", " "))
    assert len(quoted) == 1, quoted
    code, out, err = run(gpu, tmp_path, monkeypatch, capfd)
    assert code == 2 and err.strip().splitlines() == [quoted[0]], err  # that line alone (sbatch's own stderr too)
    assert not (tmp_path / "runs" / "sweep").exists()  # refused before anything was left behind
