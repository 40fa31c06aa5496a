"""--train-only on a TransformerBridge: every group selects the same heads, columns and rotary pairs as on a
HookedTransformer of the same checkpoint, with masks on the Hugging Face tensors the bridge trains; training changes
exactly those entries; and training from one checkpoint gives the same losses on both backends.

Bridge tensors are compared in TransformerLens's names through the checkpoint converter (`neox.from_hf_state`),
an independent route from the row arithmetic of `aspan.param_groups`."""
import math
from pathlib import Path
from types import SimpleNamespace

import einops
import pytest
import torch

from aspan import models, tasks
from aspan.models import hfform, neox
from aspan.models.backend import added_unembed_bias
from aspan.param_groups import (
    group_masks,
    live_parameters,
    pair_columns,
    pair_frequency,
    rotary_of,
    trainable_count,
)
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig, train
from tests.training.test_param_groups import changed_entries

TOK = CharTokenizer()
TASK = tasks.get("reversal", length=(1, 3), charset="abcd")
L, H, D, DH, MLP = 2, 4, 32, 8, 64  # layers, heads, d_model, d_head, d_mlp
SPECS = ["qk", "qk-column:3,5", "qk-pair:1", "attn", "mlp", "embed", "all", "qk-pair:0,mlp"]


def make_checkpoint(path: Path, rotary_factor: float) -> Path:
    """A random GPT-NeoX (sequential residual, biases) saved as an aspan checkpoint; `rotary_factor` of d_head
    rotates (partial rotary for 0.5)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(
        vocab_size=TOK.vocab_size, hidden_size=D, num_hidden_layers=L, num_attention_heads=H, intermediate_size=MLP,
        hidden_act="gelu", max_position_embeddings=32, use_parallel_residual=False, tie_word_embeddings=False,
        attention_bias=True, hidden_dropout=0.0, attention_dropout=0.0, initializer_range=0.1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": rotary_factor},
        architectures=["GPTNeoXForCausalLM"],
    )
    torch.manual_seed(3)
    hf = GPTNeoXForCausalLM(config).float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))  # non-trivial biases and LayerNorms
    path.mkdir(parents=True)
    hfform.save_hf(hf, path, TOK, {"task": "reversal"})
    return path


@pytest.fixture(scope="module", params=[1.0, 0.5], ids=["rotary", "partial-rotary"])
def checkpoint(request, tmp_path_factory):
    torch.set_num_threads(1)
    return make_checkpoint(tmp_path_factory.mktemp("pg") / "model", request.param), request.param


def bridge_of(checkpoint):
    return models.load(checkpoint[0], device="cpu", backend="bridge").model


def hooked_view(bridge, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors keyed by the bridge's parameter names, renamed and reshaped to TransformerLens's parameters through
    the checkpoint converter; a parameter missing from `tensors` counts as zeros (False for masks)."""
    orig = bridge.original_model
    hf_names = set(type(orig)(orig.config).state_dict())
    canon = {}  # id(parameter) -> its Hugging Face name (or the split q/k/v projection's)
    for name, t in orig.state_dict(keep_vars=True).items():
        c = name.replace("._original_component", "").replace("_original_component.", "")
        if c in hf_names or c.rsplit(".", 2)[-2] in ("q", "k", "v"):
            canon.setdefault(id(t), c)
    like = next(iter(tensors.values()))
    state = {canon[id(p)]: tensors.get(n, torch.zeros(p.shape, dtype=like.dtype)) for n, p in
             bridge.named_parameters() if id(p) in canon}
    for l in range(L):
        stem = f"gpt_neox.layers.{l}.attention."
        for kind, pattern in (("weight", "qkv (i h) m -> (i qkv h) m"), ("bias", "qkv (i h) -> (i qkv h)")):
            split = torch.stack([state.pop(f"{stem}{x}.{kind}") for x in "qkv"])
            state[f"{stem}query_key_value.{kind}"] = einops.rearrange(split, pattern, i=H)
    cfg = SimpleNamespace(n_layers=L, n_heads=H, d_vocab=TOK.vocab_size)
    return {k: v for k, v in neox.from_hf_state(state, cfg).items() if k != "unembed.b_U"}


