"""Loading never trusts a file: every value a checkpoint's config.json holds is checked (type, range, allowed values)
before anything is built, and a model too large for this machine is refused before it is allocated; each refusal is
one line naming the file (or option) and the key, exit code 2, no traceback."""
import json
import math
import shutil
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspan import models
from aspan.models.safety import MODEL_FIELDS, ModelSizes, parameter_bytes
from aspan.tokenization import CharTokenizer
from tests.cli import aspan_peak

from ..test_hardening import ENV, aspan, one_line

TASK = ["--task", "reversal", "--param", "length=1-3", "--param", "charset=abcd", "-n", "2", "--no-attn"]


@pytest.fixture(scope="module")
def aspan_ckpt(tmp_path_factory) -> Path:
    """A tiny checkpoint in the aspan format (ALiBi with 2 heads and d_mlp 20 has no Hugging Face form)."""
    tok = CharTokenizer()
    model = models.tiny(tok, n_layers=1, n_heads=2, d_model=16, d_mlp=20, n_ctx=32, positional="alibi", device="cpu")
    return models.save(model, tmp_path_factory.mktemp("ckpt") / "aspan", tok, hf=False, task="reversal")


def edited(src: Path, dst: Path, model: dict | None = None, **top) -> Path:
    """A copy of checkpoint `src` at `dst` with `model` keys and top-level keys of its config.json replaced."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["model"].update(model or {})
    config.update(top)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


# ---------------------------------------------------------------------------- the aspan format's config.json
@pytest.mark.parametrize("change, key", [
    ({"n_heads": -2}, "model.n_heads"), ({"n_layers": "1"}, "model.n_layers"),
    ({"act_fn": "os.system"}, "model.act_fn"), ({"d_model": math.nan}, "model.d_model"), ({"meta": [1]}, "meta"),
    ({"dtype": "load"}, "model.dtype"),
])
def test_a_bad_aspan_config_value_is_one_line_naming_file_and_key(aspan_ckpt, tmp_path, change, key):
    model = {k: v for k, v in change.items() if k != "meta"}
    ckpt = edited(aspan_ckpt, tmp_path / "bad", model, **{k: v for k, v in change.items() if k == "meta"})
    r = aspan("eval", str(ckpt), *TASK, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    one_line(r.stderr, str(ckpt / "config.json"), key)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]  # nothing written


JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 2**40), st.just(10**400), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "1", "gelu", "os.system", "LN", "rotary", "float64", "causal", "gpt2"]),
    st.lists(st.integers(-1, 3), max_size=3), st.dictionaries(st.sampled_from("ab"), st.integers(), max_size=2),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(MODEL_FIELDS) + ["meta", "tokenizer", "version", "format", "extra"]),
       value=JSON_VALUES)
def test_any_single_change_loads_or_is_refused_naming_the_key(aspan_ckpt, tmp_path_factory, key, value):
    """Property: whatever one key of config.json becomes, `models.load` either loads a model or raises a one-line
    ValueError naming that key (or the weights that no longer fit the config); never another exception."""
    dst = tmp_path_factory.mktemp("mut") / "ckpt"
    if key in ("meta", "tokenizer", "version", "format", "extra"):
        ckpt = edited(aspan_ckpt, dst, **{key: value})
    else:
        ckpt = edited(aspan_ckpt, dst, {key: value})
    try:
        models.load(ckpt, device="cpu", backend="hooked")
    except ValueError as e:
        message = str(e)
        assert "\n" not in message and str(ckpt) in message, message
        assert key in message or "does not match" in message, (key, value, message)


# ---------------------------------------------------------------------------------------- hostile sizes
def test_parameter_bytes_counts_what_a_hooked_transformer_allocates():
    """The estimate equals HookedTransformer's parameter count (times 4 bytes), the learned position table included."""
    vocab = CharTokenizer().vocab_size
    for positional in ("rotary", "learned"):
        m = models.tiny(CharTokenizer(), n_layers=2, n_heads=2, d_model=16, d_mlp=24, n_ctx=40,
                        positional=positional, device="cpu")
        learned = positional == "learned"
        assert parameter_bytes(ModelSizes(vocab, 16, 2, 2, 8, 24, 40, learned_positions=learned)) == \
            4 * sum(p.numel() for p in m.parameters()), positional


