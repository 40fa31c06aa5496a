"""Which heads a failure anatomy follows, at which key offset, and the one forward that reads every head's rows.

Without `heads`, the heads are the ranking's (Spiegel et al. 2025, Appendix F, with the offset scan): every head is
scored on ID samples of the task on references shifted by each offset in `deltas`; the offset whose `top` best
heads put the most attention there wins (the one nearest 0 on a tie), and those heads are selected at it. Trained
models often read a neighbour of each reference (`ref+1`, `ref+2`) that an earlier layer filled with its token.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Sequence, TypedDict

import pandas as pd
import torch
from torch import Tensor

import hooks

from .. import tasks
from ..batching import Batch
from ..evaluation import hooks_for
from ..experiments.ranking import rank_heads, select_heads
from ..options import CONVENTIONS, Convention, check_option
from ..tasks.base import Task

Head = tuple[int, int]


@dataclass(frozen=True)
class ExplainOptions:
    """How `explain` (and `explain_lengths`) read a model's heads; each field is also a keyword of theirs."""

    delta: int | None = None  # key offset of the references the heads are read on (None: the ranking's, else 0)
    top: int = 2  # how many heads the ranking selects when `heads` is not given
    rank_samples: int = 64  # ID samples of the task the ranking scores (its ID preset)
    rank_seed: int = 1  # their seed
    deltas: tuple[int, ...] = (-1, 0, 1, 2, 3)  # offsets the ranking scans when `delta` is None
    convention: Convention = "raw"  # mass over the whole row ("raw") or over the sample's own columns ("sample")

    def check(self) -> None:
        """ValueError naming the field of an impossible setting."""
        check_option("convention", self.convention, CONVENTIONS)
        for name in ("top", "rank_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.delta is not None and (isinstance(self.delta, bool) or not isinstance(self.delta, numbers.Integral)):
            raise ValueError(f"delta must be an integer key offset or None, got {self.delta!r}")
        if not self.deltas:
            raise ValueError("deltas is empty: give the offsets the ranking scans")


class ExplainSettings(TypedDict, total=False):
    """`ExplainOptions`' fields as typed keywords of `explain` (a test keeps the two lists equal)."""

    delta: int | None
    top: int
    rank_samples: int
    rank_seed: int
    deltas: tuple[int, ...]
    convention: Convention


def merge_options(cls: type, options: Any, settings: Mapping[str, Any], where: str) -> Any:
    """`options` (default `cls()`) with the keywords `settings` over it, checked; TypeError naming an unknown
    keyword, as Python names one."""
    known = {f.name for f in fields(cls)}
    for key in settings:
        if key not in known:
            raise TypeError(f"{where}() got an unexpected keyword argument {key!r} (known: {', '.join(sorted(known))})")
    out = replace(options or cls(), **settings)
    out.check()
    return out


def id_task(name: str, params: Mapping[str, Any]) -> Task:
    """The ID preset of task `name`, keeping the parameters of `params` (a sample's or a task's) that the ID and OOD
    presets share (charset, format, ...): the training distribution of a model that solves samples of `params`."""
    if name not in tasks.NAMES:
        raise ValueError(f"the samples name no task of aspan ({name!r}): pass heads= to say which heads to follow")
    presets = tasks.presets(name)
    differ = {k for k in set(presets["id"]) | set(presets["ood"]) if presets["id"].get(k) != presets["ood"].get(k)}
    return tasks.preset(name, "id", **{k: v for k, v in params.items() if k not in differ})


def from_ranking(ranking: pd.DataFrame, top: int, delta: int | None) -> tuple[list[Head], int]:
    """(heads, offset) a ranking (`rank_heads`' table) selects: the `top` heads at `delta`, or with None at the offset
    whose top heads have the most mean attention per row there (the one nearest 0, then the smaller, on a tie)."""
    scanned = sorted(int(c.removeprefix("score_row_d")) for c in ranking.columns if c.startswith("score_row_d"))
    if delta is None:
        means = {d: float(ranking[f"score_row_d{d}"].nlargest(top).mean()) for d in scanned}
        delta = min(scanned, key=lambda d: (-round(means[d], 12), abs(d), d))
    elif delta not in scanned:
        raise ValueError(f"the ranking scanned offsets {scanned}, not {delta}: rank with deltas including {delta}")
    return select_heads(ranking, top=top, by=f"score_row_d{delta}"), int(delta)


def choose(model, tokenizer, task: tuple[str, Mapping[str, Any]], heads: Any,
           options: ExplainOptions) -> tuple[list[Head], int, str]:
    """(heads, offset, how they were chosen) for `task` = (name, params): `heads` as given (offset `options.delta`,
    default 0), from a ranking table, or with None ranked on the task's ID preset."""
    if isinstance(heads, pd.DataFrame):
        sel, delta = from_ranking(heads, options.top, options.delta)
        return sel, delta, f"the top {options.top} of the given ranking at {_ref(delta)}"
    if heads is not None:
        sel = hooks.check_heads(heads, model.cfg.n_layers, model.cfg.n_heads)
        return sel, int(options.delta or 0), "given"
    samples = id_task(*task).generate(options.rank_samples, seed=options.rank_seed)
    deltas = [options.delta] if options.delta is not None else list(options.deltas)
    ranking = rank_heads(model, tokenizer, samples, deltas=deltas, convention=options.convention)
    sel, delta = from_ranking(ranking, options.top, options.delta)
    return sel, delta, (f"the top {options.top} by the ranking on {options.rank_samples} ID samples "
                        f"(seed {options.rank_seed}) at {_ref(delta)}")


def _ref(delta: int) -> str:
    return f"ref{delta:+d}" if delta else "ref"


@dataclass(frozen=True)
class NamedEdit:
    """Hooks with a name: a hook list or a function of the batch (as `evaluate` takes them) and the label the
    anatomy's tables and sentences call the edit by (`explain(..., fwd_hooks=NamedEdit(edit, "reinforce C=4"))`)."""

    fwd_hooks: Any
    label: str

    def batch_hooks(self, batch: Batch, model=None) -> list:
        """The hook list for `batch`."""
        return hooks_for(self.fwd_hooks, batch)


def edit_hooks(fwd_hooks: Any, batch: Batch, model) -> tuple[list, str]:
    """(hook list, label) of an edit: an `aspan.experiments.edit.Edit` or a `NamedEdit` (its label), a hook list, or
    a function of the batch (as `evaluate` takes them)."""
    if hasattr(fwd_hooks, "batch_hooks") and hasattr(fwd_hooks, "label"):
        return list(fwd_hooks.batch_hooks(batch, model)), str(fwd_hooks.label)
    return hooks_for(fwd_hooks, batch), "the edit"


@dataclass
class Read:
    """What one forward read: logits [batch, pos, vocab], each head's row readout (`hooks.row_readout`, [batch, q]
    tensors) and the captured patterns [batch, pos, pos] of the heads asked for."""

    logits: Tensor
    rows: dict[Head, dict[str, Tensor]]
    patterns: dict[Head, Tensor]


@torch.no_grad()
def read(model, batch: Batch, user: list, heads: Sequence[Head] | None, delta: int,
         capture: tuple[Convention, Sequence[Head]] = ("raw", ())) -> Read:
    """One forward of `batch` under the hooks `user` (an edit; they run first): logits, the row readout of `heads`
    (None: every head) on the references shifted by `delta`, and the patterns of the heads in `capture`
    (= (convention of the mass, heads whose pattern is kept)). No gradients; the model runs in eval mode and its
    `training` flag is given back as it was."""
    convention, kept = capture
    store: dict = {}
    patterns: dict = {}
    every = list(range(model.cfg.n_layers)) if heads is None else list(heads)
    columns = batch.sample_columns if convention == "sample" else None
    fwd = [*user, *hooks.readout_hooks(every, store, batch.ref_mask, delta=delta, columns=columns, model=model)]
    if kept:
        fwd += hooks.capture_hooks(list(kept), patterns, model=model)
    was = model.training
    model.eval()  # no dropout; the flag is given back as it was
    try:
        with model.hooks(fwd_hooks=hooks.check_hook_points(model, fwd)):
            logits = model(batch.tokens, attention_mask=batch.attention_mask)
    finally:
        model.train(was)
    return Read(logits, {k: store[k] for k in sorted(store)}, {k: patterns[k] for k in sorted(patterns)})

