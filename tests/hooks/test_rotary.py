"""`hooks.rotary_pairs` against brute force: the rotated queries and keys, and the logits, of a forward under the hooks
equal those of the same forward whose rotated q and k are recomputed by hand from the unrotated ones (`hook_q`,
`hook_k`) with each pair's angle as the mode asks (float64 trigonometry, written out element by element); positions
up to `beyond` are untouched; removing every pair everywhere is attention without positions; bad input is refused."""
from __future__ import annotations

import math

import pytest
import torch

import hooks

N_POS = 12


def _model(adjacent: bool = False, rotary_dim: int = 8, d_head: int = 8, n_layers: int = 2):
    """A small rotary HookedTransformer (TransformerLens 3.9; the tests using it are marked `hooked`)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=n_layers, n_heads=2, d_model=16, d_head=d_head, n_ctx=32, d_vocab=11,
                                  act_fn="relu", positional_embedding_type="rotary", rotary_dim=rotary_dim,
                                  rotary_adjacent_pairs=adjacent, rotary_base=50, seed=1)
    return HookedTransformer(cfg).eval()


def _tokens() -> torch.Tensor:
    return torch.randint(0, 11, (3, N_POS), generator=torch.Generator().manual_seed(0))


def _by_hand(x: torch.Tensor, cfg, pairs: list[int], mode: str, beyond: int | None) -> torch.Tensor:
    """Rotate the unrotated `x` [batch, pos, head, d_head] pair by pair, position by position: angle θ_i · p, or for
    a chosen pair past `beyond` θ_i · beyond ("clamp") or 0 ("remove")."""
    dim, half = cfg.rotary_dim, cfg.rotary_dim // 2
    out = x.double().clone()
    for i in range(half):
        theta = cfg.rotary_base ** (-2 * i / dim)
        lo, hi = (2 * i, 2 * i + 1) if cfg.rotary_adjacent_pairs else (i, i + half)
        for p in range(x.shape[1]):
            angle = theta * p
            if i in pairs and (beyond is None or p > beyond):
                angle = theta * beyond if mode == "clamp" else 0.0
            a, b = x[:, p, :, lo].double(), x[:, p, :, hi].double()
            out[:, p, :, lo] = a * math.cos(angle) - b * math.sin(angle)
            out[:, p, :, hi] = b * math.cos(angle) + a * math.sin(angle)
    return out.to(x.dtype)


def _brute(model, tokens, pairs, mode, beyond):
    """Logits and rotated q, k of a forward whose hook_rot_q / hook_rot_k outputs are replaced by `_by_hand` of the
    captured hook_q / hook_k."""
    got: dict[str, torch.Tensor] = {}

    def keep(x, hook):
        got[hook.name] = x.detach()

    def replace(kind):
        def fn(x, hook):
            layer = hook.name.split(".")[1]
            new = _by_hand(got[f"blocks.{layer}.attn.hook_{kind}"], model.cfg, pairs, mode, beyond)
            got[hook.name] = new
            return new
        return fn

    fwd = [(f"blocks.{layer}.attn.hook_{kind}", keep) for layer in range(2) for kind in "qk"]
    fwd += [(f"blocks.{layer}.attn.hook_rot_{kind}", replace(kind)) for layer in range(2) for kind in "qk"]
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=fwd)
    return logits, got


def _hooked(model, tokens, pairs, mode, beyond):
    got: dict[str, torch.Tensor] = {}
    edit = hooks.rotary_pairs(model, pairs, mode=mode, beyond=beyond)

    def keep(x, hook):
        got[hook.name] = x.detach()

    fwd = edit + [(name, keep) for name, _ in edit]  # the reader runs after the edit on the same hook point
    fwd += [(f"blocks.{layer}.attn.hook_{kind}", keep) for layer in range(2) for kind in "qk"]
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=fwd)
    return logits, got


@pytest.mark.hooked  # a HookedTransformer: its rotary attention calls hook_rot_q/k
@pytest.mark.parametrize("adjacent", [False, True], ids=["rotate-half", "adjacent"])
@pytest.mark.parametrize("mode, pairs, beyond", [("clamp", [0], 5), ("clamp", [0, 2, 3], 7), ("remove", [1], 4),
                                                 ("remove", [0, 3], None), ("clamp", [0, 1, 2, 3], 0)])
def test_rotated_q_k_and_logits_equal_the_rotation_recomputed_by_hand(adjacent, mode, pairs, beyond):
    model, tokens = _model(adjacent), _tokens()
    want_logits, want = _brute(model, tokens, pairs, mode, beyond)
    got_logits, got = _hooked(model, tokens, pairs, mode, beyond)
    for name in (f"blocks.{layer}.attn.hook_rot_{kind}" for layer in range(2) for kind in "qk"):
        assert torch.allclose(got[name], want[name], atol=1e-5), name
    assert torch.allclose(got_logits, want_logits, atol=1e-4)
    plain = model(tokens)
    assert not torch.allclose(got_logits, plain, atol=1e-3)  # the edit changes what the model computes


@pytest.mark.hooked  # a HookedTransformer: its rotary attention calls hook_rot_q/k
def test_a_partial_rotary_dim_leaves_the_unrotated_columns_alone():
    model, tokens = _model(rotary_dim=4, d_head=8), _tokens()
    want_logits, want = _brute(model, tokens, [1], "clamp", 3)
    got_logits, got = _hooked(model, tokens, [1], "clamp", 3)
    assert torch.allclose(got_logits, want_logits, atol=1e-4)
    for name in (f"blocks.{layer}.attn.hook_{kind}" for layer in range(2) for kind in "qk"):
        rotated = got[name.replace("hook_", "hook_rot_")]
        assert torch.equal(rotated[..., 4:], got[name][..., 4:])  # the columns past rotary_dim pass through
        assert not torch.equal(rotated[..., :4], got[name][..., :4])


@pytest.mark.hooked  # a HookedTransformer: its rotary attention calls hook_rot_q/k
def test_clamp_leaves_every_position_up_to_beyond_as_it_was():
    model, tokens = _model(), _tokens()
    plain = model(tokens)
    with model.hooks(fwd_hooks=hooks.rotary_pairs(model, [0, 1, 2, 3], mode="clamp", beyond=6)):
        clamped = model(tokens)
    assert torch.allclose(clamped[:, :7], plain[:, :7], atol=1e-5)
    assert not torch.allclose(clamped[:, 7:], plain[:, 7:], atol=1e-3)
    with model.hooks(fwd_hooks=hooks.rotary_pairs(model, [0, 1, 2, 3], mode="clamp", beyond=N_POS - 1)):
        assert torch.allclose(model(tokens), plain, atol=1e-5)  # nothing lies past the last position


@pytest.mark.hooked  # a HookedTransformer: its rotary attention calls hook_rot_q/k
def test_removing_every_pair_everywhere_is_attention_without_positions():
    """Every pair removed at every position: the scores are q · k of the unrotated projections (scaled), which depend
    on no position, so in one layer a permutation of the earlier tokens leaves the last position's logits
    unchanged."""
    model, tokens = _model(n_layers=1), _tokens()
    edit = hooks.rotary_pairs(model, range(4), mode="remove")
    shuffled = tokens.clone()
    shuffled[:, : N_POS - 1] = tokens[:, torch.randperm(N_POS - 1, generator=torch.Generator().manual_seed(3))]
    with torch.no_grad(), model.hooks(fwd_hooks=edit):
        a, b = model(tokens)[:, -1], model(shuffled)[:, -1]
    assert torch.allclose(a, b, atol=1e-4)
    assert not torch.allclose(model(tokens)[:, -1], model(shuffled)[:, -1], atol=1e-3)  # with positions it moves


@pytest.mark.hooked  # a HookedTransformer: its rotary attention calls hook_rot_q/k
def test_hooks_do_not_leak():
    model, tokens = _model(), _tokens()
    before = model(tokens)
    with model.hooks(fwd_hooks=hooks.rotary_pairs(model, [0], mode="clamp", beyond=2)):
        model(tokens)
    assert torch.equal(model(tokens), before)


@pytest.mark.hooked  # a HookedTransformer: its rotary attention calls hook_rot_q/k
def test_kv_cached_generation_is_refused():
    model = _model()
    edit = hooks.rotary_pairs(model, [0], mode="clamp", beyond=2)
    with model.hooks(fwd_hooks=edit), pytest.raises(ValueError, match="KV-cached generation"):
        model.generate(_tokens()[:1, :4], max_new_tokens=2, verbose=False, use_past_kv_cache=True, stop_at_eos=False)


@pytest.mark.hooked  # a HookedTransformer: its rotary attention calls hook_rot_q/k
@pytest.mark.parametrize("kwargs, message", [
    ({"pairs": []}, "non-empty list of rotary pair indices in 0..3"),
    ({"pairs": [4]}, "in 0..3"),
    ({"pairs": [0], "mode": "hold"}, "mode must be one of clamp, remove"),
    ({"pairs": [0], "mode": "clamp"}, "give beyond"),
    ({"pairs": [0], "mode": "remove", "beyond": -1}, "beyond must be an int >= 0"),
    ({"pairs": [0], "mode": "remove", "layers": [2]}, "layer 2 out of range"),
])
def test_bad_input_is_refused_before_any_forward(kwargs, message):
    with pytest.raises(ValueError, match=message):
        hooks.rotary_pairs(_model(), **kwargs)


@pytest.mark.hooked  # a HookedTransformer: its rotary attention calls hook_rot_q/k
def test_a_model_without_rotary_is_refused():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=1, n_heads=1, d_model=8, d_head=8, n_ctx=8, d_vocab=5, act_fn="relu")
    with pytest.raises(ValueError, match="needs a rotary model"):
        hooks.rotary_pairs(HookedTransformer(cfg), [0], mode="remove")


def test_a_bridge_is_refused_since_its_rotary_hook_points_never_fire():
    """A TransformerBridge lists hook_rot_q / hook_rot_k but its attention does not call them: a forward with hooks
    there runs them never, so `rotary_pairs` refuses the bridge instead of editing nothing."""
    from tests.conftest import _bridge_model

    bridge = _bridge_model("rotary", 1)
    fired: list[str] = []
    with bridge.hooks(fwd_hooks=[("blocks.0.attn.hook_rot_q", lambda x, hook: fired.append(hook.name))]):
        bridge(torch.randint(0, 20, (1, 6)))
    assert "blocks.0.attn.hook_rot_q" in bridge.hook_dict and not fired
    with pytest.raises(ValueError, match="needs a HookedTransformer"):
        hooks.rotary_pairs(bridge, [0], mode="remove")
