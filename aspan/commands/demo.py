"""`aspan demo`: the main job. Shipped tiny reversal model: ID vs OOD, head ranking with the offset scan, the
paper's recipe beside the toolkit's own causal search for the best edit within an ID budget and the patching upper
bound (all through the experiment engine), printed tables and an offline HTML report (see
`aspan.applications.demo`)."""
from __future__ import annotations

import argparse
import shlex

from ..applications.settings import DemoConfig
from ..config import load_config, to_toml
from ..options import CONVENTIONS, EOS_REFS
from .argtypes import config_file, device, nonneg_int, output_dir, points_fraction, positive_int, shard
from .grammar import PRINT_CONFIG_HELP, add_deprecated, add_quiet, from_settings
from .launcher_options import add_launcher_options, check_launcher, run_launched

HELP = "run the end-to-end demo (shipped reversal model): OOD failure, attention, causal repair search, HTML report"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan demo --quick --out runs/demo",
    "aspan demo --samples 200 --id-budget 1 --out runs/demo200",
    "aspan demo --samples 200 --id-budget 1 --shard 0/4 --out runs/demo200",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `DemoConfig`'s fields; none has an argparse default (a flag not given is None, so it never
    overrides --config), and `--help` shows the defaults from `DemoConfig` (and its `--quick` preset's)."""
    parser.add_argument("--config", metavar="TOML", type=config_file,
                        help="settings from a TOML file (keys: DemoConfig fields); flags given override it")
    parser.add_argument("--task", help="task (only reversal ships a model; others train one first, ~minutes)")
    parser.add_argument("--out", type=output_dir, help="run directory; the report is OUT/report.html")
    parser.add_argument("--samples", type=positive_int, help="samples per evaluation set")
    parser.add_argument("--gen-samples", type=positive_int, help="samples per split for greedy generation")
    parser.add_argument("--seed", type=nonneg_int, help="data (and training) seed")
    parser.add_argument("--train", action="store_true", default=None,
                        help="train a model instead of loading the shipped checkpoint")
    parser.add_argument("--model", metavar="DIR",
                        help="a checkpoint directory to load instead of the shipped model (e.g. one "
                             "scripts/train_default.py --seed N wrote)")
    parser.add_argument("--steps", type=positive_int,
                        help="training steps when training (when not given: 1500 reversal, 1000 others)")
    parser.add_argument("--device", type=device, help="torch device (when not given: cuda when available, else cpu)")
    parser.add_argument("--threads", type=positive_int, help="torch CPU threads (1: fastest for this tiny model)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (for tests): a few samples, a small search")
    parser.add_argument("--id-budget", type=points_fraction, metavar="PP",
                        help="selection rule: the largest OOD exact gain whose drop of ID exact accuracy is at most "
                             "PP percentage points (when not given: 1)")
    parser.add_argument("--convention", choices=CONVENTIONS,
                        help="AttnScore convention of the attention-share ranking: sample (the paper's public code: "
                             "mass on the references over the mass on the sample's own columns) or raw (over the whole "
                             "row)")
    parser.add_argument("--eos", choices=("both", *EOS_REFS),
                        help="how the search may treat the end-of-sequence row (no references): leave it alone "
                             "(none), edit it on the reference map continued one row (extrapolate), or try both and "
                             "let the selection rule decide (when not given: both)")
    parser.add_argument("--shard", type=shard, metavar="I/N",
                        help="evaluate only shard I of N of the intervention grid (resumable rows), then stop; a run "
                             "without --shard reuses every shard's rows")
    add_quiet(parser, old=None)
    parser.add_argument("--print-config", action="store_true", help=PRINT_CONFIG_HELP)
    add_launcher_options(parser)
    from_settings(parser, "aspan.applications.settings:DemoConfig", presets={"--quick": "quick_config"},
                  only=("task", "out", "samples", "gen_samples", "seed", "threads", "convention"))
    add_deprecated(parser, "--rank-convention", "--convention", dest="convention", choices=CONVENTIONS)


def run(args: argparse.Namespace) -> int:
    """Run `aspan demo` with the parsed arguments; the exit code."""
    check_launcher(args)
    kw = {k: v for k, v in dict(task=args.task, out=args.out, samples=args.samples, gen_samples=args.gen_samples,
                                 seed=args.seed, train=args.train, model=args.model, steps=args.steps,
                                 device=args.device, threads=args.threads, convention=args.convention).items()
          if v is not None}
    flags = {**kw, "id_budget": args.id_budget, "shard": args.shard,  # id_budget: a fraction (argtypes)
             "eos": EOS_REFS if args.eos == "both" else args.eos and (args.eos,)}
    # the demo's defaults (or --quick's tiny sizes), then --config, then the flags given; checked before any model loads
    cfg = load_config(DemoConfig, toml_path=args.config, flags=flags,
                      base=DemoConfig.quick_config() if args.quick else None, name="demo")
    if args.print_config:
        print(to_toml(cfg), end="")
        return 0
    points = None if args.id_budget is None else f"{args.id_budget * 100:.12g}"  # as given, for the command line
    shard_text = "/".join(map(str, args.shard)) if args.shard else None
    given = {"config": args.config, **kw, "id_budget": points, "shard": shard_text, "eos": args.eos}
    words = [f"--{k.replace('_', '-')} {shlex.quote(str(v))}" for k, v in given.items()
             if v is not None and k != "train"]
    switches = ["--train"] * bool(args.train) + ["--quick"] * bool(args.quick)
    command = " ".join(["aspan demo", *words, *switches])
    if args.launcher == "slurm":
        return run_launched(args, "demo", cfg, command)
    from ..applications.demo import run_demo  # torch, pandas: after every setting is checked

    # run_demo holds the run directory for this job and configuration; its summary printed here
    run_demo(cfg, command=command, log=print, progress=not args.quiet)
    return 0
