"""Every load of a model directory goes through one error boundary (`aspan.errors.reading`) and the checks before
it: whatever a hostile or careless file makes a parser or transformers raise is one line naming the file (and the key),
exit 2, never a traceback; quantised checkpoints are refused, whatever their method."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspan import models
from aspan.errors import UsageError, reading
from tests.cli import SMALL, aspan, one_line

ID = ["--task", "reversal", "--split", "id", "-n", "2", "--no-attn"]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    from .hf_fixtures import save_random_model

    directory = tmp_path_factory.mktemp("hf") / "plain"
    save_random_model("llama", directory)
    return directory


def copy(src: Path, dst: Path, config: dict | None = None, **files: str) -> Path:
    shutil.copytree(src, dst)
    if config is not None:
        (dst / "config.json").write_text(json.dumps({**json.loads((dst / "config.json").read_text()), **config}))
    for name, text in files.items():
        (dst / name.replace("__", ".")).write_text(text)
    return dst


def refused(path: Path, *words: str, backend: str = "hooked") -> str:
    with pytest.raises(UsageError) as info:
        models.load(path, device="cpu", backend=backend)
    message = str(info.value)
    assert "\n" not in message, message
    for w in words:
        assert w in message, (w, message)
    return message


@pytest.mark.parametrize("value", [5, True, {"a": 1}, [5], "LlamaForCausalLM"])
def test_architectures_of_the_wrong_type_name_the_file_and_key(llama_dir, tmp_path, value):
    ckpt = copy(llama_dir, tmp_path / "c", {"architectures": value})
    refused(ckpt, str(ckpt / "config.json"), "architectures")


@pytest.mark.parametrize("quant", [{"quant_method": "bitsandbytes", "load_in_4bit": True},
                                   {"quant_method": "no-such-method"}, {"quant_method": "gptq", "bits": 4}, 5])
def test_a_quantised_checkpoint_is_refused_whatever_its_method(llama_dir, tmp_path, quant):
    ckpt = copy(llama_dir, tmp_path / "q", {"quantization_config": quant})
    for backend in ("hooked", "bridge"):
        refused(ckpt, str(ckpt / "config.json"), "quantization_config", "refused", backend=backend)


@pytest.mark.parametrize("text", ['{"model": 5}', "[1, 2]", '{"model": {"type": "BPE"}}', "5", "{"])
def test_a_tokenizer_json_of_the_wrong_shape_names_it(llama_dir, tmp_path, text):
    ckpt = copy(llama_dir, tmp_path / "t", tokenizer__json=text)
    refused(ckpt, str(ckpt / "tokenizer.json"))


@pytest.mark.parametrize("name", ["tokenizer_config.json", "special_tokens_map.json", "generation_config.json"])
@pytest.mark.parametrize("text", ["[1]", "{", "5", "[" * 5000 + "]" * 5000, '{"n": ' + "9" * 5000 + "}"])
def test_every_json_file_the_loader_reads_names_itself(llama_dir, tmp_path, name, text):
    ckpt = copy(llama_dir, tmp_path / "j", **{name.replace(".", "__"): text})
    refused(ckpt, str(ckpt / name))


def test_a_safetensors_index_without_metadata_names_it(llama_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    ckpt = copy(llama_dir, tmp_path / "i")
    weights = load_file(ckpt / "model.safetensors")
    (ckpt / "model.safetensors").unlink()
    save_file(weights, ckpt / "model-00001-of-00001.safetensors")
    index = ckpt / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": dict.fromkeys(weights, "model-00001-of-00001.safetensors")}))
    refused(ckpt, str(index), "metadata")


def test_an_integer_of_5000_digits_in_config_json_names_the_file(llama_dir, tmp_path):
    ckpt = copy(llama_dir, tmp_path / "big")
    text = (ckpt / "config.json").read_text().replace('"vocab_size": ', '"vocab_size": ' + "9" * 5000 + ", \"x\": ")
    (ckpt / "config.json").write_text(text)
    r = aspan("eval", str(ckpt), *ID, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(r.stderr, str(ckpt / "config.json"), "5,000 digits")


def test_the_command_line_gives_one_line_exit_2(llama_dir, tmp_path):
    for name, config, files, words in (("a", {"architectures": 5}, {}, ["architectures"]),
                                       ("q", {"quantization_config": {"quant_method": "bitsandbytes"}}, {},
                                        ["quantization_config"]),
                                       ("t", None, {"tokenizer__json": '{"model": 5}'}, ["tokenizer.json"])):
        ckpt = copy(llama_dir, tmp_path / name, config, **files)
        r = aspan("eval", str(ckpt), *ID, cwd=tmp_path)
        assert r.returncode == 2, r.stderr[-2000:]
        one_line(r.stderr, str(ckpt), *words)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([ValueError, TypeError, KeyError, AttributeError, IndexError, RuntimeError, RecursionError,
                        ZeroDivisionError, AssertionError, NotImplementedError, OverflowError, LookupError]),
       st.text(max_size=200))
def test_the_boundary_turns_anything_raised_inside_into_one_line_naming_the_file(tmp_path, kind, text):
    path = tmp_path / "some file.json"
    with pytest.raises(UsageError) as info:
        with reading(path, "thing"):
            raise kind(text)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message.strip(), message


def test_the_boundary_lets_interrupts_and_missing_packages_through(tmp_path):
    from aspan.errors import MissingPackage, Terminated

    for error in (KeyboardInterrupt(), Terminated(), MissingPackage("gguf", "pip install gguf", "x")):
        with pytest.raises(type(error)):
            with reading(tmp_path, "thing"):
                raise error


def test_a_full_disk_while_writing_a_checkpoint_is_one_line_naming_it(tmp_path):
    """safetensors reports a failed write as its own SafetensorError ("... (os error 27)"), which printed a
    traceback; a file-size limit makes the checkpoint write fail as a full disk would."""
    limit = ("import resource, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (6000, resource.RLIM_INFINITY))\n")
    r = aspan("train", *SMALL, "--steps", "2", "--out", str(tmp_path / "run"), cwd=tmp_path, code=limit)
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(r.stderr, str(tmp_path / "run" / "checkpoints"), "File too large")
    assert not list((tmp_path / "run" / "checkpoints").glob("step-*"))


@pytest.mark.parametrize("backend", ["hooked", "bridge"])
def test_a_million_tiny_layers_are_refused_before_any_is_built(llama_dir, tmp_path, backend):
    """num_hidden_layers 10^6 with hidden_size 2 passed the parameter estimate (a few MB) and then built layer after
    layer (> 2 GB, still going after 60 s): each layer's own objects now count too (`LAYER_OVERHEAD`)."""
    from tests.cli import aspan_peak

    ckpt = copy(llama_dir, tmp_path / "deep", {"num_hidden_layers": 10**6, "hidden_size": 2, "num_attention_heads": 1,
                                               "num_key_value_heads": 1, "intermediate_size": 2, "head_dim": 2})
    machine = ("import os, aspan.models.safety as s\ns.available_bytes = lambda device=None: 16 * 2**30\n"
               f"os.environ['ASPAN_BACKEND'] = '{backend}'")
    code, err, peak = aspan_peak("eval", str(ckpt), *ID, cwd=tmp_path, code=machine)
    assert code == 2, err[-2000:]
    one_line(err, str(ckpt / "config.json"), "num_hidden_layers=1000000", "GB")
    assert peak < 1.5 * 2**30, peak


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "model.safetensors"])
def test_a_fifo_among_the_files_is_named_never_read(llama_dir, tmp_path, name):
    import os

    ckpt = copy(llama_dir, tmp_path / "f")
    (ckpt / name).unlink()
    os.mkfifo(ckpt / name)  # opened, it would block the load for ever
    refused(ckpt, str(ckpt / name), "not a regular file")


@pytest.mark.parametrize("key", ["attention_dropout", "initializer_range", "rms_norm_eps", "some_new_scale"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_nan_or_infinite_setting_names_its_key(llama_dir, tmp_path, key, value):
    ckpt = copy(llama_dir, tmp_path / "n", {key: value})
    refused(ckpt, str(ckpt / "config.json"), key)
