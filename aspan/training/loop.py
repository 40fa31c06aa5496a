"""The training loop: `train` (from scratch or fine-tuning, resumable) and `train_resumable` (into a scratch
directory), with logging, evaluations, learning curves, stop rules, checkpoints and time budgets."""
from __future__ import annotations

import logging
import math
import os
import shutil
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from .. import models, stopping
from ..accuracy import Accuracy, accuracy
from ..curves import CURVES_FILE, curve_cost, steps_to_target, stop_point
from ..evaluation import hooks_for
from ..models.backend import backend_of
from ..param_groups import parse_train_only
from ..tasks.base import Sample
from ..tokenization import Tokenizer
from .batches import BatchPlan, Prefetcher, StepBatch
from .budget import BudgetSpent, current_budget
from .config import RunOptions, TrainConfig, TrainResult, run_options
from .data import Data, Replay
from .graph import CapturedStep, capture_autocast, check_capture, fixed_shape
from .loss import target_loss
from .run import _agree, _freezer, _prepare, _Run, _setup_optimizer, _start
from .state import _cut_logs, _rng_state, _save_checkpoint, check_resume, claim_scratch
from .tally import Tally

logger = logging.getLogger(__name__)


def train(model, tokenizer: Tokenizer, data: Data | Replay, config: TrainConfig | None = None,
          options: RunOptions | None = None, **keywords: Any) -> TrainResult:
    """Train `model` in place on `data` (a task, samples, a JSONL file, or a `Replay` mixture).

    Returns the model, the logged rows and `out_dir`. `options` (a `RunOptions`) holds everything about the run
    besides the model, the data and the optimiser settings; its fields may also be given as keywords (`out_dir=...,
    eval_data=..., resume=True`), which override those of `options`. `fwd_hooks` (a list of `(name, fn)` or a
    factory `f(batch) -> list`) stay active in every training forward and in the periodic evaluations, e.g. an
    ABC pre-softmax bias while fine-tuning. `stop_after` ends the run after that step (checkpointed) so a later
    `resume=True` run continues it exactly. `meta` goes into the saved checkpoints. With `config.train_only` only
    that parameter group trains (`aspan.param_groups`); the first row of `log.jsonl` records its size.
    `curve_data` (named held-out sets) adds learning curves to `curves.jsonl` and lets `config.stop` end the run
    early (`aspan.curves`); the last row of `log.jsonl` and the result's `stop` say why and at which step it ended;
    `on_curve` gets each evaluation's rows as they are written (e.g. to log them elsewhere).
    """
    opts = run_options(options, keywords)
    run = _prepare(model, tokenizer, data, config or TrainConfig.scratch(), opts)
    check_capture(run)
    if isinstance(opts.prefetch, bool) or not isinstance(opts.prefetch, int) or opts.prefetch < 0:
        raise ValueError(f"prefetch must be an int >= 0 (batches made ahead), got {opts.prefetch!r}")
    # gradients an earlier run (or a run stopped mid-step) left on tensors this run does not train would enter its
    # gradient clipping norm: every run starts from none
    model.zero_grad(set_to_none=True)
    run.freezer = _freezer(model, parse_train_only(run.config.train_only))
    try:
        _setup_optimizer(run)
        _start(run)
        _loop(run)
        stop = _finish(run)
    finally:
        if run.freezer:
            run.freezer.close()
    return TrainResult(model, run.history, opts.out_dir, stop)


def train_resumable(scratch: str | os.PathLike, model, tokenizer: Tokenizer, data: Data | Replay,
                    config: TrainConfig, **keywords: Any) -> TrainResult:
    """`train` into the scratch directory `scratch`: a checkpoint there (a run paused by `time_budget`, or killed
    after a checkpoint) is continued exactly, and `scratch` is removed once the run ends, so it only ever holds an
    unfinished run. `scratch` must be new, empty, or this function's own (`claim_scratch`): a directory it did not
    make is never cleared or removed. `keywords` are `train`'s (`options`, a `RunOptions`, and its fields, but not
    out_dir or resume); ValueError, naming the setting, when the checkpoint there was trained with other settings."""
    taken = sorted({"out_dir", "resume"} & set(keywords))
    if taken:
        raise TypeError(f"train_resumable() sets {taken[0]} itself (the scratch directory, and whether it holds a "
                        f"checkpoint)")
    opts = run_options(keywords.pop("options", None), keywords)
    config.check()  # before the directory is touched
    scratch = Path(scratch)
    ckpt = claim_scratch(scratch)
    if ckpt is not None:
        check_resume(ckpt, config, opts.meta, model)
    result = train(model, tokenizer, data, config, opts, out_dir=scratch, resume=ckpt is not None)
    shutil.rmtree(scratch, ignore_errors=True)
    return result._replace(out_dir=None)


