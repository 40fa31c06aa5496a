"""Task parameters given as text (`key=value`, as `--param` takes them): typed like the parameter's default."""
from __future__ import annotations

import inspect
import re
from typing import Any, Iterable

from . import task_class

_RANGE = re.compile(r"^\s*(-?\d+)\s*[-,]\s*(-?\d+)\s*$")
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def parse_bool(text: str) -> bool:
    """`true/false`, `yes/no`, `on/off` or `1/0` (any case) as a bool; ValueError otherwise."""
    t = text.strip().lower()
    if t in _TRUE or t in _FALSE:
        return t in _TRUE
    raise ValueError(f"expected a boolean (true/false, yes/no, on/off, 1/0), got {text!r}")


def parse_range(text: str) -> int | list[int]:
    """`5` -> 5, `5-10` or `5,10` -> [5, 10]; ValueError otherwise."""
    m = _RANGE.match(text)
    if m:
        return [int(m.group(1)), int(m.group(2))]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected an int or a range like 5-10 or 5,10, got {text!r}") from None


def parse_value(text: str, like: Any = None) -> Any:
    """Parse a `--param` value shaped like the parameter's default `like` (None: guess bool, int, range, string)."""
    if isinstance(like, bool):
        return parse_bool(text)
    if isinstance(like, str):
        return text
    if isinstance(like, (int, tuple, list)):
        return parse_range(text)
    if text.strip().lower() in ("true", "false", "yes", "no", "on", "off"):
        return parse_bool(text)
    try:
        return parse_range(text)
    except ValueError:
        return text


def task_defaults(name: str) -> dict[str, Any]:
    """{parameter: default} of a task's constructor (None where it has no default)."""
    sig = inspect.signature(task_class(name))
    return {k: (None if p.default is inspect.Parameter.empty else p.default) for k, p in sig.parameters.items()}


def parse_params(name: str, items: Iterable[str]) -> dict[str, Any]:
    """`["key=value", ...]` -> typed keyword arguments for task `name`; ValueError naming an unknown key."""
    defaults = task_defaults(name)
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--param must look like key=value, got {item!r}")
        if key not in defaults:
            raise ValueError(f"unknown parameter {key!r} for task {name}; its parameters: {', '.join(defaults)}")
        try:
            out[key] = parse_value(text, defaults[key])
        except ValueError as e:
            raise ValueError(f"parameter {key}: {e}") from None
    return out
