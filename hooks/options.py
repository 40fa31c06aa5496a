"""The less common keyword options of the readers and edits, grouped in small frozen dataclasses.

The common call shapes stay plain arguments (`hooks.reinforce(heads, mask, 2.0, delta=1)`,
`hooks.head_scores(model, tokens, mask, "row", attention_mask)`); what is set less often travels in one object,
`options=hooks.ReinforceOptions(renormalize=True)`, or as a keyword of the same name, `renormalize=True` (typed by the
matching `...Settings`; the keywords win over the object's fields, an unknown one is a TypeError naming it). Every
field defaults to the behaviour without it, and each function checks the values it reads. The options compare by
identity (`eq=False`): the tensors they may hold have no truth value.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal, Mapping, Sequence, TypedDict, TypeVar

from jaxtyping import Bool
from torch import Tensor

from ._validate import check_flag

Index = slice | Sequence[int] | Tensor | None  # positions kept: a slice, indices, or None for all
SteerMode = Literal["exclude", "include"]  # where PASTA's log alpha goes: outside the references, or on them
Reduce = Literal["sum", "row"]  # a head score summed over target rows and batch, or the mean per target row


class _Options:
    """What every options class checks on construction: a field typed `bool` holds True or False (a TypeError naming
    it otherwise: a truthy "no" would switch it on)."""

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            if f.type in ("bool", bool):
                check_flag(f.name, getattr(self, f.name))


@dataclass(frozen=True, eq=False, kw_only=True)
class CaptureOptions(_Options):
    """The rows and columns of each captured pattern that `capture` keeps.

    Shapes:
        rows, cols: a slice, a sequence of positions or a 1-d tensor of them; None keeps every position.

    Example:
        >>> crop = hooks.CaptureOptions(rows=slice(4, 7), cols=[1, 2, 3])
        >>> tuple(hooks.capture(model, tokens, [(1, 0)], options=crop)[(1, 0)].shape)
        (1, 3, 3)
        >>> tuple(hooks.capture(model, tokens, [(1, 0)], rows=slice(4, 7))[(1, 0)].shape)  # rows alone, as a keyword
        (1, 3, 8)
    """

    rows: Index = None  # query positions kept (the pattern's rows)
    cols: Index = None  # key positions kept (the pattern's columns)


@dataclass(frozen=True, eq=False, kw_only=True)
class ScoreOptions(_Options):
    """How a reader (`head_scores`, `head_row_scores`, `rollout_scores`) divides and chunks.

    Shapes:
        columns: bool [batch, pos] or None.

    Example:
        >>> cols = torch.ones(1, 8, dtype=torch.bool)
        >>> cols[0, 0] = False  # the `sample` convention leaves the first (BOS) column out of the denominator
        >>> s = hooks.head_scores(model, tokens, mask, "row", options=hooks.ScoreOptions(columns=cols, batch_size=1))
        >>> bool((s >= hooks.head_scores(model, tokens, mask, "row")).all())
        True
    """

    columns: Bool[Tensor, "batch pos"] | None = None  # the AttnScore denominator's columns (None: the whole row)
    batch_size: int | None = None  # samples per forward (None: chosen to bound the pattern-sized temporaries)


@dataclass(frozen=True, eq=False, kw_only=True)
class OffsetOptions(ScoreOptions):
    """`ScoreOptions` of `offset_scores`, plus how the per-row masses are reduced.

    Shapes:
        columns: bool [batch, pos] or None.

    Example:
        >>> total = hooks.offset_scores(model, tokens, mask, [0], options=hooks.OffsetOptions(reduce="sum"))
        >>> mean = hooks.offset_scores(model, tokens, mask, [0])
        >>> bool(torch.allclose(total / 3, mean))  # three target rows
        True
    """

    reduce: Reduce = "row"  # "row": mean fraction per target row; "sum": summed over target rows and batch


@dataclass(frozen=True, eq=False, kw_only=True)
class EditOptions(_Options):
    """Failure gates of an attention edit (`patch_pattern`; the base of `ReinforceOptions` and `SteerOptions`).

    Shapes:
        rows: bool [batch, pos] (or [pos] for every batch element) or None.

    Example:
        >>> gated = hooks.EditOptions(rows=hooks.rows_beyond(tokens, 6))  # rows 6 and 7 only
        >>> fwd = hooks.patch_pattern([(1, 0)], mask, options=gated)
        >>> A = hooks.capture(model, tokens, [(1, 0)], fwd_hooks=fwd)[(1, 0)]
        >>> round(float(A[0, 6, 1]), 4), bool(A[0, 5, 2] < 1)  # row 6 is patched, row 5 is not
        (1.0, True)
    """

    rows: Bool[Tensor, "batch pos"] | None = None  # the rows the edit may touch, e.g. `rows_beyond` (None: all)
    gate_below: float | None = None  # edit a head's row only where its own attention on the references is below this


@dataclass(frozen=True, eq=False, kw_only=True)
class ReinforceOptions(EditOptions):
    """`EditOptions` of `reinforce`, plus its threshold and renormalisation (Spiegel et al. 2025, Appendix F).

    Shapes:
        rows: bool [batch, pos] (or [pos]) or None.

    Example:
        >>> fwd = hooks.reinforce([(1, 0)], mask, 0.3, options=hooks.ReinforceOptions(renormalize=True))
        >>> A = hooks.capture(model, tokens, [(1, 0)], fwd_hooks=fwd)[(1, 0)]
        >>> bool(torch.allclose(A[0, 5].sum(), torch.tensor(1.0)))  # the edited row sums to 1 again
        True
    """

    threshold: float | None = None  # add the strength only where the attention is above this (None: everywhere)
    renormalize: bool = False  # divide each edited row by its new sum


@dataclass(frozen=True, eq=False, kw_only=True)
class SteerOptions(EditOptions):
    """`EditOptions` of `steer`, plus PASTA's mode (Zhang et al. 2023).

    Shapes:
        rows: bool [batch, pos] (or [pos]) or None.

    Example:
        >>> fwd = hooks.steer([(1, 0)], mask, alpha=0.01, options=hooks.SteerOptions(mode="include"))
        >>> A = hooks.capture(model, tokens, [(1, 0)], fwd_hooks=fwd)[(1, 0)]
        >>> bool(A[0, 5, 2] > 0.9)  # the same effect as "exclude", reached from the other side
        True
    """

    mode: SteerMode = "exclude"  # "exclude": log alpha outside the references; "include": -log alpha on them


class CaptureSettings(TypedDict, total=False):
    """`CaptureOptions`' fields as keywords of `capture`."""

    rows: Index
    cols: Index


