"""One training loop for from-scratch training and fine-tuning: loss on target + EOS rows only.

    cfg = TrainConfig.scratch(steps=1500)          # or TrainConfig.finetune() (paper defaults)
    result = train(model, tokenizer, tasks.preset("reversal", "id"), cfg, out_dir="runs/rev",
                   eval_data={"id": id_samples, "ood": ood_samples})

Data is a Task (batches generated on the fly: batch `s` comes from seed `(seed, s)` alone, so a resumed run sees
the same data), a list of Samples, or an `aspan data` JSONL file (shuffled per epoch from `(seed, epoch)`).
AdamW, linear warm-up then cosine decay, gradient clipping, bf16 autocast on CUDA, DDP under `torchrun`.
`out_dir` gets `log.jsonl` (train rows; the last says why and at which step the run ended), `eval.jsonl` (periodic
ID/OOD evaluation), `curves.jsonl` (learning curves on held-out sets, which a stop rule may end the run on:
`aspan.curves`), `checkpoints/` (weights + optimizer/scheduler/step/RNG state, each checkpoint written whole into a
temporary directory and renamed, pointed to by `checkpoints/latest`) and, at the end, the final model itself
(`aspan.models.load(out_dir)` works). Nothing read back runs code: tensors are safetensors, everything else JSON
(`read_state`).
"""
from __future__ import annotations

import json
import logging
import math
import os
import pickle
import random
import re
import shutil
import time
import warnings
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm.auto import tqdm

from hooks import check_hook_points

from . import stopping
from .batching import IGNORE, Batch, make_batch, scores_eos
from .checks import check_device
from .curves import CURVES_FILE, Stop, auto_every, curve_cost, steps_to_target, stop_point
from .io import append_line, atomic_dir, cut_rows, parse_json, to_json, write_text
from .models.backend import backend_of
from .models.tiny import check_context
from .models.trained import TrainedTask, record_task
from .options import CurveMetric, StopRule
from .param_groups import Freezer, TrainOnly, group_masks, live_parameters, parse_train_only
from .tasks.base import Sample, Task
from .tokenization import Tokenizer, check_tokenizer, require_tokenizer

STATE_JSON, STATE_TENSORS = "train_state.json", "train_state.safetensors"  # a checkpoint's training state
LEGACY_STATE = "train_state.pt"  # earlier versions' pickle: read with torch.load(weights_only=True) only
STATE_FORMAT = "aspan-train-state"
STEP_NAME = re.compile(r"step-[0-9]+")  # what checkpoints/latest may hold


