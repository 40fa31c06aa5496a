"""Loading never trusts a file: every value a checkpoint's config.json holds is checked (type, range, allowed values)
before anything is built, and a model too large for this machine is refused before it is allocated; each refusal is
one line naming the file (or option) and the key, exit code 2, no traceback."""
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspan import models
from aspan.models.safety import MODEL_FIELDS, parameter_bytes
from aspan.tokenization import CharTokenizer

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
    st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(allow_nan=True, allow_infinity=True),
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
def aspan_peak(*args: str, cwd: Path) -> tuple[int, str, int]:
    """(exit code, stderr, peak resident memory in bytes) of one `aspan` command."""
    err = cwd / "stderr.txt"
    with open(err, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "aspan.cli", *args], cwd=cwd, env=ENV, stdout=subprocess.DEVNULL,
                             stderr=f)
        _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    text = err.read_text()
    err.unlink()
    return p.returncode, text, usage.ru_maxrss * 1024


def test_parameter_bytes_counts_what_a_hooked_transformer_allocates():
    """The estimate equals HookedTransformer's parameter count (times 4 bytes), the learned position table included."""
    vocab = CharTokenizer().vocab_size
    for positional in ("rotary", "learned"):
        m = models.tiny(CharTokenizer(), n_layers=2, n_heads=2, d_model=16, d_mlp=24, n_ctx=40,
                        positional=positional, device="cpu")
        learned = positional == "learned"
        assert parameter_bytes(vocab, 16, 2, 2, 8, 24, 40, learned_positions=learned) == \
            4 * sum(p.numel() for p in m.parameters()), positional


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
