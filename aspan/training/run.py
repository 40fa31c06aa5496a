"""One training run's shared state (`_Run`) and its set-up: device and process group, the data stream, what trains,
the optimiser, and a clean start or a resume from the latest checkpoint."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .. import models
from ..checks import check_device
from ..curves import CURVES_FILE, auto_every, stop_point
from ..io import append_line
from ..models.fit import Workload, check_fit
from ..models.fused import TrainingForward
from ..models.trained import TrainedTask, record_task
from ..param_groups import Freezer, TrainOnly, group_masks, live_parameters
from ..tokenization import Tokenizer, require_tokenizer
from .config import RunOptions, TrainConfig
from .data import Data, DataStream, Replay
from .optim import _optimizer, lr_lambda
from .state import _cut_logs, _set_rng_state, check_resume, latest_checkpoint, read_state

logger = logging.getLogger(__name__)


@dataclass
class _Run:
    """The state the stages of one training run share."""

    model: Any
    tokenizer: Tokenizer
    config: TrainConfig
    opts: RunOptions
    stream: DataStream
    device: torch.device
    rank: int
    world: int
    total: int  # steps of the whole run
    freezer: Freezer | None = None
    opt: Any = None
    sched: Any = None
    forward: Any = None  # (tokens, hooks) -> logits: `fused.TrainingForward` over the model (DDP-wrapped by torchrun)
    history: list = field(default_factory=list)
    start: int = 0
    saved: int = 0  # step of the last checkpoint written (or resumed from)
    every: int = 0  # curve interval (0: no curves)
    stopped_at: int | None = None  # the step at which the stop rule fired
    trained_s: float = 0.0  # training seconds since the last curve evaluation
    wall_offset: float = 0.0  # wall seconds of the run before this call (a resumed run's last curve row)
    began: float = field(default_factory=time.perf_counter)
    tally: Any = None  # the steps' values not yet read from the device (`tally.Tally`), set by the loop

    @property
    def curves(self) -> list[dict]:
        return [r for r in self.history if r.get("kind") == "curve"]

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def end(self) -> int:
        stop = self.opts.stop_after
        end = self.total if stop is None else min(self.total, stop)
        return end if self.stopped_at is None else min(end, self.stopped_at)

    def write(self, name: str, row: dict) -> None:
        """Append `row` to history and, on the main process, to `out_dir/name`."""
        self.history.append(row)
        if self.opts.out_dir is not None and self.main:
            append_line(self.opts.out_dir / name, row)


def resolve_device(device: str = "auto") -> torch.device:
    """`auto`: the local rank's GPU under DDP, else CUDA when present, else CPU; UsageError for an unusable device."""
    check_device(device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    if device == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device(device)


def _dist_setup(device: torch.device) -> tuple[int, int]:
    """(rank, world size); joins the process group `torchrun` describes when one is not set up yet."""
    if not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _agree(run: _Run, value: int) -> int:
    """Rank 0's `value` on every process (itself without DDP): all ranks stop at the same step."""
    if run.world == 1:
        return value
    t = torch.tensor([value], device=run.device)
    dist.broadcast(t, 0)
    return int(t[0])


def _freezer(model, spec: TrainOnly | None) -> Freezer | None:
    """What trains: the groups of `spec`; on a TransformerBridge without groups, every parameter it computes with
    (its unused duplicate tensors frozen: they would get no gradient, which DistributedDataParallel rejects)."""
    if spec is not None:
        return Freezer(model, group_masks(model, spec))
    live = live_parameters(model)
    if len(live) == len(dict(model.named_parameters())):  # every parameter computes (a HookedTransformer's do)
        return None
    return Freezer(model, {n: torch.ones_like(p, dtype=torch.bool) for n, p in live.items() if p.requires_grad})


def _prepare(model, tokenizer: Tokenizer, data: Data | Replay, config: TrainConfig, opts: RunOptions) -> _Run:
    """Check everything before any work; the device, process group and step count; the model on its device."""
    require_tokenizer(tokenizer, "train: tokenizer")
    config.check()
    if opts.resume and opts.out_dir is None:
        raise ValueError("resume=True needs the out_dir of the run to continue")
    device = resolve_device(config.device)
    rank, world = _dist_setup(device)
    stream = DataStream(data, config.batch_size, config.seed)
    total = config.steps
    if total is None:
        if stream.steps_per_epoch is None:
            raise ValueError("data generated on the fly needs a step count "
                             "(steps=None means epochs over a finite dataset)")
        total = config.epochs * stream.steps_per_epoch
    if config.batch_size < world:
        raise ValueError(f"batch_size {config.batch_size} is smaller than the number of processes {world}")
    # hook points, characters as single tokens, vocabulary and context, before any forward
    check_fit(model, tokenizer, Workload(stream.alphabet(), stream.max_text_len(), stream.max_text_len()), "train")
    record_task(model, _stream_task(stream))  # fine-tuning on another task makes it the model's task
    if config.train_only is not None:
        group_masks(model, config.train_only)  # out-of-range columns or pairs fail before any work
    if opts.out_dir is not None and rank == 0:
        opts.out_dir.mkdir(parents=True, exist_ok=True)
    if torch.device(model.cfg.device) != device:
        model.to(device)
    opts.meta = {**opts.meta, "train_config": asdict(config)}
    run = _Run(model, tokenizer, config, opts, stream, device, rank, world, total)
    run.every = _curve_interval(run)
    return run


def _curve_interval(run: _Run) -> int:
    """The curve interval (0: no curves); ValueError for a stop rule without curves or on a set they lack."""
    config, sets = run.config, run.opts.curve_data or {}
    stop = config.stop_rule()
    if config.curve_every == 0 or not sets:
        if stop.rule != "none":
            raise ValueError(f"the {stop.rule} stop rule needs learning curves (curve sets and curve_every != 0)")
        return 0
    if (stop.rule != "none" or stop.target is not None) and stop.bucket not in sets:
        raise ValueError(f"stop bucket {stop.bucket!r} is not a curve set (curve sets: {', '.join(sets)})")
    if config.curve_every is not None:
        return config.curve_every
    offset = run.tokenizer.offset + 1
    eval_tokens = sum(len(s.text) + offset for samples in sets.values() for s in samples)
    return auto_every(eval_tokens, sum(len(s.text) + offset for s in run.stream.batch(0)), run.total)


def _stream_task(stream: DataStream) -> TrainedTask | None:
    """The task a model trained on `stream` learns: its task, or the task its samples name (None when unnamed)."""
    if stream.task is not None:
        return TrainedTask(stream.task.name, stream.task.params())
    first = stream.samples[0]
    return TrainedTask(first.task, dict(first.params or {})) if first.task else None


def _setup_optimizer(run: _Run) -> None:
    """Optimiser, schedule and (under torchrun) the DDP wrapper; logs the trainable parameter count."""
    config, model = run.config, run.model
    live = live_parameters(model).values()  # a bridge's unused duplicate tensors left out
    n_all = sum(p.numel() for p in live)
    n_train = run.freezer.trainable() if run.freezer else sum(p.numel() for p in live if p.requires_grad)
    run.opts.meta["trainable_parameters"] = {"trainable": n_train, "total": n_all, "fraction": n_train / n_all,
                                             "train_only": config.train_only}
    if run.main:
        which = f" ({config.train_only})" if config.train_only else ""
        logger.info("trainable parameters: %s of %s (%.2f%%)%s", f"{n_train:,}", f"{n_all:,}",
                    100 * n_train / n_all, which)
    run.opt = _optimizer(model, config)
    run.sched = torch.optim.lr_scheduler.LambdaLR(
        run.opt, lambda s: lr_lambda(s, config.warmup, run.total, config.min_lr_ratio))
    run.forward = TrainingForward(model)  # the fused forward where it covers the model and hooks, else the hooked one
    if run.world > 1:
        ids = [run.device.index] if run.device.type == "cuda" else None
        run.forward = torch.nn.parallel.DistributedDataParallel(run.forward, device_ids=ids)


def _start(run: _Run) -> None:
    """Resume from the latest checkpoint (its logs cut back to it), or start clean: old logs removed, the size row
    written. Resuming a run without a checkpoint, or asking for fewer steps than it has, is a ValueError."""
    out = run.opts.out_dir
    if run.opts.resume:
        ckpt = latest_checkpoint(out)
        if ckpt is None:
            raise ValueError(f"cannot resume {out}: it holds no checkpoint ({out / 'checkpoints' / 'latest'} is "
                             f"missing); run without --resume to start it")
        state = read_state(ckpt)
        if state["step"] > run.total:
            raise ValueError(f"cannot resume {out} for {run.total} steps: it already has {state['step']} (ask for "
                             f"at least that many, or use a new --out)")
        check_resume(ckpt, run.config, run.opts.meta, run.model)
        run.start = run.saved = _load_state(ckpt, state, run)
        if run.main:
            run.history = _cut_logs(out, run.start)
            _resume_curves(run)
        if _agree(run, int(run.stopped_at is not None)):
            run.stopped_at = run.start
        return
    if out is not None and run.main:
        for name in ("log.jsonl", "eval.jsonl", CURVES_FILE):
            (out / name).unlink(missing_ok=True)
    run.write("log.jsonl", {"kind": "params", "step": 0, **run.opts.meta["trainable_parameters"]})


def _resume_curves(run: _Run) -> None:
    """A resumed run's curves go on from its last row: its wall clock continues, and a run whose stop rule fired at
    the step it resumes from is over."""
    rows = run.curves
    if rows:
        run.wall_offset = float(rows[-1].get("wall_s", 0.0))
    fired = stop_point(rows, run.config.stop_rule()) if run.every else None
    if fired is not None and fired[0] <= run.start:
        run.stopped_at = run.start


def _load_state(ckpt: Path, state: dict, run: _Run) -> int:
    """Weights from checkpoint `ckpt` and its optimizer, scheduler and RNG `state` (`read_state`) into the run;
    returns its step. ValueError if another data order."""
    saved = state["config"]
    world = state.get("world_size", run.world)  # checkpoints written before it was recorded: not known
    if world != run.world:
        raise ValueError(f"cannot resume {ckpt}: it was trained by {world} process(es) (torchrun's world size), now "
                         f"{run.world}: each process draws its own share of every batch, so the weights would differ; "
                         f"resume with torchrun --nproc_per_node={world}")
    for key in ("seed", "batch_size", "train_only"):
        if saved.get(key) != getattr(run.config, key):
            raise ValueError(f"cannot resume {ckpt}: it was trained with {key}={saved.get(key)!r}, "
                             f"now {getattr(run.config, key)!r}")
    params = state.get("parameters")  # a bridge's exact parameters
    if params is None:
        params = list(models.load(ckpt, device=str(run.device), backend="hooked").model.parameters())
    with torch.no_grad():
        for p, q in zip(run.model.parameters(), params, strict=True):
            p.copy_(q)
    run.opt.load_state_dict(state["optimizer"])
    run.sched.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"])
    if run.freezer:
        run.freezer.snapshot()  # frozen entries are the checkpoint's, not the caller's initial weights
    return int(state["step"])
