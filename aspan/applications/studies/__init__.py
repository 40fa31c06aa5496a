"""Studies that test the claims of the papers this toolkit follows: one module each, one contract, one registry.

Every study is a `Study`: a name, its settings dataclass (`config`: defaults, a `quick()` preset and a `check()`;
`aspan.config.load_config` builds it from defaults, a TOML file and flags), its `units` and `run(config, out, *,
progress, unit)`, which runs or resumes the study in the run directory `out`, writes every output there and returns
its result. `REGISTRY` names each study's object as "module:attribute", imported on first use (`study(name)`), so
reading the registry loads neither torch nor pandas: `aspan study` builds its subcommands from it and runs every study
through it; its options live in `aspan/commands/studies/<command>.py`.

    from aspan.applications.studies import study
    parity = study("parity")
    table = parity.run(parity.config.quick(), "runs/parity", progress=False)

Units. A study's training runs fall into units (`Unit`): independent pieces of work, each keyed by a stable string
(a condition's learning-rate grid, one seed of a condition, ...), that can run alone and in parallel
(`run(..., unit=KEY)`, `aspan study NAME --unit K`, one Slurm array task each under `--launcher slurm`). A learning
rate chosen on the first seed makes the other seeds depend on it, so units come in stages: a unit reads the rows of
the earlier stages (and refuses to start, naming the unit it waits for, when they are not on disk) and never those of
its own stage. A unit appends its rows to its own row files (`unit_file`: `runs.unit-3.jsonl` beside `runs.jsonl`,
each line one whole write, as `aspan.io.RowWriter` keeps rows), so parallel units share no file, on any shared
filesystem; it writes no table, figure or report. A run without a unit holds every unit's lock (`hold_units`: a unit job
started meanwhile is refused, and a unit job still running refuses it), merges the unit files into the study's row
files (`merge_units`), then runs what is still missing and writes every output: after every unit, it trains nothing
and its output is that of a one-process run (the same rows; row order within a file may differ, rows are keyed). A
file named like a unit file that is not one of the study's units' refuses every run (`check_unit_files`).
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any, Callable, Iterator

from ...environment import torch_threads
from ...errors import UsageError
from ...io import PathLike, claim_run, union_rows, write_lines


@dataclass(frozen=True)
class Unit:
    """One independent piece of a study's work."""

    key: str  # stable: the same settings give the same keys, in the same order (e.g. "seed 1/qk/replay 0")
    stage: int  # 0, 1, ...: a unit may read the rows of units of earlier stages, never of its own


@dataclass(frozen=True)
class Study:
    """One registered study: its settings, how it splits into units, and how it runs. `runner(config, out, *,
    progress, unit, **options)` runs (or resumes) all of it (`unit` None: merging unit files first, writing every
    output) or only the unit with key `unit` (its rows only, into its unit files); `planner(config)` lists its units
    in run order; `rows` names the row files its units write (JSONL in the run directory)."""

    name: str  # its key in REGISTRY
    config: type  # its settings dataclass
    runner: Callable[..., Any]
    planner: Callable[[Any], list[Unit]]
    rows: tuple[str, ...]  # row files, e.g. ("runs.jsonl",)

    def units(self, config: Any) -> list[Unit]:
        """The units of `config` (checked first), in the order a one-process run runs them, stage by stage."""
        config.check()
        return sorted(self.planner(config), key=lambda u: u.stage)

    def unit(self, config: Any, which: str | int) -> tuple[int, Unit]:
        """(index, unit) of `which`: an index of `units(config)` or a unit's key; KeyError naming the choices."""
        units = self.units(config)
        text = str(which)
        if text.isascii() and text.isdigit() and len(text) < 10 and int(text) < len(units):  # not "²", not 5,000 digits
            return int(text), units[int(text)]
        try:
            index = unit_index(units, text)
        except KeyError:
            shown = repr(text) if len(text) <= 60 else f"{text[:60]!r}... ({len(text)} characters)"
            raise KeyError(f"no unit {shown} in study {self.name}: 0-{len(units) - 1} or a key of --list-units") \
                from None
        return index, units[index]

    def run(self, config: Any, out: str | Path, *, progress: bool = True, unit: str | None = None,
            **options: Any) -> Any:
        """Run (or resume) the study with `config` (checked first) in the run directory `out`; every output written
        there; `progress`: a progress bar on stderr; `unit`: only that unit's runs (its key), no outputs; `options`:
        what the study's runner takes besides (its command line for run.json, ...). Returns the study's result (its
        table or tables; None for a unit).

        Without `unit`, the whole run holds every unit's lock (`hold_units`) from the merge of the unit files to its
        last output: a unit job (`--unit K`, a Slurm array task) cannot train the runs it trains, and a unit job
        still running refuses it in one line. A unit file that is not one of this study's units refuses either
        (`check_unit_files`)."""
        units = self.units(config)
        check_unit_files(out, len(units), self.rows)
        if unit is not None:
            return self.runner(config, Path(out), progress=progress, unit=unit, **options)
        with hold_units(out, len(units)):
            if any(len(row_files(out, name)) > 1 for name in self.rows):
                _merge(Path(out), len(units), self.rows)
            return self.runner(config, Path(out), progress=progress, unit=unit, **options)


