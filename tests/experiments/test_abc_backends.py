"""ABC and ABS (Duan & Shi 2023) on a TransformerBridge: the lines ABC extracts and the logits its biases give are
those of the HookedTransformer on the same checkpoint, and on the bridge alone the biased attention is zero off the
kept lines while an evaluation under the bias equals the hooks applied by hand."""
import pytest
import torch

from aspan import models, tasks
from aspan.batching import make_batch
from aspan.evaluation import evaluate
from aspan.experiments.abc import ABCSettings, abc_bias, abc_lines, abs_window, coords, every_head, lines_table


@pytest.fixture(scope="module")
def shipped():
    """The shipped reversal model (a GPT-NeoX checkpoint) as a bridge, its tokenizer and mixed-length samples."""
    torch.set_num_threads(1)
    model, tok, _ = models.load("reversal", device="cpu", backend="bridge")
    samples = tasks.preset("reversal", "id").generate(12, seed=5)
    assert len({s.prompt_len for s in samples}) > 1
    return model, tok, samples


def _logprobs(model, batch, fwd_hooks=()):
    with torch.no_grad():
        logits = model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask, fwd_hooks=list(fwd_hooks))
    return logits.log_softmax(-1)[batch.attention_mask.bool()]


def _biases(model, tok, samples):
    """ABS: the task's aligned window on every head; ABC: the lines of this model's own attention."""
    window = every_head(model, abs_window(samples, tok, width=1))
    lines = abc_lines(model, tok, samples, ABCSettings(lam=0.87, rows="all", batch_size=16))
    return {"abs": window, "abc": lines}


@pytest.mark.hooked
def test_abc_lines_and_biases_match_across_backends(shipped):
    bridge, tok, samples = shipped
    hooked = models.load("reversal", device="cpu", backend="hooked").model
    on_bridge, on_hooked = _biases(bridge, tok, samples), _biases(hooked, tok, samples)
    assert lines_table(on_bridge["abc"]).equals(lines_table(on_hooked["abc"]))  # the same lines extracted
    b = make_batch(samples, tok)
    for name, lines in on_hooked.items():
        effect = {m: _logprobs(model, b, abc_bias(lines, model)(b)) - _logprobs(model, b)
                  for m, model in (("hooked", hooked), ("bridge", bridge))}
        assert effect["hooked"].abs().max() > 0.05, name  # the bias does something
        torch.testing.assert_close(effect["bridge"], effect["hooked"], atol=1e-4, rtol=0)


def test_abs_bias_on_the_bridge_zeroes_attention_off_the_window(shipped):
    import hooks

    bridge, tok, samples = shipped
    b = make_batch(samples, tok)
    window = every_head(bridge, abs_window(samples, tok, width=1))
    fwd = abc_bias(window, bridge)(b)
    heads = [(0, 0), (1, 3)]
    pats = hooks.capture(bridge, b.tokens, heads, attention_mask=b.attention_mask, fwd_hooks=fwd)
    c = coords(b)
    for head in heads:
        kept = window[head].bias(c, b.tokens.shape[1], b.tokens.shape[1]) == 0  # [batch, q, k]
        valid = b.attention_mask.bool()[:, :, None] & b.attention_mask.bool()[:, None, :]
        assert pats[head][valid & ~kept].abs().max() < 1e-6
        rows = pats[head].sum(-1)[b.attention_mask.bool()]
        torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=0)


def test_evaluation_under_the_abc_bias_equals_the_hooks_by_hand(shipped):
    bridge, tok, samples = shipped
    lines = _biases(bridge, tok, samples)["abc"]
    factory = abc_bias(lines, bridge)
    res = evaluate(bridge, tok, samples, fwd_hooks=factory, batch_size=5, attn=False)
    b = make_batch(samples, tok)
    with torch.no_grad():
        logits = bridge.run_with_hooks(b.tokens, attention_mask=b.attention_mask, fwd_hooks=factory(b))
    pred = logits.argmax(-1)[b.target_rows]  # teacher-forced predictions on the scored rows, batch order
    got = [tok.encode(c)[0] if c != "<eos>" else tok.eos_id for c in res.records.pred_char]
    assert got == pred.tolist()
    with torch.no_grad():
        plain = bridge(b.tokens, attention_mask=b.attention_mask).argmax(-1)[b.target_rows]
    assert (plain != pred).any()  # the bias changes predictions
