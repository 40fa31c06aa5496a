"""Value assignment: docs/tasks.md example, references, validity, alphabets, bad params, random params."""
import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan.tasks.assign import Assign
from tests.tasks.sufficiency import check_sufficiency


def test_spec_example():
    assert Assign().solve("B1E0D1A1C0:ABBED=") == "11101"


def test_references():
    for s in Assign(pairs=(1, 20), length=(1, 15)).generate(200, seed=0):
        table, rest = s.prompt.split(":")
        n = len(table) // 2
        for j, refs in enumerate(s.references):
            sym_pos = 2 * n + 1 + j
            key_pos = table.index(s.text[sym_pos])
            assert key_pos % 2 == 0
            assert refs == (key_pos, key_pos + 1, sym_pos)
            assert s.target[j] == s.text[key_pos + 1]
        assert len(set(table[::2])) == n


def test_value_is_necessary():
    t = Assign(values="0123")
    for s in t.generate(100, seed=1):
        for j, (_, v, _) in enumerate(s.references):
            new = s.prompt[:v] + t.values.replace(s.prompt[v], "")[0] + s.prompt[v + 1 :]
            assert t.solve(new)[j] != s.target[j]


def test_custom_alphabets():
    t = Assign(pairs=(3, 3), length=(4, 4), keys="xyz", values="ab")
    for s in t.generate(50):
        assert sorted(s.prompt[0:6:2]) == ["x", "y", "z"]
        assert set(s.target) <= {"a", "b"}
    assert t.alphabet == ":=abxyz"


@pytest.mark.parametrize(
    "prompt", ["", "A1:A", "A1A=", "A1B0:C=", "A1A0:A=", "A2:A=", "A1:=", "A1B:A=", ":A=", "A1:A=A=", "!1:!="]
)
def test_invalid_prompts(prompt):
    with pytest.raises(ValueError):
        Assign().solve(prompt)


@pytest.mark.parametrize(
    "params",
    [dict(pairs=(53, 53)), dict(pairs=0), dict(pairs=(5, 3)), dict(length=(-2, 3)), dict(keys="aab"),
     dict(keys="ab:c"), dict(keys=""), dict(values="0=1"), dict(values="00"), dict(values="0 1")],
)
def test_bad_params(params):
    with pytest.raises(ValueError, match=next(iter(params))):
        Assign(**params)


def test_table_larger_than_keys():
    Assign(pairs=(3, 3), keys="abc")
    with pytest.raises(ValueError, match="pairs"):
        Assign(pairs=(2, 4), keys="abc")


@settings(max_examples=30, deadline=None)
@given(lo=st.integers(1, 30), extra=st.integers(0, 22), length=st.integers(1, 20),
       values=st.sampled_from(["01", "0123456789", "#"]), seed=st.integers(0, 2**32))
def test_random_params(lo, extra, length, values, seed):
    t = Assign(pairs=(lo, lo + extra), length=(1, length), keys=string.ascii_letters, values=values)
    rng = random.Random(seed)
    for s in t.generate(10, seed=seed):
        assert t.solve(s.prompt) == s.target
        assert set(s.text) <= set(t.alphabet) and len(s.text) <= t.max_text_len()
        check_sufficiency(t, s, rng)
