"""Local HF checkpoints (Llama, Qwen2, Gemma3) load offline as HookedTransformers with HF's logits."""
import pytest
import torch

from aspan import models
from aspan.hf_tokenization import HFCharAdapter

from .hf_fixtures import save_random_model

ARCHS = ["llama", "qwen2", "gemma3"]
TEXT = "abc123=321cba+xyz"  # longer than Gemma3's sliding window of 4


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tmp_path_factory):
    """(HF model, loaded model) from a directory whose name contains the architecture (TL's path trap)."""
    arch = request.param
    directory = tmp_path_factory.mktemp("ckpt") / f"my-{arch}-run"
    hf = save_random_model(arch, directory)
    return arch, hf, models.load(directory, device="cpu")


def _ids(loaded):
    tok = loaded.tokenizer
    return torch.tensor([tok.prefix_ids() + tok.encode(TEXT)])


def test_logits_match_hf(pair):
    arch, hf, loaded = pair
    assert isinstance(loaded.tokenizer, HFCharAdapter)
    assert loaded.meta["architecture"] == hf.config.architectures[0]
    assert loaded.model.cfg.d_model == 64 and loaded.model.cfg.n_layers == 2  # not an official full-size config
    ids = _ids(loaded)
    with torch.no_grad():
        diff = (loaded.model(ids) - hf(ids).logits).abs().max().item()
    assert diff < 1e-4, f"{arch}: max |logits - HF logits| = {diff:.2e}"


def test_batched_padded_equals_one_by_one(pair):
    _, _, loaded = pair
    tok = loaded.tokenizer
    short, long_ = tok.prefix_ids() + tok.encode("ab=ba"), _ids(loaded)[0].tolist()
    batch = torch.full((2, len(long_)), tok.pad_id)
    batch[0, : len(short)], batch[1] = torch.tensor(short), torch.tensor(long_)
    with torch.no_grad():
        together = loaded.model(batch)
        alone = loaded.model(torch.tensor([short]))
    assert torch.allclose(together[0, : len(short)], alone[0], atol=1e-5)  # right padding never leaks back


def test_pattern_edit_changes_logits(pair):
    arch, _, loaded = pair
    ids = _ids(loaded)

    def boost_first_key(pattern, hook):
        pattern[:, 0, :, 0] += 0.5
        return pattern

    with torch.no_grad():
        plain = loaded.model(ids)
        edited = loaded.model.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_pattern", boost_first_key)])
        again = loaded.model(ids)
    assert (edited[0, 1:] - plain[0, 1:]).abs().max() > 1e-3, arch
    assert torch.equal(again, plain)  # the hook is gone afterwards


def test_resaved_as_an_aspan_checkpoint(pair, tmp_path):
    """A converted pretrained model (e.g. after fine-tuning) saves and reloads with its HF tokenizer."""
    arch, _, loaded = pair
    models.save(loaded.model, tmp_path / "ft", loaded.tokenizer, source=arch)
    again = models.load(tmp_path / "ft", device="cpu")
    ids = _ids(loaded)
    assert again.tokenizer.prefix_ids() == loaded.tokenizer.prefix_ids() and again.meta == {"source": arch}
    with torch.no_grad():
        assert torch.equal(again.model(ids), loaded.model(ids)), arch


def test_unsupported_architecture_is_named(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=16, n_head=2).save_pretrained(tmp_path / "gpt")
    with pytest.raises(ValueError, match="config.json: unsupported architecture .gpt2."):
        models.load(tmp_path / "gpt")


def test_smollm2_missing_package_says_how_to_install(monkeypatch):
    from aspan.models import hf

    monkeypatch.setattr(hf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="make smollm2"):
        models.load("smollm2")
