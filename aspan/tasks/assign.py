"""Value assignment (Spiegel et al. 2025, Appendix A.4): `B1E0D1A1C0:ABBED=` -> `11101`.

A table of key+value pairs (unique keys), `:`, a string of table keys, `=`; the target maps every symbol through
the table. Target `j` references string symbol `j`, its key in the table and that key's value.
"""
from __future__ import annotations

import random
import string
from functools import lru_cache
from typing import Any

from .base import SEPARATORS, Sample, Task, check_range

STRUCTURE = ":="


def _check_alphabet(name: str, chars: str) -> str:
    if not isinstance(chars, str) or not chars:
        raise ValueError(f"{name} must be a non-empty string of symbols, got {chars!r}")
    if len(set(chars)) != len(chars):
        raise ValueError(f"{name} contains duplicate symbols: {chars!r}")
    bad = [c for c in chars if c in SEPARATORS or c.isspace()]
    if bad:
        raise ValueError(f"{name} may not contain separators or whitespace, found {''.join(bad)!r}")
    return chars


@lru_cache(maxsize=256)
def _split(prompt: str) -> tuple[str, str]:
    """(table, string) of a prompt `table:string=`; ValueError if the structure is wrong."""
    if prompt.count(":") != 1 or not prompt.endswith("=") or prompt.count("=") != 1:
        raise ValueError(f"assign prompt must look like `k1v1k2v2:string=`, got {prompt!r}")
    table, s = prompt[:-1].split(":")
    if not table or len(table) % 2 or not s:
        raise ValueError(f"assign prompt needs a non-empty table of key+value pairs and a string, got {prompt!r}")
    return table, s


class Assign(Task):
    """Value assignment (Spiegel et al. 2025, Appendix A.4): a key-value table, `:`, a string of keys, `=`; the target
    maps each key to its value."""
    name = "assign"
    instruction = "Each letter before ':' is followed by its value. Replace every letter after ':' by its value."
    length_param = "length"
    length_is_target = True

    def __init__(
        self,
        pairs: tuple[int, int] | int = (5, 5),
        length: tuple[int, int] | int = (5, 5),
        keys: str = string.ascii_letters,
        values: str = "01",
    ):
        self.pairs = check_range("pairs", pairs, minimum=1)
        self.length = check_range("length", length, minimum=1)
        self.keys = _check_alphabet("keys", keys)
        self.values = _check_alphabet("values", values)
        if self.pairs[1] > len(keys):
            raise ValueError(
                f"pairs: a table of {self.pairs[1]} unique keys needs {self.pairs[1]} keys, only {len(keys)} given"
            )

    def params(self) -> dict[str, Any]:
        return {"pairs": list(self.pairs), "length": list(self.length), "keys": self.keys, "values": self.values}

    @property
    def alphabet(self) -> str:
        return "".join(sorted(set(self.keys + self.values + STRUCTURE)))

    def max_text_len(self) -> int:
        return 2 * self.pairs[1] + 2 * self.length[1] + 2

    def _sample(self, rng: random.Random) -> Sample:
        n, m = rng.randint(*self.pairs), rng.randint(*self.length)
        keys = rng.sample(self.keys, n)
        vals = [rng.choice(self.values) for _ in keys]
        idx = [rng.randrange(n) for _ in range(m)]
        prompt = "".join(k + v for k, v in zip(keys, vals)) + ":" + "".join(keys[i] for i in idx) + "="
        return self._build(prompt, "".join(vals[i] for i in idx))

    def realised(self, prompt: str, target: str) -> dict[str, list[int]]:
        table, s = _split(prompt)
        return {"pairs": [len(table) // 2], "length": [len(s)]}

    def _build(self, prompt: str, target: str) -> Sample:
        table, s = _split(prompt)
        at = {k: i for i, k in enumerate(table[::2])}  # key -> its pair's index in the table
        n = len(table) // 2
        refs = tuple((2 * at[c], 2 * at[c] + 1, 2 * n + 1 + j) for j, c in enumerate(s))
        return Sample(prompt + target, len(prompt), refs, self.name, self.params())

    def solve(self, prompt: str) -> str:
        table, s = _split(prompt)
        mapping: dict[str, str] = {}
        for k, v in zip(table[::2], table[1::2]):
            if k not in self.keys or v not in self.values:
                raise ValueError(f"table pair {k + v!r} is not a key from {self.keys!r} + a value from {self.values!r}")
            if k in mapping:
                raise ValueError(f"key {k!r} appears twice in the table")
            mapping[k] = v
        missing = [c for c in s if c not in mapping]
        if missing:
            raise ValueError(f"string symbols {''.join(missing)!r} are not keys of the table")
        return "".join(mapping[c] for c in s)

    def legal_swaps(self, prompt: str, pos: int) -> str:
        """A table key for an unused key, a value for a value, a string symbol for another key of the table."""
        table, s = _split(prompt)
        used = table[::2]
        if pos < len(table):
            if pos % 2:
                return self.values.replace(prompt[pos], "")
            return "".join(k for k in self.keys if k not in used)
        if len(table) < pos < len(prompt) - 1:
            return "".join(k for k in used if k != prompt[pos])
        return ""


TASK = Assign
PRESETS = {
    "id": {"pairs": (5, 5), "length": (5, 5)},
    "ood": {"pairs": (10, 50), "length": (10, 20)},
}