def _budget_step(run: "_Run", done: int, last_ckpt: float) -> float:
    """After step `done`: pause (checkpoint, BudgetSpent) when the budget is spent, or checkpoint when the last one
    is older than the budget's `checkpoint_s`. Returns the clock time of the last checkpoint."""
    budget = current_budget()
    if budget is None:
        return last_ckpt
    now = budget.clock()
    due = run.opts.out_dir is not None and now - last_ckpt >= budget.checkpoint_s
    # rank 0's clock decides for every process (a checkpoint reads the steps' values: every process must take it)
    decision = _agree(run, int(now >= budget.deadline) | 2 * int(due))
    if decision & 1:
        if run.saved != done:
            _checkpoint(run, done)
        raise BudgetSpent(done, run.opts.out_dir)
    if decision & 2 and run.saved != done:
        _checkpoint(run, done)
        return now
    return last_ckpt


def _loop(run: _Run) -> None:
    """Steps `start`..`end` with logging, periodic evaluation and checkpoints."""
    run.model.train()
    bar = tqdm(total=run.total, initial=run.start, desc="train", disable=not (run.main and run.opts.progress),
               dynamic_ncols=True)
    budget = current_budget()
    last_ckpt = budget.clock() if budget is not None else 0.0
    if budget is not None and run.start < run.end and _agree(run, int(budget.spent())):
        bar.close()
        raise BudgetSpent(run.start)  # spent before this run took a step: nothing new to save
    if run.every and run.start == 0:
        _curve(run, 0)  # where training starts from (a stop rule never fires here)
    with bar, stepping(run) as steps:
        _steps(run, steps, bar, last_ckpt)


class Stepping(NamedTuple):
    """How a run takes its steps: the step function (`_train_step`, or its captured form), the autocast context and
    the batches (made ahead)."""

    step_fn: Callable
    amp: Any
    batches: Prefetcher


@contextmanager
def stepping(run: _Run) -> Iterator[Stepping]:
    """The run's `Stepping` for steps `start`..`end` (a fresh `run.tally`); leaving the block, an exception
    included, stops the prefetching thread."""
    cuda = run.device.type == "cuda"
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda and run.config.amp else nullcontext()
    step_fn, shape = _train_step, None
    if run.config.capture:
        shape = fixed_shape(run)
        step_fn, amp = CapturedStep(run, _train_step, shape), capture_autocast(run)
    plan = BatchPlan(run.tokenizer, run.model.cfg.n_ctx, run.rank, run.world, shape=shape,
                     full=callable(run.opts.fwd_hooks), pin=cuda)
    run.tally = Tally(run.world)
    with Prefetcher(lambda step: plan.make(run.stream.batch(step)), range(run.start, run.end),
                    run.opts.prefetch) as batches:
        yield Stepping(step_fn, amp, batches)


def take_step(run: _Run, steps: Stepping, step: int) -> None:
    """Optimiser step `step` (0-based): its batch to the device (not blocking), the step, the schedule, and its
    results added to `run.tally` (left on the device)."""
    batch = steps.batches.get(step)
    if not isinstance(steps.step_fn, CapturedStep):  # a captured step copies into its own buffers
        batch = batch.to(run.device)
    loss_sum, grad_norm = steps.step_fn(run, batch, steps.amp)
    run.sched.step()
    run.tally.add(step + 1, loss_sum, grad_norm, batch.n_target, batch.n_tokens)


