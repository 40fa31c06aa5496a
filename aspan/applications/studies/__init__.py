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
filesystem; it writes no table, figure or report. A run without a unit first merges the unit files into the study's
row files (`merge_units`, refused while a unit holds its lock), then runs what is still missing and writes every
output: after every unit, it trains nothing and its output is that of a one-process run (the same rows; row order
within a file may differ, rows are keyed).
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any, Callable

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
        if text.isdigit() and int(text) < len(units):
            return int(text), units[int(text)]
        try:
            index = unit_index(units, text)
        except KeyError:
            raise KeyError(f"no unit {text!r} in study {self.name}: 0-{len(units) - 1} or a key of --list-units") \
                from None
        return index, units[index]

    def run(self, config: Any, out: str | Path, *, progress: bool = True, unit: str | None = None,
            **options: Any) -> Any:
        """Run (or resume) the study with `config` (checked first) in the run directory `out`; every output written
        there; `progress`: a progress bar on stderr; `unit`: only that unit's runs (its key), no outputs; `options`:
        what the study's runner takes besides (its command line for run.json, ...). Returns the study's result (its
        table or tables; None for a unit)."""
        if unit is None and any(len(row_files(out, name)) > 1 for name in self.rows):
            merge_units(out, self.units(config), self.rows)
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
        return int(text) if text.isdigit() else -1
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


def merge_units(out: PathLike, units: list[Unit], names: tuple[str, ...]) -> int:
    """The rows of every unit file of `names` appended to the study's own files, in unit order, then the unit files
    removed; holding each unit's lock meanwhile (a unit still running refuses the merge in one line, naming its
    command). A keyed row whose key the study's file or an earlier unit file holds is left out (a run computed
    twice); the rows of one file are all kept (a study may record several rows under one key, and logs have none).
    Returns the number of unit files merged."""
    path = Path(out)
    found = {name: row_files(path, name)[1:] for name in names}
    if not any(found.values()):
        return 0
    with contextlib.ExitStack() as held:
        for i in range(len(units)):
            if any(unit_file(path, name, i) in files for name, files in found.items()):
                held.enter_context(claim_run(path, shard=(i, len(units)), command=f"the merge of unit {i}"))
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


def use_threads(threads: int | None) -> None:
    """Run torch on `threads` CPU threads (None or 0: leave torch's choice)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