logger = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """Optimiser, schedule and bookkeeping settings; `scratch()` and `finetune()` give the two default sets."""

    steps: int | None = 1500  # None: `epochs` passes over a finite dataset
    epochs: int = 1
    batch_size: int = 64  # global batch (split across DDP ranks)
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.1  # on tensors of >= 2 dimensions (matrices and per-head q/k/v biases; `decays`)
    warmup: int = 100  # linear warm-up steps, then cosine decay to min_lr_ratio·lr
    min_lr_ratio: float = 0.1
    grad_clip: float | None = 1.0
    eval_every: int = 0  # 0: evaluate only at the end (when eval_data is given)
    eval_samples: int = 200  # per split, used by the CLI to build eval_data
    eval_batch_size: int = 64
    seed: int = 0
    device: str = "auto"
    train_only: str | None = None  # None (everything) or parameter groups, e.g. "qk-pair:0,3" (aspan.param_groups)
    log_every: int = 10
    ckpt_every: int = 0  # 0: checkpoint only at the end (and whenever stop_after stops the run)
    amp: bool = True  # bf16 autocast on CUDA
    # learning curves on `curve_data` (aspan.curves): every N steps, None: the N that keeps them <= 10 % of training
    # time (`curves.auto_every`), 0: none; and the stop rule they drive (`curves.Stop`)
    curve_every: int | None = None
    stop: StopRule = "none"
    stop_bucket: str = "id"
    target: float | None = None
    stop_metric: CurveMetric = "exact"

    def __post_init__(self):
        if isinstance(self.train_only, TrainOnly):
            self.train_only = str(self.train_only)

    @classmethod
    def scratch(cls, **kw: Any) -> "TrainConfig":
        """From-scratch defaults (the tiny reversal model learns its ID preset in ~1500 steps at lr 1e-3, batch 64)."""
        return cls(**kw)

    @classmethod
    def finetune(cls, **kw: Any) -> "TrainConfig":
        """Fine-tuning defaults of Spiegel et al. 2025 ("Attend or Perish", Appendix D): AdamW lr 5e-6, betas
        (0.95, 0.999), weight decay 0.2, batch 4, 1 epoch."""
        base = dict(steps=None, epochs=1, batch_size=4, lr=5e-6, betas=(0.95, 0.999), weight_decay=0.2,
                    warmup=0, min_lr_ratio=1.0, grad_clip=1.0)
        return cls(**{**base, **kw})

    def stop_rule(self) -> Stop:
        """The stop rule these settings describe (checked)."""
        return Stop(self.stop, self.stop_bucket, self.target, self.stop_metric).check()

    def check(self) -> None:
        """ValueError on impossible settings, before any work."""
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        for name in ("epochs", "batch_size", "log_every", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.curve_every is not None and self.curve_every < 0:
            raise ValueError(f"curve_every must be >= 0 (or None), got {self.curve_every}")
        for name in ("warmup", "eval_every", "ckpt_every", "eval_samples", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.seed >= 1 << 30:
            raise ValueError(f"seed must be < 2**30, got {self.seed}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("weight_decay must be >= 0 and min_lr_ratio in [0, 1]")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {self.grad_clip}")
        parse_train_only(self.train_only)
        self.stop_rule()


class TrainResult(NamedTuple):
    """What `train` returns: the model, its history rows, its output directory and why it stopped."""
    model: Any
    history: list[dict]
    out_dir: Path | None
    stop: dict | None = None  # why and at which step the run ended (None: paused by stop_after before its end)


# ----------------------------------------------------------------------------------------------- data
def batch_seed(seed: int, index: int) -> int:
    """A hash-free seed for batch (or epoch) `index` of run `seed`: the same on every Python version and hash seed.

    Bit 62 keeps training seeds apart from the small seeds evaluation sets are drawn with (`task.generate(n, seed)`).
    """
    return (1 << 62) | (seed << 32) | index


def read_jsonl(path: str | os.PathLike) -> list[Sample]:
    """Samples from an `aspan data` JSONL file, each checked against its task (`aspan.tasks.read_samples`)."""
    from .tasks import read_samples

    return read_samples(path)


Data = Task | Sequence[Sample] | str | os.PathLike  # a task (generated on the fly), samples, or a JSONL file
REPLAY_STREAM = 1 << 31  # batch_seed index offset of the replay stream (steps stay far below 2**31)


@dataclass(frozen=True)
class Replay:
    """Fine-tuning data that keeps old lengths: each batch holds round(share * batch_size) samples of `replay`
    (e.g. the ID preset) and the rest from `data` (e.g. longer strings), so forgetting and extrapolation can be
    told apart. Both streams are deterministic functions of (seed, step), independent of each other."""

    data: Data  # the fine-tuning stream
    replay: Data  # the old distribution mixed back in
    share: float  # fraction of every batch drawn from `replay`, in [0, 1)

    def __post_init__(self):
        if not 0 <= self.share < 1:
            raise ValueError(f"replay share must be in [0, 1), got {self.share}")


def replay_count(share: float, batch_size: int) -> int:
    """Replay samples per batch: round(share * batch_size), at most batch_size - 1 (every batch keeps new data)."""
    return min(batch_size - 1, int(math.floor(share * batch_size + 0.5)))


class _Source:
    """One deterministic source of samples: `take(n, key)` depends only on (data, seed, n, key)."""

    def __init__(self, data: Data, batch_size: int, seed: int, index_offset: int = 0):
        if isinstance(data, (str, os.PathLike)):
            data = read_jsonl(data)
        self.task = data if isinstance(data, Task) else None
        self.samples = None if self.task else list(data)
        if self.samples is not None and not self.samples:
            raise ValueError("no training samples")
        bad = next((i for i, x in enumerate(self.samples or ()) if not isinstance(x, Sample)), None)
        if bad is not None:
            raise ValueError(f"training data: sample {bad} is a {type(self.samples[bad]).__name__}, not an aspan "
                             f"Sample (give a task, samples from task.generate(n), or an `aspan data` JSONL file)")
        self.batch_size, self.seed, self.index_offset = batch_size, seed, index_offset

    @property
    def steps_per_epoch(self) -> int | None:
        return None if self.samples is None or not self.batch_size else math.ceil(len(self.samples) / self.batch_size)

    def batch(self, step: int) -> list[Sample]:
        if not self.batch_size:
            return []
        if self.task is not None:
            return self.task.generate(self.batch_size, seed=batch_seed(self.seed, self.index_offset + step))
        epoch, k = divmod(step, self.steps_per_epoch)
        order = list(range(len(self.samples)))
        random.Random(batch_seed(self.seed, self.index_offset + epoch)).shuffle(order)
        return [self.samples[i] for i in order[k * self.batch_size : (k + 1) * self.batch_size]]

    def max_text_len(self) -> int:
        return self.task.max_text_len() if self.task else max(len(s.text) for s in self.samples)

    def alphabet(self) -> str:
        return self.task.alphabet if self.task else "".join(sorted({c for s in self.samples for c in s.text}))


class DataStream:
    """Deterministic batches: `batch(step)` depends only on (data, seed, batch_size, step); with a `Replay` the
    first batch_size - k samples come from its data and the last k from its replay set (k = `replay_count`)."""

    def __init__(self, data: Data | Replay, batch_size: int, seed: int):
        k = replay_count(data.share, batch_size) if isinstance(data, Replay) else 0
        main = data.data if isinstance(data, Replay) else data
        self.sources = [_Source(main, batch_size - k, seed)]
        if isinstance(data, Replay):
            self.sources.append(_Source(data.replay, k, seed, REPLAY_STREAM))
        self.task = self.sources[0].task
        self.samples = self.sources[0].samples
        self.batch_size, self.seed, self.n_replay = batch_size, seed, k

    @property
    def steps_per_epoch(self) -> int | None:
        """Steps per pass over a file source, or None for generated data."""
        return self.sources[0].steps_per_epoch

    def batch(self, step: int) -> list[Sample]:
        """The samples of training step `step`, from every source."""
        return [s for src in self.sources for s in src.batch(step)]

    def max_text_len(self) -> int:
        """The longest text any source produces."""
        return max(src.max_text_len() for src in self.sources)

    def alphabet(self) -> str:
        """Every character the stream's sources can produce, sorted."""
        return "".join(sorted(set("".join(src.alphabet() for src in self.sources))))


# ----------------------------------------------------------------------------------------------- helpers
def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine from 1 to `min_ratio` at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


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


def _cut_logs(out_dir: Path, step: int) -> list[dict]:
    """Cut `log.jsonl`, `eval.jsonl` and `curves.jsonl` back to the rows of steps up to `step` (in place: works on a
    full disk too), the row saying why the run stopped dropped (the run goes on, or says it again); their remaining
    rows, train rows before the evaluations of the same step."""
    kept = lambda row: row.get("step", 0) <= step and row.get("kind") != "stop"  # noqa: E731
    rows = [r for name in ("log.jsonl", "eval.jsonl", CURVES_FILE) for r in cut_rows(out_dir / name, kept)]
    return sorted(rows, key=lambda r: (r.get("step", 0), r.get("kind") != "train"))


def _complete(path: Path) -> bool:
    return (path / "config.json").is_file() and ((path / STATE_JSON).is_file() or (path / LEGACY_STATE).is_file())


def _found(root: Path) -> str:
    names = sorted(p.name for p in root.glob("step-*") if STEP_NAME.fullmatch(p.name) and _complete(p))
    if not names:
        return f"and {root} holds no complete checkpoint"
    return f"checkpoints there: {', '.join(names)} (write the name of the one to continue from into {root / 'latest'})"


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The checkpoint `checkpoints/latest` names, or None when the run has none (no pointer, no checkpoint).

    The pointer must name a complete `step-N` directory inside `checkpoints/` (no path separators, no `..`, not
    absolute, not a link leading out); anything else, or a missing pointer beside existing checkpoints, is a
    ValueError naming the pointer and the checkpoints that exist (none is ever deleted for it).
    """
    root = Path(out_dir) / "checkpoints"
    pointer = root / "latest"
    if not pointer.exists():
        if root.is_dir() and any(STEP_NAME.fullmatch(p.name) for p in root.glob("step-*")):
            raise ValueError(f"{pointer} is missing; {_found(root)}")
        return None
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{pointer} is unreadable ({type(e).__name__}); {_found(root)}") from None
    if not STEP_NAME.fullmatch(name):
        raise ValueError(f"{pointer} must name a step-N directory of {root}, it holds {name[:80]!r}; "
                         f"{_found(root)}")
    path = root / name
    if path.resolve().parent != root.resolve():
        raise ValueError(f"{pointer} names {path}, a link leading out of {root}; {_found(root)}")
    if not _complete(path):
        raise ValueError(f"{pointer} names {name}, which is missing or incomplete; {_found(root)}")
    return path


def _save_checkpoint(out_dir: Path, model, tokenizer, state: dict, meta: dict) -> Path:
    """Weights (aspan.models.save) and training state into a temporary directory renamed `checkpoints/step-N` when
    whole, then `latest` flipped and older checkpoints dropped: a failed write (a full disk) leaves nothing of it."""
    from . import models

    root = out_dir / "checkpoints"
    name = f"step-{state['step']:08d}"
    with atomic_dir(root / name) as tmp:
        models.save(model, tmp, tokenizer, hf=False, **meta)  # exact parameters: resuming needs them
        _write_state(tmp, state)
    write_text(root / "latest", name)
    for old in root.glob("step-*"):
        if old.name != name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return root / name


def _split_tensors(obj: Any, tensors: dict[str, torch.Tensor], key: str) -> Any:
    """`obj` as JSON data: each tensor moved into `tensors` (under a name made of its place) and replaced by
    `{"__tensor__": name}`; dict keys become strings."""
    if isinstance(obj, torch.Tensor):
        tensors[key] = obj.detach().cpu().clone().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        return {str(k): _split_tensors(v, tensors, f"{key}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_split_tensors(v, tensors, f"{key}.{i}") for i, v in enumerate(obj)]
    return obj


def _join_tensors(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of `_split_tensors` (KeyError for a tensor the file does not hold)."""
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        return {k: _join_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join_tensors(v, tensors) for v in obj]
    return obj


def _write_state(directory: Path, state: dict) -> None:
    """The training state as `train_state.safetensors` (its tensors) and `train_state.json` (the rest)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    data = _split_tensors(state, tensors, "state")
    save_file(tensors, str(directory / STATE_TENSORS))
    (directory / STATE_JSON).write_text(to_json({"format": STATE_FORMAT, "version": 1, "state": data}) + "\n")


def read_state(ckpt: str | os.PathLike) -> dict:
    """The training state of checkpoint directory `ckpt` (step, optimizer, scheduler, RNG, config), read without
    running code: safetensors + JSON, or an earlier version's `train_state.pt` through `torch.load(weights_only=True)`,
    which refuses a pickle that would import or call anything. ValueError naming the file otherwise."""
    ckpt = Path(ckpt)
    advice = f"delete {ckpt} to resume from an earlier checkpoint, or start afresh"
    if (ckpt / STATE_JSON).is_file():
        file = ckpt / STATE_JSON
        state = _read_state_files(ckpt, file, advice)
    elif (ckpt / LEGACY_STATE).is_file():
        file = ckpt / LEGACY_STATE
        state = _read_legacy_state(file, advice)
    else:
        raise ValueError(f"cannot resume: {ckpt} holds no training state ({STATE_JSON} is missing); {advice}")
    problem = _state_problem(state)
    if problem:
        raise ValueError(f"cannot resume: {file} is not a training state ({problem}); {advice}")
    return state


def _read_state_files(ckpt: Path, file: Path, advice: str) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        doc = parse_json(file.read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
            raise ValueError(f"format is not {STATE_FORMAT!r}")
        state = _join_tensors(doc["state"], load_file(str(ckpt / STATE_TENSORS), device="cpu"))
        state["optimizer"]["state"] = {int(k): v for k, v in state["optimizer"]["state"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, SafetensorError) as e:
        raise ValueError(f"cannot resume: {file} (with {STATE_TENSORS}) is truncated or corrupt "
                         f"({type(e).__name__}); {advice}") from None
    return state


def _read_legacy_state(file: Path, advice: str) -> dict:
    try:
        with warnings.catch_warnings():  # a plain pickle (not torch.save's) makes torch warn about its protocol
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only load failed" in str(e).lower():
            raise ValueError(f"cannot resume: {file} asks to import or call code when loaded (refused, nothing was "
                             f"run); {advice}") from None
        raise ValueError(f"cannot resume: {file} is truncated or corrupt (UnpicklingError); {advice}") from None
    except Exception as e:  # a truncated or corrupt file fails in many ways (EOFError, RuntimeError, zip errors)
        raise ValueError(f"cannot resume: {file} is truncated or corrupt ({type(e).__name__}); {advice}") from None


def _state_problem(state: Any) -> str | None:
    """What makes `state` unusable as a training state, or None."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not a dict"
    for key, kind in (("step", int), ("optimizer", dict), ("scheduler", dict), ("rng", dict), ("config", dict)):
        if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
            return f"{key!r} missing or not a {kind.__name__}"
    if state["step"] < 0:
        return f"negative step {state['step']}"
    if not isinstance(state["rng"].get("torch"), torch.Tensor):
        return "no torch RNG state"
    return None


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    if s.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def decays(name: str, p: torch.Tensor) -> bool:
    """Whether weight decay applies to parameter `name`: every tensor of two or more dimensions (nanoGPT's rule), which
    on a HookedTransformer includes the per-head query/key/value biases (`b_Q`, `b_K`, `b_V`: [head, d_head]), as
    every committed result was trained. A TransformerBridge holds those biases as 1-D Hugging Face ones (`q.bias`,
    `k.bias`, `v.bias`): they decay too, so both backends train alike. Other biases and LayerNorms never decay."""
    parts = name.replace("._original_component", "").split(".")
    return p.ndim >= 2 or (parts[-1] == "bias" and len(parts) > 1 and parts[-2] in ("q", "k", "v", "qkv"))


def _optimizer(model, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay where `decays` says (tensors of >= 2 dimensions and the query/key/value biases);
    parameters that do not train are left out."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in params if decays(n, p)]
    rest = [p for n, p in params if not decays(n, p)]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr, betas=tuple(config.betas))


def train_batch(samples: Sequence[Sample], tokenizer: Tokenizer, n_ctx: int | None = None) -> Batch:
    """`make_batch` with successor's EOS label dropped: its series has no natural end, so EOS is not a target."""
    batch = make_batch(samples, tokenizer, n_ctx=n_ctx)
    if tokenizer.eos_id is not None:
        for i, s in enumerate(samples):
            if not scores_eos(s):
                batch.labels[i, batch.lengths[i] - 2] = IGNORE
        batch.target_rows = batch.labels != IGNORE
    return batch


def target_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy over target + EOS rows (labels != IGNORE); every other row is left out."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="sum")




# ----------------------------------------------------------------------------------------------- time budget
@dataclass(frozen=True)
class TimeBudget:
    """A wall-clock limit on every `train` call made inside `time_budget(...)` (e.g. a GPU slice of a few minutes).

    A run checks the budget after every optimiser step (all DDP ranks agree): once `clock()` reaches `deadline` it
    writes a checkpoint at that step (when it has an `out_dir`) and raises `BudgetSpent`, so `train(...,
    resume=True)` later continues it exactly; while it runs, a run with an `out_dir` is checkpointed whenever
    `checkpoint_s` seconds passed since its last checkpoint, so a process killed from outside loses at most that
    much. A run without an `out_dir` is simply stopped (its caller reruns it whole)."""

    deadline: float  # clock() value at which training pauses
    checkpoint_s: float = 120.0  # the oldest a running checkpoint may get (seconds of clock())
    clock: Callable[[], float] = time.monotonic  # tests pass a step counter here

    def spent(self) -> bool:
        """Whether the deadline has passed."""
        return self.clock() >= self.deadline


class BudgetSpent(Exception):
    """The time budget ran out inside `train`: the run stopped after `step` steps (checkpointed if it had an
    `out_dir`)."""

    def __init__(self, step: int, out_dir: Path | None = None):
        where = f" (checkpointed in {out_dir})" if out_dir is not None else " (nothing new to save)"
        super().__init__(f"time budget spent after step {step}{where}; run again to continue")
        self.step, self.out_dir = step, out_dir


_BUDGET: ContextVar[TimeBudget | None] = ContextVar("aspan_time_budget", default=None)


@contextmanager
def time_budget(budget: TimeBudget | None) -> Iterator[TimeBudget | None]:
    """Every `train` call inside the block (this thread or task only) honours `budget` (None: no limit)."""
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def current_budget() -> TimeBudget | None:
    """The budget `time_budget` set for this context, if any."""
    return _BUDGET.get()


def _budget_step(run: "_Run", done: int, last_ckpt: float) -> float:
    """After step `done`: pause (checkpoint, BudgetSpent) when the budget is spent, or checkpoint when the last one
    is older than the budget's `checkpoint_s`. Returns the clock time of the last checkpoint."""
    budget = _BUDGET.get()
    if budget is None:
        return last_ckpt
    now = budget.clock()
    if _agree(run, int(now >= budget.deadline)):
        if run.saved != done:
            _checkpoint(run, done)
        raise BudgetSpent(done, run.opts.out_dir)
    if run.opts.out_dir is not None and now - last_ckpt >= budget.checkpoint_s and run.saved != done:
        _checkpoint(run, done)
        return now
    return last_ckpt


# ----------------------------------------------------------------------------------------------- the loop
@dataclass
class RunOptions:
    """Everything about one call of `train` besides the model, the data and the optimiser settings."""

    out_dir: Path | None = None  # run directory (log.jsonl, eval.jsonl, curves.jsonl, checkpoints/, model); None: none
    eval_data: dict[str, Sequence[Sample]] | None = None  # named evaluation sets (e.g. train, id, ood, length 11-20)
    resume: bool = False  # continue from the last checkpoint in out_dir
    fwd_hooks: Any = ()  # hook list or factory f(batch) -> list, active in every training and evaluation forward
    progress: bool = True  # progress bar and printed evaluations
    stop_after: int | None = None  # end (checkpointed) after this step; a later resume continues exactly
    meta: dict = field(default_factory=dict)  # extra metadata for the saved checkpoints
    curve_data: dict[str, Sequence[Sample]] | None = None  # held-out curve sets (aspan.curves), e.g. id, length 11-20
    on_curve: Callable[[list[dict]], None] | None = None  # called with each evaluation's curve rows (main process)


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
    net: Any = None  # the model, or its DDP wrapper
    history: list = field(default_factory=list)
    start: int = 0
    saved: int = 0  # step of the last checkpoint written (or resumed from)
    every: int = 0  # curve interval (0: no curves)
    stopped_at: int | None = None  # the step at which the stop rule fired
    trained_s: float = 0.0  # training seconds since the last curve evaluation
    wall_offset: float = 0.0  # wall seconds of the run before this call (a resumed run's last curve row)
    began: float = field(default_factory=time.perf_counter)

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


def train(
    model,
    tokenizer: Tokenizer,
    data: Data | Replay,
    config: TrainConfig | None = None,
    out_dir: str | os.PathLike | None = None,
    eval_data: dict[str, Sequence[Sample]] | None = None,
    resume: bool = False,
    fwd_hooks: Sequence[tuple[str, Callable]] | Callable = (),
    progress: bool = True,
    stop_after: int | None = None,
    meta: dict | None = None,
    curve_data: dict[str, Sequence[Sample]] | None = None,
    on_curve: Callable[[list[dict]], None] | None = None,
) -> TrainResult:
    """Train `model` in place on `data` (a task, samples, a JSONL file, or a `Replay` mixture).

    Returns the model, the logged rows and `out_dir`. The keyword arguments are those of `RunOptions` (kept as
    keywords for callers; the stages below take the grouped `_Run`). `fwd_hooks` (a list of `(name, fn)` or a
    factory `f(batch) -> list`) stay active in every training forward and in the periodic evaluations, e.g. an
    ABC pre-softmax bias while fine-tuning. `stop_after` ends the run after that step (checkpointed) so a later
    `resume=True` run continues it exactly. `meta` goes into the saved checkpoints. With `config.train_only` only
    that parameter group trains (`aspan.param_groups`); the first row of `log.jsonl` records its size.
    `curve_data` (named held-out sets) adds learning curves to `curves.jsonl` and lets `config.stop` end the run
    early (`aspan.curves`); the last row of `log.jsonl` and the result's `stop` say why and at which step it ended;
    `on_curve` gets each evaluation's rows as they are written (e.g. to log them elsewhere).
    """
    opts = RunOptions(None if out_dir is None else Path(out_dir), eval_data, resume, fwd_hooks, progress,
                      stop_after, dict(meta or {}), curve_data, on_curve)
    run = _prepare(model, tokenizer, data, config or TrainConfig.scratch(), opts)
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
                    config: TrainConfig, **options: Any) -> TrainResult:
    """`train` into the scratch directory `scratch`: a checkpoint there (a run paused by `time_budget`, or killed
    after a checkpoint) is continued exactly, anything else there is cleared first, and `scratch` is removed once the
    run ends, so it only ever holds an unfinished run. `options` are `train`'s keywords (not out_dir or resume);
    ValueError, naming the setting, when the checkpoint there was trained with other settings."""
    scratch = Path(scratch)
    ckpt = latest_checkpoint(scratch) if scratch.is_dir() else None
    if ckpt is None:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        check_resume(ckpt, config, options.get("meta"), model)
    result = train(model, tokenizer, data, config, out_dir=scratch, resume=ckpt is not None, **options)
    shutil.rmtree(scratch, ignore_errors=True)
    return result._replace(out_dir=None)


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
    check_context(model, stream.max_text_len(), tokenizer.offset, eos=tokenizer.eos_id is not None)
    check_tokenizer(tokenizer, stream.alphabet())
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
    run.net = model
    if run.world > 1:
        ids = [run.device.index] if run.device.type == "cuda" else None
        run.net = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


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


def _agree(run: _Run, value: int) -> int:
    """Rank 0's `value` on every process (itself without DDP): all ranks stop at the same step."""
    if run.world == 1:
        return value
    t = torch.tensor([value], device=run.device)
    dist.broadcast(t, 0)
    return int(t[0])


def _train_step(run: _Run, step: int, amp) -> tuple[float, int, float | None]:
    """One optimiser step on batch `step`: (mean loss per target token, tokens in the batch, gradient norm)."""
    from .evaluation import hooks_for

    samples = run.stream.batch(step)
    eos = run.tokenizer.eos_id is not None
    # over the global batch, so DDP's gradient average is the global per-token mean
    n_target = sum(len(s.target) - len(s.given) + (eos and scores_eos(s)) for s in samples)
    batch = train_batch(samples[run.rank :: run.world], run.tokenizer, run.model.cfg.n_ctx).to(run.device)
    with amp, run.model.hooks(fwd_hooks=check_hook_points(run.model, hooks_for(run.opts.fwd_hooks, batch))):
        logits = run.net(batch.tokens)
    loss_sum = target_loss(logits, batch.labels)
    run.opt.zero_grad(set_to_none=True)
    (loss_sum * run.world / n_target).backward()
    clip = run.config.grad_clip
    grad_norm = float(torch.nn.utils.clip_grad_norm_(run.model.parameters(), clip)) if clip else None
    run.opt.step()
    run.sched.step()
    if run.freezer:
        run.freezer.restore()
    n_tok = int(batch.attention_mask.sum())
    if run.world > 1:
        t = torch.tensor([float(loss_sum.detach()), n_tok], device=run.device)
        dist.all_reduce(t)
        loss_value, n_tok = float(t[0]) / n_target, int(t[1])
    else:
        loss_value = float(loss_sum.detach()) / n_target
    if not math.isfinite(loss_value):
        raise FloatingPointError(f"loss became {loss_value} at step {step + 1}; lower the learning rate")
    return loss_value, n_tok, grad_norm


def _loop(run: _Run) -> None:
    """Steps `start`..`end` with logging, periodic evaluation and checkpoints."""
    config = run.config
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if run.device.type == "cuda" and config.amp else nullcontext()
    run.model.train()
    bar = tqdm(total=run.total, initial=run.start, desc="train", disable=not (run.main and run.opts.progress),
               dynamic_ncols=True)
    budget = _BUDGET.get()
    last_ckpt = budget.clock() if budget is not None else 0.0
    if budget is not None and run.start < run.end and _agree(run, int(budget.spent())):
        bar.close()
        raise BudgetSpent(run.start)  # spent before this run took a step: nothing new to save
    if run.every and run.start == 0:
        _curve(run, 0)  # where training starts from (a stop rule never fires here)
    with bar:
        _steps(run, amp, bar, last_ckpt)


def _steps(run: _Run, amp, bar, last_ckpt: float) -> None:
    """The optimiser steps of `_loop`, each followed by its logging, evaluation, curve, checkpoint and budget check."""
    config = run.config
    tokens_seen, busy = 0, 0.0  # tokens/s counts training time only (evaluation and checkpoints excluded)
    for step in range(run.start, run.end):
        t0 = time.perf_counter()
        loss_value, n_tok, grad_norm = _train_step(run, step, amp)
        tokens_seen += n_tok
        busy += time.perf_counter() - t0
        run.trained_s += time.perf_counter() - t0
        done, rate = step + 1, tokens_seen / max(busy, 1e-9)
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.4f}", tok_s=f"{rate:,.0f}")
        if done % config.log_every == 0 or done == run.end:
            run.write("log.jsonl", {"kind": "train", "step": done, "loss": loss_value, "lr": run.sched.get_last_lr()[0],
                                    "tokens_per_s": rate, "grad_norm": grad_norm})
        if config.eval_every and done % config.eval_every == 0 and done != run.total:
            _evaluate(run, done)
        stopped = bool(run.every) and (done % run.every == 0 or done == run.total) and _curve(run, done)
        signalled = _agree(run, int(stopping.received() is not None))  # every process stops at the same step
        if stopped or done == run.end or signalled or (config.ckpt_every and done % config.ckpt_every == 0):
            _checkpoint(run, done)  # a stop signal: the step just finished is saved, the run resumes after it
        if signalled:
            stopping.check()
        if stopped:
            break
        if done != run.end:
            last_ckpt = _budget_step(run, done, last_ckpt)


