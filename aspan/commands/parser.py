"""The `aspan` parser: one subcommand per module of `aspan.commands` (see `aspan.cli`, which runs what it parses).

Each command's options are built only for the command chosen (another command's `add_arguments` may import modules
`aspan data` should not wait for), and every (sub)command takes `-v/--verbose` and `--quiet` at its own level too
(`aspan study qk ... -v`, `aspan show --quiet`), as well as before its name (`aspan -v show`).
"""
from __future__ import annotations

import argparse
from importlib import import_module

from .. import __version__
from .grammar import QUIET_HELP, HelpFormatter, epilog

# in the order `aspan --help` lists them: each command's examples may read what an earlier command's wrote (`aspan
# eval runs/tiny` after `aspan train --out runs/tiny`, `aspan report runs/demo` after `aspan demo --out runs/demo`)
COMMANDS = ("data", "show", "train", "eval", "rank", "explain", "sweep", "abc", "demo", "pretrained", "study",
            "report", "tutorials", "gpu", "doctor")
EXIT_USAGE = 2  # a mistake in what the user asked for (`aspan.cli` adds the exit codes of a stopped command)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `aspan train: error: argument --threads: must be >= 1, got 0 (see ... --help)`."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class _Version(argparse.Action):
    """`aspan --version`: `aspan X.Y.Z`, then exit 0 (`main` answers it before building the parser; the environment,
    which needs torch and TransformerLens, is `aspan doctor`'s)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit(0)


def version_line() -> str:
    """`aspan X.Y.Z`, what `aspan --version` prints."""
    return f"aspan {__version__}"


def _load(name: str):
    return import_module(f"aspan.commands.{name}")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; given `argv`, only the chosen command's options are built (another command's `add_arguments`
    may import heavy modules, e.g. the studies', which `aspan data` should not wait for)."""
    chosen = next((a for a in argv if not a.startswith("-")), None) if argv else None
    parser = Parser(prog="aspan", description="Study and edit attention on AttentionSpan tasks.")
    parser.add_argument("--version", action=_Version, help="print aspan's version, then exit (`aspan doctor`: the "
                        "versions of the stack, the backend and the device)")
    add_verbose(parser, default=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = _load(name)
        except ModuleNotFoundError as e:  # a command not built yet must not break the others
            if e.name != f"aspan.commands.{name}":
                raise
            continue
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP, formatter_class=HelpFormatter,
                           epilog=epilog(getattr(mod, "EXAMPLES", ())))
        if chosen not in COMMANDS or chosen == name:
            mod.add_arguments(p)
        add_verbose(p, default=argparse.SUPPRESS)  # `aspan -v CMD` or `aspan CMD ... -v` (`aspan study qk ... -v`)
        p.set_defaults(_run=mod.run, _run_dir=getattr(mod, "RUN_DIR", None))
    return parser


VERBOSE_HELP = "report debug messages too (the default: information and warnings on stderr)"


def add_verbose(parser: argparse.ArgumentParser, default) -> None:
    """`-v/--verbose` and `--quiet` on `parser` and on every parser nested under it (a command's own subcommands),
    where it has no `--quiet` of its own (`grammar.add_quiet`). Given anywhere on the command line (`aspan -v show`,
    `aspan study qk --quick -v`, `aspan gpu --quiet status`), each holds: below the top they default to
    `argparse.SUPPRESS`, so a nested parser never resets what an outer one set."""
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help=VERBOSE_HELP)
    if "--quiet" not in parser._option_string_actions:
        parser.add_argument("--quiet", action="store_true", default=default, help=QUIET_HELP)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                add_verbose(child, argparse.SUPPRESS)
