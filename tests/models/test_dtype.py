"""Precision and placement: `models.load(dtype=..., device_map=...)` and `--dtype` for every model kind; bfloat16 and
float16 on the CPU against float32; the memory refusal counts the dtype; run.json records it.

Tolerance (stated here, asserted below), on the target rows of the shipped reversal model's ID and OOD samples:
the half-precision logits differ from float32's by at most `TOL[split][dtype]` times the largest float32 logit
(bfloat16 keeps 8 significant bits, 2^-8 = 0.4 % a rounding, float16 11 bits; measured: bfloat16 1.2-1.6 % on ID and
4.5 % on OOD rows, float16 0.2 % and 0.5 %). The argmax is the same on every ID row; on OOD rows, where the model
is unsure, it is the same wherever float32's two best logits are further apart than twice that error (a near-tie
may flip: 16 of 542 OOD rows in bfloat16, all with a float32 margin under 0.5 of logits up to 19).
"""
from __future__ import annotations

import json

import pytest
import torch

from aspan import models, tasks
from aspan.batching import make_batch
from aspan.errors import UsageError
from aspan.models import safety
from aspan.tokenization import CharTokenizer

from .. import cli
from .hf_fixtures import save_random_model

TOL = {"id": {"bfloat16": 0.025, "float16": 0.004}, "ood": {"bfloat16": 0.06, "float16": 0.008}}


