"""`aspan eval` as a function a notebook can call: a checkpoint's accuracy on a task split (teacher-forced or greedy),
the per-length table, AttnScore on correct vs wrong target tokens (Spiegel et al. 2025, Table 3) and, with
buckets, one table per length range; records streamed to JSONL, and with a run directory its run.json and
summary.json (for `aspan report`).

    from aspan.applications.eval import EvalRun, run_eval
    tables = run_eval(EvalRun("runs/train", split="ood", samples=100, run_dir="runs/eval"))
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd

from .. import models, tasks, viz
from ..buckets import bucket_name, bucket_table, bucket_task, parse_buckets
from ..checks import check_batch_memory, check_eval_memory, check_offsets
from ..environment import run_environment, torch_threads
from ..evaluation import CHUNK, StreamTotals, evaluate_stream, summarize
from ..io import atomic_write, claim_run, dump_frame, write_json
from ..models.trained import check_task, trained_task
from ..tasks.params import parse_params
from ..tokenization import check_tokenizer
from ..training import latest_checkpoint, resolve_device

logger = logging.getLogger(__name__)


@dataclass
class EvalRun:
    """The settings of one evaluation (those of `aspan eval`'s flags, named after them)."""

    checkpoint: str  # checkpoint or training run directory, .gguf file, or 'smollm2'
    task: str | None = None  # default: the checkpoint's training task
    any_task: bool = False  # score a model on another task than the one it was trained on
    split: str = "ood"  # the task preset
    params: tuple[str, ...] = ()  # key=value task parameter overrides
    samples: int = 500  # samples (per bucket with buckets)
    mode: str = "teacher"  # teacher forcing or greedy generation
    seed: int = 0
    batch_size: int = 32
    heads: str | None = None  # heads for attn_heads_sample/_raw, e.g. "1.3,1.5"
    delta: int = 0  # score references shifted by this key offset
    attn: bool = True  # False: accuracy only (no AttnScore forwards)
    buckets: str | None = None  # length ranges each evaluated on its own samples, e.g. "1-10,11-20"
    bucket: int | None = None  # length bucket width of the table (default: 1, or 5 beyond 15 lengths)
    device: str = "auto"
    dtype: str = "float32"  # precision the model is loaded in (float32, bfloat16, float16)
    threads: int | None = None
    output: str | None = None  # per-token records JSONL
    run_dir: str | None = None  # also run.json, summary.json and records.jsonl here
    progress: bool = True  # a progress bar over the samples


def parse_heads(text: str | None) -> list[tuple[int, int]] | None:
    """`"1.3,0.5"` (or `1:3`) -> [(1, 3), (0, 5)]; None -> None; ValueError naming --heads on any other form, an
    empty one included (`--heads ""`: leave the flag out for no head records)."""
    if text is None:
        return None
    out = []
    for item in text.split(","):
        found = re.fullmatch(r"\s*([0-9]{1,9})[.:]([0-9]{1,9})\s*", item)
        if found is None:
            shown = repr(item) if len(item) <= 60 else f"{item[:60]!r}... ({len(item)} characters)"
            raise ValueError(f"--heads: expected layer.head pairs like 1.3,0.5, got {shown}")
        out.append((int(found[1]), int(found[2])))
    return out


def resolve_checkpoint(path: str) -> str:
    """A training run directory without a final model (a run still going, or killed) resolves to its latest
    checkpoint, and says so on stderr: the numbers are then those of an intermediate model."""
    p = Path(path)
    if p.is_dir() and not (p / "config.json").exists() and (ckpt := latest_checkpoint(p)) is not None:
        logger.warning("%s has no final model (the run is unfinished or was stopped): evaluating its latest "
                       "checkpoint %s", path, ckpt.name)
        return str(ckpt)
    return path


def _names_its_task(path: str) -> bool:
    """False for models that never record a task (SmolLM2, GGUF files): `--task` is then required before loading.
    Checkpoint directories are asked after loading (their formats record it in different places)."""
    return not (str(path).lower() == "smollm2" or str(path).lower().endswith(".gguf"))


def run_eval(run: EvalRun, echo: Callable[[str], None] | None = None) -> dict:
    """Evaluate `run.checkpoint` on its task split: print the headline, the tables and (with buckets) the
    per-bucket table; stream the records to `run.output` and `run.run_dir`'s records.jsonl, and write the run
    directory's run.json and summary.json, holding `run.run_dir` for this job throughout (`claim_run`). Every
    setting is checked (one-line ValueError) before the model loads, the samples' memory before any is scored.
    The headline, the tables and the files written go to `echo` line by line (`aspan eval` prints them; the default
    logs them at INFO). Returns the tables (by_length, correct_vs_error, by_bucket)."""
    with claim_run(run.run_dir) if run.run_dir else contextlib.nullcontext(), torch_threads(run.threads):
        return _run_eval(run, echo or logger.info)


def _run_eval(run: EvalRun, echo: Callable[[str], None]) -> dict:
    if run.samples < 1:
        raise ValueError(f"-n must be >= 1, got {run.samples}")
    heads = parse_heads(run.heads)
    buckets = parse_buckets(run.buckets)
    model, tokenizer, name, task = _model_and_task(run)
    samples, names, longest = _samples(model, task, buckets, run, tokenizer.offset)
    check_offsets(run.delta, tokenizer.offset + longest + 1, "--delta")
    run_dir = Path(run.run_dir) if run.run_dir else None
    files = [Path(p) for p in (run.output, run_dir and run_dir / "records.jsonl") if p]
    chunks = evaluate_stream(model, tokenizer, samples, mode=run.mode, batch_size=run.batch_size, heads=heads,
                             delta=run.delta, attn=run.attn, progress=run.progress, any_task=run.any_task)
    totals = _evaluate(chunks, names, files, run.mode)
    tables = _report_tables(totals, name, run, names, echo)
    if run.output:
        echo(f"records written to {run.output}")
    if run_dir:
        settings = {"command": "eval", "model": str(run.checkpoint), "task": name, "split": run.split,
                    "params": task.params(), "mode": run.mode, "n": run.samples, "seed": run.seed,
                    "heads": heads, "delta": run.delta, **({"buckets": [list(b) for b in buckets]} if buckets else {}),
                    **({"any_task": True} if run.any_task else {})}  # a model scored on another task says so
        _write_run_dir(run_dir, totals.result(), {**settings, **run_environment(model)}, tables)
        echo(f"run directory: {run_dir}")
    return tables


def _model_and_task(run: EvalRun):
    """(model, tokenizer, task name, task): the model loaded, the task its preset with the params; refused (before
    any sample is drawn) when the model was trained on another task, unless `any_task`."""
    if run.task:
        tasks.task_class(run.task)  # unknown task: fail before loading the model
    device = resolve_device(run.device)
    path = resolve_checkpoint(run.checkpoint)
    if not run.task and not _names_its_task(path):
        raise ValueError(f"--task is required: {run.checkpoint} does not name the task it was trained on")
    model, tokenizer, meta = models.load(path, device=str(device), dtype=run.dtype)
    name = run.task or meta.get("task")
    if not name:
        raise ValueError("--task is required (the checkpoint does not name its task)")
    task = tasks.preset(name, run.split, **parse_params(name, list(run.params)))
    if not run.any_task:
        check_task(trained_task(model), [(task.name, task.params())], f"--task {name}",
                   "pass --any-task to evaluate it anyway")
    check_tokenizer(tokenizer, task.alphabet)
    return model, tokenizer, name, task


def _samples(model, task, buckets, run: EvalRun, offset: int) -> tuple[Iterator, list[str] | None, int]:
    """The samples to score, drawn as they are evaluated (each bucket its own samples, the ones `bucket_sets`
    holds, in the same order); with buckets, each sample's bucket name; and the longest text they can have. Their
    memory is checked first: one chunk at a time, and one per-sample row each."""
    every = [bucket_task(task, b) for b in buckets] if buckets else [task]
    n_tokens = max(models.check_context(model, t, offset) for t in every)
    longest = max(t.max_text_len() for t in every)
    check_eval_memory(run.samples * len(every), longest, CHUNK, "-n")
    check_batch_memory(model.cfg, run.batch_size, n_tokens, "--batch-size", training=False,
                       device=str(getattr(model.cfg, "device", None) or "cpu"))
    samples = itertools.chain.from_iterable(itertools.islice(t.stream(run.seed), run.samples) for t in every)
    names = [bucket_name(b) for b in buckets for _ in range(run.samples)] if buckets else None
    return samples, names, longest


def _evaluate(chunks: Iterator, names: list[str] | None, files: list[Path], mode: str) -> StreamTotals:
    """Consume `evaluate_stream`'s `chunks`: each chunk's records (with their bucket names) appended to every one of
    `files` (each written atomically: a failure leaves none of them), its totals kept (`StreamTotals`)."""
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


def _report_tables(totals: StreamTotals, name: str, run: EvalRun, names: list[str] | None,
                   echo: Callable[[str], None]) -> dict:
    """The headline, the per-length table, Table 3 and (with buckets) the per-bucket table, to `echo`; the tables."""
    res = totals.result()
    bucket = run.bucket or (5 if res.samples.length.nunique() > 15 else 1)
    by_length = summarize(res, bucket=bucket)
    cve = totals.correct_vs_error_table()
    s = res.summary()
    echo(f"{name} {run.split} ({run.mode}, n={s['n']}): exact {s['exact']:.3f}, partial {s['partial']:.3f}"
          + ("" if not run.attn else f", rollout AttnScore {100 * s['attn_rollout_sample']:.3g}% (sample convention), "
             f"{100 * s['attn_rollout_raw']:.3g}% (raw)"))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        echo(by_length.round(4).to_string(index=False))
        if not cve.empty:
            echo("\nAttnScore on correct vs wrong target tokens (Spiegel et al. 2025, Table 3; Welch's t-test); "
                  "convention sample: share of the sample's own columns, raw: share of the whole row:")
            cols = ["source", "convention", "correct (%)", "error (%)", "n_correct", "n_error", "t", "p"]
            echo(cve[cols].to_string(index=False))
    by_bucket = _bucket_output(res, names, run.run_dir, echo) if names else None
    return {"by_length": by_length, "correct_vs_error": cve, "by_bucket": by_bucket}


def _bucket_output(res, names: list[str], run_dir: str | None, echo: Callable[[str], None]) -> pd.DataFrame:
    """The per-bucket table to `echo`; with a run directory also its figure. Returns the table."""
    table = bucket_table(res, names)
    echo("\nby length bucket (each bucket its own samples):")
    echo(table[["bucket", "n", "exact", "partial"]].round(4).to_string(index=False))
    if run_dir:
        long = table.melt(id_vars=["bucket"], value_vars=["exact", "partial"], var_name="metric", value_name="accuracy")
        fig = viz.accuracy_by_bucket(long, y="accuracy", group="metric", title="Accuracy by length bucket")
        viz.save_figure(fig, Path(run_dir) / "figures" / "by_bucket.json")
    return table


def _write_run_dir(run_dir: Path, res, settings: dict, tables: dict) -> None:
    """run.json and summary.json (headline numbers and the tables) beside the streamed records.jsonl, for
    `aspan report`."""
    summary = {**res.summary(), "tables": {k: t.to_dict("records") for k, t in tables.items() if t is not None}}
    write_json(run_dir / "run.json", settings)
    write_json(run_dir / "summary.json", summary)
