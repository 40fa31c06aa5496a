"""`aspan train`: train a tiny model from scratch, or fine-tune a checkpoint, on a task (on-the-fly data or JSONL)."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..options import CURVE_METRICS, STOP_RULES
from .argtypes import device, nonneg_float, nonneg_int, output_dir, positive_float, positive_int, unit_float

HELP = "train a model from scratch or fine-tune a checkpoint (--init) on a task; resumable (--resume)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", help="task name (default: the task of the --data samples)")
    p.add_argument("--split", default="id", choices=("id", "ood"), help="preset to train on (default id)")
    p.add_argument("--param", action="append", default=[], metavar="K=V", help="task parameter override (repeatable)")
    p.add_argument("--data", help="train on this `aspan data` JSONL file instead of generating samples")
    p.add_argument("--out", required=True, type=output_dir,
                   help="run directory: log.jsonl, eval.jsonl, curves.jsonl, checkpoints/, final model")
    p.add_argument("--init", metavar="CKPT", help="start from this checkpoint (fine-tuning) instead of a fresh model")
    p.add_argument("--finetune", action="store_true",
                   help="the paper's fine-tuning defaults: lr 5e-6, betas (0.95, 0.999), wd 0.2, batch 4, 1 epoch")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out (same data order)")
    p.add_argument("--train-only", metavar="GROUPS",
                   help="train only these parameter groups, comma-separated: qk, qk-column:C[,C...], qk-pair:I[,I...] "
                        "(RoPE pair I: columns I and I+rotary_dim/2 of W_Q and W_K), attn, mlp, embed, all")
    p.add_argument("--steps", type=positive_int,
                   help="optimiser steps (default 1500 from scratch; fine-tuning: 1 epoch of --data)")
    p.add_argument("--epochs", type=positive_int, help="passes over --data when --steps is not given")
    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--lr", type=positive_float)
    p.add_argument("--weight-decay", type=nonneg_float)
    p.add_argument("--warmup", type=nonneg_int, help="linear warm-up steps before the cosine decay")
    p.add_argument("--grad-clip", type=positive_float)
    p.add_argument("--eval-every", type=nonneg_int,
                   help="evaluate every N steps (0: at the end only) on: train (the training distribution, when it "
                        "differs from both presets), id and ood (the task's presets), and each --buckets range")
    p.add_argument("--buckets", metavar="RANGES",
                   help="also evaluate each length range on its own samples, e.g. 1-10,11-20,21-30,31-50")
    p.add_argument("--replay", type=nonneg_float, default=0.0, metavar="SHARE",
                   help="mix this share of ID-preset samples into every batch (fine-tuning that keeps old lengths)")
    p.add_argument("--eval-samples", type=nonneg_int, help="samples per split for those evaluations (default 200)")
    p.add_argument("--ckpt-every", type=nonneg_int, help="checkpoint every N steps (0: at the end only)")
    g = p.add_argument_group("learning curves and stop rules (curves.jsonl; see README)")
    g.add_argument("--curve-every", type=nonneg_int, metavar="K",
                   help="score the curve sets every K steps (and at step 0 and the end); default: the K that keeps "
                        "them at <= 10%% of training time; 0: no curves")
    g.add_argument("--curve-buckets", metavar="SETS",
                   help="curve sets, comma-separated: train, id, ood and length ranges like 11-20, each with "
                        "--eval-samples held-out samples (default: the evaluation sets: train, id, ood, --buckets)")
    g.add_argument("--stop", choices=STOP_RULES, default="none",
                   help="end before --steps: none; target (--stop-bucket reaches --target); plateau (no gain of 1 "
                        "point over the last 3 curve evaluations)")
    g.add_argument("--stop-bucket", metavar="SET",
                   help="the curve set the stop rule watches: id, ood, train or a range like 11-20 (default: id, "
                        "else the first curve set)")
    g.add_argument("--target", type=unit_float,
                   help="accuracy in [0, 1] for --stop target; with any rule, the run records its steps-to-target")
    g.add_argument("--stop-metric", choices=CURVE_METRICS, default="exact",
                   help="what the stop rule watches: exact or partial (per-token) accuracy (default exact)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="data order and model initialisation")
    p.add_argument("--device", type=device, default="auto", help="cpu, cuda, cuda:N (default: CUDA when present)")
    p.add_argument("--threads", type=positive_int,
                   help="CPU threads for torch (1 is fastest for tiny models on a busy machine)")
    g = p.add_argument_group("fresh model (ignored with --init)")
    g.add_argument("--n-layers", type=positive_int, default=2)
    g.add_argument("--n-heads", type=positive_int, default=8)
    g.add_argument("--d-model", type=positive_int, default=128)
    g.add_argument("--positional", default="rotary", choices=("rotary", "learned", "alibi", "none"),
                   help="positional encoding (default rotary; none = NoPE)")
    g.add_argument("--n-ctx", type=positive_int,
                   help="context length (default: enough for the task's OOD preset, at least 256)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def task_pair(name: str, split: str, items: list[str]):
    """(train task, id task, ood task): the training task is the `split` preset with every `--param` override; the ID
    and OOD presets keep their own values of the parameters they set (so `--param length=11-20` trains on 11-20
    while `id` still means lengths 1-10) and take the other overrides (e.g. charset)."""
    from aspan import tasks
    from aspan.commands.data import parse_params

    overrides = parse_params(name, items)
    presets = tasks.presets(name)
    own = {s: tasks.preset(name, s, **{k: v for k, v in overrides.items() if k not in presets[s]})
           for s in ("id", "ood")}
    return tasks.preset(name, split, **overrides), own["id"], own["ood"]


# Bytes in memory per byte of an `aspan data` JSON line, bounded (a reversal line of ~230 bytes is a ~2.2 kB sample)
DATA_MEMORY_FACTOR = 12


def check_data_memory(path: str) -> None:
    """Refuse a --data file whose samples could not be held in memory, before reading it."""
    from aspan.checks import check_memory

    size = Path(path).stat().st_size if Path(path).is_file() else 0
    check_memory(DATA_MEMORY_FACTOR * size, f"--data {path}", f"{size:,} bytes of JSON lines, up to "
                 f"{DATA_MEMORY_FACTOR} times that as samples")


def check_workload(cfg, config, n_tokens: int, evaluated: list, device: str) -> None:
    """Refuse a --batch-size whose activations (forward and backward, sequences of up to `n_tokens` tokens) or an
    --eval-samples whose evaluation sets (one per task in `evaluated`) cannot fit in memory, before anything is
    generated or trained."""
    from aspan.checks import check_batch_memory, check_sample_memory

    check_batch_memory(cfg, config.batch_size, n_tokens, "--batch-size", training=True, device=device)
    if config.eval_samples:
        longest = max(t.max_text_len() for t in evaluated)
        check_sample_memory(config.eval_samples * len(evaluated), longest, "--eval-samples", records=True)


def eval_sets(tasks3, buckets, n: int, seed: int) -> dict:
    """Named evaluation sets: train (only when it differs from both presets), id, ood, and `length LO-HI` buckets
    (drawn from the training task with its length set to the bucket)."""
    from aspan.buckets import bucket_sets

    train_task, id_task, ood_task = tasks3
    sets = {}
    if train_task.params() not in (id_task.params(), ood_task.params()):
        sets["train"] = train_task.generate(n, seed=seed)
    sets["id"] = id_task.generate(n, seed=seed)
    sets["ood"] = ood_task.generate(n, seed=seed)
    return {**sets, **bucket_sets(train_task, buckets, n, seed)}


def data_task(path: str, data: list, task: str | None) -> str | None:
    """The one task of the `--data` samples; UsageError when they mix tasks or contradict `--task`."""
    found = sorted({s.task for s in data if s.task})
    if len(found) > 1:
        raise UsageError(f"--data {path} mixes tasks ({', '.join(found)}): train on one task per run")
    if task and found and found[0] != task:
        raise UsageError(f"--data {path} holds {found[0]} samples but --task is {task}")
    return task or (found[0] if found else None)


def _resumes(out: Path, config) -> list[dict]:
    """The resumes recorded in `out/run.json` so far, plus this one (the step it continues from, and the run length
    before and now), so run.json says truthfully how the run was made; [] when there is nothing to resume."""
    from aspan.models.checkpoint import saved_info
    from aspan.training import latest_checkpoint

    ckpt = latest_checkpoint(out)
    if ckpt is None:
        return []
    try:
        before = json.loads((out / "run.json").read_text())
    except (OSError, ValueError):
        before = {}
    saved = saved_info(ckpt)[0]
    old = saved.get("train_config", {})
    return [*before.get("resumes", []), {"from_step": saved.get("step"), "steps_before": old.get("steps"),
                                         "epochs_before": old.get("epochs"), "steps": config.steps,
                                         "epochs": config.epochs}]


def _input_hashes(args: argparse.Namespace) -> dict[str, str]:
    """sha256 of the --data file and of the --init checkpoint (a file, or every file of a checkpoint directory):
    recorded in the run's settings and checkpoints, so a run is never continued on other inputs of the same name."""
    from aspan.io import sha256_of
    from aspan.models.checkpoint import content_hash, model_path

    hashes = {}
    if args.data:
        hashes["data_sha256"] = sha256_of(args.data)
    if args.init and model_path(args.init).exists():  # (an absent one is reported when loaded, naming what exists)
        hashes["init_sha256"] = content_hash(args.init)
    return hashes


