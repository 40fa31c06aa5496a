"""--train-only parameter groups: each changes exactly its entries (weight decay included), counts them right, and
qk-pair selects the two coordinates the model's own rotary embedding mixes."""
import math
import warnings
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan import models, tasks
from aspan.models.tiny import build
from aspan.param_groups import (
    KINDS,
    Freezer,
    Group,
    TrainOnly,
    group_masks,
    pair_columns,
    pair_frequency,
    parse_train_only,
    trainable_count,
)
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig, train

warnings.filterwarnings("ignore", message=r"HookedTransformer(\.from_pretrained)? is deprecated",
                        category=DeprecationWarning)
TOK = CharTokenizer()
TASK = tasks.get("reversal", length=(1, 3), charset="abcd")
L, H, D, DH = 2, 4, 32, 8  # layers, heads, d_model, d_head of the test model


def tiny():
    torch.set_num_threads(1)
    return models.tiny(TOK, n_layers=L, n_heads=H, d_model=D, d_mlp=64, n_ctx=32, seed=0, device="cpu")


def expected_count(spec: str, vocab: int) -> int:
    """Entries each group owns, from the architecture alone (not from the masks under test)."""
    qk_col = 2 * L * H * D  # one column of W_Q and of W_K, every head of every layer
    attn = L * (4 * H * D * DH + 3 * H * DH + D)  # W_Q, W_K, W_V, W_O; b_Q, b_K, b_V; b_O
    mlp = L * (2 * D * 64 + 64 + D)
    embed = vocab * D
    total = attn + mlp + embed + L * 4 * D + 2 * D + D * vocab + vocab  # + LayerNorms, final LN, unembed
    return {"qk": DH * qk_col, "qk-column:3,5": 2 * qk_col, "qk-pair:1": 2 * qk_col, "attn": attn, "mlp": mlp,
            "embed": embed, "all": total, "qk-pair:0,mlp": 2 * qk_col + mlp, "qk,qk-column:2": DH * qk_col}[spec]


def changed_entries(spec: str, name: str, shape, rotary_dim: int = DH) -> torch.Tensor:
    """Independent description of which entries of TransformerLens parameter `name` (of `shape`) `spec` may change,
    from the architecture alone (a bool tensor)."""
    qk = name.split(".")[-1] in ("W_Q", "W_K")
    half = rotary_dim // 2
    full, none = torch.ones(shape, dtype=torch.bool), torch.zeros(shape, dtype=torch.bool)

    def cols(*c):
        m = none.clone()
        m[..., list(c)] = True
        return m

    return {
        "qk": full if qk else none,
        "qk-column:3,5": cols(3, 5) if qk else none,
        "qk-pair:1": cols(1, 1 + half) if qk else none,
        "attn": full if ".attn." in name else none,
        "mlp": full if ".mlp." in name else none,
        "embed": full if name.startswith("embed.") else none,
        "all": full,
        "qk-pair:0,mlp": cols(0, half) if qk else (full if ".mlp." in name else none),
        "qk,qk-column:2": full if qk else none,
    }[spec]


# HookedTransformer's names here; the bridge's: tests/training/test_param_groups_backends.py
@pytest.mark.hooked
@pytest.mark.parametrize("spec", ["qk", "qk-column:3,5", "qk-pair:1", "attn", "mlp", "embed", "all", "qk-pair:0,mlp",
                                  "qk,qk-column:2"])
def test_each_group_changes_exactly_its_parameters(spec, caplog):
    model = tiny()
    before = {k: v.clone() for k, v in model.named_parameters()}
    n, total = trainable_count(model, spec)
    assert n == expected_count(spec, TOK.vocab_size) and total == sum(p.numel() for p in model.parameters())
    config = TrainConfig.scratch(steps=3, batch_size=8, lr=1e-2, warmup=0, weight_decay=0.5, train_only=spec)
    with caplog.at_level("INFO", logger="aspan"):  # reported through the aspan.training loggers
        res = train(model, TOK, TASK, config, progress=True)
    assert f"trainable parameters: {n:,} of {total:,} ({100 * n / total:.2f}%) ({spec})" in caplog.text
    assert res.history[0] == {"kind": "params", "step": 0, "trainable": n, "total": total, "fraction": n / total,
                              "train_only": spec}
    moved = 0
    for name, p in model.named_parameters():
        allowed = changed_entries(spec, name, p.shape)
        assert torch.equal(p[~allowed], before[name][~allowed]), f"{spec}: frozen entries of {name} moved"
        moved += int((p != before[name])[allowed].sum())
        assert p.requires_grad  # flags restored
    assert moved > 0.9 * n  # the selected entries do train (a few may stay put by chance)


