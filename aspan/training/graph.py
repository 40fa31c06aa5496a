"""An optional captured training step (`TrainConfig(capture=True)`, CUDA only): the whole step (forward, loss,
backward, gradient clipping, AdamW) recorded once as a CUDA graph over static buffers of one fixed shape, then
replayed every step, so a step costs one graph launch instead of hundreds of kernel launches.

The fixed shape is (this process's rows, the longest sample the data stream can produce): shorter batches are
right-padded, which changes no scored row (attention is causal and padding sits after every scored row), so the
loss is that of the tight batch up to float rounding. The learning rate lives in a device tensor the schedule fills
before each replay. The graph is recorded after a few warm-up steps on a side stream (which initialise AdamW's
state and the kernels' workspaces); their updates are undone, so the run trains exactly the steps it logs.

Additive attention biases given as tensors (`hooks.attn_bias`: ABC, ABS) are captured with the step: the fused
forward (`aspan.models.fused`) turns them into an attention mask once, at the warm-up, and the graph reads that
mask, kept alive with it. A bias changed in place after the recording would not reach the graph: the next step
refuses it. Hook functions and hook factories run Python on every forward and are not captured.
"""
from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Any, Callable

import torch
from torch import Tensor

from ..batching import IGNORE
from ..models import fused
from ..models.backend import backend_of
from .batches import StepBatch

WARMUP_STEPS = 3  # eager steps before recording (AdamW state, cuBLAS workspaces, autocast), undone afterwards
Step = Callable[[Any, StepBatch, Any], "tuple[Tensor, Tensor | None]"]  # `loop._train_step`


def check_capture(run) -> None:
    """ValueError (one line) when `run` asked for a captured step it cannot have: only a single CUDA process
    training a HookedTransformer, without forward hooks or with tensor attention biases only, can be captured."""
    if not run.config.capture:
        return
    why = None
    if run.device.type != "cuda":
        why = f"needs a CUDA device (this run is on {run.device.type})"
    elif run.world > 1:
        why = f"needs a single process (this run has {run.world}; DDP's all-reduce is not captured)"
    elif run.opts.fwd_hooks:
        why = _hooks_reason(run.model, run.opts.fwd_hooks)
    if why is None and backend_of(run.model).name != "hooked":
        why = "covers HookedTransformer models only"
    if why:
        raise ValueError(f"capture=True {why}: train with capture=False")


def _hooks_reason(model, fwd_hooks) -> str | None:
    """Why a step under `fwd_hooks` cannot be captured (None: it can: tensor attention biases on a model the fused
    forward runs)."""
    if callable(fwd_hooks):
        return "cannot capture a hook factory (it runs Python on every batch)"
    plan = fused.bias_plan(list(fwd_hooks))
    if isinstance(plan, str) or not all(isinstance(h.bias, Tensor) for hs in plan.values() for h in hs):
        return ("cannot capture forward hooks other than attention biases given as tensors (hooks.attn_bias): hook "
                "functions run Python on every forward")
    why = fused.why_not(model, list(fwd_hooks))
    return None if why is None else f"captures attention biases through the fused forward only, not here ({why})"


def fixed_shape(run) -> tuple[int, int]:
    """(rows, width) of this process's share of every batch: its largest share, and the longest sample's tokens."""
    rows = -(-run.config.batch_size // run.world)
    width = run.tokenizer.offset + run.stream.max_text_len() + (run.tokenizer.eos_id is not None)
    return rows, width


def capture_autocast(run):
    """bf16 autocast as the eager step uses it, without its weight-cast cache (which a graph cannot hold)."""
    if run.config.amp:
        return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)
    return nullcontext()


def _state_snapshot(run) -> tuple[list[Tensor], dict]:
    """Copies of the weights and of AdamW's state tensors, to undo the warm-up steps."""
    weights = [p.detach().clone() for p in run.model.parameters()]
    state = {p: {k: v.clone() for k, v in s.items() if isinstance(v, Tensor)} for p, s in run.opt.state.items()}
    return weights, state


