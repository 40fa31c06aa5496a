"""Edit the rotation of chosen rotary pairs in queries and keys (`hook_rot_q`, `hook_rot_k`): an inference-time test
of which rotation frequencies a model's failure at new lengths rests on.

Rotary embeddings (Su et al. 2021) turn each pair of a head's query and key dimensions by an angle `θ_i · p` at
position p; pair i is columns i and i + rotary_dim/2 in the rotate-half layout TransformerLens uses by default
(adjacent columns 2i, 2i + 1 with `rotary_adjacent_pairs`), θ_i = base^(−2i/rotary_dim), so pair 0 turns fastest.
`rotary_pairs` re-aims the chosen pairs after TransformerLens has rotated them, by the extra rotation that takes
angle θ_i · p to the angle the mode asks for:

- "clamp": at positions p > `beyond`, the angle held at its value at position `beyond` (θ_i · min(p, beyond)), so a
  query and a key past the longest training position see, on these pairs, only angles seen in training;
- "remove": no rotation at all on these pairs (angle 0) at positions p > `beyond`, or at every position when
  `beyond` is None (the pairs then carry content only, as without positional encoding).

Positions are those of a forward over whole sequences (right padding; the i-th token at position i). KV-cached
generation rotates the new queries at an offset these hooks cannot see, so a cached forward is refused. The hooks need
a HookedTransformer: a TransformerBridge (TransformerLens 3.9) lists `hook_rot_q` and `hook_rot_k` but its rotary
attention does not call them, so a bridge is refused rather than left unedited.
"""
from __future__ import annotations

from typing import Callable, Iterable, Literal

import torch
from torch import Tensor

from ._validate import _is_int, check_layers

RotaryMode = Literal["clamp", "remove"]
ROTARY_MODES = ("clamp", "remove")


def _rotary_layout(cfg) -> tuple[int, float, bool]:
    """(rotary_dim, base, adjacent) of a rotary model's config; ValueError for another positional embedding or a
    rotary variant whose angles are not base^(−2i/rotary_dim) · p (NTK, YaRN, scaling)."""
    if getattr(cfg, "positional_embedding_type", None) != "rotary":
        raise ValueError(f"rotary_pairs needs a rotary model, got positional_embedding_type "
                         f"{getattr(cfg, 'positional_embedding_type', None)!r}")
    for flag in ("use_NTK_by_parts_rope", "use_yarn_rope", "use_dynamic_ntk_rope"):
        if getattr(cfg, flag, False):
            raise ValueError(f"rotary_pairs supports plain rotary angles only, the model sets {flag}")
    if getattr(cfg, "rotary_scaling_factor", 1.0) not in (None, 1.0):
        raise ValueError("rotary_pairs supports plain rotary angles only, the model scales them "
                         f"(rotary_scaling_factor {cfg.rotary_scaling_factor})")
    dim = cfg.rotary_dim or cfg.d_head
    return int(dim), float(cfg.rotary_base), bool(getattr(cfg, "rotary_adjacent_pairs", False))


