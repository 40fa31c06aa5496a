"""The options objects of the readers and edits: a field given as `options=` or as a keyword gives the same result,
the keywords win over the object, and a wrong keyword or object fails with one line before any forward."""
import dataclasses
import typing

import pytest
import torch

import hooks
from hooks.options import SETTINGS
from tests.conftest import padded_batch

HEADS = [(0, 1), (1, 3), (2, 0)]


@pytest.mark.parametrize("kind", sorted(SETTINGS, key=lambda k: k.__name__), ids=lambda k: k.__name__)
def test_each_options_class_and_its_keywords_name_the_same_fields(kind):
    assert set(typing.get_type_hints(SETTINGS[kind])) == {f.name for f in dataclasses.fields(kind)}
    assert all(f.default is not dataclasses.MISSING for f in dataclasses.fields(kind))  # every field has a default
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(kind(), dataclasses.fields(kind)[0].name, None)


def test_the_edits_give_the_same_hooks_from_an_object_or_keywords(model):
    tokens, am, mask = padded_batch([12, 9], seed=11)
    rows = hooks.rows_beyond(tokens, 5)
    pairs = [
        (hooks.reinforce(HEADS, mask, 0.7, options=hooks.ReinforceOptions(threshold=0.02, renormalize=True, rows=rows)),
         hooks.reinforce(HEADS, mask, 0.7, threshold=0.02, renormalize=True, rows=rows)),
        (hooks.steer(HEADS, mask, alpha=0.1, options=hooks.SteerOptions(mode="include", gate_below=0.5)),
         hooks.steer(HEADS, mask, alpha=0.1, mode="include", gate_below=0.5)),
        (hooks.patch_pattern(HEADS, mask, delta=1, options=hooks.EditOptions(rows=rows)),
         hooks.patch_pattern(HEADS, mask, delta=1, rows=rows)),
    ]
    plain = model(tokens, attention_mask=am)
    for by_object, by_keyword in pairs:
        got = model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=by_object)
        assert (got - plain).abs().max() > 1e-4  # the options reach the edit, which does something
        assert torch.equal(got, model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=by_keyword))


def test_a_keyword_wins_over_the_object(model):
    tokens, am, mask = padded_batch([10, 8], seed=12)
    gated = hooks.ReinforceOptions(rows=torch.zeros(2, 10, dtype=torch.bool))  # no row may be edited
    plain = model(tokens, attention_mask=am)
    assert torch.equal(model.run_with_hooks(tokens, attention_mask=am,
                                            fwd_hooks=hooks.reinforce(HEADS, mask, 1.0, options=gated)), plain)
    opened = hooks.reinforce(HEADS, mask, 1.0, options=gated, rows=None)
    assert not torch.equal(model.run_with_hooks(tokens, attention_mask=am, fwd_hooks=opened), plain)


def test_the_readers_give_the_same_scores_from_an_object_or_keywords(model):
    tokens, am, mask = padded_batch([12, 9, 7], seed=13)
    cols = am.bool().clone()
    cols[:, 0] = False
    score = hooks.ScoreOptions(columns=cols, batch_size=2)
    same = [
        (hooks.head_scores(model, tokens, mask, "row", am, options=score),
         hooks.head_scores(model, tokens, mask, "row", am, columns=cols, batch_size=2)),
        (hooks.head_row_scores(model, tokens, mask, attention_mask=am, options=score),
         hooks.head_row_scores(model, tokens, mask, attention_mask=am, columns=cols, batch_size=2)),
        (hooks.rollout_scores(model, tokens, mask, am, options=score),
         hooks.rollout_scores(model, tokens, mask, am, columns=cols, batch_size=2)),
        (hooks.offset_scores(model, tokens, mask, [0, 1], am, options=hooks.OffsetOptions(reduce="sum", columns=cols)),
         hooks.offset_scores(model, tokens, mask, [0, 1], am, reduce="sum", columns=cols)),
        (hooks.capture(model, tokens, [(1, 2)], options=hooks.CaptureOptions(rows=[3, 5], cols=slice(1, 6)))[(1, 2)],
         hooks.capture(model, tokens, [(1, 2)], rows=[3, 5], cols=slice(1, 6))[(1, 2)]),
    ]
    for by_object, by_keyword in same:
        torch.testing.assert_close(by_object, by_keyword, rtol=0, atol=0)
    # the columns reach the reader: the `sample` denominator leaves column 0 out, so the shares grow
    raw = hooks.head_scores(model, tokens, mask, "row", am)
    assert (same[0][0] >= raw - 1e-6).all() and (same[0][0] > raw + 1e-4).any()


def test_an_unknown_keyword_or_a_foreign_options_object_fails_before_any_forward(model):
    tokens, am, mask = padded_batch([8], seed=14)
    calls = []
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: calls.append(1))]):
        with pytest.raises(TypeError, match=r"reinforce\(\) got an unexpected keyword argument 'mode'"):
            hooks.reinforce(HEADS, mask, 1.0, mode="include")
        with pytest.raises(TypeError, match="head_row_scores.*'reduce'"):  # a field of OffsetOptions only
            hooks.head_row_scores(model, tokens, mask, attention_mask=am, reduce="row")
        with pytest.raises(ValueError, match="options must be a hooks.SteerOptions, got ReinforceOptions"):
            hooks.steer(HEADS, mask, options=hooks.ReinforceOptions())
        with pytest.raises(ValueError, match="options must be a hooks.OffsetOptions, got ScoreOptions"):
            hooks.offset_scores(model, tokens, mask, [0], options=hooks.ScoreOptions())
        with pytest.raises(ValueError, match="options must be a hooks.CaptureOptions, got dict"):
            hooks.capture(model, tokens, [(0, 0)], options={"rows": [1]})
    assert not calls