def unit_file(out: PathLike, name: str, index: int | None) -> Path:
    """Where the unit of index `index` appends the rows of row file `name` (None: the study's own file)."""
    path = Path(out) / name
    return path if index is None else path.with_name(f"{path.stem}.unit-{index}{path.suffix}")


def row_files(out: PathLike, name: str) -> list[Path]:
    """Row file `name` of run directory `out` and its unit files, in unit order (what a unit reads)."""
    path = Path(out) / name

    def index(p: Path) -> int:
        text = p.stem.rpartition(".unit-")[2]
        return int(text) if text.isascii() and text.isdigit() and len(text) < 10 else -1
    return [path, *sorted(path.parent.glob(f"{path.stem}.unit-*{path.suffix}"), key=index)]


def study_rows(out: PathLike, name: str, fields: tuple[str, ...] = (), what: str = "", *,
               unique: bool = True) -> list[dict]:
    """Every row of row file `name` and of its unit files (by key, the study's own first; `unique=False`: every row
    a file holds under a key, as `union_rows`)."""
    return union_rows([p for p in row_files(out, name) if p.exists()], fields, what, unique=unique)


def unit_index(units: list[Unit], key: str | None) -> int | None:
    """The index of the unit of key `key` (None: None); KeyError naming it when there is none."""
    if key is None:
        return None
    for i, u in enumerate(units):
        if u.key == key:
            return i
    raise KeyError(f"no unit {key!r}")


def check_unit_files(out: PathLike, n_units: int, names: tuple[str, ...]) -> None:
    """UsageError in one line naming the first file beside row files `names` in `out` that looks like a unit file
    (`runs.unit-K.jsonl`) but is not one of the study's `n_units` units' (`unit_file`): `rows.unit-99.jsonl` of a
    study of 5 units, `rows.unit-abc.jsonl`. Such a file is another run's: the study neither reads, merges nor
    deletes it."""
    path = Path(out)
    own = {unit_file(path, name, i).name for name in names for i in range(n_units)}
    for name in names:
        for p in row_files(path, name)[1:]:
            if p.name not in own:
                raise UsageError(f"{p}: not a unit file of this study (its units are 0-{n_units - 1}); move it out "
                                 f"of {path}")


@contextlib.contextmanager
def hold_units(out: PathLike, n_units: int, command: str | None = None) -> Iterator[None]:
    """Hold the lock of every unit of `n_units` in `out` (each `claim_run` with the unit as shard, what a unit job
    holds), in index order, as `command` (default: this process's command line); a unit job still running refuses in
    one line, naming its command."""
    with contextlib.ExitStack() as held:
        for i in range(n_units):
            held.enter_context(claim_run(out, shard=(i, n_units), command=command))
        yield


