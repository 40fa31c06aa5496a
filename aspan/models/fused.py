"""A fused forward of a HookedTransformer over its own parameters: the function of its hooked forward in a fraction
of the kernels, for training and teacher-forced evaluation.

TransformerLens writes its forward to be read and hooked: every block normalises its input three times (once each
for queries, keys and values), rotates queries and keys by slice assignment and materialises the attention scores
for hooks to edit. On a GPU each kernel costs a launch, so for the small models of this project the kernel count
sets the step time. `logits` computes the same logits from the same parameter tensors (nothing is copied or
converted: the gradients reach the model's own parameters, which analysis, hooks and checkpoints keep using) with
one `F.layer_norm` per LayerNorm, one concatenated QKV projection per block, rotary applied to queries and keys
together with the model's own rotary tables and convention (rotate-half, or adjacent pairs where the config says
so), and `F.scaled_dot_product_attention` with the model's attention scale. ALiBi (Press et al. 2022) and the
additive pre-softmax biases of `hooks.attn_bias` (ABC and ABS, Duan & Shi 2023) become the attention's float mask.

Covered: HookedTransformers with LayerNorm or RMSNorm (with weights or folded), rotary (any rotary dimension, none
included), learned or ALiBi positions, a GELU, ReLU or SiLU MLP (gated or not), grouped-query attention, and
attention and MLP in parallel (GPT-NeoX): the tiny models of every positional encoding and the loaded Llama,
Qwen2 and GPT-NeoX checkpoints. Anything else -- a hook other than an `attn_bias` one, hooks attached to the model
itself, a TransformerBridge, another architecture -- runs the hooked forward. Which forward ran, and why not the
fused one, is logged once per model and reason at DEBUG level on this module's logger (`aspan.models.fused`; the
library configures no logging: an application that wants these lines enables DEBUG for that logger itself), and
`why_not` says it directly:

    out = fused.logits(model, tokens, fwd_hooks)     # [batch, pos, vocab], whichever forward applies
    fused.why_not(model, fwd_hooks)                  # None where the fused forward runs, else the reason
"""
from __future__ import annotations

import functools
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

import hooks

logger = logging.getLogger(__name__)

HookList = Sequence[tuple[str, Callable]]
_TANH_GELU = functools.partial(F.gelu, approximate="tanh")
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {  # TransformerLens's act_fn names the fused forward runs
    "gelu": F.gelu, "gelu_new": _TANH_GELU, "gelu_fast": _TANH_GELU, "gelu_pytorch_tanh": _TANH_GELU,
    "relu": F.relu, "silu": F.silu,
}
# config fields that change the function beyond what the fused forward computes (each must be falsy)
_UNCOVERED = ("use_split_qkv_input", "use_attn_in", "use_qk_norm", "use_local_attn",
              "use_normalization_before_and_after", "post_embedding_ln", "use_attention_sinks", "use_logn_attn",
              "use_dynamic_ntk_rope", "load_in_4bit", "clip_qkv", "num_experts")
_OWN_ARCHITECTURES = ("Olmo2ForCausalLM", "Olmo3ForCausalLM", "OlmoeForCausalLM")  # norms placed otherwise
_BLOCK_PARTS = ("attn", "mlp", "ln1", "ln2")
_CFG_FIELDS = ("attention_dir", "positional_embedding_type", "attn_only", "act_fn", "n_devices",
               "original_architecture", "attn_scores_soft_cap", "output_logits_soft_cap", *_UNCOVERED)


@dataclass
class _Seen:
    """What the fused forward keeps about one model: its modules as last read (`key`: their identities) and why its
    components are not covered (None: they are), the same of its config, whether hooks are attached, what it
    logged, and its rotary tables and masks by shape."""

    key: tuple = ()
    reason: str | None = None
    cfg_key: tuple = ()  # the config settings (and tokenizer padding side) `cfg_reason` was read from
    cfg_reason: str | None = None
    clean: int = -1  # the hook-handle counter when no hook was attached to the model (-1: not known)
    told: set[str] = field(default_factory=set)
    tables: dict = field(default_factory=dict)


_state: "weakref.WeakKeyDictionary[Any, _Seen]" = weakref.WeakKeyDictionary()  # per model, dropped with it


