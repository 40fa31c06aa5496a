"""Causal head profiling: exact effects, the attribution estimate, greedy selection, metrics and the rankings table."""
import math

import pandas as pd
import pytest
import torch
from transformer_lens import HookedTransformerConfig

from aspan import evaluation, models, tasks
from aspan.batching import make_batch
from aspan.experiments import profiling as P
from aspan.experiments.ranking import rank_heads

USEFUL = (0, 2)  # the one head built to copy the reference token


@pytest.fixture(scope="module")
def copy_model(tok):
    """One attention-only layer, uniform attention (W_Q = W_K = 0), one-hot residual stream (W_E = W_U = I).

    Head 2 writes the token it attends to (W_V = I): more attention on the reference raises the target's logit.
    The other heads write a *different* token (W_V a permutation without fixed points): more attention on the
    reference raises a wrong token's logit. So USEFUL is the only head whose reinforcement helps, by construction.
    """
    v = tok.vocab_size
    cfg = HookedTransformerConfig(n_layers=1, d_model=v, n_ctx=64, d_head=v, n_heads=4, d_vocab=v, attn_only=True,
                                  normalization_type=None, positional_embedding_type="standard", act_fn="relu",
                                  default_prepend_bos=False, device="cpu")
    model = models.build(cfg)
    eye, perm = torch.eye(v), torch.eye(v).roll(1, dims=1)
    sd = {k: torch.zeros_like(t) for k, t in model.state_dict().items()}
    sd["embed.W_E"], sd["unembed.W_U"] = eye.clone(), eye.clone()
    sd["blocks.0.attn.W_V"] = torch.stack([eye if h == USEFUL[1] else perm for h in range(4)])
    sd["blocks.0.attn.W_O"] = torch.stack([8.0 * eye] * 4)
    for k, t in model.state_dict().items():
        if k.endswith(("IGNORE", "mask")):  # TransformerLens' causal-mask buffers keep their values
            sd[k] = t
    model.load_state_dict(sd)
    return model.eval()


@pytest.fixture(scope="module")
def f64_model(tok):
    model = models.tiny(tok, n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=64, seed=1, device="cpu")
    model.cfg.dtype = torch.float64
    return model.to(torch.float64).eval()


@pytest.fixture(scope="module")
def ood_samples():
    return tasks.preset("reversal", "ood", length=(11, 14)).generate(12, seed=5)


def test_exact_profiling_ranks_the_constructed_head_first(copy_model, tok, id_samples):
    edit = P.Edit("reinforce", strength=1.0)
    for metric in ("logprob", "partial"):
        table = P.profile(copy_model, tok, id_samples, edit, P.ProfileConfig(metric=metric, batch_size=4))
        assert table.effect.notna().all()
        first = table.sort_values("effect_rank").iloc[0]
        assert (int(first.layer), int(first["head"])) == USEFUL
        others = table[table["head"] != USEFUL[1]].effect
        if metric == "logprob":  # the copy head helps, every other head hurts
            assert first.effect > 0 and (others < 0).all()
        else:
            assert first.effect >= others.max()
    assert P.top_heads(table, 1) == [USEFUL]


def test_greedy_selection_picks_the_constructed_head_and_stops(copy_model, tok, id_samples):
    batches = P.selection_batches(copy_model, tok, id_samples, batch_size=5)
    all_heads = [(0, h) for h in range(4)]
    chosen = P.greedy_select(copy_model, batches, P.Edit("reinforce", strength=1.0), all_heads, k=3)
    by_name = P.greedy_select(copy_model, batches, P.Edit("reinforce", strength=1.0), all_heads, 3, "exact")
    pd.testing.assert_frame_equal(by_name, P.greedy_select(copy_model, batches, P.Edit("reinforce", strength=1.0),
                                                           all_heads, 3, P.GreedyRule("exact")))
    assert by_name.attrs["metric"] == "exact"
    assert list(zip(chosen.layer, chosen["head"])) == [USEFUL]  # adding any other head hurts
    assert chosen.gain.iloc[0] > 0
    assert chosen.value.iloc[0] == pytest.approx(chosen.attrs["baseline"] + chosen.gain.iloc[0])


