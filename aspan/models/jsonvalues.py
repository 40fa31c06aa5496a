"""Checks of single JSON values read from a model file: each check returns None for a good value, or what the
value must be (the words of a one-line error)."""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Literal

# TransformerLens's activation names (`transformer_lens.utilities.activation_functions.SUPPORTED_ACTIVATIONS`).
ActFn = Literal["solu", "solu_ln", "gelu_new", "gelu_fast", "silu", "relu", "gelu", "gelu_pytorch_tanh", "xielu",
                "relu2"]
Dtype = Literal["float32", "float16", "bfloat16", "float64"]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    """A finite JSON number a float can hold (an integer of 400 digits cannot)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return abs(x) < 2**1000 if isinstance(x, int) else math.isfinite(x)


def _int(lo: int, optional: bool = False, also: tuple = ()) -> Callable[[Any], str | None]:
    def check(x):
        if (optional and x is None) or x in also and _is_int(x):
            return None
        return None if _is_int(x) and x >= lo else f"must be an integer >= {lo}{' or null' if optional else ''}"
    return check


def _number(positive: bool = False, optional: bool = False) -> Callable[[Any], str | None]:
    def check(x):
        if optional and x is None:
            return None
        if not _is_number(x) or (positive and x <= 0):
            return f"must be a finite {'positive ' if positive else ''}number{' or null' if optional else ''}"
        return None
    return check


def _bool(optional: bool = False) -> Callable[[Any], str | None]:
    return lambda x: None if isinstance(x, bool) or (optional and x is None) else "must be true or false"


def _choice(*values: Any) -> Callable[[Any], str | None]:
    return lambda x: None if any(x is v or (x == v and type(x) is type(v)) for v in values) else \
        f"must be one of {', '.join(map(repr, values))}"


def _text(optional: bool = False) -> Callable[[Any], str | None]:
    return lambda x: None if (optional and x is None) or (isinstance(x, str) and len(x) <= 200) else \
        "must be a string (at most 200 characters)"


def _refused(value: Any, why: str) -> Callable[[Any], str | None]:
    return lambda x: None if x is value or (x == value and type(x) is type(value)) else \
        f"must be {json.dumps(value)}: {why}"


def _layer_types(x: Any) -> str | None:
    if x is None or (isinstance(x, list) and all(t in ("global", "local") for t in x)):
        return None
    return "must be null or a list of 'global' / 'local'"


_POSITIVE, _OPT_POSITIVE, _NUMBER, _POS_NUMBER = _int(1), _int(1, optional=True), _number(), _number(positive=True)


def _short(value: Any, limit: int = 60) -> str:
    """`repr(value)` (a string as it is) cut to `limit` characters."""
    text = value if isinstance(value, str) and limit > 60 else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
