"""What each Slurm array task asks for and how `--launcher slurm` drives the array (`SlurmResources`, from flags or
the `[slurm]` table of a `--config` TOML); loads nothing heavy, so `--help` can show its defaults. The launcher itself
is `aspan.applications.launch`."""
from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields
from typing import Any

from ..config import check_type, field_defaults
from ..errors import UsageError
from ..io import PathLike, read_toml


@dataclass
class SlurmResources:
    """What each array task asks Slurm for, and how the launcher drives the array (flags, or a `[slurm]` table in the
    `--config` TOML)."""

    partition: str | None = None  # --partition; None: the cluster's default partition
    time: int = 60  # minutes per task (--time); a task out of time is resubmitted and resumes from its rows
    cpus: int = 1  # CPUs per task (--cpus-per-task)
    gpus: int = 0  # GPUs per task (--gpus-per-node; each task is one process on one node)
    mem: str | None = None  # memory per task, e.g. "16G" (--mem); None: the partition's default
    array_parallelism: int = 256  # array tasks running at once (the array's %N)
    array_tasks: int | None = None  # array tasks, one grid shard each; None: the command's default (sweep: one per
    # grid point, at most 64; demo and pretrained: 4); a resumed launch keeps its first count
    max_retries: int = 2  # times one failed, cancelled or pre-empted task is resubmitted alone
    sbatch: dict[str, str] = field(default_factory=dict)  # extra sbatch options, e.g. {account = "lab", qos = "low"}
    poll: float = 10.0  # seconds between two looks at the queue while waiting

    def check(self) -> None:
        """ValueError naming the first setting out of range."""
        for name in ("time", "cpus", "array_parallelism"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("gpus", "max_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0, got {getattr(self, name)}")
        if self.array_tasks is not None and self.array_tasks < 1:
            raise ValueError(f"array_tasks must be at least 1, got {self.array_tasks}")
        if self.poll <= 0:
            raise ValueError(f"poll must be positive, got {self.poll}")
        for key, value in self.sbatch.items():
            if not isinstance(value, str) or not key.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"sbatch: option {key!r} must be a word with a string value")

    def executor_parameters(self) -> dict[str, Any]:
        """submitit's `SlurmExecutor.update_parameters` arguments."""
        params: dict[str, Any] = {"time": self.time, "cpus_per_task": self.cpus, "ntasks_per_node": 1, "nodes": 1,
                                  "array_parallelism": self.array_parallelism, "job_name": "aspan-sweep",
                                  "additional_parameters": dict(self.sbatch)}
        if self.partition:
            params["partition"] = self.partition
        if self.gpus:
            params["gpus_per_node"] = self.gpus
        if self.mem:
            params["mem"] = self.mem
        return params


def load_resources(toml_path: PathLike | None, flags: dict[str, Any]) -> SlurmResources:
    """The defaults, then the `[slurm]` table of `toml_path` (when it has one), then the given `flags` (None: not
    given); UsageError in one line naming the file and key, or the flag."""
    values: dict[str, Any] = {}
    where = "slurm resources"
    if toml_path is not None:
        table = read_toml(toml_path, "config").get("slurm", {})
        where = f"{toml_path}: [slurm]"
        if not isinstance(table, dict):
            raise UsageError(f"{toml_path}: slurm must be a table ([slurm])")
        known = {f.name for f in fields(SlurmResources)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        values = dict(table)
    hints = _hints()
    for key, value in values.items():
        check_type(value, hints[key], f"{where} {key}")
    for key, value in flags.items():
        if value is not None:
            values[key] = {**values.get("sbatch", {}), **value} if key == "sbatch" else value
            where = f"--{key.replace('_', '-')}" if key != "sbatch" else where
    resources = SlurmResources(**{**field_defaults(SlurmResources), **values})
    try:
        resources.check()
    except ValueError as e:
        raise UsageError(f"{where}: {e}") from None
    return resources


def _hints() -> dict[str, Any]:
    return typing.get_type_hints(SlurmResources)
