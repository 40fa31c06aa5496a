"""A GGUF file's memory is estimated from its header (tensor shapes and metadata, never its data) before
transformers dequantises it, and refused over the available memory like any other model: one line naming the file,
exit 2, before the allocation."""
import struct

from aspan.models.hf import smollm2_path
from aspan.models.safety import gguf_shapes
from tests.cli import aspan_peak, one_line

# `aspan` with this machine's available memory made small: 512 MB (so 410 MB for a model)
SMALL_MACHINE = "import aspan.models.safety as s\ns.available_bytes = lambda device=None: 512 * 2**20"


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def gguf_file(path, dims: list[int], tail: bytes = b"") -> None:
    """A GGUF header with one metadata entry (the architecture) and one float32 tensor of `dims`, without its data."""
    kv = _string("general.architecture") + struct.pack("<I", 8) + _string("llama")
    tensor = _string("token_embd.weight") + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + kv + tensor + struct.pack("<IQ", 0, 0) + tail)


def test_the_header_gives_the_shapes_gguf_itself_reads():
    from gguf import GGUFReader

    path = smollm2_path()
    meta, shapes = gguf_shapes(path)
    reader = GGUFReader(path)
    assert {t.name: sorted(int(d) for d in t.shape) for t in reader.tensors} == \
        {k: sorted(v) for k, v in shapes.items()}
    assert sum(int(t.n_elements) for t in reader.tensors) == 134_515_008
    assert (meta["general.architecture"], meta["llama.block_count"], meta["llama.context_length"]) == \
        ("llama", 30, 8192)


def test_a_gguf_model_over_the_available_memory_is_refused_before_dequantising(tmp_path):
    for backend, words in (("hooked", ["about 3.1 GB"]), ("bridge", ["about 1.1 GB", "parameters=134515008"])):
        code, err, peak = aspan_peak("eval", "smollm2", "--task", "reversal", "-n", "1", "--no-attn", cwd=tmp_path,
                                     code=SMALL_MACHINE + f"\nimport os\nos.environ['ASPAN_BACKEND'] = '{backend}'")
        assert code == 2, err[-2000:]
        one_line(err, str(smollm2_path()), "the model would take", *words, "more than this machine can hold")
        assert peak < 1.2 * 2**30, peak  # the dequantised float32 model alone would add 0.5 GB (hooked: 1.7 GB peak)


def test_a_gguf_header_with_hostile_shapes_or_lengths_is_refused_in_one_line(tmp_path):
    huge = tmp_path / "huge.gguf"
    gguf_file(huge, [2**20, 2**20])
    code, err, peak = aspan_peak("eval", str(huge), "--task", "reversal", "-n", "1", cwd=tmp_path)
    assert code == 2 and peak < 2**30, err[-2000:]
    one_line(err, str(huge), "the model would take about 8,192.0 GB", "tensors=1")  # 2^40 float32 entries, twice
    cut = tmp_path / "cut.gguf"  # a tensor name claiming a terabyte in a 100-byte file
    kv = _string("general.architecture") + struct.pack("<I", 8) + _string("llama")
    cut.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + kv + struct.pack("<Q", 2**40) + b"x" * 60)
    code, err, _ = aspan_peak("eval", str(cut), "--task", "reversal", "-n", "1", cwd=tmp_path)
    assert code == 2
    one_line(err, str(cut), "GGUF header")
