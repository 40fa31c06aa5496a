"""Editing the end-of-sequence row on the reference map continued one row (`eos="extrapolate"`): the mask on
reversal by hand, the patched row through the model, the engine's methods, and nothing changed with the option off."""
import dataclasses

import pandas as pd
import pytest
import torch

import hooks
from aspan import models, tasks
from aspan.applications import causal
from aspan.batching import make_batch
from aspan.experiments import engine as E
from aspan.experiments import profiling as P
from aspan.experiments import search as S
from aspan.tasks.base import Sample
from tests.hooks.brute_edits import brute_rows, layer_hooks, uniform_row


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(1)
    model, tok, _ = models.load("reversal", device="cpu")
    return model, tok


def _reversal(s: str) -> Sample:
    n = len(s)
    return Sample(s + "=" + s[::-1], n + 1, tuple((n - 1 - j,) for j in range(n)), task="reversal")


def test_extrapolated_mask_on_reversal_by_hand(shipped):
    """'abcd=dcba' behind BOS: target j is predicted at row 1 + 5 + j - 1 = 5 + j and reads column 1 + 3 - j; the
    EOS row 9 gets column 0 (step -1)."""
    _, tok = shipped
    batch = make_batch([_reversal("abcd"), _reversal("xy"), _reversal("pqrstu")], tok)
    got = hooks.extrapolate_mask(batch.ref_mask, attention_mask=batch.attention_mask)
    want = batch.ref_mask.clone()
    want[0, 9, 0] = True  # the row predicting EOS
    want[2, 13, 0] = True  # 'pqrstu=utsrqp': target rows 7 ... 12 read columns 6 ... 1; EOS row 13
    assert [int(batch.ref_mask[0, r].nonzero()) for r in range(5, 9)] == [4, 3, 2, 1]
    assert torch.equal(got, want)  # 'xy' has two target rows only: one step, fewer than the 3 rows asked for
    assert batch.labels[0, 9] == tok.eos_id and batch.labels[2, 13] == tok.eos_id
    assert P.Edit("patch", eos="extrapolate").refs(batch.ref_mask)[0, 9].nonzero().flatten().tolist() == [0]


def test_patched_eos_row_is_uniform_on_the_extrapolated_columns(shipped):
    """Through the model: the pattern after the edit, read by a hook that runs after it, is uniform on the
    extrapolated columns shifted by delta at the EOS row; logits equal a brute-force replacement."""
    model, tok = shipped
    samples = [_reversal("abcdefghijklm"), _reversal("k3Zq"), _reversal("ab")]
    batch = make_batch(samples, tok)
    heads, delta = [(1, 7), (1, 2)], 2
    seen = {}

    def record(pattern, hook):
        seen["p"] = pattern.detach().clone()

    edit = P.Edit("patch", delta=delta, eos="extrapolate", heads=heads)
    fwd = edit.hooks(batch.ref_mask, model) + [("blocks.1.attn.hook_pattern", record)]
    got = model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask, fwd_hooks=fwd)
    for i, s in enumerate(samples):
        eos_row = int(batch.lengths[i]) - 2
        for _, h in heads:
            row = seen["p"][i, h, eos_row]
            if len(s.target) >= 3:  # column 0 (BOS) + 2 = column 2
                assert torch.equal(row, torch.nn.functional.one_hot(torch.tensor(2), row.shape[-1]).to(row.dtype))
            else:
                assert row[2] < 1  # too few target rows: the EOS row keeps the model's own attention
    m = hooks.shift_mask(hooks.extrapolate_mask(batch.ref_mask), delta)
    brute = layer_hooks(heads, lambda Pt, hs: brute_rows(Pt, m, hs, uniform_row(m)))
    want = model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask, fwd_hooks=brute)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    plain = model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask,
                                 fwd_hooks=P.Edit("patch", delta=delta, heads=heads).hooks(batch.ref_mask, model))
    assert (got[0, int(batch.lengths[0]) - 2] - plain[0, int(batch.lengths[0]) - 2]).abs().max() > 1e-3
    rows = batch.ref_mask.any(-1)  # the target rows come before the EOS row: the same edit there
    assert torch.equal(got[rows], plain[rows])