def _steps(run: _Run, steps: Stepping, bar, last_ckpt: float) -> None:
    """The optimiser steps of `_loop`, each followed by its logging, evaluation, curve, checkpoint and budget check.
    Nothing is read back from the device but at the steps that log, evaluate, score curves or checkpoint
    (`_reads_at`)."""
    config, tally, busy = run.config, run.tally, 0.0  # tokens/s counts training time only (evaluation excluded)
    for step in range(run.start, run.end):
        t0 = time.perf_counter()
        take_step(run, steps, step)
        done = step + 1
        if _reads_at(run, done):
            tally.read()  # inside the timed step: the device's queued work is counted as training time
        busy += time.perf_counter() - t0
        run.trained_s += time.perf_counter() - t0
        bar.update(1)
        if done % config.log_every == 0 or done == run.end:
            rate = tally.tokens / max(busy, 1e-9)
            bar.set_postfix(loss=f"{tally.loss:.4f}", tok_s=f"{rate:,.0f}")
            run.write("log.jsonl", {"kind": "train", "step": done, "loss": tally.loss, "lr": _lr(run),
                                    "tokens_per_s": rate, "grad_norm": tally.grad_norm})
        if _after_step(run, done):
            break
        if done != run.end:
            last_ckpt = _budget_step(run, done, last_ckpt)


def _reads_at(run: _Run, done: int) -> bool:
    """Whether step `done` is followed by a log row, an evaluation, a curve or a checkpoint: the points where the
    step's values are read from the device (a checkpoint anywhere else reads them itself)."""
    config = run.config
    return (done % config.log_every == 0 or done == run.end
            or bool(config.eval_every and done % config.eval_every == 0 and done != run.total)
            or bool(run.every and (done % run.every == 0 or done == run.total))
            or bool(config.ckpt_every and done % config.ckpt_every == 0))


def _after_step(run: _Run, done: int) -> bool:
    """The evaluation, curve, stop signal and checkpoint after step `done`; whether the stop rule ended the run."""
    config = run.config
    if config.eval_every and done % config.eval_every == 0 and done != run.total:
        _evaluate(run, done)
    stopped = bool(run.every) and (done % run.every == 0 or done == run.total) and _curve(run, done)
    signalled = _agree(run, int(stopping.received() is not None))  # every process stops at the same step
    if stopped or done == run.end or signalled or (config.ckpt_every and done % config.ckpt_every == 0):
        _checkpoint(run, done)  # a stop signal: the step just finished is saved, the run resumes after it
    if signalled:
        stopping.check()
    return stopped


def _lr(run: _Run) -> float:
    """The learning rate of the step just taken (a captured step keeps it in a device tensor: read here)."""
    return float(run.sched.get_last_lr()[0])


def _hooks(run: _Run, batch: StepBatch) -> list:
    """The run's forward hooks for `batch` (a factory gets the whole batch); none: an empty list, no per-step cost."""
    if not run.opts.fwd_hooks:
        return []
    return hooks_for(run.opts.fwd_hooks, batch.full)


