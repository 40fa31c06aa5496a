"""`evaluate`'s settings: one `EvalOptions` dataclass, its fields also typed keywords (`EvalSettings`) that earlier
calls use; the two spellings give the same result, keywords win over `options`, an unknown keyword is refused."""
import typing
from dataclasses import fields

import pandas as pd
import pytest
import torch

from aspan import evaluation as ev
from aspan.generation import GreedySettings, greedy


def test_the_keywords_are_the_options_fields_with_their_types():
    keywords = typing.get_type_hints(ev.EvalSettings)
    options = typing.get_type_hints(ev.EvalOptions)
    assert list(keywords) == [f.name for f in fields(ev.EvalOptions)]
    assert keywords == options


def test_options_and_keywords_give_the_same_result(random_model, tok, mixed_samples):
    fwd = [("blocks.0.hook_resid_post", lambda x, hook: -x)]  # changes what the model writes
    by_keyword = ev.evaluate(random_model, tok, mixed_samples, mode="generate", batch_size=3, heads=[(1, 0)],
                             fwd_hooks=fwd)
    options = ev.EvalOptions(mode="generate", batch_size=3, heads=[(1, 0)], fwd_hooks=fwd)
    by_options = ev.evaluate(random_model, tok, mixed_samples, options=options)
    pd.testing.assert_frame_equal(by_keyword.records, by_options.records, check_exact=True)
    assert by_options.mode == "generate" and by_options.records.attn_heads_sample.notna().any()
    plain = ev.evaluate(random_model, tok, mixed_samples, options=ev.EvalOptions(mode="generate", batch_size=3))
    assert not plain.records.pred_char.equals(by_options.records.pred_char)  # the hooks were in the options
    streamed = ev.evaluate_stream(random_model, tok, iter(mixed_samples), chunk=64, options=options)
    pd.testing.assert_frame_equal(pd.concat([c.records for c in streamed], ignore_index=True), by_options.records,
                                  check_exact=True)


def test_keywords_override_the_options(random_model, tok, mixed_samples):
    both = ev.evaluate(random_model, tok, mixed_samples, options=ev.EvalOptions(mode="generate", attn=False),
                       mode="teacher")
    teacher = ev.evaluate(random_model, tok, mixed_samples, attn=False)
    assert both.mode == "teacher"
    pd.testing.assert_frame_equal(both.records, teacher.records, check_exact=True)
    assert ev.eval_options(ev.EvalOptions(delta=2), {"batch_size": 4}) == ev.EvalOptions(delta=2, batch_size=4)


def test_an_unknown_keyword_or_a_positional_setting_is_refused(random_model, tok, mixed_samples):
    with pytest.raises(TypeError, match=r"evaluate\(\) got an unexpected keyword argument 'batchsize'"):
        ev.evaluate(random_model, tok, mixed_samples, batchsize=4)
    with pytest.raises(TypeError, match=r"evaluate_stream\(\) got an unexpected keyword argument 'modes'"):
        ev.evaluate_stream(random_model, tok, mixed_samples, modes="teacher")
    with pytest.raises(TypeError):
        ev.evaluate(random_model, tok, mixed_samples, ())  # the settings are keywords (or `options`)


def test_greedy_keywords(random_model, tok):
    prompt = torch.tensor([tok.prefix_ids() + tok.encode("abc=")])
    assert set(typing.get_type_hints(GreedySettings)) == {"use_cache", "fwd_hooks", "forced"}
    free = greedy(random_model, prompt, 4)
    assert torch.equal(free, greedy(random_model, prompt, 4, use_cache=False))
    forced = torch.tensor([[free[0, 0].item() + 1, -1, -1, -1]])
    assert greedy(random_model, prompt, 4, forced=forced)[0, 0] == forced[0, 0]
    with pytest.raises(TypeError, match="unexpected keyword argument 'cache'"):
        greedy(random_model, prompt, 4, cache=False)
    assert ev.greedy is greedy  # still importable from aspan.evaluation