@pytest.mark.parametrize("method", ["patch", "reinforce", "steer"])
def test_engine_methods_edit_the_extrapolated_mask(shipped, method):
    """A point with eos="extrapolate" equals the same method on the hand-extrapolated mask; without it, the same
    point is bit-identical to the method on the batch's own mask, and its key has no trace of the option."""
    model, tok = shipped
    data = E.Data("reversal", ood_params={"length": [11, 14]}, n=8)
    batch = make_batch(tasks.preset("reversal", "ood", length=(11, 14)).generate(8, seed=3), tok)
    strength = {"steer": 0.01, "patch": None}.get(method, 2.0)  # patch takes none
    on = E.point(data, "reversal", "list:1.7,1.2", strength, method=method, delta=2, eos="extrapolate")
    off = E.point(data, "reversal", "list:1.7,1.2", on["strength"], method=method, delta=2)
    assert on["eos"] == "extrapolate" and "eos" not in off and E.settings_key(on) != E.settings_key(off)
    assert E.point(data, "reversal", "list:1.7,1.2", on["strength"], method=method, delta=2, eos="none") == off
    engine = E.Engine(model, tok, data)
    run = lambda p, mask: model.run_with_hooks(  # noqa: E731
        batch.tokens, attention_mask=batch.attention_mask,
        fwd_hooks=engine.edit(p, [(1, 7), (1, 2)])(dataclasses.replace(batch, ref_mask=mask)))
    ext = hooks.extrapolate_mask(batch.ref_mask)
    assert not torch.equal(ext, batch.ref_mask)
    assert torch.equal(run(on, batch.ref_mask), run(off, ext))
    plain = model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask, fwd_hooks=_direct(
        method, batch.ref_mask, on["strength"], model))
    assert torch.equal(run(off, batch.ref_mask), plain)
    with pytest.raises(ValueError, match="eos must be one of"):
        E.point(data, "reversal", "list:1.7", 1.0, eos="yes")


def _direct(method, mask, strength, model):
    heads = [(1, 7), (1, 2)]
    if method == "patch":
        return hooks.patch_pattern(heads, mask, delta=2, model=model)
    if method == "steer":
        return hooks.steer(heads, mask, alpha=strength, delta=2, model=model)
    return hooks.reinforce(heads, mask, strength, delta=2, model=model)


def test_option_off_changes_nothing(shipped):
    """Edits and atoms without the option: the same hooks' output bit for bit, the same encoding (so the same grid
    keys as before the option existed), and a search point list with no EOS versions."""
    model, tok = shipped
    batch = make_batch(tasks.preset("reversal", "ood", length=(11, 13)).generate(6, seed=9), tok)
    atoms = [P.Edit("patch", delta=2, heads=[(1, 7)]), P.Edit("reinforce", strength=5.0, beyond=21, heads=[(0, 0)])]
    assert all(e.refs(batch.ref_mask) is batch.ref_mask for e in atoms)
    got = model.run_with_hooks(batch.tokens, fwd_hooks=P.atom_hooks(atoms, batch.ref_mask, model))
    want = model.run_with_hooks(batch.tokens, fwd_hooks=hooks.patch_pattern([(1, 7)], batch.ref_mask, delta=2) +
                                hooks.reinforce([(0, 0)], batch.ref_mask, 5.0,
                                                rows=hooks.rows_beyond(batch.tokens, 22)))
    assert torch.equal(got, want)
    enc = S.encode_atoms(atoms)
    assert all(set(d) == {"layer", "head", "method", "delta", "strength", "renormalize", "beyond", "below"}
               for d in enc)
    assert S.decode_atoms(enc) == atoms
    ext = [dataclasses.replace(e, eos="extrapolate") for e in atoms]
    assert S.decode_atoms(S.encode_atoms(ext)) == ext and S.encode_atoms(ext)[0]["eos"] == "extrapolate"
    assert "EOS row extrapolated" in S.describe(ext) and "EOS" not in S.describe(atoms)
    with pytest.raises(ValueError, match="eos must be one of"):
        P.Edit("patch", eos="yes")


