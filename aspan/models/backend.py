"""The backend seam: which TransformerLens class runs a model, and everything that differs between the two.

"hooked" is `HookedTransformer` (TransformerLens 3; the parameters are its own, in its names); "bridge" is
`TransformerBridge` (TransformerLens 3.9 and 4, in compatibility mode: the same hook names, wrapping a Hugging Face
model whose own tensors train). Both run the same hooks; they differ only in what `ModelBackend` names: the KV-cached
step, which parameters are live, where the query/key projections and the whole-tensor groups lie, the Hugging Face
model a checkpoint writes, and the Hugging Face config they wrap. Everything else in aspan asks `backend_of(model)`
and never tests the class itself; a third backend is one more implementation here.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Literal, Protocol

import torch
from torch import Tensor

from ..options import BACKENDS, Backend, check_option
from ..tokenization import CharTokenizer, Tokenizer
from .build import fresh_bridged, fresh_hooked, hooked_from_form, to_bridge
from .loaded import bridge, cache_keyword, forward_cache_to_attention, import_transformer_lens, is_bridge

Layout = Literal["heads", "rows"]  # heads: [head, d_model, d_head]; rows: an nn.Linear weight [(head d_head), d_model]
QK_NAMES = ("W_Q", "W_K", "_W_K")  # HookedTransformer's [heads, d_model, d_head]; _W_K under grouped-query attention


class ModelBackend(Protocol):
    """What differs between the classes that run a model."""

    name: Backend  # "hooked" or "bridge", as run directories record it
    exact_save: bool  # whether `save(hf=False)` writes the model's own parameters (not a converted form)
    keeps_masks: bool  # whether the model holds per-layer [n_ctx, n_ctx] attention masks (memory estimates count them)
    converts_weights: bool  # whether loading a Hugging Face model builds a second copy of its weights (memory x2)
    takes_device_map: bool  # whether Hugging Face's placement over several devices (`device_map`) applies

    def available(self) -> bool:
        """Whether the installed TransformerLens has this class."""

    def fresh(self, sizes: dict[str, int], positional: str, seed: int, device, tokenizer: Any) -> Any:
        """A newly initialised aspan tiny model of `sizes` (d_vocab, n_layers, n_heads, d_model, d_head, d_mlp,
        n_ctx) with `positional` encoding (`tokenizer`: the Tokenizer, or None for a vocabulary size alone)."""

    def from_hooked(self, load: Callable[[Any], Any], where: Any) -> Any:
        """A LoadedModel from `load(dtype)`, which reads an aspan-format checkpoint as a HookedTransformer; `where`:
        the Placement (device, dtype, device_map)."""

    def from_form(self, path: os.PathLike, config: dict[str, Any], where: Any) -> Any:
        """The model of an aspan checkpoint in its Hugging Face form (directory `path`, its `config.json` read)."""

    def from_hf_dir(self, path: os.PathLike, config: dict[str, Any], where: Any, adapter: dict[str, Any]) -> Any:
        """A LoadedModel of a Hugging Face checkpoint directory, its tokenizer adapted by `adapter`."""

    def from_hf_model(self, hf_model: Any, tokenizer: Any, where: Any, n_ctx: int | None) -> Any:
        """The model over an in-memory Hugging Face model (e.g. dequantised from a GGUF file) and its tokenizer
        (`n_ctx`: a shorter context, where the class copies the weights)."""

    def cached_step(self, model, batch: int, device) -> Callable[[Tensor, int], Tensor]:
        """`step(new_tokens, total_len) -> logits`: a forward over the new tokens only, reusing a KV cache."""

    def live_parameters(self, model) -> dict[str, Tensor]:
        """{name: parameter} of the parameters the forward computes with (those that train)."""

    def qk_projections(self, model) -> list[tuple[str, Layout]]:
        """(parameter name, layout) of every query and key projection weight that trains."""

    def group_parameters(self, model, kind: str, live: dict[str, Tensor]) -> list[str]:
        """Names in `live` of the whole-tensor group `kind` ("attn", "mlp" or "embed")."""

    def hf_model(self, model, tokenizer: Tokenizer, hf: bool | None) -> Any:
        """The Hugging Face model a checkpoint of `model` writes (`hf`: None = when exact, True = required, False =
        the aspan format), or None for the aspan format; ValueError when the asked-for form is impossible."""

    def hf_config(self, model) -> dict[str, Any] | None:
        """The config of the Hugging Face model `model` wraps, or None."""


class Hooked:
    """HookedTransformer: TransformerLens's own cache, parameters and names."""

    name: Backend = "hooked"
    exact_save = True
    keeps_masks = True
    converts_weights = True  # the Hugging Face model stays alive while its weights are converted
    takes_device_map = False

    def available(self) -> bool:
        """Whether the installed TransformerLens has HookedTransformer (3.x does, 4.x does not)."""
        return has_hooked()

    def fresh(self, sizes: dict[str, int], positional: str, seed: int, device, tokenizer: Any) -> Any:
        """A newly initialised tiny HookedTransformer of `sizes` with `positional` encoding."""
        return fresh_hooked(sizes, positional, seed, device)

    def from_hooked(self, load: Callable[[Any], Any], where: Any) -> Any:
        """The aspan-format checkpoint `load` reads, at the placement's dtype."""
        return load(where.dtype)

    def from_form(self, path: os.PathLike, config: dict[str, Any], where: Any) -> Any:
        """The model of an aspan checkpoint in its Hugging Face form (directory `path`), as a HookedTransformer."""
        return hooked_from_form(path, config, where.device, where.dtype)

    def from_hf_dir(self, path: os.PathLike, config: dict[str, Any], where: Any, adapter: dict[str, Any]) -> Any:
        """A LoadedModel of a Hugging Face checkpoint directory as a HookedTransformer, its tokenizer adapted by
        `adapter`."""
        from .hf import load_hf_dir

        return load_hf_dir(path, config, device=where.device, dtype=where.dtype, **adapter)

    def from_hf_model(self, hf_model: Any, tokenizer: Any, where: Any, n_ctx: int | None) -> Any:
        """A HookedTransformer converted from an in-memory Hugging Face model (`n_ctx`: a shorter context)."""
        from .hf import from_hf

        return from_hf(hf_model, where.device, n_ctx, where.dtype)

    def cached_step(self, model, batch: int, device) -> Callable[[Tensor, int], Tensor]:
        """TransformerLens's own cache; its attention mask covers the new tokens."""
        from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

        cache = TransformerLensKeyValueCache.init_cache(model.cfg, device, batch)
        return lambda new, total: model(new, past_kv_cache=cache, attention_mask=_ones(batch, new.shape[1], device))

    def live_parameters(self, model) -> dict[str, Tensor]:
        """The model's parameters by name."""
        return dict(model.named_parameters())

    def qk_projections(self, model) -> list[tuple[str, Layout]]:
        """The query and key weights and biases, with their layout (`heads`: one slice per head)."""
        return [(n, "heads") for n, _ in model.named_parameters() if n.rsplit(".", 1)[-1] in QK_NAMES]

    def group_parameters(self, model, kind: str, live: dict[str, Tensor]) -> list[str]:
        """The names in `live` that parameter group `kind` (`attn`, `mlp` or embeddings) selects."""
        def selects(parts: list[str]) -> bool:
            return kind in parts if kind in ("attn", "mlp") else parts[0] in ("embed", "pos_embed")

        return [n for n in live if selects(n.split("."))]

    def hf_model(self, model, tokenizer: Tokenizer, hf: bool | None) -> Any:
        """The Hugging Face model a checkpoint of `model` writes (see `Backend.hf_model`), or None for the aspan format.
        """
        from . import hfform

        if hf is not False and isinstance(tokenizer, CharTokenizer):
            reason = hfform.why_not(model)
            if reason is None:
                return hfform.to_hf(model, tokenizer)
            if hf:
                raise ValueError(f"cannot save as a Hugging Face checkpoint: {reason}")
        elif hf:
            raise ValueError("a Hugging Face checkpoint needs a character tokenizer")
        return None

    def hf_config(self, model) -> dict[str, Any] | None:
        """None: a HookedTransformer carries no Hugging Face config."""
        return None


