"""Addition: docs/tasks.md example, hand-worked references, ID/OOD contract, sufficiency, padding, validation."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan import tasks
from aspan.tasks.addition import Addition
from tests.tasks.task_checks import check_determinism, check_samples


def lsd(x: int, width: int = 0) -> str:
    return str(x).zfill(width)[::-1]


def test_spec_example():
    t = tasks.get("addition")
    assert t.solve("0421+5334=") == "5755"  # 1240 + 4335 = 5575


def test_spec_example_references():
    # positions: 0421 -> 0..3, '+' 4, 5334 -> 5..8, '=' 9, sum digits 10..13
    expected = ((0, 5), (0, 1, 5, 6, 10), (1, 2, 6, 7, 11), (2, 3, 7, 8, 12))
    t = Addition(digits=(4, 4))
    s = t.build([1240, 4335])
    assert s.text == "0421+5334=5755" and s.prompt_len == 10
    assert s.references == expected


def test_carry_out_references():
    # 99 + 1 = 100: '99+1=' then '001'; the final carry digit reads op0 digit 1 (pos 1) and sum digit 1 (pos 6)
    s = Addition(digits=(1, 2)).build([99, 1])
    assert s.text == "99+1=001"
    assert s.references == ((0, 3), (0, 1, 3, 5), (1, 6))


def test_padding_references():
    # padded: 5 + 91 -> '50+19=' then '690' (96 padded to 3 digits); the top sum digit is a carry digit
    t = Addition(digits=(1, 2), padding=True)
    s = t.build([5, 91])
    assert s.text == "50+19=690"
    assert s.references == ((0, 3), (0, 1, 3, 4, 6), (1, 4, 7))
    assert t.solve("50+19=") == "690"
    assert t.solve("00+00=") == "000"
    with pytest.raises(ValueError):
        t.solve("5+19=")


def test_three_operands():
    t = tasks.get("addition", operands=3, digits=(1, 4))
    assert t.solve("9+9+9=") == "72"
    s = t.build([9, 9, 9])
    assert s.text == "9+9+9=72"
    assert s.references == ((0, 2, 4), (0, 2, 4, 6))
    samples, checked = check_samples(t, 200)
    assert checked > 1000
    assert all(s.prompt.count("+") == 2 for s in samples)


@pytest.mark.parametrize("split,lo,hi", [("id", 1, 4), ("ood", 5, 10)])
@pytest.mark.parametrize("padding", [False, True])
def test_contract(split, lo, hi, padding):
    task = tasks.preset("addition", split, padding=padding)
    samples, checked = check_samples(task, 250)
    assert checked > 1000
    seen = set()
    for s in samples:
        ops = s.prompt[:-1].split("+")
        assert len(ops) == 2
        values = [int(o[::-1]) for o in ops]
        if padding:
            assert len(ops[0]) == len(ops[1]) and lo <= len(ops[0]) <= hi
            assert s.target == lsd(sum(values), len(ops[0]) + 1)
        else:
            assert all(lo <= len(o) <= hi for o in ops)
            assert all(len(o) == len(str(v)) for o, v in zip(ops, values))  # canonical
            assert s.target == lsd(sum(values))
        seen.update(len(o) for o in ops)
        for refs in s.references:
            assert all(s.text[p].isdigit() for p in refs)
    if not padding:
        assert seen == set(range(lo, hi + 1))


def test_determinism():
    check_determinism(tasks.preset("addition", "id"))
    check_determinism(tasks.get("addition", operands=4, digits=(2, 6), padding=True))


@given(st.lists(st.integers(0, 10**12), min_size=2, max_size=10))
@settings(max_examples=200, deadline=None)
def test_solve_matches_int_sum(xs):
    t = Addition(operands=len(xs))
    assert t.solve("+".join(lsd(x) for x in xs) + "=") == lsd(sum(xs))


@pytest.mark.parametrize(
    "params,name",
    [
        ({"operands": 1}, "operands"),
        ({"operands": 11}, "operands"),
        ({"operands": 2.0}, "operands"),
        ({"operands": True}, "operands"),
        ({"digits": (0, 3)}, "digits"),
        ({"digits": (4, 2)}, "digits"),
        ({"digits": (-2, 2)}, "digits"),
        ({"digits": "ab"}, "digits"),
        ({"padding": "yes"}, "padding"),
    ],
)
def test_bad_params(params, name):
    with pytest.raises(ValueError, match=name):
        Addition(**params)


@pytest.mark.parametrize(
    "prompt",
    ["12+34", "12+34=5", "12+=", "+34=", "12+34+5=", "12=34=", "10+34=", "12+3a=", "1 2+34=", "12*34=", ""],
)
def test_bad_prompts(prompt):
    with pytest.raises(ValueError):
        tasks.get("addition").solve(prompt)


def test_zero_is_canonical():
    t = tasks.get("addition")
    assert t.solve("0+0=") == "0"
    assert t.solve("0+1=") == "1"
    with pytest.raises(ValueError):
        t.solve("00+1=")


def test_build_checks_its_input():
    with pytest.raises(ValueError):
        Addition().build([1, 2, 3])
    with pytest.raises(ValueError):
        Addition().build([1, -2])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 10**30), min_size=2, max_size=10),
    st.booleans(),
)
def test_solver_agrees_with_integer_arithmetic(xs, padding):
    """The column-by-column solver against Python's big integers, on up to 10 operands of up to 31 digits."""
    t = Addition(operands=len(xs), digits=(1, 31), padding=padding)
    width = max(len(str(x)) for x in xs) if padding else 0
    prompt = "+".join(lsd(x, width) for x in xs) + "="
    assert t.solve(prompt) == lsd(sum(xs), width + 1 if padding else 0)
    assert t.solve(prompt) == t.build(xs).target