@torch.no_grad()
def _restore(run, snapshot: tuple[list[Tensor], dict]) -> None:
    """Put back the weights and AdamW state of `snapshot` in place (the graph holds these very tensors); state the
    warm-up created is zeroed, which is what AdamW starts from."""
    weights, state = snapshot
    for p, w in zip(run.model.parameters(), weights, strict=True):
        p.copy_(w)
    for p, s in run.opt.state.items():
        for k, v in s.items():
            if isinstance(v, Tensor) and k in state.get(p, {}):
                v.copy_(state[p][k])
            elif isinstance(v, Tensor):
                v.zero_()


class CapturedStep:
    """`step(run, batch, amp)` (`loop._train_step`) on static buffers of shape `shape`, recorded as a CUDA graph at
    the first call and replayed after; with `graph=False` the same buffers, warm-up and undo run eagerly (how the
    CPU tests check everything but the recording). Called like `step`; returns its loss sum and gradient norm
    (copies: the graph's outputs are overwritten by the next replay)."""

    def __init__(self, run, step: Step, shape: tuple[int, int], graph: bool = True):
        dev, pad = run.device, run.tokenizer.pad_id
        self.static = StepBatch(
            tokens=torch.full(shape, pad, dtype=torch.long, device=dev),
            labels=torch.full(shape, IGNORE, dtype=torch.long, device=dev),
            mask=torch.zeros(shape, dtype=torch.long, device=dev),
            n_target=torch.ones((), dtype=torch.float32, device=dev),  # type: ignore[arg-type]  (a tensor here)
            n_tokens=0)
        self.step, self.shape, self.use_graph = step, shape, graph
        self.graph: Any = None
        self.out: tuple[Tensor, Tensor | None] | None = None
        self.warm = False
        self.kept: list = []  # the fused forward's tables and masks the graph reads (kept alive with it)
        plan = fused.bias_plan(list(run.opts.fwd_hooks or ()))
        biases = [h.bias for hs in (plan.values() if isinstance(plan, dict) else ()) for h in hs]
        self.biases = [(b, b._version) for b in biases]  # the attention biases, as recorded
        for group in run.opt.param_groups:  # the schedule fills these in place; the graph reads them
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=dev)
            group["capturable"] = graph
            if not graph:
                group["foreach"] = False  # the CPU stand-in: only AdamW's per-tensor form takes a CPU tensor lr

    def __call__(self, run, batch: StepBatch, amp) -> tuple[Tensor, Tensor | None]:
        if tuple(batch.tokens.shape) != self.shape:
            raise ValueError(f"a captured step takes batches of {self.shape}, got {tuple(batch.tokens.shape)}")
        if any(b._version != v for b, v in self.biases):
            raise ValueError("an attention bias of this captured step was changed in place after it was recorded, "
                             "which the recorded step would not see: train with capture=False to change biases")
        self.static.tokens.copy_(batch.tokens, non_blocking=True)
        self.static.labels.copy_(batch.labels, non_blocking=True)
        self.static.n_target.fill_(batch.n_target)
        if not self.warm:
            self._record(run, amp)
        if self.graph is not None:
            self.graph.replay()
            loss, norm = self.out
        else:
            loss, norm = self.step(run, self.static, amp)
        return loss.clone(), None if norm is None else norm.clone()

    def _record(self, run, amp) -> None:
        """Warm up on a side stream, record the graph (CUDA), and undo the warm-up's updates."""
        snapshot = _state_snapshot(run)
        fused.tables(run.model).clear()  # the warm-up builds every table and mask the recorded forward reads
        side = torch.cuda.Stream() if self.use_graph else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
        with warnings.catch_warnings(), (torch.cuda.stream(side) if side is not None else nullcontext()):
            warnings.filterwarnings("ignore", message=".*capturable=True.*")  # the warm-up runs uncaptured
            for _ in range(WARMUP_STEPS):
                self.step(run, self.static, amp)
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
            run.opt.zero_grad(set_to_none=True)  # gradients allocated inside the graph's own memory
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):  # the prefetch thread pins memory
                self.out = self.step(run, self.static, amp)
        self.kept = list(fused.tables(run.model).values())
        _restore(run, snapshot)
        self.warm = True
