"""Readers that run the batch in chunks give what one whole-batch forward gives (padded inputs, every chunk size)."""
import pytest
import torch

import hooks
from hooks._stream import chunk_size
from tests.conftest import padded_batch

LENGTHS = [12, 5, 9, 12, 7]  # batch 5: chunks of 2 hold different numbers of target rows
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture
def batch():
    return padded_batch(LENGTHS, seed=7)


@pytest.mark.parametrize("size", [1, 2, 5])
def test_every_reader_chunked_equals_whole_batch(model, batch, size):
    tokens, am, mask = batch
    whole = hooks.ScoreOptions(batch_size=len(LENGTHS))
    cases = [
        lambda o: hooks.head_row_scores(model, tokens, mask, attention_mask=am, options=o),
        lambda o: hooks.head_row_scores(model, tokens, mask, heads=[(2, 1), (0, 3)], attention_mask=am, options=o),
        lambda o: hooks.head_scores(model, tokens, mask, attention_mask=am, options=o),
        lambda o: hooks.head_scores(model, tokens, mask, reduce="row", attention_mask=am, options=o),
        lambda o: hooks.offset_scores(model, tokens, mask, deltas=[-1, 0, 2], attention_mask=am,
                                      options=hooks.OffsetOptions(reduce="sum", batch_size=o.batch_size)),
        lambda o: hooks.offset_scores(model, tokens, mask, deltas=[-1, 0, 2], attention_mask=am,
                                      options=hooks.OffsetOptions(batch_size=o.batch_size)),
        lambda o: hooks.rollout(model, tokens, attention_mask=am, batch_size=o.batch_size),
        lambda o: hooks.rollout_scores(model, tokens, mask, attention_mask=am, options=o),
    ]
    for fn in cases:
        torch.testing.assert_close(fn(hooks.ScoreOptions(batch_size=size)), fn(whole), **TOL)


def test_row_mean_is_over_all_target_rows_not_a_mean_of_chunk_means(model, batch):
    tokens, am, mask = batch
    rows = hooks.target_rows(mask, am)
    per_chunk_rows = [int(rows[i : i + 2].sum()) for i in range(0, 5, 2)]
    assert len(set(per_chunk_rows)) > 1  # the chunks really differ in size
    row = hooks.head_row_scores(model, tokens, mask, attention_mask=am, options=hooks.ScoreOptions(batch_size=5))
    expected = row[rows].mean(0)
    two = hooks.ScoreOptions(batch_size=2)
    got = hooks.head_scores(model, tokens, mask, reduce="row", attention_mask=am, options=two)
    torch.testing.assert_close(got, expected, **TOL)
    chunk_means = torch.stack([row[i : i + 2][rows[i : i + 2]].mean(0) for i in range(0, 5, 2)]).mean(0)
    assert not torch.allclose(got, chunk_means, **TOL)
    off = hooks.offset_scores(model, tokens, mask, [0], am, options=hooks.OffsetOptions(batch_size=2))
    torch.testing.assert_close(off[0], expected, **TOL)


def test_one_chunk_is_bit_identical_to_the_default_on_small_inputs(model, batch):
    tokens, am, mask = batch
    assert chunk_size(model, tokens, None) >= len(LENGTHS)  # tiny patterns: the default is one forward
    assert torch.equal(hooks.head_scores(model, tokens, mask, attention_mask=am),
                       hooks.head_scores(model, tokens, mask, attention_mask=am,
                                         options=hooks.ScoreOptions(batch_size=5)))


def test_default_chunk_bounds_the_pattern(model):
    pos = 1024
    size = chunk_size(model, torch.zeros(64, pos, dtype=torch.long), None)
    assert size >= 1 and size * model.cfg.n_heads * pos * pos * 4 <= hooks._stream.CHUNK_BYTES
    assert chunk_size(model, torch.zeros(2, 100_000, dtype=torch.long), None) == 1  # at least one sample
    assert chunk_size(model, torch.zeros(2, 8, dtype=torch.long), 3) == 3


def test_forwards_per_call_and_bad_batch_size(model, batch):
    tokens, am, mask = batch
    calls = []
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: calls.append(x.shape[0]))]):
        hooks.head_scores(model, tokens, mask, attention_mask=am, options=hooks.ScoreOptions(batch_size=2))
        assert calls == [2, 2, 1]
        calls.clear()
        for bad in (0, -1, 1.5, True, "2"):
            with pytest.raises(ValueError, match="batch_size"):
                hooks.rollout(model, tokens, batch_size=bad)
        with pytest.raises(ValueError, match="attention_mask"):  # checked for the whole batch before the first chunk
            hooks.head_scores(model, tokens, mask, attention_mask=am[:3], options=hooks.ScoreOptions(batch_size=2))
        assert not calls
    assert all(not hp._forward_hooks for hp in model.hook_dict.values())
