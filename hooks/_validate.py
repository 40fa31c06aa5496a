"""Input checks shared by every hook factory: clear errors before any forward pass starts."""
from __future__ import annotations

import functools
import math
import numbers
from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor

Head = tuple[int, int]


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_heads(heads: Iterable[Sequence[int]], n_layers: int | None = None, n_heads: int | None = None) -> list[Head]:
    """Return `heads` as a deduplicated, ordered list of (layer, head) ints; ValueError on a bad or out-of-range
    head."""
    if heads is None:
        raise ValueError("heads must be a list of (layer, head) pairs, got None")
    out: list[Head] = []
    for h in heads:
        if not (isinstance(h, (tuple, list)) and len(h) == 2 and all(_is_int(int_) for int_ in h)):
            raise ValueError(f"each head must be a (layer, head) pair of ints, got {h!r}")
        layer, head = int(h[0]), int(h[1])
        if layer < 0 or (n_layers is not None and layer >= n_layers):
            raise ValueError(f"head {(layer, head)}: layer {layer} out of range 0..{(n_layers or 1) - 1}")
        if head < 0 or (n_heads is not None and head >= n_heads):
            raise ValueError(f"head {(layer, head)}: head {head} out of range 0..{(n_heads or 1) - 1}")
        if (layer, head) not in out:
            out.append((layer, head))
    if not out:
        raise ValueError("heads is empty: select at least one (layer, head)")
    return out


def check_layers(layers: int | Iterable[int] | None, n_layers: int | None = None) -> list[int]:
    """Return layers as a sorted list of ints (all layers when None and n_layers is known)."""
    if layers is None:
        if n_layers is None:
            raise ValueError("layers=None needs a model to know how many layers there are")
        return list(range(n_layers))
    layers = [layers] if _is_int(layers) else list(layers)
    for layer in layers:
        if not _is_int(layer) or layer < 0 or (n_layers is not None and layer >= n_layers):
            raise ValueError(f"layer {layer!r} out of range 0..{(n_layers or 1) - 1}")
    if not layers:
        raise ValueError("layers is empty")
    return sorted(set(layers))


def check_mask(mask: Tensor, tokens: Tensor | None = None) -> Tensor:
    """Check a reference mask: bool, [batch, pos, pos] (or [pos, pos]), matching `tokens` [batch, pos] when given."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be boolean (row = query, col = key), got dtype {mask.dtype}")
    if mask.ndim not in (2, 3) or mask.shape[-1] != mask.shape[-2]:
        raise ValueError(f"mask must have shape [batch, pos, pos] or [pos, pos], got {tuple(mask.shape)}")
    if tokens is not None:
        tokens = as_batch(tokens)
        b, pos = tokens.shape
        if mask.ndim == 2:
            mask = mask.expand(b, *mask.shape)
        if tuple(mask.shape) != (b, pos, pos):
            raise ValueError(f"mask shape {tuple(mask.shape)} does not match tokens {tuple(tokens.shape)}: "
                             f"expected {(b, pos, pos)}")
    return mask


def check_attention_mask(attention_mask: Tensor | None, tokens: Tensor) -> Tensor | None:
    """Check an optional padding mask [batch, pos] (1 = real token) against `tokens`."""
    if attention_mask is None:
        return None
    tokens = as_batch(tokens)
    if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(tokens.shape):
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
        raise ValueError(f"attention_mask {shape} does not match tokens {tuple(tokens.shape)}")
    return attention_mask


def check_columns(columns: Tensor | None, tokens: Tensor) -> Tensor | None:
    """Check the denominator columns of an AttnScore: None or bool [batch, pos] matching `tokens`."""
    if columns is None:
        return None
    if not isinstance(columns, Tensor) or columns.dtype != torch.bool:
        raise ValueError(f"columns must be a bool tensor [batch, pos] (True: in the denominator), got "
                         f"{getattr(columns, 'dtype', type(columns).__name__)}")
    tokens = as_batch(tokens)
    if columns.ndim == 1:
        columns = columns[None]
    if tuple(columns.shape) != tuple(tokens.shape):
        raise ValueError(f"columns {tuple(columns.shape)} does not match tokens {tuple(tokens.shape)}")
    return columns


def check_flag(name: str, value: object) -> bool:
    """A boolean option: True or False only. A truthy string ("no"), a number or a tensor would silently switch it
    on, so anything else is a TypeError naming the option."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def check_index(name: str, index) -> tuple[slice | tuple[int, ...] | Tensor | None, int | None]:
    """Positions kept along one axis of a pattern (`capture`'s `rows`, `cols`): None (all), a slice of ints (step
    >= 1), or a sequence or 1-d integer tensor of positions >= 0. Returns it with its largest position (None for None
    or a slice), which `check_index_fits` compares with the pattern's length at the forward; ValueError naming the
    option otherwise (a float, a negative position or a bool)."""
    if index is None:
        return None, None
    if isinstance(index, slice):
        parts = (index.start, index.stop, index.step)
        if any(p is not None and not _is_int(p) for p in parts) or (index.step is not None and index.step < 1):
            raise ValueError(f"{name} must be a slice of ints with a step >= 1, got {index!r}")
        return index, None
    if type(index).__module__ == "numpy":  # an array of positions
        index = torch.as_tensor(index)
    if isinstance(index, Tensor):
        if index.ndim != 1 or index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
            raise ValueError(f"{name} must be a 1-d integer tensor of positions, got {index.dtype} "
                             f"{tuple(index.shape)}")
        values = index.tolist()
    elif isinstance(index, (str, bytes)) or not isinstance(index, Sequence):
        raise ValueError(f"{name} must be None, a slice, a sequence or a 1-d tensor of positions, got "
                         f"{type(index).__name__}")
    else:
        values = list(index)
        bad = [v for v in values if not _is_int(v)]
        if bad:
            raise ValueError(f"{name} must hold integer positions, got {bad[0]!r}")
        index = tuple(int(v) for v in values)
    if any(v < 0 for v in values):
        raise ValueError(f"{name}: position {min(values)} is negative (positions count from 0)")
    return index, (max(values) if values else None)


