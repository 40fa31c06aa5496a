"""One unit of a GPU slice in its own process (`aspan.applications.slice_units.run_units` starts it):

    python -m aspan.commands.gpu_worker --until EPOCH --checkpoint-s SECONDS -- ASPAN ARGUMENTS...

runs the `aspan` command line after `--` under a time budget that ends at `EPOCH` (a `time.time()` value: the
slice's deadline, shared by every process on the machine) and exits with the command's code, or with
`PAUSED_EXIT` when the budget paused a training (checkpointed; the next slice continues it)."""
from __future__ import annotations

import sys
import time

from ..applications.slice_units import PAUSED_EXIT
from ..cli import main as aspan


def parse(argv: list[str]) -> tuple[float, float, list[str]]:
    """(deadline epoch, checkpoint seconds, the aspan command line); ValueError naming what is wrong."""
    if "--" not in argv:
        raise ValueError("usage: gpu_worker --until EPOCH --checkpoint-s SECONDS -- ASPAN ARGUMENTS...")
    head, command = argv[: argv.index("--")], argv[argv.index("--") + 1:]
    options = dict(zip(head[::2], head[1::2]))
    if len(head) % 2 or set(options) != {"--until", "--checkpoint-s"} or not command:
        raise ValueError("usage: gpu_worker --until EPOCH --checkpoint-s SECONDS -- ASPAN ARGUMENTS...")
    return float(options["--until"]), float(options["--checkpoint-s"]), command


def main(argv: list[str] | None = None) -> int:
    """Run the command line under the deadline; its exit code, or `PAUSED_EXIT` when the budget paused it."""
    from ..training import BudgetSpent, TimeBudget, time_budget

    try:
        until, checkpoint_s, command = parse(sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        print(f"aspan gpu worker: {e}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + (until - time.time())
    try:
        with time_budget(TimeBudget(deadline, checkpoint_s)):
            return aspan(command)
    except BudgetSpent as e:
        print(f"aspan gpu worker: paused: {e}", file=sys.stderr)
        return PAUSED_EXIT


if __name__ == "__main__":
    sys.exit(main())
