"""aspan's training step timed against a plain PyTorch model doing the same training work, in one process: what
`benchmarks/bench_training.py` prints and the GPU slice's training check records.

Both sides train on the same batches, made the same way (lean batches made ahead in a thread, pinned and copied
without blocking on CUDA), with rotary positions, gradient clipping, the warm-up + cosine schedule, AdamW with the
same weight-decay groups (fused on CUDA) and bf16 autocast on CUDA, and neither reads anything back inside a step.
They are timed in alternating short bursts (each ending with the read a log row makes, so the device's queued work
counts) and compared by their median time per step.
"""
from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn import functional as F

from .. import tasks
from ..tokenization import CharTokenizer
from ..training import TrainConfig, lr_lambda, resolve_device, target_loss
from ..training.batches import BatchPlan, Prefetcher
from ..training.costs import SyncCounter, count_kernels
from ..training.data import Data, DataStream
from ..training.optim import adamw_options
from ..training.tally import Tally


class Steps(Protocol):
    """What `interleave` and `step_costs` drive: `aspan.training.costs.Stepper` or `PlainStepper`."""

    def step(self) -> None:
        """Take the next training step, reading nothing back from the device."""

    def read(self) -> float:
        """Wait for the device and return the last step's mean loss per target token."""


def _rotary_tables(n_ctx: int, d_head: int, rotary_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [n_ctx, d_head] of rotate-half rotary on the first `rotary_dim` dimensions (1 and 0 beyond)."""
    half = rotary_dim // 2
    freq = base ** (-torch.arange(half, dtype=torch.float32) / half)
    angle = torch.arange(n_ctx, dtype=torch.float32)[:, None] * freq.repeat(2)[None, :]
    cos, sin = torch.ones(n_ctx, d_head), torch.zeros(n_ctx, d_head)
    cos[:, :rotary_dim], sin[:, :rotary_dim] = angle.cos(), angle.sin()
    return cos, sin


def plain_model(cfg) -> nn.Module:
    """A plain PyTorch decoder of a HookedTransformer's shape (`cfg`: its config): pre-LayerNorm blocks, one fused
    QKV linear, `scaled_dot_product_attention` (scale 1/sqrt(d_head), causal), a gelu MLP, and rotary positions
    applied to q and k together (rotate-half) when the model's are rotary, learned positions otherwise."""
    d, n_heads, d_head = cfg.d_model, cfg.n_heads, cfg.d_head
    rotary = cfg.positional_embedding_type == "rotary"

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.out = nn.Linear(d, 3 * n_heads * d_head), nn.Linear(n_heads * d_head, d)
            self.mlp = nn.Sequential(nn.Linear(d, cfg.d_mlp), nn.GELU(), nn.Linear(cfg.d_mlp, d))

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            qkv = self.qkv(self.ln1(x)).view(b, t, 3, n_heads, d_head).transpose(1, 3)  # [b, head, 3, t, d_head]
            qk, v = qkv[:, :, :2], qkv[:, :, 2]
            if cos is not None:
                half, r = cfg.rotary_dim // 2, cfg.rotary_dim
                turned = torch.cat((-qk[..., half:r], qk[..., :half], qk[..., r:]), -1)
                qk = qk * cos[:t] + turned * sin[:t]
            a = F.scaled_dot_product_attention(qk[:, :, 0], qk[:, :, 1], v, is_causal=True)
            x = x + self.out(a.transpose(1, 2).reshape(b, t, n_heads * d_head))
            return x + self.mlp(self.ln2(x))

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(cfg.d_vocab, d)
            self.pos = None if rotary else nn.Embedding(cfg.n_ctx, d)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layers))
            self.ln, self.unembed = nn.LayerNorm(d), nn.Linear(d, cfg.d_vocab_out)
            tables = _rotary_tables(cfg.n_ctx, d_head, cfg.rotary_dim, cfg.rotary_base) if rotary else (None, None)
            self.register_buffer("cos", tables[0], persistent=False)
            self.register_buffer("sin", tables[1], persistent=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            if self.pos is not None:
                x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
            for block in self.blocks:
                x = block(x, self.cos, self.sin)
            return self.unembed(self.ln(x))

    return Plain()


class PlainStepper:
    """The plain model of `model_cfg`'s shape trained step by step with aspan's settings (`config`) and data
    handling: `step()` takes the next step, reading nothing back; `read()` waits for the device and returns the
    last step's loss; `close()` stops the prefetching."""

    def __init__(self, model_cfg, tokenizer, data: Data, config: TrainConfig, prefetch: int = 2):
        self.device = device = resolve_device(config.device)
        self.model = model = plain_model(model_cfg).to(device)
        decay = [p for p in model.parameters() if p.ndim >= 2]
        rest = [p for p in model.parameters() if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": rest, "weight_decay": 0.0}]
        options = adamw_options(model.parameters())  # aspan's choice: fused on CUDA, multi-tensor on the CPU
        self.opt = torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas), **options)
        total = config.steps
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_lambda(s, config.warmup, total, config.min_lr_ratio))
        cuda = device.type == "cuda"
        self.amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda and config.amp else nullcontext()
        stream, plan = DataStream(data, config.batch_size, config.seed), BatchPlan(tokenizer, model_cfg.n_ctx, pin=cuda)
        self.batches = Prefetcher(lambda s: plan.make(stream.batch(s)), range(total), prefetch)
        self.clip, self.tally, self.taken = config.grad_clip, Tally(), 0

    def step(self) -> None:
        """One optimiser step, as aspan's loop takes it."""
        batch = self.batches.get(self.taken).to(self.device)
        with self.amp:
            logits = self.model(batch.tokens)
        loss_sum = target_loss(logits, batch.labels)
        self.opt.zero_grad(set_to_none=True)
        (loss_sum / batch.n_target).backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip) if self.clip else None
        self.opt.step()
        self.sched.step()
        self.taken += 1
        self.tally.add(self.taken, loss_sum.detach(), norm, batch.n_target, batch.n_tokens)

    def read(self) -> float:
        """The last step's mean loss per target token (waits for the device)."""
        self.tally.read()
        return self.tally.loss

    def close(self) -> None:
        """Stop making batches ahead."""
        self.batches.close()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleave(steppers: dict[str, Steps], rounds: int, burst: int, device: torch.device) -> dict[str, Any]:
    """Median seconds per step of each stepper over `rounds` rounds of `burst` steps each, the steppers taking
    turns (in reversed order every other round); each burst ends with the stepper's `read`, so the work it queued
    on the device is in its time. Returns {name: median s}, and `losses` {name: the loss read after each burst}."""
    times: dict[str, list[float]] = {k: [] for k in steppers}
    losses: dict[str, list[float]] = {k: [] for k in steppers}
    names = list(steppers)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(burst):
                steppers[name].step()
            losses[name].append(steppers[name].read())
            times[name].append((time.perf_counter() - t0) / burst)
    return {**{k: statistics.median(v) for k, v in times.items()}, "losses": losses}


