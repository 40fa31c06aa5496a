"""`aspan.check_model` and the checks before the first forward of `evaluate`, `rank_heads`, `train` and the experiment
engine: a model whose vocabulary, context, hook points or tokenizer cannot run a task is refused in one line naming
the fix, and nothing runs through the model first. Each refused model is also shown to fail without the check (a
raw error deep in TransformerLens, or a silent wrong answer), so the check is what turns it into the one line. The
boundaries are exact: a model one id or one position larger passes."""
from __future__ import annotations

import warnings

import pytest
import torch

import aspan
from aspan import tasks
from aspan.errors import UsageError
from aspan.experiments.engine import Engine
from aspan.experiments.sweep import SweepConfig
from aspan.models import check_model, has_hooked
from aspan.tokenization import CharTokenizer

TOK = CharTokenizer()
TASK = tasks.get("reversal", length=(2, 5), charset="abcd")  # texts of up to 11 characters, ids up to 65 ('=')
NEEDED = TOK.offset + TASK.max_text_len() + 1  # BOS + text + EOS = 13
TOP_ID = max(TOK.encode("abcd=") + [TOK.eos_id, TOK.bos_id, TOK.pad_id])


def small(vocab=TOK, n_ctx=NEEDED, **kw):
    return aspan.tiny(vocab, n_layers=1, n_heads=2, d_model=16, n_ctx=n_ctx, **kw).eval()


def entry_points(model, tok=TOK):
    """Every entry point that runs a model on samples, as a call (the samples: TASK's longest)."""
    samples = tasks.get("reversal", length=(5, 5), charset="abcd").generate(4, seed=0)
    engine_data = SweepConfig.from_dict({"task": "reversal", "task_params": {"length": [2, 5], "charset": "abcd"},
                                         "id_params": {"length": [2, 5], "charset": "abcd"}, "strengths": [1.0],
                                         "heads": {"list": [[0, 0]]}}).data()
    return {
        "check_model": lambda: check_model(model, tok, TASK),
        "evaluate": lambda: aspan.evaluate(model, tok, samples),
        "rank heads": lambda: aspan.rank_heads(model, tok, samples),
        "train": lambda: aspan.train(model, tok, TASK, aspan.TrainConfig.scratch(steps=1, batch_size=2),
                                     progress=False),
        "experiment engine": lambda: Engine(model, tok, engine_data),
    }


def refused_everywhere(model, *words: str, tok=TOK) -> None:
    """Every entry point refuses `model` in one line starting with its own name and naming `words`, before any
    forward (no hook point fires, no parameter moves)."""
    fired = []
    for name, point in model.hook_dict.items():
        if name.endswith("hook_pattern"):
            point.add_hook(lambda x, hook: fired.append(hook.name))
    before = [p.detach().clone() for p in model.parameters()]
    for where, call in entry_points(model, tok).items():
        with pytest.raises(UsageError) as e:
            call()
        text = str(e.value)
        assert "\n" not in text and text.startswith(f"{where}: "), text
        assert all(w in text for w in words), (where, text)
    assert not fired and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    model.reset_hooks()


def test_a_model_that_fits_passes_with_one_line_saying_why():
    model = small()
    line = check_model(model, TOK, TASK)
    assert line == (f"{type(model).__name__} 1 layers x 2 heads: d_vocab 70 covers the tokenizer's ids (up to "
                    f"{TOP_ID}); n_ctx {NEEDED} >= the {NEEDED} tokens of the longest reversal sample")
    assert "no task given" in check_model(model, TOK)
    assert "the 103 tokens of the longest reversal sample" in check_model(small(n_ctx=103), TOK, "reversal")  # OOD
    assert aspan.check_model is check_model


def test_a_vocabulary_too_small_is_refused_naming_the_size_to_build():
    exact = small(TOP_ID + 1)
    check_model(exact, TOK, TASK)  # one id more than the largest the task uses: enough
    too_small = small(TOP_ID)
    with pytest.raises(IndexError):  # what happens without the check: deep inside TransformerLens's embedding
        too_small(torch.tensor([TOK.prefix_ids() + TOK.encode("ab=ba")]))
    refused_everywhere(too_small, f"vocabulary too small: d_vocab={TOP_ID} but the tokenizer gives ids up to "
                       f"{TOP_ID}", f"d_vocab >= {TOP_ID + 1}", "HookedTransformerConfig(d_vocab=tokenizer.vocab_size")


@pytest.mark.hooked
def test_an_unembedding_too_small_is_refused_too():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=NEEDED, d_vocab=70,
                                  d_vocab_out=TOP_ID, act_fn="gelu", normalization_type="LN")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(cfg)
    with pytest.raises(UsageError, match=f"d_vocab_out={TOP_ID} but the tokenizer gives ids up to {TOP_ID}"):
        check_model(model, TOK, TASK)