def _seen(model) -> _Seen:
    """The model's `_Seen`, its components read again when one of them was replaced."""
    blocks = model._modules["blocks"]._modules.values()
    key = (*map(id, model._modules.values()), *(id(b._modules.get(k)) for b in blocks for k in _BLOCK_PARTS))
    seen = _state.get(model)
    if seen is None:
        seen = _state.setdefault(model, _Seen())
    if seen.key != key:
        tl = _tl()
        reason = "a TransformerLens without HookedTransformer" if tl is None else _components_reason(model, tl)
        seen.key, seen.reason, seen.clean = key, reason, -1
        seen.tables.clear()
    return seen


@functools.lru_cache(maxsize=1)
def _tl() -> dict[str, type] | None:
    """TransformerLens's HookedTransformer and the component classes the fused forward knows (None on a
    TransformerLens without HookedTransformer)."""
    from .loaded import import_transformer_lens

    import_transformer_lens()
    try:
        from transformer_lens import HookedTransformer
        from transformer_lens import components as c
        from transformer_lens.components.mlps.gated_mlp import GatedMLP
        from transformer_lens.components.mlps.mlp import MLP

        return {"model": HookedTransformer, "block": (c.TransformerBlock,),
                "attn": (c.Attention, c.GroupedQueryAttention), "gqa": c.GroupedQueryAttention, "mlp": (MLP, GatedMLP),
                "gated": GatedMLP, "embed": (c.Embed,), "pos_embed": (c.PosEmbed,), "unembed": (c.Unembed,),
                "norm": (c.LayerNorm, c.LayerNormPre, c.RMSNorm, c.RMSNormPre, torch.nn.Identity)}
    except (ImportError, AttributeError):  # TransformerLens 4: TransformerBridge only
        return None


# ----------------------------------------------------------------------------------------------- selection
def architecture_reason(model) -> str | None:
    """Why the fused forward does not compute `model`'s function (None: it does): not a HookedTransformer, or a
    config field or component it does not cover."""
    tl = _tl()
    if tl is None or type(model) is not tl["model"]:
        return f"a {type(model).__name__}, not a TransformerLens HookedTransformer"
    return _architecture(model, _seen(model))


def _architecture(model, seen: _Seen) -> str | None:
    cfg = model.cfg
    padding = getattr(getattr(model, "tokenizer", None), "padding_side", "")
    key = (*(getattr(cfg, f, None) for f in _CFG_FIELDS), padding)
    if seen.cfg_key != key:
        seen.cfg_key, seen.cfg_reason = key, _config_reason(cfg, key[-1])
    reason = seen.cfg_reason or seen.reason
    return None if reason is None else f"{reason} is not covered"


def _config_reason(cfg, padding_side: str) -> str | None:
    """The first config setting the fused forward does not compute (None: every one is covered)."""
    found = [
        (cfg.attention_dir != "causal", f"attention_dir={cfg.attention_dir!r}"),
        (cfg.positional_embedding_type not in ("standard", "rotary", "alibi"),
         f"positional_embedding_type={cfg.positional_embedding_type!r}"),
        (not cfg.attn_only and cfg.act_fn not in ACTIVATIONS, f"act_fn={cfg.act_fn!r}"),
        (cfg.n_devices > 1, f"n_devices={cfg.n_devices}"),
        (cfg.original_architecture in _OWN_ARCHITECTURES, f"the {cfg.original_architecture} block"),
        ((cfg.attn_scores_soft_cap or 0) > 0 or (cfg.output_logits_soft_cap or 0) > 0, "soft-capped scores or logits"),
        *((bool(getattr(cfg, f, None)), f"{f}={getattr(cfg, f, None)!r}") for f in _UNCOVERED),
        (padding_side == "left", "a tokenizer that pads on the left (TransformerLens then masks the padding it finds)"),
    ]
    return next((why for bad, why in found if bad), None)


