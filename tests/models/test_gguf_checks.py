"""A GGUF file is checked against itself and against the model built from it, as Hugging Face directories are: a
block count that is not the blocks stored, a missing or unused tensor, a header that counts fewer tensors, a NaN or
negative norm epsilon, metadata transformers would reject or choke on, arrays nested or sized past reason: each
refused in one line naming the file and the first mismatch, before or instead of a model with random weights."""
from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspan import models
from aspan.errors import UsageError
from tests.cli import aspan, aspan_peak, one_line

from .gguf_fixtures import TOKENS, nested_array, raw_gguf, string, write_gguf

pytest.importorskip("gguf", reason="the GGUF checks need the gguf package (pip install 'aspan[gguf]')")
ID = ["--task", "reversal", "-n", "1", "--no-attn"]


def refused(path, *words):
    with pytest.raises(UsageError) as info:
        models.load(path, device="cpu", backend="hooked")
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    for w in words:
        assert w in message, (w, message)
    return message


def test_a_faithful_file_loads_with_every_tensor_used(tmp_path):
    loaded = models.load(write_gguf(tmp_path / "ok.gguf"), device="cpu", backend="hooked")
    assert loaded.model.cfg.n_layers == 2


@pytest.mark.parametrize("case, kw, words", [
    ("fewer layers", dict(meta={"llama.block_count": 1}), ["blk.1", "block_count is 1"]),
    ("more layers", dict(meta={"llama.block_count": 3}), ["block_count is 3", "blk.2"]),
    ("no layers", dict(meta={"llama.block_count": 0}), ["llama.block_count", ">= 1"]),
    ("missing tensor", dict(drop=("blk.1.ffn_down.weight",)), ["needs blk.1.ffn_down.weight", "lacks"]),
    ("extra block", dict(extra=("blk.5.attn_norm.weight",)), ["blk.5", "block_count is 2"]),
    ("unknown tensor", dict(extra=("mystery.weight",)), ["mystery.weight", "not a tensor of the model"]),
    ("tensor of another shape", dict(reshape={"blk.1.attn_q.weight": (16, 18)}),
     ["blk.1.attn_q.weight with shape [16, 18]", "needs [16, 16]"]),
    ("NaN epsilon", dict(meta={"llama.attention.layer_norm_rms_epsilon": float("nan")}),
     ["layer_norm_rms_epsilon", "finite positive"]),
    ("negative epsilon", dict(meta={"llama.attention.layer_norm_rms_epsilon": -1e-5}),
     ["layer_norm_rms_epsilon", "finite positive"]),
    ("no scores", dict(meta={"tokenizer.ggml.scores": None}), ["tokenizer.ggml.scores is missing"]),
])
def test_a_file_that_does_not_describe_its_model_is_refused(tmp_path, case, kw, words):
    refused(write_gguf(tmp_path / "m.gguf", **kw), *words)


def test_a_header_that_counts_fewer_tensors_is_refused(tmp_path):
    path = write_gguf(tmp_path / "count.gguf")
    data = bytearray(path.read_bytes())
    data[8:16] = struct.pack("<Q", 5)  # the tensor count: 5 of 21
    path.write_bytes(bytes(data))
    refused(path, "block_count is 2", "blk.1")


def test_the_command_line_says_it_in_one_line_exit_2(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", drop=("blk.1.ffn_down.weight",))
    r = aspan("eval", str(path), *ID, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(r.stderr, str(path), "blk.1.ffn_down.weight")


# Metadata transformers rejects or mis-builds: each is refused naming the key (the 13 probes of the bug report among
# the examples Hypothesis draws from).
SIZES = ["llama.attention.head_count", "llama.embedding_length", "llama.block_count", "llama.context_length",
         "llama.attention.head_count_kv", "llama.feed_forward_length", "llama.vocab_size"]
IDS = ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.tuples(st.sampled_from(SIZES), st.one_of(st.integers(-2**40, 0), st.integers(10**6, 2**40),
                                                st.floats(allow_nan=True), st.text(max_size=3))),
    st.tuples(st.sampled_from(SIZES[:2] + SIZES[4:5]), st.just(3)),  # widths and heads that do not divide
    st.tuples(st.sampled_from(IDS), st.one_of(st.integers(len(TOKENS), 2**40), st.integers(-2**40, -1))),
    st.tuples(st.sampled_from(["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"]),
              st.one_of(st.just([]), st.lists(st.integers(0, 9), min_size=1, max_size=30), st.just(["a"]))),
    st.tuples(st.sampled_from(["llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base"]),
              st.one_of(st.floats(max_value=0.0), st.just(float("inf")), st.just(float("nan")))),
    st.tuples(st.just("llama.attention.some_scale"), st.sampled_from([float("nan"), float("inf"), -float("inf")])),
))
def test_metadata_a_model_cannot_be_built_from_is_refused_naming_the_key(tmp_path_factory, change):
    key, value = change
    path = write_gguf(tmp_path_factory.mktemp("meta") / "m.gguf", meta={key: value})
    refused(path, key)


