"""`aspan eval CKPT`: accuracy (teacher-forced or greedy), per-length table and AttnScore correct vs error
(`aspan.applications.eval.run_eval`)."""
from __future__ import annotations

import argparse

from aspan.options import MODEL_DTYPES, MODES

from .argtypes import device, nonneg_int, output_dir, output_file, positive_int
from .grammar import add_quiet

HELP = "evaluate a checkpoint on a task split: exact/partial accuracy per length, AttnScore correct vs error"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="CKPT", help="checkpoint or training run directory, .gguf file, or 'smollm2'")
    p.add_argument("--task", help="task name (default: the checkpoint's training task)")
    p.add_argument("--any-task", action="store_true",
                   help="score a model on another task than the one it was trained on (refused otherwise)")
    p.add_argument("--split", default="ood", choices=("id", "ood"), help="preset (default ood)")
    p.add_argument("--param", action="append", default=[], metavar="K=V", help="task parameter override (repeatable)")
    p.add_argument("-n", "--samples", type=positive_int, default=500, help="number of samples (default 500)")
    p.add_argument("--mode", default="teacher", choices=MODES, help="teacher forcing or greedy generation")
    p.add_argument("--seed", type=nonneg_int, default=0, help="sample seed (default 0)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="evaluation batch size (default 32)")
    p.add_argument("--heads", help="heads for attn_heads_sample/_raw, e.g. 1.3,1.5 (layer.head)")
    p.add_argument("--delta", type=int, default=0, help="score references shifted by this key offset")
    p.add_argument("--no-attn", action="store_true", help="accuracy only (skip the AttnScore forwards)")
    p.add_argument("--buckets", metavar="RANGES",
                   help="evaluate each length range on its own -n samples, e.g. 1-10,11-20,21-30,31-50")
    p.add_argument("--bucket", type=positive_int,
                   help="length bucket width of the table (default: 1, or 5 beyond 15 lengths)")
    p.add_argument("--device", type=device, default="auto", help="cpu, cuda, cuda:N (default: CUDA when present)")
    p.add_argument("--dtype", default="float32", choices=MODEL_DTYPES,
                   help="precision the model is loaded in (default float32; bfloat16 and float16 take half the memory)")
    p.add_argument("--threads", type=positive_int,
                   help="CPU threads for torch (1 is fastest for tiny models on a busy machine)")
    p.add_argument("-o", "--output", type=output_file, help="write per-token records to this JSONL file")
    p.add_argument("--run-dir", type=output_dir,
                   help="also write run.json, summary.json and records.jsonl here (for `aspan report`)")
    add_quiet(p, old=None)


def run(args: argparse.Namespace) -> int:
    from aspan.applications.eval import EvalRun, run_eval

    run_eval(EvalRun(args.checkpoint, task=args.task, any_task=args.any_task, split=args.split,
                     params=tuple(args.param), samples=args.samples, mode=args.mode, seed=args.seed,
                     batch_size=args.batch_size, heads=args.heads, delta=args.delta, attn=not args.no_attn,
                     buckets=args.buckets, bucket=args.bucket, device=args.device, dtype=args.dtype,
                     threads=args.threads,
                     output=args.output, run_dir=args.run_dir, progress=not args.quiet))
    return 0