def check_index_fits(name: str, top: int | None, size: int) -> None:
    """ValueError when the largest position `top` of option `name` is past a pattern axis of `size` positions."""
    if top is not None and top >= size:
        raise ValueError(f"{name}: position {top} out of range 0..{size - 1} (this forward's pattern has {size})")


def check_threshold(threshold: float | None) -> float | None:
    """A gate on the original attention value (edit where A > τ): None or a finite number in [0, 1)."""
    if threshold is None:
        return None
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not math.isfinite(threshold):
        raise ValueError(f"threshold must be a finite number or None, got {threshold!r}")
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0 (attention weights are non-negative), got {threshold}")
    if threshold >= 1:
        raise ValueError(f"threshold must be < 1: attention weights are at most 1, so the edit (where A > "
                         f"{threshold:g}) would never fire")
    return float(threshold)


def check_delta(delta) -> int:
    """A key offset: an integer (2.7 or "2" are refused, not truncated or parsed)."""
    if not _is_int(delta):
        raise ValueError(f"delta must be an integer key offset, got {delta!r}")
    return int(delta)


def check_batch_size(batch_size: int | None) -> int | None:
    """Samples per forward: None (automatic) or an int >= 1."""
    if batch_size is not None and (not _is_int(batch_size) or batch_size < 1):
        raise ValueError(f"batch_size must be an int >= 1 or None (automatic), got {batch_size!r}")
    return batch_size


def check_strength(strength: float, dtype: torch.dtype = torch.float32, n_keys: int = 1) -> float:
    """The additive constant C: a finite number >= 0 (a negative C drives attention weights, and rows, below 0) that
    the attention's `dtype` can hold: a row of `n_keys` weights each raised by C must stay finite (`check_fits`)."""
    if not isinstance(strength, (int, float)) or isinstance(strength, bool) or not math.isfinite(strength):
        raise ValueError(f"strength must be a finite number, got {strength!r}")
    if strength < 0:
        raise ValueError(f"strength must be >= 0 (it adds attention to references; a negative C makes attention "
                         f"weights negative), got {strength}")
    check_fits(strength, dtype, n_keys)
    return float(strength)


