"""Teacher-forced evaluation runs the fused forward (`aspan.models.fused`) where it applies, and its records,
summaries, exact flags and held-out loss equal those of the hooked forward: on the shipped model, without and with
an ABC bias, for a mix of right and wrong answers."""
import pandas as pd
import pytest
import torch

from aspan import models, tasks
from aspan.evaluation import evaluate, exact_flags
from aspan.experiments import abc
from aspan.models import fused
from aspan.training import heldout_loss

NOOP = ("hook_embed", lambda x, hook: None)  # changes nothing, but is no bias: the hooked forward


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(1)
    model, tok, _ = models.load("reversal", device="cpu")
    samples = (tasks.preset("reversal", "id").generate(40, seed=3)
               + tasks.preset("reversal", "ood", length=(11, 13)).generate(40, seed=4))
    return model, tok, samples


@pytest.fixture
def fused_runs(monkeypatch):
    calls = []
    real = fused.fused_logits
    monkeypatch.setattr(fused, "fused_logits", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def bias_and_hooked(model, bias: bool):
    """The run's hooks: nothing or an ABC bias (fused), and the same with a no-op hook added (hooked)."""
    if not bias:
        return [], [NOOP]
    lines = {(1, 0): abc.HeadLines({"anti": (-1, 0, 1)}), (1, 2): abc.HeadLines({"anti": (0,), "diagonal": (0,)})}
    make = abc.abc_bias(lines, model)
    return make, (lambda b: make(b) + [NOOP])


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "abc"])
@pytest.mark.parametrize("attn", [False, True], ids=["no-scores", "scores"])
def test_evaluate_records_equal_the_hooked_evaluation(shipped, fused_runs, bias, attn):
    model, tok, samples = shipped
    fast_hooks, hooked = bias_and_hooked(model, bias)
    fast = evaluate(model, tok, samples, fwd_hooks=fast_hooks, attn=attn, batch_size=32)
    assert len(fused_runs) == 3  # every teacher-forced batch ran the fused forward
    ref = evaluate(model, tok, samples, fwd_hooks=hooked, attn=attn, batch_size=32)
    assert len(fused_runs) == 3
    assert 0 < fast.summary()["exact"] < 1  # a mix of right and wrong answers
    pd.testing.assert_frame_equal(fast.records, ref.records)
    assert fast.summary() == pytest.approx(ref.summary(), nan_ok=True)


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "abc"])
def test_exact_flags_and_heldout_loss_equal_the_hooked_ones(shipped, fused_runs, bias):
    model, tok, samples = shipped
    fast_hooks, hooked = bias_and_hooked(model, bias)
    flags = exact_flags(model, tok, samples, fast_hooks, batch_size=50)
    loss = heldout_loss(model, tok, samples, fast_hooks, batch_size=50)
    assert len(fused_runs) == 2  # one forward each: the 80 samples fill fewer than the CPU's 4,096 tokens
    assert torch.equal(flags, exact_flags(model, tok, samples, hooked, batch_size=50))
    assert 0 < int(flags.sum()) < len(samples)
    assert loss == pytest.approx(heldout_loss(model, tok, samples, hooked, batch_size=50), rel=1e-6)
    assert len(fused_runs) == 2
