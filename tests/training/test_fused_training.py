"""Training through the fused forward (`aspan.models.fused`) is the hooked forward's training: 100 steps give the
same losses and weights within 1e-4, per positional encoding and under an ABC bias; the run uses the fused forward
unless a hook needs the hooked one."""
import pytest
import torch

from aspan import models, tasks
from aspan.experiments import abc
from aspan.models import fused
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig, train

TOK = CharTokenizer()
TASK = tasks.get("reversal", length=(1, 5), charset="abcd")
NOOP = ("hook_embed", lambda x, hook: None)  # reads nothing, changes nothing, but is no bias: the hooked forward


def tiny(positional: str):
    torch.set_num_threads(1)
    return models.tiny(TOK, n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=32, seed=0, device="cpu",
                       positional=positional)


def abc_lines():
    return {(0, 1): abc.HeadLines({"diagonal": (0, 1)}), (1, 0): abc.HeadLines({"anti": (-1, 0, 1)})}


def trained(positional: str, bias: bool, hooked: bool, monkeypatch):
    """(losses of every step, the model, fused forwards run) of 100 steps."""
    calls = []
    real = fused.fused_logits
    monkeypatch.setattr(fused, "fused_logits", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = tiny(positional)
    extra = [NOOP] if hooked else []
    fwd = (lambda b: abc.abc_bias(abc_lines(), model)(b) + extra) if bias else extra
    cfg = TrainConfig.scratch(steps=100, batch_size=8, lr=3e-3, warmup=10, log_every=1, seed=1)
    res = train(model, TOK, TASK, cfg, fwd_hooks=fwd, progress=False)
    losses = [r["loss"] for r in res.history if r["kind"] == "train"]
    return torch.tensor(losses), model, len(calls)


@pytest.mark.parametrize("positional,bias", [("rotary", False), ("learned", False), ("alibi", False),
                                             ("none", False), ("rotary", True), ("learned", True)])
def test_100_steps_fused_equal_100_steps_hooked(positional, bias, monkeypatch):
    fast_losses, fast, fast_calls = trained(positional, bias, hooked=False, monkeypatch=monkeypatch)
    ref_losses, ref, ref_calls = trained(positional, bias, hooked=True, monkeypatch=monkeypatch)
    assert fast_calls == 100 and ref_calls == 0
    assert len(fast_losses) == 100 and fast_losses[-1] < 0.6 * fast_losses[0]  # it learnt something
    torch.testing.assert_close(fast_losses, ref_losses, atol=1e-4, rtol=0)
    inert = []
    for (name, w), want in zip(fast.named_parameters(), ref.parameters()):
        if name.endswith("attn.b_K") and positional != "rotary":
            inert.append((w, want))
            continue
        torch.testing.assert_close(w, want, atol=1e-4, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
    # without rotation the key bias adds the same q.b_K to every key of a row, which softmax ignores: its gradient is
    # rounding noise in either forward, which AdamW scales up into steps that follow no data. It is inert: the
    # trained model's logits do not change when it takes the other training's key biases.
    assert len(inert) == (0 if positional == "rotary" else 2)
    tokens = torch.randint(0, TOK.vocab_size, (4, 12), generator=torch.Generator().manual_seed(0))
    before = fast(tokens)
    with torch.no_grad():
        for w, want in inert:
            w.copy_(want)
    torch.testing.assert_close(fast(tokens), before, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast(tokens), ref(tokens), atol=1e-4, rtol=0)
