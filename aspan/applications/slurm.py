"""What each Slurm array task asks for and how `--launcher slurm` drives the array (`SlurmResources`, from flags or
the `[slurm]` table of a `--config` TOML); loads nothing heavy, so `--help` can show its defaults. The launcher itself
is `aspan.applications.launch`.

Every value here ends up in the batch script that every array task runs (`#SBATCH --key=value` lines), so each is
checked before anything is submitted: its type, its range (`LIMITS`), and no control character (a newline would
start a line of its own in the script). Extra sbatch options are words (`account`, `qos`, `mail-type`), never one
the launcher sets itself (`RESERVED`)."""
from __future__ import annotations

import math
import re
import typing
from dataclasses import dataclass, field, fields
from typing import Any

from ..config import check_type, describe, field_defaults, fits
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
    mem: str | None = None  # memory per task, e.g. "16G" (--mem; units K, M, G, T); None: the partition's default
    array_parallelism: int = 256  # array tasks running at once (the array's %N)
    array_tasks: int | None = None  # array tasks, one grid shard each; None: the command's default (sweep: one per
    # grid point, at most 64; demo and pretrained: 4); a resumed launch keeps its first count
    max_retries: int = 2  # times one failed, cancelled or pre-empted task is resubmitted alone
    sbatch: dict[str, str] = field(default_factory=dict)  # extra sbatch options, e.g. {account = "lab", qos = "low"}
    poll: float = 10.0  # seconds between two looks at the queue while waiting

    def check(self) -> None:
        """ValueError naming the first setting of the wrong type, out of range (`LIMITS`) or holding a control
        character."""
        hints = _hints()
        for f in fields(self):
            check_resource(f.name, getattr(self, f.name), hints)

    def executor_parameters(self) -> dict[str, Any]:
        """submitit's `SlurmExecutor.update_parameters` arguments (the `#SBATCH` lines of the batch script)."""
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


# (least, most) of each numeric setting: beyond these no cluster has the resource, and a count this large only
# makes the launcher loop (Slurm's own default MaxArraySize is 1001 tasks).
LIMITS: dict[str, tuple[float, float]] = {"time": (1, 366 * 24 * 60), "cpus": (1, 100_000), "gpus": (0, 10_000),
                                          "array_parallelism": (1, 1_000_000), "array_tasks": (1, 100_000),
                                          "max_retries": (0, 1_000), "poll": (0, 3_600)}  # poll: above 0
MAX_ARRAY_TASKS = int(LIMITS["array_tasks"][1])
# sbatch options the launcher sets itself (or a setting of its own names): an extra option may not change them
RESERVED = {"array": "the launcher's", "output": "the launcher's", "error": "the launcher's",
            "open-mode": "the launcher's", "signal": "the launcher's", "job-name": "the launcher's",
            "wrap": "the launcher's", "parsable": "the launcher's", "nodes": "the launcher's",
            "ntasks-per-node": "the launcher's", "partition": "partition", "time": "time", "cpus-per-task": "cpus",
            "gpus-per-node": "gpus", "mem": "mem"}
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_MEM = re.compile(r"([0-9]{1,12}([KMGTkmgt][Bb]?)?)?")  # empty: the partition's default, as None
_PARTITION = re.compile(r"[A-Za-z0-9_.,:+-]{0,200}")  # empty: the cluster's default, as None


def control_character(text: str) -> str | None:
    """The first control character of `text` (U+0000-U+001F, U+007F-U+009F, line and paragraph separators) as
    `U+XXXX`, or None."""
    for ch in text:
        if ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F or ch in "\u2028\u2029":
            return f"U+{ord(ch):04X}"
    return None


def check_shell_text(text: str, what: str) -> None:
    """ValueError naming `what` when `text` holds a control character (it would break its line of the script)."""
    bad = control_character(text)
    if bad is not None:
        raise ValueError(f"{what} holds the control character {bad}, which would break the batch script's line; "
                         f"got {short_repr(text)}")


