"""The settings of a training run: `TrainConfig` (optimiser, schedule, bookkeeping), `RunOptions` (everything else
about one `train` call), what a run returns, and which settings a resumed run may change."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from ..curves import Stop
from ..options import CurveMetric, StopRule, check_count, check_real
from ..param_groups import TrainOnly, parse_train_only
from ..tasks.base import Sample


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
    # CUDA only: record the whole step (forward, backward, clipping, AdamW) once as a CUDA graph over batches padded
    # to one fixed shape, and replay it (`aspan.training.graph`); refused on the CPU, under DDP and with fwd_hooks
    capture: bool = False
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
        """ValueError naming the first impossible setting (a wrong type; a number that is not finite or outside its
        range, such as lr = inf, weight_decay = nan or a beta of 1.5), before any work."""
        if self.steps is not None:
            check_count("steps", self.steps, 1)
        for name in ("epochs", "batch_size", "log_every", "eval_batch_size"):
            check_count(name, getattr(self, name), 1)
        if self.curve_every is not None:
            check_count("curve_every", self.curve_every, 0)
        for name in ("warmup", "eval_every", "ckpt_every", "eval_samples"):
            check_count(name, getattr(self, name), 0)
        check_count("seed", self.seed, 0, 1 << 30)
        check_real("lr", self.lr, 0, open_low=True)
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        for i, beta in enumerate(self.betas):
            check_real(f"betas[{i}]", beta, 0, 1, open_high=True)
        check_real("weight_decay", self.weight_decay, 0)
        check_real("min_lr_ratio", self.min_lr_ratio, 0, 1)
        if self.grad_clip is not None:
            check_real("grad_clip", self.grad_clip, 0, open_low=True)
        for name in ("amp", "capture"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.device, str):
            raise ValueError(f"device must be a string such as 'cpu', 'cuda:0' or 'auto', got {self.device!r}")
        parse_train_only(self.train_only)
        self.stop_rule()


class TrainResult(NamedTuple):
    """What `train` returns: the model, its history rows, its output directory and why it stopped."""

    model: Any  # the trained model (the one passed in, trained in place)
    history: list[dict]  # every row the run logged: params, train, eval, curve and stop rows
    out_dir: Path | None  # the run directory (None: none, or `train_resumable`'s scratch directory, removed)
    stop: dict | None = None  # why and at which step the run ended (None: paused by stop_after before its end)


@dataclass
class RunOptions:
    """Everything about one call of `train` besides the model, the data and the optimiser settings."""

    # run directory (log.jsonl, eval.jsonl, curves.jsonl, checkpoints/, the model; a Path once set); None: none
    out_dir: str | os.PathLike | None = None
    eval_data: dict[str, Sequence[Sample]] | None = None  # named evaluation sets (e.g. train, id, ood, length 11-20)
    resume: bool = False  # continue from the last checkpoint in out_dir
    fwd_hooks: Any = ()  # hook list or factory f(batch) -> list, active in every training and evaluation forward
    progress: bool = True  # progress bar, and each evaluation's scores logged (the `aspan` logger, INFO)
    stop_after: int | None = None  # end (checkpointed) after this step; a later resume continues exactly
    meta: dict | None = field(default_factory=dict)  # extra metadata for the saved checkpoints (None: none)
    curve_data: dict[str, Sequence[Sample]] | None = None  # held-out curve sets (aspan.curves), e.g. id, length 11-20
    on_curve: Callable[[list[dict]], None] | None = None  # called with each evaluation's curve rows (main process)
    prefetch: int = 2  # batches made ahead in a background thread (0: each made inside its step); same batches

    def __post_init__(self):
        if self.out_dir is not None:
            self.out_dir = Path(self.out_dir)
        self.meta = dict(self.meta or {})  # a copy: the run adds its own keys


def run_options(options: RunOptions | None = None, keywords: dict[str, Any] | None = None) -> RunOptions:
    """A copy of `options` (default: `RunOptions()`) with the fields named in `keywords` replaced; TypeError naming
    a keyword that is no field of `RunOptions`."""
    known = {f.name for f in fields(RunOptions)}
    unknown = sorted(set(keywords or {}) - known)
    if unknown:
        raise TypeError(f"train() got an unexpected keyword argument {unknown[0]!r} (the options are RunOptions' "
                        f"fields: {', '.join(sorted(known))})")
    return replace(options or RunOptions(), **(keywords or {}))


# Settings a resumed run may change: those that change neither the weights nor the data order, and the length of
# the run (`steps`, `epochs`, the curves and their stop rule: a finished or stopped run can be extended; the CLI
# records each resume in run.json).
RESUME_FREE = ("device", "eval_every", "eval_samples", "eval_batch_size", "ckpt_every", "log_every", "steps", "epochs",
               "curve_every", "stop", "stop_bucket", "target", "stop_metric")
# The model settings (TransformerLens config names) a resumed run must share with its checkpoint
ARCHITECTURE = ("n_layers", "n_heads", "d_model", "d_head", "d_mlp", "n_ctx", "d_vocab", "act_fn",
                "normalization_type", "positional_embedding_type", "rotary_dim", "n_key_value_heads")
