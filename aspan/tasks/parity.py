"""Parity in four formats (Ebrahimi, Panchal & Memisevic 2024, "Your context is not an array", arXiv 2408.05506, §3-4).

    plain        `10110=` -> `1`                     the parity alone; it references every input bit
    scratchpad   `10110=` -> `11011`                 running parity; output `i` reads bit `i` and output `i-1`
    interleaved  `10110=` -> `1101101101`            each input bit is replayed (given) before its running parity
    interleaved-ab `10110=` -> `b1a1b0b1a1`          the same, the replayed bits on tokens of their own (a: 0, b: 1)
    mnemonic     `a1b0c1=` -> `a1b1c0`               a random anchor before every bit, repeated in the scratchpad

The scratchpad needs an index-based lookup (output `i` must find bit `i`, `n + 1` positions back), which is what
fails beyond the training length (the paper's §3). The interleaved scratchpad (§3.2) places every step next to
what it needs: the input bit is supplied into the target stream (a `given` character: not predicted, not scored)
and the running parity is produced right after it, so output `i` reads fixed relative offsets 0 and 1 before its
query row. In `interleaved` the replayed bit is the same `0`/`1` token as a parity output, so a model cannot tell
from the token alone whether the previous character was a given bit or its own output; `interleaved-ab` spells
the replayed bits `a` (0) and `b` (1) instead (`REPLAYED`), everything else unchanged. Mnemonics (§4) attach
distinct random anchor symbols to the input bits; the model writes the anchor of step `i` and then the running
parity, so bit `i` is found by content (the bit after the matching anchor), not by index. Anchors are drawn
without replacement from `ANCHOR_POOL` (ASCII, Greek and Cyrillic letters: one character, one token each);
`anchors` sets how many of them a task uses, at least the longest input.
Duan & Shi 2023 (arXiv 2310.11984, Section 4 and Table 3) use the running parity, on binary numbers zero-padded to a
fixed width: `layout="padded", width=W` (scratchpad format only) writes an n-bit number (n from `length`, its
leading bit 1 when n > 1) zero-padded on the left to W bits, and its running parity over all W bits.
"""
from __future__ import annotations

import random
import string
from typing import Any, Literal, get_args

from .base import Sample, Task, check_range
from .numbers import Layout, check_layout

BITS = "01"
ParityFormat = Literal["plain", "scratchpad", "interleaved", "interleaved-ab", "mnemonic"]
FORMATS: tuple[str, ...] = get_args(ParityFormat)
# Distinct one-character anchor symbols, in a fixed order: ASCII letters, Greek lower/upper, Cyrillic lower.
ANCHOR_POOL = (
    string.ascii_lowercase
    + string.ascii_uppercase
    + "".join(chr(c) for c in range(0x3B1, 0x3CA))
    + "".join(chr(c) for c in range(0x391, 0x3AA) if c != 0x3A2)
    + "".join(chr(c) for c in range(0x430, 0x450))
)
DEFAULT_ANCHORS = 100
REPLAYED = {"0": "a", "1": "b"}  # how `interleaved-ab` spells a replayed input bit
INTERLEAVED = ("interleaved", "interleaved-ab")


def running(bits: str) -> str:
    """Running parity of a bit string: character `i` is the parity of `bits[: i + 1]`."""
    out, acc = [], 0
    for c in bits:
        acc ^= c == "1"
        out.append("1" if acc else "0")
    return "".join(out)