def check_resource(name: str, value: Any, hints: dict[str, Any] | None = None) -> None:
    """ValueError naming setting `name` of `SlurmResources` when `value` is not of its type, out of its range
    (`LIMITS`), or (a string) not of its form."""
    hint = (hints or _hints())[name]
    if not fits(value, hint):
        raise ValueError(f"{name} must be {describe(hint)}, got {short_repr(value)}")
    if value is None:
        return
    if name in LIMITS:
        least, most = LIMITS[name]
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        if value < least or (name == "poll" and value <= least):
            raise ValueError(f"{name} must be {'positive' if name == 'poll' else f'at least {least:g}'}, "
                             f"got {value!r}")
        if value > most:
            raise ValueError(f"{name} must be at most {most:g}, got {value!r}")
    elif name == "partition":
        check_shell_text(value, "partition")
        if not _PARTITION.fullmatch(value):
            raise ValueError(f"partition must be a partition name (letters, digits, _.,:+-), got {short_repr(value)}")
    elif name == "mem":
        check_shell_text(value, "mem")
        if not _MEM.fullmatch(value):
            raise ValueError(f"mem must be a size such as 16G or 800M (units K, M, G, T), got {short_repr(value)}")
    elif name == "sbatch":
        for key, option in value.items():
            check_sbatch_option(key, option)


def check_sbatch_option(key: Any, value: Any) -> None:
    """ValueError naming an extra sbatch option that is not a word with a one-line string value, or that is one the
    launcher sets itself (`RESERVED`)."""
    if not isinstance(key, str) or not _WORD.fullmatch(key):
        raise ValueError(f"sbatch option {short_repr(key)} must be a word (letters, digits, - and _, without its "
                         "dashes), e.g. account")
    if not isinstance(value, str):
        raise ValueError(f"sbatch option {key!r} must have a string value, got {short_repr(value)}")
    check_shell_text(value, f"sbatch option {key!r}")
    owner = RESERVED.get(key.replace("_", "-").lower())
    if owner == "the launcher's":
        raise ValueError(f"sbatch option {key!r} is set by the launcher itself")
    if owner:
        raise ValueError(f"sbatch option {key!r} has a setting of its own: use {owner} "
                         f"(--{owner.replace('_', '-')}, or {owner} = ... in [slurm])")


def short_repr(value: Any, limit: int = 60) -> str:
    """`repr(value)`, cut to about `limit` characters (a 5,000-character value stays a one-line message)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def load_resources(toml_path: PathLike | None, flags: dict[str, Any]) -> SlurmResources:
    """The defaults, then the `[slurm]` table of `toml_path` (when it has one), then the given `flags` (None: not
    given; `sbatch`'s options added to the table's); each value checked where it comes from: UsageError in one line
    naming the file and key, or the flag."""
    values: dict[str, Any] = {}
    hints = _hints()
    if toml_path is not None:
        table = read_toml(toml_path, "config").get("slurm", {})
        where = f"{toml_path}: [slurm]"
        if not isinstance(table, dict):
            raise UsageError(f"{toml_path}: slurm must be a table ([slurm])")
        known = {f.name for f in fields(SlurmResources)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise UsageError(f"{where}: unknown key {short_repr(unknown[0])} (known: {', '.join(sorted(known))})")
        for key, value in table.items():
            check_type(value, hints[key], f"{where} {key}")
            _checked(key, value, hints, where)
        values = dict(table)
    for key, value in flags.items():
        if value is None:
            continue
        _checked(key, value, hints, f"--{key.replace('_', '-')}")
        values[key] = {**values.get("sbatch", {}), **value} if key == "sbatch" else value
    resources = SlurmResources(**{**field_defaults(SlurmResources), **values})
    try:
        resources.check()
    except ValueError as e:
        raise UsageError(f"slurm resources: {e}") from None
    return resources


def _checked(key: str, value: Any, hints: dict[str, Any], where: str) -> None:
    try:
        check_resource(key, value, hints)
    except ValueError as e:
        raise UsageError(f"{where}: {e}") from None


def _hints() -> dict[str, Any]:
    return typing.get_type_hints(SlurmResources)
