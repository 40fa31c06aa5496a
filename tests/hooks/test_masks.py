"""Pure mask helpers: shift_mask against a brute force; attention mass; KV-cache row cropping."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hooks
from hooks.masks import query_rows


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7), st.integers(-9, 9), st.integers(0, 2**31 - 1))
def test_shift_mask_brute_force(pos, delta, seed):
    g = torch.Generator().manual_seed(seed)
    m = (torch.rand(2, pos, pos, generator=g) < 0.4).tril()
    got = hooks.shift_mask(m, delta)
    expected = torch.zeros_like(m)
    for b, q, k in m.nonzero().tolist():
        if 0 <= k + delta <= q:
            expected[b, q, k + delta] = True
    assert torch.equal(got, expected)


def test_attn_mass_and_query_rows():
    attn = torch.tensor([[[1.0, 0, 0], [0.3, 0.7, 0], [0.2, 0.3, 0.5]]])
    mask = torch.tensor([[[False] * 3, [True, False, False], [True, False, True]]])
    assert torch.allclose(hooks.attn_mass(attn, mask), torch.tensor([[0.0, 0.3, 0.7]]))
    big = torch.zeros(1, 6, 6, dtype=torch.bool)
    big[0, 3, 1] = True
    assert torch.equal(query_rows(big, 2, 4), big[:, 2:4, :4])
    assert torch.equal(hooks.target_rows(mask), torch.tensor([[False, True, True]]))


def _extrapolated_by_loops(mask, last):
    """`extrapolate_mask` written out per sample with Python sets: the references the function must equal."""
    out = mask.clone()
    for i in range(mask.shape[0]):
        rows = [r for r in range(mask.shape[1]) if mask[i, r].any()]
        if not rows or rows[-1] - last + 1 < 0 or rows[-1] + 1 >= mask.shape[1]:
            continue
        run = range(rows[-1] - last + 1, rows[-1] + 1)
        if not all(mask[i, r].any() for r in run):
            continue
        sets = [set(mask[i, r].nonzero().flatten().tolist()) for r in run]
        step = min(sets[1]) - min(sets[0])
        if any({c + step for c in a} != b for a, b in zip(sets, sets[1:])):
            continue
        new = {c + step for c in sets[-1]}
        if all(0 <= c <= rows[-1] + 1 for c in new):
            out[i, rows[-1] + 1, sorted(new)] = True
    return out


@st.composite
def _maps(draw):
    """Masks whose rows are mostly a regular map (a base set moved by a step per row), sometimes perturbed."""
    pos = draw(st.integers(3, 12))
    masks = []
    for _ in range(3):
        m = torch.zeros(pos, pos, dtype=torch.bool)
        start = draw(st.integers(0, pos - 1))
        n = draw(st.integers(0, pos - start))
        base = draw(st.sets(st.integers(0, pos - 1), min_size=1, max_size=3))
        step = draw(st.integers(-2, 2))
        for j in range(n):
            for c in base:
                if 0 <= c + j * step <= start + j:
                    m[start + j, c + j * step] = True
        if n and draw(st.booleans()):  # perturb one of the map's rows
            r, c = draw(st.integers(start, start + n - 1)), draw(st.integers(0, pos - 1))
            m[r, min(c, r)] ^= True
        masks.append(m)
    return torch.stack(masks), draw(st.integers(2, 4))


@settings(max_examples=150, deadline=None)
@given(_maps())
def test_extrapolate_mask_brute_force(drawn):
    mask, last = drawn
    got = hooks.extrapolate_mask(mask, last)
    assert torch.equal(got, _extrapolated_by_loops(mask, last))
    assert torch.equal(got & mask, mask) and torch.equal(hooks.extrapolate_mask(mask[0], last), got[0])


def test_extrapolate_mask_continues_a_diagonal_or_nothing():
    m = torch.zeros(1, 8, 8, dtype=torch.bool)
    for r, c in ((3, 4 - 1), (4, 2), (5, 1)):  # anti-diagonal: step -1
        m[0, r, c] = True
    want = m.clone()
    want[0, 6, 0] = True
    assert torch.equal(hooks.extrapolate_mask(m), want)
    bent = m.clone()
    bent[0, 5] = False
    bent[0, 5, 0] = True  # steps -1 then -2: not regular, nothing added
    assert torch.equal(hooks.extrapolate_mask(bent), bent)
    assert torch.equal(hooks.extrapolate_mask(bent, last=2), _extrapolated_by_loops(bent, 2))  # one step suffices
    assert hooks.extrapolate_mask(bent, last=2)[0, 6, :].nonzero().flatten().tolist() == []  # column -1: none
    am = torch.ones(1, 8, dtype=torch.long)
    am[0, 6:] = 0  # the next row is padding: nothing added
    assert torch.equal(hooks.extrapolate_mask(m, attention_mask=am), m)
    with pytest.raises(ValueError, match="last must be >= 2"):
        hooks.extrapolate_mask(m, last=1)