def test_models_build_refuses_a_config_too_large_for_this_machine():
    """`models.build`, where every HookedTransformer of the toolkit is made, checks the memory first (1e12 bytes of
    causal mask here; TransformerLens would ask for them at once)."""
    from transformer_lens import HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=10**6, d_head=8, n_heads=2, d_vocab=7, act_fn="gelu",
                                  device="cpu", init_weights=False)
    with pytest.raises(ValueError, match="n_ctx=1000000.*more than this machine can hold"):
        models.build(cfg)


@pytest.mark.parametrize("key", ["n_ctx", "d_mlp", "d_model", "n_layers"])
def test_a_huge_size_in_a_config_is_refused_before_allocation(aspan_ckpt, tmp_path, key):
    ckpt = edited(aspan_ckpt, tmp_path / "huge", {key: 10**9})
    code, err, peak = aspan_peak("eval", str(ckpt), *TASK, cwd=tmp_path)
    assert code == 2, err[-2000:]
    one_line(err, str(ckpt / "config.json"), f"{key}=1000000000", "GB", "available")
    assert peak < 2 * 2**30, peak  # the imports alone take ~0.5 GB; the model would take tens of GB or more


@pytest.mark.parametrize("flags, key", [
    (["--n-ctx", "1000000000", "--positional", "learned"], "n_ctx=1000000000"),
    (["--d-model", "100000"], "d_model=100000"), (["--n-layers", "1000000"], "n_layers=1000000"),
])
def test_a_huge_fresh_model_is_refused_before_allocation(tmp_path, flags, key):
    code, err, peak = aspan_peak("train", "--task", "reversal", "--steps", "1", "--out", str(tmp_path / "run"), *flags,
                                 cwd=tmp_path)
    assert code == 2, err[-2000:]
    one_line(err, key, "GB", "available")
    assert not (tmp_path / "run").exists() and peak < 2 * 2**30, peak


# ------------------------------------------------------------------------- Hugging Face-form checkpoints
def hf_edited(dst: Path, src: Path | None = None, **changes) -> Path:
    """A copy of a Hugging Face checkpoint (the shipped GPT-NeoX one by default) with config.json keys replaced
    (`rope_parameters.partial_rotary_factor` as a dotted key)."""
    shutil.copytree(src or models.SHIPPED / "reversal", dst)
    config = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        parent, _, leaf = key.rpartition(".")
        (config[parent] if parent else config)[leaf] = value
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def backend_env(backend: str) -> dict:
    return {**ENV, "ASPAN_BACKEND": backend}


ID = ["--task", "reversal", "--split", "id", "-n", "4", "--no-attn"]