class Parity(Task):
    """Running parity of a bit string: the target is the parity after each bit, in the chosen format."""
    name = "parity"
    instruction = "Write the running parity of the bits."
    length_param = "length"
    length_is_target = True

    def __init__(
        self,
        length: tuple[int, int] | int = (1, 10),
        scratchpad: bool = True,
        format: ParityFormat | None = None,
        anchors: int = DEFAULT_ANCHORS,
        layout: Layout = "lsd",
        width: int | None = None,
    ):
        self.length = check_range("length", length, minimum=1)
        if not isinstance(scratchpad, bool):
            raise ValueError(f"scratchpad must be a bool, got {scratchpad!r}")
        if format is None:
            format = "scratchpad" if scratchpad else "plain"
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {format!r}")
        if not scratchpad and format != "plain":
            raise ValueError(f"scratchpad=False means format='plain', but format={format!r} was given")
        if isinstance(anchors, bool) or not isinstance(anchors, int) or not 1 <= anchors <= len(ANCHOR_POOL):
            raise ValueError(f"anchors must be an int in 1..{len(ANCHOR_POOL)}, got {anchors!r}")
        if format != "mnemonic" and anchors != DEFAULT_ANCHORS:
            raise ValueError(f"anchors is a parameter of format='mnemonic' only (format is {format!r})")
        if format == "mnemonic" and anchors < self.length[1]:
            raise ValueError(f"anchors={anchors} is fewer than the longest input ({self.length[1]} bits); "
                             "every bit needs its own anchor")
        self.format: str = format
        self.anchors = anchors
        self.scratchpad = format != "plain"
        self.layout, self.width = layout, check_layout(layout, width, self.length[1])
        if self.width is not None and format != "scratchpad":
            raise ValueError(f"layout='padded' is the running parity: format must be 'scratchpad', got {format!r}")

    def params(self) -> dict[str, Any]:
        p: dict[str, Any] = {"length": list(self.length), "scratchpad": self.scratchpad, "format": self.format}
        if self.format == "mnemonic":
            p["anchors"] = self.anchors
        return p if self.width is None else {**p, "layout": self.layout, "width": self.width}

    @property
    def anchor_symbols(self) -> str:
        """The anchor symbols of the `mnemonic` format (empty for the others)."""
        return ANCHOR_POOL[: self.anchors] if self.format == "mnemonic" else ""

    @property
    def alphabet(self) -> str:
        replayed = "".join(REPLAYED.values()) if self.format == "interleaved-ab" else ""
        return "".join(sorted(set("01=" + self.anchor_symbols + replayed)))

    def max_text_len(self) -> int:
        n = self.length[1] if self.width is None else self.width
        return {"plain": n + 2, "scratchpad": 2 * n + 1, "interleaved": 3 * n + 1, "interleaved-ab": 3 * n + 1,
                "mnemonic": 4 * n + 1}[self.format]

    def _sample(self, rng: random.Random) -> Sample:
        n = rng.randint(*self.length)
        bits = "".join(rng.choice(BITS) for _ in range(n))
        if self.width is not None:  # an n-bit number, zero-padded to the width
            bits = ("1" + bits[1:] if n > 1 else bits).zfill(self.width)
        return self._from_bits(bits, rng)

    def build(self, x: int) -> Sample:
        """The padded-layout sample of the number `x`: its binary digits zero-padded to the width, then its running
        parity (Duan & Shi 2023 draw numbers and write them in binary)."""
        if self.width is None:
            raise ValueError("build(x) writes a number in the padded layout: use layout='padded' with a width")
        if isinstance(x, bool) or not isinstance(x, int) or x < 0 or x.bit_length() > self.width:
            raise ValueError(f"build needs an int from 0 to 2**{self.width} - 1 (width={self.width}), got {x!r}")
        return self._from_bits(format(x, "b").zfill(self.width), None)

    def _from_bits(self, bits: str, rng: random.Random | None) -> Sample:
        """The sample of the input bits `bits` in this task's format (mnemonic anchors drawn from `rng`)."""
        n = len(bits)
        par = running(bits)
        if self.format == "plain":
            return self._build(bits + "=", par[-1])
        if self.format == "scratchpad":
            return self._build(bits + "=", par)
        if self.format == "interleaved":
            return self._build(bits + "=", "".join(b + p for b, p in zip(bits, par)))
        if self.format == "interleaved-ab":
            return self._build(bits + "=", "".join(REPLAYED[b] + p for b, p in zip(bits, par)))
        marks = rng.sample(self.anchor_symbols, n)
        prompt = "".join(m + b for m, b in zip(marks, bits)) + "="
        return self._build(prompt, "".join(m + p for m, p in zip(marks, par)))

    def realised(self, prompt: str, target: str) -> dict[str, list[int]]:
        if self.width is not None:  # an n-bit number zero-padded: n is its bit length (0 counts as one bit)
            return {"length": [max(len(self._parse(prompt)[0].lstrip("0")), 1)]}
        return {"length": [len(self._parse(prompt)[0])]}

    def _build(self, prompt: str, target: str) -> Sample:
        n = len(self._parse(prompt)[0])
        given: tuple[int, ...] = ()
        if self.format == "plain":
            refs = [tuple(range(n))]
        elif self.format == "scratchpad":
            refs = [(0,) if i == 0 else (i, n + i) for i in range(n)]  # output i-1 sits at n + 1 + i - 1
        elif self.format in INTERLEAVED:
            t = n + 1  # target index k sits at text position t + k; bit i at 2i (given), parity i at 2i + 1
            refs = []
            for i in range(n):
                refs += [(), (t,) if i == 0 else (t + 2 * i - 1, t + 2 * i)]
            given = tuple(range(0, 2 * n, 2))
        else:
            t = 2 * n + 1  # anchor i at 2i in the prompt and t + 2i in the target; bit i at 2i + 1
            refs = []
            for i in range(n):
                refs += [(2 * i,), (1,) if i == 0 else (2 * i + 1, t + 2 * i - 1)]
        return Sample(prompt + target, len(prompt), tuple(refs), self.name, self.params(), given)

    def bits(self, prompt: str) -> str:
        """The input bits of a prompt of this task (anchors dropped); ValueError on an invalid prompt."""
        return self._parse(prompt)[0]

    def _parse(self, prompt: str) -> tuple[str, str]:
        """(bits, anchors) of a prompt; ValueError naming what is wrong."""
        body = prompt[:-1]
        if not prompt.endswith("=") or not body:
            raise ValueError(f"parity prompt must end with `=` after at least one bit, got {prompt!r}")
        if self.format != "mnemonic":
            if any(c not in BITS for c in body):
                raise ValueError(f"parity prompt must be bits followed by `=`, got {prompt!r}")
            if self.width is not None and len(body) != self.width:
                raise ValueError(f"padded parity prompt must hold exactly {self.width} bits, got {prompt!r}")
            return body, ""
        marks, bits = body[0::2], body[1::2]
        if len(body) % 2 or any(c not in BITS for c in bits) or any(c not in self.anchor_symbols for c in marks):
            raise ValueError(f"mnemonic parity prompt must be (anchor, bit) pairs followed by `=`, got {prompt!r}")
        if len(set(marks)) != len(marks):
            raise ValueError(f"mnemonic anchors must be distinct, got {marks!r}")
        return bits, marks

    def solve(self, prompt: str) -> str:
        bits, marks = self._parse(prompt)
        acc, steps = 0, []
        for k, c in enumerate(bits):  # independent of the generator: a loop, not `running`
            acc = 1 - acc if c == "1" else acc
            replayed = {"interleaved": c, "interleaved-ab": "b" if c == "1" else "a"}.get(self.format, "")
            steps.append((marks[k] if marks else replayed) + str(acc))
        return str(acc) if self.format == "plain" else "".join(steps)

    def legal_swaps(self, prompt: str, pos: int) -> str:
        c = prompt[pos]
        if c in BITS:
            return BITS.replace(c, "")
        if self.format == "mnemonic" and c in self.anchor_symbols:
            return self.anchor_symbols.replace(c, "")
        return ""


TASK = Parity
PRESETS = {"id": {"length": (1, 10)}, "ood": {"length": (11, 50)}}
