"""Sample and Task: the contract every task follows (Spiegel et al. 2025, §3.1: reference attention masks).

A `Sample` is character-level text (prompt + target) with, for every target character, the sparse set of
text positions the model must read to produce it. A `Task` is a seeded, infinite generator of samples with an
independent solver.

Some formats interleave input into the target (Ebrahimi et al. 2024, §3: the interleaved scratchpad): those
target characters are `given`, supplied like the prompt rather than predicted. They carry no loss, are not scored,
are forced during generation, and their reference sets are empty.
"""
from __future__ import annotations

import json
import numbers
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

if TYPE_CHECKING:  # torch is imported lazily so that `aspan data` and the task generators start fast
    from jaxtyping import Bool
    from torch import Tensor

# Characters the tasks use as structure; a user charset may not contain them.
SEPARATORS = frozenset("=+*:,")


@dataclass(frozen=True)
class Sample:
    """One task instance: `text[:prompt_len]` is the prompt, `text[prompt_len:]` the target.

    `references[j]` holds the positions in `text` (all `< prompt_len + j`) needed to produce target char `j`.
    `given` lists the target indices that are input interleaved into the target (never predicted; empty refs).
    """

    text: str
    prompt_len: int
    references: tuple[tuple[int, ...], ...]
    task: str = ""
    params: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    given: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        n_target = len(self.text) - self.prompt_len
        if not 0 < self.prompt_len <= len(self.text):
            raise ValueError(f"prompt_len={self.prompt_len} out of range for text of length {len(self.text)}")
        if len(self.references) != n_target:
            raise ValueError(f"references has {len(self.references)} entries, target has {n_target} characters")
        for j, refs in enumerate(self.references):
            for p in refs:
                if not 0 <= p < self.prompt_len + j:
                    raise ValueError(
                        f"reference {p} of target char {j} is not < prompt_len + j = {self.prompt_len + j}"
                    )
        if list(self.given) != sorted(set(self.given)) or any(not 0 <= j < n_target for j in self.given):
            raise ValueError(f"given must be sorted, unique target indices < {n_target}, got {self.given}")
        if any(self.references[j] for j in self.given):
            raise ValueError("a given target character is supplied, not predicted: its references must be empty")

    @property
    def prompt(self) -> str:
        """The text before the target: the first `prompt_len` characters of `text`."""
        return self.text[: self.prompt_len]

    @property
    def target(self) -> str:
        """The text the model must produce: `text` after its first `prompt_len` characters."""
        return self.text[self.prompt_len :]

    def query_row(self, j: int, offset: int = 1) -> int:
        """Query position that predicts target char `j` when `offset` tokens precede the text."""
        return offset + self.prompt_len + j - 1

    def mask(self, offset: int = 1, size: int | None = None) -> Bool[Tensor, "pos pos"]:
        """Dense reference mask, `[T+offset, T+offset]` (or `[size, size]`); row = query, col = key position."""
        import torch

        n = len(self.text) + offset if size is None else size
        if n < len(self.text) + offset:
            raise ValueError(f"size={size} is smaller than text length + offset = {len(self.text) + offset}")
        m = torch.zeros(n, n, dtype=torch.bool)
        rows, cols = self.ref_pairs(offset)
        if rows:
            m[torch.tensor(rows), torch.tensor(cols)] = True
        return m

    def ref_pairs(self, offset: int = 1) -> tuple[list[int], list[int]]:
        """(query rows, key cols) of every reference, shifted by `offset`: the sparse form of `mask`."""
        rows, cols = [], []
        for j, refs in enumerate(self.references):
            q = self.query_row(j, offset)
            for p in refs:
                rows.append(q)
                cols.append(p + offset)
        return rows, cols

    def to_dict(self) -> dict[str, Any]:
        """The sample as JSON-ready data (one line of an `aspan data` file)."""
        d = {
            "task": self.task,
            "text": self.text,
            "prompt_len": self.prompt_len,
            "references": [list(r) for r in self.references],
            "params": self.params,
        }
        if self.given:  # only formats with interleaved input carry the key (other tasks' JSONL is unchanged)
            d["given"] = list(self.given)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> "Sample":
        """The sample of a `to_dict()` dict, every field checked for its type (nothing is rounded or coerced: a
        `prompt_len` of 4.7 or a reference `true` is refused); ValueError starting "field 'NAME': "."""
        if not isinstance(d, dict):
            raise ValueError(f"a sample is a JSON object, got a {type(d).__name__}")
        unknown = sorted(set(d) - set(FIELDS))
        if unknown:
            raise ValueError(f"field {unknown[0]!r}: not a sample field (fields: {', '.join(FIELDS)})")
        missing = [k for k in ("text", "prompt_len", "references") if k not in d]
        if missing:
            raise ValueError(f"field {missing[0]!r}: missing")
        for name in FIELDS:
            if name in d and not FIELDS[name][0](d[name]):
                raise ValueError(f"field {name!r}: must be {FIELDS[name][1]}, got {_short(d[name])}")
        try:
            return cls(text=d["text"], prompt_len=d["prompt_len"], references=tuple(map(tuple, d["references"])),
                       task=d.get("task", ""), params=d.get("params", {}), given=tuple(d.get("given", ())))
        except ValueError as e:
            raise ValueError(f"field {_field_of(str(e))!r}: {e}") from None

    def to_json(self) -> str:
        """The sample as one line of JSON, keys sorted."""
        return json.dumps(self.to_dict(), sort_keys=True)


