"""`aspan pretrained --config FILE`: a pretrained model (SmolLM2 or any supported HF dir / .gguf) end to end:
zero/few-shot evaluation, fine-tuning with the paper's defaults, Table 2, Table 3, head ranking and a reinforcement
sweep."""
from __future__ import annotations

import argparse
import shlex

from aspan.options import MODEL_DTYPES

from ..config import load_config
from .argtypes import device, output_dir, positive_int, shard
from .grammar import PRINT_CONFIG_HELP, add_config_file, add_quiet, config_file
from .launcher_options import add_launcher_options, check_launcher, run_launched

HELP = "pretrained model end to end: few-shot eval, fine-tune (paper defaults), Table 2/3, head ranking, sweep"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan pretrained --config smollm2_smoke --out runs/smollm2-smoke",
    "aspan pretrained --config smollm2_reversal --dtype bfloat16 --threads 2",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options and arguments of `aspan pretrained` to its parser."""
    add_config_file(p, "TOML config: a file, or a config aspan ships, by name (smollm2_smoke, smollm2_reversal)")
    p.add_argument("--model", help="override the config's model: 'smollm2', an HF checkpoint dir or a .gguf file")
    p.add_argument("--out", type=output_dir, help="override the run directory")
    p.add_argument("--device", type=device, help="cpu, cuda, cuda:N (default: CUDA when present)")
    p.add_argument("--dtype", choices=MODEL_DTYPES,
                   help="override the config's dtype: the precision the model is loaded and fine-tuned in")
    p.add_argument("--threads", type=positive_int, help="CPU threads for torch (1 is fastest on a busy machine)")
    p.add_argument("--steps", type=positive_int, help="override finetune.steps")
    p.add_argument("--shard", type=shard, metavar="I/N",
                   help="fine-tune, then evaluate only shard I of N of the reinforcement grid (a job array on "
                        "identical machines); a run without --shard reuses every shard's rows")
    p.add_argument("--print-config", action="store_true",
                   help=PRINT_CONFIG_HELP.replace(", then exit", " (--shard, a flag only, left out), then exit"))
    add_quiet(p, old=None)
    add_launcher_options(p)


def run(args: argparse.Namespace) -> int:
    """Run `aspan pretrained` with the parsed arguments; the exit code."""
    check_launcher(args)
    path = config_file(args)
    from ..applications.pretrained import PretrainedConfig, run_pretrained  # pandas, torch

    args.config = path  # the launcher reads its [slurm] table from the same file
    flags = {"model": args.model, "out": args.out, "device": args.device, "dtype": args.dtype, "threads": args.threads,
             "shard": args.shard, "finetune.steps": args.steps}
    cfg = load_config(PretrainedConfig, toml_path=path, flags=flags)  # checked before the model loads
    if args.print_config:
        print(cfg.toml_text(), end="")
        return 0
    given = {k: getattr(args, k) for k in ("model", "out", "device", "dtype", "threads", "steps")}
    given["shard"] = "/".join(map(str, args.shard)) if args.shard else None
    words = [f"--{k} {shlex.quote(str(v))}" for k, v in given.items() if v is not None]
    command = " ".join(["aspan pretrained --config", shlex.quote(path), *words])
    if args.launcher == "slurm":
        return run_launched(args, "pretrained", cfg, command)
    # run_pretrained holds the run directory for this job and config; its summary printed here
    run_pretrained(cfg, command=command, log=print, progress=not args.quiet)
    return 0