def _check_inputs(out: str, hashes: dict[str, str], args: argparse.Namespace) -> None:
    """UsageError when --data or --init has the name the run in `out` was made with but other content."""
    from aspan.io import recorded_settings

    recorded = recorded_settings(out) if Path(out).is_dir() else None
    if not isinstance(recorded, dict):
        return
    for option, name in (("data", args.data), ("init", args.init)):
        key = f"{option}_sha256"
        if name is None or recorded.get(option) != name or recorded.get(key) == hashes.get(key):
            continue  # (another name is another configuration: `claim` names that difference)
        if recorded.get(key) is None:
            raise UsageError(f"--{option} {name}: {out} was made by an earlier aspan that recorded no hash of it, so "
                             f"an unchanged file cannot be told from a changed one; use a new --out")
        raise UsageError(f"--{option} {name} changed since {out} was made with it (sha256 {recorded[key][:12]}... "
                         f"then, {hashes.get(key, '?')[:12]}... now): use the original, or a new --out")


def _config(args: argparse.Namespace):
    from aspan.curves import stop_set
    from aspan.training import TrainConfig

    keys = ("steps", "epochs", "batch_size", "lr", "weight_decay", "warmup", "grad_clip", "eval_every",
            "eval_samples", "ckpt_every")
    kw: dict[str, Any] = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    kw.update(seed=args.seed, device=args.device, train_only=args.train_only, curve_every=args.curve_every,
              stop=args.stop, stop_bucket=stop_set(args.stop_bucket), target=args.target, stop_metric=args.stop_metric)
    config = (TrainConfig.finetune if args.finetune else TrainConfig.scratch)(**kw)
    config.check()
    return config


