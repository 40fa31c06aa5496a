"""`aspan gpu`: a study campaign in slices of a few minutes of GPU time (`aspan.applications.campaign`).

    aspan gpu slice --plan configs/gpu/campaign.toml --campaign results/gpu_campaign/state --out /tmp/slice
    aspan gpu merge /tmp/slice --campaign results/gpu_campaign/state
    aspan gpu status --plan configs/gpu/campaign.toml --campaign results/gpu_campaign/state
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from ..applications import campaign as c
from ..cli import main
from ..errors import UsageError

HELP = "advance a study campaign by one time-limited GPU slice (device checks first), merge a slice, show progress"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan gpu status --plan configs/gpu/campaign.toml --campaign results/gpu_campaign/state",
    "aspan gpu slice --plan configs/gpu/campaign.toml --campaign results/gpu_campaign/state --out /tmp/slice",
    "aspan gpu merge /tmp/slice --campaign results/gpu_campaign/state",
)
PLAN = "configs/gpu/campaign.toml"
CAMPAIGN = "results/gpu_campaign/state"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options and arguments of `aspan gpu` to its parser."""
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("slice", help="device checks, then the first unfinished runs until the budget is spent")
    m = sub.add_parser("merge", help="apply a slice's output (run.json and state archive) to the campaign")
    st = sub.add_parser("status", help="print how far the campaign is")
    for q in (s, st):
        q.add_argument("--plan", default=PLAN, metavar="TOML", help=f"the campaign (default {PLAN})")
    for q in (s, m, st):
        q.add_argument("--campaign", default=CAMPAIGN, metavar="DIR", help=f"campaign directory (default {CAMPAIGN})")
    s.add_argument("--out", required=True, metavar="DIR", help="where run.json and the state archive go")
    s.add_argument("--device", default="cuda", help="cuda (default) or cpu (tests)")
    s.add_argument("--budget", type=float, metavar="SECONDS", help="wall seconds of the slice (default: the plan's)")
    s.add_argument("--no-checks", action="store_true", help="skip the device checks")
    m.add_argument("slice", metavar="SLICE_DIR", help="a slice's --out directory")
    m.add_argument("--slices", default=None, metavar="DIR",
                   help="also copy its run.json here as slice-<started>.json (default: the campaign's parent/slices)")


def run(args: argparse.Namespace) -> int:
    """Run `aspan gpu` with the parsed arguments; the exit code."""
    from dataclasses import replace

    if args.action == "merge":
        record = c.merge_slice(args.slice, args.campaign)
        slices = Path(args.slices) if args.slices else Path(args.campaign).parent / "slices"
        slices.mkdir(parents=True, exist_ok=True)
        name = "slice-" + record["started"].replace(":", "") + ".json"
        shutil.copyfile(Path(args.slice) / "run.json", slices / name)
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

    record = c.run_slice(plan, c.Slice(Path(args.campaign), Path(args.out), main, args.device))
    print(json.dumps({k: record[k] for k in ("runs", "wall_s", "parts")}, default=str))
    print(c.format_status(record["status"]))
    return 0
