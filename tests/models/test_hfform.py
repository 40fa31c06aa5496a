"""Tiny models as standard Hugging Face checkpoints (GPT-NeoX for rotary and no positions, GPT-2 for learned ones,
Bloom for ALiBi),
and the two TransformerLens backends (HookedTransformer and TransformerBridge) on the same checkpoint:
log-probabilities against the Hugging Face model itself, head scores, rollout, edits and KV-cached generation."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hooks
from aspan import models, tasks
from aspan.batching import make_batch
from aspan.evaluation import evaluate
from aspan.models import bloom, gpt2, hfbase, hfform, neox
from aspan.tokenization import CharTokenizer
from tests.conftest import check_cached_generation


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer()


# the Hugging Face form of each encoding
MODEL_TYPE = {"rotary": "gpt_neox", "none": "gpt_neox", "learned": "gpt2", "alibi": "bloom"}
# Tolerances (log-probabilities, head scores) on the perturbed models below. Bloom adds ALiBi as slope x key position
# (up to ~30 here, where TransformerLens adds slope x distance) and keeps the embeddings behind a LayerNorm inverted
# with a bias `b` of up to ~40 x the embeddings' size, so float32 rounding is larger: measured 1.7e-4 and 2.2e-5
# (the other forms: below 1e-4 and 1e-5). At the tiny model's initial scale all forms agree within 1e-5.
TOL = {"alibi": (5e-4, 5e-5)}


def _tol(model) -> tuple[float, float]:
    """(log-probability, score) tolerances for the encoding of `model`."""
    return TOL.get(models.positional_of(model), (1e-4, 1e-5))


@pytest.fixture(scope="module", params=list(MODEL_TYPE))
def trained_like(tok, request):
    """A tiny model (each encoding with a Hugging Face form) whose every weight (biases, LayerNorms, positions, the
    unembedding bias b_U) is non-trivial.

    d_model 80 >= d_vocab 70, so b_U folds exactly into the final LayerNorm bias (and Bloom's embedding LayerNorm
    inverts: d_vocab < d_model; Bloom's MLP is 4 d_model wide)."""
    torch.manual_seed(0)
    model = models.tiny(tok, n_layers=2, n_heads=4, d_model=80, d_mlp=None if request.param == "alibi" else 96,
                        n_ctx=64, seed=5, device="cpu", positional=request.param)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    assert model.unembed.b_U.abs().min() > 0
    return model.eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, trained_like, tok):
    return models.save(trained_like, tmp_path_factory.mktemp("hfform") / "model", tok, task="reversal", steps=3)


@pytest.fixture(scope="module")
def batch(tok):
    samples = tasks.get("reversal", length=(3, 12)).generate(6, seed=1)
    return samples, make_batch(samples, tok)


def _logprobs(model, batch, fwd_hooks=()):
    with torch.no_grad():
        if hasattr(model, "original_model") and not hasattr(model, "hook_dict"):  # a bare Hugging Face model
            logits = model(batch.tokens, attention_mask=batch.attention_mask).logits
        else:
            logits = model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask, fwd_hooks=list(fwd_hooks))
    return logits.log_softmax(-1)[batch.attention_mask.bool()]