def _components_reason(model, tl: dict) -> str | None:
    """The first component of another class than TransformerLens's own (a subclass may compute something else)."""
    parts = [("ln_final", getattr(model, "ln_final", torch.nn.Identity()), tl["norm"]),
             ("embed", model.embed, tl["embed"]), ("unembed", model.unembed, tl["unembed"])]
    if model.cfg.positional_embedding_type == "standard":
        parts.append(("pos_embed", model.pos_embed, tl["pos_embed"]))
    for i, block in enumerate(model.blocks):
        parts += [(f"blocks.{i}", block, tl["block"]), (f"blocks.{i}.attn", block.attn, tl["attn"]),
                  (f"blocks.{i}.ln1", block.ln1, tl["norm"])]
        if not model.cfg.attn_only:
            parts += [(f"blocks.{i}.mlp", block.mlp, tl["mlp"]), (f"blocks.{i}.ln2", block.ln2, tl["norm"])]
    for name, module, known in parts:
        if type(module) not in known:
            return f"{name} (a {type(module).__name__})"
    return None


def _attached_reason(model, seen: _Seen) -> str | None:
    """Hooks attached to the model itself (a forward, backward or pre-hook on any of its modules, or a global one):
    the fused forward would skip them. Every hook registration makes a `RemovableHandle`, whose counter says when
    a model found clean must be looked at again."""
    from torch.nn.modules import module as nn_module
    from torch.utils.hooks import RemovableHandle

    if seen.clean == RemovableHandle.next_id:
        return None
    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return "a global module forward hook is registered"
    for name, m in model.named_modules():
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
            return f"a hook attached to {name or 'the model'}"
    seen.clean = RemovableHandle.next_id
    return None


def _unwrap(fn: Callable) -> Callable:
    """`fn` without aspan's shape-checking wrapper (`hooks.check_hook_points`), which changes nothing it returns."""
    while getattr(fn, "_aspan_shape_checked", False) and hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def bias_plan(fwd_hooks: HookList) -> dict[int, list[hooks.BiasHook]] | str:
    """The additive attention biases of `fwd_hooks` by layer, or why they are not all such biases: a hook that
    is no `hooks.attn_bias` hook on its layer's `hook_attn_scores`."""
    plan: dict[int, list[hooks.BiasHook]] = {}
    for name, fn in fwd_hooks:
        hook = _unwrap(fn)
        if not isinstance(hook, hooks.BiasHook) or name != f"blocks.{hook.layer}.attn.hook_attn_scores":
            return f"the hook on {name!r} is not an attention bias"
        plan.setdefault(hook.layer, []).append(hook)
    return plan


def why_not(model, fwd_hooks: HookList = ()) -> str | None:
    """Why `logits` runs `model` with `fwd_hooks` through its hooked forward (None: it runs the fused forward)."""
    plan = _plan(model, list(fwd_hooks))
    return plan if isinstance(plan, str) else None


def _plan(model, fwd_hooks: list) -> dict[int, list[hooks.BiasHook]] | str:
    tl = _tl()
    if tl is None or type(model) is not tl["model"]:
        return architecture_reason(model)
    seen = _seen(model)
    return _architecture(model, seen) or _attached_reason(model, seen) or bias_plan(fwd_hooks)


def _tell(model, message: str) -> None:
    """Log `message` at DEBUG once per model."""
    try:
        told = _state.setdefault(model, _Seen()).told
    except TypeError:  # a model that takes no weak reference: told every time
        told = set()
    if message not in told:
        told.add(message)
        logger.debug("%s: %s", type(model).__name__, message)


def logits(model, tokens: Int[Tensor, "batch pos"], fwd_hooks: HookList = (),
           attention_mask: Int[Tensor, "batch pos"] | None = None) -> Float[Tensor, "batch pos vocab"]:
    """`model(tokens)` under `fwd_hooks`: the fused forward where it computes the same function (`why_not`), else the
    hooked forward (told once per model and reason at DEBUG). `attention_mask` (1 on real tokens) must be right
    padding, as `aspan.batching` makes batches: the hooked forward takes it; the fused one needs none, since with
    causal attention no real row sees the padding after it."""
    fwd_hooks = list(fwd_hooks)
    checked = hooks.check_hook_points(model, fwd_hooks)  # names checked on either path
    plan = _plan(model, fwd_hooks)
    if isinstance(plan, str):
        _tell(model, f"hooked forward ({plan})")
        with model.hooks(fwd_hooks=checked):
            return model(tokens) if attention_mask is None else model(tokens, attention_mask=attention_mask)
    _tell(model, "fused forward" + (" with attention biases" if plan else ""))
    return fused_logits(model, tokens, plan)