def test_freezer_keeps_frozen_entries_under_weight_decay_without_gradients():
    model = tiny()
    masks = group_masks(model, "qk-column:0")
    freezer = Freezer(model, masks)
    w = model.blocks[0].attn.W_Q
    before = w.detach().clone()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1, weight_decay=1.0)
    w.sum().backward()
    opt.step()
    assert not torch.equal(w[..., 1:], before[..., 1:])  # decay alone moves frozen entries...
    freezer.restore()
    assert torch.equal(w[..., 1:], before[..., 1:])  # ...restore undoes it
    assert not torch.equal(w[..., 0], before[..., 0])
    freezer.close()


def rotary_partners(model, column: int) -> set[int]:
    """Coordinates a one-hot query vector at `column` spreads to when the model's own rotary rotates it."""
    attn = model.blocks[0].attn
    x = torch.zeros(1, 6, 1, model.cfg.d_head)
    x[..., column] = 1.0
    with torch.no_grad():
        y = attn.apply_rotary(x)
    return set(torch.nonzero(y[0, 1:, 0].abs().sum(0) > 1e-6).flatten().tolist())


@pytest.mark.hooked  # through HookedTransformer's apply_rotary; the bridge's rotary: test_param_groups_backends.py
@pytest.mark.parametrize("variant", ["default", "adjacent", "partial"])
def test_pair_is_what_the_rotary_embedding_mixes(variant):
    model = tiny()
    cfg = model.cfg
    if variant != "default":
        kw = {"rotary_adjacent_pairs": True} if variant == "adjacent" else {"rotary_dim": DH // 2}
        model = build(replace(cfg, **kw))
        cfg = model.cfg
    half = cfg.rotary_dim // 2
    for i in range(half):
        cols = pair_columns(cfg, i)
        assert rotary_partners(model, cols[0]) == set(cols) == rotary_partners(model, cols[1])
        # the angle at position 1 is the pair's frequency base^(-2i/rotary_dim)
        cos1 = float(model.blocks[0].attn.rotary_cos[1, cols[0]])
        assert math.acos(cos1) == pytest.approx(pair_frequency(cfg, i), abs=1e-4)
    # every rotated column is in exactly one pair; columns past rotary_dim are never rotated
    assert sorted(c for i in range(half) for c in pair_columns(cfg, i)) == list(range(cfg.rotary_dim))
    for c in range(cfg.rotary_dim, cfg.d_head):
        assert rotary_partners(model, c) == {c}
    with pytest.raises(ValueError, match="out of range"):
        pair_columns(cfg, half)


groups = st.one_of(
    st.sampled_from([k for k in KINDS if k not in ("qk-column", "qk-pair")]).map(lambda k: Group(k)),
    st.tuples(st.sampled_from(["qk-column", "qk-pair"]), st.lists(st.integers(0, 99), min_size=1, max_size=4)).map(
        lambda t: Group(t[0], tuple(sorted(set(t[1]))))),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(groups, min_size=1, max_size=4))
def test_parser_round_trips(gs):
    spec = TrainOnly(tuple(gs))
    assert parse_train_only(str(spec)) == spec
    assert parse_train_only(spec) is spec


@pytest.mark.parametrize("text, message", [
    ("nope", "unknown train_only group"), ("mlp:1", "takes no index"), ("qk-pair", "needs a pair index"),
    ("qk-column:x", "must be an integer"), ("qk-column:-1", ">= 0"), ("", "non-empty"), ("mlp,3", "unknown"),
])
def test_parser_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_train_only(text)


def test_bare_qk_column_means_column_zero_and_ranges_are_checked():
    assert parse_train_only("qk-column") == TrainOnly((Group("qk-column", (0,)),))
    with pytest.raises(ValueError, match="out of range"):
        group_masks(tiny(), "qk-column:8")
    with pytest.raises(ValueError, match="out of range"):
        train(tiny(), TOK, TASK, TrainConfig.scratch(steps=1, train_only="qk-pair:4"), progress=False)