def check_fits(strength: float, dtype: torch.dtype, n_keys: int) -> None:
    """ValueError when C overflows `dtype`: 1e300 is finite in Python but inf in float32, and the edited rows would
    turn into NaN logits. A row of `n_keys` weights (each at most 1) each raised by C sums to at most n_keys·(1 + C)."""
    top = torch.finfo(dtype).max if dtype.is_floating_point else math.inf
    if n_keys * (1 + strength) > top:
        raise ValueError(f"strength {strength:g} overflows the attention's {str(dtype).removeprefix('torch.')} "
                         f"(largest finite value {top:.4g}; a row of {n_keys} keys raised by it must stay below it)")


def model_dtype(model) -> torch.dtype:
    """The dtype a model's attention runs in (float32 when no model is given)."""
    dtype = getattr(getattr(model, "cfg", None), "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def as_batch(tokens: Tensor) -> Tensor:
    """Token ids as [batch, pos] (a 1-D sequence becomes a batch of one)."""
    if not isinstance(tokens, Tensor) or tokens.ndim not in (1, 2):
        raise ValueError(f"tokens must be a [batch, pos] tensor of ids, got {getattr(tokens, 'shape', type(tokens))}")
    return tokens[None] if tokens.ndim == 1 else tokens


def check_length(model, tokens: Tensor) -> None:
    """ValueError when `tokens` [batch, pos] are longer than the model's context (rotary tables stop at n_ctx)."""
    pos, n_ctx = tokens.shape[-1], getattr(model.cfg, "n_ctx", None)
    if n_ctx is not None and pos > n_ctx:
        raise ValueError(f"tokens have {pos} positions but the model's context is n_ctx={n_ctx}: "
                         f"shorten the sequences to at most {n_ctx} tokens")


def check_hook_points(model, fwd_hooks: Iterable) -> list:
    """`fwd_hooks` as a list, ValueError naming a hook point the model does not have (e.g. a head's layer out of
    range because the hooks were built without `model=`), instead of TransformerLens' bare KeyError."""
    fwd_hooks = list(fwd_hooks)
    points = getattr(model, "hook_dict", None)
    if points is None:
        return fwd_hooks
    for name, _ in fwd_hooks:
        if isinstance(name, str) and name not in points:
            raise ValueError(f"hook point {name!r} is not in this model ({model.cfg.n_layers} layers x "
                             f"{model.cfg.n_heads} heads): the hooks select a layer or head it does not have "
                             f"(pass model= to the hook factory to check when building them)")
    return [(name, _same_shape(name, fn)) for name, fn in fwd_hooks]


def _same_shape(name, fn: Callable) -> Callable:
    """`fn`, refusing (ValueError naming the hook point) a returned activation of another shape than the one it was
    given: a pattern that lost or gained a dimension can broadcast through TransformerLens' einsums into wrong
    logits, silently. None (the activation edited in place, or only read) is fine."""
    if getattr(fn, "_aspan_shape_checked", False):
        return fn

    @functools.wraps(fn)
    def checked(act, *args, **kwargs):
        out = fn(act, *args, **kwargs)
        if out is not None and (not isinstance(out, Tensor) or out.shape != act.shape):
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"the hook on {name!r} returned {got} for an activation of shape {tuple(act.shape)}: a "
                             f"hook must return a tensor of its activation's shape, or None")
        return out

    checked._aspan_shape_checked = True
    return checked


def check_model_heads(model, heads: list[Head]) -> list[Head]:
    """Check heads against `model.cfg` when a model is given."""
    return heads if model is None else check_heads(heads, model.cfg.n_layers, model.cfg.n_heads)


def head_index(scores_or_pattern: Tensor, layer: int, hs: list[int]) -> Tensor:
    """Index tensor of heads `hs` for a [batch, head, q, k] tensor of `layer`; ValueError if the layer lacks one."""
    n_h = scores_or_pattern.shape[1]
    if max(hs) >= n_h:
        raise ValueError(f"head {(layer, max(hs))} out of range: layer {layer} has {n_h} heads")
    return torch.tensor(hs, device=scores_or_pattern.device)