def merge_units(out: PathLike, units: list[Unit], names: tuple[str, ...]) -> int:
    """The rows of every unit file of `names` appended to the study's own files, in unit order, then the unit files
    removed; holding each unit's lock meanwhile (a unit still running refuses the merge in one line, naming its
    command). A keyed row whose key the study's file or an earlier unit file holds is left out (a run computed
    twice); the rows of one file are all kept (a study may record several rows under one key, and logs have none).
    Only the study's own unit files are merged: any other file named like one refuses the merge before it starts
    (`check_unit_files`). Returns the number of unit files merged."""
    check_unit_files(out, len(units), names)
    if not any(len(row_files(out, name)) > 1 for name in names):
        return 0
    with hold_units(out, len(units), "the merge of the units"):
        return _merge(Path(out), len(units), names)


def _merge(path: Path, n_units: int, names: tuple[str, ...]) -> int:
    """`merge_units` inside the hold on every unit's lock, of unit files already checked."""
    found = {name: [p for p in (unit_file(path, name, i) for i in range(n_units)) if p.exists()] for name in names}
    for name, files in found.items():
        if files:
            rows = union_rows([path / name, *files], unique=False)
            write_lines(path / name, (json.dumps(r, sort_keys=True, allow_nan=False, default=str) for r in rows))
            for f in files:
                f.unlink()
    return sum(map(len, found.values()))


@dataclass(frozen=True)
class Registered:
    """One study in REGISTRY: where its object is and which `aspan study` subcommand runs it."""

    study: str  # "module:attribute" of its `Study` object
    command: str  # the subcommand of `aspan study` (whose options are `aspan/commands/studies/<command>.py`)
    summary: str  # what it tests, in one line


REGISTRY: dict[str, Registered] = {
    "qk": Registered("aspan.applications.studies.qk:STUDY", "qk",
                     "which attention parameters must change for a model to work at longer lengths"),
    "abc": Registered("aspan.applications.studies.abc:STUDY", "abc",
                      "attention bias calibration and scaling (Duan & Shi 2023), this toolkit's aligned variant"),
    "abc-paper": Registered("aspan.applications.studies.abc_paper:STUDY", "abc",
                            "attention bias calibration under Duan & Shi 2023's own protocol (--protocol paper)"),
    "parity": Registered("aspan.applications.studies.parity:STUDY", "parity",
                         "does the scratchpad's format decide length generalization on parity (Ebrahimi et al. "
                         "2024)"),
}
STUDIES = tuple(dict.fromkeys(r.command for r in REGISTRY.values()))  # the subcommands: "qk", "abc", "parity"


def study(name: str) -> Study:
    """The registered study `name` (its module imported now); KeyError naming the registered ones."""
    if name not in REGISTRY:
        raise KeyError(f"no study {name!r}; registered: {', '.join(REGISTRY)}")
    module, _, attribute = REGISTRY[name].study.partition(":")
    found = getattr(import_module(module), attribute)
    if not isinstance(found, Study) or found.name != name:
        raise TypeError(f"{REGISTRY[name].study} is not the Study {name!r}")
    return found


def protocol_fields(raw: dict[str, Any], protocol: str) -> dict[str, Any]:
    """A study's `--config` file less what is not its settings: a `[slurm]` table (the resources of `--launcher
    slurm`) and a top-level `protocol` key (which `--print-config` writes where a command runs more than one protocol,
    e.g. `aspan study abc --protocol paper`), which must name `protocol`: ValueError naming it otherwise."""
    named = raw.get("protocol", protocol)
    if named != protocol:
        raise ValueError(f"protocol: this file is for protocol {named!r}, these settings are protocol {protocol!r}'s "
                         "(aspan study abc --protocol NAME reads each)")
    return {k: v for k, v in raw.items() if k not in ("slurm", "protocol")}


def study_threads(threads: int | None) -> contextlib.AbstractContextManager[None]:
    """torch on `threads` CPU threads inside the block (None or 0: torch's choice), the caller's count restored
    afterwards (`aspan.environment.torch_threads`): a study's `--threads` leaves the process that called it alone."""
    return torch_threads(threads)