def test_saved_as_a_standard_hf_checkpoint_that_transformers_loads_alone(checkpoint, trained_like, batch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = (checkpoint / "config.json").read_text()
    assert f'"model_type": "{MODEL_TYPE[models.positional_of(trained_like)]}"' in config
    assert '"use_parallel_residual": false' in config or '"activation_function": "gelu"' in config or \
        '"apply_residual_connection_post_layernorm": false' in config
    hf = AutoModelForCausalLM.from_pretrained(str(checkpoint)).eval()
    assert not hf.config.tie_word_embeddings
    _, b = batch
    with torch.no_grad():
        got = hf(b.tokens, attention_mask=b.attention_mask).logits.log_softmax(-1)[b.attention_mask.bool()]
    torch.testing.assert_close(got, _logprobs(trained_like, b), atol=_tol(trained_like)[0], rtol=0)
    hf_tok = AutoTokenizer.from_pretrained(str(checkpoint))
    assert hf_tok("ab=ba")["input_ids"] == CharTokenizer().encode("ab=ba")  # the same ids, one per character


def test_unembedding_bias_is_folded_exactly(trained_like):
    b_new = hfbase.fold_unembed_bias(trained_like).double()
    W_U, b_U, b = (t.detach().double() for t in (trained_like.unembed.W_U, trained_like.unembed.b_U,
                                                  trained_like.ln_final.b))
    torch.testing.assert_close(b_new @ W_U, b @ W_U + b_U, atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["hooked", "bridge"])
def test_both_backends_match_the_hf_model(checkpoint, batch, backend):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(checkpoint)).eval()
    loaded = models.load(checkpoint, device="cpu", backend=backend)
    assert loaded.meta == {"task": "reversal", "steps": 3} and isinstance(loaded.tokenizer, CharTokenizer)
    assert models.positional_of(loaded.model) == models.positional_of(models.load(checkpoint, device="cpu").model)
    _, b = batch
    with torch.no_grad():
        want = hf(b.tokens, attention_mask=b.attention_mask).logits.log_softmax(-1)[b.attention_mask.bool()]
    torch.testing.assert_close(_logprobs(loaded.model, b), want, atol=_tol(loaded.model)[0], rtol=0)


@pytest.fixture(scope="module")
def pair(checkpoint):
    return (models.load(checkpoint, device="cpu", backend="hooked").model,
            models.load(checkpoint, device="cpu", backend="bridge").model)


def test_head_scores_and_rollout_agree_across_backends(pair, batch):
    hooked, bridge = pair
    _, b = batch
    kw = {"attention_mask": b.attention_mask}
    tol = _tol(hooked)[1]
    torch.testing.assert_close(hooks.head_scores(bridge, b.tokens, b.ref_mask, **kw),
                               hooks.head_scores(hooked, b.tokens, b.ref_mask, **kw), atol=tol, rtol=0)
    torch.testing.assert_close(hooks.rollout(bridge, b.tokens, **kw), hooks.rollout(hooked, b.tokens, **kw),
                               atol=tol, rtol=0)


@pytest.mark.parametrize("edit", ["reinforce", "renormalized", "bias"])
def test_the_same_edit_changes_the_logits_identically(pair, batch, edit):
    hooked, bridge = pair
    _, b = batch
    heads = [(1, 0), (1, 2)]
    fwd = {
        "reinforce": hooks.reinforce(heads, b.ref_mask, 2.0),
        "renormalized": hooks.reinforce(heads, b.ref_mask, 2.0, renormalize=True, delta=1),
        "bias": hooks.attn_bias(-2.0 * torch.ones(b.tokens.shape[1], b.tokens.shape[1]).tril(-1), layers=[1]),
    }[edit]
    effect = {name: _logprobs(m, b, fwd) - _logprobs(m, b) for name, m in (("hooked", hooked), ("bridge", bridge))}
    assert effect["hooked"].abs().max() > 0.05  # the edit does something
    torch.testing.assert_close(effect["bridge"], effect["hooked"], atol=_tol(hooked)[0], rtol=0)


def test_kv_cached_generation_with_hooks_equals_teacher_forcing_on_the_bridge(pair, tok):
    _, bridge = pair
    sample = tasks.get("reversal", length=(6, 6)).generate(1, seed=3)[0]
    b = make_batch([sample], tok)
    p = b.offset + sample.prompt_len
    check_cached_generation(bridge, b.tokens[:, :p], 8, hooks.reinforce([(1, 1), (1, 2)], b.ref_mask, 4.0))


