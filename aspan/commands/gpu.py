"""`aspan gpu`: a study campaign in slices of a few minutes of GPU time (`aspan.applications.campaign`).

    aspan gpu slice --plan configs/gpu/campaign.toml --campaign results/gpu_campaign/state --out /tmp/slice
    aspan gpu merge /tmp/slice --campaign results/gpu_campaign/state
    aspan gpu status --plan configs/gpu/campaign.toml --campaign results/gpu_campaign/state
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Iterator

from ..applications import campaign as c
from ..cli import build_parser, main
from ..errors import UsageError
from .argtypes import output_dir, output_file, output_file_or_stdout, positive_float

HELP = "advance a study campaign by one time-limited GPU slice (device checks first), merge a slice, show progress"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan gpu status --plan configs/gpu/campaign.toml --campaign results/gpu_campaign/state",
    "aspan gpu slice --plan configs/gpu/campaign.toml --campaign results/gpu_campaign/state --out /tmp/slice",
    "aspan gpu merge /tmp/slice --campaign results/gpu_campaign/state",
)
OUTPUTS = (output_file, output_dir, output_file_or_stdout)  # the argument types of options that name outputs
PLAN = "configs/gpu/campaign.toml"
CAMPAIGN = "results/gpu_campaign/state"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options and arguments of `aspan gpu` to its parser."""
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("slice", help="device checks, then the first unfinished runs until the budget is spent")
    m = sub.add_parser("merge", help="check a slice's output (run.json and state archive), then apply it to the "
                       "campaign, all or nothing")
    st = sub.add_parser("status", help="print how far the campaign is")
    for q in (s, st):
        q.add_argument("--plan", default=PLAN, metavar="TOML", help=f"the campaign (default {PLAN})")
    for q in (s, m, st):
        q.add_argument("--campaign", default=CAMPAIGN, metavar="DIR", help=f"campaign directory (default {CAMPAIGN})")
    s.add_argument("--out", required=True, metavar="DIR",
                   help="where run.json and the state archive go (outside the campaign directory)")
    s.add_argument("--device", default="cuda", help="cuda (default) or cpu (tests)")
    s.add_argument("--budget", type=positive_float, metavar="SECONDS",
                   help="wall seconds of the slice (default: the plan's)")
    s.add_argument("--no-checks", action="store_true", help="skip the device checks")
    m.add_argument("slice", metavar="SLICE_DIR", help="a slice's --out directory")
    m.add_argument("--slices", default=None, metavar="DIR",
                   help="also copy its run.json here as slice-<started>.json (default: the campaign's parent/slices)")


def run(args: argparse.Namespace) -> int:
    """Run `aspan gpu` with the parsed arguments; the exit code."""
    from dataclasses import replace

    if args.action == "merge":
        slices = Path(args.slices) if args.slices else Path(args.campaign).parent / "slices"
        record = c.merge_slice(args.slice, args.campaign, slices=slices)
        name = "slice-" + record["started"].replace(":", "") + ".json"
        print(f"merged {args.slice} into {args.campaign}; its record: {slices / name}", file=sys.stderr)
        return 0
    plan = c.load_plan(args.plan)
    if args.action == "status":
        print(c.format_status(c.status(plan, args.campaign)))
        return 0
    if args.budget is not None:
        if args.budget <= plan.reserve_s:
            raise UsageError(f"--budget must exceed the plan's reserve_s ({plan.reserve_s:g} s), got {args.budget:g}")
        plan = replace(plan, budget_s=args.budget)
    if args.no_checks:
        plan = replace(plan, checks=())
    c.check_out(Path(args.campaign), Path(args.out))
    check_commands(plan, args)

    record = c.run_slice(plan, c.Slice(Path(args.campaign), Path(args.out), main, args.device))
    print(json.dumps({k: record[k] for k in ("runs", "wall_s", "parts")}, default=str))
    print(c.format_status(record["status"]))
    return 0


def check_commands(plan: c.CampaignPlan, args: argparse.Namespace) -> None:
    """UsageError naming the plan's run whose command line the slice cannot run: not an `aspan` command line once
    the slice adds --out and --device, or one with an output option that points outside the campaign directory
    (the slice ships back only that directory: what is written elsewhere would be lost)."""
    campaign = Path(args.campaign).resolve()
    for i, entry in enumerate(plan.entries()):
        where = f"{args.plan}: runs[{i}].command"
        argv = [*entry.command, "--out", str(Path(args.campaign) / entry.name), "--device", args.device]
        parser, said = build_parser(argv), io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
                parsed = parser.parse_args(argv)
        except SystemExit:
            lines = said.getvalue().strip().splitlines()
            raise UsageError(f"{where} is not a command line the slice can run "
                             f"({lines[-1] if lines else 'it exits before it runs'})") from None
        for action in chosen_actions(parser, parsed):
            value = getattr(parsed, action.dest, None)
            if action.type in OUTPUTS and "--out" not in action.option_strings and value not in (None, "-") \
                    and campaign not in Path(value).resolve().parents:
                raise UsageError(f"{where}: {'/'.join(action.option_strings)} {value} writes outside the campaign "
                                 f"directory {args.campaign}, and a slice ships back only that directory")


def chosen_actions(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> Iterator[argparse.Action]:
    """The options of `parser` and of the subcommands `parsed` chose."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(parsed, action.dest, None)
            if chosen in action.choices:
                yield from chosen_actions(action.choices[chosen], parsed)
        else:
            yield action
