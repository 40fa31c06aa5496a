"""Submitting one Slurm job array for `--launcher slurm` (`aspan.applications.launch`): submitit writes the batch
script and each task's pickled call (its `submitit.core._submit` runs them on the nodes, as `SlurmExecutor.map_array`
would); this module runs `sbatch` itself, so that the submission has a time limit, its failure is one line, and a
failed submission leaves none of its files behind."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Callable

SBATCH_TIMEOUT_S = 300.0  # one submission; never retried (a submission that timed out may still have queued a job)
COMMANDS = ("sbatch", "srun", "squeue")  # what the launcher and its batch script run


def check_commands() -> None:
    """ChildProcessError in one line naming the first Slurm command not on PATH (checked before anything is
    written or submitted)."""
    for name in COMMANDS:
        if shutil.which(name) is None:
            raise ChildProcessError(f"{name} not found: --launcher slurm runs on a Slurm login node "
                                    f"({', '.join(COMMANDS)} on PATH)")


def submit_array(folder: Path, params: dict[str, Any], calls: list[tuple[Callable[..., Any], tuple]]) -> list[str]:
    """Submit `fn(*args)` for each `(fn, args)` of `calls` as one job array (task i runs call i) with the submitit
    Slurm parameters `params` (`SlurmResources.executor_parameters`), its files in `folder`. Returns the tasks' job
    ids (`ARRAY_I`). ChildProcessError in one line when sbatch fails, runs past `SBATCH_TIMEOUT_S` or prints no job
    id; the files this submission wrote are removed then."""
    from submitit.core.utils import DelayedSubmission
    from submitit.slurm.slurm import _make_sbatch_string

    folder = folder.absolute()
    folder.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    pickles = [folder / f".submitting-{tag}-{i}.pkl" for i in range(len(calls))]
    script = folder / f".submitting-{tag}.sh"
    try:
        for (fn, args), path in zip(calls, pickles):
            delayed = DelayedSubmission(fn, *args)
            delayed.set_timeout(params.get("time", 5), 0)  # no resubmission by submitit: the launcher resubmits
            delayed.dump(path)
        command = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
        script.write_text(_make_sbatch_string(command=command, folder=folder, map_count=len(calls), **params))
        array = _sbatch(script)
    except BaseException:
        for path in (*pickles, script):
            path.unlink(missing_ok=True)
        raise
    for i, path in enumerate(pickles):  # where each task's `_submit` looks for its call
        path.rename(folder / f"{array}_{i}_submitted.pkl")
    script.rename(folder / f"{array}_submission.sh")
    return [f"{array}_{i}" for i in range(len(calls))]


def _sbatch(script: Path) -> str:
    """Run `sbatch --parsable SCRIPT`; the job id it printed, or ChildProcessError in one line."""
    try:
        done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                              timeout=SBATCH_TIMEOUT_S)
    except FileNotFoundError:
        raise ChildProcessError("sbatch not found: --launcher slurm runs on a Slurm login node") from None
    except subprocess.TimeoutExpired:
        raise ChildProcessError(f"sbatch did not answer within {SBATCH_TIMEOUT_S:g} s (a busy Slurm controller?); "
                                "`squeue` shows whether it queued the array anyway; rerun the command to adopt it "
                                "or to submit again") from None
    except OSError as e:
        raise ChildProcessError(f"sbatch could not run: {e}") from None
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        why = lines[-1].removeprefix("sbatch: error: ") if lines else f"exit status {done.returncode}"
        raise ChildProcessError(f"sbatch failed: {why}")
    out = done.stdout.strip()
    found = re.fullmatch(r"([0-9]+)(;\S*)?", out.splitlines()[-1].strip() if out else "") or \
        re.search(r"\bjob ([0-9]+)\b", out)
    if found is None:
        shown = " ".join(out.split())[:100] or "nothing"
        raise ChildProcessError(f"sbatch printed no job id (it printed {shown!r}); check `squeue` for a job it may "
                                "have queued anyway")
    return found.group(1)
