"""Multiplication: docs/tasks.md example with hand-worked references, ID/OOD contract, sufficiency, validation."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan import tasks
from aspan.tasks.multiplication import Multiplication
from tests.tasks.task_checks import check_determinism, check_samples


def lsd(x: int, width: int = 0) -> str:
    return str(x).zfill(width)[::-1]


def test_spec_example():
    t = tasks.get("multiplication")
    assert t.solve("99*99=") == "1980+0198=1089"  # 891, 8910, 9801
    s = t.build(99, 99)
    assert s.text == "99*99=1980+0198=1089" and s.prompt_len == 6
    # prompt: a0=0 a1=1 '*'=2 b0=3 b1=4 '='=5; p_0 at 6..9, '+' 10, p_1 at 11..14, '=' 15, r at 16..19
    assert s.references == (
        (0, 3),  # p_0[0]: a_0, b_0
        (0, 1, 3, 6),  # p_0[1]: a_1, a_0, b_0, p_0[0]
        (1, 3, 7),  # p_0[2]: final carry: a_1, b_0, p_0[1]
        (),  # p_0[3]: padding past the last carry
        (),  # '+'
        (),  # p_1[0]: shift zero
        (0, 4),  # p_1[1]: a_0, b_1
        (0, 1, 4, 12),  # p_1[2]: a_1, a_0, b_1, p_1[1]
        (1, 4, 13),  # p_1[3]: final carry
        (),  # '='
        (6, 11),  # r[0]: p_0[0], p_1[0]
        (6, 7, 11, 12, 16),
        (7, 8, 12, 13, 17),
        (8, 9, 13, 14, 18),
    )


def test_one_digit_and_zero():
    t = tasks.get("multiplication")
    s = t.build(7, 8)  # '7*8=' -> p_0 = 56 -> '65', r = '65'
    assert s.text == "7*8=65=65"
    assert s.references == ((0, 2), (0, 2, 4), (), (4,), (4, 5, 7))
    assert t.solve("0*5=") == "00=0"
    assert t.solve("21*0=") == "000=0"
    assert t.solve("5*01=") == "000+050=05"  # 5 * 10: p_0 = 0, p_1 = 50


@pytest.mark.parametrize("split,lo,hi", [("id", 1, 3), ("ood", 4, 6)])
def test_contract(split, lo, hi):
    task = tasks.preset("multiplication", split)
    samples, checked = check_samples(task, 150 if split == "ood" else 300)
    assert checked > 2000
    seen = set()
    for s in samples:
        sa, sb = s.prompt[:-1].split("*")
        a, b = int(sa[::-1]), int(sb[::-1])
        assert lo <= len(sa) <= hi and lo <= len(sb) <= hi
        assert len(sa) == len(str(a)) and len(sb) == len(str(b))
        seen.update((len(sa), len(sb)))
        width = len(sa) + len(sb)
        partials, r = s.target.split("=")
        assert partials.split("+") == [lsd(a * int(d) * 10**j, width) for j, d in enumerate(sb)]
        assert r == lsd(a * b)
        for j, refs in enumerate(s.references):
            assert all(s.text[p].isdigit() for p in refs)
            assert refs or s.target[j] in "+=0"  # empty only for separators and zeros (shift/padding)
    assert seen == set(range(lo, hi + 1))


def test_asymmetric_ranges():
    t = Multiplication(digits=(5, 5), digits_b=(1, 2))
    samples, checked = check_samples(t, 100)
    assert checked > 500
    for s in samples:
        sa, sb = s.prompt[:-1].split("*")
        assert len(sa) == 5 and 1 <= len(sb) <= 2
    assert tasks.from_params("multiplication", t.params()).params() == t.params()
    assert Multiplication(digits=(2, 4)).digits_b == (2, 4)


def test_determinism():
    check_determinism(tasks.preset("multiplication", "id"))


@given(st.integers(0, 10**8), st.integers(0, 10**6))
@settings(max_examples=200, deadline=None)
def test_solve_matches_build(a, b):
    t = tasks.get("multiplication")
    s = t.build(a, b)
    assert t.solve(s.prompt) == s.target
    assert s.target.split("=")[1] == lsd(a * b)


@pytest.mark.parametrize(
    "params,name",
    [
        ({"digits": (0, 3)}, "digits"),
        ({"digits": (3, 1)}, "digits"),
        ({"digits_b": (0, 2)}, "digits_b"),
        ({"digits_b": (2, 1)}, "digits_b"),
        ({"digits_b": (1, 11)}, "digits_b"),
        ({"digits": (1, 12)}, "digits_b"),
    ],
)
def test_bad_params(params, name):
    with pytest.raises(ValueError, match=name):
        Multiplication(**params)


@pytest.mark.parametrize(
    "prompt", ["99*99", "99*99=1", "99+99=", "9*9*9=", "*9=", "9*=", "90*9=", "9*90=", "9a*9=", "99=99*", ""]
)
def test_bad_prompts(prompt):
    with pytest.raises(ValueError):
        tasks.get("multiplication").solve(prompt)