def test_greedy_selection_matches_brute_force_first_step(f64_model, tok, ood_samples):
    batches = P.selection_batches(f64_model, tok, ood_samples, batch_size=6)
    edit = P.Edit("reinforce", delta=1, strength=2.0)
    heads = [(l, h) for l in range(2) for h in range(4)]
    chosen = P.greedy_select(f64_model, batches, edit, heads, k=2, rule=P.GreedyRule(min_gain=-math.inf))
    effects = P.exact_effects(f64_model, batches, edit, heads)
    best = max(heads, key=lambda h: effects[h])
    assert (int(chosen.layer[0]), int(chosen["head"][0])) == best
    pair = [(int(l), int(h)) for l, h in zip(chosen.layer, chosen["head"])]
    assert len(pair) == 2 and pair[0] != pair[1]
    value = P.measure(f64_model, batches, lambda b: edit.on(pair).hooks(b.ref_mask, f64_model))
    assert chosen.value.iloc[1] == pytest.approx(value, abs=1e-12)


@pytest.mark.parametrize("edit", [
    P.Edit("reinforce", delta=0, strength=1e-4),
    P.Edit("reinforce", delta=1, strength=1e-4, renormalize=True),
    P.Edit("steer", delta=2, strength=1 - 1e-4),
])
def test_attribution_equals_finite_difference_for_a_tiny_edit(f64_model, tok, ood_samples, edit):
    batches = P.selection_batches(f64_model, tok, ood_samples, batch_size=5)
    est = P.attribution(f64_model, batches, edit)
    heads = [(l, h) for l in range(2) for h in range(4)]
    exact = P.exact_effects(f64_model, batches, edit, heads, metric="logprob")
    fd = torch.tensor([[exact[(l, h)] for h in range(4)] for l in range(2)], dtype=torch.float64)
    assert fd.abs().max() > 1e-7  # the edit does something measurable
    torch.testing.assert_close(est, fd, rtol=2e-3, atol=1e-9)
    assert all(p.requires_grad for p in f64_model.parameters())  # flags restored
    assert all(p.grad is None for p in f64_model.parameters())  # no weight gradients accumulated


def test_attribution_is_batch_invariant_and_linear_in_strength(f64_model, tok, ood_samples):
    one = P.attribution(f64_model, P.selection_batches(f64_model, tok, ood_samples, 12), P.Edit("reinforce", 1, 1.0))
    split = P.attribution(f64_model, P.selection_batches(f64_model, tok, ood_samples, 5), P.Edit("reinforce", 1, 1.0))
    torch.testing.assert_close(one, split)
    three = P.attribution(f64_model, P.selection_batches(f64_model, tok, ood_samples, 12), P.Edit("reinforce", 1, 3.0))
    torch.testing.assert_close(three, 3 * one)


def test_metrics_agree_with_evaluate(tiny_model, tok, ood_samples):
    """The vectorised partial / exact accuracy equal `evaluation.evaluate`, with and without an edit."""
    batches = P.selection_batches(tiny_model, tok, ood_samples, batch_size=5)
    edit = P.Edit("patch", delta=1)
    heads = [(1, 0), (1, 3)]
    for hooks_fn in (None, lambda b: edit.on(heads).hooks(b.ref_mask, tiny_model)):
        res = evaluation.evaluate(tiny_model, tok, ood_samples, fwd_hooks=hooks_fn or (), attn=False).summary()
        assert P.measure(tiny_model, batches, hooks_fn, "partial") == pytest.approx(res["partial"], abs=1e-6)
        assert P.measure(tiny_model, batches, hooks_fn, "exact") == pytest.approx(res["exact"], abs=1e-6)
    # logprob: brute force, one sample at a time
    want = []
    for s in ood_samples:
        b = make_batch([s], tok)
        with torch.no_grad():
            lp = tiny_model(b.tokens).log_softmax(-1)[0]
        rows = torch.nonzero(b.target_rows[0]).flatten()[: len(s.target)]
        want.append(float(lp[rows, b.labels[0, rows]].mean()))
    assert P.measure(tiny_model, batches, None, "logprob") == pytest.approx(sum(want) / len(want), abs=1e-5)


