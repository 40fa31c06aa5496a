"""Which parameters train: a small vocabulary of parameter groups, masks for partial tensors, and the Freezer.

    spec = parse_train_only("qk-pair:0,3,mlp")     # TrainOnly(groups=(Group('qk-pair', (0, 3)), Group('mlp', ())))
    masks = group_masks(model, spec)                # {param name: bool mask of the entries that train}
    trainable_count(model, spec)                    # (trainable, total)

Groups (combinable with commas; the integers after a group's colon are its indices):

- `qk`: every `W_Q` and `W_K` (the query and key projection weights of every head).
- `qk-column:C[,C...]`: column C (of `d_head`) of `W_Q` and `W_K` in every head ("Attend or Perish", Spiegel et al.,
  revised abstract of the ICLR 2026 submission: fine-tuning one query/key column). A bare `qk-column` means column 0.
- `qk-pair:I[,I...]`: the rotary (RoPE) rotation pair I, i.e. the two columns the rotary embedding rotates
  together (Su et al. 2021, Eq. 34): columns I and I + rotary_dim/2 in TransformerLens's default rotate-half
  layout (GPT-NeoX style), columns 2I and 2I + 1 when `cfg.rotary_adjacent_pairs` is set; of both `W_Q` and `W_K`.
  Its angular frequency is base^(-2I/rotary_dim) radians per position.
- `attn`: every parameter of every attention layer (`W_Q`, `W_K`, `W_V`, `W_O` and their biases).
- `mlp`: every parameter of every MLP.
- `embed`: the input embeddings (`embed.*`, and `pos_embed.*` when the model has learned positions).
- `all`: everything.

Biases (`b_Q`, `b_K`) are not part of the qk groups: a group names weight matrices, `attn` adds the biases.

Both backends. On a TransformerBridge the tensors that train are the wrapped Hugging Face model's: the query and key
projections are `nn.Linear` weights `[(head d_head), d_model]`, so column C of head h is row h * d_head + C; the
whole-tensor groups are the parameters of the bridge's `blocks.L.attn`, `blocks.L.mlp`, `embed` and `pos_embed`
components. Tensors the bridge holds but does not compute with (GPT-NeoX's fused `query_key_value`, kept beside the
split projections it runs) never train and are not counted, nor does the zero unembedding bias TransformerLens 3.9's
bridge adds (the Hugging Face model has none, so the bridge trains exactly the parameters it saves; the hooked model's
`b_U` is in `all`). A group thus selects the same heads, columns and rotary pairs on either backend of one checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool
from torch import Tensor

from .models.backend import Layout, backend_of

# the grammar of `--train-only` (parsed without torch), importable from here too
from .train_only import INDEXED, KINDS, Group, GroupKind, TrainOnly, parse_train_only  # noqa: F401


@dataclass(frozen=True)
class Rotary:
    """A model's rotary embedding: how many `d_head` columns rotate, its base, and how pairs are laid out."""

    dim: int  # rotated columns of each head (0: no rotary positions)
    base: float  # the frequency base (RoPE's theta)
    adjacent: bool  # pairs are columns (2i, 2i+1) instead of rotate-half's (i, i + dim/2)


def rotary_of(model_or_cfg) -> Rotary:
    """The rotary geometry of a HookedTransformer, its config, or a TransformerBridge (read from the Hugging Face
    config it wraps: TransformerLens leaves the bridge's `cfg.rotary_dim` unset)."""
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    if cfg.positional_embedding_type != "rotary":
        return Rotary(0, 10000.0, False)
    hf = backend_of(model_or_cfg).hf_config(model_or_cfg) if hasattr(model_or_cfg, "cfg") else None
    if hf is None or cfg.rotary_dim:
        return Rotary(int(cfg.rotary_dim or 0), float(cfg.rotary_base), bool(getattr(cfg, "rotary_adjacent_pairs",
                                                                                    False)))
    rope = dict(hf.get("rope_parameters") or {})
    factor = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", hf.get("rotary_pct", 1.0)))
    base = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    # Hugging Face's GPT-NeoX and Llama rotate halves (rotate_half), TransformerLens's default layout
    return Rotary(int(cfg.d_head * factor), float(base), bool(getattr(cfg, "rotary_adjacent_pairs", False)))


def pair_columns(model_or_cfg, pair: int) -> tuple[int, int]:
    """The two `d_head` columns the rotary embedding rotates together as pair `pair` (TransformerLens layout) of a
    model (either backend) or a HookedTransformer config."""
    rot = rotary_of(model_or_cfg)
    if not rot.dim:
        raise ValueError("qk-pair needs a model with rotary positional embeddings")
    half = rot.dim // 2
    if not 0 <= pair < half:
        raise ValueError(f"qk-pair {pair} out of range: the model has {half} rotary pairs (rotary_dim {rot.dim})")
    if rot.adjacent:
        return 2 * pair, 2 * pair + 1
    return pair, pair + half


def pair_frequency(model_or_cfg, pair: int) -> float:
    """Angular frequency of rotary pair `pair`: base^(-2 pair / rotary_dim) radians per position."""
    pair_columns(model_or_cfg, pair)
    rot = rotary_of(model_or_cfg)
    return rot.base ** (-2 * pair / rot.dim)


def _columns(model, group: Group) -> list[int]:
    """The d_head columns of W_Q/W_K a qk-column or qk-pair group selects (range-checked)."""
    if group.kind == "qk-column":
        for c in group.indices:
            if c >= model.cfg.d_head:
                raise ValueError(f"qk-column {c} out of range: d_head is {model.cfg.d_head}")
        return list(group.indices)
    return [c for i in group.indices for c in pair_columns(model, i)]