def _train_step(run: _Run, batch: StepBatch, amp) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimiser step on `batch` (tokens and labels [batch, pos] on the device): its summed target loss and its
    gradient norm (None without clipping), both 0-d tensors left on the device. The loss is divided by the global
    batch's target count, so DDP's gradient average is the global per-token mean; the schedule steps outside."""
    with amp:  # the fused forward where it covers the model and hooks, else the hooked one (`aspan.models.fused`)
        logits = run.forward(batch.tokens, _hooks(run, batch))
    loss_sum = target_loss(logits, batch.labels)
    run.opt.zero_grad(set_to_none=True)
    (loss_sum * run.world / batch.n_target).backward()
    clip = run.config.grad_clip
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), clip) if clip else None
    run.opt.step()
    if run.freezer:
        run.freezer.restore()
    return loss_sum.detach(), grad_norm


def _curve(run: _Run, step: int) -> bool:
    """Score every curve set at `step` (rows to `curves.jsonl`, on the main process); whether the stop rule fires
    here (the same answer on every process), in which case `run.stopped_at` is `step`."""
    fired = None
    if run.main:
        train_s, run.trained_s = run.trained_s, 0.0
        first = len(run.history)
        for name, samples in run.opts.curve_data.items():
            t0 = time.perf_counter()
            acc = _accuracy(run, samples)  # accuracy and loss from one pass
            res = acc.summary()
            run.write(CURVES_FILE, {"kind": "curve", "step": step, "bucket": name, "n": len(samples),
                                    "exact": res["exact"], "partial": res["partial"], "loss": acc.loss,
                                    "eval_s": time.perf_counter() - t0, "train_s": train_s,
                                    "wall_s": run.wall_offset + time.perf_counter() - run.began})
        if run.opts.on_curve is not None:
            run.opts.on_curve(run.history[first:])
        fired = stop_point(run.curves, run.config.stop_rule())
        if run.opts.progress and fired is not None:
            logger.info("step %d: the %s stop rule fired on %s", step, fired[1], run.config.stop_bucket)
    if _agree(run, int(fired is not None and fired[0] == step)):
        run.stopped_at = step
        return True
    return False


def _accuracy(run: _Run, samples: Sequence[Sample]) -> Accuracy:
    """Teacher-forced accuracy and loss of `samples` under the run's hooks, in large batches on the device, without
    per-token records: `evaluate(..., attn=False)`'s exact, partial and n, and `heldout_loss`'s loss."""
    return accuracy(run.model, run.tokenizer, samples, run.opts.fwd_hooks, run.config.eval_batch_size)


def _evaluate(run: _Run, step: int) -> None:
    """Evaluate every named set (with the run's hooks) and log one row per set."""
    if not (run.opts.eval_data and run.main):
        return
    for split, samples in run.opts.eval_data.items():
        row = {"kind": "eval", "step": step, "split": split, **_accuracy(run, samples).summary()}
        row = {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
        run.write("eval.jsonl", row)
        if run.opts.progress:
            logger.info("step %d: %s exact %.3f partial %.3f", step, split, row["exact"], row["partial"])


def _checkpoint(run: _Run, step: int) -> None:
    """Save checkpoint `step`; if that fails (a full disk), the logs are cut back to the last good checkpoint."""
    if run.tally is not None and run.tally.pending:
        run.tally.read()  # a loss that is not finite stops the run before its checkpoint is written
    if run.opts.out_dir is not None and run.main:
        state = {"step": step, "optimizer": run.opt.state_dict(), "scheduler": run.sched.state_dict(),
                 "rng": _rng_state(), "config": asdict(run.config), "world_size": run.world}
        if not backend_of(run.model).exact_save:
            # a TransformerBridge: its Hugging Face form is the same function, but on TransformerLens 3.9 not the same
            # parameters (the unembedding bias it adds is folded away), so resuming copies these instead
            state["parameters"] = [p.detach().cpu() for p in run.model.parameters()]
        try:
            _save_checkpoint(run.opts.out_dir, run.model, run.tokenizer, state, {**run.opts.meta, "step": step})
        except BaseException:
            _cut_logs(run.opts.out_dir, run.saved)  # the rows of the steps after the last good checkpoint go too
            raise
        run.saved = step


def _finish(run: _Run) -> dict | None:
    """At the end of the whole run (its cap, or where the stop rule fired): the final evaluation, the final model in
    out_dir and the row saying why and where it stopped, returned (None for a run paused by stop_after)."""
    final = run.stopped_at if run.stopped_at is not None else run.total if run.end == run.total else None
    stop = None
    if final is not None:
        if run.start < final:
            _evaluate(run, final)
            if run.opts.out_dir is not None and run.main:
                models.save(run.model, run.opts.out_dir, run.tokenizer, **{**run.opts.meta, "step": final})
        stop = _stop_row(run, final)
        if run.main:
            run.write("log.jsonl", stop)
    if run.world > 1:
        dist.barrier()
    return stop


def _stop_row(run: _Run, final: int) -> dict:
    """Why the run ended at step `final` (cap, target or plateau), its steps-to-target when a target is set, the
    curve interval and what the curves cost as a fraction of training time."""
    rule, rows = run.config.stop_rule(), run.curves
    reason = rule.rule if run.stopped_at is not None else "cap"
    row = {"kind": "stop", "step": final, "reason": reason, "rule": rule.rule, "curve_every": run.every}
    if run.every:
        row.update(bucket=rule.bucket, metric=rule.metric, curve_cost=curve_cost(rows))
    if run.every and rule.target is not None:
        row.update(target=rule.target, steps_to_target=steps_to_target(rows, rule.bucket, rule.target, rule.metric))
    return row
