"""`aspan` command line: a thin dispatcher; each subcommand lives in `aspan.commands.<name>`.

A command module defines `HELP` (one line), `EXAMPLES` (the command lines that end its `--help`),
`add_arguments(parser)` and `run(args) -> int`; `RUN_DIR = "out"` names the option holding its run directory when
the dispatcher should hold it for the job (`aspan.io.claim_run`: a second job on the same directory fails at once).
Commands that also pin a configuration claim it themselves.

Every mistake in what the user asked for ends in one line on stderr and exit code 2, with no traceback:
argument errors, `UsageError`/`ValueError`, missing files and other OS errors on user paths, a missing optional
package (with what to install). Ctrl-C and SIGTERM set a flag (`aspan.stopping`): the command stops at its next safe
point with its state saved, prints one line and exits 130 (Ctrl-C) or 143 (SIGTERM); a closed stdout pipe
(`aspan data ... | head -1`) ends the command quietly.

Library modules report through `logging` (one logger per module, under `aspan`) and never configure it; the command
line does, for the length of one command (`reporting`): INFO and above on stderr as plain lines, `--quiet` only
warnings (and no progress bars), `-v/--verbose` debug too. A command's result (a table, a path) is printed on stdout
by the command itself.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings
from importlib import import_module

from . import __version__, stopping
from .checks import check_device
from .commands.grammar import HelpFormatter, epilog
from .errors import Terminated, UsageError, missing_package_message
from .io import claim_run

COMMANDS = ("data", "show", "train", "eval", "rank", "sweep", "abc", "report", "demo", "pretrained", "study",
            "gpu", "doctor")
EXIT_USAGE, EXIT_SIGINT, EXIT_SIGTERM = 2, 130, 143


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
    """`-v/--verbose` on `parser` and on every parser nested under it (a command's own subcommands)."""
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help=VERBOSE_HELP)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                add_verbose(child, argparse.SUPPRESS)


class _Stderr(logging.StreamHandler):
    """The command line's handler (one at a time on the `aspan` logger, however deeply commands nest)."""


class _Plain(logging.Formatter):
    """A message as it is; a warning or error prefixed with its level (`warning: ...`)."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {text}"


@contextlib.contextmanager
def reporting(args: argparse.Namespace):
    """The `aspan` loggers' output for one command: a plain handler on stderr at INFO (`--quiet`: WARNING,
    `-v`: DEBUG); the logger's level, handlers and propagation are restored afterwards (the process calling `main`,
    e.g. a test or a notebook, keeps its own logging as it was)."""
    logger = logging.getLogger("aspan")
    level = logging.DEBUG if getattr(args, "verbose", False) else (
        logging.WARNING if getattr(args, "quiet", False) else logging.INFO)
    nested = any(isinstance(h, _Stderr) for h in logger.handlers)  # `aspan gpu slice` runs commands through main
    handler = _Stderr(sys.stderr)
    handler.setFormatter(_Plain("%(message)s"))
    was = logger.level, logger.propagate
    logger.setLevel(level)
    logger.propagate = False
    if not nested:
        logger.addHandler(handler)
    try:
        yield
    finally:
        if not nested:
            logger.removeHandler(handler)
        logger.setLevel(was[0])
        logger.propagate = was[1]


def describe(error: BaseException) -> str | None:
    """The one-line message for an error the user can fix, or None for a bug (which keeps its traceback)."""
    if isinstance(error, ImportError):
        return missing_package_message(error)
    if isinstance(error, OSError) and error.filename is not None:
        names = " -> ".join(str(f) for f in (error.filename, error.filename2) if f is not None)
        return f"{names}: {error.strerror or error}"
    if isinstance(error, (ValueError, OSError, FloatingPointError)):
        text = str(error).strip() or type(error).__name__
        return text.splitlines()[0]
    return None


def _check_common(args: argparse.Namespace) -> None:
    """Options many commands share (study subcommands included, whatever their parsers), checked before any work."""
    device = getattr(args, "device", None)
    if isinstance(device, str):
        check_device(device, "--device")
    threads = getattr(args, "threads", None)
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise UsageError(f"--threads must be >= 1, got {threads}")


def _held(args: argparse.Namespace):
    """`aspan.io.claim_run` of the command's run directory (the option its `RUN_DIR` names), when it has one."""
    out = getattr(args, args._run_dir, None) if args._run_dir else None
    if not out:
        return contextlib.nullcontext()

    return claim_run(out)


def _stdout_closed() -> None:
    """The reader of our stdout went away: point stdout at /dev/null so the final flush cannot fail again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    """Run `aspan` with `argv` (default: the process's arguments); the exit code (0 ok, 2 usage, 130/143 stopped).
    The warning filters are the caller's again afterwards (a test or a notebook calling `main` keeps its own)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"HookedTransformer(\.from_pretrained)? is deprecated",
                                category=DeprecationWarning)
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    name = "aspan"
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["--version"]:  # at once: building the parser imports every command's module
        print(version_line())
        return 0
    try:
        parser = build_parser(given)
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help (0) or an argument error (2, already printed): a return code, like the rest
            return e.code if isinstance(e.code, int) else EXIT_USAGE
        if not getattr(args, "_run", None):
            parser.print_help()
            return EXIT_USAGE
        name = f"aspan {args.command}"
        _check_common(args)
        with reporting(args), stopping.handled(), _held(args):
            code = int(args._run(args) or 0)
            sys.stdout.flush()
            stopping.check()  # a signal no safe point acted on still ends the command non-zero
        return code
    except BrokenPipeError:
        _stdout_closed()
        return 0
    except KeyboardInterrupt:
        print(f"\n{name}: interrupted", file=sys.stderr)
        return EXIT_SIGINT
    except Terminated:
        print(f"{name}: terminated (SIGTERM)", file=sys.stderr)
        return EXIT_SIGTERM
    except Exception as e:  # bad input: one clear line, no traceback; anything else is a bug and keeps it
        message = describe(e)
        if message is None:
            raise
        print(f"{name}: error: {message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":  # `python -m aspan.cli`: run the one `aspan.cli` module, not this copy of it, so that a
    # command that runs commands (`aspan gpu slice`) finds this command's log handler and stop flag as its own
    from aspan.cli import main as _main

    sys.exit(_main())
