"""Tokenizers: every task character is exactly one token (Spiegel et al. 2025, Appendix C).

`CharTokenizer` is the from-scratch vocabulary; `HFCharAdapter` (in `aspan.hf_tokenization`) maps a pretrained
tokenizer onto the same interface. Both expose `prefix_ids()`: the tokens before every sample (BOS, an
instruction, few-shot examples); its length is the `offset` that shifts every reference position.
"""
from __future__ import annotations

import json
from typing import Callable, Iterable, Protocol, runtime_checkable

BOS, EOS, PAD = "<bos>", "<eos>", "<pad>"
SPECIALS: tuple[str, ...] = (PAD, BOS, EOS)
# Every symbol of every task with default parameters, in a fixed order so checkpoints stay compatible.
DEFAULT_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ=+*:,"


@runtime_checkable
class Tokenizer(Protocol):
    """What the batch helper, training and evaluation need from a tokenizer."""

    pad_id: int
    eos_id: int | None

    def encode(self, text: str) -> list[int]:
        """One id per character of `text`; ValueError otherwise."""

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, special tokens left out."""

    def prefix_ids(self) -> list[int]:
        """The ids before every sample (BOS, an instruction, few-shot samples)."""

    @property
    def offset(self) -> int:
        """The number of prefix tokens before a sample's first character (`len(prefix_ids())`)."""

    @property
    def vocab_size(self) -> int:
        """The number of ids."""


class CharTokenizer:
    """Character vocabulary: `<pad>`, `<bos>`, `<eos>`, then one id per character."""

    def __init__(self, chars: str = DEFAULT_CHARS, bos: bool = True):
        if len(set(chars)) != len(chars):
            raise ValueError("chars contains duplicates")
        self.chars = chars
        self.itos: list[str] = [*SPECIALS, *chars]
        self.stoi: dict[str, int] = {s: i for i, s in enumerate(self.itos)}
        self.pad_id, self.bos_id, self.eos_id = (self.stoi[s] for s in SPECIALS)
        self.bos = bos

    @classmethod
    def for_alphabets(cls, *alphabets: str) -> "CharTokenizer":
        """The default vocabulary extended (at the end, in first-seen order) by any extra characters."""
        extra = "".join(dict.fromkeys(c for a in alphabets for c in a if c not in DEFAULT_CHARS))
        return cls(DEFAULT_CHARS + extra)

    @property
    def vocab_size(self) -> int:
        """The number of ids: the characters and the special tokens."""
        return len(self.itos)

    @property
    def offset(self) -> int:
        """The number of prefix tokens before a sample's first character (1 with BOS, else 0)."""
        return len(self.prefix_ids())

    def prefix_ids(self) -> list[int]:
        """The ids before every sample: `[bos_id]`, or none."""
        return [self.bos_id] if self.bos else []

    def encode(self, text: str) -> list[int]:
        """One id per character of `text`; ValueError naming the characters outside the vocabulary."""
        missing = sorted(set(text) - self.stoi.keys())
        if missing:
            raise ValueError(f"characters not in the tokenizer's vocabulary: {''.join(missing)!r}")
        return [self.stoi[c] for c in text]

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True) -> str:
        """Text of `ids`, special tokens left out, up to the first EOS when `stop_at_eos`."""
        return decode_ids(ids, self.itos.__getitem__, (self.pad_id, self.bos_id, self.eos_id), self.eos_id, stop_at_eos)

    def check(self, alphabet: str) -> None:
        """ValueError naming every character of `alphabet` this tokenizer cannot encode."""
        self.encode(alphabet)

    def to_dict(self) -> dict:
        """The tokenizer as JSON-ready data (what a checkpoint records)."""
        return {"type": "char", "chars": self.chars, "bos": self.bos}

    @classmethod
    def from_dict(cls, d: dict) -> "CharTokenizer":
        """The tokenizer `to_dict` wrote; ValueError if `d` is not a char tokenizer's."""
        if d.get("type", "char") != "char":
            raise ValueError(f"not a char tokenizer config: {json.dumps(d)[:200]}")
        return cls(d["chars"], bos=d.get("bos", True))

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, bos={self.bos})"


def decode_ids(
    ids: Iterable[int],
    to_char: Callable[[int], str],
    skip: tuple[int | None, ...],
    eos_id: int | None,
    stop_at_eos: bool,
) -> str:
    """Text of `ids`: special ids in `skip` dropped, and everything from the first EOS on when `stop_at_eos`."""
    out = []
    for i in map(int, ids):
        if stop_at_eos and i == eos_id:
            break
        if i not in skip:
            out.append(to_char(i))
    return "".join(out)


TOKENIZER_API = ("encode", "decode", "prefix_ids", "offset", "vocab_size", "pad_id", "eos_id")  # `Tokenizer`


def require_tokenizer(tokenizer: object, where: str = "tokenizer") -> None:
    """A one-line TypeError saying what to pass when `tokenizer` is not one of aspan's (a model's own, e.g. a
    HookedTransformer's `model.tokenizer`, or None): the tasks need one token per character and a known prefix."""
    if all(hasattr(tokenizer, name) for name in TOKENIZER_API):
        return
    raise TypeError(
        f"{where}: got {type(tokenizer).__name__}, not an aspan tokenizer (tasks need one token per character); pass "
        f"aspan.CharTokenizer() for a model over aspan's character vocabulary, or "
        f"aspan.hf_tokenization.HFCharAdapter(hf_tokenizer) to wrap a pretrained model's Hugging Face tokenizer"
    )


def check_tokenizer(tokenizer: Tokenizer, alphabet: str) -> None:
    """ValueError naming the characters the tokenizer does not map to exactly one token (text is character-level)."""
    bad = []
    for c in alphabet:
        try:
            if len(tokenizer.encode(c)) != 1:
                bad.append(c)
        except ValueError:
            bad.append(c)
    if bad:
        raise ValueError(f"the tokenizer cannot encode these task characters as one token each: {''.join(bad)!r}")
