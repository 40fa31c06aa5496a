"""The fused forward (`aspan.models.fused`): the same logits and gradients as the hooked forward on the same weights,
per positional encoding, under ABC and ABS biases and on the loaded architectures' configs; padding that changes no
scored row; and the hooked forward, said once, for everything it does not cover."""
import logging
import math

import pytest
import torch
import torch.nn.functional as F

import hooks
from aspan import models, tasks
from aspan.batching import make_batch
from aspan.experiments import abc
from aspan.models import fused
from aspan.models.build import build
from aspan.tokenization import CharTokenizer

TOK = CharTokenizer()
TASK = tasks.get("reversal", length=(2, 6), charset="abcd")
ENCODINGS = ["rotary", "learned", "alibi", "none"]
TOL = dict(atol=1e-5, rtol=1e-5)


def jitter(model, seed: int = 0):
    """Non-trivial biases and norm weights (a fresh model's are 0 and 1, which would hide a missing term)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 or name.endswith(("b_Q", "b_K", "b_V")):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


def tiny(positional="rotary", seed=0):
    torch.set_num_threads(1)
    return jitter(models.tiny(TOK, n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=48, seed=seed, device="cpu",
                              positional=positional))


def batch(n=5, seed=1):
    return make_batch(TASK.generate(n, seed=seed), TOK)


def hooked_logits(model, tokens, fwd_hooks=()):
    with model.hooks(fwd_hooks=list(fwd_hooks)):
        return model(tokens)


def loss_and_grads(model, forward, tokens, labels):
    """(logits, {name: gradient}) of the mean cross-entropy against `labels` on every row."""
    model.zero_grad(set_to_none=True)
    out = forward(tokens)
    F.cross_entropy(out.flatten(0, 1), labels.flatten()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def assert_same_function(model, fwd_hooks=(), b=None):
    b = b or batch()
    labels = torch.randint(0, model.cfg.d_vocab, b.tokens.shape, generator=torch.Generator().manual_seed(0))
    assert fused.why_not(model, fwd_hooks) is None
    ref, ref_g = loss_and_grads(model, lambda t: hooked_logits(model, t, fwd_hooks), b.tokens, labels)
    out, g = loss_and_grads(model, lambda t: fused.logits(model, t, fwd_hooks), b.tokens, labels)
    torch.testing.assert_close(out, ref, **TOL)
    assert g.keys() == ref_g.keys() and len(g) >= 10  # every parameter the hooked forward trains gets a gradient
    for name in ref_g:
        torch.testing.assert_close(g[name], ref_g[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


def abc_hooks(model, b):
    """ABC (Duan & Shi 2023) as aspan builds it: per head, kept lines of several directions; some heads unbiased."""
    lines = {(0, 0): abc.HeadLines({"diagonal": (0, 1)}), (0, 2): abc.HeadLines({"anti": (0, 1), "vertical": (0,)}),
             (1, 1): abc.HeadLines({"anti": (-1, 0, 1)}, prompt={"diagonal": (0, 1, 2)})}
    return abc.abc_bias(lines, model)(b)


def abs_hooks(model, b):
    """ABS: a window of anti-diagonals around the reversal's references on every head."""
    return abc.abs_bias(model, "anti", 0, 1)(b)


@pytest.mark.parametrize("positional", ENCODINGS)
def test_logits_and_gradients_equal_the_hooked_forward(positional):
    assert_same_function(tiny(positional))


@pytest.mark.parametrize("positional", ENCODINGS)
@pytest.mark.parametrize("make", [abc_hooks, abs_hooks], ids=["abc", "abs"])
def test_abc_and_abs_biases_become_the_mask(positional, make):
    model, b = tiny(positional), batch()
    fwd = make(model, b)
    assert all(isinstance(fn, hooks.BiasHook) for _, fn in fwd)
    assert not torch.allclose(hooked_logits(model, b.tokens, fwd), hooked_logits(model, b.tokens), atol=1e-3)
    assert_same_function(model, fwd, b)


