"""Reversal: docs/tasks.md example, contract on ID/OOD samples, sufficiency, parameter and prompt validation."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan import tasks
from aspan.tasks.reversal import DEFAULT_CHARSET, Reversal
from tests.tasks.task_checks import check_determinism, check_samples


def test_spec_example():
    t = tasks.get("reversal")
    assert t.solve("dh13H=") == "H31hd"
    # 'dh13H' has n=5: target j references 4-j
    refs = ((4,), (3,), (2,), (1,), (0,))
    s = tasks.Sample("dh13H=H31hd", 6, refs, task="reversal")
    assert [s.text[r[0]] for r in s.references] == list(s.target)


def test_defaults_and_presets():
    assert len(DEFAULT_CHARSET) == 62
    assert tasks.get("reversal").params() == tasks.preset("reversal", "id").params()
    assert tasks.preset("reversal", "ood").length == (11, 50)
    assert "=" in tasks.get("reversal").alphabet


@pytest.mark.parametrize("split,lo,hi", [("id", 1, 10), ("ood", 11, 50)])
def test_contract(split, lo, hi):
    task = tasks.preset("reversal", split)
    samples, checked = check_samples(task, 300)
    assert checked > 1000
    for s in samples:
        n = s.prompt_len - 1
        assert lo <= n <= hi and s.text[n] == "="
        assert s.references == tuple((n - 1 - j,) for j in range(n))
        assert all(s.text[r[0]] == s.target[j] for j, r in enumerate(s.references))
    lengths = {s.prompt_len - 1 for s in samples}
    assert min(lengths) == lo and max(lengths) == hi


def test_determinism():
    check_determinism(tasks.preset("reversal", "id"))


def test_small_charset():
    t = Reversal(length=(3, 3), charset="ab")
    s = t.generate(1, seed=0)[0]
    assert set(s.text) <= {"a", "b", "="} and t.alphabet == "=ab"
    assert t.legal_swaps("ab=", 0) == "b" and t.legal_swaps("ab=", 2) == ""


@given(st.text(alphabet=DEFAULT_CHARSET, min_size=1, max_size=60))
@settings(max_examples=200, deadline=None)
def test_solve_any_string(s):
    assert tasks.get("reversal").solve(s + "=") == "".join(reversed(s))


@pytest.mark.parametrize(
    "params,name",
    [
        ({"length": (0, 3)}, "length"),
        ({"length": (5, 2)}, "length"),
        ({"length": (-1, 2)}, "length"),
        ({"charset": "abca"}, "charset"),
        ({"charset": "ab="}, "charset"),
        ({"charset": "ab,"}, "charset"),
        ({"charset": "a"}, "charset"),
        ({"charset": ""}, "charset"),
    ],
)
def test_bad_params(params, name):
    with pytest.raises(ValueError, match=name):
        Reversal(**params)


@pytest.mark.parametrize("prompt", ["", "=", "abc", "ab=c=", "ab!=", "a b="])
def test_bad_prompts(prompt):
    with pytest.raises(ValueError):
        tasks.get("reversal").solve(prompt)
