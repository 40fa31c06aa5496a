"""The `--train-only` vocabulary: parameter groups by name, parsed and checked without torch (the command line and
`TrainConfig.check` read it before any model loads). `aspan.param_groups` documents the groups and turns a parsed value
into masks on a model.

    parse_train_only("qk-pair:0,3,mlp")   # TrainOnly(groups=(Group('qk-pair', (0, 3)), Group('mlp', ())))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

GroupKind = Literal["qk", "qk-column", "qk-pair", "attn", "mlp", "embed", "all"]
KINDS: tuple[str, ...] = get_args(GroupKind)
INDEXED: tuple[str, ...] = ("qk-column", "qk-pair")  # groups that take indices after a colon


@dataclass(frozen=True)
class Group:
    """One parameter group: its kind and, for `qk-column`/`qk-pair`, the column or pair indices."""

    kind: GroupKind  # one of KINDS
    indices: tuple[int, ...] = ()  # columns (qk-column) or rotary pairs (qk-pair); empty for the others

    def __str__(self) -> str:
        return self.kind + (":" + ",".join(map(str, self.indices)) if self.indices else "")


@dataclass(frozen=True)
class TrainOnly:
    """A parsed `--train-only` value: the union of its groups."""

    groups: tuple[Group, ...]  # at least one

    def __str__(self) -> str:
        return ",".join(map(str, self.groups))


def parse_train_only(text: str | TrainOnly | None) -> TrainOnly | None:
    """`None` -> None (train everything); `"qk-pair:0,3,mlp"` -> TrainOnly; ValueError naming a bad item."""
    if text is None or isinstance(text, TrainOnly):
        return text
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"train_only must be a non-empty string like 'qk-pair:0,mlp', got {text!r}")
    groups: list[tuple[str, list[int]]] = []
    for item in (t.strip() for t in text.split(",")):
        kind, colon, index = item.partition(":")
        if kind.lstrip("-").isdigit() and not colon and groups and groups[-1][0] in INDEXED:
            groups[-1][1].append(_index(kind, groups[-1][0]))
            continue
        if kind not in KINDS:
            raise ValueError(f"unknown train_only group {item!r}; choose from {', '.join(KINDS)} "
                             "(qk-column:C and qk-pair:I take indices)")
        if colon and kind not in INDEXED:
            raise ValueError(f"train_only group {kind!r} takes no index, got {item!r}")
        if kind in INDEXED and colon:
            groups.append((kind, [_index(index, kind)]))
        elif kind == "qk-pair":
            raise ValueError("train_only group 'qk-pair' needs a pair index, e.g. qk-pair:0")
        else:
            groups.append((kind, [0] if kind == "qk-column" else []))
    return TrainOnly(tuple(Group(k, tuple(sorted(set(i)))) for k, i in groups))  # type: ignore[arg-type]


def _index(text: str, kind: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"train_only {kind} index must be an integer, got {text!r}") from None
    if value < 0:
        raise ValueError(f"train_only {kind} index must be >= 0, got {value}")
    return value
