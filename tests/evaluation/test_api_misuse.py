"""The Python API refuses what the command line refuses, with the same words: anything but `Sample`s, a reference
offset outside every sequence (`evaluate(delta=...)`, `rank_heads(deltas=...)`), a hook that returns an activation of
another shape, and hand-built samples whose references their task's rule contradicts (`tasks.check_sample`)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspan import tasks
from aspan.errors import UsageError
from aspan.evaluation import evaluate
from aspan.experiments.ranking import rank_heads
from aspan.tasks import Sample

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
REVERSAL = tasks.get("reversal", length=(1, 4), charset="abcd")


@pytest.fixture(scope="module")
def samples():
    return REVERSAL.generate(3, seed=0)


def longest(tok, samples) -> int:
    return max(tok.offset + len(s.text) + (tok.eos_id is not None) for s in samples)


@pytest.mark.parametrize("bad", [["ab=ba"], [{"text": "ab=ba"}], [None]])
def test_anything_but_samples_is_refused_naming_it(random_model, tok, bad):
    for call in (lambda: evaluate(random_model, tok, bad, any_task=True), lambda: rank_heads(random_model, tok, bad)):
        with pytest.raises(UsageError, match=r"sample 0 is a \w+ .*not an aspan Sample"):
            call()


@SETTINGS
@given(st.integers(-(10**12), 10**12))
def test_offsets_outside_every_sequence_are_refused_like_the_command_line(random_model, tok, samples, delta):
    n = longest(tok, samples)
    if abs(delta) < n:
        return  # a valid offset: scored (the evaluation tests cover what it gives)
    with pytest.raises(UsageError, match=f"offset {delta} is outside every sequence"):
        evaluate(random_model, tok, samples, heads=[(0, 0)], delta=delta, any_task=True)
    with pytest.raises(UsageError, match=f"offset {delta} is outside every sequence"):
        rank_heads(random_model, tok, samples, deltas=[delta])


@pytest.mark.parametrize("edit", [lambda a: a[0], lambda a: a[..., :-1], lambda a: a[..., None], lambda a: a.sum(),
                                  lambda a: a.tolist()])
def test_a_hook_returning_another_shape_is_refused_naming_the_hook_point(random_model, tok, samples, edit):
    hooks = [("blocks.0.attn.hook_pattern", lambda act, hook: edit(act))]
    with pytest.raises(ValueError, match="the hook on 'blocks.0.attn.hook_pattern' returned .* a hook must return"):
        evaluate(random_model, tok, samples, fwd_hooks=hooks, any_task=True, attn=False)
    assert not any(h.fwd_hooks for h in random_model.hook_dict.values())  # no hook left attached


def test_a_hook_of_the_right_shape_or_none_still_runs(random_model, tok, samples):
    base = evaluate(random_model, tok, samples, any_task=True, attn=False).summary()
    same = evaluate(random_model, tok, samples, any_task=True, attn=False,
                    fwd_hooks=[("blocks.0.attn.hook_pattern", lambda act, hook: act.clone()),
                               ("blocks.0.hook_resid_pre", lambda act, hook: None)]).summary()
    assert same == base


@SETTINGS
@given(st.data())
def test_hand_built_samples_with_wrong_references_are_refused_before_scoring(random_model, tok, data):
    s = REVERSAL.generate(1, seed=data.draw(st.integers(0, 1000)))[0]
    refs = data.draw(st.lists(st.lists(st.integers(0, s.prompt_len - 1), max_size=2).map(tuple),
                              min_size=len(s.references), max_size=len(s.references)).map(tuple))
    hand = Sample(s.text, s.prompt_len, refs, task=s.task, params=s.params)
    if refs == s.references:
        assert tasks.check_sample(hand) is hand
        return
    with pytest.raises(ValueError, match="field 'references'"):
        tasks.check_sample(hand)
    with pytest.raises(UsageError, match="evaluate: sample 0 .*field 'references'"):
        evaluate(random_model, tok, [hand], any_task=True)


def test_training_on_strings_is_refused_naming_the_sample(tok):
    from aspan import models
    from aspan.training import TrainConfig, train

    model = models.tiny(tok, n_layers=1, n_heads=2, d_model=16, d_mlp=16, n_ctx=32, device="cpu")
    with pytest.raises(ValueError, match="training data: sample 1 is a str, not an aspan Sample"):
        train(model, tok, [REVERSAL.generate(1)[0], "ab=ba"], TrainConfig(steps=1, batch_size=2), progress=False)


def test_every_function_that_batches_samples_refuses_strings(random_model, tok):
    """Profiling, editing and everything else that tokenises samples goes through `make_batch`."""
    from aspan.batching import make_batch

    with pytest.raises(ValueError, match="make_batch: sample 0 is a str, not an aspan Sample"):
        make_batch(["ab=ba"], tok)
