"""`aspan eval MODEL`: accuracy (teacher-forced or greedy), per-length table and AttnScore correct vs error
(`aspan.applications.eval.run_eval`)."""
from __future__ import annotations

import argparse

from aspan.config import load_config, to_toml
from aspan.errors import UsageError
from aspan.options import MODEL_DTYPES, MODES

from .argtypes import device, nonneg_int, output_dir, output_file, positive_int
from .grammar import Once, add_config, add_deprecated, add_quiet, from_settings, given

HELP = "evaluate a checkpoint on a task split: exact/partial accuracy per length, AttnScore correct vs error"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan eval reversal -n 16 --no-attn --quiet",
    "aspan eval reversal --split ood --buckets 11-15,16-20 -n 50 --out runs/eval",
    "aspan eval runs/tiny --mode generate --heads 1.3,1.5 -o records.jsonl",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `EvalRun`'s fields, by the same names; none has an argparse default (a flag not given is None),
    so the defaults live on `EvalRun` alone and `--help` shows them from there."""
    p.add_argument("checkpoint", metavar="MODEL", nargs="?",
                   help="aspan checkpoint or training run directory, HF checkpoint dir, .gguf file, or 'smollm2' "
                        "(required unless the --config file names it)")
    p.add_argument("--task", help="task name (default: the checkpoint's training task)")
    p.add_argument("--any-task", action="store_true", default=None,
                   help="score a model on another task than the one it was trained on (refused otherwise)")
    p.add_argument("--split", choices=("id", "ood"), help="preset")
    p.add_argument("--param", action="append", dest="params", metavar="KEY=VALUE",
                   help="override a task parameter (repeatable)")
    p.add_argument("-n", "--samples", type=positive_int, help="number of samples")
    p.add_argument("--mode", choices=MODES, help="teacher forcing or greedy generation")
    p.add_argument("--seed", type=nonneg_int, help="sample seed")
    p.add_argument("--batch-size", type=positive_int, help="evaluation batch size")
    p.add_argument("--heads", metavar="L.H,...", help="heads for attn_heads_sample/_raw, e.g. 1.3,1.5 (layer.head)")
    p.add_argument("--delta", type=int, help="score references shifted by this key offset")
    p.add_argument("--no-attn", action="store_true", help="accuracy only (skip the AttnScore forwards)")
    p.add_argument("--buckets", metavar="RANGES",
                   help="evaluate each length range on its own -n samples, e.g. 1-10,11-20,21-30,31-50")
    p.add_argument("--bucket", type=positive_int,
                   help="length bucket width of the table (default: 1, or 5 beyond 15 lengths)")
    p.add_argument("--device", type=device, help="cpu, cuda, cuda:N, or auto (CUDA when present)")
    p.add_argument("--dtype", choices=MODEL_DTYPES,
                   help="precision the model is loaded in (bfloat16 and float16 take half the memory)")
    p.add_argument("--threads", type=positive_int,
                   help="CPU threads for torch (1 is fastest for tiny models on a busy machine)")
    p.add_argument("-o", "--output", type=output_file, action=Once, help="write per-token records to this JSONL file")
    p.add_argument("--out", dest="run_dir", type=output_dir, metavar="DIR", action=Once,
                   help="run directory: also write run.json, summary.json and records.jsonl there (for `aspan report`)")
    add_quiet(p, old=None)
    add_config(p, "EvalRun")
    from_settings(p, "aspan.applications.eval:EvalRun")
    add_deprecated(p, "--run-dir", "--out", dest="run_dir", type=output_dir, metavar="DIR")


FIELDS = ("checkpoint", "task", "any_task", "split", "samples", "mode", "seed", "batch_size", "heads", "delta",
          "buckets", "bucket", "device", "dtype", "threads", "output", "run_dir")


def settings(args: argparse.Namespace):
    """`EvalRun` from its defaults, then --config, then the flags given, then its check."""
    from aspan.applications.eval import EvalRun

    if args.checkpoint is None and args.config is None:
        raise UsageError("MODEL is required (or a --config file that names its checkpoint)")
    flags = {**given(args, FIELDS), "params": args.params and tuple(args.params),
             "attn": False if args.no_attn else None, "progress": False if args.quiet else None}
    return load_config(EvalRun, toml_path=args.config, flags=flags, name="eval")


def run(args: argparse.Namespace) -> int:
    """Run `aspan eval` with the parsed arguments; the exit code."""
    from aspan.applications.eval import run_eval

    cfg = settings(args)
    if args.print_config:
        print(to_toml(cfg), end="")
        return 0
    run_eval(cfg, echo=print)  # the headline and tables as they come
    return 0
