"""`aspan doctor`: what results computed here would record (versions, backend, device), one `name: value` a line;
with `--model`, whether that model can run a task (`aspan.applications.doctor`)."""
from __future__ import annotations

import argparse

from aspan.applications.doctor import DoctorRun, check_model_line, describe_environment

from .argtypes import device

HELP = "print the versions, backend and device a run here would record (as in run.json); check a model with --model"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan doctor",
    "ASPAN_BACKEND=bridge aspan doctor",
    "aspan doctor --model reversal --task reversal --param length=11-20",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The backend follows ASPAN_BACKEND, the device is the one commands pick by default; `--model` adds one line on
    whether that model can run a task (or fails in one line naming the fix)."""
    p.add_argument("--model", metavar="MODEL",
                   help="check that this model (checkpoint, HF dir, .gguf file, 'smollm2') can run the task: attention "
                        "hook points, one token per task character, vocabulary and context")
    p.add_argument("--task", help="the task it must run (default: the model's training task)")
    p.add_argument("--split", choices=("id", "ood"), default="ood",
                   help="the task's preset (ood: the longest samples it will be asked)")
    p.add_argument("--param", action="append", dest="params", default=[], metavar="KEY=VALUE",
                   help="override a task parameter (repeatable)")
    p.add_argument("--device", type=device, help="where to load the model (default: CUDA when present, else cpu)")


def run(args: argparse.Namespace) -> int:
    """Run `aspan doctor` with the parsed arguments; the exit code."""
    if args.model is None and (args.task or args.params):
        raise ValueError("--task and --param need --model (the model to check)")
    print("\n".join(describe_environment()), flush=True)  # the record first, also when the model check fails
    if args.model is not None:
        check = DoctorRun(args.model, args.task, args.split, tuple(args.params), args.device)
        print(f"model: {check_model_line(check)}")
    return 0
