"""How an application holds its run directory for one job and one configuration (`aspan.io.claim_run`): the
configuration is the settings dataclass without the fields that only change how the job runs, plus the backend."""
from __future__ import annotations

import contextlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..io import PathLike, RunDir, claim_run, recorded_settings
from ..models.backend import default_backend


def claim_config(out: PathLike, name: str, config: Any, runtime: tuple[str, ...], *,
                 shard: tuple[int, int] | None = None,
                 command: str | None = None) -> contextlib.AbstractContextManager[RunDir]:
    """Hold `out` for this job (the lock of `shard`) and for `config`'s settings (a dataclass; `runtime` names its
    fields that may differ between a run and its resumption), recorded as command `name`."""
    # a float32 `dtype` (the default) stays unrecorded: the runs made before the option computed in float32, and resume
    settings = {"command": name, **{k: v for k, v in asdict(config).items()
                                    if k not in runtime and not (k == "dtype" and v == "float32")},
                "backend": default_backend()}
    recorded = recorded_settings(out) if Path(out).is_dir() else None
    for new, old in FORMER_NAMES.items():  # a setting recorded under its former name is compared under that name
        if isinstance(recorded, dict) and new in settings and old in recorded and new not in recorded:
            settings = {(old if k == new else k): v for k, v in settings.items()}
    return claim_run(out, settings, shard=shard, command=command)


def claim_study(out: PathLike, study: str, options: dict[str, Any], config_file: PathLike | None = None, *,
                shard: tuple[int, int] | None = None,
                command: str | None = None) -> contextlib.AbstractContextManager[RunDir]:
    """Hold a study's run directory for this job and its configuration: the study, the backend, its `options` (those
    that change what it computes) and the content of its TOML `config_file` (the file's content defines the run,
    not its name). `shard`: (I, N) holds the lock of unit I of N instead (units run in parallel, each writing its
    own files); `command`: the command line a second job's refusal names (default: this process's)."""
    settings = {"study": study, "backend": default_backend(), **options}
    if config_file and Path(config_file).is_file():
        settings["config"] = Path(config_file).read_bytes().decode("utf-8", "replace")  # not UTF-8: read_toml said so
    recorded = recorded_settings(out) if Path(out).is_dir() else None
    if isinstance(recorded, dict):  # what earlier versions recorded though it changes nothing: taken as it is there
        settings |= {k: recorded[k] for k in FORMERLY_RECORDED if k in recorded}
    return claim_run(out, settings, shard=shard, command=command)


# Settings renamed since a run directory may have recorded them: new name -> the name recorded before.
FORMER_NAMES = {"convention": "rank_convention"}

# Options a study's run directory recorded before they were known to change nothing computed (`-v`, a logging flag):
# a directory that holds one resumes, with the flag given or not.
FORMERLY_RECORDED = ("verbose",)