class TrainingForward(torch.nn.Module):
    """`logits` as a module over `model`, whose parameters are the model's own: `net(tokens, fwd_hooks) -> logits`.
    DistributedDataParallel wraps this module (not the model), so its gradient hooks see the fused forward."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens: Int[Tensor, "batch pos"], fwd_hooks: HookList = ()) -> Float[Tensor, "batch pos vocab"]:
        return logits(self.model, tokens, fwd_hooks)


# ----------------------------------------------------------------------------------------------- the forward
@dataclass
class _Mask:
    """One layer's attention mask: None (causal) or a float mask with the causal part in it, and the rows whose
    every key it masks (`dead`, None when none can be), which the hooked forward zeroes (TransformerLens turns
    their NaN pattern into 0)."""

    add: Float[Tensor, "b h q k"] | None = None
    dead: Bool[Tensor, "b h q 1"] | None = None


def fused_logits(model, tokens: Int[Tensor, "batch pos"],
                 biases: dict[int, list[hooks.BiasHook]] | None = None) -> Float[Tensor, "batch pos vocab"]:
    """The logits of a covered HookedTransformer (`architecture_reason` is None) with the additive attention
    `biases` of each layer, from its own parameters (no hooks run: use `logits`, which checks coverage)."""
    cfg, w_e = model.cfg, model.embed.W_E
    tokens = tokens if tokens.device == w_e.device else tokens.to(w_e.device)  # no copy (and no sync) in a step
    b, p = tokens.shape
    at = _Pass(b, p, w_e.dtype, w_e.device, _cache(model))
    x = F.embedding(tokens, w_e)
    if cfg.positional_embedding_type == "standard":
        x = x + model.pos_embed.W_pos[:p]
    masks = _masks(model, at, biases or {})
    for i, block in enumerate(model.blocks):
        x = _block(block, x, masks[i], _rotary(block.attn, at))
    x = _norm(model.ln_final, x) if cfg.normalization_type is not None else x
    out = torch.addmm(model.unembed.b_U, x.reshape(b * p, -1), model.unembed.W_U)
    return out.view(b, p, -1)


def _norm(ln, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
    """TransformerLens's LayerNorm, LayerNormPre, RMSNorm, RMSNormPre or Identity as one fused kernel."""
    kind = type(ln).__name__
    if kind == "Identity":
        return x
    shape = (x.shape[-1],)
    if kind.startswith("LayerNorm"):
        return F.layer_norm(x, shape, getattr(ln, "w", None), getattr(ln, "b", None), ln.eps)
    return F.rms_norm(x, shape, getattr(ln, "w", None), ln.eps)


def _block(block, x: Float[Tensor, "b p d"], mask: _Mask, rotary) -> Float[Tensor, "b p d"]:
    """One TransformerBlock: pre-norm attention then MLP, or both from the same input (parallel)."""
    cfg = block.cfg
    attn = _attention(block.attn, _norm(block.ln1, x), mask, rotary)
    if cfg.attn_only:
        return x + attn
    if cfg.parallel_attn_mlp:
        return x + attn + _mlp(block.mlp, _norm(block.ln2, x))
    x = x + attn
    return x + _mlp(block.mlp, _norm(block.ln2, x))


def _mlp(mlp, x: Float[Tensor, "b p d"]) -> Float[Tensor, "b p d"]:
    """The MLP (gated: act(x W_gate) * (x W_in) + b_in), as TransformerLens computes it."""
    act = ACTIVATIONS[mlp.cfg.act_fn]
    flat = x.reshape(-1, x.shape[-1])
    if type(mlp) is _tl()["gated"]:
        hidden = torch.addcmul(mlp.b_in, act(flat @ mlp.W_gate), flat @ mlp.W_in)
    else:
        hidden = act(torch.addmm(mlp.b_in, flat, mlp.W_in))
    return torch.addmm(mlp.b_out, hidden, mlp.W_out).view(x.shape)


