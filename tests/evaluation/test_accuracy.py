"""`aspan.accuracy`: the same exact and partial accuracy as `evaluate`'s records (per sample and summarised, bit for
bit), the training loss of `heldout_loss` as it was computed, for every way a task scores its rows (EOS scored or
not, given characters) and with attention biases; in batches of any size; one read from the device per set."""
import numpy as np
import pandas as pd
import pytest
import torch

import hooks
from aspan import models, tasks
from aspan.accuracy import EVAL_TOKENS, LOGITS, Accuracy, accuracy, rows_per_forward, target_predictions
from aspan.batching import IGNORE
from aspan.evaluation import evaluate, exact_flags
from aspan.experiments import abc
from aspan.models import fused
from aspan.tokenization import CharTokenizer
from aspan.training import target_loss, train_batch
from aspan.training.costs import SyncCounter

TOK = CharTokenizer()
TASKS = {  # name -> (task, samples): EOS scored (reversal), EOS not scored (successor), given characters (parity)
    "reversal": tasks.get("reversal", length=(1, 4), charset="ab"),
    "successor": tasks.get("successor"),
    "parity": tasks.get("parity", format="interleaved", length=(1, 4)),
    "addition": tasks.preset("addition", "id"),
}


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(1)
    model, tok, _ = models.load("reversal", device="cpu")
    samples = (tasks.preset("reversal", "id").generate(40, seed=3)
               + tasks.preset("reversal", "ood", length=(11, 13)).generate(40, seed=4))
    return model, tok, samples


def columns(table: pd.DataFrame) -> pd.DataFrame:
    return table[["sample_id", "length", "exact", "partial"]].reset_index(drop=True)


def same_as_evaluate(model, tok, samples, fwd_hooks=(), **kw):
    """accuracy's per-sample table and summary equal evaluate's (attn=False), bit for bit; returns the accuracy."""
    acc = accuracy(model, tok, samples, fwd_hooks, **kw)
    ref = evaluate(model, tok, samples, fwd_hooks=fwd_hooks, attn=False, any_task=True, batch_size=7)
    pd.testing.assert_frame_equal(acc.table(samples), columns(ref.samples))
    want = ref.summary()
    assert acc.summary() == {k: want[k] for k in ("exact", "partial", "n")}
    assert torch.equal(acc.exact[acc.rows > 0], torch.tensor(ref.samples.exact.to_numpy()))
    return acc


def reference_loss(model, tok, samples, fwd_hooks=(), batch_size: int = 7) -> float:
    """The held-out loss as it was computed: `train_batch` batches through the hooked forward."""
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(samples), batch_size):
            b = train_batch(samples[i : i + batch_size], tok, model.cfg.n_ctx)
            with model.hooks(fwd_hooks=list(fwd_hooks(b) if callable(fwd_hooks) else fwd_hooks)):
                total += float(target_loss(model(b.tokens, attention_mask=b.attention_mask), b.labels))
            count += int((b.labels != IGNORE).sum())
    return total / count


@pytest.mark.parametrize("name", TASKS)
def test_every_way_of_scoring_rows_equals_evaluate(name):
    task = TASKS[name]
    model = models.tiny(TOK, task=task, n_layers=1, d_model=32, n_heads=2, seed=1)
    samples = task.generate(30, seed=2)
    acc = same_as_evaluate(model, TOK, samples)
    assert acc.loss == pytest.approx(reference_loss(model, TOK, samples), rel=1e-5)
    if name == "successor":  # its EOS is not a target: rows are the target characters only
        assert torch.equal(acc.rows, acc.chars)
    if name == "parity":  # given characters are neither rows nor characters
        assert int(acc.chars.sum()) == sum(len(s.target) - len(s.given) for s in samples)


