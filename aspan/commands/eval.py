"""`aspan eval CKPT`: accuracy (teacher-forced or greedy), per-length table and AttnScore correct vs error."""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Iterator

from aspan.options import MODES

from .argtypes import device, nonneg_int, output_dir, output_file, positive_int

RUN_DIR = "run_dir"  # held for the job by the dispatcher (one job per run directory), when given
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
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--heads", help="heads for attn_heads_sample/_raw, e.g. 1.3,1.5 (layer.head)")
    p.add_argument("--delta", type=int, default=0, help="score references shifted by this key offset")
    p.add_argument("--no-attn", action="store_true", help="accuracy only (skip the AttnScore forwards)")
    p.add_argument("--buckets", metavar="RANGES",
                   help="evaluate each length range on its own -n samples, e.g. 1-10,11-20,21-30,31-50")
    p.add_argument("--bucket", type=positive_int,
                   help="length bucket width of the table (default: 1, or 5 beyond 15 lengths)")
    p.add_argument("--device", type=device, default="auto", help="cpu, cuda, cuda:N (default: CUDA when present)")
    p.add_argument("--threads", type=positive_int,
                   help="CPU threads for torch (1 is fastest for tiny models on a busy machine)")
    p.add_argument("-o", "--output", type=output_file, help="write per-token records to this JSONL file")
    p.add_argument("--run-dir", type=output_dir,
                   help="also write run.json, summary.json and records.jsonl here (for `aspan report`)")


def parse_heads(text: str | None) -> list[tuple[int, int]] | None:
    """`"1.3,0.5"` (or `1:3`) -> [(1, 3), (0, 5)]."""
    if not text:
        return None
    out = []
    for item in text.split(","):
        layer, sep, head = item.strip().replace(":", ".").partition(".")
        try:
            out.append((int(layer), int(head)))
        except ValueError:
            raise ValueError(f"--heads: expected layer.head pairs like 1.3,0.5, got {item!r}") from None
    return out


def resolve_checkpoint(path: str) -> str:
    """A training run directory without a final model (a run still going, or killed) resolves to its latest
    checkpoint, and says so on stderr: the numbers are then those of an intermediate model."""
    from aspan.training import latest_checkpoint

    p = Path(path)
    if p.is_dir() and not (p / "config.json").exists() and (ckpt := latest_checkpoint(p)) is not None:
        print(f"{path} has no final model (the run is unfinished or was stopped): evaluating its latest checkpoint "
              f"{ckpt.name}", file=sys.stderr)
        return str(ckpt)
    return path


def _names_its_task(path: str) -> bool:
    """False for models that never record a task (SmolLM2, GGUF files): `--task` is then required before loading.
    Checkpoint directories are asked after loading (their formats record it in different places)."""
    return not (str(path).lower() == "smollm2" or str(path).lower().endswith(".gguf"))


def _samples(model, task, buckets, args: argparse.Namespace, offset: int) -> tuple[Iterator, list[str] | None, int]:
    """The samples to score, drawn as they are evaluated (each bucket its own -n samples, the ones `bucket_sets`
    holds, in the same order); with buckets, each sample's bucket name; and the longest text they can have. Their
    memory is checked first: one chunk at a time, and one per-sample row each."""
    from aspan import models
    from aspan.buckets import bucket_name, bucket_task
    from aspan.checks import check_batch_memory, check_eval_memory
    from aspan.evaluation import CHUNK

    every = [bucket_task(task, b) for b in buckets] if buckets else [task]
    n_tokens = max(models.check_context(model, t, offset) for t in every)
    longest = max(t.max_text_len() for t in every)
    check_eval_memory(args.samples * len(every), longest, CHUNK, "-n")
    check_batch_memory(model.cfg, args.batch_size, n_tokens, "--batch-size", training=False,
                       device=str(getattr(model.cfg, "device", None) or "cpu"))
    samples = itertools.chain.from_iterable(itertools.islice(t.stream(args.seed), args.samples) for t in every)
    names = [bucket_name(b) for b in buckets for _ in range(args.samples)] if buckets else None
    return samples, names, longest


def _bucket_output(res, names: list[str], run_dir: str | None):
    """Print the per-bucket table; with a run directory also its figure. Returns the table."""
    from aspan import viz
    from aspan.buckets import bucket_table

    table = bucket_table(res, names)
    print("\nby length bucket (each bucket its own samples):")
    print(table[["bucket", "n", "exact", "partial"]].round(4).to_string(index=False))
    if run_dir:
        long = table.melt(id_vars=["bucket"], value_vars=["exact", "partial"], var_name="metric", value_name="accuracy")
        fig = viz.accuracy_by_bucket(long, y="accuracy", group="metric", title="Accuracy by length bucket")
        viz.save_figure(fig, Path(run_dir) / "figures" / "by_bucket.json")
    return table


def _evaluate(chunks: Iterator, names: list[str] | None, files: list[Path], mode: str):
    """Consume `evaluate_stream`'s `chunks`: each chunk's records (with their bucket names) appended to every one of
    `files` (each written atomically: a failure leaves none of them), its totals kept (`StreamTotals`)."""
    from aspan.evaluation import StreamTotals
    from aspan.io import atomic_write, dump_frame

    totals = StreamTotals(mode)

    def consume(opened: list) -> None:
        if len(opened) < len(files):  # open the next file inside this one's writer
            atomic_write(files[len(opened)], lambda f: consume([*opened, f]))
            return
        for chunk in chunks:
            if names:
                chunk.records["bucket"] = [names[i] for i in chunk.records.sample_id]
            totals.add(chunk)
            for f in opened:
                dump_frame(f, chunk.records)

    consume([])
    return totals


