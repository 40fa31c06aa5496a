"""Tiny GGUF files written with gguf's own writer (a 2-layer Llama of width 16 with a SentencePiece-style
vocabulary of 11 tokens), with any metadata value replaced, tensors left out or added, for the loader's checks."""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

CHARS = "abcdefgh"
TOKENS = ["<unk>", "<s>", "</s>", *CHARS]
LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down")


def _shapes(d: int, kv: int, ff: int, layers: int) -> dict[str, tuple[int, ...]]:
    hd = d // 2
    per = {"attn_norm": (d,), "attn_q": (d, d), "attn_k": (kv * hd, d), "attn_v": (kv * hd, d), "attn_output": (d, d),
           "ffn_norm": (d,), "ffn_gate": (ff, d), "ffn_up": (ff, d), "ffn_down": (d, ff)}
    out = {"token_embd.weight": (len(TOKENS), d), "output_norm.weight": (d,), "output.weight": (len(TOKENS), d)}
    for i in range(layers):
        out.update({f"blk.{i}.{n}.weight": s for n, s in per.items()})
    return out


def write_gguf(path: Path, meta: dict[str, Any] | None = None, drop: tuple[str, ...] = (),
               extra: tuple[str, ...] = (), layers: int = 2, reshape: dict[str, tuple[int, ...]] | None = None) -> Path:
    """A valid tiny Llama GGUF at `path`; `meta` replaces metadata values (by full key; None removes the key),
    `drop` leaves tensors out, `extra` adds 16-entry tensors, `reshape` stores tensors with other (torch-order)
    shapes, `layers`: blocks stored (block_count stays 2 unless `meta` sets it)."""
    import gguf

    meta = dict(meta or {})
    w = gguf.GGUFWriter(str(path), "llama")
    d, kv, ff = 16, 1, 32
    values: dict[str, Any] = {
        "llama.block_count": 2, "llama.context_length": 64, "llama.embedding_length": d,
        "llama.feed_forward_length": ff, "llama.attention.head_count": 2, "llama.attention.head_count_kv": kv,
        "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.dimension_count": d // 2,
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": TOKENS,
        "tokenizer.ggml.scores": [0.0] * len(TOKENS), "tokenizer.ggml.token_type": [2, 3, 3] + [1] * len(CHARS),
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
    }
    values.update(meta)
    empty = [key for key, value in values.items() if value == []]  # gguf's writer refuses empty arrays: patched below
    for key, value in values.items():
        if value is not None:
            _add(w, key, [""] if value == [] else value)
    rng = np.random.default_rng(0)
    tensors = {**_shapes(d, kv, ff, layers), **{name: (d,) for name in extra}, **(reshape or {})}
    for name, shape in tensors.items():
        if name not in drop:
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for key in empty:  # the one-string array [""] made empty (only the header's checks read such a file)
        one = string(key) + struct.pack("<IIQQ", 9, 8, 1, 0)
        path.write_bytes(path.read_bytes().replace(one, string(key) + struct.pack("<IIQ", 9, 8, 0), 1))
    return path


def _add(w, key: str, value: Any) -> None:
    """One metadata entry, typed as llama.cpp writes it (sizes uint32, floats float64, lists by their first item)."""
    from gguf import GGUFValueType as T

    if isinstance(value, list):
        kind = T.STRING if value and isinstance(value[0], str) else T.FLOAT32 if value and isinstance(
            value[0], float) else T.INT32
        w.add_key_value(key, value, T.ARRAY, sub_type=kind)
    elif isinstance(value, bool):
        w.add_key_value(key, value, T.BOOL)
    elif isinstance(value, int):
        w.add_key_value(key, value, T.UINT32 if 0 <= value < 2**32 else T.INT64)
    elif isinstance(value, float):
        w.add_key_value(key, value, T.FLOAT64)
    else:
        w.add_key_value(key, value, T.STRING)


def string(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def raw_gguf(path: Path, entries: bytes, n_entries: int) -> Path:
    """A GGUF file of `n_entries` raw metadata entries and no tensors."""
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, n_entries) + entries)
    return path


def nested_array(key: str, depth: int) -> bytes:
    """A metadata entry holding an array of an array ... `depth` deep, the innermost empty."""
    return string(key) + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * (depth - 1) + struct.pack("<IQ", 0, 0)
