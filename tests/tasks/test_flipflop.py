"""Flip-flop: docs/tasks.md example, references by hand, validity rules, flips off, sufficiency over random parameters.
"""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan.tasks.flipflop import FlipFlop
from tests.tasks.sufficiency import check_sufficiency


def test_spec_example():
    t = FlipFlop()
    assert t.solve("w11i10f10r10f11r1") == "1"
    assert t.solve("w11r11r1") == "1"
    assert t.solve("w10w01f00r0") == "0"


def _brute(prompt: str) -> tuple[str, tuple[int, ...]]:
    """Replay from the end: the target register's last w/r fixes the value, later flips toggle it."""
    reg, refs, flips = prompt[-1], [], 0
    for k in range(len(prompt) - 5, -1, -3):
        op, r, bit = prompt[k : k + 3]
        if r != reg:
            continue
        if op == "f":
            flips, refs = flips + 1, [k, k + 1, *refs]
        elif op in "wr":
            return str(int(bit) ^ (flips % 2)), (k + 2, *refs)
    raise AssertionError("never written")


def test_references_by_hand():
    t = FlipFlop()
    # w11 i10 f10 r10 f11 r1: last read's bit at 11, later flip op/register at 12, 13
    assert _brute("w11i10f10r10f11r1") == ("1", (11, 12, 13))
    for s in t.generate(300, seed=1):
        assert (s.target, s.references[0]) == _brute(s.prompt)
        assert len(s.prompt) == 3 * 9 + 2 and s.prompt[-2] == "r"


@pytest.mark.parametrize(
    "prompt",
    ["r11r1", "f11w11r1", "w11r10r1", "w11r0", "w21r2", "x11r1", "w11r", "w11w1", "w11i1", "w12r1", ""],
)
def test_invalid_prompts(prompt):
    with pytest.raises(ValueError):
        FlipFlop().solve(prompt)


def test_first_use_is_a_write_and_ignore_is_harmless():
    t = FlipFlop(instructions=(1, 30), registers=3)
    for s in t.generate(300, seed=2):
        seen = set()
        for k in range(0, s.prompt_len - 2, 3):
            op, reg = s.text[k : k + 2]
            if op in "rf" and reg not in seen:
                pytest.fail(f"{op} before write in {s.text}")
            if op == "w":
                seen.add(reg)
        assert s.text[-2] in seen
    assert t.solve("i01w11r1") == "1"


def test_flips_off():
    t = FlipFlop(instructions=(1, 40), flips=False)
    samples = t.generate(200, seed=3)
    assert all("f" not in s.prompt[0::3] for s in samples)
    assert "f" not in t.alphabet
    with pytest.raises(ValueError):
        t.solve("w11f10r1")


def test_necessity_of_the_bit():
    """Flipping the referenced write bit flips the target (a referenced read bit makes the prompt invalid)."""
    t = FlipFlop(instructions=(1, 20), registers=3)
    for s in t.generate(200, seed=4):
        p = s.references[0][0]
        new = s.prompt[:p] + "10"[int(s.prompt[p])] + s.prompt[p + 1 :]
        if s.prompt[p - 2] == "w":
            try:
                assert t.solve(new) != s.target
            except ValueError:  # a later read of the register now disagrees
                pass


@pytest.mark.parametrize(
    "params",
    [dict(registers=0), dict(registers=11), dict(registers=True), dict(instructions=(5, 2)), dict(instructions=0),
     dict(instructions=(-1, 3)), dict(flips="yes")],
)
def test_bad_params(params):
    name = next(iter(params))
    with pytest.raises(ValueError, match=name):
        FlipFlop(**params)


@settings(max_examples=30, deadline=None)
@given(lo=st.integers(1, 15), extra=st.integers(0, 15), registers=st.integers(1, 10), flips=st.booleans(),
       seed=st.integers(0, 2**32))
def test_random_params(lo, extra, registers, flips, seed):
    t = FlipFlop(instructions=(lo, lo + extra), registers=registers, flips=flips)
    rng = random.Random(seed)
    for s in t.generate(10, seed=seed):
        assert t.solve(s.prompt) == s.target
        assert set(s.text) <= set(t.alphabet) and len(s.text) <= t.max_text_len()
        assert lo <= (s.prompt_len - 2) // 3 <= lo + extra
        check_sufficiency(t, s, rng)


def test_registers_ten_uses_all_digits():
    t = FlipFlop(instructions=(50, 50), registers=10)
    assert set("".join(s.prompt[1::3] for s in t.generate(20))) == set("0123456789")


def _commands(prompt: str) -> int:
    """Commands as the public generator counts them: every 3-character instruction, plus the final bit-less read."""
    import re

    m = re.fullmatch(r"((?:[wrif][0-9][01])*)(r[0-9])", prompt)
    assert m, prompt
    return len(re.findall(r"[wrif][0-9][01]", m.group(1))) + 1


def test_presets_count_the_final_read_as_a_command():
    from aspan import tasks

    id_samples = tasks.preset("flipflop", "id").generate(200, seed=0)
    assert {len(s.prompt) for s in id_samples} == {29}  # 9 instructions + the read
    assert {_commands(s.prompt) for s in id_samples} == {10}
    ood = {_commands(s.prompt) for s in tasks.preset("flipflop", "ood").generate(3000, seed=0)}
    assert min(ood) == 11 and max(ood) == 100  # 10-99 instructions + the read
