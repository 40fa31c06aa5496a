"""`aspan train` as a function a notebook can call: train a tiny model from scratch, or fine-tune a checkpoint, on a
task (samples generated on the fly, or an `aspan data` JSONL file), into a resumable run directory.

    from aspan.applications.train import TrainRun, train_run
    from aspan.training import TrainConfig
    result = train_run(TrainRun(task="reversal", train=TrainConfig.scratch(steps=200)), "runs/tiny")

The run directory holds the log, evaluations, checkpoints, the final model, `figures/` and `run.json`.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import tasks
from ..buckets import bucket_sets, bucket_task, parse_buckets
from ..checks import check_batch_memory, check_memory, check_sample_memory
from ..config import file_value, load_config
from ..curves import curve_sets, parse_curve_sets, set_name
from ..environment import run_environment, torch_threads
from ..errors import UsageError
from ..io import claim_run, recorded_settings, save_figure, sha256_of, write_json
from ..tasks.params import parse_params
from ..tokenization import CharTokenizer, check_tokenizer
from ..training import ARCHITECTURE, RESUME_FREE, Replay, RunOptions, TrainConfig, read_jsonl


@dataclass
class TrainRun:
    """What `aspan train` does besides the optimisation settings in `train` (steps, batch, lr, seed, device, ...)."""

    train: TrainConfig = field(default_factory=TrainConfig.scratch)
    task: str | None = None  # default: the task of the `data` samples
    split: str = "id"  # preset to train on
    params: tuple[str, ...] = ()  # task parameter overrides, `key=value` (`aspan.tasks.params.parse_params`)
    data: str | None = None  # an `aspan data` JSONL file to train on instead of generated samples
    init: str | None = None  # checkpoint to fine-tune instead of a fresh model
    finetune: bool = False  # `train` holds the paper's fine-tuning defaults (needs `init`)
    resume: bool = False  # continue from the last checkpoint in the run directory
    replay: float = 0.0  # share of ID-preset samples mixed into every batch
    buckets: str | None = None  # also evaluate each length range, e.g. "1-10,11-20"
    curve_buckets: str | None = None  # learning-curve sets (`aspan.curves.parse_curve_sets`); None: the eval sets
    stop_bucket_given: bool = False  # `train.stop_bucket` was chosen (else: id, or the first curve set without id)
    threads: int | None = None  # torch CPU threads
    n_layers: int = 2  # a fresh model's shape (ignored with `init`)
    n_heads: int = 8
    d_model: int = 128
    positional: str = "rotary"
    n_ctx: int | None = None  # default: enough for the task's OOD preset, at least 256
    progress: bool = True

    def check(self) -> None:
        """UsageError/ValueError on settings that cannot go together, before anything is read or built."""
        if self.finetune and not self.init:
            raise UsageError("--finetune (the paper's fine-tuning defaults) needs --init CKPT, the model to fine-tune")
        self.train.check()
        if self.task is not None:
            parse_params(self.task, list(self.params))  # an unknown task or parameter, by name
        parse_buckets(self.buckets)
        if not 0 <= self.replay < 1:
            raise ValueError(f"--replay must be in [0, 1), got {self.replay}")


def resolved_run(flags: dict[str, Any], config: str | None, finetune: bool | None) -> tuple[TrainRun, TrainRun]:
    """The settings of `aspan train`: `TrainRun`'s defaults (the fine-tuning preset when `finetune`, or when the
    `config` file says `finetune = true`), then the `config` TOML file, then `flags` (the [train] table's as
    "train.NAME"), then its check; and the preset it started from (what `--print-config` writes against)."""
    finetune = finetune or (config is not None and file_value(config, "finetune", "train") is True)
    base = TrainRun(train=TrainConfig.finetune() if finetune else TrainConfig.scratch(), finetune=bool(finetune))
    return load_config(TrainRun, toml_path=config, flags=flags, base=base, name="train"), base


def train_run(run: TrainRun, out: str) -> Any:
    """Train (or fine-tune, or resume) as `run` says into run directory `out`, holding it for this job and this
    configuration; print the result, write the figures and `run.json`. Returns `aspan.training.train`'s result.
    torch runs on `run.threads` CPU threads meanwhile (the caller's number restored afterwards)."""
    with torch_threads(run.threads):
        return _train_run(run, out)


def _train_run(run: TrainRun, out: str) -> Any:
    from ..training import resolve_device

    run.check()
    buckets = parse_buckets(run.buckets)
    device = resolve_device(run.train.device)
    if run.data:
        check_data_memory(run.data)
    data = read_jsonl(run.data) if run.data else None
    hashes = input_hashes(run)
    check_inputs(out, hashes, run)
    name = data_task(run.data, data, run.task) if data else run.task
    if not name:
        raise ValueError("--task is required (the --data samples do not name their task)")
    tasks3 = task_pair(name, run.split, run.params)
    curves = curve_items(run, tasks3, buckets)
    texts = "".join(t.alphabet for t in tasks3) + "".join(s.text for s in data or [])
    needed = [*tasks3, *(bucket_task(tasks3[0], b) for b in [*buckets, *curves] if not isinstance(b, str))]
    model, tokenizer = build_model(run, "".join(sorted(set(texts))), needed, device)
    if run.train.steps is None and data is None:
        raise ValueError("fine-tuning on generated data needs --steps (one epoch is only defined for --data)")
    trained = [len(s.text) for s in data] if data else [t.max_text_len() for t in tasks3[: 2 if run.replay else 1]]
    check_workload(model.cfg, run.train, tokenizer.offset + max(trained) + 1, needed, str(device))
    return fit(run, out, Prepared(model, tokenizer, data, tasks3, buckets, curves, hashes))


@dataclass
class Prepared:
    """What `train_run` checked and built before training: the model, the data, the evaluation sets' definitions
    and the inputs' hashes."""

    model: Any  # the model to train: a fresh tiny model, or the --init checkpoint
    tokenizer: Any  # its tokenizer
    data: list | None  # the --data samples (None: samples generated from the training task)
    tasks3: tuple  # (train task, id task, ood task), `task_pair`
    buckets: list  # evaluation length ranges (`aspan.buckets.parse_buckets`)
    curves: list  # learning-curve set items (`curve_items`; [] for none)
    hashes: dict[str, str]  # sha256 of --data and of --init (`input_hashes`)


def fit(run: TrainRun, out: str, prepared: Prepared) -> Any:
    """The training itself, in the claimed run directory; then the printout, the figures and run.json."""
    import torch

    from .. import models
    from ..models.backend import backend_of
    from ..training import train

    model, tokenizer, data, tasks3, hashes = (prepared.model, prepared.tokenizer, prepared.data, prepared.tasks3,
                                              prepared.hashes)
    config, name, buckets, curves = run.train, tasks3[0].name, prepared.buckets, prepared.curves
    eval_data = eval_sets(tasks3, buckets, config.eval_samples, config.seed) if config.eval_samples else None
    curve_data = curve_sets(dict(zip(("train", "id", "ood"), tasks3)), curves, config.eval_samples, config.seed)
    meta = {"task": name, "params": tasks3[0].params(), "id_params": tasks3[1].params(),
            "ood_params": tasks3[2].params(), "init": run.init, "data": run.data, "replay": run.replay,
            "positional": models.positional_of(model), **hashes}
    stream = data if data is not None else tasks3[0]
    if run.replay:
        stream = Replay(stream, tasks3[1], run.replay)
    # one job per run directory (rank 0 holds it under torchrun), one configuration: what defines the weights
    settings = {"command": "train", **{k: v for k, v in meta.items() if k != "ood_params"}, "split": run.split,
                "backend": backend_of(model).name,
                "model": {k: getattr(model.cfg, k, None) for k in ARCHITECTURE},
                "config": {k: v for k, v in vars(config).items() if k not in RESUME_FREE}}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # torchrun: the weights depend on how many processes share each batch (one process: not recorded,
        settings["world_size"] = world  # as in run directories written before it was)
    main = int(os.environ.get("RANK", "0")) == 0
    with claim_run(out, settings) if main else contextlib.nullcontext():
        resumes = _resumes(Path(out), config) if run.resume else []
        options = RunOptions(out_dir=out, eval_data=eval_data, resume=run.resume, progress=run.progress, meta=meta,
                             curve_data=curve_data or None)
        result = train(model, tokenizer, stream, config, options)
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            return result
        eval_figures(result.history, Path(out))
        write_json(Path(out) / "run.json",
                   {"command": "train", "task": name, "split": run.split, "params": tasks3[0].params(),
                    "seed": config.seed, "buckets": [list(b) for b in buckets], "replay": run.replay,
                    "config": dict(vars(config)), "init": run.init, "data": run.data, **hashes,
                    "resumes": resumes, "stop": result.stop, **run_environment(model)})
    return result


def task_pair(name: str, split: str, items: tuple[str, ...] | list[str]):
    """(train task, id task, ood task): the training task is the `split` preset with every `key=value` override; the
    ID and OOD presets keep their own values of the parameters they set (so `--param length=11-20` trains on 11-20
    while `id` still means lengths 1-10) and take the other overrides (e.g. charset)."""
    overrides = parse_params(name, items)
    presets = tasks.presets(name)
    own = {s: tasks.preset(name, s, **{k: v for k, v in overrides.items() if k not in presets[s]})
           for s in ("id", "ood")}
    return tasks.preset(name, split, **overrides), own["id"], own["ood"]


def curve_items(run: TrainRun, tasks3, buckets) -> list:
    """The curve sets (`aspan.curves.parse_curve_sets` items; [] for none): `curve_buckets`, or the evaluation sets;
    UsageError for a stop rule without curves or watching a set they lack."""
    config = run.train
    if not config.eval_samples and (config.curve_every or run.curve_buckets):
        raise UsageError("--curve-every and --curve-buckets need --eval-samples above 0 (the samples per curve set)")
    if not config.eval_samples or config.curve_every == 0:
        if config.stop != "none":
            raise UsageError(f"--stop {config.stop} needs learning curves: --eval-samples and --curve-every above 0")
        return []
    train_task, id_task, ood_task = tasks3
    named = ["id", "ood"] if train_task.params() in (id_task.params(), ood_task.params()) else ["train", "id", "ood"]
    items = parse_curve_sets(run.curve_buckets) if run.curve_buckets else [*named, *buckets]
    names = [set_name(i) for i in items]
    if not run.stop_bucket_given and "id" not in names:
        config.stop_bucket = names[0]
    if (config.stop != "none" or config.target is not None) and config.stop_bucket not in names:
        raise UsageError(f"--stop-bucket {config.stop_bucket!r} is not a curve set (curve sets: {', '.join(names)})")
    return items


# Bytes in memory per byte of an `aspan data` JSON line, bounded (a reversal line of ~230 bytes is a ~2.2 kB sample)
DATA_MEMORY_FACTOR = 12


def check_data_memory(path: str) -> None:
    """Refuse a --data file whose samples could not be held in memory, before reading it."""
    size = Path(path).stat().st_size if Path(path).is_file() else 0
    check_memory(DATA_MEMORY_FACTOR * size, f"--data {path}", f"{size:,} bytes of JSON lines, up to "
                 f"{DATA_MEMORY_FACTOR} times that as samples")


def check_workload(cfg, config, n_tokens: int, evaluated: list, device: str) -> None:
    """Refuse a --batch-size whose activations (forward and backward, sequences of up to `n_tokens` tokens) or an
    --eval-samples whose evaluation sets (one per task in `evaluated`) cannot fit in memory, before anything is
    generated or trained."""
    check_batch_memory(cfg, config.batch_size, n_tokens, "--batch-size", training=True, device=device)
    if config.eval_samples:
        longest = max(t.max_text_len() for t in evaluated)
        check_sample_memory(config.eval_samples * len(evaluated), longest, "--eval-samples", records=True)


def eval_sets(tasks3, buckets, n: int, seed: int) -> dict:
    """Named evaluation sets: train (only when it differs from both presets), id, ood, and `length LO-HI` buckets
    (drawn from the training task with its length set to the bucket)."""
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
    from ..models.checkpoint import saved_info
    from ..training import latest_checkpoint

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


def input_hashes(run: TrainRun) -> dict[str, str]:
    """sha256 of the --data file and of the --init checkpoint (a file, or every file of a checkpoint directory):
    recorded in the run's settings and checkpoints, so a run is never continued on other inputs of the same name."""
    from ..models.checkpoint import content_hash, model_path

    hashes = {}
    if run.data:
        hashes["data_sha256"] = sha256_of(run.data)
    if run.init and model_path(run.init).exists():  # (an absent one is reported when loaded, naming what exists)
        hashes["init_sha256"] = content_hash(run.init)
    return hashes


def check_inputs(out: str, hashes: dict[str, str], run: TrainRun) -> None:
    """UsageError when --data or --init has the name the run in `out` was made with but other content."""
    recorded = recorded_settings(out) if Path(out).is_dir() else None
    if not isinstance(recorded, dict):
        return
    for option, name in (("data", run.data), ("init", run.init)):
        key = f"{option}_sha256"
        if name is None or recorded.get(option) != name or recorded.get(key) == hashes.get(key):
            continue  # (another name is another configuration: `claim` names that difference)
        if recorded.get(key) is None:
            raise UsageError(f"--{option} {name}: {out} was made by an earlier aspan that recorded no hash of it, so "
                             f"an unchanged file cannot be told from a changed one; use a new --out")
        raise UsageError(f"--{option} {name} changed since {out} was made with it (sha256 {recorded[key][:12]}... "
                         f"then, {hashes.get(key, '?')[:12]}... now): use the original, or a new --out")


def build_model(run: TrainRun, alphabet: str, tasks_needed: list, device):
    """The checkpoint given by --init, or a fresh tiny model whose context covers `tasks_needed`; both checked."""
    from .. import models

    if run.init:
        model, tokenizer, _ = models.load(run.init, device=str(device))
    else:
        tokenizer = CharTokenizer.for_alphabets(alphabet)
        needed = max(models.check_context(10**9, t, tokenizer.offset) for t in tasks_needed)
        n_ctx = run.n_ctx or max(256, needed)
        model = models.tiny(tokenizer, n_layers=run.n_layers, n_heads=run.n_heads, d_model=run.d_model,
                            n_ctx=n_ctx, seed=run.train.seed, device=str(device), positional=run.positional)
    check_tokenizer(tokenizer, alphabet)
    for t in tasks_needed:
        models.check_context(model, t, tokenizer.offset)
    return model, tokenizer


def format_result(result, out: str) -> str:
    """What `aspan train` prints when it ends: the trainable parameters, the last step and its evaluations, the
    learning curves' cost and why training ended, where the model is."""
    lines = []
    for p in [r for r in result.history if r["kind"] == "params"][:1]:
        lines.append(f"trainable parameters: {p['trainable']:,} of {p['total']:,} ({100 * p['fraction']:.2f}%)"
                     + (f" ({p['train_only']})" if p["train_only"] else ""))
    last = [r for r in result.history if r["kind"] == "train"][-1:]
    evals = [r for r in result.history if r["kind"] == "eval" and r["step"] == (last[0]["step"] if last else -1)]
    if last:
        lines.append(f"step {last[0]['step']}: loss {last[0]['loss']:.4f}, {last[0]['tokens_per_s']:,.0f} tokens/s")
    lines += [f"  {r['split']}: exact {r['exact']:.3f}, partial {r['partial']:.3f} (n={r['n']})" for r in evals]
    stop = result.stop or {}
    if stop.get("curve_every"):
        cost = "" if stop["curve_cost"] is None else f", {100 * stop['curve_cost']:.1f}% of the training time"
        lines.append(f"learning curves every {stop['curve_every']} steps in curves.jsonl{cost}; ended at step "
                     f"{stop['step']} ({stop['reason']})")
    lines.append(f"model written to {Path(out)} (load with aspan.models.load or `aspan eval {out}`)")
    return "\n".join(lines)


def eval_figures(history: list[dict], out: Path) -> None:
    """figures/eval_exact.json and eval_partial.json: accuracy against step, one line per evaluation set."""
    import pandas as pd

    from .. import viz

    rows = pd.DataFrame([r for r in history if r.get("kind") == "eval"])
    if rows.empty:
        return
    for metric in ("exact", "partial"):
        fig = viz.accuracy_vs_strength(rows, y=metric, x="step", group="split",
                                       title=f"{metric} accuracy during training, per evaluation set")
        save_figure(fig, out / "figures" / f"eval_{metric}.json")