def test_tensor_biases_on_some_heads_and_every_layer():
    """`hooks.attn_bias` tensors of every shape it takes ([q,k], [head,q,k], [batch,head,q,k]) on chosen heads,
    two on one layer, and one tensor shared by every layer (the ABC paper protocol's form)."""
    model, b = tiny("learned"), batch()
    g = torch.Generator().manual_seed(3)
    p = b.tokens.shape[1]
    fwd = (hooks.attn_bias(torch.randn(p + 2, p + 2, generator=g), heads=[(0, 1), (1, 3)], model=model)
           + hooks.attn_bias(torch.randn(2, p, p, generator=g), layers=0, heads=[2, 0], model=model)
           + hooks.attn_bias(torch.randn(len(b), 4, p, p, generator=g), layers=1, model=model)
           + hooks.attn_bias(-3 * torch.rand(4, p, p, generator=g), model=model))
    assert_same_function(model, fwd, b)


def test_a_bias_tensor_changed_in_place_changes_the_mask():
    """The mask of a tensor bias is kept between forwards; a bias edited in place (or another tensor) is a new one."""
    model, b = tiny("alibi"), batch()
    p = b.tokens.shape[1]
    bias = torch.randn(4, p, p, generator=torch.Generator().manual_seed(5))
    fwd = hooks.attn_bias(bias, model=model)
    first = fused.logits(model, b.tokens, fwd)
    torch.testing.assert_close(first, hooked_logits(model, b.tokens, fwd), **TOL)
    bias.mul_(-2.0)
    second = fused.logits(model, b.tokens, fwd)
    assert not torch.allclose(first, second, atol=1e-3)
    torch.testing.assert_close(second, hooked_logits(model, b.tokens, fwd), **TOL)
    torch.testing.assert_close(fused.logits(model, b.tokens, hooks.attn_bias(torch.zeros(p, p), model=model)),
                               hooked_logits(model, b.tokens), **TOL)


def test_rows_a_bias_masks_whole_are_zero_as_in_the_hooked_forward():
    """A row whose every key is -inf: TransformerLens turns its NaN pattern into 0; so does the fused forward
    (without a NaN anywhere, gradients included)."""
    model, b = tiny(), batch()
    p = b.tokens.shape[1]
    bias = torch.zeros(p, p)
    bias[3] = -math.inf
    fwd = hooks.attn_bias(bias, layers=0, heads=[1], model=model)
    ref = hooked_logits(model, b.tokens, fwd)
    out = fused.logits(model, b.tokens, fwd)
    torch.testing.assert_close(out, ref, **TOL)
    out.sum().backward()
    assert all(torch.isfinite(q.grad).all() for q in model.parameters() if q.grad is not None)


def config(**kw):
    from transformer_lens import HookedTransformerConfig

    base = dict(n_layers=2, d_model=32, n_heads=4, d_head=8, d_mlp=64, n_ctx=48, d_vocab=TOK.vocab_size,
                act_fn="gelu", normalization_type="LN", positional_embedding_type="rotary", rotary_dim=8, seed=0,
                device="cpu", default_prepend_bos=False)
    return HookedTransformerConfig(**{**base, **kw})


LOADED = {  # the forms of the checkpoints aspan loads, and the other switches the fused forward covers
    "llama": dict(normalization_type="RMS", act_fn="silu", gated_mlp=True, n_key_value_heads=2, final_rms=True),
    "neox": dict(parallel_attn_mlp=True, rotary_dim=4, act_fn="gelu_new"),
    "adjacent_pairs": dict(rotary_adjacent_pairs=True, normalization_type="LNPre", act_fn="relu"),
    "attn_only_rms_pre": dict(attn_only=True, normalization_type="RMSPre", positional_embedding_type="standard"),
    "layer_scaled": dict(scale_attn_by_inverse_layer_idx=True, use_attn_scale=True, attn_scale=3.0,
                         act_fn="gelu_fast"),
}