def logits(model, tok, samples) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 logits on the target rows, the argmax there)."""
    batch = make_batch(samples, tok)
    with torch.no_grad():
        out = model(batch.tokens.to(next(model.parameters()).device)).float().cpu()[batch.target_rows]
    return out, out.argmax(-1)


@pytest.mark.parametrize("backend", ["hooked", "bridge"])
def test_half_precision_on_cpu_matches_float32_within_the_stated_tolerance(backend):
    """The shipped reversal model on its ID and OOD presets: the same argmax on every target row."""
    loaded = {d: models.load("reversal", device="cpu", backend=backend, dtype=d)
              for d in ("float32", "bfloat16", "float16")}
    for split in ("id", "ood"):
        samples = tasks.preset("reversal", split).generate(16, seed=7)
        ref, ref_argmax = logits(loaded["float32"].model, loaded["float32"].tokenizer, samples)
        top2 = ref.topk(2, dim=-1).values
        for dtype, tol in TOL[split].items():
            assert next(loaded[dtype].model.parameters()).dtype == getattr(torch, dtype)
            got, argmax = logits(loaded[dtype].model, loaded[dtype].tokenizer, samples)
            err = (got - ref).abs().max()
            assert 0 < err <= tol * ref.abs().max(), (split, dtype, float(err / ref.abs().max()))
            clear = top2[:, 0] - top2[:, 1] > 2 * err if split == "ood" else torch.ones_like(ref_argmax, dtype=bool)
            assert torch.equal(argmax[clear], ref_argmax[clear]), (split, dtype)
            assert (argmax == ref_argmax).float().mean() >= 0.95, (split, dtype)


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    """A model of every kind on disk: the aspan format, the Hugging Face form of a tiny model, a Llama directory."""
    d = tmp_path_factory.mktemp("kinds")
    tok = CharTokenizer()
    tiny = models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=32, device="cpu")
    save_random_model("llama", d / "llama")
    return {"aspan": models.save(tiny, d / "aspan", tok, hf=False), "hf form": models.save(tiny, d / "form", tok),
            "llama": d / "llama"}


@pytest.mark.parametrize("backend", ["hooked", "bridge"])
@pytest.mark.parametrize("kind", ["aspan", "hf form", "llama"])
def test_every_kind_loads_in_the_asked_dtype(kinds, kind, backend):
    for dtype in ("bfloat16", "float16", torch.bfloat16):
        model = models.load(kinds[kind], device="cpu", backend=backend, dtype=dtype).model
        floats = {p.dtype for p in model.parameters() if p.is_floating_point()}
        assert floats == {getattr(torch, str(dtype).removeprefix("torch."))}, (kind, dtype, floats)
    assert {p.dtype for p in models.load(kinds[kind], device="cpu", backend=backend).model.parameters()} == \
        {torch.float32}  # the default stays float32


def test_a_bad_dtype_or_a_device_map_the_backend_cannot_use_is_one_line(kinds):
    with pytest.raises(ValueError, match=r"^dtype must be one of 'float32', 'bfloat16', 'float16', got 'float64'$"):
        models.load(kinds["llama"], device="cpu", dtype="float64")
    with pytest.raises(UsageError, match="device_map needs backend 'bridge'"):
        models.load(kinds["llama"], device="cpu", backend="hooked", device_map="auto")
    with pytest.raises(UsageError, match="device_map needs a Hugging Face checkpoint"):
        models.load(kinds["aspan"], device="cpu", backend="bridge", device_map={"": "cpu"})


def test_a_device_map_places_the_bridge_through_hugging_face(kinds, monkeypatch):
    """The map reaches Hugging Face's loader (which places the modules: "auto" spreads them over the GPUs), and the
    model is the same; on this machine every module goes to the CPU."""
    import transformers

    asked = []
    original = transformers.LlamaForCausalLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        asked.append(kwargs.get("device_map"))
        return original(cls, *args, **kwargs)

    plain = models.load(kinds["llama"], device="cpu", backend="bridge").model
    monkeypatch.setattr(transformers.LlamaForCausalLM, "from_pretrained", classmethod(spy))
    mapped = models.load(kinds["llama"], device="cpu", backend="bridge", device_map={"": "cpu"}).model
    assert asked == [{"": "cpu"}]
    tokens = torch.tensor([[1, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(plain(tokens), mapped(tokens))
    half = models.load(kinds["llama"], device="cpu", backend="bridge", device_map={"": "cpu"}, dtype="bfloat16")
    assert next(half.model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("kind", ["aspan", "llama"])
def test_the_memory_refusal_counts_the_dtype(kinds, kind, monkeypatch):
    """What the refusal counts halves in bfloat16; with memory between the two, float32 is refused in one line
    naming the file and bfloat16 loads."""
    monkeypatch.setattr(safety, "LAYER_OVERHEAD", 0)  # tiny models: per-layer objects would outweigh the weights
    seen = []
    original = safety.check_memory
    monkeypatch.setattr(safety, "check_memory",
                        lambda needed, *a, **k: (seen.append(needed), original(needed, *a, **k)))
    for dtype in ("float32", "bfloat16"):
        models.load(kinds[kind], device="cpu", dtype=dtype)
    full, half = seen[0], seen[-1]
    assert half < 0.6 * full
    monkeypatch.setattr(safety, "available_bytes", lambda device=None: int((full + half) / 2 / safety.MEMORY_SHARE))
    with pytest.raises(UsageError, match="more than this machine can hold") as e:
        models.load(kinds[kind], device="cpu", dtype="float32")
    assert str(kinds[kind]) in str(e.value) and "\n" not in str(e.value)
    models.load(kinds[kind], device="cpu", dtype="bfloat16")


@pytest.mark.parametrize("kind", ["hf form", "llama"])
def test_the_command_line_dtype_reaches_the_model_and_run_json(kinds, kind, tmp_path):
    for dtype in ("bfloat16", "float32"):
        run = tmp_path / dtype
        r = cli.aspan("eval", str(kinds[kind]), "--task", "reversal", "--any-task", "--split", "id", "-n", "2",
                      "--no-attn", "--device", "cpu", "--dtype", dtype, "--out", str(run), cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        assert json.loads((run / "run.json").read_text())["dtype"] == dtype
    r = cli.aspan("eval", str(kinds[kind]), "--dtype", "float64", cwd=tmp_path)
    assert r.returncode == 2
    cli.one_line(r.stderr, "--dtype", "float64", "'bfloat16'")


def test_pretrained_takes_the_dtype_from_its_config_or_flag(tmp_path):
    """`aspan pretrained` loads (and fine-tunes) in the config's `dtype` or `--dtype`; a float32 run keeps the settings
    of the runs made before the option (it resumes them), and another dtype is another configuration."""
    from aspan.applications.pretrained import PretrainedConfig
    from aspan.config import load_config

    toml = tmp_path / "c.toml"
    toml.write_text('model = "smollm2"\ndtype = "bfloat16"\n')
    assert load_config(PretrainedConfig, toml_path=toml).dtype == "bfloat16"
    assert load_config(PretrainedConfig, toml_path=toml, flags={"dtype": "float16"}).dtype == "float16"
    toml.write_text('model = "smollm2"\ndtype = "float64"\n')
    with pytest.raises(ValueError, match="dtype"):
        load_config(PretrainedConfig, toml_path=toml)
    from aspan.applications.claims import claim_config
    from aspan.applications.pretrained import RUNTIME
    from aspan.io import SETTINGS

    out = tmp_path / "run"
    with claim_config(out, "pretrained", PretrainedConfig(), RUNTIME):
        (out / "rows.jsonl").write_text("{}\n")
    assert "dtype" not in json.loads((out / SETTINGS).read_text())  # as before the option: such runs resume
    with claim_config(out, "pretrained", PretrainedConfig(), RUNTIME):
        pass
    with pytest.raises(ValueError, match=r"another configuration \(dtype = None there, 'bfloat16' now\)"):
        with claim_config(out, "pretrained", PretrainedConfig(dtype="bfloat16"), RUNTIME):
            pass


def test_a_sweep_runs_in_its_configs_dtype(kinds, tmp_path):
    """A sweep config's `dtype` loads the model in it and run.json records it; an unknown one is one line."""
    ckpt = kinds["hf form"]
    body = (f'model = "{ckpt}"\ntask = "reversal"\nany_task = true\nn_samples = 2\nbatch_size = 2\n'
            'task_params = {length = [2, 3]}\nstrengths = [1.0]\n[heads]\nlist = [[0, 0]]\n')
    (tmp_path / "s.toml").write_text('dtype = "bfloat16"\n' + body)
    r = cli.aspan("sweep", "--config", str(tmp_path / "s.toml"), "--out", str(tmp_path / "run"), "--quiet",
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["dtype"] == "bfloat16"
    (tmp_path / "bad.toml").write_text('dtype = "float64"\n' + body)
    r = cli.aspan("sweep", "--config", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "bad"), cwd=tmp_path)
    assert r.returncode == 2
    cli.one_line(r.stderr, "dtype", "float64", "'bfloat16'")