def curve_items(args: argparse.Namespace, config, tasks3, buckets) -> list:
    """The curve sets (`aspan.curves.parse_curve_sets` items; [] for none): --curve-buckets, or the evaluation sets;
    UsageError for a stop rule without curves or watching a set they lack."""
    from aspan.curves import parse_curve_sets, set_name

    if not config.eval_samples and (args.curve_every or args.curve_buckets):
        raise UsageError("--curve-every and --curve-buckets need --eval-samples above 0 (the samples per curve set)")
    if not config.eval_samples or config.curve_every == 0:
        if config.stop != "none":
            raise UsageError(f"--stop {config.stop} needs learning curves: --eval-samples and --curve-every above 0")
        return []
    train_task, id_task, ood_task = tasks3
    named = ["id", "ood"] if train_task.params() in (id_task.params(), ood_task.params()) else ["train", "id", "ood"]
    items = parse_curve_sets(args.curve_buckets) if args.curve_buckets else [*named, *buckets]
    names = [set_name(i) for i in items]
    if args.stop_bucket is None and "id" not in names:
        config.stop_bucket = names[0]
    if (config.stop != "none" or config.target is not None) and config.stop_bucket not in names:
        raise UsageError(f"--stop-bucket {config.stop_bucket!r} is not a curve set (curve sets: {', '.join(names)})")
    return items


