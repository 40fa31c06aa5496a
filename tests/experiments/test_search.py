"""The toolkit's own search: proposals come from measurements and respect the ID-cost veto."""
import pytest
import torch

from aspan import evaluation, models, tasks
from aspan.experiments import profiling as P
from aspan.experiments import search as S


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(1)
    model, tok, _ = models.load("reversal", device="cpu")
    return model, tok


def test_propose_on_the_shipped_model(shipped):
    model, tok = shipped
    sel = tasks.preset("reversal", "ood", length=(11, 13)).generate(16, seed=2)
    ids = tasks.preset("reversal", "id").generate(16, seed=1)
    cfg = S.SearchConfig(deltas=(0, 2), profile=3, max_heads=3, batch_size=16)
    prop = S.propose(model, tok, sel, ids, beyond=21, cfg=cfg)
    # every (head, delta, gate) atom is scored, and the scores are the attribution estimate
    assert len(prop.estimates) == 16 * 2 * 2
    est = P.attribution(model, P.selection_batches(model, tok, sel, 16), P.Edit("patch", delta=2))
    got = prop.estimates[(prop.estimates.delta == 2) & ~prop.estimates.gated].sort_values(["layer", "head"])
    torch.testing.assert_close(torch.tensor(got.estimate.values), est.flatten(), rtol=1e-5, atol=1e-6)
    # the heads profiled exactly are the top 3 by their best ungated estimate
    best = prop.estimates[~prop.estimates.gated].groupby(["layer", "head"]).estimate.max().nlargest(3)
    assert set(zip(prop.profiled.layer, prop.profiled["head"])) == set(best.index)
    # the greedy choice: heads with a positive measured effect, one atom each, improving the selection set
    positive = {(int(l), int(h)) for l, h, e in zip(prop.profiled.layer, prop.profiled["head"], prop.profiled.effect)
                if e > 0}
    heads = [h for e in prop.atoms for h in e.heads]
    assert set(heads) <= positive and len(set(heads)) == len(heads) and 1 <= len(heads) <= 3
    fwd = lambda b: P.atom_hooks(prop.atoms, b.ref_mask, model)  # noqa: E731
    before = evaluation.evaluate(model, tok, sel, attn=False).summary()
    after = evaluation.evaluate(model, tok, sel, fwd_hooks=fwd, attn=False).summary()
    assert (after["exact"], after["partial"]) > (before["exact"], before["partial"])
    id_cost = evaluation.evaluate(model, tok, ids, attn=False).summary()["exact"] - \
        evaluation.evaluate(model, tok, ids, fwd_hooks=fwd, attn=False).summary()["exact"]
    assert id_cost <= cfg.id_budget
    assert S.decode_atoms(S.encode_atoms(prop.atoms)) == prop.atoms
    assert S.describe(prop.atoms).startswith(f"L{heads[0][0]}H{heads[0][1]} patch")


def test_veto_with_a_zero_budget_never_lets_id_drop(shipped):
    model, tok = shipped
    sel = tasks.preset("reversal", "ood", length=(11, 12)).generate(8, seed=4)
    ids = tasks.preset("reversal", "id").generate(24, seed=5)
    cfg = S.SearchConfig(deltas=(0, 1, 2), profile=4, max_heads=4, id_budget=0.0, batch_size=24)
    prop = S.propose(model, tok, sel, ids, beyond=21, cfg=cfg)
    batches = P.selection_batches(model, tok, ids)
    for k in range(1, len(prop.atoms) + 1):  # every greedy prefix passed the veto
        combo = prop.atoms[:k]
        assert P.measure(model, batches, lambda b, c=combo: P.atom_hooks(c, b.ref_mask, model), "exact") == \
            P.measure(model, batches, None, "exact")


def test_search_config_bad_input():
    for kw, msg in (({"deltas": ()}, "deltas"), ({"profile": 0}, "profile"), ({"max_heads": 0}, "max_heads"),
                    ({"id_budget": 2.0}, "id_budget")):
        with pytest.raises(ValueError, match=msg):
            S.SearchConfig(**kw).check(16)