def test_evaluate_gives_the_same_records_on_both_backends(pair, batch, tok):
    samples, _ = batch
    for mode in ("teacher", "generate"):
        a, c = (evaluate(m, tok, samples, mode=mode).records for m in pair)
        assert a.pred_char.tolist() == c.pred_char.tolist()
        for col in ("attn_rollout_sample", "attn_rollout_raw"):
            torch.testing.assert_close(torch.tensor(a[col].to_numpy()), torch.tensor(c[col].to_numpy()),
                                       atol=_tol(pair[0])[1], rtol=0, equal_nan=True)


@pytest.mark.parametrize("positional", ["rotary", "learned"])
def test_a_model_without_an_exact_hf_form_keeps_the_aspan_format(tmp_path, tok, positional):
    model = models.tiny(tok, n_layers=1, n_heads=2, d_model=32, n_ctx=32, device="cpu", positional=positional)
    with torch.no_grad():
        model.unembed.b_U.add_(torch.randn_like(model.unembed.b_U))  # d_vocab 70 > d_model 32: cannot fold
    assert "cannot be folded" in hfform.why_not(model)
    path = models.save(model, tmp_path / "m", tok)
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]
    with pytest.raises(ValueError, match="cannot be folded"):
        models.save(model, tmp_path / "n", tok, hf=True)
    with pytest.raises(ValueError, match="backend 'bridge' needs a model with a Hugging Face form.*cannot be folded"):
        models.load(path, device="cpu", backend="bridge")


def test_alibi_without_a_bloom_shape_keeps_the_aspan_format_and_loads_hooked_only(tmp_path, tok):
    alibi = models.tiny(tok, n_layers=1, n_heads=5, d_model=80, n_ctx=32, device="cpu", positional="alibi")
    assert hfform.why_not(alibi) == "5 heads is not a power of two (Bloom's ALiBi slopes differ then)"
    assert neox.why_not(alibi) == "positions are not rotary (nor none)" and gpt2.why_not(alibi) == \
        "positions are not learned"
    path = models.save(alibi, tmp_path / "m", tok)
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]
    tokens = torch.tensor([tok.encode("abcabc")])
    assert torch.equal(models.load(path, device="cpu").model(tokens), alibi(tokens))
    with pytest.raises(ValueError, match="needs a model with a Hugging Face form: 5 heads is not a power of two"):
        models.load(path, device="cpu", backend="bridge")
    with torch.no_grad():  # q = k = 0: TransformerLens's ALiBi pattern alone, m_h (j - i) unscaled
        for name in ("W_Q", "b_Q", "W_K", "b_K"):
            getattr(alibi.blocks[0].attn, name).zero_()
        _, cache = alibi.run_with_cache(tokens)
    torch.testing.assert_close(cache["pattern", 0][0], _alibi_pattern(5, 6, 1.0), atol=1e-6, rtol=0)
    wide = models.tiny(tok, n_layers=1, n_heads=4, d_model=64, n_ctx=32, device="cpu", positional="alibi")
    assert "d_vocab 70 >= d_model 64" in hfform.why_not(wide)  # the embedding LayerNorm cannot be inverted


@given(st.integers(2, 40), st.integers(0, 2**31 - 1), st.floats(0.01, 3.0))
@settings(max_examples=25, deadline=None)
def test_the_embedding_layernorm_inverse_reproduces_every_embedding(n_tokens, seed, scale):
    d_model = n_tokens + 1 + seed % 24
    E = scale * torch.randn(n_tokens, d_model, generator=torch.Generator().manual_seed(seed))
    inverse = bloom.embedding_layernorm_inverse(E)
    assert inverse is not None
    stored, w, b = inverse  # float32: exact up to float32 rounding of the larger of E and b
    got = torch.nn.functional.layer_norm(stored.double(), (d_model,), w.double(), b.double(), eps=1e-5)
    torch.testing.assert_close(got, E.double(), atol=1e-6 * max(1.0, scale, b.abs().max().item()), rtol=0)
    assert bloom.embedding_layernorm_inverse(torch.randn(d_model, d_model)) is None  # d_vocab >= d_model: none


