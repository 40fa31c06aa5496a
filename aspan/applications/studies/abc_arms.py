"""The ABC arms of `aspan study abc` (`aspan.applications.studies.abc`): three protocol choices on which the
study's ABC and Duan & Shi's (2023, Section 5 and Algorithm 1) differ, each a setting of the retraining that follows
the same calibration of the same base model.

- layout: "natural" (the study's: numbers least significant digit first, as long as they are) or "padded" (Duan &
  Shi's: every operand zero-padded on the left to the longest test length and written most significant digit first,
  the answer least significant first, one digit longer; `tasks.get(..., layout="padded")`). The retrained model trains
  and is tested on the same numbers in that layout. The lines are the same in both: an aligned line counts a digit
  by its significance (`aspan.experiments.abc.text_coords`).
- layer: "each" (each layer's own lines on that layer, the study's) or a layer index L (-1: the last; layer L's lines
  on every layer of the fresh model, as Duan & Shi add the bias of their last decoder layer to every layer).
- positional: the retrained model's positional encoding ("none": NoPE, the study's; "learned": absolute positions,
  as the paper's sinusoidal ones).
- prompt: the prompt rows' lines ("calibrated": the base's diagonal and vertical lines, the study's; "local": the
  diagonal ones only, so that no prompt row reads a fixed position; "free": none, the prompt rows unbiased, as Duan &
  Shi leave their encoder's self-attention). In the padded layout a fixed position holds the same digit of every
  number, the padding "0" in every training number up to the longest test lengths.

An arm at the study's defaults is the plain `abc` condition (its rows keep their keys); any other is the condition
`abc[...]` naming what differs (`AbcArm.variant`)."""
from __future__ import annotations

import random
from dataclasses import dataclass, replace
from itertools import product
from typing import Any

from ...tasks.base import Sample, Task
from ...tasks.draws import build
from .abc_paper_data import padded_task

LAYOUTS = ("natural", "padded")
PROMPTS = ("calibrated", "local", "free")  # `AbcArm.prompt`
PADDED_TASKS = ("successor", "addition")  # the tasks whose numbers the padded layout writes most significant first


@dataclass(frozen=True)
class AbcArm:
    """One ABC arm: the layout the fresh model trains and is tested in, the layer the bias comes from, and the fresh
    model's positional encoding."""

    layout: str = "natural"  # "natural" or "padded" (see the module)
    layer: int | str = "each"  # "each", or the index of the base's layer whose lines go to every layer (-1: last)
    positional: str = "none"  # the fresh model's positional encoding
    prompt: str = "calibrated"  # the prompt rows' lines: "calibrated", "local" or "free" (see the module)

    def settings(self, default_positional: str) -> dict[str, Any]:
        """The arm's settings that differ from the study's ABC (`default_positional`: its `bias_positional`): what
        the arm adds to its rows' keys (none for the study's own ABC, whose rows keep their keys)."""
        out: dict[str, Any] = {}
        if self.layout != "natural":
            out["abc_layout"] = self.layout
        if self.layer != "each":
            out["abc_layer"] = self.layer
        if self.positional != default_positional:
            out["abc_positional"] = self.positional
        if self.prompt != "calibrated":
            out["abc_prompt"] = self.prompt
        return out

    def variant(self, default_positional: str) -> str:
        """The condition name of the arm's rows in the tables: "abc" for the study's own ABC, else "abc[...]" with
        what differs (e.g. "abc[padded, layer 0, learned]"; "last layer" for -1)."""
        parts = []
        if self.layout != "natural":
            parts.append(self.layout)
        if self.layer != "each":
            parts.append("last layer" if self.layer == -1 else f"layer {self.layer}")
        if self.positional != default_positional:
            parts.append(self.positional)
        if self.prompt != "calibrated":
            parts.append(f"prompt {self.prompt}")
        return "abc" + (f"[{', '.join(parts)}]" if parts else "")

    @classmethod
    def of_row(cls, row: dict, default_positional: str) -> "AbcArm":
        """The arm an ABC row of runs.jsonl was trained in (rows without arm settings: the study's own)."""
        return cls(row.get("abc_layout", "natural"), row.get("abc_layer", "each"),
                   row.get("abc_positional", default_positional), row.get("abc_prompt", "calibrated"))