def _model(args: argparse.Namespace, alphabet: str, tasks_needed: list, device):
    """The checkpoint given by --init, or a fresh tiny model whose context covers `tasks_needed`; both checked."""
    from aspan import models
    from aspan.tokenization import CharTokenizer, check_tokenizer

    if args.init:
        model, tokenizer, _ = models.load(args.init, device=str(device))
    else:
        tokenizer = CharTokenizer.for_alphabets(alphabet)
        needed = max(models.check_context(10**9, t, tokenizer.offset) for t in tasks_needed)
        n_ctx = args.n_ctx or max(256, needed)
        model = models.tiny(tokenizer, n_layers=args.n_layers, n_heads=args.n_heads, d_model=args.d_model,
                            n_ctx=n_ctx, seed=args.seed, device=str(device), positional=args.positional)
    check_tokenizer(tokenizer, alphabet)
    for t in tasks_needed:
        models.check_context(model, t, tokenizer.offset)
    return model, tokenizer


def _print_result(result, out: str, quiet: bool) -> None:
    size = [r for r in result.history if r["kind"] == "params"]
    if quiet and size:  # (printed at the start otherwise)
        p = size[0]
        print(f"trainable parameters: {p['trainable']:,} of {p['total']:,} ({100 * p['fraction']:.2f}%)"
              + (f" ({p['train_only']})" if p["train_only"] else ""))
    last = [r for r in result.history if r["kind"] == "train"][-1:]
    evals = [r for r in result.history if r["kind"] == "eval" and r["step"] == (last[0]["step"] if last else -1)]
    if last:
        print(f"step {last[0]['step']}: loss {last[0]['loss']:.4f}, {last[0]['tokens_per_s']:,.0f} tokens/s")
    for r in evals:
        print(f"  {r['split']}: exact {r['exact']:.3f}, partial {r['partial']:.3f} (n={r['n']})")
    stop = result.stop or {}
    if stop.get("curve_every"):
        cost = "" if stop["curve_cost"] is None else f", {100 * stop['curve_cost']:.1f}% of the training time"
        print(f"learning curves every {stop['curve_every']} steps in curves.jsonl{cost}; ended at step {stop['step']} "
              f"({stop['reason']})")
    print(f"model written to {Path(out)} (load with aspan.models.load or `aspan eval {out}`)")


def _eval_figures(history: list[dict], out: Path) -> None:
    """figures/eval_exact.json and eval_partial.json: accuracy against step, one line per evaluation set."""
    import pandas as pd

    from aspan import viz
    from aspan.io import save_figure

    rows = pd.DataFrame([r for r in history if r.get("kind") == "eval"])
    if rows.empty:
        return
    for metric in ("exact", "partial"):
        fig = viz.accuracy_vs_strength(rows, y=metric, x="step", group="split",
                                       title=f"{metric} accuracy during training, per evaluation set")
        save_figure(fig, out / "figures" / f"eval_{metric}.json")