def test_shipped_checkpoint_on_both_backends_matches_the_tl_parameters(tok):
    """The shipped model through its Hugging Face form: log-probabilities within 1e-4 of its own weights."""
    loaded = models.load("reversal", device="cpu")
    samples = tasks.preset("reversal", "ood", length=(11, 20)).generate(8, seed=0)
    b = make_batch(samples, loaded.tokenizer)
    reference = _logprobs(loaded.model, b)
    for backend in ("hooked", "bridge"):
        other = models.load("reversal", device="cpu", backend=backend).model
        torch.testing.assert_close(_logprobs(other, b), reference, atol=1e-4, rtol=0)


def test_a_sweep_reads_the_model_dimensions_of_every_form(checkpoint):
    from aspan.experiments.sweep import checkpoint_dims

    assert checkpoint_dims(str(checkpoint)) == (2, 4)


def _alibi_pattern(n_heads: int, n: int, scale: float) -> torch.Tensor:
    """softmax over keys of scale * m_h (j - i), causal, with TransformerLens's slopes m_h = 2^(-8 (h+1) / n_heads)
    (Press et al.'s for a power-of-two head count)."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, n_heads + 1) / n_heads)
    dist = (torch.arange(n)[None, :] - torch.arange(n)[:, None]).float()
    return (scale * slopes[:, None, None] * dist).masked_fill(dist > 0, float("-inf")).softmax(-1)


def test_why_alibi_is_bloom_measured(monkeypatch):
    """What the hfform docstring says, measured: Bloom's MLP is the tanh GELU (TransformerLens's gelu_new, which ALiBi
    tiny models use) and it normalises its embeddings (inverted by the conversion); MPT has no bias; Falcon (SDPA,
    its default) scales the ALiBi bias by 1/sqrt(d_head), and its eager path adds it twice."""
    from transformers import BloomConfig, BloomForCausalLM, FalconConfig, FalconForCausalLM, MptConfig, MptForCausalLM

    x = torch.linspace(-4, 4, 101)
    bloom = BloomForCausalLM(BloomConfig(vocab_size=8, hidden_size=8, n_layer=1, n_head=2))
    assert (bloom.transformer.h[0].mlp.gelu_impl(x) - torch.nn.functional.gelu(x)).abs().max() > 1e-4
    gelu_new = torch.nn.functional.gelu(x, approximate="tanh")  # TransformerLens's "gelu_new"
    torch.testing.assert_close(bloom.transformer.h[0].mlp.gelu_impl(x), gelu_new, atol=1e-6, rtol=0)
    assert isinstance(bloom.transformer.word_embeddings_layernorm, torch.nn.LayerNorm)
    mpt = MptForCausalLM(MptConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=2))
    assert not [n for n, _ in mpt.named_parameters() if n.endswith("bias")]
    masks = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, attn_mask=None, **kw: masks.append(attn_mask) or sdpa(q, k, v, attn_mask, **kw))
    for impl in ("sdpa", "eager"):
        falcon = FalconForCausalLM(FalconConfig(
            vocab_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, alibi=True, bias=True,
            new_decoder_architecture=False, parallel_attn=False, multi_query=False, attn_implementation=impl,
            bos_token_id=None, eos_token_id=None)).eval()
        with torch.no_grad():
            falcon.transformer.h[0].self_attention.query_key_value.weight.zero_()  # q = k = 0: only the bias is left
            falcon.transformer.h[0].self_attention.query_key_value.bias.zero_()
            out = falcon(torch.zeros(1, 6, dtype=torch.long), output_attentions=impl == "eager")
        pattern = masks[-1][0].softmax(-1) if impl == "sdpa" else out.attentions[0][0]
        scale = (1.0 if impl == "sdpa" else 2.0) / 8**0.5  # d_head 8
        torch.testing.assert_close(pattern, _alibi_pattern(2, 6, scale), atol=1e-6, rtol=0)
        assert (pattern - _alibi_pattern(2, 6, 1.0)).abs().max() > 1e-3  # TransformerLens's ALiBi: scale 1