def pair_angles(cfg, n_pos: int, dtype=torch.float64) -> Tensor:
    """The rotation angle θ_i · p of every pair i at every position p < n_pos: [n_pos, rotary_dim / 2] (radians)."""
    dim, base, _ = _rotary_layout(cfg)
    theta = base ** (-torch.arange(dim // 2, dtype=dtype) / (dim // 2))
    return torch.arange(n_pos, dtype=dtype)[:, None] * theta[None, :]


def _check_pairs(pairs: Iterable[int], half: int) -> list[int]:
    out = sorted({int(i) for i in pairs}) if pairs is not None else []
    if not out or any(not _is_int(i) or not 0 <= i < half for i in pairs):
        raise ValueError(f"pairs must be a non-empty list of rotary pair indices in 0..{half - 1}, got {pairs!r}")
    return out


def rotary_pairs(model, pairs: Iterable[int], mode: RotaryMode = "clamp", beyond: int | None = None,
                 layers: int | Iterable[int] | None = None) -> list[tuple[str, Callable]]:
    """Hooks on `hook_rot_q` and `hook_rot_k` of `layers` (default: every layer) that turn the rotary `pairs` of every
    head to the angle `mode` asks for: "clamp" holds θ_i · p at θ_i · `beyond` for p > `beyond` (required);
    "remove" sets it to 0 for p > `beyond`, or everywhere when `beyond` is None.

    Shapes:
        pairs: rotary pair indices in 0..rotary_dim/2 − 1 (0 turns fastest).
        returns: [(hook name, fn)] for `model.hooks(fwd_hooks=...)`; fn edits [batch, pos, head, d_head].

    Example:
        >>> import torch
        >>> import hooks
        >>> from transformer_lens import HookedTransformer, HookedTransformerConfig
        >>> tokens = torch.tensor([[0, 3, 4, 5, 2, 5, 4, 3]])  # one sequence of 8 tokens [batch, pos]
        >>> # the tiny model of the package's other examples has learned positions; this one is rotary
        >>> rcfg = HookedTransformerConfig(n_layers=1, n_heads=2, d_model=16, d_head=8, n_ctx=16, d_vocab=10,
        ...                                act_fn="relu", positional_embedding_type="rotary", rotary_dim=8, seed=0)
        >>> rmodel = HookedTransformer(rcfg)
        >>> edit = hooks.rotary_pairs(rmodel, [0], mode="clamp", beyond=5)
        >>> [name for name, _ in edit]
        ['blocks.0.attn.hook_rot_q', 'blocks.0.attn.hook_rot_k']
        >>> with rmodel.hooks(fwd_hooks=edit):
        ...     clamped = rmodel(tokens)
        >>> torch.allclose(clamped[0, :6], rmodel(tokens)[0, :6], atol=1e-5)  # positions <= 5 unchanged
        True
    """
    dim, _, adjacent = _rotary_layout(model.cfg)
    if not hasattr(model.blocks[0].attn, "apply_rotary"):
        raise ValueError(f"rotary_pairs needs a HookedTransformer: the rotary attention of this "
                         f"{type(model).__name__} does not call hook_rot_q / hook_rot_k, so nothing would be edited")
    chosen = _check_pairs(pairs, dim // 2)
    if mode not in ROTARY_MODES:
        raise ValueError(f"mode must be one of {', '.join(ROTARY_MODES)}, got {mode!r}")
    if mode == "clamp" and beyond is None:
        raise ValueError("mode 'clamp' holds the angle at position `beyond`: give beyond")
    if beyond is not None and (not _is_int(beyond) or beyond < 0):
        raise ValueError(f"beyond must be an int >= 0 (a position), got {beyond!r}")
    lo = torch.tensor([2 * i if adjacent else i for i in chosen])
    hi = lo + 1 if adjacent else lo + dim // 2
    cache: dict[int, tuple[Tensor, Tensor]] = {}

    def turn(n_pos: int, device, dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of the extra angle (wanted − TransformerLens's) per position and chosen pair: [pos, pairs]."""
        if n_pos not in cache:
            angle = pair_angles(model.cfg, n_pos)[:, chosen]
            pos = torch.arange(n_pos)
            past = pos > (-1 if beyond is None else beyond)
            wanted = torch.zeros_like(angle) if mode == "remove" else angle[min(beyond, n_pos - 1)].expand_as(angle)
            extra = torch.where(past[:, None], wanted - angle, torch.zeros_like(angle))
            cache[n_pos] = (extra.cos(), extra.sin())
        cos, sin = cache[n_pos]
        return cos.to(device, dtype), sin.to(device, dtype)

    def edit(x: Tensor, hook=None) -> Tensor:
        cos, sin = turn(x.shape[1], x.device, x.dtype)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # [1, pos, 1, pairs]
        a, b = x[..., lo.to(x.device)], x[..., hi.to(x.device)]
        out = x.clone()
        out[..., lo.to(x.device)] = a * cos - b * sin
        out[..., hi.to(x.device)] = b * cos + a * sin
        return out

    seen: dict[int, int] = {}

    def on_q(layer: int):
        def fn(q: Tensor, hook=None) -> Tensor:
            seen[layer] = q.shape[1]
            return edit(q)
        return fn

    def on_k(layer: int):
        def fn(k: Tensor, hook=None) -> Tensor:
            if seen.pop(layer, k.shape[1]) != k.shape[1]:
                raise ValueError("rotary_pairs: queries and keys differ in length (KV-cached generation); the "
                                 "hooks know positions only for a forward over whole sequences")
            return edit(k)
        return fn

    out = []
    for layer in check_layers(layers, model.cfg.n_layers):
        out += [(f"blocks.{layer}.attn.hook_rot_q", on_q(layer)), (f"blocks.{layer}.attn.hook_rot_k", on_k(layer))]
    return out

