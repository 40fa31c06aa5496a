"""Options every command spells the same way (the command-line grammar: docs/cli-examples.md).

- `--quiet`: no progress bars. `--no-progress`, its old spelling in `rank`, `sweep`, `abc` and the studies, still
  works for one release and says so in one line on stderr.
- `--out DIR` names a run directory, `-o/--output FILE` a single file (`aspan report`'s `--out FILE` is the old
  spelling of its `-o/--output`). A value given twice, differently (`-o a -o b`, or the old and the new spelling),
  is refused (`Once`), not one of them dropped.
"""
from __future__ import annotations

import argparse
import sys

from ..errors import UsageError

QUIET_HELP = "no progress bars, warnings only"


class _Deprecated(argparse.Action):
    """An old spelling: sets `dest` like the new one (True for a switch, else the value, through the new one's
    type), after one line on stderr naming both."""

    def __init__(self, option_strings, dest, new: str, help=None, nargs=0, **kw):
        super().__init__(option_strings, dest=dest, nargs=nargs, help=help, **kw)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        notice(parser.prog, option_string, self.new)
        value = True if self.nargs == 0 else values
        refuse_second(self, parser, namespace, value)
        setattr(namespace, self.dest, value)


class Once(argparse.Action):
    """An option whose value is given once: a second, different value (the option again, or its deprecated
    spelling) is refused in one line rather than one of them dropped."""

    def __call__(self, parser, namespace, values, option_string=None):
        refuse_second(self, parser, namespace, values)
        setattr(namespace, self.dest, values)


def refuse_second(action: argparse.Action, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                  value) -> None:
    """argparse's error for `action` when its destination already holds another value than its default and
    `value` (the same setting given twice, differently)."""
    before = getattr(namespace, action.dest, None)
    if before is not None and before != parser.get_default(action.dest) and before != value:
        raise argparse.ArgumentError(action, f"given twice ({before} and {value}): give it once")


def add_deprecated(parser: argparse.ArgumentParser, old: str, new: str, dest: str, **kw) -> None:
    """`old` as a deprecated spelling of the option `new` (same `dest`; `kw`: its type and metavar)."""
    parser.add_argument(old, action=_Deprecated, dest=dest, new=new, nargs=None, default=argparse.SUPPRESS,
                        help=f"deprecated spelling of {new} (goes in the next release)", **kw)


def notice(prog: str, old: str, new: str) -> None:
    """The one-line deprecation notice on stderr: `prog: OLD is deprecated and goes in the next release; use NEW`."""
    print(f"{prog}: {old} is deprecated and goes in the next release; use {new}", file=sys.stderr)


def add_config_file(parser: argparse.ArgumentParser, help: str) -> None:
    """`--config FILE` (a command whose settings live in a TOML file of their own shape), and the positional FILE as
    its deprecated spelling (`config_file` resolves the two)."""
    parser.add_argument("old_config", nargs="?", metavar="CONFIG",
                        help="deprecated spelling of --config CONFIG (goes in the next release)")
    parser.add_argument("--config", metavar="FILE", help=help)


def config_file(args: argparse.Namespace) -> str:
    """The TOML file of `add_config_file`: --config FILE, or the old positional spelling (after a one-line notice);
    UsageError for neither or both."""
    prog = f"aspan {args.command}" if getattr(args, "command", None) else "aspan"
    if args.old_config is not None:
        if args.config is not None:
            raise UsageError(f"give the TOML file once: --config {args.config} (not also {args.old_config})")
        notice(prog, "the positional CONFIG", "--config CONFIG")
        return args.old_config
    if args.config is None:
        raise UsageError("--config FILE is required: the TOML settings file")
    return args.config


def add_quiet(parser: argparse.ArgumentParser, old: str | None = "--no-progress") -> None:
    """`--quiet` (dest `quiet`), and `old`, when given, as its deprecated alias."""
    parser.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    if old:
        parser.add_argument(old, action=_Deprecated, dest="quiet", new="--quiet", default=False,
                            help="deprecated spelling of --quiet (goes in the next release)")