def test_a_context_too_short_is_refused_naming_the_context_to_build():
    check_model(small(n_ctx=NEEDED), TOK, TASK)
    refused_everywhere(small(n_ctx=NEEDED - 1), f"context too short: n_ctx={NEEDED - 1}",
                       f"needs {NEEDED} tokens", f"build the model with n_ctx >= {NEEDED}")
    with pytest.raises(UsageError, match=r"this model fits length up to 18 \(e\.g\. --param length=11-18\)"):
        check_model(small(n_ctx=40), TOK, tasks.preset("reversal", "ood", length=(11, 20)))


def test_a_character_the_tokenizer_lacks_is_refused_naming_the_fix():
    short = CharTokenizer("abc")  # no 'd', no '='
    model = small(short.vocab_size)
    with pytest.raises(ValueError):  # without the check: the batch cannot even be built
        aspan.make_batch(TASK.generate(4, seed=0), short)
    with pytest.raises(UsageError) as e:
        check_model(model, short, TASK)
    assert str(e.value) == ("check_model: tokenizer: characters not in the tokenizer's vocabulary: '=d'; the tasks "
                            "need one token per character: extend it with aspan.CharTokenizer.for_alphabets("
                            "task.alphabet), and build the model with d_vocab >= its vocab_size")


def test_a_task_character_of_several_tokens_is_refused():
    from aspan.hf_tokenization import HFCharAdapter

    from .hf_fixtures import bpe_tokenizer

    adapter = HFCharAdapter(bpe_tokenizer())
    model = small(len(adapter.hf_tokenizer))
    with pytest.raises(UsageError) as e:
        check_model(model, adapter, tasks.get("reversal", length=(2, 3), charset="abé"))
    text = str(e.value)
    assert "\n" not in text and text.startswith("check_model: tokenizer: 1 character(s) are not single tokens")
    assert "'é' -> 2 tokens" in text and "one token per character" in text


class _NoHooks(torch.nn.Module):
    """A model with a TransformerLens config and hook points, but not the attention scores' of its first layer."""

    def __init__(self, model):
        super().__init__()
        self.cfg = model.cfg
        self.hook_dict = {k: v for k, v in model.hook_dict.items() if not k.startswith("blocks.0.attn.hook_attn")}


def test_a_model_aspan_cannot_hook_is_refused_naming_what_to_build():
    plain = torch.nn.Linear(4, 4)
    with pytest.raises(UsageError) as e:
        check_model(plain, TOK, TASK)
    text = str(e.value)
    assert text.startswith("check_model: model: a Linear is not a TransformerLens model")
    assert "HookedTransformer" in text and "TransformerBridge.boot_transformers" in text and "\n" not in text
    with pytest.raises(UsageError, match=r"has no hook point 'blocks\.0\.attn\.hook_attn_scores'"):
        check_model(_NoHooks(small()), TOK, TASK)
    with pytest.raises(UsageError, match="evaluate: model: a Linear is not a TransformerLens model"):
        aspan.evaluate(plain, TOK, TASK.generate(2, seed=0))


def test_tiny_builds_either_backend_where_it_exists():
    bridge = small(backend="bridge")
    assert type(bridge).__name__ == "TransformerBridge"
    if has_hooked():
        assert type(small(backend="hooked")).__name__ == "HookedTransformer"
    else:
        with pytest.raises(ValueError, match="backend 'hooked' needs HookedTransformer.*aspan\\[hooked\\]"):
            small(backend="hooked")


def test_doctor_checks_a_model_in_one_line(tmp_path):
    from ..cli import aspan as run
    from ..cli import one_line

    ok = run("doctor", "--model", "reversal", "--device", "cpu", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    last = ok.stdout.splitlines()[-1]
    assert last.startswith("model: ") and last.endswith("n_ctx 128 >= the 103 tokens of the longest reversal sample "
                                                          "(ood preset)")  # its training task, by default
    assert ok.stdout.splitlines()[:-1] == run("doctor", cwd=tmp_path).stdout.splitlines()  # after the record
    long = run("doctor", "--model", "reversal", "--param", "length=11-80", "--device", "cpu", cwd=tmp_path)
    assert long.returncode == 2
    one_line(long.stderr, "--model reversal: model: context too short: n_ctx=128", "needs 163 tokens",
             "fits length up to 62")
    alone = run("doctor", "--task", "reversal", cwd=tmp_path)
    assert alone.returncode == 2 and alone.stdout == ""
    one_line(alone.stderr, "--task and --param need --model")