def _attention(attn, x: Float[Tensor, "b p d"], mask: _Mask, rotary) -> Float[Tensor, "b p d"]:
    """Causal self-attention: one QKV projection, rotary on q and k together, SDPA, the output projection."""
    cfg = attn.cfg
    b, p, d = x.shape
    gqa = type(attn) is _tl()["gqa"]
    n_q, n_kv = cfg.n_heads, (cfg.n_key_value_heads if gqa else cfg.n_heads)
    w_k, w_v, b_k, b_v = (attn._W_K, attn._W_V, attn._b_K, attn._b_V) if gqa else (attn.W_K, attn.W_V, attn.b_K,
                                                                                    attn.b_V)
    # [d_model, heads, d_head] from the [heads, d_model, d_head] parameters, one copy for the three
    weight = torch.cat([w.transpose(0, 1) for w in (attn.W_Q, w_k, w_v)], 1).view(d, -1)
    bias = torch.cat([attn.b_Q, b_k, b_v]).view(-1)
    qkv = torch.addmm(bias, x.reshape(b * p, d), weight).view(b, p, n_q + 2 * n_kv, -1)
    qk, v = qkv.split([n_q + n_kv, n_kv], 2)
    if rotary is not None:
        cos, sin, roll = rotary
        qk = torch.addcmul(qk * cos, roll(qk), sin)
    q, k = qk.transpose(1, 2).split([n_q, n_kv], 1)
    z = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), attn_mask=mask.add, is_causal=mask.add is None,
                                       scale=1.0 / float(attn.attn_scale), enable_gqa=n_kv != n_q)
    if mask.dead is not None:
        z = z.masked_fill(mask.dead, 0.0)
    z = z.transpose(1, 2).reshape(b * p, -1)
    return torch.addmm(attn.b_O, z, attn.W_O.reshape(z.shape[1], d)).view(b, p, d)


# ----------------------------------------------------------------------------------------------- tables and masks
@dataclass(frozen=True)
class _Pass:
    """One fused forward's batch size, length, dtype and device, and the model's cache of tables and masks."""

    b: int
    p: int
    dtype: torch.dtype
    device: torch.device
    cache: dict


def tables(model) -> dict:
    """The rotary tables and attention masks the fused forward keeps for `model`, by shape (the dict itself). A
    recorded CUDA graph reads the very tensors its forward found here: it empties this before its warm-up (so the
    forward it records builds nothing) and keeps references to what the warm-up put here (which the fused forward
    may later drop)."""
    return _seen(model).tables


def _cache(model) -> dict:
    cache = _seen(model).tables
    if len(cache) > 64:  # shapes of a long evaluation, or buffers moved to another device
        cache.clear()
    return cache


def _rotary(attn, at: _Pass):
    """(cos, signed sin, partner) for `at.p` positions from the attention's own rotary tables: q' = q cos +
    partner(q) sin, with cos 1 and sin 0 past `rotary_dim`; None without rotary (NoPE included)."""
    cfg, p = attn.cfg, at.p
    if cfg.positional_embedding_type != "rotary" or not cfg.rotary_dim:
        return None
    if p > attn.rotary_cos.shape[0]:  # as TransformerLens extends its tables for a longer input
        attn._extend_rotary_embeddings(min(cfg.n_ctx, max(p, 2 * attn.rotary_cos.shape[0])))
    cos_t, sin_t = attn.rotary_cos, attn.rotary_sin
    key = ("rotary", cos_t.data_ptr(), sin_t.data_ptr(), cos_t._version, sin_t._version, p)
    if key not in at.cache:
        at.cache[key] = _rotary_tables(cos_t[:p], sin_t[:p], cfg.d_head, cfg.rotary_adjacent_pairs)
    return at.cache[key]


