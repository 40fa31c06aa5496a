"""Reinforcement (Spiegel et al. 2025, Appendix F): brute-force edits, hand-made patterns, per-element masks,
KV-cached decoding, hook hygiene."""
import pytest
import torch

import hooks
from aspan.evaluation import cached_step
from hooks.reinforce import edit_pattern
from tests.conftest import hooked_model, padded_batch


def brute_edit(P, mask, heads_of_layer, C, tau=None, renorm=False):
    """The reinforcement edit written out with Python loops over (batch, head, row, key)."""
    P = P.clone()
    b, _, q, k = P.shape
    for i in range(b):
        for h in heads_of_layer:
            for r in range(q):
                if not mask[i, r].any():
                    continue
                orig = P[i, h, r].clone()
                touched = False
                for c in range(k):
                    if mask[i, r, c] and (tau is None or orig[c] > tau):
                        P[i, h, r, c] = orig[c] + C
                        touched = C != 0
                s = P[i, h, r].sum()
                if renorm and touched and s != 0:
                    P[i, h, r] = P[i, h, r] / s
    return P


def brute_hooks(heads, mask, C, tau=None, renorm=False):
    layers = sorted({layer for layer, _ in heads})

    def make(layer):
        return lambda P, hook: brute_edit(P, mask, [h for l_, h in heads if l_ == layer], C, tau, renorm)

    return [(f"blocks.{layer}.attn.hook_pattern", make(layer)) for layer in layers]


HEADS = [(0, 1), (1, 3), (2, 0), (2, 2)]
RENORMALIZE = hooks.ReinforceOptions(renormalize=True)
OPTIONS = hooks.ReinforceOptions(threshold=0.02, renormalize=True)


@pytest.mark.parametrize("tau,renorm", [(None, False), (0.1, False), (None, True), (0.05, True)])
def test_reinforce_equals_brute_force_in_the_model(any_model, tau, renorm):
    model = any_model
    tokens, am, mask = padded_batch([10, 7], seed=1)
    fwd = hooks.reinforce(HEADS, mask, 0.7, model=model,
                          options=hooks.ReinforceOptions(threshold=tau, renormalize=renorm))
    got = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=fwd)
    expected = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=brute_hooks(HEADS, mask, 0.7, tau, renorm))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["rotary", "standard"])
def test_last_layer_edit_recomputed_by_hand(kind):
    """Edit the cached last-layer pattern by hand and push it through W_O, the MLP, ln_final and unembed."""
    model = hooked_model(kind)
    L = model.cfg.n_layers - 1
    tokens, am, mask = padded_batch([11, 11], seed=2)
    heads = [(L, 0), (L, 3)]
    _, cache = model.run_with_cache(tokens)

    def by_hand(P):
        blk = model.blocks[L]
        z = torch.einsum("bhqk,bkhd->bqhd", P, cache["v", L])
        attn_out = torch.einsum("bqhd,hdm->bqm", z, blk.attn.W_O) + blk.attn.b_O
        mid = cache["resid_pre", L] + attn_out
        post = mid + blk.mlp(blk.ln2(mid))
        return model.unembed(model.ln_final(post))

    with torch.no_grad():
        plain = by_hand(cache["pattern", L])
        torch.testing.assert_close(plain, model(tokens), atol=1e-5, rtol=1e-5)  # the recomputation is faithful
        edited = by_hand(brute_edit(cache["pattern", L], mask, [0, 3], 1.5, 0.02, True))
        got = model.run_with_hooks(tokens, fwd_hooks=hooks.reinforce(heads, mask, 1.5, options=OPTIONS))
    torch.testing.assert_close(got, edited, atol=1e-5, rtol=1e-5)


def test_edit_changes_logits_and_zero_strength_is_bit_identical(model):
    tokens, am, mask = padded_batch([12, 9], seed=3)
    plain = model(tokens, attention_mask=am)
    for tau, renorm in [(None, False), (0.0, True)]:
        options = hooks.ReinforceOptions(threshold=tau, renormalize=renorm)
        fwd = hooks.reinforce(HEADS, mask, 0.0, options=options)
        zero = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=fwd)
        assert torch.equal(zero, plain)
    for head in HEADS:
        edited = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=hooks.reinforce([head], mask, 1.0))
        rows = mask.any(-1)
        assert (edited - plain).abs().amax(-1)[rows].max() > 1e-3
        first = int(mask.any(-1).float().argmax(-1).min())
        assert torch.equal(edited[:, :first], plain[:, :first])  # rows before the first referencing row are untouched


def test_batched_equals_one_by_one_with_own_masks(model):
    lengths = [12, 6, 9]
    tokens, am, mask = padded_batch(lengths, seed=4)
    options = hooks.ReinforceOptions(threshold=0.05, renormalize=True)
    fwd = hooks.reinforce(HEADS, mask, 0.8, options=options)
    batched = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=fwd)
    for i, n in enumerate(lengths):
        one = model.run_with_hooks(tokens[i : i + 1, :n],
                                   fwd_hooks=hooks.reinforce(HEADS, mask[i : i + 1, :n, :n], 0.8, options=options))
        torch.testing.assert_close(batched[i, :n], one[0], atol=1e-5, rtol=1e-5)