class ScoreSettings(TypedDict, total=False):
    """`ScoreOptions`' fields as keywords of `head_scores`, `head_row_scores` and `rollout_scores`."""

    columns: Bool[Tensor, "batch pos"] | None
    batch_size: int | None


class OffsetSettings(ScoreSettings, total=False):
    """`OffsetOptions`' fields as keywords of `offset_scores`."""

    reduce: Reduce


class EditSettings(TypedDict, total=False):
    """`EditOptions`' fields as keywords of `patch_pattern`."""

    rows: Bool[Tensor, "batch pos"] | None
    gate_below: float | None


class ReinforceSettings(EditSettings, total=False):
    """`ReinforceOptions`' fields as keywords of `reinforce`."""

    threshold: float | None
    renormalize: bool


class SteerSettings(EditSettings, total=False):
    """`SteerOptions`' fields as keywords of `steer`."""

    mode: SteerMode


# Each options class with the TypedDict of its keywords (a test keeps their fields equal).
SETTINGS = {CaptureOptions: CaptureSettings, ScoreOptions: ScoreSettings, OffsetOptions: OffsetSettings,
            EditOptions: EditSettings, ReinforceOptions: ReinforceSettings, SteerOptions: SteerSettings}

O = TypeVar("O")


def merge(options: O | None, settings: Mapping[str, object], kind: type[O], where: str) -> O:
    """`options` (None: `kind()`) with the keywords `settings` over it: a ValueError for options of another kind,
    a TypeError naming an unknown keyword as Python names one (`where`: the function's name)."""
    if options is not None and type(options) is not kind:  # exactly: another edit's options would be ignored in part
        raise ValueError(f"options must be a hooks.{kind.__name__}, got {type(options).__name__}")
    known = {f.name for f in fields(kind)}
    for key in settings:
        if key not in known:
            raise TypeError(f"{where}() got an unexpected keyword argument {key!r} (known: {', '.join(sorted(known))})")
    return replace(options if options is not None else kind(), **settings)
