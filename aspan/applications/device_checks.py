"""The device checks a GPU slice starts with (`aspan gpu slice`): do the toolkit's paths give on this device what
they give on the CPU?

Four checks, each a dict with `ok`, what it measured and its `seconds`; `run_checks` runs them all and never
raises (a failed check says why in `error`):

- `hooks`: the shipped reversal model's teacher-forced records (rollout and head AttnScores, predictions) under a
  reinforcement edit (`hooks.reinforce`), on the device and on the CPU, agree within `HOOKS_ATOL`;
- `generation`: greedy generation with the KV cache under the same edit agrees with teacher forcing under it up to
  the first wrong token of every sample (the same prefix must give the same next token), on the device;
- `training`: training steps of the tiny default model (bf16 autocast on CUDA): the loss is finite, and its tokens/s
  against a plain PyTorch model of the same shape (fused QKV, `scaled_dot_product_attention`) in the same process;
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
TRAIN_STEPS = 40  # timed training steps (after WARM_STEPS untimed ones)
WARM_STEPS = 5
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


def plain_model(n_layers: int, d_model: int, n_heads: int, d_mlp: int, vocab: int, n_ctx: int):
    """A plain PyTorch decoder of the tiny model's shape (pre-LayerNorm, fused QKV, `scaled_dot_product_attention`,
    learned positions): the throughput reference of the training check."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
            self.mlp = nn.Sequential(nn.Linear(d_model, d_mlp), nn.GELU(), nn.Linear(d_mlp, d_model))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, n_heads, -1).transpose(1, 3).unbind(2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(a.transpose(1, 2).reshape(b, t, d_model))
            return x + self.mlp(self.ln2(x))

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(n_ctx, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layers))
            self.ln, self.unembed = nn.LayerNorm(d_model), nn.Linear(d_model, vocab)

        def forward(self, tokens):
            x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
            for block in self.blocks:
                x = block(x)
            return self.unembed(self.ln(x))

    return Plain()


def _timed(step: Callable[[int], int], device: str) -> float:
    """Tokens per second over `TRAIN_STEPS` calls of `step(i) -> tokens`, after `WARM_STEPS` untimed ones."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for i in range(WARM_STEPS):
        step(i)
    sync()
    t0, tokens = time.perf_counter(), 0
    for i in range(WARM_STEPS, WARM_STEPS + TRAIN_STEPS):
        tokens += step(i)
    sync()
    return tokens / (time.perf_counter() - t0)


def check_training(device: str, batch_size: int = 64) -> dict[str, Any]:
    """Training steps of the tiny default model through `aspan.training` (bf16 autocast on CUDA) and of the plain
    model of its shape on the same batches: finite losses, tokens/s of each and their ratio."""
    from contextlib import nullcontext

    import torch

    from .. import models
    from ..training import TrainConfig, target_loss, train, train_batch

    task, tok = tasks.preset("reversal", "id"), CharTokenizer()
    model = models.tiny(tok, task="reversal", device=device)
    losses, rates = [], []
    for steps in (WARM_STEPS, TRAIN_STEPS):  # the first call warms the device up; the second is timed
        cfg = TrainConfig.scratch(steps=steps, batch_size=batch_size, log_every=1, device=device, seed=steps)
        rows = [r for r in train(model, tok, task, cfg, progress=False).history if r.get("kind") == "train"]
        losses += [r["loss"] for r in rows]
        rates.append(rows[-1]["tokens_per_s"])  # tokens over training seconds of that call
    c = model.cfg
    plain = plain_model(c.n_layers, c.d_model, c.n_heads, c.d_mlp, c.d_vocab, c.n_ctx).to(device)
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else nullcontext()
    batches = [train_batch(task.generate(batch_size, seed=900 + i), tok, c.n_ctx).to(device)
               for i in range(WARM_STEPS + TRAIN_STEPS)]

    def plain_step(i: int) -> int:
        b = batches[i]
        with amp:
            logits = plain(b.tokens)
        loss = target_loss(logits.float(), b.labels) / (b.labels >= 0).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return int(b.attention_mask.sum())

    plain_rate = _timed(plain_step, device)
    aspan_rate = rates[-1]
    finite = all(math.isfinite(x) for x in losses)
    return {"autocast": "bfloat16" if device.startswith("cuda") else "none", "steps": len(losses),
            "first_loss": losses[0], "last_loss": losses[-1], "loss_finite": finite,
            "aspan_tokens_per_s": aspan_rate, "plain_tokens_per_s": plain_rate,
            "aspan_over_plain": aspan_rate / plain_rate, "parameters": sum(p.numel() for p in model.parameters()),
            "batch_size": batch_size, "ok": finite and losses[-1] < losses[0]}


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