def arms(layouts, layers, positionals, prompts=("calibrated",)) -> list[AbcArm]:
    """Every combination of the given layouts, layers, positional encodings and prompt lines, in that order."""
    return [AbcArm(a, b, c, d) for a, b, c, d in product(layouts, layers, positionals, prompts)]


def check_arms(layouts, layers, positionals, tasks, n_layers: int, prompts=("calibrated",)) -> None:
    """ValueError on arm settings the study cannot run, before any work."""
    if not layouts or any(x not in LAYOUTS for x in layouts):
        raise ValueError(f"abc_layouts must be a non-empty subset of {', '.join(LAYOUTS)}, got {list(layouts)}")
    if "padded" in layouts and any(t not in PADDED_TASKS for t in tasks):
        raise ValueError(f"abc_layouts 'padded' writes the numbers of {', '.join(PADDED_TASKS)} only, got tasks "
                         f"{list(tasks)}")
    for layer in layers or ("",):
        if layer != "each" and (isinstance(layer, bool) or not isinstance(layer, int)
                                or not -n_layers <= layer < n_layers):
            raise ValueError(f"abc_layers must be 'each' or layer indices of the {n_layers} layers (-1: the last), "
                             f"got {list(layers)}")
    if not positionals or any(p not in ("rotary", "learned", "alibi", "none") for p in positionals):
        raise ValueError(f"abc_positionals must be rotary, learned, alibi or none, got {list(positionals)}")
    if not prompts or any(p not in PROMPTS for p in prompts):
        raise ValueError(f"abc_prompts must be a non-empty subset of {', '.join(PROMPTS)}, got {list(prompts)}")


def layer_lines(lines: dict, layer: int | str, n_layers: int) -> dict:
    """The per-head lines the fresh model gets: `lines` as calibrated ("each"), or layer `layer`'s lines on the same
    head of every layer."""
    if layer == "each":
        return lines
    source = layer % n_layers
    return {(lyr, h): hl for lyr in range(n_layers) for (src, h), hl in lines.items() if src == source}


def prompt_lines(lines: dict, prompt: str) -> dict:
    """The per-head lines with the prompt rows' lines as `prompt` says: as calibrated, the diagonal ones only
    ("local"), or none ("free": the prompt rows unbiased)."""
    if prompt == "calibrated":
        return lines
    if prompt == "local":
        return {k: replace(hl, prompt={"diagonal": (hl.prompt or {}).get("diagonal", ())}) for k, hl in lines.items()}
    return {k: replace(hl, prompt=None) for k, hl in lines.items()}


# ----------------------------------------------------------------------------------------------- the padded layout
def numbers_of(sample: Sample) -> list[int]:
    """The operands of a natural-layout successor or addition sample (least significant digit first)."""
    return [int(p[::-1]) for p in sample.text[: sample.prompt_len - 1].replace("+", ",").split(",")]


def padded_sample(sample: Sample, width: int) -> Sample:
    """The same numbers in the padded layout of `width` digits."""
    return build(padded_task(sample.task, width), numbers_of(sample))


class PaddedDraw(Task):
    """The samples of a natural-layout task (a `LengthMix` of successor or addition) written in the padded layout:
    the same numbers, drawn the same way."""

    def __init__(self, base: Task, width: int):
        if base.name not in PADDED_TASKS:
            raise ValueError(f"the padded layout writes {', '.join(PADDED_TASKS)} samples, not {base.name}")
        self.base, self.width, self.padded = base, width, padded_task(base.name, width)
        self.name, self.open_ended = base.name, self.padded.open_ended

    def params(self) -> dict[str, Any]:
        return {**self.padded.params(), "drawn_as": self.base.params()}

    @property
    def alphabet(self) -> str:
        return self.padded.alphabet

    def max_text_len(self) -> int:
        return self.padded.max_text_len()

    def _sample(self, rng: random.Random) -> Sample:
        return padded_sample(self.base._sample(rng), self.width)

    def solve(self, prompt: str, *args: Any) -> str:
        return self.padded.solve(prompt, *args)

    def solve_like(self, prompt: str, target: str) -> str:
        return self.padded.solve_like(prompt, target)

    def legal_swaps(self, prompt: str, pos: int) -> str:
        return self.padded.legal_swaps(prompt, pos)
