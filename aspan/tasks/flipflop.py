"""Flip-flop language modelling with several registers and a flip command: `w11i10f10r10f11r1` -> `1`.

Spiegel et al. 2025, Appendix A.5 (after Liu et al. 2023, "Exposing attention glitches with flip-flop language
modeling").

Instructions are op + register digit + bit: `w` write, `r` read (bit = current value), `i` ignore and `f` flip
(noise bits). The first non-ignore instruction on a register is a write. The prompt ends with a bit-less read
(`instructions` counts the instructions before it: the paper's "commands" include the read);
the target is that register's value, referencing the bit of its last write or read and the op and register
characters of every later flip of it.
"""
from __future__ import annotations

import random
from typing import Any

from .base import Sample, Task, check_range

OPS_ALL = "wrif"
BITS = "01"


class FlipFlop(Task):
    """Flip-flop language: write, read, ignore and flip instructions on registers; the target is the bit the last read
    returns."""
    name = "flipflop"
    instruction = ("Instructions are an operation (w write, r read, i ignore, f flip), a register and a bit. "
                   "Give the bit the last read returns.")
    length_param = "instructions"

    def __init__(self, instructions: tuple[int, int] | int = (9, 9), registers: int = 2, flips: bool = True):
        self.instructions = check_range("instructions", instructions, minimum=1)
        if isinstance(registers, bool) or not isinstance(registers, int) or not 1 <= registers <= 10:
            raise ValueError(f"registers must be an int in 1..10 (one digit each), got {registers!r}")
        if not isinstance(flips, bool):
            raise ValueError(f"flips must be a bool, got {flips!r}")
        self.registers, self.flips = registers, flips
        self.ops = OPS_ALL if flips else "wri"
        self.regs = "0123456789"[:registers]

    def params(self) -> dict[str, Any]:
        return {"instructions": list(self.instructions), "registers": self.registers, "flips": self.flips}

    @property
    def alphabet(self) -> str:
        return "".join(sorted(set(self.ops + self.regs + BITS)))

    def max_text_len(self) -> int:
        return 3 * self.instructions[1] + 3  # instructions, final `r` + register, target bit

    def _sample(self, rng: random.Random) -> Sample:
        n = rng.randint(*self.instructions)
        while True:  # rejection: at least one register must be written for the final read
            parts: list[str] = []
            value: dict[str, int] = {}
            for _ in range(n):
                reg = rng.choice(self.regs)
                op = rng.choice(self.ops if reg in value else "wi")
                if op == "w":
                    value[reg] = rng.randint(0, 1)
                    bit = value[reg]
                elif op == "r":
                    bit = value[reg]
                elif op == "f":
                    value[reg] ^= 1
                    bit = rng.randint(0, 1)
                else:
                    bit = rng.randint(0, 1)
                parts.append(f"{op}{reg}{bit}")
            written = [r for r in self.regs if r in value]
            if written:
                break
        reg = rng.choice(written)
        return self._build("".join(parts) + "r" + reg, str(value[reg]))

    def realised(self, prompt: str, target: str) -> dict[str, list[int]]:
        return {"instructions": [(len(prompt) - 2) // 3]}  # three characters each, then the final read `r` + reg

    def _build(self, prompt: str, target: str) -> Sample:
        """The read bit references the last write or read of its register and the op and register of every later
        flip of it."""
        refs: dict[str, list[int]] = {}  # register -> positions that fix its current value
        for s in range(0, len(prompt) - 2, 3):
            op, reg = prompt[s], prompt[s + 1]
            if op in "wr":
                refs[reg] = [s + 2]
            elif op == "f":
                refs[reg] += [s, s + 1]
        return Sample(prompt + target, len(prompt), (tuple(refs[prompt[-1]]),), self.name, self.params())

    def solve(self, prompt: str) -> str:
        """Simulate the registers; ValueError on a malformed prompt, a wrong read bit or a use before write."""
        if len(prompt) < 5 or (len(prompt) - 2) % 3:
            raise ValueError(f"flipflop prompt must be 3-char instructions then `r<register>`, got {prompt!r}")
        state: dict[str, str] = {}
        for k in range(0, len(prompt) - 2, 3):
            op, reg, bit = prompt[k : k + 3]
            if op not in self.ops or reg not in self.regs or bit not in BITS:
                raise ValueError(f"bad instruction {prompt[k:k + 3]!r} at position {k}")
            if op == "w":
                state[reg] = bit
            elif op in "rf" and reg not in state:
                raise ValueError(f"{op!r} on register {reg} before any write, at position {k}")
            elif op == "r" and state[reg] != bit:
                raise ValueError(f"read at position {k} says {bit} but register {reg} holds {state[reg]}")
            elif op == "f":
                state[reg] = "1" if state[reg] == "0" else "0"
        op, reg = prompt[-2:]
        if op != "r" or reg not in self.regs:
            raise ValueError(f"flipflop prompt must end with a read `r<register>`, got {prompt[-2:]!r}")
        if reg not in state:
            raise ValueError(f"final read of register {reg}, which was never written")
        return state[reg]

    def legal_swaps(self, prompt: str, pos: int) -> str:
        """Bits swap for bits; ops and register digits are structure (swapping them changes which register an
        instruction writes, so no sparse reference set of the final read could be sufficient)."""
        if pos < len(prompt) - 2 and pos % 3 == 2 and prompt[pos] in BITS:
            return BITS.replace(prompt[pos], "")
        return ""


TASK = FlipFlop
# The paper's presets (Spiegel et al. 2025, Appendix E.2) count commands as the public generator does: it draws
# the length L, emits L - 1 instructions, then the final read. So ID "10 commands" is 9 instructions + the read
# (a prompt of 29 characters) and OOD "11-100 commands" is 10-99 instructions + the read.
PRESETS = {
    "id": {"instructions": (9, 9), "registers": 2, "flips": True},
    "ood": {"instructions": (10, 99), "registers": 2, "flips": True},
}
