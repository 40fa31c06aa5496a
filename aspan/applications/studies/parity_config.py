"""The settings of the parity study (`aspan.applications.studies.parity`): `ParityStudyConfig`, its presets
(`quick`, `curves`) and its checks."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...options import POSITIONAL, Positional
from ...tasks.parity import FORMATS, Parity

SET_DRAWS = ("disjoint", "with_replacement")  # `ParityStudyConfig.set_draw`
PROTOCOLS = ("budget", "curves")


@dataclass
class ParityStudyConfig:
    """Settings of one parity study; every field can come from a TOML file (`--config`) or a flag."""

    formats: tuple[str, ...] = FORMATS  # parity formats compared
    # the formats whose alphabets and longest samples size every model's vocabulary and context (empty: `formats`).
    # A model's initialisation depends on both, so a run that extends another run to more seeds of fewer formats
    # names that run's formats here to train the same models; the rows' keys do not depend on it
    model_formats: tuple[str, ...] = ()
    train_length: int = 8  # training inputs have 1..train_length bits
    multiples: tuple[int, ...] = (1, 2, 5, 10)  # test inputs have exactly multiple * train_length bits
    select_multiple: int = 2  # the selection set's length, as a multiple of train_length
    seeds: int = 3  # training seeds per format (>= 3 for a mean ± sd)
    lrs: tuple[float, ...] = (1e-3, 3e-3)  # learning-rate grid, chosen per format on the selection set
    # a format's own grid, by format, in place of `lrs` (e.g. one rate each, chosen by an earlier run): {} none
    format_lrs: dict = field(default_factory=dict)
    steps: int = 800  # optimiser steps per run (the same for every format)
    batch_size: int = 32  # samples per step
    warmup: int = 50  # linear warm-up steps
    n_layers: int = 2  # model depth
    n_heads: int = 4  # attention heads per layer
    d_model: int = 64  # residual width
    positional: Positional = "rotary"  # positional encoding of the models (models.tiny's `positional`)
    anchors: int = 100  # mnemonic anchor symbols (>= the longest test input)
    # share of the inputs of 1..train_length bits held out of training (aspan.tasks.split, by a hash of the bits):
    # the held-out sets at the training lengths (selection 1x, test 1x, the fit curve set) draw only from them, so no
    # held-out ID input is a training input; 0: no split (training then covers every short input)
    held_out_share: float = 0.2
    # how the held-out sets are drawn. "disjoint": every set without repeats (by the input bits), and the selection,
    # test and curve sets pairwise disjoint at every length: at the training lengths each draws from its own third
    # of the held-out inputs (selection, curve, test, by the same hash of the bits: `ID_PARTS`), at longer lengths
    # each excludes the inputs of the sets drawn before it (selection, tests, curves, in that order); a set whose
    # pool holds fewer inputs than asked is that whole pool, and its rows record the n it has (10 bits at share 0.2:
    # about 68 inputs per third, so n_test 200 gives about 68 at 1x). "with_replacement": the former independent
    # draws, which repeat and overlap where the pool is small; rows written before this setting existed carry no
    # such key and were drawn so
    set_draw: str = "disjoint"
    n_select: int = 100  # selection samples per selection length
    n_test: int = 200  # held-out test samples per test length
    eval_batch_size: int = 50  # samples per evaluation forward
    device: str = "cpu"  # "cpu", "cuda" or "auto"
    threads: int = 1  # torch CPU threads
    # protocol "budget": every run trains `steps` steps; "curves": every run trains until its learning curve on
    # held-out training-length inputs (1..train_length bits, `n_curve` samples) reaches `fit_exact` exact (the target
    # stop rule), scored every `curve_every` steps, or `cap` steps; a format whose runs do not all get there "did
    # not fit" and claims no accuracy beyond its training length
    protocol: str = "budget"
    cap: int = 10_000
    curve_every: int = 200
    n_curve: int = 200
    fit_exact: float = 0.99

    @classmethod
    def quick(cls, **kw: Any) -> "ParityStudyConfig":
        """Tiny settings that finish in well under a minute (for the tests), same code path: half of the 30 inputs
        of 1-4 bits held out, so each held-out third has a few (3 or 4 of exactly 4 bits)."""
        base = dict(train_length=4, seeds=2, lrs=(1e-3, 3e-3), steps=8, warmup=2, n_layers=1, n_heads=2, d_model=16,
                    anchors=40, held_out_share=0.5, n_select=8, n_test=8, eval_batch_size=16)
        return cls(**{**base, **kw})

    @classmethod
    def curves(cls, quick: bool = False, **kw: Any) -> "ParityStudyConfig":
        """The curves protocol's defaults (`--protocol curves`): inputs of up to 20 bits, tested at 1x, 2x and 5x
        (100 bits: within the mnemonic anchors), a 3-point grid; with `quick`, the tiny settings of the tests."""
        if quick:
            return cls.quick(**{"protocol": "curves", "cap": 12, "curve_every": 4, "n_curve": 8, "fit_exact": 0.99,
                                **kw})
        base = dict(protocol="curves", train_length=20, multiples=(1, 2, 5), lrs=(3e-4, 1e-3, 3e-3))
        return cls(**{**base, **kw})

    def check(self) -> None:
        """ValueError on impossible settings, before any work."""
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        for name in ("cap", "curve_every", "n_curve"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.fit_exact <= 1:
            raise ValueError(f"fit_exact must be in (0, 1], got {self.fit_exact}")
        if not self.formats or any(f not in FORMATS for f in self.formats):
            raise ValueError(f"formats must be a non-empty subset of {', '.join(FORMATS)}, got {self.formats}")
        if len(set(self.formats)) != len(self.formats):
            raise ValueError(f"formats repeat: {self.formats}")
        if self.model_formats and (any(f not in FORMATS for f in self.model_formats)
                                   or not set(self.formats) <= set(self.model_formats)):
            raise ValueError(f"model_formats must be formats of {', '.join(FORMATS)} that include every format "
                             f"studied ({', '.join(self.formats)}), got {self.model_formats}")
        for name in ("train_length", "seeds", "steps", "batch_size", "n_layers", "n_heads", "d_model", "n_select",
                     "n_test", "eval_batch_size", "threads", "select_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if not 0 <= self.held_out_share < 1:
            raise ValueError(f"held_out_share must be in [0, 1), got {self.held_out_share}")
        if self.set_draw not in SET_DRAWS:
            raise ValueError(f"set_draw must be one of {', '.join(SET_DRAWS)}, got {self.set_draw!r}")
        if not self.multiples or any(m < 1 for m in self.multiples) or 1 not in self.multiples:
            raise ValueError(f"multiples must be positive and include 1 (the training length), got {self.multiples}")
        if not self.lrs or any(not 0 < lr < math.inf for lr in self.lrs):
            raise ValueError(f"lrs must be finite and positive, got {self.lrs}")
        for fmt, grid in self.format_lrs.items():
            if fmt not in self.formats:
                raise ValueError(f"format_lrs: {fmt!r} is not one of the formats {list(self.formats)}")
            if not isinstance(grid, (list, tuple)) or not grid or any(
                    isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf for lr in grid):
                raise ValueError(f"format_lrs.{fmt} must be a non-empty list of finite positive rates, got {grid!r}")
        if self.positional not in POSITIONAL:
            raise ValueError(f"positional must be one of {', '.join(POSITIONAL)}, got {self.positional!r}")
        if "mnemonic" in self.formats:
            Parity(length=self.longest, format="mnemonic", anchors=self.anchors)  # enough anchors for 10x

    @classmethod
    def toml_fields(cls, raw: dict[str, Any], path: Any = None) -> dict[str, Any]:
        """The settings of a parsed config file (`aspan.config.load_config`'s hook): its `[parity]` table, or the
        whole file less a `[slurm]` table (the resources of `--launcher slurm`, `aspan.applications.launch`)."""
        return raw.get("parity", {k: v for k, v in raw.items() if k != "slurm"})

    def grid(self, fmt: str) -> tuple[float, ...]:
        """The learning-rate grid of format `fmt`: its own (`format_lrs`), else `lrs`."""
        return tuple(self.format_lrs.get(fmt, self.lrs))

    @property
    def sizing_formats(self) -> tuple[str, ...]:
        """The formats that size the models' vocabulary and context: `model_formats`, or else `formats`."""
        return self.model_formats or self.formats

    @property
    def longest(self) -> int:
        """The longest evaluated length: the largest multiple of the training length."""
        return max(max(self.multiples), self.select_multiple) * self.train_length
