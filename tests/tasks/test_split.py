"""`aspan.tasks.split`: the hash split's sides and thirds, and `distinct` (no repeats, nothing excluded, the stream's
own draw where that has neither)."""
from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan.tasks.parity import Parity
from aspan.tasks.split import SplitTask, distinct, fraction, held_out, part_of, prompt_key


@given(key=st.text(max_size=12), share=st.floats(0.01, 0.99), parts=st.integers(1, 5))
def test_the_parts_slice_the_held_out_side_and_nothing_else(key, share, parts):
    p = part_of(key, share, parts)
    assert (p is None) == (not held_out(key, share))
    if p is not None:
        assert 0 <= p < parts and p * share / parts <= fraction(key) < (p + 1) * share / parts


def test_a_part_keeps_only_its_slice_and_the_training_side_takes_no_part():
    task = Parity(length=(1, 8), format="plain")
    key = lambda s: task.bits(s.text[: s.prompt_len])  # noqa: E731
    seen = [{key(s) for s in SplitTask(task, "held_out", 0.5, key, part=(i, 3)).generate(300, seed=4)}
            for i in range(3)]
    assert all(seen) and not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])
    assert all(part_of(b, 0.5, 3) == i for i, bits in enumerate(seen) for b in bits)
    with pytest.raises(ValueError, match="held-out side only"):
        SplitTask(task, "train", 0.5, key, part=(0, 3))
    with pytest.raises(ValueError, match="0 <= index < count"):
        SplitTask(task, "held_out", 0.5, key, part=(3, 3))


@settings(deadline=None, max_examples=30)
@given(n=st.integers(0, 80), seed=st.integers(0, 2**32), excluded=st.integers(0, 20))
def test_distinct_draws_no_repeat_nothing_excluded_and_stops_at_a_counted_pool(n, seed, excluded):
    task = Parity(length=(1, 5), format="plain")  # 62 inputs
    every = sorted("".join(b) for k in range(1, 6) for b in product("01", repeat=k))
    exclude = {prompt_key(s) for s in Parity(length=(1, 5), format="plain").generate(excluded, seed=seed + 1)}
    out = [prompt_key(s) for s in distinct(task, n, seed, exclude=exclude, pool=len(every) - len(exclude))]
    assert len(set(out)) == len(out) == min(n, len(every) - len(exclude)) and not set(out) & exclude
    stream = [prompt_key(s) for s in task.generate(3 * n + 400, seed=seed)]
    firsts = list(dict.fromkeys(k for k in stream if k not in exclude))  # the stream's own draw, repeats skipped
    assert out == firsts[: len(out)] or len(firsts) < len(out)


def test_distinct_refuses_a_pool_nobody_counted_that_runs_dry(monkeypatch):
    monkeypatch.setattr("aspan.tasks.split.MAX_REDRAWS", 50)
    with pytest.raises(ValueError, match=r"only 2 distinct inputs of the 5 asked for in 50 draws in a row"):
        distinct(Parity(length=1, format="plain"), 5, seed=0)
