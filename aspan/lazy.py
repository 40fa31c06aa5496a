"""A package's public names imported from their submodules on first access (PEP 562), so that importing the package
loads none of its heavy submodules: the light ones (settings the command line reads and checks) then come without
torch and pandas. A package lists its names by submodule in a `_LAZY` dict literal and takes the three module-level
functions from `lazy_exports`:

    _LAZY: dict[str, tuple[str, ...]] = {"loop": ("train",), "config": ("TrainConfig",)}
    __all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY)
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(package: str, lazy: dict[str, tuple[str, ...]]
                 ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """(`__all__`, `__getattr__`, `__dir__`) of `package` whose names `lazy` lists by submodule. `__getattr__` imports
    a listed name from its submodule on first access and caches it on the package; any other name that is a
    submodule's (`aspan.training.loop`) imports that submodule, as a package's eager imports would."""
    exports = {name: module for module, names in lazy.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in exports:
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return sorted(exports), __getattr__, __dir__
