"""The device checks a GPU slice starts with (`aspan gpu slice`): do the toolkit's paths give on this device what
they give on the CPU?

Four checks, each a dict with `ok`, what it measured and its `seconds`; `run_checks` runs them all and never
raises (a failed check says why in `error`):

- `hooks`: the shipped reversal model's teacher-forced records (rollout and head AttnScores, predictions) under a
  reinforcement edit (`hooks.reinforce`), on the device and on the CPU, agree within `HOOKS_ATOL`;
- `generation`: greedy generation with the KV cache under the same edit agrees with teacher forcing under it up to
  the first wrong token of every sample (the same prefix must give the same next token), on the device;
- `training`: training steps of the tiny default model (bf16 autocast on CUDA): the loss is finite and falls, and
  its tokens/s against a plain PyTorch model of the same shape doing the same training work on the same batches
  (`step_timing`: rotary, clipping, schedule, AdamW, batches made ahead), timed in alternating bursts in the same
  process, with kernels and syncs per step; on CUDA also the captured step (`TrainConfig(capture=True)`);
- `distributed`: `torchrun` with one process joins a process group (NCCL on CUDA, gloo on the CPU), all-reduces a
  tensor and trains a few steps under DistributedDataParallel.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .. import tasks
from ..tokenization import CharTokenizer

HOOKS_ATOL = 1e-3  # AttnScores are probabilities: CPU and GPU kernels may differ by float32 rounding, not more
CHECK_SAMPLES = 48  # reversal samples per check (ID and OOD lengths mixed)
TRAIN_ROUNDS = 8  # alternating bursts of the training check, per stepper
TRAIN_BURST = 5  # steps per burst (each burst ends with the read a log row makes)
WARM_STEPS = 5  # untimed steps first
WORKER_TIMEOUT = 180  # seconds the torchrun worker may take


def _samples():
    half = CHECK_SAMPLES // 2
    return (tasks.preset("reversal", "id").generate(half, seed=71) +
            tasks.preset("reversal", "ood", length=(11, 16)).generate(half, seed=72))


def _edit(model):
    """A reinforcement edit on every head of the last layer (per batch: it reads the batch's references)."""
    import hooks

    heads = [(model.cfg.n_layers - 1, h) for h in range(model.cfg.n_heads)]
    return lambda batch: hooks.reinforce(heads, batch.ref_mask, strength=0.3, model=model)


def check_hooks(device: str) -> dict[str, Any]:
    """The edited teacher-forced records on `device` against the CPU's: numeric columns within `HOOKS_ATOL`, the
    predicted characters equal except where the CPU's top two logits are closer than rounding (counted)."""
    from .. import models
    from ..evaluation import evaluate

    samples = _samples()
    out: dict[str, Any] = {}
    records = {}
    for where in ("cpu", device):
        model, tok, _ = models.load("reversal", device=where)
        heads = [(model.cfg.n_layers - 1, h) for h in range(model.cfg.n_heads)]
        records[where] = evaluate(model, tok, samples, fwd_hooks=_edit(model), heads=heads).records
    cpu, dev = records["cpu"], records[device]
    numeric = [c for c in cpu.columns if c.startswith("attn_") or c in ("p_target", "logit_target")]
    numeric = [c for c in numeric if c in dev.columns]
    diffs = {c: float((cpu[c] - dev[c]).abs().max()) for c in numeric}
    worst = max((d for d in diffs.values() if not math.isnan(d)), default=0.0)
    differing = int((cpu.pred_char != dev.pred_char).sum())
    out.update(columns=sorted(numeric), max_abs_diff=worst, tolerance=HOOKS_ATOL, rows=len(cpu),
               differing_predictions=differing, ok=worst <= HOOKS_ATOL and differing == 0)
    return out


def check_generation(device: str) -> dict[str, Any]:
    """Cached greedy generation under the edit against teacher forcing under it, on `device`: up to and including
    each sample's first wrong character both predict the same characters."""
    from .. import models
    from ..evaluation import evaluate

    model, tok, _ = models.load("reversal", device=device)
    samples = _samples()
    gen = evaluate(model, tok, samples, fwd_hooks=_edit(model), mode="generate", attn=False).records
    teach = evaluate(model, tok, samples, fwd_hooks=_edit(model), mode="teacher", attn=False).records
    compared = mismatched = 0
    for i in range(len(samples)):
        g = gen[gen.sample_id == i].sort_values("target_index")
        t = teach[teach.sample_id == i].sort_values("target_index")
        upto = _shared_prefix(t.correct.tolist())
        compared += upto
        mismatched += int((g.pred_char.to_numpy()[:upto] != t.pred_char.to_numpy()[:upto]).sum())
    wrong = int((teach.groupby("sample_id").correct.min() == 0).sum())
    return {"samples": len(samples), "compared_tokens": compared, "mismatched_tokens": mismatched,
            "samples_with_an_error": wrong, "ok": compared > 0 and mismatched == 0}


def _shared_prefix(teacher_correct: list[bool]) -> int:
    """How many leading target positions generation and teacher forcing see the same prefix for: through the first
    position teacher forcing gets wrong (after it, generation continues from its own wrong character)."""
    for j, ok in enumerate(teacher_correct):
        if not ok:
            return j + 1
    return len(teacher_correct)


def check_training(device: str, batch_size: int = 64, rounds: int = TRAIN_ROUNDS) -> dict[str, Any]:
    """aspan's training step and a plain PyTorch model's doing the same work (`aspan.applications.step_timing`), on
    the same batches with the same data handling, timed in alternating bursts: finite, falling losses, tokens/s of
    each and their ratio, kernels and syncs per step; on CUDA also the captured step (`TrainConfig(capture=True)`)
    against both, and how far its losses are from the eager step's over the same batches."""
    from .step_timing import Comparison, compare

    eager = compare(Comparison(device, batch_size, rounds, TRAIN_BURST, WARM_STEPS))
    losses = eager["losses"]["aspan"]
    rate = {k: eager["tokens_per_step"][k] / eager["seconds"][k] for k in ("aspan", "plain")}
    finite = all(math.isfinite(x) for x in losses)
    out = {"autocast": "bfloat16" if device.startswith("cuda") else "none", "batch_size": batch_size,
           "steps": eager["steps"], "first_loss": losses[0], "last_loss": losses[-1],
           "loss_finite": finite, "aspan_tokens_per_s": rate["aspan"], "plain_tokens_per_s": rate["plain"],
           "aspan_over_plain": rate["aspan"] / rate["plain"], "step_costs": eager["costs"],
           "parameters": eager["parameters"], "ok": finite and losses[-1] < losses[0]}
    if device.startswith("cuda"):
        out.update(_check_capture(Comparison(device, batch_size, rounds, TRAIN_BURST, WARM_STEPS, capture=True)))
    return out


def _check_capture(settings) -> dict[str, Any]:
    """The captured step against the eager one and the plain model (its own interleaved run, `settings` a
    `step_timing.Comparison`; a failure to capture is recorded, not raised: the eager loop is what the slice trains
    with by default)."""
    from .step_timing import compare

    try:
        run = compare(settings)
    except Exception as e:  # noqa: BLE001 (an optional path: its failure is a result)
        return {"captured_error": f"{type(e).__name__}: {str(e).strip().splitlines()[:1]}"}
    sec, eager, captured = run["seconds"], run["losses"]["aspan"], run["losses"]["captured"]
    gap = max(abs(a - b) / max(abs(a), 1e-9) for a, b in zip(eager, captured))
    return {"captured_over_plain": sec["plain"] / sec["captured"],
            "captured_over_eager": sec["aspan"] / sec["captured"],
            "eager_over_plain_same_run": sec["plain"] / sec["aspan"],
            "captured_step_costs": run["costs"]["captured"], "captured_loss_max_rel_diff": gap}


def check_distributed(device: str) -> dict[str, Any]:
    """`torchrun --nproc_per_node=1` running `distributed_worker`: its exit code and what it reports."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "worker.json"
        env = {**os.environ, "ASPAN_CHECK_DEVICE": device, "ASPAN_CHECK_REPORT": str(report)}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m",
               "aspan.applications.device_checks"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT)
        got = json.loads(report.read_text()) if report.is_file() else {}
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
    ok = proc.returncode == 0 and got.get("all_reduce") == 1.0 and got.get("loss_finite") is True
    return {"returncode": proc.returncode, **got, "ok": ok, **({} if ok else {"output_tail": tail})}


def distributed_worker() -> None:
    """Run under torchrun: join the process group, all-reduce a one, train 5 steps under DDP, write a report."""
    import torch
    import torch.distributed as dist

    from .. import models
    from ..training import TrainConfig, train

    device = os.environ["ASPAN_CHECK_DEVICE"]
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    try:
        t = torch.ones(1, device=device)
        dist.all_reduce(t)
        tok = CharTokenizer()
        model = models.tiny(tok, task="reversal", device=device)
        cfg = TrainConfig.scratch(steps=5, batch_size=16, log_every=1, device=device)
        hist = train(model, tok, tasks.preset("reversal", "id"), cfg, progress=False).history
        losses = [r["loss"] for r in hist if r.get("kind") == "train"]
        report = {"backend": dist.get_backend(), "world_size": dist.get_world_size(), "all_reduce": float(t[0]),
                  "ddp_steps": len(losses), "loss_finite": all(math.isfinite(x) for x in losses)}
        Path(os.environ["ASPAN_CHECK_REPORT"]).write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


CHECKS: dict[str, Callable[[str], dict[str, Any]]] = {
    "hooks": check_hooks, "generation": check_generation, "training": check_training,
    "distributed": check_distributed,
}


def run_checks(device: str, names: tuple[str, ...] = tuple(CHECKS)) -> dict[str, Any]:
    """Every check in `names` on `device`; a check that raises is recorded as failed with its error (one line)."""
    out: dict[str, Any] = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            result = CHECKS[name](device)
        except Exception as e:  # noqa: BLE001 (a failed check is a result of the slice, not the end of it)
            result = {"ok": False, "error": f"{type(e).__name__}: {str(e).strip().splitlines()[:1]}"}
        out[name] = {**result, "seconds": round(time.perf_counter() - t0, 2)}
    out["all_ok"] = all(v["ok"] for k, v in out.items() if isinstance(v, dict))
    return out


if __name__ == "__main__":  # the torchrun worker of `check_distributed`
    distributed_worker()
