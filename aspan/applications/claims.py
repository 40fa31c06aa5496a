"""How an application holds its run directory for one job and one configuration (`aspan.io.claim_run`): the
configuration is the settings dataclass without the fields that only change how the job runs, plus the backend."""
from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import Any

from ..io import PathLike, RunDir, claim_run
from ..models.backend import default_backend


def claim_config(out: PathLike, name: str, config: Any, runtime: tuple[str, ...], *,
                 shard: tuple[int, int] | None = None,
                 command: str | None = None) -> contextlib.AbstractContextManager[RunDir]:
    """Hold `out` for this job (the lock of `shard`) and for `config`'s settings (a dataclass; `runtime` names its
    fields that may differ between a run and its resumption), recorded as command `name`."""
    settings = {"command": name, **{k: v for k, v in asdict(config).items() if k not in runtime},
                "backend": default_backend()}
    return claim_run(out, settings, shard=shard, command=command)