class Bridge:
    """TransformerBridge: the wrapped Hugging Face model's cache and tensors, seen through TransformerLens's names."""

    name: Backend = "bridge"
    exact_save = False  # on TransformerLens 3.9 the bridge adds an unembedding bias its Hugging Face form folds away
    keeps_masks = False
    converts_weights = False  # it wraps the Hugging Face model's own tensors
    takes_device_map = True

    def available(self) -> bool:
        """True: every supported TransformerLens has TransformerBridge."""
        return True

    def fresh(self, sizes: dict[str, int], positional: str, seed: int, device, tokenizer: Any) -> Any:
        """The same network in its Hugging Face form inside a TransformerBridge."""
        return fresh_bridged(sizes, positional, seed, device, tokenizer)

    def from_hooked(self, load: Callable[[Any], Any], where: Any) -> Any:
        """Read in float32, then bridged over its Hugging Face form (the bridge casts to `where.dtype`)."""
        loaded = load(None)
        return loaded._replace(model=to_bridge(loaded.model, loaded.tokenizer, where.device, where.dtype))

    def from_form(self, path: os.PathLike, config: dict[str, Any], where: Any) -> Any:
        """The model of an aspan checkpoint in its Hugging Face form (directory `path`), bridged."""
        return bridge(path, where.device, dtype=where.dtype, device_map=where.device_map)

    def from_hf_dir(self, path: os.PathLike, config: dict[str, Any], where: Any, adapter: dict[str, Any]) -> Any:
        """A LoadedModel of a Hugging Face checkpoint directory as a TransformerBridge, its tokenizer adapted by
        `adapter`."""
        from .hf import load_hf_bridge

        device_map = {} if where.device_map is None else {"device_map": where.device_map}
        return load_hf_bridge(path, config, device=where.device, dtype=where.dtype, **device_map, **adapter)

    def from_hf_model(self, hf_model: Any, tokenizer: Any, where: Any, n_ctx: int | None) -> Any:
        """A TransformerBridge over an in-memory Hugging Face model and its tokenizer."""
        return bridge(hf_model, where.device or "cpu", tokenizer, dtype=where.dtype)

    def cached_step(self, model, batch: int, device) -> Callable[[Tensor, int], Tensor]:
        """The Hugging Face cache, updated in place by the wrapped model; its attention mask covers the whole
        sequence."""
        from transformers import DynamicCache

        forward_cache_to_attention(model)  # bridges built elsewhere than aspan.models too
        cache = {cache_keyword(model): DynamicCache()}
        return lambda new, total: model(new, attention_mask=_ones(batch, total, device), use_cache=True, **cache)

    def live_parameters(self, model) -> dict[str, Tensor]:
        """Left out: tensors the bridge holds but does not compute with (GPT-NeoX's fused `query_key_value` beside
        the split q, k, v projections it runs), found by one backward pass from a two-token input, and the
        unembedding bias it adds to a Hugging Face model without one (`added_unembed_bias`), so a trained bridge
        saves exactly as its Hugging Face model."""
        added = added_unembed_bias(model)
        named = {n: p for n, p in model.named_parameters() if p is not added}
        params = list(named.values())
        flags = [p.requires_grad for p in params]
        try:
            for p in params:
                p.requires_grad_(True)
            with torch.enable_grad():
                out = model(torch.zeros(1, 2, dtype=torch.long, device=params[0].device)).float().sum()
                grads = torch.autograd.grad(out, params, allow_unused=True)
        finally:
            for p, flag in zip(params, flags):
                p.requires_grad_(flag)
        return {n: p for (n, p), g in zip(named.items(), grads) if g is not None}

    def qk_projections(self, model) -> list[tuple[str, Layout]]:
        """The wrapped model's separate q and k `nn.Linear` projections (ValueError when a layer has none live)."""
        names = {id(p): n for n, p in self.live_parameters(model).items()}
        out: list[tuple[str, Layout]] = []
        for layer, block in enumerate(model.blocks):
            for role in ("q", "k"):
                inner = getattr(getattr(block.attn, role, None), "original_component", None)
                weight = getattr(inner, "weight", None)
                if not isinstance(inner, torch.nn.Linear) or id(weight) not in names:
                    raise ValueError(f"qk groups on a TransformerBridge need separate, live query and key "
                                     f"projections; layer {layer} of this {type(model.original_model).__name__} has "
                                     f"none for {role}")
                out.append((names[id(weight)], "rows"))
        return out

    def group_parameters(self, model, kind: str, live: dict[str, Tensor]) -> list[str]:
        """From the bridge's TransformerLens-named components: blocks.L.attn, blocks.L.mlp, embed and pos_embed."""
        if kind in ("attn", "mlp"):
            mods = [getattr(b, kind) for b in model.blocks]
        else:
            mods = [m for m in (getattr(model, "embed", None), getattr(model, "pos_embed", None)) if m is not None]
        members = {id(p) for m in mods for p in m.parameters()}
        return [n for n, p in live.items() if id(p) in members]

    def hf_model(self, model, tokenizer: Tokenizer, hf: bool | None) -> Any:
        """Its Hugging Face model as it is, which `hf=False` asks for too (the weights it trains)."""
        from . import hfform

        if not isinstance(tokenizer, CharTokenizer):
            raise ValueError("a TransformerBridge saves as a Hugging Face checkpoint: it needs a character tokenizer")
        return hfform.unwrap(model.original_model, hfform.split_qkv_is_live(model))

    def hf_config(self, model) -> dict[str, Any] | None:
        """The Hugging Face config of the model the bridge wraps, as a dict."""
        return model.original_model.config.to_dict()


