"""The one signal policy of the command line: SIGTERM (a cluster's time limit) and SIGINT (Ctrl-C) set a flag; the
command stops at its next safe point (`check`: between training steps, after a result row is written, between
samples written), with what it has done saved, and exits non-zero.

A handler that raised instead lost the signal whenever it arrived while a `__del__` ran (Python prints "Exception
ignored in ..." and goes on): the command then finished and exited 0. A flag cannot be lost: a command that reaches
no safe point after the signal still exits 130 or 143 (`aspan.cli.main` asks `received`). A second signal of the same
kind raises at once, for a user who does not want to wait for the safe point.

Only the command line installs the handlers (`handled`); a library caller's process keeps its own, and `check` does
nothing there.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

from .errors import Terminated

_received: list[int] = []  # the signals received since `handled` was entered, in order


def received() -> int | None:
    """The first stop signal received while `handled` is active (signal.SIGTERM or signal.SIGINT), else None."""
    return _received[0] if _received else None


def _raise(signum: int):
    raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def check() -> None:
    """A safe point: raise `KeyboardInterrupt` (SIGINT) or `Terminated` (SIGTERM) when a stop signal was received,
    so the command unwinds here, where its state is whole (atomic writers remove their temporary files)."""
    if _received:
        _raise(_received[0])


def _handler(signum, frame) -> None:
    if signum in _received:  # the second of its kind: the user will not wait for the next safe point
        _raise(signum)
    _received.append(signum)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """While the command runs: SIGTERM and SIGINT set the flag (main thread only; the old handlers are restored and the
    flag cleared after). SIGINT is left alone where the process ignores it (a shell's background job). Nested inside
    another `handled` (a command run by a command, as `aspan gpu slice` runs its studies) it changes nothing: a
    signal the inner command stopped for still stops the outer one."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is _handler:
        yield
        return
    _received.clear()
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig, was in old.items():
        if not (sig == signal.SIGINT and was == signal.SIG_IGN):
            signal.signal(sig, _handler)
    try:
        yield
    finally:
        for sig, was in old.items():  # None: a handler not set from Python, which cannot be put back
            signal.signal(sig, signal.SIG_DFL if was is None else was)
        _received.clear()