def run(args: argparse.Namespace) -> int:
    import torch

    from aspan import models
    from aspan.buckets import bucket_task, parse_buckets
    from aspan.curves import curve_sets
    from aspan.environment import run_environment
    from aspan.io import claim_run, write_json
    from aspan.models.backend import backend_of
    from aspan.training import ARCHITECTURE, RESUME_FREE, Replay, read_jsonl, resolve_device, train

    if args.finetune and not args.init:
        raise UsageError("--finetune (the paper's fine-tuning defaults) needs --init CKPT, the model to fine-tune")
    if args.threads:
        torch.set_num_threads(args.threads)
    config = _config(args)
    buckets = parse_buckets(args.buckets)
    if not 0 <= args.replay < 1:
        raise ValueError(f"--replay must be in [0, 1), got {args.replay}")
    device = resolve_device(config.device)
    if args.data:
        check_data_memory(args.data)
    data = read_jsonl(args.data) if args.data else None
    hashes = _input_hashes(args)
    _check_inputs(args.out, hashes, args)
    name = data_task(args.data, data, args.task) if data else args.task
    if not name:
        raise ValueError("--task is required (the --data samples do not name their task)")
    tasks3 = task_pair(name, args.split, args.param)
    curves = curve_items(args, config, tasks3, buckets)
    texts = "".join(t.alphabet for t in tasks3) + "".join(s.text for s in data or [])
    needed = [*tasks3, *(bucket_task(tasks3[0], b) for b in [*buckets, *curves] if not isinstance(b, str))]
    model, tokenizer = _model(args, "".join(sorted(set(texts))), needed, device)
    if config.steps is None and data is None:
        raise ValueError("fine-tuning on generated data needs --steps (one epoch is only defined for --data)")
    trained = [len(s.text) for s in data] if data else [t.max_text_len() for t in tasks3[: 2 if args.replay else 1]]
    check_workload(model.cfg, config, tokenizer.offset + max(trained) + 1, needed, str(device))
    eval_data = eval_sets(tasks3, buckets, config.eval_samples, config.seed) if config.eval_samples else None
    curve_data = curve_sets(dict(zip(("train", "id", "ood"), tasks3)), curves, config.eval_samples, config.seed)
    meta = {"task": name, "params": tasks3[0].params(), "id_params": tasks3[1].params(),
            "ood_params": tasks3[2].params(), "init": args.init, "data": args.data, "replay": args.replay,
            "positional": models.positional_of(model), **hashes}
    stream = data if data is not None else tasks3[0]
    if args.replay:
        stream = Replay(stream, tasks3[1], args.replay)
    # one job per run directory (rank 0 holds it under torchrun), one configuration: what defines the weights
    settings = {"command": "train", **{k: v for k, v in meta.items() if k != "ood_params"}, "split": args.split,
                "backend": backend_of(model).name,
                "model": {k: getattr(model.cfg, k, None) for k in ARCHITECTURE},
                "config": {k: v for k, v in vars(config).items() if k not in RESUME_FREE}}
    main = int(os.environ.get("RANK", "0")) == 0
    with claim_run(args.out, settings) if main else contextlib.nullcontext():
        resumes = _resumes(Path(args.out), config) if args.resume else []
        result = train(model, tokenizer, stream, config, out_dir=args.out, eval_data=eval_data, resume=args.resume,
                       progress=not args.quiet, meta=meta, curve_data=curve_data or None)
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            return 0
        _print_result(result, args.out, args.quiet)
        _eval_figures(result.history, Path(args.out))
        write_json(Path(args.out) / "run.json",
                   {"command": "train", "task": name, "split": args.split, "params": tasks3[0].params(),
                    "seed": args.seed, "buckets": [list(b) for b in buckets], "replay": args.replay,
                    "config": dict(vars(config)), "init": args.init, "data": args.data, **hashes,
                    "resumes": resumes, "stop": result.stop, **run_environment(model)})
    return 0
