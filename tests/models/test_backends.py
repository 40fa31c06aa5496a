"""The TransformerBridge backend on its own (TransformerLens 3.9 and 4.x): training, saving and reloading, KV-cached
generation with hooks, the shipped model's story, and loading without deprecation warnings."""
import warnings

import pytest
import torch

import hooks
from aspan import models, tasks
from aspan.batching import make_batch
from aspan.evaluation import evaluate
from aspan.training import TrainConfig, train
from tests.conftest import check_cached_generation


@pytest.fixture(scope="module")
def shipped():
    return models.load("reversal", device="cpu", backend="bridge")


def _bridge(tok, positional: str, path):
    """A tiny model of `positional` saved at `path` and loaded back as a TransformerBridge (on TransformerLens 4
    `models.tiny` builds the bridge itself)."""
    start = models.tiny(tok, n_layers=2, n_heads=4, d_model=80, d_mlp=None if positional == "alibi" else 64, n_ctx=64,
                        device="cpu", positional=positional)  # Bloom (ALiBi) has d_mlp = 4 d_model
    return models.load(models.save(start, path, tok), device="cpu", backend="bridge").model


def _train(model, tok, task, steps: int = 20):
    train(model, tok, task, TrainConfig.scratch(steps=steps, batch_size=16, lr=3e-3, warmup=2), progress=False)


@pytest.mark.parametrize("positional", ["rotary", "learned", "none", "alibi"])
def test_a_bridge_trains_saves_and_reloads_to_the_same_logits(tmp_path, tok, positional):
    # d_model 80 >= d_vocab 70: the unembedding bias TransformerLens 3.9's bridge adds (and trains) folds exactly
    model = _bridge(tok, positional, tmp_path / "start")
    task = tasks.get("reversal", length=(1, 3), charset="abcd")
    batch = make_batch(task.generate(8, seed=1), tok)
    with torch.no_grad():
        before = model(batch.tokens).clone()
    _train(model, tok, task)
    with torch.no_grad():
        after = model(batch.tokens)
    assert (after - before).abs().max() > 0.1  # training changed the bridge's weights
    saved = models.save(model, tmp_path / "trained", tok, task="reversal")
    reloaded = models.load(saved, device="cpu", backend="bridge")
    assert reloaded.meta == {"task": "reversal"} and models.positional_of(reloaded.model) == positional
    with torch.no_grad():
        torch.testing.assert_close(reloaded.model(batch.tokens), after, atol=1e-5, rtol=0)
    if models.has_hooked():  # the trained weights (q, k, v fused back, b_U folded) mean the same to HookedTransformer
        hooked = models.load(saved, device="cpu", backend="hooked").model
        assert models.positional_of(hooked) == positional
        with torch.no_grad():
            torch.testing.assert_close(hooked(batch.tokens).log_softmax(-1), after.log_softmax(-1), atol=1e-4, rtol=0)


@pytest.mark.parametrize("positional", ["none", "learned"])
def test_nope_stays_without_positions_when_trained_on_the_bridge(tmp_path, tok, positional):
    """Without positions, layer 0 cannot tell equal tokens apart: its attention over a constant prefix is uniform,
    before and after training; with learned positions it is not. NoPE has no positional parameter to train."""
    model = _bridge(tok, positional, tmp_path / "m")
    _train(model, tok, tasks.get("reversal", length=(1, 4), charset="abcd"), steps=30)
    tokens = torch.tensor([tok.encode("aaaaaaa")])  # no BOS: every token equal
    seen = {}
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_pattern",
                                                 lambda x, hook: seen.setdefault("p", x.detach().clone()))])
    n = tokens.shape[1]
    uniform = (torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]).expand_as(seen["p"][0])
    positional_params = [name for name, _ in model.named_parameters()
                         if any(k in name for k in ("wpe", "pos_embed", "position", "rotary"))]
    if positional == "none":
        assert not positional_params
        torch.testing.assert_close(seen["p"][0], uniform, atol=1e-5, rtol=0)
    else:
        assert positional_params and not torch.allclose(seen["p"][0], uniform, atol=1e-3)


@pytest.mark.parametrize("positional", ["rotary", "learned", "none", "alibi"])
def test_a_bridge_run_checkpoints_and_resumes_to_the_same_model(tmp_path, tok, positional):
    """Training checkpoints of a bridge are its Hugging Face form; resuming from one continues the same run (the same
    function: on TransformerLens 3.9 the bridge's added unembedding bias comes back folded)."""
    task = tasks.get("reversal", length=(1, 3), charset="abcd")
    cfg = TrainConfig.scratch(steps=6, batch_size=8, lr=3e-3, warmup=2, log_every=1, eval_every=0, ckpt_every=3)
    tokens = make_batch(task.generate(8, seed=1), tok).tokens
    straight = train(_bridge(tok, positional, tmp_path / "s"), tok, task, cfg, out_dir=tmp_path / "a", progress=False)
    half = train(_bridge(tok, positional, tmp_path / "h"), tok, task, cfg, out_dir=tmp_path / "b", progress=False,
                 stop_after=3)
    assert (tmp_path / "b" / "checkpoints" / "step-00000003" / "tokenizer.json").is_file()  # a Hugging Face form
    with torch.no_grad():
        assert not torch.allclose(half.model(tokens), straight.model(tokens), atol=1e-3)
    resumed = train(_bridge(tok, positional, tmp_path / "r"), tok, task, cfg, out_dir=tmp_path / "b", resume=True,
                    progress=False)
    final = models.load(tmp_path / "b", device="cpu", backend="bridge")
    assert final.meta["step"] == 6 and models.positional_of(final.model) == positional
    with torch.no_grad():
        want = straight.model(tokens)
        torch.testing.assert_close(resumed.model(tokens), want, atol=1e-4, rtol=0)
        torch.testing.assert_close(final.model(tokens), want, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="cannot resume .* model n_layers = 2, now 1"):
        small = models.tiny(tok, n_layers=1, n_heads=4, d_model=80, n_ctx=64, device="cpu", positional=positional)
        train(small if not models.has_hooked() else models.load(models.save(small, tmp_path / "1", tok),
                                                                  device="cpu", backend="bridge").model,
              tok, task, cfg, out_dir=tmp_path / "b", resume=True, progress=False)