def _rotary_tables(cos: Tensor, sin: Tensor, d_head: int, adjacent: bool):
    """Tables over the whole head for TransformerLens's rotation (`rotate_every_two`): rotate-half pairs dimension
    i with i + r/2, adjacent pairs 2i with 2i + 1; the first of each pair takes -sin."""
    p, r = cos.shape
    idx = torch.arange(d_head, device=cos.device)
    sign = torch.ones(r, dtype=cos.dtype, device=cos.device)
    if adjacent:
        partner = torch.cat([(idx[:r] ^ 1), idx[r:]])
        sign[0::2] = -1
    else:
        partner = torch.cat([(idx[:r] + r // 2) % r, idx[r:]])
        sign[: r // 2] = -1
    pad = (0, d_head - r)
    cos_full = F.pad(cos, pad, value=1.0)[:, None, :]  # [pos, 1, d_head]: broadcast over batch and heads
    sin_full = F.pad(sin * sign, pad, value=0.0)[:, None, :]
    if not adjacent and r == d_head:
        return cos_full, sin_full, functools.partial(torch.roll, shifts=r // 2, dims=-1)
    return cos_full, sin_full, functools.partial(torch.index_select, dim=-1, index=partner)


def _masks(model, at: _Pass, biases: dict[int, list[hooks.BiasHook]]) -> list[_Mask]:
    """Every layer's attention mask: ALiBi and the causal part (None where that is all), plus the layer's biases
    (one mask shared by the layers whose biases are the same objects)."""
    n_heads = model.cfg.n_heads
    base = _alibi(n_heads, at) if model.cfg.positional_embedding_type == "alibi" else None
    out, shared = [], {}
    for layer in range(model.cfg.n_layers):
        hs = biases.get(layer, [])
        if not hs:
            out.append(_Mask(base))
            continue
        key = tuple((id(h.bias), tuple(h.heads or ())) for h in hs)
        if key not in shared:
            shared[key] = _biased(base if base is not None else _causal(at), hs, n_heads, at)
        out.append(shared[key])
    return out


def _biased(base: Float[Tensor, "1 h q k"], bias_hooks: list[hooks.BiasHook], n_h: int, at: _Pass) -> _Mask:
    """`base` plus each hook's bias on its heads (as the hooks add them to the masked scores), its dead rows kept
    finite and recorded, to be zeroed. Biases that are tensors (not functions of the length) give the same mask
    every forward of this shape: it is kept, and its dead rows are looked for once."""
    fixed = all(isinstance(h.bias, Tensor) for h in bias_hooks)
    if fixed:
        batched = any(h.bias.ndim == 4 and h.bias.shape[0] > 1 for h in bias_hooks)
        key = ("bias", *((id(h.bias), h.bias.data_ptr(), h.bias._version, tuple(h.heads or ())) for h in bias_hooks),
               at.b if batched else 0, at.p, at.dtype, at.device, id(base))
        if key in at.cache:
            return at.cache[key][0]
    p, mask = at.p, base
    for h in bias_hooks:
        add = h.block(at.b, n_h, p, p, at.device, at.dtype)
        if h.heads is None:
            mask = mask + add
        else:
            mask = mask.expand(max(mask.shape[0], add.shape[0]), n_h, p, p).clone()
            mask[:, torch.tensor(h.heads, device=at.device)] += add
    dead = torch.isneginf(mask).all(-1, keepdim=True)
    out = _Mask(mask.masked_fill(dead, 0.0), dead)
    if fixed:
        if not bool(dead.any()):  # one look, when the mask is made
            out = _Mask(mask)
        at.cache[key] = (out, [h.bias for h in bias_hooks], base)  # the tensors kept alive: their ids stay theirs
    return out


def _causal(at: _Pass) -> Float[Tensor, "1 1 q k"]:
    """0 on and below the diagonal, -inf above (cached)."""
    key = ("causal", at.p, at.dtype, at.device)
    if key not in at.cache:
        above = torch.ones(at.p, at.p, dtype=torch.bool, device=at.device).triu(1)
        at.cache[key] = torch.zeros(at.p, at.p, dtype=at.dtype, device=at.device).masked_fill(above, float("-inf"))[
            None, None]
    return at.cache[key]


def _alibi(n_heads: int, at: _Pass) -> Float[Tensor, "1 h q k"]:
    """TransformerLens's ALiBi bias (`create_alibi_bias`) with the causal part, as a float mask (cached)."""
    from transformer_lens.components import AbstractAttention

    key = ("alibi", n_heads, at.p, at.dtype, at.device)
    if key not in at.cache:
        alibi = AbstractAttention.create_alibi_bias(n_heads, at.p, at.device).to(at.dtype)
        at.cache[key] = (alibi + _causal(at)[0])[None]
    return at.cache[key]