def test_edit_patterns_brute_force(tok):
    g = torch.Generator().manual_seed(0)
    pattern = torch.rand(2, 3, 5, 5, generator=g).tril()
    pattern = pattern / pattern.sum(-1, keepdim=True)
    mask = torch.zeros(2, 5, 5, dtype=torch.bool)
    mask[0, 3, [0, 2]] = True
    mask[1, 4, 1] = True
    patched = P.Edit("patch").apply(pattern, mask)
    steered = P.Edit("steer", strength=0.1).apply(pattern, mask)
    for b in range(2):
        for q in range(5):
            refs = mask[b, q]
            for h in range(3):
                row = pattern[b, h, q]
                if not refs.any():
                    assert torch.equal(patched[b, h, q], row) and torch.equal(steered[b, h, q], row)
                    continue
                torch.testing.assert_close(patched[b, h, q], refs.float() / refs.sum())
                scaled = torch.where(refs, row, 0.1 * row)
                torch.testing.assert_close(steered[b, h, q], scaled / scaled.sum())


@pytest.mark.parametrize("edit", [
    P.Edit("reinforce", delta=2, strength=1.5, renormalize=True),
    P.Edit("reinforce", delta=0, strength=2.0, beyond=15, below=0.3),
    P.Edit("patch", delta=1),
    P.Edit("patch", delta=2, beyond=14, below=0.5),
    P.Edit("steer", delta=-1, strength=0.05),
    P.Edit("steer", delta=1, strength=0.2, beyond=16, below=0.4),
])
def test_library_hooks_equal_the_pure_edit(tiny_model, tok, ood_samples, edit):
    """`Edit.hooks` (the hooks package) and `Edit.apply` (what the attribution differentiates) are one edit."""
    b = make_batch(ood_samples, tok)
    heads = [(0, 1), (1, 2)]
    with torch.no_grad():
        lib = tiny_model.run_with_hooks(b.tokens, attention_mask=b.attention_mask,
                                        fwd_hooks=edit.on(heads).hooks(b.ref_mask))
        ours = tiny_model.run_with_hooks(b.tokens, attention_mask=b.attention_mask,
                                         fwd_hooks=P.pattern_hooks(edit.on(heads), b.ref_mask))
        plain = tiny_model(b.tokens, attention_mask=b.attention_mask)
    torch.testing.assert_close(lib, ours, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(plain, ours)


def test_profile_candidates_profile_only_the_top_estimates(tiny_model, tok, ood_samples):
    edit = P.Edit("reinforce", delta=1, strength=1.0)
    table = P.profile(tiny_model, tok, ood_samples, edit, P.ProfileConfig(candidates=3, batch_size=6))
    profiled = table[table.effect.notna()]
    assert len(profiled) == 3 and set(profiled.estimate_rank) == {1, 2, 3}
    assert table.effect_rank.notna().sum() == 3
    assert table.attrs["n_profiled"] == 3 and math.isfinite(table.attrs["spearman"])
    full = P.profile(tiny_model, tok, ood_samples, edit, P.ProfileConfig(batch_size=6))
    part = profiled.set_index(["layer", "head"]).effect
    pd.testing.assert_series_equal(full.set_index(["layer", "head"]).effect.loc[part.index], part, atol=1e-6)
    rho, _ = P.spearman(full.estimate, full.effect)
    assert rho == pytest.approx(full.attrs["spearman"])


def test_compare_rankings_table(tiny_model, tok, id_samples, ood_samples):
    share = rank_heads(tiny_model, tok, id_samples, deltas=[1])
    prof = P.profile(tiny_model, tok, ood_samples, P.Edit("reinforce", delta=1), P.ProfileConfig(batch_size=6))
    table = P.compare_rankings(share, prof, delta=1)
    assert len(table) == 8 and list(table.effect_rank) == list(range(1, 9))
    merged = table.merge(share, on=["layer", "head"])
    assert (merged.paper_rank == merged["rank"]).all() and (merged.share == merged["score_row_d1"]).all()
    assert set(table.share_rank) == set(range(1, 9))
    assert -1 <= table.attrs["spearman_share_vs_effect"] <= 1
    with pytest.raises(ValueError, match="offset 3"):
        P.compare_rankings(share, prof, delta=3)


def test_bad_input():
    with pytest.raises(ValueError, match="unknown edit method"):
        P.Edit("shout")
    with pytest.raises(ValueError, match="alpha"):
        P.Edit("steer", strength=2.0)
    with pytest.raises(ValueError, match="finite"):
        P.Edit("reinforce", strength=float("nan"))
    with pytest.raises(ValueError, match="candidates"):
        P.ProfileConfig(candidates=0).check(8)
    with pytest.raises(ValueError, match="metric"):
        P.ProfileConfig(metric="loss").check(8)


def test_bad_heads_fail_before_work(tiny_model, tok, ood_samples):
    batches = P.selection_batches(tiny_model, tok, ood_samples[:2])
    with pytest.raises(ValueError, match="out of range"):
        P.exact_effects(tiny_model, batches, P.Edit(), [(5, 0)])
    with pytest.raises(ValueError, match="k must be"):
        P.greedy_select(tiny_model, batches, P.Edit(), [(0, 0)], k=0)
    with pytest.raises(ValueError, match="empty"):
        P.selection_batches(tiny_model, tok, [])


def test_gates_brute_force():
    g = torch.Generator().manual_seed(1)
    pattern = torch.rand(1, 2, 6, 6, generator=g).tril()
    pattern = pattern / pattern.sum(-1, keepdim=True)
    mask = torch.zeros(1, 6, 6, dtype=torch.bool)
    mask[0, 2, 0] = mask[0, 4, 1] = mask[0, 5, 3] = True
    for method in ("reinforce", "patch", "steer"):
        strength = {"steer": 0.5, "patch": None}.get(method, 1.0)  # patch takes no strength
        full = P.Edit(method, strength=strength).apply(pattern, mask)
        beyond = P.Edit(method, strength=strength, beyond=3).apply(pattern, mask)
        assert torch.equal(beyond[:, :, :4], pattern[:, :, :4]) and torch.equal(beyond[:, :, 4:], full[:, :, 4:])
        below = P.Edit(method, strength=strength, below=0.3).apply(pattern, mask)
        for h in range(2):
            for q in range(6):
                weak = float((pattern[0, h, q] * mask[0, q]).sum()) < 0.3
                torch.testing.assert_close(below[0, h, q], full[0, h, q] if weak else pattern[0, h, q])
    # under a KV cache the last q rows of k positions are edited with the same absolute gate
    tail = P.Edit("patch", beyond=3).apply(pattern[:, :, 3:], mask[:, 3:])
    torch.testing.assert_close(tail, P.Edit("patch", beyond=3).apply(pattern, mask)[:, :, 3:])
    assert "rows > 3" in P.Edit("patch", beyond=3).label


def test_gate_beyond_training_rows_leaves_id_untouched(tiny_model, tok, id_samples, ood_samples):
    longest = max(tok.offset + len(s.text) for s in id_samples)  # rows past every ID target row
    edit = P.Edit("patch", delta=1, beyond=longest, heads=[(0, 1), (1, 2)])
    for samples, same in ((id_samples, True), (ood_samples, False)):
        b = make_batch(samples, tok)
        with torch.no_grad():
            plain = tiny_model(b.tokens, attention_mask=b.attention_mask)
            edited = tiny_model.run_with_hooks(b.tokens, attention_mask=b.attention_mask,
                                               fwd_hooks=edit.hooks(b.ref_mask, tiny_model))
        assert torch.equal(plain, edited) == same


def test_greedy_atoms_respect_the_veto_and_the_tiebreak(copy_model, tok, id_samples):
    batches = P.selection_batches(copy_model, tok, id_samples, batch_size=5)
    atoms = [P.Edit("reinforce", strength=1.0, heads=[(0, h)]) for h in range(4)]
    veto = P.GreedyRule(allowed=lambda a: all(e.heads != (USEFUL,) for e in a))
    vetoed = P.greedy_atoms(copy_model, batches, atoms, k=2, rule=veto)
    assert USEFUL not in [(int(l), int(h)) for l, h in zip(vetoed.layer, vetoed["head"])]
    assert len(vetoed) == 0  # every other head hurts: nothing is chosen
    rule = P.GreedyRule(metric="exact", tiebreak="logprob")
    chosen = P.greedy_atoms(copy_model, batches, atoms, k=2, rule=rule)
    assert chosen.attrs["atoms"][:1] == [atoms[USEFUL[1]]]
    assert chosen.tiebreak.iloc[0] > P.measure(copy_model, batches, None, "logprob")


def test_attribution_of_several_edits_in_one_pass_and_on_top_of_base_atoms(f64_model, tok, ood_samples):
    batches = P.selection_batches(f64_model, tok, ood_samples, batch_size=6)
    edits = [P.Edit("patch", delta=2), P.Edit("reinforce", delta=0, strength=2.0, beyond=20), P.Edit("steer", 1, 0.5)]
    together = P.attribution(f64_model, batches, edits)
    assert together.shape == (3, 2, 4)
    for i, e in enumerate(edits):
        torch.testing.assert_close(together[i], P.attribution(f64_model, batches, e))
    base = [P.Edit("patch", delta=1, heads=[(1, 2)])]
    tiny = P.Edit("reinforce", delta=1, strength=1e-4)
    est = P.attribution(f64_model, batches, tiny, base=base)
    before = P.measure(f64_model, batches, lambda b: P.atom_hooks(base, b.ref_mask))
    for head in [(0, 0), (1, 3), (1, 2)]:
        after = P.measure(f64_model, batches, lambda b, h=head: P.atom_hooks([*base, tiny.on([h])], b.ref_mask))
        assert est[head] == pytest.approx(after - before, rel=2e-3, abs=1e-10)
    assert not torch.allclose(est, P.attribution(f64_model, batches, tiny))  # the base edit changes the estimate


def test_greedy_atoms_fall_back_to_the_gated_twin_when_vetoed(copy_model, tok, id_samples):
    batches = P.selection_batches(copy_model, tok, id_samples, batch_size=5)
    plain = P.Edit("reinforce", strength=1.0, heads=[USEFUL])
    gated = plain.replace(beyond=6)
    veto = lambda combo: all(e.beyond is not None for e in combo)  # noqa: E731  only gated edits pass
    chosen = P.greedy_atoms(copy_model, batches, [plain], k=1, rule=P.GreedyRule(allowed=veto, fallback={plain: gated}))
    assert chosen.attrs["atoms"] == [gated] and chosen.gain.iloc[0] > 0
    assert len(P.greedy_atoms(copy_model, batches, [plain], k=1, rule=P.GreedyRule(allowed=veto))) == 0
    with pytest.raises(ValueError, match="an atom edits one head"):
        P.greedy_atoms(copy_model, batches, [plain.on([USEFUL, (0, 0)])], k=1)