HOOKED, BRIDGE = Hooked(), Bridge()
REGISTRY: dict[str, ModelBackend] = {"hooked": HOOKED, "bridge": BRIDGE}  # a new backend adds its instance here


def backend_of(model) -> ModelBackend:
    """The backend that runs `model`."""
    return BRIDGE if is_bridge(model) else HOOKED


def backend_named(name: Backend) -> ModelBackend:
    """The backend called `name` ("hooked" or "bridge"; a one-line error for any other)."""
    return REGISTRY[check_option("backend", name, tuple(REGISTRY))]


def _ones(batch: int, n: int, device) -> Tensor:
    return torch.ones(batch, n, dtype=torch.long, device=device)


def added_unembed_bias(model) -> Tensor | None:
    """The unembedding bias a TransformerBridge adds to a Hugging Face model that has none (TransformerLens 3.9 gives
    it one of zeros), else None. The wrapped model's class, built on the meta device, says whether it has one."""
    bias = getattr(getattr(getattr(model, "unembed", None), "original_component", None), "bias", None)
    if bias is None or not is_bridge(model):
        return None
    orig = model.original_model
    with torch.device("meta"):
        fresh = type(orig)(orig.config)
    return bias if getattr(fresh.get_output_embeddings(), "bias", None) is None else None


def has_hooked() -> bool:
    """Whether this TransformerLens has HookedTransformer (3.x; 4.x has only TransformerBridge)."""
    import_transformer_lens()
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return False
    return True


def default_backend() -> Backend:
    """`ASPAN_BACKEND` when set (so every command can use either), else "hooked" where TransformerLens has
    HookedTransformer (3.x) and "bridge" where it does not (4.x)."""
    chosen = os.environ.get("ASPAN_BACKEND")
    if chosen:
        return check_option("ASPAN_BACKEND", chosen, BACKENDS)
    return "hooked" if has_hooked() else "bridge"