def step_costs(stepper: Steps, device: torch.device) -> dict[str, int]:
    """One step's `kernels` (`count_kernels`), `reads` and `blocking_copies` (`SyncCounter`), and on CUDA its
    `cuda_syncs` (what CUDA's sync debug mode flags, every thread included)."""
    kernels = count_kernels(stepper.step)
    stepper.read()
    counter = SyncCounter()
    with counter:
        stepper.step()
    out = {"kernels": kernels, "reads": counter.reads, "blocking_copies": counter.blocking_copies}
    stepper.read()
    if device.type == "cuda":
        import warnings

        torch.cuda.synchronize(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                stepper.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        out["cuda_syncs"] = sum("synchroniz" in str(w.message) for w in caught)
        stepper.read()
    return out


@dataclass(frozen=True)
class Comparison:
    """One interleaved comparison of the tiny default model's training step (reversal, its ID preset)."""

    device: str = "cpu"
    batch_size: int = 64
    rounds: int = 8  # bursts per stepper
    burst: int = 5  # steps per burst
    warm: int = 5  # untimed steps first
    capture: bool = False  # add aspan's captured step (CUDA only) beside its eager one
    amp: bool = True  # bf16 autocast on CUDA, for both sides

    @property
    def steps(self) -> int:
        """Steps each stepper takes: warm-up, three counted ones (`step_costs`) and the timed bursts."""
        return self.warm + 3 + self.rounds * self.burst


def make_steppers(c: Comparison) -> dict[str, Any]:
    """aspan's step (`aspan.training.costs.Stepper`, "aspan"; with `c.capture` also "captured") and the plain
    model's ("plain") on the same reversal batches, from models of the same seed, each warmed up."""
    from dataclasses import replace

    from .. import models
    from ..training.costs import Stepper

    task, tok = tasks.preset("reversal", "id"), CharTokenizer()
    cfg = TrainConfig.scratch(steps=c.steps, batch_size=c.batch_size, device=c.device, amp=c.amp)
    model = models.tiny(tok, task="reversal", device=c.device)
    out: dict[str, Any] = {"aspan": Stepper(model, tok, task, cfg), "plain": PlainStepper(model.cfg, tok, task, cfg)}
    try:
        if c.capture:
            out["captured"] = Stepper(models.tiny(tok, task="reversal", device=c.device), tok, task,
                                      replace(cfg, capture=True))
        for stepper in out.values():
            for _ in range(c.warm):
                stepper.step()  # a captured step records its graph at the first
            stepper.read()
    except BaseException:
        for stepper in out.values():
            stepper.close()
        raise
    return out


def compare(c: Comparison) -> dict[str, Any]:
    """`c`'s steppers compared: `seconds` (median per step), `losses` (after each burst), `costs` (`step_costs`),
    `tokens_per_step`, `parameters` (aspan's model) and `steps`."""
    device = torch.device(c.device)
    steppers = make_steppers(c)
    try:
        costs = {name: step_costs(s, device) for name, s in steppers.items()}
        timed = interleave(steppers, c.rounds, c.burst, device)
        tokens = {name: s.tally.tokens / s.taken for name, s in steppers.items()}
        params = sum(p.numel() for p in steppers["aspan"].run.model.parameters())
    finally:
        for s in steppers.values():
            s.close()
    return {"seconds": {k: timed[k] for k in steppers}, "losses": timed["losses"], "costs": costs,
            "tokens_per_step": tokens, "parameters": params, "steps": c.steps}