def run(args: argparse.Namespace) -> int:
    import torch

    from aspan.buckets import parse_buckets
    from aspan.checks import check_offsets
    from aspan.environment import run_environment
    from aspan.evaluation import evaluate_stream

    if args.samples < 1:
        raise ValueError(f"-n must be >= 1, got {args.samples}")
    heads = parse_heads(args.heads)
    buckets = parse_buckets(args.buckets)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, name, task = _model_and_task(args)
    samples, names, longest = _samples(model, task, buckets, args, tokenizer.offset)
    check_offsets(args.delta, tokenizer.offset + longest + 1, "--delta")
    run_dir = Path(args.run_dir) if args.run_dir else None
    files = [Path(p) for p in (args.output, run_dir and run_dir / "records.jsonl") if p]
    chunks = evaluate_stream(model, tokenizer, samples, mode=args.mode, batch_size=args.batch_size, heads=heads,
                             delta=args.delta, attn=not args.no_attn, progress=True, any_task=args.any_task)
    totals = _evaluate(chunks, names, files, args.mode)
    tables = _print_tables(totals, name, args, names)
    if args.output:
        print(f"records written to {args.output}")
    if run_dir:
        settings = {"command": "eval", "model": str(args.checkpoint), "task": name, "split": args.split,
                    "params": task.params(), "mode": args.mode, "n": args.samples, "seed": args.seed,
                    "heads": heads, "delta": args.delta, **({"buckets": [list(b) for b in buckets]} if buckets else {}),
                    **({"any_task": True} if args.any_task else {})}  # a model scored on another task says so
        _write_run_dir(run_dir, totals.result(), {**settings, **run_environment(model)}, tables)
    return 0


def _model_and_task(args: argparse.Namespace):
    """(model, tokenizer, task name, task): the model loaded, the task its preset with --param; refused (before any
    sample is drawn) when the model was trained on another task, unless --any-task."""
    from aspan import models, tasks
    from aspan.models.trained import check_task, trained_task
    from aspan.tasks.params import parse_params
    from aspan.tokenization import check_tokenizer
    from aspan.training import resolve_device

    if args.task:
        tasks.task_class(args.task)  # unknown task: fail before loading the model
    device = resolve_device(args.device)
    path = resolve_checkpoint(args.checkpoint)
    if not args.task and not _names_its_task(path):
        raise ValueError(f"--task is required: {args.checkpoint} does not name the task it was trained on")
    model, tokenizer, meta = models.load(path, device=str(device))
    name = args.task or meta.get("task")
    if not name:
        raise ValueError("--task is required (the checkpoint does not name its task)")
    task = tasks.preset(name, args.split, **parse_params(name, args.param))
    if not args.any_task:
        check_task(trained_task(model), [(task.name, task.params())], f"--task {name}",
                   "pass --any-task to evaluate it anyway")
    check_tokenizer(tokenizer, task.alphabet)
    return model, tokenizer, name, task


def _print_tables(totals, name: str, args: argparse.Namespace, names: list[str] | None) -> dict:
    """Print the headline, the per-length table, Table 3 and (with buckets) the per-bucket table; return them."""
    import pandas as pd

    from aspan.evaluation import summarize

    res = totals.result()
    bucket = args.bucket or (5 if res.samples.length.nunique() > 15 else 1)
    by_length = summarize(res, bucket=bucket)
    cve = totals.correct_vs_error_table()
    s = res.summary()
    print(f"{name} {args.split} ({args.mode}, n={s['n']}): exact {s['exact']:.3f}, partial {s['partial']:.3f}"
          + ("" if args.no_attn else f", rollout AttnScore {100 * s['attn_rollout_sample']:.3g}% (sample convention), "
             f"{100 * s['attn_rollout_raw']:.3g}% (raw)"))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(by_length.round(4).to_string(index=False))
        if not cve.empty:
            print("\nAttnScore on correct vs wrong target tokens (Spiegel et al. 2025, Table 3; Welch's t-test); "
                  "convention sample: share of the sample's own columns, raw: share of the whole row:")
            cols = ["source", "convention", "correct (%)", "error (%)", "n_correct", "n_error", "t", "p"]
            print(cve[cols].to_string(index=False))
    by_bucket = _bucket_output(res, names, args.run_dir) if names else None
    return {"by_length": by_length, "correct_vs_error": cve, "by_bucket": by_bucket}


def _write_run_dir(run_dir: Path, res, settings: dict, tables: dict) -> None:
    """run.json and summary.json (headline numbers and the tables) beside the streamed records.jsonl, for
    `aspan report`."""
    from aspan.io import write_json

    summary = {**res.summary(), "tables": {k: t.to_dict("records") for k, t in tables.items() if t is not None}}
    write_json(run_dir / "run.json", settings)
    write_json(run_dir / "summary.json", summary)
    print(f"run directory: {run_dir}")
