"""The signal policy (`aspan.stopping`): SIGTERM and SIGINT set a flag, the command stops at its next safe point with
its state saved and exits 143 or 130. A signal that arrives while a `__del__` runs was lost before (Python prints
"Exception ignored ..." for what the old handler raised there; the command went on and exited 0): here the signal is
sent from inside a `__del__` at a chosen moment of the command."""
from __future__ import annotations

import signal

import pytest
import torch

from aspan import models, stopping
from tests.cli import SMALL, aspan, one_line

# Code run in the command's process first: `target` is wrapped so that, on its `at`-th call, an object whose
# `__del__` sends `sig` to the process is dropped.
BOMB = """
import gc, os, signal, importlib
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever the test runner ignores
class _Bomb:
    def __del__(self):
        os.kill(os.getpid(), signal.{sig})
_module = importlib.import_module("{module}")
_original, _calls = getattr(_module, "{name}"), []
def _wrapped(*a, **k):
    _calls.append(1)
    if len(_calls) == {at}:
        _b = _Bomb()
        del _b
    return _original(*a, **k)
setattr(_module, "{name}", _wrapped)
"""


def bomb(target: str, at: int = 1, sig: str = "SIGTERM") -> str:
    module, _, name = target.rpartition(".")
    return BOMB.format(module=module, name=name, at=at, sig=sig)


@pytest.mark.parametrize("sig, code, word", [("SIGTERM", 143, "terminated"), ("SIGINT", 130, "interrupted")])
def test_a_signal_inside_a_del_is_not_lost(tmp_path, sig, code, word):
    """`aspan data -o` stops at its next sample, removes its temporary file and exits non-zero."""
    r = aspan("data", "--task", "reversal", "-n", "2000", "-o", "out.jsonl", cwd=tmp_path,
              code=bomb("aspan.applications.data.write_lines", 1, sig))
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    one_line(r.stderr, word)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_training_stops_after_the_step_it_is_in_saves_it_and_resumes_to_the_same_weights(tmp_path):
    out, straight = tmp_path / "run", tmp_path / "straight"
    r = aspan("train", *SMALL, "--steps", "6", "--out", str(out), cwd=tmp_path,
              code=bomb("aspan.training.loop._train_step", at=3))
    assert r.returncode == 143, r.stderr[-2000:]
    one_line(r.stderr, "terminated")
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-00000003"
    assert aspan("train", *SMALL, "--steps", "6", "--out", str(out), "--resume", cwd=tmp_path).returncode == 0
    assert aspan("train", *SMALL, "--steps", "6", "--out", str(straight), cwd=tmp_path).returncode == 0
    a, b = (models.load(d, device="cpu").model for d in (out, straight))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_a_signal_no_safe_point_sees_still_ends_the_command_non_zero(tmp_path):
    """`aspan show` has no safe point: it finishes, then exits 143 instead of 0."""
    r = aspan("show", "--task", "reversal", "-n", "2", cwd=tmp_path, code=bomb("aspan.applications.data.render"))
    assert r.returncode == 143, r.stderr[-2000:]
    one_line(r.stderr, "terminated")


def test_the_library_leaves_the_signal_handlers_alone():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with stopping.handled():
        assert signal.getsignal(signal.SIGTERM) is not before[0]
        signal.raise_signal(signal.SIGTERM)  # the flag, no exception
        assert stopping.received() == signal.SIGTERM
        with pytest.raises(stopping.Terminated):
            stopping.check()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert stopping.received() is None
    stopping.check()  # outside the command line: nothing to do


def test_a_nested_command_keeps_the_signal_for_the_command_that_runs_it():
    """`aspan gpu slice` runs its studies through `aspan.cli.main`: the signal a study stopped for stops the slice."""
    before = signal.getsignal(signal.SIGTERM)
    with stopping.handled():
        with stopping.handled():  # the nested command
            signal.raise_signal(signal.SIGTERM)
            assert stopping.received() == signal.SIGTERM
        assert stopping.received() == signal.SIGTERM, "the inner command's end cleared the flag"
        with pytest.raises(stopping.Terminated):
            stopping.check()
    assert signal.getsignal(signal.SIGTERM) == before and stopping.received() is None