def _curve(run: _Run, step: int) -> bool:
    """Score every curve set at `step` (rows to `curves.jsonl`, on the main process); whether the stop rule fires
    here (the same answer on every process), in which case `run.stopped_at` is `step`."""
    fired = None
    if run.main:
        train_s, run.trained_s = run.trained_s, 0.0
        first = len(run.history)
        for name, samples in run.opts.curve_data.items():
            t0 = time.perf_counter()
            res = _scores(run, samples)
            loss = heldout_loss(run.model, run.tokenizer, samples, run.opts.fwd_hooks, run.config.eval_batch_size)
            run.write(CURVES_FILE, {"kind": "curve", "step": step, "bucket": name, "n": len(samples),
                                    "exact": res["exact"], "partial": res["partial"], "loss": loss,
                                    "eval_s": time.perf_counter() - t0, "train_s": train_s,
                                    "wall_s": run.wall_offset + time.perf_counter() - run.began})
        if run.opts.on_curve is not None:
            run.opts.on_curve(run.history[first:])
        fired = stop_point(run.curves, run.config.stop_rule())
        if run.opts.progress and fired is not None:
            tqdm.write(f"step {step}: the {fired[1]} stop rule fired on {run.config.stop_bucket}")
    if _agree(run, int(fired is not None and fired[0] == step)):
        run.stopped_at = step
        return True
    return False


