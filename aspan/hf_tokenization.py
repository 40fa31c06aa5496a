"""A pretrained (Hugging Face) tokenizer behind the char `Tokenizer` protocol (Spiegel et al. 2025, Appendix C).

Every task character must be exactly one token of the pretrained vocabulary, found by tokenizing the lone
character and checked by round trip. An optional instruction and few-shot examples form the prefix (after BOS);
its length is the `offset` that shifts every reference position.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

from .tasks.base import Sample
from .tokenization import decode_ids


class HFCharAdapter:
    """One HF token id per task character, with BOS + instruction + few-shot examples as the prefix."""

    def __init__(
        self,
        hf_tokenizer: Any,
        instruction: str | None = None,
        few_shot: Sequence[Sample] = (),
        bos: bool = True,
        alphabet: str | None = None,
        separator: str = "\n",
    ):
        self.hf_tokenizer = hf_tokenizer
        self.instruction = instruction or None
        self.few_shot = tuple(few_shot)
        self.bos = bos
        self.alphabet = alphabet
        self.separator = separator
        self._ids: dict[str, int] = {}
        self._chars: dict[int, str] = {}
        self.bos_id: int | None = hf_tokenizer.bos_token_id if bos else None
        self.eos_id: int | None = hf_tokenizer.eos_token_id
        pad = hf_tokenizer.pad_token_id
        self.pad_id: int = pad if pad is not None else (self.eos_id if self.eos_id is not None else 0)
        if alphabet is not None:
            self.check(alphabet)
        self._prefix = self._build_prefix()

    # -- the character table ------------------------------------------------------------------------------
    def _problem(self, c: str) -> str | None:
        """Why `c` is not a single token (None if it is); caches the id of a good character."""
        if c in self._ids:
            return None
        ids = self.hf_tokenizer.encode(c, add_special_tokens=False)
        if len(ids) != 1:
            return f"{c!r} -> {len(ids)} tokens {ids}"
        # Decoding the token twice catches SentencePiece's hidden leading space ("▁a" decodes alone to "a").
        back = self.hf_tokenizer.decode(ids * 2)
        if back != c * 2:
            return f"{c!r} -> token {ids[0]} which decodes as {back[: len(back) // 2]!r}"
        self._ids[c] = ids[0]
        self._chars.setdefault(ids[0], c)
        return None

    def check(self, alphabet: str) -> None:
        """ValueError naming every character of `alphabet` that is not exactly one round-tripping token."""
        problems = [p for c in dict.fromkeys(alphabet) if (p := self._problem(c)) is not None]
        if problems:
            name = getattr(self.hf_tokenizer, "name_or_path", "") or type(self.hf_tokenizer).__name__
            raise ValueError(
                f"{len(problems)} character(s) are not single tokens of the tokenizer {name}: " + "; ".join(problems)
            )

    def encode(self, text: str) -> list[int]:
        """One id per character of `text`; ValueError on a character the adapter cannot encode as one token."""
        self.check(text)
        return [self._ids[c] for c in text]

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True) -> str:
        """Text of `ids`, special tokens left out, up to the first EOS when `stop_at_eos`."""
        def to_char(i: int) -> str:
            return self._chars[i] if i in self._chars else self.hf_tokenizer.decode([i])

        return decode_ids(ids, to_char, (self.pad_id, self.bos_id, self.eos_id), self.eos_id, stop_at_eos)

    # -- the prefix ---------------------------------------------------------------------------------------
    def _build_prefix(self) -> list[int]:
        ids = [self.bos_id] if self.bos_id is not None else []
        if self.instruction:
            ids += self.hf_tokenizer.encode(self.instruction, add_special_tokens=False)
        sep = self.hf_tokenizer.encode(self.separator, add_special_tokens=False) if self.separator else []
        for s in self.few_shot:
            ids += self.encode(s.text) + sep
        return ids

    def prefix_ids(self) -> list[int]:
        """The ids that precede every sample: BOS, the instruction and the few-shot samples."""
        return list(self._prefix)

    @property
    def offset(self) -> int:
        """The number of prefix tokens (BOS, instruction, few-shot) before a sample's first character."""
        return len(self._prefix)

    @property
    def vocab_size(self) -> int:
        """The Hugging Face tokenizer's vocabulary size."""
        return len(self.hf_tokenizer)

    # -- checkpoints --------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The adapter's settings as JSON-ready data (what a checkpoint records)."""
        return {
            "type": "hf_char",
            "hf_path": getattr(self.hf_tokenizer, "name_or_path", None),
            "instruction": self.instruction,
            "few_shot": [s.to_dict() for s in self.few_shot],
            "bos": self.bos,
            "alphabet": self.alphabet,
            "separator": self.separator,
        }

    @classmethod
    def from_dict(cls, d: dict, hf_tokenizer: Any = None, base_dir: str | os.PathLike | None = None) -> "HFCharAdapter":
        """Rebuild from `to_dict()`; loads the HF tokenizer from `hf_path` (relative to `base_dir`) unless given."""
        if d.get("type") != "hf_char":
            raise ValueError(f"not an hf_char tokenizer config (type={d.get('type')!r})")
        if hf_tokenizer is None:
            from transformers import AutoTokenizer

            path = d.get("hf_path")
            if not path:
                raise ValueError("hf_char tokenizer config has no hf_path to load the Hugging Face tokenizer from")
            if base_dir is not None and not os.path.isabs(path):
                path = os.path.join(base_dir, path)
            hf_tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        return cls(
            hf_tokenizer,
            instruction=d.get("instruction"),
            few_shot=[Sample.from_dict(s) for s in d.get("few_shot", [])],
            bos=d.get("bos", True),
            alphabet=d.get("alphabet"),
            separator=d.get("separator", "\n"),
        )

    def __repr__(self) -> str:
        name = getattr(self.hf_tokenizer, "name_or_path", "") or type(self.hf_tokenizer).__name__
        return f"HFCharAdapter({name!r}, offset={self.offset}, few_shot={len(self.few_shot)})"
