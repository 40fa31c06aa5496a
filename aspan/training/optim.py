"""The optimiser and its schedule: AdamW with weight decay on matrices and attention biases, linear warm-up then
cosine decay."""
from __future__ import annotations

import math

import torch

from .config import TrainConfig


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine from 1 to `min_ratio` at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def decays(name: str, p: torch.Tensor) -> bool:
    """Whether weight decay applies to parameter `name`: every tensor of two or more dimensions (nanoGPT's rule), which
    on a HookedTransformer includes the per-head query/key/value biases (`b_Q`, `b_K`, `b_V`: [head, d_head]), as
    every committed result was trained. A TransformerBridge holds those biases as 1-D Hugging Face ones (`q.bias`,
    `k.bias`, `v.bias`): they decay too, so both backends train alike. Other biases and LayerNorms never decay."""
    parts = name.replace("._original_component", "").split(".")
    return p.ndim >= 2 or (parts[-1] == "bias" and len(parts) > 1 and parts[-2] in ("q", "k", "v", "qkv"))


def fused_ok(params) -> bool:
    """Whether PyTorch's fused AdamW (one kernel per step for every tensor) takes `params`: every one a CUDA
    floating-point tensor."""
    params = list(params)
    return bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)


def adamw_options(params) -> dict:
    """How AdamW steps `params`: fused on CUDA (`fused_ok`); on the CPU its multi-tensor ("foreach") form, which on
    the CPU runs the same per-tensor operations as its default loop (the same numbers, bit for bit) with one call per
    operation for all tensors; elsewhere (mixed devices) PyTorch's default."""
    params = list(params)
    if fused_ok(params):
        return {"fused": True}
    if params and all(p.device.type == "cpu" and p.is_floating_point() for p in params):
        return {"foreach": True}
    return {}


def _optimizer(model, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay where `decays` says (tensors of >= 2 dimensions and the query/key/value biases);
    parameters that do not train are left out. Fused on CUDA, multi-tensor on the CPU (`adamw_options`)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in params if decays(n, p)]
    rest = [p for n, p in params if not decays(n, p)]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    options = adamw_options(p for _, p in params)
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr, betas=tuple(config.betas), **options)