def _scores(run: _Run, samples: Sequence[Sample]) -> dict:
    """`evaluate`'s summary of `samples` under the run's hooks (teacher-forced, no attention scores)."""
    from .evaluation import evaluate

    return evaluate(run.model, run.tokenizer, samples, fwd_hooks=run.opts.fwd_hooks,
                    batch_size=run.config.eval_batch_size, attn=False).summary()


@torch.no_grad()
def heldout_loss(model, tokenizer: Tokenizer, samples: Sequence[Sample], fwd_hooks=(), batch_size: int = 64) -> float:
    """The training loss (mean cross-entropy per target + EOS token, `target_loss`) on `samples`, in eval mode."""
    from .evaluation import hooks_for

    was_training, total, count = model.training, 0.0, 0
    model.eval()
    try:
        for i in range(0, len(samples), batch_size):
            batch = train_batch(samples[i : i + batch_size], tokenizer, model.cfg.n_ctx).to(model.cfg.device)
            with model.hooks(fwd_hooks=check_hook_points(model, hooks_for(fwd_hooks, batch))):
                logits = model(batch.tokens)  # as in training: padding sits after every scored row
            total += float(target_loss(logits, batch.labels))
            count += int((batch.labels != IGNORE).sum())
    finally:
        model.train(was_training)
    return total / max(count, 1)


