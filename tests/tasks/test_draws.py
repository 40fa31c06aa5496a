"""`aspan.tasks.draws`: a length mix draws the length uniformly, a number draw only from its pool."""
from __future__ import annotations

from collections import Counter

import pytest

from aspan import tasks
from aspan.tasks import check_sample
from aspan.tasks.draws import LengthMix, NumberDraw


def test_length_mix_draws_each_length_about_equally_and_keeps_its_parts_rules():
    parts = [tasks.get("addition", operands=2, digits=(n, n)) for n in (1, 2, 3)]
    mix = LengthMix(parts)
    samples = mix.generate(600, seed=0)
    counts = Counter(len(s.prompt.split("+")[0]) for s in samples)
    assert set(counts) == {1, 2, 3} and min(counts.values()) > 150
    for s in samples[:50]:
        check_sample(s)
    assert mix.params() == {"mix": [p.params() for p in parts]} and mix.max_text_len() == parts[-1].max_text_len()
    with pytest.raises(ValueError, match="at least one task"):
        LengthMix([])


def test_number_draw_takes_operands_from_its_pool_only():
    base = tasks.get("addition", operands=2, digits=(1, 3), layout="padded", width=3)
    pool = [7, 42, 311]
    draw = NumberDraw(base, pool)
    for s in draw.generate(40, seed=1):
        check_sample(s)
        assert {int(x) for x in s.prompt.rstrip("=").split("+")} <= set(pool), s.prompt
    assert draw.params()["numbers"] == 3
    with pytest.raises(ValueError, match="NumberDraw builds"):
        NumberDraw(tasks.get("reversal"), pool)