def test_search_points_offer_both_treatments_of_the_eos_row():
    """With eos ("none", "extrapolate") every search edit is also evaluated with the EOS row extrapolated, after
    the points of before (unchanged, in the same order); with ("none",) nothing is added."""
    atoms = [P.Edit("patch", delta=2, heads=[(1, 7)]), P.Edit("patch", heads=[(0, 0)])]
    prop = S.Proposal(pd.DataFrame(), pd.DataFrame({"layer": [1, 0], "head": [7, 0], "delta": [2, 0],
                                                    "effect": [0.1, 0.05]}), pd.DataFrame(), atoms)
    data = E.Data("reversal", n=8)
    before = causal._search_points(data, "reversal", prop, (21, 0), ("patch", "steer alpha=0.01"))
    both = causal._search_points(data, "reversal", prop, (21, 0), ("patch", "steer alpha=0.01"),
                                 ("none", "extrapolate"))
    assert both[:len(before)] == before
    assert all("eos" not in a for p in before for a in p["atoms"])
    added = both[len(before):]
    assert added and all(a["eos"] == "extrapolate" for p in added for a in p["atoms"])
    strip = lambda p: [{k: v for k, v in a.items() if k != "eos"} for a in p["atoms"]]  # noqa: E731
    assert sorted(map(str, map(strip, added))) == sorted(map(str, map(strip, before)))  # one twin per edit
    assert len({E.settings_key(p) for p in both}) == len(both)


def test_sweep_configs_take_eos_as_a_grid_axis():
    """`eos = ["none", "extrapolate"]` doubles the grid; "none" points keep the keys of a config without the axis;
    the seed-averaged table keeps the two apart and the held-out evaluation takes only the chosen one (and its
    gate)."""
    from aspan.experiments.sweep import SweepConfig, _same_setting, grid, summary_table

    raw = {"model": "reversal", "task": "reversal", "strengths": [1.0], "method": ["patch"],
           "gates": ["none", "beyond"], "heads": {"list": [[1, 7]]}, "n_samples": 4, "seeds": [0, 1]}
    plain = grid(SweepConfig.from_dict(raw))
    both = grid(SweepConfig.from_dict({**raw, "eos": ["none", "extrapolate"]}))
    assert len(both) == 2 * len(plain) == 8
    assert {E.settings_key(p) for p in plain} == {E.settings_key(p) for p in both if "eos" not in p}
    metrics = {m: 0.5 for m in ("attn_rollout_sample", "attn_rollout_raw", "attn_heads_sample", "attn_heads_raw",
                                "baseline_attn_rollout_sample", "baseline_attn_rollout_raw", "id_partial",
                                "id_baseline_partial", "partial", "baseline_partial")}
    rows = pd.DataFrame([{**p, **metrics, "n_heads": 1, "n": 4, "baseline_exact": 0.0, "id_baseline_exact": 1.0,
                          "exact": 0.75 if p.get("eos") and not p.get("gate") else 0.25, "id_exact": 1.0}
                         for p in both])
    table = summary_table(rows)
    assert len(table) == 4 and set(table.eos) == {"none", "extrapolate"} and set(table.gate) == {"none", "beyond"}
    best = E.select(table).row
    assert (best["eos"], best["gate"]) == ("extrapolate", "none")
    chosen = [p for p in both if _same_setting(p, best)]
    assert len(chosen) == 2 and all(p["eos"] == "extrapolate" and "gate" not in p for p in chosen)  # one per seed
    with pytest.raises(ValueError, match="sweep config: eos"):
        SweepConfig.from_dict({**raw, "eos": ["sometimes"]})
