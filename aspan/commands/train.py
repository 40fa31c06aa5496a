"""`aspan train`: train a tiny model from scratch, or fine-tune a checkpoint, on a task (on-the-fly data or JSONL);
the command parses its flags and calls `aspan.applications.train.train_run`."""
from __future__ import annotations

import argparse

import aspan.applications.train as app
from aspan.config import to_toml
from aspan.curves import stop_set
from aspan.errors import UsageError

from ..options import CURVE_METRICS, STOP_RULES
from .argtypes import device, nonneg_float, nonneg_int, output_dir, positive_float, positive_int, unit_float
from .grammar import add_config, add_quiet, from_settings, given

HELP = "train a model from scratch or fine-tune a checkpoint (--init) on a task; resumable (--resume)"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan train --task reversal --out runs/tiny --steps 40 --n-layers 2 --n-heads 4 --d-model 32 --eval-samples 16",
    "aspan train --init reversal --task reversal --param length=11-20 --train-only qk-pair:1 --replay 0.5 --steps 50 "
    "--lr 1e-2 --out runs/ft",
    "aspan train --task reversal --out runs/tiny --steps 80 --n-layers 2 --n-heads 4 --d-model 32 --eval-samples 16 "
    "--resume",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options and arguments of `aspan train` to its parser."""
    p.add_argument("--task", help="task name (default: the task of the --data samples)")
    p.add_argument("--split", choices=("id", "ood"), help="preset to train on")
    p.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="override a task parameter (repeatable)")
    p.add_argument("--data", help="train on this `aspan data` JSONL file instead of generating samples")
    p.add_argument("--out", type=output_dir,
                   help="run directory (required): log.jsonl, eval.jsonl, curves.jsonl, checkpoints/, final model")
    p.add_argument("--init", metavar="CKPT", help="start from this checkpoint (fine-tuning) instead of a fresh model")
    p.add_argument("--finetune", action="store_true", default=None,
                   help="the paper's fine-tuning defaults: lr 5e-6, betas (0.95, 0.999), wd 0.2, batch 4, 1 epoch")
    p.add_argument("--resume", action="store_true", default=None,
                   help="continue from the last checkpoint in --out (same data order)")
    p.add_argument("--train-only", metavar="GROUPS",
                   help="train only these parameter groups, comma-separated: qk, qk-column:C[,C...], qk-pair:I[,I...] "
                        "(RoPE pair I: columns I and I+rotary_dim/2 of W_Q and W_K), attn, mlp, embed, all")
    p.add_argument("--steps", type=positive_int,
                   help="optimiser steps (with --finetune and no --steps: --epochs passes over --data)")
    p.add_argument("--epochs", type=positive_int, help="passes over --data when --steps is not given")
    p.add_argument("--batch-size", type=positive_int, help="samples per optimiser step")
    p.add_argument("--lr", type=positive_float, help="peak learning rate of AdamW")
    p.add_argument("--weight-decay", type=nonneg_float,
                   help="AdamW weight decay (on matrices and the q/k/v biases; never on norms or other biases)")
    p.add_argument("--warmup", type=nonneg_int, help="linear warm-up steps before the cosine decay")
    p.add_argument("--grad-clip", type=positive_float, help="clip the gradient norm to this value")
    p.add_argument("--eval-every", type=nonneg_int,
                   help="evaluate every N steps (0: at the end only) on: train (the training distribution, when it "
                        "differs from both presets), id and ood (the task's presets), and each --buckets range")
    p.add_argument("--buckets", metavar="RANGES",
                   help="also evaluate each length range on its own samples, e.g. 1-10,11-20,21-30,31-50")
    p.add_argument("--replay", type=nonneg_float, metavar="SHARE",
                   help="mix this share of ID-preset samples into every batch (fine-tuning that keeps old lengths)")
    p.add_argument("--eval-samples", type=nonneg_int, help="samples per split for those evaluations")
    p.add_argument("--ckpt-every", type=nonneg_int, help="checkpoint every N steps (0: at the end only)")
    g = p.add_argument_group("learning curves and stop rules (curves.jsonl; see the command-line examples in docs/)")
    g.add_argument("--curve-every", type=nonneg_int, metavar="K",
                   help="score the curve sets every K steps (and at step 0 and the end); when not given: the K that "
                        "keeps them at <= 10%% of training time; 0: no curves")
    g.add_argument("--curve-buckets", metavar="SETS",
                   help="curve sets, comma-separated: train, id, ood and length ranges like 11-20, each with "
                        "--eval-samples held-out samples (default: the evaluation sets: train, id, ood, --buckets)")
    g.add_argument("--stop", choices=STOP_RULES,
                   help="end before --steps: none; target (--stop-bucket reaches --target); plateau (no gain of 1 "
                        "point over the last 3 curve evaluations)")
    g.add_argument("--stop-bucket", metavar="SET",
                   help="the curve set the stop rule watches: id, ood, train or a range like 11-20 (when not given: "
                        "id, else the first curve set)")
    g.add_argument("--target", type=unit_float,
                   help="accuracy in [0, 1] for --stop target; with any rule, the run records its steps-to-target")
    g.add_argument("--stop-metric", choices=CURVE_METRICS,
                   help="what the stop rule watches: exact or partial (per-token) accuracy")
    p.add_argument("--seed", type=nonneg_int, help="data order and model initialisation")
    p.add_argument("--device", type=device, help="cpu, cuda, cuda:N, or auto (CUDA when present)")
    p.add_argument("--threads", type=positive_int,
                   help="CPU threads for torch (1 is fastest for tiny models on a busy machine)")
    g = p.add_argument_group("fresh model (ignored with --init)")
    g.add_argument("--n-layers", type=positive_int, help="transformer blocks")
    g.add_argument("--n-heads", type=positive_int, help="attention heads per block")
    g.add_argument("--d-model", type=positive_int, help="residual stream width")
    g.add_argument("--positional", choices=("rotary", "learned", "alibi", "none"),
                   help="positional encoding (none = NoPE)")
    g.add_argument("--n-ctx", type=positive_int,
                   help="context length (when not given: enough for the task's OOD preset, at least 256)")
    add_quiet(p, old=None)
    add_config(p, "TrainRun", "the optimisation settings, TrainConfig, as a [train] table")
    # no argparse defaults: a flag not given leaves the settings' own (TrainConfig's, or its fine-tuning preset's)
    from_settings(p, "aspan.training:TrainConfig", presets={"--finetune": "finetune"}, only=TRAIN_KEYS)
    from_settings(p, "aspan.applications.train:TrainRun", only=RUN_KEYS)


TRAIN_KEYS = ("steps", "epochs", "batch_size", "lr", "weight_decay", "warmup", "grad_clip", "eval_every",
              "eval_samples", "ckpt_every", "seed", "device", "train_only", "curve_every", "stop", "target",
              "stop_metric")
RUN_KEYS = ("task", "split", "data", "init", "replay", "buckets", "curve_buckets", "threads", "n_layers", "n_heads",
            "d_model", "positional", "n_ctx")


def settings(args: argparse.Namespace):
    """`TrainRun` from its defaults (the fine-tuning preset with --finetune, or a --config file that says
    `finetune = true`), then --config, then the flags given, then its check; and that preset."""
    flags = {**given(args, TRAIN_KEYS, "train."), **given(args, RUN_KEYS)}
    flags.update({"params": args.param and tuple(args.param), "finetune": args.finetune, "resume": args.resume,
                  "progress": False if args.quiet else None})
    if args.stop_bucket is not None:
        flags.update({"train.stop_bucket": stop_set(args.stop_bucket), "stop_bucket_given": True})
    return app.resolved_run(flags, args.config, args.finetune)


def run(args: argparse.Namespace) -> int:
    """Run `aspan train` with the parsed arguments; the exit code."""
    import os

    run, base = settings(args)
    if args.print_config:
        print(to_toml(run, base), end="")
        return 0
    if not args.out:
        raise UsageError("--out DIR is required: the run directory")
    result = app.train_run(run, args.out)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun: the first process speaks for all
        print(app.format_result(result, args.out))
    return 0
