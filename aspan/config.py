"""One way to build a settings dataclass from what a user gave: `load_config`.

The layers, each overriding the one before: the dataclass's defaults (or a preset such as a `quick()` config), the
keys of a TOML file, the command-line flags that were actually given, then the dataclass's own check (`check()`).
Every mistake is one `UsageError` line naming the file and the key (an unknown key, a wrong type) or the flag, raised
before any model loads or any run directory is created.

    cfg = load_config(QKStudyConfig, toml_path="configs/qk_study_gpu.toml", flags={"steps": 10})

A TOML file's keys are the dataclass's fields, its arrays the fields' tuples. A dataclass whose file has another
shape (sections, renamed keys) says how it maps a parsed file to fields in a classmethod `toml_fields(raw, path)`
(a ValueError names the key). Flags map field names to values; None means "not given", so a command gives its
config options no argparse default (an argparse default would override the file). A dotted name sets one key of
a dict field (`{"finetune.steps": 50}`, the flag `--steps`), or one field of a nested settings dataclass
(`{"train.lr": 1e-3}`), which a file gives as a table (`[train]`, over `base`'s value of it where given).
`to_toml` writes the settings back in that form (`--print-config`).
"""
from __future__ import annotations

import dataclasses
import math
import re
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, TypeVar, Union

from .errors import UsageError
from .io import PathLike, read_toml

C = TypeVar("C")