def _evaluate(run: _Run, step: int) -> None:
    """Evaluate every named set (with the run's hooks) and log one row per set."""
    if not (run.opts.eval_data and run.main):
        return
    for split, samples in run.opts.eval_data.items():
        row = {"kind": "eval", "step": step, "split": split, **_scores(run, samples)}
        row = {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
        run.write("eval.jsonl", row)
        if run.opts.progress:
            tqdm.write(f"step {step}: {split} exact {row['exact']:.3f} partial {row['partial']:.3f}")


def _checkpoint(run: _Run, step: int) -> None:
    """Save checkpoint `step`; if that fails (a full disk), the logs are cut back to the last good checkpoint."""
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
                from . import models

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


# Settings a resumed run may change: those that change neither the weights nor the data order, and the length of
# the run (`steps`, `epochs`, the curves and their stop rule: a finished or stopped run can be extended; the CLI
# records each resume in run.json).
RESUME_FREE = ("device", "eval_every", "eval_samples", "eval_batch_size", "ckpt_every", "log_every", "steps", "epochs",
               "curve_every", "stop", "stop_bucket", "target", "stop_metric")
ARCHITECTURE = ("n_layers", "n_heads", "d_model", "d_head", "d_mlp", "n_ctx", "d_vocab", "act_fn",
                "normalization_type", "positional_embedding_type", "rotary_dim", "n_key_value_heads")


def check_resume(ckpt: Path, config: TrainConfig, meta: dict | None, model) -> None:
    """ValueError naming the first setting of this run that differs from the checkpoint's: a resumed run must be the
    run it continues (same training settings, task, data, initialisation and architecture), or it would record
    settings it never trained with."""
    from .models.checkpoint import architecture, saved_info

    try:
        saved_meta, saved_model = saved_info(ckpt)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot resume: {ckpt / 'config.json'} is unreadable ({type(e).__name__}: {e})") from None
    as_json = lambda d: json.loads(json.dumps(d, default=str))  # noqa: E731  (tuples as lists, like the saved file)
    new, old = as_json(asdict(config)), saved_meta.get("train_config", {})
    pairs = [(f"--{k.replace('_', '-')}", old.get(k), v) for k, v in new.items() if k not in RESUME_FREE and k in old]
    pairs += [(f"run setting {k!r}", saved_meta.get(k), v) for k, v in as_json(meta or {}).items()
              if k not in ("step", "train_config", "trainable_parameters")]
    current = architecture(model)
    pairs += [(f"model {k}", saved_model.get(k), current.get(k)) for k in ARCHITECTURE
              if k in saved_model or k in current]
    for what, before, now in pairs:
        if before != now:
            raise ValueError(f"cannot resume {ckpt.parent.parent}: it was trained with {what} = {before!r}, "
                             f"now {now!r} (use the same settings, or a new --out)")


def _load_state(ckpt: Path, state: dict, run: _Run) -> int:
    """Weights from checkpoint `ckpt` and its optimizer, scheduler and RNG `state` (`read_state`) into the run;
    returns its step. ValueError if another data order."""
    from . import models

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