# ----------------------------------------------------------------------------------------------- the two backends
@dataclass(frozen=True)
class QKWeight:
    """One query or key projection weight as it trains: its parameter name and how heads and columns lie in it."""

    name: str  # the name in model.named_parameters()
    layout: Layout  # heads: [head, d_model, d_head] (HookedTransformer); rows: an nn.Linear
    # weight [(head d_head), d_model] (the Hugging Face q/k projections a TransformerBridge runs)
    d_head: int

    def mask(self, shape: torch.Size, cols: list[int] | None) -> Bool[Tensor, "..."]:
        """The entries of columns `cols` of every head (None: every entry)."""
        m = torch.zeros(shape, dtype=torch.bool)
        if cols is None:
            m[...] = True
        elif self.layout == "heads":
            m[..., cols] = True
        else:
            m.view(-1, self.d_head, shape[-1])[:, cols, :] = True
        return m


def live_parameters(model) -> dict[str, Tensor]:
    """{name: parameter} of the parameters that train (`aspan.models.backend`: on a TransformerBridge, without the
    tensors it holds but does not compute with and the unembedding bias it adds)."""
    return backend_of(model).live_parameters(model)


def qk_weights(model) -> list[QKWeight]:
    """Every query and key projection weight the model trains (W_Q, W_K or _W_K; on a bridge the q/k projections)."""
    return [QKWeight(name, layout, model.cfg.d_head) for name, layout in backend_of(model).qk_projections(model)]


def _whole(model, kind: GroupKind) -> list[str]:
    """Names of the parameters a whole-tensor group (attn, mlp, embed, all) selects, on either backend."""
    live = live_parameters(model)
    return list(live) if kind == "all" else backend_of(model).group_parameters(model, kind, live)


def group_masks(model, spec: TrainOnly | str) -> dict[str, Bool[Tensor, "..."]]:
    """{param name: bool mask} of the entries `spec` trains (only parameters with at least one entry selected).

    On a TransformerBridge the masks are on the tensors it trains (the Hugging Face projections), selecting the
    same heads, columns and rotary pairs as on a HookedTransformer of the same checkpoint."""
    spec = parse_train_only(spec)
    params = dict(model.named_parameters())
    masks: dict[str, Tensor] = {}

    def add(name: str, m: Tensor) -> None:
        m = m.to(params[name].device)
        masks[name] = masks[name] | m if name in masks else m

    for group in spec.groups:
        if group.kind in ("qk", "qk-column", "qk-pair"):
            cols = _columns(model, group) if group.kind in INDEXED else None
            for w in qk_weights(model):
                add(w.name, w.mask(params[w.name].shape, cols))
        else:
            for name in _whole(model, group.kind):
                add(name, torch.ones_like(params[name], dtype=torch.bool))
    if not masks:
        raise ValueError(f"train_only {str(spec)!r} selects no parameter of this model")
    return masks


def qk_column_masks(model, column: int) -> dict[str, Bool[Tensor, "..."]]:
    """{param name: bool mask} selecting column `column` of W_Q and W_K in every head."""
    return group_masks(model, TrainOnly((Group("qk-column", (column,)),)))


def parameter_count(model) -> int:
    """Entries of the parameters the model computes with (a bridge's unused duplicates left out)."""
    return sum(p.numel() for p in live_parameters(model).values())


def trainable_count(model, spec: TrainOnly | str | None) -> tuple[int, int]:
    """(trainable entries, all entries) of `model` under `spec` (None: everything trains)."""
    total = parameter_count(model)
    if parse_train_only(spec) is None:
        return total, total
    return int(sum(int(m.sum()) for m in group_masks(model, spec).values())), total


class Freezer:
    """Train only masked entries.

    Unselected parameters get requires_grad=False. A parameter selected in part gets a gradient-mask hook, and its
    frozen entries are copied back after every optimiser step: AdamW's decoupled weight decay (Loshchilov & Hutter
    2019) shrinks every entry of a tensor it updates, gradient or not. Fully selected parameters train as usual.
    `close()` restores requires_grad and removes the hooks.
    """

    def __init__(self, model, masks: dict[str, Tensor]):
        self.params = dict(model.named_parameters())
        unknown = sorted(set(masks) - set(self.params))
        if unknown:
            raise ValueError(f"masks name parameters the model does not have: {', '.join(unknown)}")
        self.flags = {n: p.requires_grad for n, p in self.params.items()}
        self.n_trainable = int(sum(int(m.sum()) for m in masks.values()))
        self.masks = {n: m.to(self.params[n].device) for n, m in masks.items() if not bool(m.all())}
        self.handles = []
        self.snapshot()
        for n, p in self.params.items():
            p.requires_grad_(n in masks and bool(masks[n].any()))
        for n, m in self.masks.items():
            self.handles.append(self.params[n].register_hook(lambda g, m=m: g * m))

    def snapshot(self) -> None:
        """Remember the current values of the frozen entries of partly trained parameters."""
        self.frozen = {n: self.params[n].detach().clone() for n in self.masks}

    def trainable(self) -> int:
        """The number of trainable parameter entries."""
        return self.n_trainable

    @torch.no_grad()
    def restore(self) -> None:
        """Copy the frozen entries back into each partly trained parameter (after an optimizer step)."""
        for n, m in self.masks.items():
            p = self.params[n]
            p.copy_(torch.where(m, p, self.frozen[n]))

    def close(self) -> None:
        """Remove the gradient hooks and give every parameter back its `requires_grad`."""
        for h in self.handles:
            h.remove()
        self.handles = []
        for n, p in self.params.items():
            p.requires_grad_(self.flags[n])