def load_config(cls: type[C], *, toml_path: PathLike | None = None, flags: Mapping[str, Any] | None = None,
                base: C | None = None, name: str = "config", check: Callable[[C], None] | None = None) -> C:
    """`cls` from its defaults (or `base`), then the TOML file `toml_path`'s keys, then the given `flags` (None
    values are not given), then its check (`check`, default its `check()` method); UsageError in one line naming
    the file and key, or the flag (`name` says what the settings are when no file is given)."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}  # field -> where its value came from, for the message of a failed check
    if toml_path is not None:
        values = toml_values(cls, toml_path, hints, name, base)
        sources = dict.fromkeys(values, str(toml_path))
    defaults = field_defaults(cls) if base is None else {f.name: getattr(base, f.name) for f in dataclasses.fields(cls)}
    for key, value in (flags or {}).items():
        if value is None:
            continue
        field, _, item = key.partition(".")
        flag = "--" + (item or field).replace("_", "-")
        if field not in hints:
            raise UsageError(f"{flag}: {cls.__name__} has no setting {field!r}")
        if item and dataclasses.is_dataclass(hints[field]):  # one field of a nested settings dataclass
            value = _nested_flag(values.get(field, defaults.get(field)), item, value, flag)
        elif item:  # one key of a dict field, on top of the file's (or the default) dict
            value = {**values.get(field, defaults.get(field, {})), item: value}
        else:
            check_type(value, hints[field], flag)
        values[field], sources[field] = value, flag
    where = str(toml_path) if toml_path is not None else name
    try:
        cfg = cls(**{**defaults, **values})
    except TypeError as e:  # a required setting the file does not give
        missing = re.findall(r"'(\w+)'", str(e))
        raise UsageError(f"{where}: missing required key {missing[0] if missing else str(e)!r}") from None
    check = check or getattr(cls, "check", None)
    if check is not None:
        try:
            check(cfg)
        except ValueError as e:
            raise UsageError(f"{_culprit(str(e), sources, where)}: {e}") from None
    return cfg


def file_value(path: PathLike, key: str, name: str = "config") -> Any:
    """The value of one top-level key of a TOML settings file (None where it has none), for a command whose defaults
    depend on it (`aspan train`'s `finetune` picks the fine-tuning preset)."""
    return read_toml(path, name).get(key)


def field_defaults(cls: type) -> dict[str, Any]:
    """The default of every field of dataclass `cls` that has one."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def toml_values(cls: type, path: PathLike, hints: dict[str, Any], name: str = "config",
                base: Any = None) -> dict[str, Any]:
    """The fields a TOML file sets (its arrays as tuples, a table of a nested settings dataclass as that dataclass,
    over `base`'s where given), each of its field's type; UsageError naming the file and the key that is unknown, of
    the wrong type, or (through `cls.toml_fields`) otherwise bad."""
    raw = read_toml(path, name)
    if hasattr(cls, "toml_fields"):
        try:
            raw = cls.toml_fields(raw, Path(path))
        except ValueError as e:
            raise UsageError(f"{path}: {e}") from None
    unknown = sorted(set(raw) - set(hints))
    if unknown:
        raise UsageError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(hints))})")
    values = {key: as_tuples(value, hints[key]) for key, value in raw.items()}
    for key, value in values.items():
        if isinstance(value, dict) and dataclasses.is_dataclass(hints[key]):  # a [table] of a nested dataclass
            values[key] = value = _nested_table(hints[key], value, f"{path}: {key}", getattr(base, key, None))
        check_type(value, hints[key], f"{path}: {key}")
    return values


def _nested_table(cls: type, table: dict[str, Any], where: str, base: Any = None) -> Any:
    """A TOML table as the nested settings dataclass `cls` (its keys checked like a file's), over `base` (a preset
    of it) where given; UsageError naming the table and key."""
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(table) - set(hints))
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(hints))})")
    values = {key: as_tuples(value, hints[key]) for key, value in table.items()}
    for key, value in values.items():
        check_type(value, hints[key], f"{where}.{key}")
    try:
        return cls(**values) if base is None else dataclasses.replace(base, **values)
    except ValueError as e:
        raise UsageError(f"{where}: {e}") from None


def _nested_flag(current: Any, item: str, value: Any, flag: str) -> Any:
    """The nested settings dataclass `current` with its field `item` set to the flag's `value` (checked)."""
    hints = typing.get_type_hints(type(current))
    if item not in hints:
        raise UsageError(f"{flag}: {type(current).__name__} has no setting {item!r}")
    check_type(value, hints[item], flag)
    try:
        return dataclasses.replace(current, **{item: value})
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from None


def as_tuples(value: Any, hint: Any) -> Any:
    """A TOML value with its arrays as tuples where the field holds tuples (a dict field keeps its lists)."""
    if isinstance(value, list) and _is(hint, list):
        return value
    if isinstance(value, list) and not _is(hint, dict):
        return tuple(as_tuples(v, Any) for v in value)
    return value


_BRIEF = reprlib.Repr()  # a value shown in an error: one short line, however long the value
_BRIEF.maxlong, _BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlevel = 40, 60, 60, 3


def check_type(value: Any, hint: Any, where: str) -> None:
    """UsageError `where: must be <type>, got <value>` when `value` is not of the type `hint`."""
    if not fits(value, hint):
        raise UsageError(f"{where}: must be {describe(hint)}, got {_BRIEF.repr(value)}")


def fits(value: Any, hint: Any) -> bool:
    """Whether `value` is of the type `hint` (the types settings dataclasses use: scalars, Literal, unions, tuples
    of one type or of fixed length, dicts). An int is a float too (it stays an int); nan and inf are not."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    if origin in (Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin is Literal:
        return value in args
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # a finite one: no setting means nan or inf (a huge integer is no float either)
        return isinstance(value, (int, float)) and not isinstance(value, bool) and _finite(value)
    if origin is tuple or hint is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(fits(v, args[0]) for v in value)
        return not args or (len(args) == len(value) and all(fits(v, a) for v, a in zip(value, args)))
    if _is(hint, dict):
        return isinstance(value, dict)
    return isinstance(value, origin or hint)


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond any float
        return False


def describe(hint: Any) -> str:
    """A type in words: `an integer`, `a list of numbers`, `one of 'a', 'b'`, `none or a string`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join("none" if a is type(None) else describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return f"a list of {_plural(args[0])}"
    if origin is tuple:
        return f"a list of {len(args)} ({', '.join(describe(a) for a in args)})" if args else "a list"
    words = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}
    return words.get(hint, "a table" if _is(hint, dict) else f"a {getattr(hint, '__name__', hint)}")


def _plural(hint: Any) -> str:
    text = describe(hint)
    return {"an integer": "integers", "a finite number": "finite numbers", "a string": "strings"}.get(text, text)


def _is(hint: Any, kind: type) -> bool:
    return hint is kind or typing.get_origin(hint) is kind


def _culprit(message: str, sources: dict[str, str], default: str) -> str:
    """Where the setting a failed check names came from (the flag, or the file), else `default`."""
    named = [sources[f] for f in re.findall(r"[A-Za-z_]+", message) if f in sources]
    flags = [s for s in named if s.startswith("--")]
    return (flags or named or [default])[0]


def to_toml(cfg: Any, base: Any = None) -> str:
    """The settings dataclass `cfg` as a TOML file that `load_config(type(cfg), toml_path=..., base=base)` reads
    back to an equal `cfg` (`--print-config`): one `key = value` line per field, a nested settings dataclass as a
    `[field]` table; a None field is left out (TOML has no null), so it reads back only where None is also the
    default (`base`'s value, or the field's; ValueError naming the field otherwise)."""
    lines, tables = _toml_lines(cfg, base, ""), []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            tables += ["", f"[{f.name}]", *_toml_lines(value, getattr(base, f.name, None), f"{f.name}.")]
    return "\n".join(lines + tables) + "\n"


def _toml_lines(cfg: Any, base: Any, prefix: str) -> list[str]:
    """`key = value` for every field of `cfg` but its nested dataclasses (None left out where it is the default)."""
    defaults = field_defaults(type(cfg)) if base is None else {f.name: getattr(base, f.name)
                                                                  for f in dataclasses.fields(base)}
    lines = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            continue
        if value is None:
            if f.name in defaults and defaults[f.name] is not None:
                raise ValueError(f"{prefix}{f.name} is None, which a TOML file cannot say "
                                 f"(default {defaults[f.name]!r})")
            continue
        lines.append(f"{f.name} = {_toml_value(value, prefix + f.name)}")
    return lines


def _toml_value(value: Any, name: str) -> str:
    """One TOML value: booleans, integers, floats, strings, arrays (tuples, lists) and inline tables (dicts)."""
    import math

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return ("-" if value < 0 else "") + ("inf" if math.isinf(value) else "nan")
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value, name)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v, name) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_string(str(k), name)} = {_toml_value(v, name)}" for k, v in value.items()) + "}"
    raise ValueError(f"{name}: a {type(value).__name__} has no TOML form")


def _toml_string(text: str, name: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, and U+007F (DEL), which JSON leaves raw and TOML forbids
    raw, as `\\u007F`; ValueError naming the field for a lone surrogate, which no TOML (or UTF-8) file can hold."""
    import json

    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in text):
        raise ValueError(f"{name}: a string with a lone surrogate has no TOML form")
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007F")