@pytest.mark.parametrize("bias", ["none", "tensor", "factory"])
@pytest.mark.parametrize("tokens", [0, None], ids=["batch_size", "by_tokens"])
def test_the_shipped_model_with_and_without_biases(shipped, monkeypatch, bias, tokens):
    model, tok, samples = shipped
    calls = []
    real = fused.fused_logits
    monkeypatch.setattr(fused, "fused_logits", lambda *a, **k: calls.append(a[1].shape) or real(*a, **k))
    p = len(tok.prefix_ids()) + max(len(s.text) for s in samples) + 1
    fwd = {"none": [], "tensor": hooks.attn_bias(torch.randn(p, p, generator=torch.Generator().manual_seed(0)),
                                                 layers=1, heads=[0, 2], model=model),
           "factory": abc.abc_bias({(1, 0): abc.HeadLines({"anti": (-1, 0, 1)})}, model)}[bias]
    acc = same_as_evaluate(model, tok, samples, fwd, batch_size=16, tokens=tokens)
    assert 0 < acc.summary()["exact"] < 1  # a mix of right and wrong answers
    mine = [16] * 5 if tokens == 0 else [80]  # every forward fused; by tokens, one forward
    assert [s[0] for s in calls[: len(mine) + 1]] == [*mine, 7]  # then evaluate's, of 7
    assert acc.loss == pytest.approx(reference_loss(model, tok, samples, fwd), rel=1e-5)
    assert torch.equal(exact_flags(model, tok, samples, fwd, batch_size=16), acc.exact)


def test_batches_of_any_size_count_the_same(shipped):
    model, tok, samples = shipped
    one = accuracy(model, tok, samples, batch_size=1, tokens=0)
    big = accuracy(model, tok, samples, batch_size=1, tokens=1 << 20)
    for field in ("exact", "right", "chars", "rows"):
        assert torch.equal(getattr(one, field), getattr(big, field))
    assert one.loss == pytest.approx(big.loss, rel=1e-6)


def test_one_read_per_set_and_the_training_flag_restored(shipped):
    model, tok, samples = shipped
    model.train()
    with SyncCounter() as counter:
        accuracy(model, tok, samples, batch_size=8, tokens=0)  # ten forwards
    assert counter.reads == 1 and counter.blocking_copies == 0
    assert model.training
    model.eval()


def test_rows_per_forward_fill_the_tokens_and_bound_the_logits():
    assert rows_per_forward(width=25, vocab=20, batch_size=32, tokens=0) == 32
    assert rows_per_forward(width=25, vocab=20, batch_size=32, tokens=4096) == 163  # 163 x 25 <= 4096
    assert rows_per_forward(width=25, vocab=20, batch_size=500, tokens=4096) == 500  # at least batch_size
    big = rows_per_forward(width=100, vocab=50_000, batch_size=1, tokens=1 << 16)
    assert big * 100 * 50_000 <= LOGITS < (big + 1) * 100 * 50_000
    assert EVAL_TOKENS["cuda"] > EVAL_TOKENS["cpu"]


def test_no_samples_and_too_long_samples_are_refused(shipped):
    model, tok, _ = shipped
    with pytest.raises(ValueError, match="no samples"):
        accuracy(model, tok, [])
    long = tasks.get("reversal", length=(model.cfg.n_ctx, model.cfg.n_ctx)).generate(1, seed=0)
    with pytest.raises(ValueError, match="n_ctx"):
        accuracy(model, tok, long)


def test_partial_is_nan_without_target_characters():
    a = Accuracy(torch.tensor([True, False, True]), torch.tensor([2, 0, 0]), torch.tensor([2, 3, 0]),
                 torch.tensor([3, 4, 0]), 1.0)
    assert np.array_equal(a.partial, [1.0, 0.0, np.nan], equal_nan=True)
    assert a.summary() == {"exact": 0.5, "partial": 0.5, "n": 2} and a.loss == pytest.approx(1 / 7)


@pytest.mark.parametrize("name", TASKS)
def test_target_predictions_are_evaluates_records(name):
    """By target index: the predicted token and whether it is right, on every row `evaluate` records (and no other
    row), in batches of any size."""
    from aspan.evaluation import _token_str

    task = TASKS[name]
    model = models.tiny(TOK, task=task, n_layers=1, d_model=32, n_heads=2, seed=1)
    samples = task.generate(30, seed=2)
    pred, gold = target_predictions(model, TOK, samples, batch_size=4, tokens=0)
    rec = evaluate(model, TOK, samples, attn=False, any_task=True).records
    rows = torch.nonzero(gold != IGNORE).tolist()
    got = [(i, j, _token_str(TOK, {}, int(pred[i, j])), bool(pred[i, j] == gold[i, j])) for i, j in rows]
    assert got == list(zip(rec.sample_id, rec.target_index, rec.pred_char, rec.correct))
    assert bool((pred[gold == IGNORE] == -1).all())
    assert torch.equal(target_predictions(model, TOK, samples, batch_size=30)[0], pred)