@pytest.mark.parametrize("key, value", [
    ("hidden_size", 64), ("num_attention_heads", 3), ("vocab_size", 5), ("rope_parameters.partial_rotary_factor", 2.0),
])
def test_a_bad_hf_config_value_is_one_line_naming_file_and_key(tmp_path, key, value):
    ckpt = hf_edited(tmp_path / "bad", **{key: value})
    r = aspan("eval", str(ckpt), *ID, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(r.stderr, str(ckpt / "config.json"), key)


@pytest.mark.parametrize("layers, backend", [(1, "hooked"), (1, "bridge"), (-1, "bridge"), (3, "hooked")])
def test_a_layer_count_that_does_not_match_the_weights_is_refused(tmp_path, layers, backend):
    """Fewer layers than stored dropped the rest silently (ID exact 0.000 instead of 1.000, exit 0); more were
    initialised at random. Either way the load is refused, naming the file and num_hidden_layers."""
    ckpt = hf_edited(tmp_path / "layers", num_hidden_layers=layers)
    r = aspan("eval", str(ckpt), *ID, cwd=tmp_path, env=backend_env(backend))
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(r.stderr, str(ckpt), "num_hidden_layers")


@pytest.fixture(scope="module")
def forms(tmp_path_factory) -> dict[str, Path]:
    """A tiny checkpoint in each Hugging Face form: GPT-NeoX (rotary), GPT-2 (learned), Bloom (ALiBi)."""
    tok, root = CharTokenizer(), tmp_path_factory.mktemp("forms")
    out = {}
    for positional in ("rotary", "learned", "alibi"):
        model = models.tiny(tok, n_layers=2, n_heads=2, d_model=128, d_mlp=512, n_ctx=32, positional=positional,
                            device="cpu", seed=1)
        out[positional] = models.save(model, root / positional, tok, hf=True)
    return out


@pytest.mark.parametrize("backend", ["hooked", "bridge"])
def test_every_form_refuses_dropped_missing_and_unused_tensors(forms, tmp_path, backend):
    from safetensors.torch import load_file, save_file

    for positional, src in forms.items():
        models.load(src, device="cpu", backend=backend)  # as saved: loads
        layer_key = "num_hidden_layers" if positional == "rotary" else "n_layer"
        for layers in (1, 3, 0, -1):
            ckpt = hf_edited(tmp_path / f"{positional}{layers}", src, **{layer_key: layers})
            with pytest.raises(ValueError, match=f"{layer_key}={layers}" if layers > 0 else f"{layer_key} must be"):
                models.load(ckpt, device="cpu", backend=backend)
        extra = hf_edited(tmp_path / f"{positional}-extra", src)
        weights = load_file(extra / "model.safetensors")
        save_file({**weights, "unused.weight": torch.zeros(3)}, extra / "model.safetensors")
        with pytest.raises(ValueError, match="unused.weight is not a tensor of the model"):
            models.load(extra, device="cpu", backend=backend)


# ------------------------------------------------------------------------------ Hugging Face directories
@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    from .hf_fixtures import save_random_model

    directory = tmp_path_factory.mktemp("hf") / "plain"
    save_random_model("llama", directory)
    return directory


def test_pickled_weights_are_refused_up_front(llama_dir, tmp_path):
    from safetensors.torch import load_file

    pickled = tmp_path / "pickled"
    shutil.copytree(llama_dir, pickled)
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    for backend in ("hooked", "bridge"):
        r = aspan("eval", str(pickled), *ID, cwd=tmp_path, env=backend_env(backend))
        assert r.returncode == 2, r.stderr[-2000:]
        one_line(r.stderr, str(pickled / "pytorch_model.bin"), "safetensors")


def test_truncated_safetensors_in_a_hugging_face_directory_is_one_line(llama_dir, tmp_path):
    truncated = tmp_path / "truncated"
    shutil.copytree(llama_dir, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    for backend in ("hooked", "bridge"):
        r = aspan("eval", str(truncated), *ID, cwd=tmp_path, env=backend_env(backend))
        assert r.returncode == 2, r.stderr[-2000:]
        one_line(r.stderr, str(weights), "truncated")


def test_a_gguf_header_claiming_huge_counts_is_refused_without_allocating(tmp_path):
    gguf = tmp_path / "huge.gguf"
    gguf.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**40, 2**40))  # 24 bytes
    code, err, peak = aspan_peak("eval", str(gguf), *ID, cwd=tmp_path)
    assert code == 2, err[-2000:]
    one_line(err, str(gguf), "GGUF header claims")
    assert peak < 2 * 2**30, peak


def test_every_loading_command_refuses_the_dropped_layers(llama_dir, tmp_path):
    """`aspan rank`, `aspan sweep` and `aspan pretrained` load through the same checks as `aspan eval`: a Hugging Face
    directory whose config drops a stored layer is refused in one line naming the file and the key."""
    ckpt = hf_edited(tmp_path / "ckpt", llama_dir, num_hidden_layers=1)
    sweep = tmp_path / "s.toml"
    sweep.write_text(f'model = "{ckpt}"\ntask = "reversal"\nn_samples = 2\nbatch_size = 2\n'
                     'task_params = {length = [2, 3]}\nstrengths = [1.0]\n[heads]\nlist = [[0, 0]]\n')
    smoke = Path(__file__).resolve().parents[2] / "configs" / "smollm2_smoke.toml"
    commands = [["rank", str(ckpt), "--task", "reversal", "-n", "2", "--out", str(tmp_path / "rank")],
                ["sweep", "--config", str(sweep), "--out", str(tmp_path / "sweep")],
                ["pretrained", "--config", str(smoke), "--model", str(ckpt), "--out", str(tmp_path / "pre")]]
    for args in commands:
        r = aspan(*args, cwd=tmp_path)
        assert r.returncode == 2, (args[0], r.stderr[-2000:])
        one_line(r.stderr, str(ckpt), "num_hidden_layers=1")
