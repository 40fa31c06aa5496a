"""The padded layout of Duan & Shi (2023, Section 4) for addition, successor and parity: the paper's own example,
values against plain integer arithmetic, sufficiency of the references, positions that never move, parameters that
round-trip, and bad parameters refused."""
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan import tasks
from tests.tasks.sufficiency import check_sufficiency

PADDED = {
    "addition": dict(operands=2, digits=(1, 6), layout="padded", width=7),
    "addition3": dict(operands=3, digits=(2, 4), layout="padded", width=5),
    "successor": dict(start=(0, 999_999), numbers=2, layout="padded", width=7),
    "parity": dict(length=(1, 20), layout="padded", width=22),
}


def task_of(case: str) -> tasks.Task:
    return tasks.get(case.rstrip("0123456789"), **PADDED[case])


def test_the_papers_example():
    s = tasks.get("addition", digits=(1, 4), layout="padded", width=4).build([123, 748])
    assert (s.prompt, s.target) == ("0123+0748=", "17800")  # 0123 + 0748 -> 1780, with the carry digit
    # sum digit 1 (7): tens of both operands (positions 2, 7), their units (3, 8) for the carry, sum digit 0 (10)
    assert s.references[1] == (2, 3, 7, 8, 10)


@pytest.mark.parametrize("case", list(PADDED))
def test_solver_sufficiency_and_fixed_positions(case):
    task = task_of(case)
    rng = random.Random(case)
    samples = task.generate(300, seed=3)
    checked = 0
    for s in samples:
        assert task.solve_like(s.prompt, s.target) == s.target
        assert set(s.text) <= set(task.alphabet) and len(s.text) == task.max_text_len()
        assert tasks.Sample.from_dict(json.loads(s.to_json())) == s
        checked += check_sufficiency(task, s, rng, tries_per_row=3)
    assert checked >= 300
    # the layout's point: every sample of a width has the same prompt length and the same reference positions
    assert len({(s.prompt_len, s.references) for s in samples}) == 1


@settings(max_examples=200, deadline=None)
@given(xs=st.lists(st.integers(0, 10**6 - 1), min_size=2, max_size=2), width=st.integers(6, 9))
def test_addition_and_successor_equal_integer_arithmetic(xs, width):
    add = tasks.get("addition", digits=(1, 6), layout="padded", width=width).build(xs)
    assert add.prompt == f"{xs[0]:0{width}d}+{xs[1]:0{width}d}="
    assert add.target[::-1] == f"{sum(xs):0{width + 1}d}"
    succ = tasks.get("successor", start=(0, 10**6 - 1), numbers=2, layout="padded", width=width).build(xs[0], 2)
    assert succ.prompt == f"{xs[0]:0{width}d}," and succ.target[::-1] == f"{xs[0] + 1:0{width + 1}d}"


def test_parity_is_the_running_parity_of_a_number_of_the_drawn_length():
    task = task_of("parity")
    for s in task.generate(200, seed=1):
        bits = s.prompt[:-1]
        n = len(bits.lstrip("0")) or 1
        assert 1 <= n <= 20 and len(bits) == 22
        assert s.target == "".join(str(bits[: i + 1].count("1") % 2) for i in range(22))


@pytest.mark.parametrize("case", list(PADDED))
def test_params_round_trip_and_the_default_layout_keeps_its_params(case):
    task = task_of(case)
    again = tasks.from_params(task.name, json.loads(json.dumps(task.params())))
    assert again.params() == task.params() and again.generate(10, seed=2) == task.generate(10, seed=2)
    assert "layout" not in tasks.preset(task.name, "id").params()  # committed samples keep their parameters


@pytest.mark.parametrize("name, params", [
    ("addition", dict(digits=(1, 6), layout="padded", width=5)),  # narrower than the longest operand
    ("addition", dict(digits=(1, 3), layout="padded")),  # no width
    ("addition", dict(digits=(1, 3), width=4)),  # width without the padded layout
    ("addition", dict(digits=(1, 3), layout="padded", width=4, padding=True)),
    ("addition", dict(digits=(1, 3), layout="msd", width=4)),
    ("successor", dict(start=(0, 99), numbers=(2, 3), layout="padded", width=3)),
    ("parity", dict(length=(1, 5), format="plain", scratchpad=False, layout="padded", width=6)),
])
def test_bad_layouts_are_refused(name, params):
    with pytest.raises(ValueError, match="layout|width|padding"):
        tasks.get(name, **params)


def test_a_prompt_of_another_width_is_not_solved():
    task = tasks.get("addition", digits=(1, 3), layout="padded", width=4)
    with pytest.raises(ValueError):
        task.solve("123+0748=")


@settings(max_examples=100, deadline=None)
@given(x=st.integers(0, 2**22 - 1))
def test_parity_builds_a_number_in_binary_like_the_samples_it_draws(x):
    task = task_of("parity")
    s = task.build(x)
    assert s.prompt == format(x, "b").zfill(22) + "=" and int(s.prompt[:-1], 2) == x
    assert s.target == task.solve(s.prompt)
    drawn = task.generate(1, seed=x)[0]  # the same layout: prompt length, references, parameters
    assert (s.prompt_len, s.references, s.params) == (drawn.prompt_len, drawn.references, drawn.params)


@pytest.mark.parametrize("x", [2**22, -1, 1.5, True])
def test_parity_build_refuses_what_does_not_fit_the_width(x):
    with pytest.raises(ValueError, match="build"):
        task_of("parity").build(x)
    with pytest.raises(ValueError, match="padded"):
        tasks.get("parity", length=(1, 5)).build(3)
