"""`exact_flags` is `evaluate`'s per-sample exact without the per-token table: equal sample for sample, with and
without an edit, on a task that scores its EOS (reversal) and one that does not (successor)."""
import pytest
import torch

import hooks
from aspan import models, tasks
from aspan.evaluation import evaluate, exact_flags
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig, train


def _both(model, tok, samples, edit, batch_sizes=(17, 23)):
    want = torch.tensor(evaluate(model, tok, samples, fwd_hooks=edit, attn=False, any_task=True,
                                 batch_size=batch_sizes[0]).samples.exact.to_numpy())
    got = exact_flags(model, tok, samples, edit, batch_size=batch_sizes[1])
    return want, got


def test_reversal_mixed_right_and_wrong_with_and_without_an_edit():
    model, tok, _ = models.load("reversal", device="cpu")
    samples = (tasks.preset("reversal", "id").generate(40, seed=3)
               + tasks.preset("reversal", "ood", length=(11, 13)).generate(40, seed=4))
    edit = lambda b: hooks.reinforce([(1, 0), (1, 1)], b.ref_mask, strength=0.5, model=model)  # noqa: E731
    for h in ((), edit):
        want, got = _both(model, tok, samples, h)
        assert 0 < int(want.sum()) < len(samples), "a mix of right and wrong answers"
        assert torch.equal(want, got)


@pytest.fixture(scope="module")
def successor_model():
    torch.set_num_threads(1)
    task = tasks.preset("successor", "id")
    tok = CharTokenizer.for_alphabets(task.alphabet)
    model = models.tiny(tok, n_layers=2, n_heads=2, d_model=32, n_ctx=64, seed=0, device="cpu")
    train(model, tok, task, TrainConfig.scratch(steps=150, batch_size=32, lr=3e-3, device="cpu", log_every=1000),
          progress=False)
    return model, tok, task


def test_successor_whose_eos_is_no_target(successor_model):
    model, tok, task = successor_model
    want, got = _both(model, tok, task.generate(80, seed=5), ())
    assert torch.equal(want, got)
    for mode in (True, False):  # the model's training flag is handed back as it was
        model.train(mode)
        assert exact_flags(model, tok, task.generate(3, seed=5)).dtype == torch.bool and model.training == mode


def test_no_samples_is_one_line():
    model, tok, _ = models.load("reversal", device="cpu")
    with pytest.raises(ValueError, match="exact_flags: no samples"):
        exact_flags(model, tok, [])


def test_lean_batches_equal_make_batch_with_given_rows_and_a_hook_list():
    """A hook list (not a factory) takes the lean batches (`lean_batch`); a factory, `make_batch`'s: on parity's
    interleaved format (input bits given inside the target, never predicted) both equal `evaluate`."""
    torch.set_num_threads(1)
    task = tasks.get("parity", length=(1, 6), format="interleaved-ab")
    tok = CharTokenizer.for_alphabets(task.alphabet)
    model = models.tiny(tok, n_layers=1, n_heads=2, d_model=32, n_ctx=64, seed=0, device="cpu")
    train(model, tok, task, TrainConfig.scratch(steps=120, batch_size=32, lr=3e-3, device="cpu", log_every=1000),
          progress=False)
    longer = tasks.get("parity", length=(7, 10), format="interleaved-ab")
    samples = task.generate(30, seed=9) + longer.generate(30, seed=10)
    assert any(s.given for s in samples)
    damp = [("blocks.0.attn.hook_pattern", lambda pattern, hook: pattern * 0.9)]
    for edit in ((), damp, lambda batch: damp):
        want, got = _both(model, tok, samples, edit)
        assert torch.equal(want, got), edit
    assert 0 < int(want.sum()) < len(samples), "a mix of right and wrong answers"