@pytest.mark.parametrize("spec", SPECS)
def test_bridge_masks_select_the_hooked_models_entries(checkpoint, spec):
    bridge = bridge_of(checkpoint)
    rotary_dim = round(checkpoint[1] * DH)
    assert rotary_of(bridge).dim == rotary_dim
    masks = group_masks(bridge, spec)
    live = live_parameters(bridge)
    assert set(masks) <= set(live)  # only tensors the bridge computes with (never the fused query_key_value)
    assert not [n for n in live if "query_key_value" in n or ".qkv." in n]
    view = hooked_view(bridge, masks)
    for name, m in view.items():
        assert torch.equal(m, changed_entries(spec, name, m.shape, rotary_dim)), f"{spec}: {name}"
    added = added_unembed_bias(bridge)  # TransformerLens 3.9's zero unembedding bias: never trains
    assert all(p is not added for p in live.values()) and (added is None or not added.any())
    n, total = trainable_count(bridge, spec)
    assert (n, total) == (sum(int(m.sum()) for m in view.values()), sum(p.numel() for p in view.values()))


def test_pair_is_what_the_bridges_rotary_embedding_mixes(checkpoint):
    """Through the wrapped Hugging Face model's own rotary embedding (its `apply_rotary_pos_emb`)."""
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

    bridge = bridge_of(checkpoint)
    rot = rotary_of(bridge)
    x = torch.zeros(1, 1, 6, DH)  # [batch, head, pos, d_head]
    cos, sin = bridge.original_model.gpt_neox.rotary_emb(x, torch.arange(6)[None])

    def partners(column: int) -> set[int]:
        one = x.clone()
        one[..., column] = 1.0
        y, _ = apply_rotary_pos_emb(one, one, cos, sin)
        return set(torch.nonzero(y[0, 0, 1:].abs().sum(0) > 1e-6).flatten().tolist())

    for i in range(rot.dim // 2):
        cols = pair_columns(bridge, i)
        assert partners(cols[0]) == set(cols) == partners(cols[1])
        assert math.acos(float(cos[0, 1, cols[0]])) == pytest.approx(pair_frequency(bridge, i), abs=1e-4)
    assert sorted(c for i in range(rot.dim // 2) for c in pair_columns(bridge, i)) == list(range(rot.dim))
    assert all(partners(c) == {c} for c in range(rot.dim, DH))
    with pytest.raises(ValueError, match="out of range"):
        pair_columns(bridge, rot.dim // 2)


@pytest.mark.hooked
@pytest.mark.parametrize("spec", SPECS)
def test_both_backends_train_the_same_entries(checkpoint, spec):
    hooked = models.load(checkpoint[0], device="cpu", backend="hooked").model
    bridge = bridge_of(checkpoint)
    want = group_masks(hooked, spec)
    got = hooked_view(bridge, group_masks(bridge, spec))
    for name, m in got.items():
        assert torch.equal(m, want.get(name, torch.zeros_like(m))), f"{spec}: {name}"
    assert pair_frequency(bridge, 1) == pair_frequency(hooked, 1)
    n_hooked, total_hooked = trainable_count(hooked, spec)
    n_bridge, total_bridge = trainable_count(bridge, spec)
    b_U = TOK.vocab_size  # the hooked model's unembedding bias (GPT-NeoX has none: the checkpoint folds it away)
    assert (n_bridge + b_U * (spec == "all"), total_bridge + b_U) == (n_hooked, total_hooked)


def test_a_qk_column_step_on_the_bridge_changes_only_that_column(checkpoint):
    bridge = bridge_of(checkpoint)
    before = {n: p.detach().clone() for n, p in bridge.named_parameters()}
    config = TrainConfig.scratch(steps=2, batch_size=8, lr=1e-2, warmup=0, weight_decay=0.5, train_only="qk-column:0")
    res = train(bridge, TOK, TASK, config, progress=False)
    after = {n: p.detach().clone() for n, p in bridge.named_parameters()}
    old, new = hooked_view(bridge, before), hooked_view(bridge, after)
    for name in old:
        moved = old[name] != new[name]
        if name.rsplit(".", 1)[-1] in ("W_Q", "W_K"):
            assert not moved[..., 1:].any(), name
            assert moved[..., 0].float().mean() > 0.9, name  # every head's column 0 trains
        else:
            assert not moved.any(), name
    untouched = [n for n in before if not any(k in n for k in (".q.", ".k."))]  # bias, fused copy, everything else
    assert all(torch.equal(before[n], after[n]) for n in untouched)
    assert res.history[0]["trainable"] == 2 * L * H * D


def losses(model, spec: str) -> list[float]:
    config = TrainConfig.scratch(steps=4, batch_size=8, lr=3e-3, warmup=0, seed=7, train_only=spec, log_every=1)
    return [r["loss"] for r in train(model, TOK, TASK, config, progress=False).history if r["kind"] == "train"]


@pytest.mark.hooked
@pytest.mark.parametrize("spec", ["qk-column:0", "qk-pair:1", "attn", "mlp"])
def test_training_from_one_checkpoint_gives_the_same_losses_on_both_backends(checkpoint, spec):
    hooked = models.load(checkpoint[0], device="cpu", backend="hooked").model
    bridge = bridge_of(checkpoint)
    start = {n: p.detach().clone() for n, p in hooked.named_parameters()}
    a, b = losses(hooked, spec), losses(bridge, spec)
    assert len(a) == 4 and any(not torch.equal(p, start[n]) for n, p in hooked.named_parameters())  # it trains
    assert all(math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6) for x, y in zip(a, b)), (a, b)
    got = hooked_view(bridge, {n: p.detach() for n, p in bridge.named_parameters()})
    want = dict(hooked.named_parameters())
    for name, t in got.items():
        w = want[name].detach()
        if name.endswith("b_K"):  # unrotated key-bias columns shift a whole score row: their gradient is zero but
            t, w = t[..., : rotary_of(hooked).dim], w[..., : rotary_of(hooked).dim]  # for rounding, Adam scales it
        torch.testing.assert_close(t, w, atol=2e-5, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_qk_groups_on_grouped_query_bridges(arch, tmp_path):
    """Llama and Qwen2 (4 query heads, 2 key heads; Qwen2's projections have biases): on the bridge the groups mask
    rows h * d_head + c of q_proj and k_proj; on 3.9 those are the entries of the hooked model's W_Q and _W_K."""
    from tests.models.hf_fixtures import save_random_model

    save_random_model(arch, tmp_path / arch)
    bridge = models.load(tmp_path / arch, device="cpu", backend="bridge").model
    hooked = models.load(tmp_path / arch, device="cpu", backend="hooked").model if models.has_hooked() else None
    d_head, half = bridge.cfg.d_head, rotary_of(bridge).dim // 2
    for spec, cols in (("qk-column:3", [3]), ("qk-pair:1", [1, 1 + half]), ("qk", list(range(d_head)))):
        masks = group_masks(bridge, spec)
        assert len(masks) == 2 * bridge.cfg.n_layers and all(n.endswith("weight") for n in masks)
        for name, m in masks.items():
            per_head = einops.rearrange(m, "(n h) m -> n m h", h=d_head)  # TransformerLens's [head, d_model, d_head]
            assert per_head[..., cols].all() and per_head.sum() == per_head[..., cols].numel(), (spec, name)
        if hooked is not None:
            want = group_masks(hooked, spec)
            got = {f"blocks.{n.split('layers.')[1].split('.')[0]}.attn.{'W_Q' if '.q' in n else '_W_K'}":
                   einops.rearrange(m, "(n h) m -> n m h", h=d_head) for n, m in masks.items()}
            assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want), spec
            assert trainable_count(bridge, spec)[0] == trainable_count(hooked, spec)[0]
            assert pair_frequency(bridge, 1) == pytest.approx(pair_frequency(hooked, 1), rel=1e-12)
