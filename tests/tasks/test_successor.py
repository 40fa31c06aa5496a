"""Successor: docs/tasks.md example with hand-worked references, length handling, ID/OOD contract, sufficiency,
validation."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan import tasks
from aspan.tasks.successor import Successor
from tests.tasks.task_checks import check_determinism, check_samples


def lsd(x: int) -> str:
    return str(x)[::-1]


def test_spec_example():
    t = tasks.get("successor")
    assert t.solve("21,", 8) == "31,41,51"  # LSD-first 12, 13, 14, 15
    s = t.build(12, 4)
    assert s.text == "21,31,41,51" and s.prompt_len == 3
    # positions: '21' 0-1, ',' 2, '31' 3-4, ',' 5, '41' 6-7, ',' 8, '51' 9-10
    assert s.references == ((0,), (0, 1, 3), (), (3,), (3, 4, 6), (), (6,), (6, 7, 9))


def test_new_digit_references():
    # 99 -> 100: the new top digit reads digit 1 of 99 (pos 1) and digit 1 of 100 (pos 4)
    s = tasks.get("successor").build(99, 2)
    assert s.text == "99,001"
    assert s.references == ((0,), (0, 1, 3), (1, 4))


def test_solve_lengths():
    t = tasks.get("successor")  # numbers (2, 4): without length, the next 3 numbers
    assert t.solve("21,") == "31,41,51"
    assert t.solve("21,", 0) == ""
    assert t.solve("21,", 3) == "31,"
    assert t.solve("99,", 5) == "001,1"
    assert t.solve("0,", 7) == "1,2,3,4"
    assert Successor(numbers=(2, 2)).solve("9,") == "01"
    s = t.build(5, 3)
    assert t.solve_like(s.prompt, s.target) == s.target == "6,7"


@pytest.mark.parametrize("split,start,count", [("id", (1, 90), (2, 4)), ("ood", (100, 900), (5, 6))])
def test_contract(split, start, count):
    task = tasks.preset("successor", split)
    samples, checked = check_samples(task, 400, tries_per_row=4)
    assert checked > (500 if split == "id" else 2000)  # ID prompts have only 1-2 digits to perturb
    starts, counts = set(), set()
    for s in samples:
        parts = s.text.split(",")
        values = [int(p[::-1]) for p in parts]
        assert all(p == lsd(v) for p, v in zip(parts, values))  # canonical
        assert values == list(range(values[0], values[0] + len(values)))
        assert s.prompt == parts[0] + ","
        assert start[0] <= values[0] <= start[1] and count[0] <= len(values) <= count[1]
        starts.add(values[0])
        counts.add(len(values))
        for j, refs in enumerate(s.references):
            assert all(s.text[p].isdigit() for p in refs)
            assert bool(refs) == (s.target[j] != ",")
    assert counts == set(range(count[0], count[1] + 1))
    assert min(starts) < start[0] + 10 and max(starts) > start[1] - 10


def test_determinism():
    check_determinism(tasks.preset("successor", "ood"))


@given(st.integers(0, 10**15), st.integers(0, 60))
@settings(max_examples=200, deadline=None)
def test_solve_matches_int_series(x, length):
    series = ",".join(lsd(x + m) for m in range(1, 40))
    assert tasks.get("successor").solve(lsd(x) + ",", length) == series[:length]


@pytest.mark.parametrize(
    "params,name",
    [
        ({"start": (-1, 5)}, "start"),
        ({"start": (9, 5)}, "start"),
        ({"numbers": (1, 3)}, "numbers"),
        ({"numbers": (4, 3)}, "numbers"),
        ({"numbers": "x"}, "numbers"),
    ],
)
def test_bad_params(params, name):
    with pytest.raises(ValueError, match=name):
        Successor(**params)


@pytest.mark.parametrize("prompt", ["21", ",", "21,31,", "210,", "2a,", "-1,", "", "21=", "2 1,"])
def test_bad_prompts(prompt):
    with pytest.raises(ValueError):
        tasks.get("successor").solve(prompt, 5)


@pytest.mark.parametrize("length", [-1, 2.5, True])
def test_bad_length(length):
    with pytest.raises(ValueError, match="length"):
        tasks.get("successor").solve("21,", length)


def test_only_successor_is_open_ended():
    from aspan import tasks

    assert [n for n in tasks.NAMES if tasks.task_class(n).open_ended] == ["successor"]
