"""Experiments on attention: head ranking (`ranking`), intervention sweeps (`sweep`), ABC/ABS biases (`abc`).

    ranking = rank_heads(model, tokenizer, id_samples, deltas=range(-2, 4))
    heads = select_heads(ranking, fraction=0.1)
    rows = run_sweep(SweepConfig.from_toml("configs/reversal_reinforce.toml"), "runs/sweep/sweep.jsonl")
    result = run_abc(model, tokenizer, id_samples, ood_samples)
"""
from __future__ import annotations

import importlib
from typing import Any

# submodule -> the names it defines, each imported from it on first access (PEP 562): a light submodule (`edit`, whose
# `Edit` the command line's settings hold) then loads without the others' torch and pandas
_LAZY: dict[str, tuple[str, ...]] = {
    "abc": ("ABCSettings", "HeadLines", "abc_bias", "abc_lines", "abs_bias", "abs_lines", "run_abc"),
    "ranking": ("heatmap", "offset_table", "rank_heads", "select_heads"),
    "sweep": ("SweepConfig", "grid", "run_sweep", "summary_table"),
}
_EXPORTS = {name: module for module, names in _LAZY.items() for name in names}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import a name of `__all__` from its submodule on first access and cache it on the package; a submodule's name
    (`aspan.training.loop`) imports that submodule, as the package's eager imports once did."""
    if name not in _EXPORTS:
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