def test_delta_is_a_shifted_mask(model):
    tokens, am, mask = padded_batch([12, 12], seed=5)
    for d in (-1, 2):
        a = model.run_with_hooks(tokens, fwd_hooks=hooks.reinforce(HEADS, mask, 1.0, delta=d))
        b = model.run_with_hooks(tokens, fwd_hooks=hooks.reinforce(HEADS, hooks.shift_mask(mask, d), 1.0))
        assert torch.equal(a, b)


def test_hand_made_patterns_gate_and_renormalise():
    P = torch.tensor([[[0.5, 0.0, 0.0], [0.6, 0.4, 0.0], [0.0, 0.0, 0.0]]])[None]  # [1, 1, 3, 3]; row 2 all zero
    M = torch.tensor([[[False, False, False], [True, True, False], [True, True, False]]])
    plain = edit_pattern(P, M, 1.0)
    torch.testing.assert_close(plain[0, 0], torch.tensor([[0.5, 0, 0], [1.6, 1.4, 0], [1.0, 1.0, 0]]))
    gated = edit_pattern(P, M, 1.0, threshold=0.5)  # only 0.6 > 0.5 gets the boost
    torch.testing.assert_close(gated[0, 0], torch.tensor([[0.5, 0, 0], [1.6, 0.4, 0], [0, 0, 0]]))
    renorm = edit_pattern(P, M, 1.0, threshold=0.5, renormalize=True)
    torch.testing.assert_close(renorm[0, 0], torch.tensor([[0.5, 0, 0], [0.8, 0.2, 0], [0, 0, 0]]))  # zero row stays 0
    assert not renorm.isnan().any()
    renorm_all = edit_pattern(P, M, 2.0, renormalize=True)
    torch.testing.assert_close(renorm_all[0, 0, 1], torch.tensor([2.6, 2.4, 0]) / 5)
    torch.testing.assert_close(renorm_all[0, 0, 2], torch.tensor([0.5, 0.5, 0]))
    assert torch.equal(P[0, 0, 2], torch.zeros(3))  # the input is not modified
    for dtype in (torch.bfloat16, torch.float64):
        out = edit_pattern(P.to(dtype), M, 1.0, renormalize=True)
        assert out.dtype == dtype


def test_kv_cached_greedy_decoding_matches_teacher_forcing(any_model):
    model = any_model
    prompt_len, new = 6, 8
    tokens, _, mask = padded_batch([prompt_len + new] * 2, seed=6)
    prompt = tokens[:, :prompt_len]
    for options in [None, hooks.ReinforceOptions(threshold=0.05, renormalize=True)]:
        fwd = hooks.reinforce(HEADS, mask, 1.2, options=options)
        fwd += hooks.attn_bias(hooks.offset_bias(torch.linspace(0, -1, 5).repeat(2, 1), fill=-2.0),
                               layers=[1], heads=[0, 2])
        step = cached_step(model, 2, model.cfg.device)  # TransformerLens's KV cache, or Hugging Face's on a bridge
        step_logits, seq = [], prompt
        with torch.no_grad(), model.hooks(fwd_hooks=fwd):
            logits = step(prompt, prompt_len)
            for _ in range(new):
                nxt = logits[:, -1].argmax(-1, keepdim=True)
                step_logits.append(logits[:, -1])
                seq = torch.cat([seq, nxt], 1)
                logits = step(nxt, seq.shape[1])
            full = model(seq)
        for j, lg in enumerate(step_logits):
            torch.testing.assert_close(lg, full[:, prompt_len - 1 + j], atol=1e-5, rtol=1e-5)
        plain = model(seq)
        assert (plain - full).abs().max() > 1e-3  # the hooks were really active


def test_hooks_gone_after_exception(model):
    tokens, _, mask = padded_batch([8], seed=7)
    plain = model(tokens)
    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks(fwd_hooks=hooks.reinforce(HEADS, mask, 1.0)):
            model(tokens)
            raise RuntimeError("boom")
    assert all(not hp._forward_hooks for hp in model.hook_dict.values())
    assert torch.equal(model(tokens), plain)


def test_gradients_flow_through_edits(model):
    tokens, _, mask = padded_batch([9], seed=8)
    model.zero_grad()
    loss = (
        model.run_with_hooks(tokens, fwd_hooks=hooks.reinforce(HEADS, mask, 1.0, options=RENORMALIZE))
        .logsumexp(-1).sum()
    )
    loss.backward()
    grads = [p.grad for p in model.blocks[0].attn.parameters()]  # W_Q on a HookedTransformer, q/k/v on a bridge
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    model.zero_grad()