def test_tiny_builds_each_encoding_and_names_why_an_alibi_shape_has_no_form(tok):
    for positional in ("rotary", "learned", "none", "alibi"):
        model = models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=16, device="cpu", positional=positional)
        assert models.positional_of(model) == positional
    if not models.has_hooked():  # TransformerLens 4: ALiBi is Bloom, whose slopes match for 2^k heads only
        with pytest.raises(ValueError, match="power-of-two head count"):
            models.tiny(tok, n_layers=1, n_heads=3, d_model=24, n_ctx=16, device="cpu", positional="alibi")


def test_kv_cached_generation_with_hooks_equals_teacher_forcing(shipped):
    model, tok, _ = shipped
    sample = tasks.get("reversal", length=(14, 14)).generate(1, seed=3)[0]
    b = make_batch([sample], tok)
    p = b.offset + sample.prompt_len
    check_cached_generation(model, b.tokens[:, :p], 15, hooks.reinforce([(1, 2), (1, 7)], b.ref_mask, 4.0, delta=2))


def test_the_shipped_model_fails_ood_and_reinforcement_helps(shipped):
    model, tok, _ = shipped
    ood = tasks.preset("reversal", "ood", length=(11, 16)).generate(16, seed=0)
    base = evaluate(model, tok, ood).summary()
    edit = lambda b: hooks.reinforce([(1, 2), (1, 7)], b.ref_mask, 4.0, delta=2)  # noqa: E731
    helped = evaluate(model, tok, ood, fwd_hooks=edit).summary()
    assert evaluate(model, tok, tasks.preset("reversal", "id").generate(16, seed=1)).summary()["exact"] == 1.0
    assert helped["partial"] > base["partial"] + 0.2


def test_loading_and_building_show_no_deprecation_warning(tok):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        models.load("reversal", device="cpu")
        models.load("reversal", device="cpu", backend="bridge")
        models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=16, device="cpu")
    assert not [w for w in caught if issubclass(w.category, DeprecationWarning)], [str(w.message) for w in caught]


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="backend must be one of 'hooked', 'bridge', got 'tl'"):
        models.load("reversal", backend="tl")
    if not models.has_hooked():  # TransformerLens 4
        with pytest.raises(ValueError, match="backend 'hooked' needs TransformerLens 3"):
            models.load("reversal", backend="hooked")


def test_the_environment_chooses_the_default_backend(monkeypatch, tok):
    monkeypatch.setenv("ASPAN_BACKEND", "bridge")
    assert hasattr(models.load("reversal", device="cpu").model, "original_model")  # a TransformerBridge
    built = models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=16, device="cpu")  # models built too
    assert hasattr(built, "original_model")
    assert models.positional_of(models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=16, device="cpu",
                                            positional="alibi")) == "alibi"  # a Bloom bridge
    monkeypatch.setenv("ASPAN_BACKEND", "nope")
    with pytest.raises(ValueError, match="ASPAN_BACKEND must be one of 'hooked', 'bridge', got 'nope'"):
        models.load("reversal", device="cpu")


def test_each_backend_implements_the_whole_seam_consistently(shipped):
    """`aspan.models.backend`: both implementations have every member of `ModelBackend`, carry the names
    `options.BACKENDS` lists, and agree with themselves: the q/k projections are live, inside the `attn` group."""
    from aspan import options
    from aspan.models.backend import BRIDGE, HOOKED, ModelBackend, backend_of

    members = {n for n in vars(ModelBackend) if not n.startswith("_")} | set(ModelBackend.__annotations__)
    assert {"cached_step", "live_parameters", "qk_projections", "hf_model", "hf_config"} <= members
    assert all(hasattr(impl, m) for impl in (HOOKED, BRIDGE) for m in members)
    assert (HOOKED.name, BRIDGE.name) == options.BACKENDS
    loaded = [shipped.model] + ([models.load("reversal", device="cpu", backend="hooked").model]
                                if models.has_hooked() else [])
    for model in loaded:
        backend = backend_of(model)
        live = backend.live_parameters(model)
        qk = dict(backend.qk_projections(model))
        assert len(qk) == 2 * model.cfg.n_layers and set(qk) <= set(live)
        assert set(qk) <= set(backend.group_parameters(model, "attn", live))
        assert not set(qk) & set(backend.group_parameters(model, "mlp", live))
        assert (backend.hf_config(model) is None) == (backend is HOOKED)
    assert backend_of(shipped.model) is BRIDGE and BRIDGE.hf_config(shipped.model)["model_type"] == "gpt_neox"
