"""One contract for every study: the registry's four studies share `run(config, out, *, progress)`, `aspan study`
runs each through the registry, and their quick runs write the rows recorded in `data/study_quick_rows.json` (by
`study_rows.py`, with the command line of the code before the studies shared the contract)."""
from __future__ import annotations

import dataclasses
import inspect
import json
import math
from importlib import import_module
from pathlib import Path

import pytest

from aspan import findings
from aspan.applications import studies
from aspan.applications.studies import REGISTRY, STUDIES, Study, study
from aspan.cli import main
from aspan.environment import torch_threads

from .study_rows import QUICK, by_key, rows

RECORDED = json.loads((Path(__file__).parent / "data" / "study_quick_rows.json").read_text(encoding="utf-8"))


def test_the_registry_holds_the_four_studies_and_their_subcommands():
    assert set(REGISTRY) == set(QUICK) == {"qk", "parity", "abc", "abc-paper"}
    assert STUDIES == ("qk", "abc", "parity")
    with pytest.raises(KeyError, match="registered: qk"):
        study("nope")


@pytest.mark.parametrize("name", REGISTRY)
def test_every_study_keeps_the_contract(name):
    s = study(name)
    assert isinstance(s, Study) and s.name == name
    assert dataclasses.is_dataclass(s.config) and callable(s.config.quick) and callable(s.config.check)
    s.config.quick().check()
    params = list(inspect.signature(s.runner).parameters.values())
    assert [p.name for p in params[:2]] == ["config", "out"]
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params[:2])
    for name, default in (("progress", True), ("unit", None)):
        p = inspect.signature(s.runner).parameters[name]
        assert p.kind is p.KEYWORD_ONLY and p.default is default
    assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in params[2:])  # the rest are optional
    assert s.rows and all(name.endswith(".jsonl") for name in s.rows)


def test_a_wrong_object_in_the_registry_is_refused(monkeypatch):
    monkeypatch.setitem(REGISTRY, "qk", studies.Registered("aspan.applications.studies.abc:STUDY", "qk", "x"))
    with pytest.raises(TypeError, match="is not the Study 'qk'"):
        study("qk")


def test_every_study_has_its_finding():
    """The report answers every registered study in words (the findings know them under the same names)."""
    assert set(findings.STUDY_FINDINGS) == set(REGISTRY)


@pytest.mark.parametrize("name", QUICK)
def test_the_study_command_runs_each_study_through_the_registry(name, tmp_path, monkeypatch):
    """`aspan study ...` builds the settings, then calls the registered study's `run`; here a stand-in records the
    call instead of training."""
    import aspan.commands.study as command

    calls = []

    class StandIn:
        def __init__(self, real: Study):
            self.name, self.config, self.real = real.name, real.config, real

        def run(self, config, out, *, progress=True, **options):
            calls.append((self.name, config, Path(out), progress, options))
            return "result"

    monkeypatch.setattr(command, "study", lambda n: StandIn(study(n)))
    argv, _ = QUICK[name]
    shown = []
    mod = import_module(f"aspan.commands.studies.{argv[1]}")
    monkeypatch.setattr(mod, "show", lambda args, config, result: shown.append(result) or 0)
    assert main([*argv, "--out", str(tmp_path / "run"), "--quiet"]) == 0
    assert len(calls) == 1 and shown == ["result"]
    ran, config, out, progress, options = calls[0]
    assert ran == name and type(config) is study(name).config and out == tmp_path / "run" and progress is False
    assert config == study(name).config.quick(**({"threads": 1} if name == "parity" else {}))
    assert set(options) <= {"command", "report"}


def _same(got, want, where: str) -> None:
    """Equal, floats to 1e-6 relative: the same training on another CPU's kernels (AVX2 or AVX-512) rounds
    differently, and a loss after a quick run moves in its 7th digit (parity's final loss: 2.9177591 recorded,
    2.9177588 on an AVX-512 machine); a change of what is computed moves it far more."""
    if isinstance(want, float) and isinstance(got, float):
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-6, abs=1e-12), where
    elif isinstance(want, dict) and isinstance(got, dict):
        assert sorted(got) == sorted(want), where
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list) and isinstance(got, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


@pytest.mark.hooked  # the rows were recorded on HookedTransformer (the bridge builds and initialises its own model)
@pytest.mark.parametrize("name", QUICK)
def test_quick_rows_match_the_recorded_rows(name, tmp_path):
    """Each study's quick run through the registry, from Python, on one CPU thread (as recorded), writes the same
    rows (timings aside) as before the studies shared one contract."""
    s = study(name)
    config = s.config.quick(**({"threads": 1} if name == "parity" else {}))
    with torch_threads(1):
        s.run(config, tmp_path / name, progress=False)
    got, want = rows(tmp_path / name, name), RECORDED[name]
    want = by_key(want)  # recorded in another order before the rows gained fields
    assert len(got) == len(want) > 0
    _same(got, want, name)