def test_arrays_nested_5000_deep_are_refused_by_the_header_reader(tmp_path):
    path = raw_gguf(tmp_path / "deep.gguf", nested_array("deep.key", 5000), 1)
    refused(path, "deep.key", "nests arrays more than")


def test_a_huge_metadata_array_is_refused_before_any_reader_allocates_it(tmp_path):
    """3 million booleans in a 3 MB file took gguf's reader to 2.7 GB; refused from the header, in one line."""
    n = 3_000_000
    entry = string("junk.flags") + struct.pack("<I", 9) + struct.pack("<IQ", 7, n) + b"\x00" * n
    path = raw_gguf(tmp_path / "flags.gguf", entry, 1)
    code, err, peak = aspan_peak("eval", str(path), *ID, cwd=tmp_path)
    assert code == 2, err[-2000:]
    one_line(err, str(path), "junk.flags", "3,000,000 entries")
    assert peak < 1.5 * 2**30, peak


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_a_fifo_named_gguf_is_called_a_fifo(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    r = aspan("eval", str(fifo), *ID, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(r.stderr, str(fifo), "a FIFO")
    (tmp_path / "ckpt").mkdir()
    os.mkfifo(tmp_path / "ckpt" / "config.json")  # read, it would block the command for ever
    r = aspan("eval", str(tmp_path / "ckpt"), *ID, cwd=tmp_path, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(r.stderr, str(tmp_path / "ckpt" / "config.json"), "a FIFO")


def test_a_million_blocks_are_refused_from_the_header(tmp_path):
    from tests.cli import aspan_peak

    path = write_gguf(tmp_path / "deep.gguf", meta={"llama.block_count": 10**6})
    code, err, peak = aspan_peak("eval", str(path), *ID, cwd=tmp_path)
    assert code == 2, err[-2000:]
    one_line(err, str(path), "llama.block_count")
    assert peak < 1.5 * 2**30, peak


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 6000))
def test_the_header_reader_answers_any_nesting_depth(tmp_path, depth):
    from aspan.models.safety import MAX_GGUF_NESTING, GGUFArray, gguf_shapes

    path = raw_gguf(tmp_path / "nested.gguf", nested_array("deep.key", depth), 1)
    if depth <= MAX_GGUF_NESTING:
        meta, _ = gguf_shapes(path)
        assert meta["deep.key"] == GGUFArray(9 if depth > 1 else 0, 1 if depth > 1 else 0)
    else:
        with pytest.raises(UsageError, match="deep.key nests arrays more than"):
            gguf_shapes(path)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 3 * 2**20), st.sampled_from([(7, 1), (6, 4), (10, 8)]))
def test_metadata_arrays_are_sized_from_the_header_and_bounded(tmp_path, n, kind):
    from aspan.models.safety import MAX_GGUF_ARRAY, GGUFArray, gguf_shapes

    item, size = kind
    entry = string("some.array") + struct.pack("<I", 9) + struct.pack("<IQ", item, n)
    path = raw_gguf(tmp_path / "array.gguf", entry + b"\0" * (n * size), 1)
    if n <= MAX_GGUF_ARRAY:
        assert gguf_shapes(path)[0]["some.array"] == GGUFArray(item, n)
    else:
        with pytest.raises(UsageError, match=f"some.array is an array of {n:,} entries"):
            gguf_shapes(path)


def test_a_cut_file_is_refused_naming_the_first_tensor_past_its_end(tmp_path):
    path = write_gguf(tmp_path / "cut.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 3000])
    refused(path, "the data of blk.1.ffn_down.weight ends at byte", "past the end of the file", "truncated")
