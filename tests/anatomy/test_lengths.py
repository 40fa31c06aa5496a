"""`explain_lengths`: every table on the scripted model by hand, batched equal to `explain` one sample at a time (under
padding), the leave sentences, the options."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from aspan import tasks
from aspan.anatomy import explain, explain_lengths
from aspan.anatomy.lengths import LengthOptions, LengthSettings

from .scripted import READER, Scripted, one_hot_rows


def leaving_reader(T: int) -> torch.Tensor:
    """The reader on reversal of length L = (T - 3) / 2: at ref+1 (key L - j + 1), except that from length 5 on it
    reads key 1 (BOS: EOS predicted, no mass) from token 3 on; the EOS row on key 1."""
    L = (T - 3) // 2
    keys = {L + 1 + j: {1 if (L >= 5 and j >= 3) else L - j + 1: 1.0} for j in range(L)}
    keys[2 * L + 1] = {1: 1.0}
    return one_hot_rows(T, keys)


@pytest.fixture(scope="module")
def found():
    s = Scripted(delta=1)
    s.scripts[READER] = leaving_reader
    task = tasks.get("reversal", length=(3, 6), charset="abcdefgh")
    return explain_lengths(s.model, s.tok, task, [6, 3, 4, 5, 4], heads=[READER], delta=1, n=4, batch_size=3)


def test_per_length_by_hand(found):
    b = found.by_length.set_index("length")
    assert list(b.index) == [3, 4, 5, 6] and (b.n == 4).all()
    assert list(b.exact) == [1, 1, 0, 0] and list(b.partial) == pytest.approx([1, 1, 3 / 5, 3 / 6])
    assert list(b.mass) == pytest.approx([1, 1, 3 / 5, 3 / 6])
    assert list(b.on_ref) == pytest.approx([1, 1, 3 / 5, 3 / 6])
    # top positions from token 3 on are text position 0; references L-1-j: offsets -1, 0 (L=5), -2, -1, 0 (L=6)
    assert list(b.offset) == pytest.approx([1, 1, (3 - 1 + 0) / 5, (3 - 2 - 1 + 0) / 6])
    assert list(b.failing) == [0, 0, 4, 4] and np.isnan(b.first_error[3]) and b.first_error[5] == 3


def test_positions_tokens_and_where_attention_leaves(found):
    p = found.by_position.set_index(["length", "j"])
    assert p.loc[(5, 3), "first_error"] == 4 and p.loc[(5, 4), "first_error"] == 0 and p.loc[(5, 5), "accuracy"] == 1
    assert list(p.loc[6].accuracy) == [1, 1, 1, 0, 0, 0, 1]  # the EOS row (j 6) is right
    t = found.by_token.set_index(["length", "j"])
    assert list(t.loc[6].mass) == [1, 1, 1, 0, 0, 0] and list(t.loc[6].rows) == [4] * 6  # no EOS: no references
    leaves = found.leaves.set_index("length")
    assert leaves.first_token.isna().tolist() == [True, True, False, False]
    assert list(leaves.first_token.loc[[5, 6]]) == [3, 3]
    assert found.causes == ["head L1H0's attention first leaves ref+1 at length 5, token 3 (mean mass 0.00 < 0.5); "
                            "it leaves at 2 of the 2 lengths from there, at length 6 from token 3"]


def test_a_head_that_never_leaves():
    s = Scripted(delta=1)
    s.scripts[READER] = leaving_reader
    task = tasks.get("reversal", length=(1, 4), charset="abcdefgh")
    out = explain_lengths(s.model, s.tok, task, range(2, 5), heads=[READER], delta=1, n=3)
    assert out.causes == ["head L1H0 keeps a mean mass of at least 0.5 on ref+1 at every output token of lengths 2-4"]
    assert (out.by_length.exact == 1).all() and out.leaves.first_token.isna().all()


def test_batched_equals_explain_one_sample_at_a_time_under_padding(tok, tiny_model):
    """assign's tables differ in size within one string length: the batches are padded; `explain` reads each
    sample alone. The per-length and per-token numbers agree."""
    task = tasks.get("assign", pairs=(3, 6), length=(2, 3))
    heads = [(1, 0), (0, 2)]
    got = explain_lengths(tiny_model, tok, task, [2, 3], heads=heads, delta=1, n=5, batch_size=4, seed=2)
    for length in (2, 3):
        samples = tasks.get("assign", pairs=(3, 6), length=(length, length)).generate(5, seed=2)
        assert len({len(s.prompt) for s in samples}) > 1  # padded
        each = [explain(tiny_model, tok, s, heads=heads, delta=1) for s in samples]
        row = got.by_length.set_index("length").loc[length]
        assert row.exact == np.mean([a.exact() for a in each])
        chars = [a.tokens[~a.tokens.eos].correct.mean() for a in each]
        assert row.partial == pytest.approx(np.mean(chars))
        for name in ("L1H0", "L0H2"):
            rows = [a.heads[a.heads.name == name].set_index("j") for a in each]
            mine = got.by_token[(got.by_token.length == length) & (got.by_token.name == name)].set_index("j")
            for j in mine.index:
                mass = [r.mass[j] for r in rows if r.mass[j] == r.mass[j]]
                offset = [r.offset[j] for r in rows if r.mass[j] == r.mass[j]]
                assert mine.rows[j] == len(mass)
                assert mine.mass[j] == pytest.approx(np.mean(mass), abs=1e-6)
                assert mine.offset[j] == pytest.approx(np.mean(offset), abs=1e-6)


def test_options(tok, tiny_model):
    assert sorted(LengthSettings.__annotations__) == sorted(LengthOptions.__dataclass_fields__)
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        explain_lengths(tiny_model, tok, "reversal", [11], heads=[(0, 0)], n=0)
    with pytest.raises(ValueError, match="lengths must be integers >= 1"):
        explain_lengths(tiny_model, tok, "reversal", [], heads=[(0, 0)])
    with pytest.raises(ValueError, match="length buckets need a task"):
        explain_lengths(tiny_model, tok, "addition", [3], heads=[(0, 0)])
    with pytest.raises(ValueError, match="context too short"):
        explain_lengths(tiny_model, tok, "reversal", [40], heads=[(0, 0)])
    with pytest.raises(TypeError, match="unexpected keyword argument 'samples'"):
        explain_lengths(tiny_model, tok, "reversal", [3], heads=[(0, 0)], samples=3)