@pytest.mark.parametrize("name", LOADED)
def test_loaded_architectures(name):
    torch.manual_seed(0)
    assert_same_function(jitter(build(config(**LOADED[name]))))


def test_padding_after_a_sample_changes_none_of_its_rows():
    """Right padding: every sample's rows in a padded batch equal its rows run alone (with a per-sample ABC bias)."""
    for positional in ("rotary", "alibi"):
        model, b = tiny(positional), batch(6, seed=4)
        assert len(set(b.lengths.tolist())) > 2
        out = fused.logits(model, b.tokens, abc_hooks(model, b))
        for i, s in enumerate(b.samples):
            one = make_batch([s], TOK)
            alone = fused.logits(model, one.tokens, abc_hooks(model, one))[0]
            n = int(b.lengths[i])
            torch.testing.assert_close(out[i, :n], alone[:n], **TOL)


def test_an_unrelated_hook_runs_the_hooked_forward_and_says_so_once(caplog):
    model, b = tiny(), batch()
    double = [("blocks.0.attn.hook_q", lambda q, hook: 2 * q)]
    assert "hook_q" in fused.why_not(model, double)
    with caplog.at_level(logging.DEBUG, logger="aspan.models.fused"):
        for _ in range(3):
            out = fused.logits(model, b.tokens, double)
    torch.testing.assert_close(out, hooked_logits(model, b.tokens, double))
    assert not torch.allclose(out, hooked_logits(model, b.tokens), atol=1e-4)
    said = [r.getMessage() for r in caplog.records if "hooked forward" in r.getMessage()]
    assert len(said) == 1 and "blocks.0.attn.hook_q" in said[0] and "not an attention bias" in said[0]


def test_hooks_attached_to_the_model_are_not_skipped():
    model, b = tiny(), batch()
    model.blocks[1].hook_resid_mid.add_hook(lambda x, hook: 0.5 * x)
    try:
        assert "blocks.1.hook_resid_mid" in fused.why_not(model)
        torch.testing.assert_close(fused.logits(model, b.tokens), model(b.tokens))
    finally:
        model.reset_hooks()
    assert fused.why_not(model) is None


@pytest.mark.parametrize("change", ["act_fn", "bidirectional", "module"])
def test_an_uncovered_model_runs_the_hooked_forward(change, caplog):
    torch.manual_seed(0)
    if change == "module":  # a component replaced by a subclass that computes something else
        model = build(config())

        class Doubled(type(model.blocks[0].mlp)):
            def forward(self, x):
                return 2 * super().forward(x)

        old = model.blocks[0].mlp
        model.blocks[0].mlp = Doubled(model.cfg)
        model.blocks[0].mlp.load_state_dict(old.state_dict())
    else:
        model = build(config(act_fn="solu_ln") if change == "act_fn" else config(attention_dir="bidirectional"))
    b = batch()
    with caplog.at_level(logging.DEBUG, logger="aspan.models.fused"):
        out = fused.logits(model, b.tokens)
    assert "not covered" in fused.why_not(model)
    torch.testing.assert_close(out, model(b.tokens))
    assert any("hooked forward" in r.getMessage() and "not covered" in r.getMessage() for r in caplog.records)


def test_a_transformer_bridge_runs_its_hooked_forward():
    class Bridge(torch.nn.Module):  # stands in for a TransformerBridge: not a HookedTransformer
        pass

    assert "not a TransformerLens HookedTransformer" in fused.why_not(Bridge())


def test_the_training_module_trains_the_models_own_parameters():
    model = tiny()
    net = fused.TrainingForward(model)
    assert [id(p) for p in net.parameters()] == [id(p) for p in model.parameters()]
    b = batch()
    net(b.tokens, []).sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters())
