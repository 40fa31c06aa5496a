"""Tiny random HookedTransformers (rotary, standard, GQA) and random padded batches with reference masks."""
import warnings

import pytest
import torch

warnings.filterwarnings("ignore", message=r"HookedTransformer(\.from_pretrained)? is deprecated", category=DeprecationWarning)
from transformer_lens import HookedTransformer, HookedTransformerConfig  # noqa: E402

KINDS = ["rotary", "standard"]  # every test; GQA joins the core checks through `any_model`


def tiny_model(kind: str, n_layers: int = 3) -> HookedTransformer:
    extra = {"n_key_value_heads": 2} if kind == "gqa" else {}
    cfg = HookedTransformerConfig(
        n_layers=n_layers, d_model=32, n_heads=4, d_head=8, d_mlp=64, n_ctx=64, d_vocab=20, act_fn="gelu",
        positional_embedding_type="standard" if kind == "standard" else "rotary", normalization_type="LN",
        seed=0, **extra,
    )
    model = HookedTransformer(cfg)
    model.eval()
    return model


_MODELS: dict[str, HookedTransformer] = {}


def _get(kind: str) -> HookedTransformer:
    if kind not in _MODELS:
        _MODELS[kind] = tiny_model(kind)
    return _MODELS[kind]


@pytest.fixture(params=KINDS)
def model(request) -> HookedTransformer:
    return _get(request.param)


@pytest.fixture(params=KINDS + ["gqa"])
def any_model(request) -> HookedTransformer:
    """Rotary, standard, and a grouped-query (n_key_value_heads=2) model."""
    return _get(request.param)


def random_mask(lengths, pos: int, seed: int = 0, p: float = 0.3) -> torch.Tensor:
    """Bool [batch, pos, pos]: the second half of each sample's rows reference random earlier-or-same keys."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(len(lengths), pos, pos, dtype=torch.bool)
    for i, n in enumerate(lengths):
        m = (torch.rand(n, n, generator=g) < p).tril()
        m[: n // 2] = False
        mask[i, :n, :n] = m
    return mask


def padded_batch(lengths, pos: int | None = None, seed: int = 0, left: bool = False):
    """Random tokens (pad id 0 is never a real token), attention mask and reference mask, right (or left) padded."""
    pos = pos or max(lengths)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(len(lengths), pos, dtype=torch.long)
    am = torch.zeros(len(lengths), pos, dtype=torch.long)
    mask = torch.zeros(len(lengths), pos, pos, dtype=torch.bool)
    small = random_mask(lengths, pos, seed)
    for i, n in enumerate(lengths):
        sl = slice(pos - n, pos) if left else slice(0, n)
        tokens[i, sl] = torch.randint(1, 20, (n,), generator=g)
        am[i, sl] = 1
        mask[i, sl, sl] = small[i, :n, :n]
    return tokens, am, mask
