"""aspan: study why transformers fail to extrapolate, by looking at and editing their attention.

    import aspan
    model, tokenizer, meta = aspan.load("reversal")
    ood = aspan.preset("reversal", "ood", length=(11, 20)).generate(64, seed=0)
    print(aspan.evaluate(model, tokenizer, ood).summary())

The entry points below are imported lazily (on first use), so `import aspan` stays light: it loads neither
torch nor TransformerLens. The attention hooks themselves are the separate `hooks` package.
"""
from __future__ import annotations

import importlib
import logging
from typing import Any

__version__ = "0.2.0"

# Library modules report through loggers under "aspan"; the application (or `aspan`'s command line) decides where
# their messages go. Without a decision of its own they go nowhere (no "No handlers could be found" fallback).
logging.getLogger(__name__).addHandler(logging.NullHandler())


def _shadowed_hooks() -> str | None:
    """Why the `hooks` package beside `aspan` would not be the one imported, or None: a `hooks.py` (or another
    `hooks` package) earlier on `sys.path`, e.g. in the working directory, takes its place."""
    import importlib.util
    import sys
    from pathlib import Path

    ours = Path(__file__).resolve().parent.parent / "hooks" / "__init__.py"
    module = sys.modules.get("hooks")
    try:
        spec = module.__spec__ if module is not None else importlib.util.find_spec("hooks")
    except (ImportError, ValueError, AttributeError):
        spec = None
    if spec is None:
        where = "nothing (no `hooks` package is installed)"
    elif spec.origin and spec.origin not in ("namespace", "built-in", "frozen"):
        if Path(spec.origin).resolve() == ours:
            return None
        where = spec.origin
    else:  # a directory named hooks without an __init__.py: a namespace package
        where = f"the directory {next(iter(spec.submodule_search_locations or []), '?')}"
    return f"aspan needs its own `hooks` package ({ours.parent}), but `import hooks` finds {where}: rename that " \
           f"file or take its directory off sys.path"


_SHADOWED = _shadowed_hooks()
if _SHADOWED is not None:
    raise ImportError(_SHADOWED, name="hooks")

# public name -> (module, attribute); attribute None means the module itself
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "tasks": ("aspan.tasks", None),
    "models": ("aspan.models", None),
    "Sample": ("aspan.tasks", "Sample"),
    "Task": ("aspan.tasks", "Task"),
    "preset": ("aspan.tasks", "preset"),
    "CharTokenizer": ("aspan.tokenization", "CharTokenizer"),
    "make_batch": ("aspan.batching", "make_batch"),
    "load": ("aspan.models", "load"),
    "save": ("aspan.models", "save"),
    "tiny": ("aspan.models", "tiny"),
    "check_model": ("aspan.models", "check_model"),
    "evaluate": ("aspan.evaluation", "evaluate"),
    "summarize": ("aspan.evaluation", "summarize"),
    "correct_vs_error": ("aspan.evaluation", "correct_vs_error"),
    "rank_heads": ("aspan.experiments.ranking", "rank_heads"),
    "select_heads": ("aspan.experiments.ranking", "select_heads"),
    "TrainConfig": ("aspan.training", "TrainConfig"),
    "train": ("aspan.training", "train"),
    "Replay": ("aspan.training", "Replay"),
    "parse_train_only": ("aspan.param_groups", "parse_train_only"),
    "bucket_sets": ("aspan.buckets", "bucket_sets"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import an entry point on first access (PEP 562) and cache it on the package."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'aspan' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
