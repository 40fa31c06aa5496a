"""Studies that test the claims of the papers this toolkit follows: one module each, one contract, one registry.

Every study is a `Study`: a name, its settings dataclass (`config`: defaults, a `quick()` preset and a `check()`;
`aspan.config.load_config` builds it from defaults, a TOML file and flags) and `run(config, out, *, progress)`,
which runs or resumes the study in the run directory `out`, writes every output there and returns its result.
`REGISTRY` names each study's object as "module:attribute", imported on first use (`study(name)`), so reading the
registry loads neither torch nor pandas: `aspan study` builds its subcommands from it and runs every study through
it; its options live in `aspan/commands/studies/<command>.py`.

    from aspan.applications.studies import study
    parity = study("parity")
    table = parity.run(parity.config.quick(), "runs/parity", progress=False)
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Study(Protocol):
    """What every study is (see the module docstring)."""

    name: str  # its key in REGISTRY
    config: type  # its settings dataclass

    def run(self, config: Any, out: str | Path, *, progress: bool = True) -> Any:
        """Run (or resume) the study with `config` (checked first) in the run directory `out`; every output written
        there; `progress`: a progress bar on stderr. Returns the study's result (its table or tables)."""


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
