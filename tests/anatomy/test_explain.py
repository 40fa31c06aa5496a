"""`explain`'s table, column by column, on a model whose attention is set (tests/anatomy/scripted.py): every value
below is worked out by hand from the script, not read back from the code."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import hooks
from aspan import tasks
from aspan.anatomy import Anatomy, ExplainOptions, explain
from aspan.anatomy.heads import ExplainSettings, from_ranking

from .scripted import DISTRACTOR, MOVER, QUIET, READER, Scripted, one_hot_rows

TEXT, PROMPT = "abcdef=fedcba", "abcdef="  # T = 15 tokens: BOS, 13 characters, EOS
T = 15


def sample(text: str = TEXT, prompt: str = PROMPT):
    n = len(prompt) - 1
    return tasks.get("reversal", length=(n, n), charset="abcdefgh").rebuild(prompt, text[len(prompt):])


def reader_keys(wrong: dict[int, dict[int, float]] | None = None, eos_key: int = 1) -> dict[int, dict[int, float]]:
    """The reader's rows: target j (row 7 + j) at ref+1 (key 7 - j), unless `wrong` gives it other keys; the EOS
    row (13) at `eos_key` (key 1 carries BOS: EOS is predicted)."""
    rows = {7 + j: {7 - j: 1.0} for j in range(6)}
    rows.update({7 + j: keys for j, keys in (wrong or {}).items()})
    rows[13] = {eos_key: 1.0}
    return rows


def run(keys: dict, **kw) -> Anatomy:
    s = Scripted(delta=1, distractor=kw.pop("distractor", 0.0))
    s.scripts[READER] = one_hot_rows(T, keys)
    if "distractor_rows" in kw:
        D = torch.zeros(T, T)
        for r, row in kw.pop("distractor_rows").items():
            for k, w in row.items():
                D[r, k] = w
        s.scripts[DISTRACTOR] = D
    return explain(s.model, s.tok, kw.pop("sample", sample()), heads=[READER], delta=1, **kw)


def col(a: Anatomy, head: tuple[int, int], name: str) -> list:
    h = a.heads[(a.heads.layer == head[0]) & (a.heads["head"] == head[1])].set_index("j")
    return h[name].tolist()


def test_every_column_of_a_right_answer_by_hand():
    a = run(reader_keys())
    t = a.tokens
    assert list(t.index) == list(range(7)) and list(t.row) == list(range(7, 14))
    assert list(t.expected) == [*"fedcba", "<eos>"] and list(t.predicted) == list(t.expected)
    assert t.correct.all() and not t.first_error.any() and a.first_error() is None and a.exact()
    assert list(t.refs) == [(5 - j,) for j in range(6)] + [()]
    assert list(t.eos) == [False] * 6 + [True]
    # logits: the current token 1, the reader's copy 3 (EOS: 3 through BOS) -> margin 3 - 1 = 2 everywhere
    assert t.margin.tolist() == pytest.approx([2.0] * 7)
    # the reader: mass 1 on ref+1, top at text position ref + 1 (key 7 - j is text position 6 - j), offset +1
    assert col(a, READER, "mass")[:6] == [1.0] * 6 and math.isnan(col(a, READER, "mass")[6])
    assert col(a, READER, "top") == [6 - j for j in range(6)] + [0]
    assert col(a, READER, "top_token") == [*"=fedcb", "a"]
    assert col(a, READER, "offset")[:6] == [1.0] * 6 and math.isnan(col(a, READER, "offset")[6])
    # the mover reads the key before its row: top = row - 1 = 6 + j (text 5 + j), 2j right of the reference; its mass
    # on ref+1 (key 7 - j) is 0
    assert col(a, MOVER, "top")[:6] == [5 + j for j in range(6)]
    assert col(a, MOVER, "offset")[:6] == [2.0 * j for j in range(6)]
    assert col(a, MOVER, "mass")[:6] == [0.0] * 6
    # the quiet head's own pattern: uniform over the row's r + 1 keys, top on the first (BOS, text -1)
    assert col(a, QUIET, "mass")[:6] == pytest.approx([1 / (8 + j) for j in range(6)])
    assert col(a, QUIET, "top") == [-1] * 7 and col(a, QUIET, "top_token") == ["<bos>"] * 7
    assert col(a, QUIET, "offset")[:6] == [-(6.0 - j) for j in range(6)]
    assert a.selected == [READER] and a.names == ["L1H0"] and a.delta == 1 and a.causes == []
    assert a.heads.selected.sum() == 7 and set(a.heads[a.heads.selected].name) == {"L1H0"}
    assert len(a.heads) == 7 * 4  # every head of the model, one row per output token


def test_wrong_answers_margins_and_the_first_error_by_hand():
    # from token 3 on the reader reads one key right of ref+1: it copies the token at the key before it
    a = run(reader_keys({j: {8 - j: 1.0} for j in (3, 4, 5)}))
    t = a.tokens
    assert list(t.predicted) == [*"fed", "d", "c", "b", "<eos>"]
    assert list(t.correct) == [True] * 3 + [False] * 3 + [True]
    assert list(t.first_error) == [False] * 3 + [True] + [False] * 3 and a.first_error() == 3 and not a.exact()
    # wrong rows: the copy (3) lands on the current token (1), the expected token gets 0: margin -4
    assert t.margin.tolist() == pytest.approx([2, 2, 2, -4, -4, -4, 2])
    assert col(a, READER, "offset")[:6] == [1.0] * 3 + [2.0] * 3
    assert col(a, READER, "mass")[:6] == [1.0] * 3 + [0.0] * 3
    assert col(a, READER, "top")[3:6] == [4, 3, 2]


def test_a_soft_pattern_splits_mass_margin_and_top():
    # token 2 (row 9): 0.6 on ref+1 (key 5, carrying 'd'), 0.4 on key 3 (carrying 'b')
    a = run(reader_keys({2: {5: 0.6, 3: 0.4}}))
    t, m = a.tokens.loc[2], col(a, READER, "mass")[2]
    assert t.predicted == "d" and t.correct
    assert t.margin == pytest.approx(3 * 0.6 - 3 * 0.4)  # 'd' 1.8 against 'b' 1.2 (the current token 'e' has 1)
    assert m == pytest.approx(0.6) and col(a, READER, "top")[2] == 4 and col(a, READER, "offset")[2] == 1


def test_the_sample_convention_divides_by_the_sample_columns():
    keys = reader_keys({2: {5: 0.6, 0: 0.4}})  # 0.4 on BOS: left out of the `sample` denominator
    raw, own = run(keys), run(keys, convention="sample")
    assert col(raw, READER, "mass")[2] == pytest.approx(0.6) and col(own, READER, "mass")[2] == pytest.approx(1.0)


def test_an_edit_side_by_side():
    keys = reader_keys({j: {8 - j: 1.0} for j in (3, 4, 5)})
    patch = lambda b: hooks.patch_pattern([READER], b.ref_mask, delta=1)  # noqa: E731  back to ref+1
    a = run(keys, fwd_hooks=patch)
    assert a.edit == "the edit" and list(a.tokens.correct) == [True] * 3 + [False] * 3 + [True]
    assert a.tokens.correct_after.all() and a.exact(after=True) and a.first_error(after=True) is None
    assert col(a, READER, "mass_after")[:6] == [1.0] * 6 and col(a, READER, "offset_after")[:6] == [1.0] * 6
    table = a.table
    assert list(table.columns[:9]) == ["expected", "predicted", "predicted_after", "correct", "correct_after",
                                       "margin", "margin_after", "first_error", "first_error_after"]
    assert {"L1H0 mass", "L1H0 mass_after", "L1H0 top", "L1H0 top_after", "L1H0 offset",
            "L1H0 offset_after"} <= set(table.columns)
    assert table.loc[3, "L1H0 offset"] == 2 and table.loc[3, "L1H0 offset_after"] == 1
    # the EOS row is left alone by the patch (no references): the same before and after
    assert col(a, READER, "top_after")[6] == col(a, READER, "top")[6] == 0


def test_an_edit_object_names_itself():
    from aspan.experiments.edit import Edit

    a = run(reader_keys({3: {5: 1.0}}), fwd_hooks=Edit("patch", delta=1, heads=(READER,)))
    assert a.edit == "patch at ref+1" and a.exact(after=True)


def test_one_forward_reads_every_head(monkeypatch):
    """One sample costs one forward (two with an edit), however many heads: the model is called that often."""
    s = Scripted(delta=1)
    s.scripts[READER] = one_hot_rows(T, reader_keys())
    calls = []
    original = type(s.model).forward
    monkeypatch.setattr(type(s.model), "forward", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    explain(s.model, s.tok, sample(), heads=[READER, MOVER, QUIET, DISTRACTOR], delta=1)
    assert len(calls) == 1
    explain(s.model, s.tok, sample(), heads=[READER], delta=1, fwd_hooks=[])
    assert len(calls) == 3


def test_options_and_keywords_agree_and_unknown_keywords_are_refused():
    assert sorted(ExplainSettings.__annotations__) == sorted(f for f in ExplainOptions.__dataclass_fields__)
    s = Scripted(delta=1)
    s.scripts[READER] = one_hot_rows(T, reader_keys())
    a = explain(s.model, s.tok, sample(), heads=[READER], options=ExplainOptions(delta=1))
    b = explain(s.model, s.tok, sample(), heads=[READER], delta=1)
    pd.testing.assert_frame_equal(a.table, b.table)
    with pytest.raises(TypeError, match="unexpected keyword argument 'deltaa'"):
        explain(s.model, s.tok, sample(), heads=[READER], deltaa=1)
    with pytest.raises(ValueError, match="convention"):
        explain(s.model, s.tok, sample(), heads=[READER], convention="nope")
    with pytest.raises(ValueError, match="out of range"):
        explain(s.model, s.tok, sample(), heads=[(2, 0)])
    with pytest.raises(ValueError, match="not an aspan Sample"):
        explain(s.model, s.tok, "abc=cba", heads=[READER])


def test_a_ranking_table_selects_heads_and_offset():
    ranking = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "score_row_d0": [0.5, 0.1, 0.2, 0.3],
                            "score_row_d2": [0.1, 0.2, 0.9, 0.8]})
    assert from_ranking(ranking, 2, None) == ([(1, 0), (1, 1)], 2)
    assert from_ranking(ranking, 1, 0) == ([(0, 0)], 0)
    with pytest.raises(ValueError, match="not 1"):
        from_ranking(ranking, 1, 1)


@pytest.fixture(scope="module")
def shipped():
    from aspan import models

    torch.set_num_threads(1)
    return models.load("reversal")[:2]


def test_the_shipped_model_without_heads_follows_the_rankings_lookup_heads(shipped):
    """Without heads the ranking on ID samples selects the README's two lookup heads at ref+2; the failing OOD
    sample's table and causes come out, the table's first error is the first wrong token."""
    model, tok = shipped
    s = tasks.preset("reversal", "ood", length=(11, 20)).generate(3, seed=0)[2]
    a = explain(model, tok, s)
    assert a.delta == 2 and a.selected == [(1, 7), (1, 0)] and "ranking" in a.how
    assert a.first_error() == 6 and not a.exact() and a.causes
    assert len(a.heads) == len(a.tokens) * 16
    text = a.text()
    assert "likely cause:" in text and "L1H7 mass" in text
    assert "<li>" in a._repr_html_() and a.to_dict()["first_error"] == 6


def test_explain_leaves_the_model_as_it_was(tiny_model, tok):
    """No hook left behind (also when an edit raises), the training flag and the weights as they were."""
    s = tasks.get("reversal", length=(3, 5)).generate(1, seed=0)[0]
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    tiny_model.train()
    try:
        explain(tiny_model, tok, s, heads=[(1, 0)], fwd_hooks=lambda b: hooks.reinforce([(1, 0)], b.ref_mask, 2.0))

        def broken(pattern, hook):
            raise RuntimeError("an edit that fails")

        with pytest.raises(RuntimeError, match="an edit that fails"):
            explain(tiny_model, tok, s, heads=[(1, 0)], fwd_hooks=[("blocks.0.attn.hook_pattern", broken)])
        assert tiny_model.training
    finally:
        tiny_model.eval()
    assert all(not hp.fwd_hooks for hp in tiny_model.hook_dict.values())
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.state_dict().items())


@pytest.mark.hooked  # compares the two backends: TransformerLens 3 only
def test_a_transformer_bridge_reads_the_same(shipped):
    """The shipped model as a TransformerBridge: the same answers, tops, causes; masses within float rounding."""
    from aspan import models

    model, tok = shipped
    bridge, btok, _ = models.load("reversal", device="cpu", backend="bridge")
    s = tasks.preset("reversal", "ood", length=(11, 20)).generate(3, seed=0)[2]
    a = explain(model, tok, s, heads=[(1, 7), (1, 0)], delta=2)
    b = explain(bridge, btok, s, heads=[(1, 7), (1, 0)], delta=2)
    assert a.tokens.predicted.equals(b.tokens.predicted) and a.heads.top.equals(b.heads.top)
    assert a.heads.mass.to_numpy() == pytest.approx(b.heads.mass.to_numpy(), abs=1e-4, nan_ok=True)
    assert a.causes == b.causes
