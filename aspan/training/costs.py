"""What a training step costs, counted the same way on any device, and aspan's step taken one at a time outside
`train`: what `benchmarks/bench_training.py` and the GPU slice's training check measure.

- `count_kernels(fn)`: kernels `fn()` launches, from torch.profiler's operator events: every leaf operator (one
  that calls no other operator but view and metadata ones), each foreach/fused operator once. On the CPU this is
  the number of kernels the same operators launch on a GPU, each of which costs a launch (~5-10 us); for a captured
  step (a CUDA graph), the launches outside its graph.
- `SyncCounter`: reads of tensor values into Python and blocking copies, each a device sync on a GPU.
- `Stepper`: the loop's own set-up, batches, step and tally, driven one step at a time.
"""
from __future__ import annotations

import sys
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from ..param_groups import parse_train_only
from .config import RunOptions, TrainConfig
from .data import Data, Replay
from .graph import check_capture
from .loop import stepping, take_step
from .run import _freezer, _prepare, _setup_optimizer, _start

# operators that make views, metadata or empty memory only: no kernel on a GPU
NO_KERNEL = frozenset(f"aten::{name}" for name in (
    "empty", "empty_strided", "empty_like", "as_strided", "view", "_unsafe_view", "_reshape_alias", "reshape",
    "alias", "detach", "resolve_conj", "resolve_neg", "result_type", "t", "transpose", "permute", "expand",
    "expand_as", "view_as", "slice", "select", "unsqueeze", "squeeze", "split", "split_with_sizes", "unsafe_split",
    "unbind", "chunk", "narrow", "movedim", "flatten", "unflatten", "lift_fresh", "_local_scalar_dense", "item",
    "resize_", "scalar_tensor", "to", "_to_copy", "contiguous", "numpy_T", "mT", "is_nonzero", "new_empty",
    "new_empty_strided", "clone", "zeros", "ones", "full", "new_zeros", "zeros_like", "ones_like", "full_like",
    "_has_compatible_shallow_copy_type"))
GROUPED = ("aten::_foreach_", "aten::_fused_")  # one kernel launch (or a few) for a whole list of tensors


OPTIMIZER = "Optimizer.step#"  # torch.profiler's label of an optimiser's step


def _kernels(event) -> int:
    """Kernels of one operator event and everything it calls."""
    if event.name.startswith(GROUPED):
        return 1
    calls = [c for c in event.cpu_children if c.name.startswith("aten::")]
    inside = sum(_kernels(c) for c in calls)
    own = event.name.startswith("aten::") and event.name not in NO_KERNEL and all(c.name in NO_KERNEL for c in calls)
    return inside + own


def _in_optimizer(event) -> bool:
    while event is not None:
        if event.name.startswith(OPTIMIZER):
            return True
        event = event.cpu_parent
    return False


def count_kernels(fn: Callable[[], object]) -> dict[str, int]:
    """Kernels `fn()` launches (see the module's docstring), counted over every thread's operators: the `total`
    and those of the optimiser's step (`optimizer`: per tensor for AdamW's default CPU implementation, a few for
    the whole model for its foreach and fused ones)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    tops = [e for e in prof.events() if e.name.startswith("aten::")
            and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    return {"total": sum(_kernels(e) for e in tops), "optimizer": sum(_kernels(e) for e in tops if _in_optimizer(e))}


def _names_device(args: tuple, kwargs: dict) -> bool:
    """Whether a `to`/`copy_`/`cuda` call moves memory to a device (not only a cast to another dtype)."""
    if "device" in kwargs or not args:
        return True
    return any(isinstance(a, (torch.device, str, torch.Tensor, int)) and not isinstance(a, bool) for a in args[1:])


class SyncCounter(TorchFunctionMode):
    """While active, counts `reads` (a tensor's value into Python: `item`, `float(t)`, `int(t)`, `bool(t)`,
    `tolist`, `numpy`) asked for by code outside torch, and `blocking_copies` (`to`, `copy_` or `cuda` to a device
    without `non_blocking=True`) asked for by code outside torch and TransformerLens. On a GPU each is a device
    sync; on the CPU the same calls are counted. Left out: torch's AdamW reads its step counters, which it keeps on
    the host so that reading them costs nothing, and TransformerLens's `.to(device)` calls keep each tensor where it
    is on a single device."""

    READS = frozenset({"item", "__float__", "__int__", "__bool__", "__index__", "tolist", "numpy"})
    COPIES = frozenset({"to", "copy_", "cuda"})

    def __init__(self):
        super().__init__()
        self.reads = self.blocking_copies = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in self.READS or (name in self.COPIES and not kwargs.get("non_blocking", False)):
            caller = set(sys._getframe(1).f_code.co_filename.replace("\\", "/").split("/"))
            if name in self.READS:
                self.reads += "torch" not in caller
            elif not caller & {"torch", "transformer_lens"} and (name == "cuda" or _names_device(args, kwargs)):
                self.blocking_copies += 1
        return func(*args, **kwargs)


class Stepper:
    """aspan's training step outside `train`, one at a time: `train`'s set-up (device, optimiser, schedule, what
    trains), its batches made ahead, its step function (eager or captured, as `config` says) and its tally. `step()`
    takes the next step without reading anything back; `read()` fetches the pending values (the sync a log row
    makes) and returns the last step's loss. `config.steps` bounds the steps; `close()` stops the prefetching."""

    def __init__(self, model, tokenizer, data: Data | Replay, config: TrainConfig, prefetch: int = 2):
        run = _prepare(model, tokenizer, data, config, RunOptions(progress=False, prefetch=prefetch, meta=None))
        check_capture(run)
        model.zero_grad(set_to_none=True)
        run.freezer = _freezer(model, parse_train_only(config.train_only))
        _setup_optimizer(run)
        _start(run)
        model.train()
        self.run, self.taken = run, 0
        self._steps = stepping(run)
        self.steps = self._steps.__enter__()

    @property
    def tally(self):
        """The run's `Tally` (its `tokens` count every step's real tokens)."""
        return self.run.tally

    def step(self) -> None:
        """Take the next optimiser step."""
        take_step(self.run, self.steps, self.taken)
        self.taken += 1

    def read(self) -> float:
        """The last step's mean loss per target token (waits for the device)."""
        self.run.tally.read()
        return self.run.tally.loss

    def close(self) -> None:
        """Stop making batches ahead and give back what trains."""
        self._steps.__exit__(None, None, None)
        if self.run.freezer:
            self.run.freezer.close()