# ----------------------------------------------------------------------------------------------- defaults in --help
# A command names the settings dataclass its flags fill (`from_settings`); `--help` then shows each flag's default
# as that dataclass holds it. The class is imported only when the help is printed: the settings of `eval`, `rank`,
# `abc` and `train` live beside torch, which parsing must not wait for.


def settings_class(spec: str) -> type:
    """`"aspan.applications.eval:EvalRun"` -> the class."""
    from importlib import import_module

    module, _, name = spec.partition(":")
    return getattr(import_module(module), name)


def setting_default(spec: str, field: str, preset: str | None = None):
    """The default of `field` of the dataclass `spec` (or of its classmethod preset `preset`, e.g. `finetune`);
    `dataclasses.MISSING` when it has no such field or no default."""
    import dataclasses

    cls = settings_class(spec)
    if preset is not None:
        return getattr(getattr(cls, preset)(), field, dataclasses.MISSING)
    for f in dataclasses.fields(cls):
        if f.name == field:
            if f.default is not dataclasses.MISSING:
                return f.default
            return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING
    return dataclasses.MISSING


def show_value(value) -> str | None:
    """A default as `--help` shows it (as it would be typed), or None for none worth showing (None, a switch)."""
    if value is None or isinstance(value, bool) or value == () or value == [] or value == {}:
        return None
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def shown_default(action: argparse.Action) -> str | None:
    """`default: X` (and `; FLAG: Y` for each preset whose value differs) for an action `from_settings` marked, or
    None."""
    import dataclasses

    spec, field, presets = getattr(action, "setting", (None, None, {}))
    if spec is None:
        return None
    value = setting_default(spec, field)
    shown = None if value is dataclasses.MISSING else show_value(value)
    if shown is None:
        return None
    text = f"default: {shown}"
    for flag, preset in presets.items():
        other = show_value(setting_default(spec, field, preset))
        if other is not None and other != shown:
            text += f"; {flag}: {other}"
    return text


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Epilogs (the examples) kept as written; each flag a settings dataclass fills shows that dataclass's default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        shown = shown_default(action)
        return text if shown is None or text is None else f"{text} ({shown.replace('%', '%%')})"


def from_settings(parser: argparse.ArgumentParser, spec: str, rename: dict[str, str] | None = None,
                  presets: dict[str, str] | None = None, only: tuple[str, ...] | None = None) -> None:
    """Mark the options of `parser` (those in `only`, else all) as fields of the dataclass `spec`
    (`"module:Class"`): field = the option's dest, or `rename[dest]`. `presets` maps a flag to a classmethod preset
    whose other defaults the help shows too (`{"--finetune": "finetune"}`)."""
    rename = rename or {}
    for action in parser._actions:
        if action.dest in (argparse.SUPPRESS, "help") or (only is not None and action.dest not in only):
            continue
        action.setting = (spec, rename.get(action.dest, action.dest), presets or {})


PRINT_CONFIG_HELP = "print the resolved settings as TOML (which --config reads back unchanged), then exit"


def add_config(parser: argparse.ArgumentParser, settings: str, tables: str = "") -> None:
    """`--config FILE` (a TOML file of the fields of the dataclass `settings`, nested ones as the `tables` say, under
    the flags given) and `--print-config`."""
    parser.add_argument("--config", metavar="FILE", help=f"settings from a TOML file (keys: the fields of {settings}"
                        f"{'; ' + tables if tables else ''}); flags given override it")
    parser.add_argument("--print-config", action="store_true", help=PRINT_CONFIG_HELP)


def given(args: argparse.Namespace, keys, prefix: str = "") -> dict:
    """The flags `keys` as `load_config` takes them (`prefix` + key -> value; None: not given)."""
    return {prefix + k: getattr(args, k) for k in keys}


def epilog(examples: tuple[str, ...]) -> str | None:
    """The examples section that ends a command's `--help` (its module's `EXAMPLES`), or None without examples."""
    return "examples:\n" + "\n".join(f"  {e}" for e in examples) if examples else None