def _index(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _indices(v: Any) -> bool:
    return isinstance(v, list) and all(map(_index, v))


# The fields of a sample's JSON form: (type check, what it must be).
FIELDS: dict[str, tuple[Any, str]] = {
    "task": (lambda v: isinstance(v, str), "a task name"),
    "text": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "prompt_len": (_index, "an integer"),
    "references": (lambda v: isinstance(v, list) and all(map(_indices, v)), "a list of lists of integer positions"),
    "params": (lambda v: isinstance(v, dict), "an object of task parameters"),
    "given": (_indices, "a list of integer target indices"),
}


def _short(v: Any) -> str:
    text = json.dumps(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _field_of(message: str) -> str:
    """The field a `Sample` consistency error is about (its messages start with or name it)."""
    return next((f for f in ("prompt_len", "given", "references") if f in message), "references")


def _whole(v: Any) -> bool:
    """An int, or a float with no fractional part (JSON and TOML may write 3 as 3.0); never a bool."""
    return not isinstance(v, bool) and (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))


def check_seed(seed: Any) -> int:
    """`seed` as an int >= 0; ValueError otherwise. `random.Random` seeds with `abs(seed)`, so -1 would silently
    draw the samples of seed 1, and a float or string seed would be hashed into some unrelated stream."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    return int(seed)


def check_range(name: str, value: tuple[int, int] | int, minimum: int = 0) -> tuple[int, int]:
    """Normalise an int or (lo, hi) inclusive range; ValueError naming `name` if impossible.

    Only whole numbers are accepted (`3` or `3.0`): `(1.5, 3)` is refused, not truncated to `(1, 3)`.
    """
    if _whole(value):
        value = (value, value)
    pair = not isinstance(value, (str, bytes)) and hasattr(value, "__len__") and len(value) == 2
    if not pair or not all(map(_whole, value)):
        raise ValueError(f"{name} must be an int or a (min, max) pair of ints, got {value!r}")
    lo, hi = (int(v) for v in value)
    if lo < minimum:
        raise ValueError(f"{name}: minimum {lo} is below {minimum}")
    if hi < lo:
        raise ValueError(f"{name}: range ({lo}, {hi}) is reversed")
    return lo, hi


class Task:
    """Base class: subclasses set `name`, define `__init__(**params)`, `_sample(rng)`, `solve`, `alphabet`.

    `generate(n, seed)` is deterministic across Python versions and hash seeds: one `random.Random(seed)`
    drives every choice, and no code iterates over sets.
    """

    name: ClassVar[str] = ""
    # True when the prompt does not fix the target length (successor): EOS is then not scored and generated
    # output is compared on the target's length (`Task.solve_like`).
    open_ended: ClassVar[bool] = False
    # What a pretrained model is told before the few-shot examples (`aspan pretrained`): what to do, in words.
    instruction: ClassVar[str] = ""
    # The parameter whose range sets the lengths of the samples (the ID and OOD presets differ in it), or None;
    # `length_is_target` when that range is the target's length itself (what length buckets set).
    length_param: ClassVar[str | None] = None
    length_is_target: ClassVar[bool] = False
    # Overrides of the OOD preset for `aspan demo` (near OOD, where the failure and its repair are measurable) and
    # for `aspan demo --quick`.
    demo_ood: ClassVar[dict[str, Any]] = {}
    quick_ood: ClassVar[dict[str, Any]] = {}

    def params(self) -> dict[str, Any]:
        """The parameters that reproduce this task (JSON-serialisable)."""
        raise NotImplementedError

    @property
    def alphabet(self) -> str:
        """Every character a sample of this task can contain (sorted, no duplicates)."""
        raise NotImplementedError

    def max_text_len(self) -> int:
        """Length of the longest text this task can generate (for context checks)."""
        raise NotImplementedError

    def _sample(self, rng: random.Random) -> Sample:
        raise NotImplementedError

    def solve(self, prompt: str) -> str:
        """The target for `prompt`; ValueError on an invalid prompt."""
        raise NotImplementedError

    def legal_swaps(self, prompt: str, pos: int) -> str:
        """Characters that may replace `prompt[pos]` under the sufficiency perturbation rule (a digit for a digit, a bit
        for a bit, a symbol for a symbol), the current one excluded; "" for structure (separators, ops).

        The result may still make the prompt invalid (`solve` then raises ValueError): callers skip those.
        """
        raise NotImplementedError

    def solve_like(self, prompt: str, target: str) -> str:
        """`solve(prompt)`, for tasks whose prompt fixes the target length; successor overrides it."""
        return self.solve(prompt)

    def rebuild(self, prompt: str, target: str) -> Sample:
        """The sample of this task with `prompt` and `target`, its references (and given characters) built by the
        task's own rule; ValueError on an invalid prompt or a target the solver disagrees with (`solve_like`).

        A sample read from a file is trusted only when it equals `rebuild(sample.prompt, sample.target)`."""
        want = self.solve_like(prompt, target)
        if target != want:
            raise ValueError(f"target {target!r} is not the {self.name} solver's {want!r} for prompt {prompt!r}")
        return self._build(prompt, target)

    def _build(self, prompt: str, target: str) -> Sample:
        """The sample with this (valid) prompt and target and the task's references: the one reference builder,
        used by `_sample` and `rebuild`."""
        raise NotImplementedError

    def realised(self, prompt: str, target: str) -> dict[str, list[int]]:
        """For each (min, max) range parameter, the values a sample with this valid prompt and target has (its
        string's length, each operand's digits...): `admits` refuses a sample whose values its task's ranges do not
        hold. {} where a task says nothing."""
        return {}

    def admits(self, prompt: str, target: str) -> None:
        """ValueError naming the parameter unless this task, as parameterised, can generate a sample with this
        valid prompt and target (`realised` inside each range)."""
        for name, values in self.realised(prompt, target).items():
            lo, hi = getattr(self, name)
            bad = next((v for v in values if not lo <= v <= hi), None)
            if bad is not None:
                raise ValueError(f"{name} is {lo}-{hi} in the sample's params, but its text has {name} {bad}")

    def stream(self, seed: int = 0) -> Iterator[Sample]:
        """Infinite deterministic stream of samples; `seed` an int >= 0 (checked when called, not when iterated)."""
        return self._stream(random.Random(check_seed(seed)))

    def _stream(self, rng: random.Random) -> Iterator[Sample]:
        while True:
            yield self._sample(rng)

    def generate(self, n: int, seed: int = 0) -> list[Sample]:
        """`n` samples of seed `seed` (the first `n` of `stream(seed)`); ValueError unless `n` is an int >= 0."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        it = self.stream(seed)
        return [next(it) for _ in range(n)]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"
