"""Reversal (Spiegel et al. 2025, Appendix A.1): `s=` -> `reversed(s)`; target char j references position n-1-j."""
from __future__ import annotations

import random
import string
from typing import Any

from .base import SEPARATORS, Sample, Task, check_range

DEFAULT_CHARSET = string.ascii_lowercase + string.ascii_uppercase + string.digits


class Reversal(Task):
    """Copy a string backwards; `length` is the (min, max) string length, `charset` the symbols (>= 2, no
    separators)."""

    name = "reversal"
    instruction = "Reverse the string before '='."
    length_param = "length"
    length_is_target = True
    demo_ood = {"length": (11, 20)}
    quick_ood = {"length": (11, 14)}

    def __init__(self, length: tuple[int, int] | int = (1, 10), charset: str = DEFAULT_CHARSET):
        self.length = check_range("length", length, minimum=1)
        if not isinstance(charset, str):
            raise ValueError(f"charset must be a string, got {type(charset).__name__}")
        if len(set(charset)) != len(charset):
            dup = next(c for i, c in enumerate(charset) if c in charset[:i])
            raise ValueError(f"charset has duplicate symbol {dup!r}")
        bad = [c for c in charset if c in SEPARATORS or c.isspace()]
        if bad:
            raise ValueError(f"charset may not contain separators or whitespace, found {bad[0]!r}")
        if len(charset) < 2:
            raise ValueError(f"charset needs at least 2 symbols, got {len(charset)}")
        self.charset = charset

    def params(self) -> dict[str, Any]:
        return {"length": list(self.length), "charset": self.charset}

    @property
    def alphabet(self) -> str:
        return "".join(sorted(self.charset + "="))

    def max_text_len(self) -> int:
        return 2 * self.length[1] + 1

    def _sample(self, rng: random.Random) -> Sample:
        s = "".join(rng.choice(self.charset) for _ in range(rng.randint(*self.length)))
        return self._build(s + "=", s[::-1])

    def realised(self, prompt: str, target: str) -> dict[str, list[int]]:
        return {"length": [len(target)]}

    def _build(self, prompt: str, target: str) -> Sample:
        n = len(target)
        refs = tuple((n - 1 - j,) for j in range(n))
        return Sample(prompt + target, len(prompt), refs, task=self.name, params=self.params())

    def solve(self, prompt: str) -> str:
        """The reversed string; any non-empty length is accepted, every symbol must be in the charset."""
        if len(prompt) < 2 or not prompt.endswith("="):
            raise ValueError(f"reversal prompt must be a non-empty string followed by '=', got {prompt!r}")
        s = prompt[:-1]
        for c in s:
            if c not in self.charset:
                raise ValueError(f"reversal prompt has symbol {c!r} outside the charset")
        return s[::-1]

    def legal_swaps(self, prompt: str, pos: int) -> str:
        c = prompt[pos]
        return self.charset.replace(c, "") if c in self.charset else ""


TASK = Reversal
PRESETS: dict[str, dict[str, Any]] = {"id": {"length": (1, 10)}, "ood": {"length": (11, 50)}}
