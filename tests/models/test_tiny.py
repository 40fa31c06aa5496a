"""The tiny from-scratch model: architecture, seeding, and the up-front context check."""
import pytest
import torch

from aspan import models, tasks
from aspan.tokenization import CharTokenizer


def test_defaults_follow_the_brief():
    tok = CharTokenizer()
    m = models.tiny(tok, device="cpu")
    c = m.cfg
    assert (c.n_layers, c.d_model, c.n_heads, c.d_head, c.d_mlp, c.n_ctx) == (2, 128, 8, 16, 512, 256)
    assert (c.positional_embedding_type, c.normalization_type, c.act_fn) == ("rotary", "LN", "gelu")
    assert c.d_vocab == tok.vocab_size
    logits = m(torch.tensor([tok.prefix_ids() + tok.encode("abc=cba")]))
    assert logits.shape == (1, 8, tok.vocab_size)


def test_seed_decides_the_weights_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = models.tiny(30, d_model=32, n_heads=4, seed=1, device="cpu")
    after = torch.rand(1)
    b = models.tiny(30, d_model=32, n_heads=4, seed=1, device="cpu")
    c = models.tiny(30, d_model=32, n_heads=4, seed=2, device="cpu")
    assert before.equal(after)  # building a model did not consume the caller's random stream
    assert all(x.equal(y) for x, y in zip(a.parameters(), b.parameters()))
    assert not a.W_Q.equal(c.W_Q)


def test_context_check_names_both_numbers():
    task = tasks.preset("reversal", "ood")
    needed = task.max_text_len() + 1 + 1
    assert models.check_context(needed, task) == needed
    with pytest.raises(ValueError, match=f"n_ctx={needed - 1}.*{needed} tokens"):
        models.check_context(needed - 1, task)
    with pytest.raises(ValueError, match=f"n_ctx=64.*{needed} tokens"):
        models.tiny(CharTokenizer(), d_model=32, n_heads=4, n_ctx=64, task="reversal")
    m = models.tiny(CharTokenizer(), d_model=32, n_heads=4, n_ctx=needed, task="reversal", device="cpu")
    assert models.check_context(m, "reversal") == needed
    # a longer prefix (instruction, few-shot) needs more room
    with pytest.raises(ValueError, match=f"{needed + 4} tokens"):
        models.check_context(m, task, offset=5)


def test_context_covers_the_longest_real_sample():
    """The check's arithmetic matches what the batch helper builds for actual OOD samples."""
    from aspan.batching import make_batch

    tok = CharTokenizer()
    for name in tasks.NAMES:
        task = tasks.preset(name, "ood")
        batch = make_batch(task.generate(20, seed=0), tok)
        assert batch.tokens.shape[1] <= models.check_context(10_000, task, tok.offset)


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="not divisible"):
        models.tiny(30, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="even d_head"):
        models.tiny(30, d_model=32, n_heads=4, d_head=7)
    with pytest.raises(ValueError, match="vocab_size"):
        models.tiny(0)


def test_a_config_and_keywords_build_the_same_model():
    import typing
    from dataclasses import fields

    from aspan.models.tiny import TinyConfig, TinySettings

    assert list(typing.get_type_hints(TinySettings)) == [f.name for f in fields(TinyConfig)]
    assert typing.get_type_hints(TinySettings) == typing.get_type_hints(TinyConfig)
    config = TinyConfig(n_layers=1, n_heads=2, d_model=16, n_ctx=32, seed=3, device="cpu", positional="learned")
    by_config = models.tiny(30, config)
    by_keyword = models.tiny(30, n_layers=1, n_heads=2, d_model=16, n_ctx=32, seed=3, device="cpu",
                             positional="learned")
    assert by_config.cfg.to_dict() == by_keyword.cfg.to_dict()
    assert all(x.equal(y) for x, y in zip(by_config.parameters(), by_keyword.parameters()))
    over = models.tiny(30, config, n_layers=2)  # a keyword wins over the config
    assert over.cfg.n_layers == 2 and over.cfg.d_model == 16
    with pytest.raises(TypeError, match="tiny\\(\\) got an unexpected keyword argument 'layers'"):
        models.tiny(30, layers=2)
