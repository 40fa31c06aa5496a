"""The failure anatomy across lengths: per length, accuracy, the selected heads' attention on their references and
where their top positions lie; at which length and token each head's attention leaves the references.

    lengths = explain_lengths(model, tokenizer, tasks.preset("reversal", "ood"), range(11, 31), n=50)
    lengths.by_length          # exact, partial, mass, offset, on_ref, first errors per length
    lengths.leaves             # per head and length: the first token whose mean mass falls below the threshold
    lengths.causes             # the same in words
    lengths.figure(); lengths.leave_figure()

Every length gets `n` samples of its own (the task's length parameter set to it, as `aspan.buckets` does); they go
through the model `batch_size` at a time with the heads read inside the forward, and only running sums (and three
numbers per sample) are kept. Teacher-forced, as `explain`.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Iterable, Unpack

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import models, stopping, tasks
from ..batching import make_batch, scores_eos
from ..buckets import bucket_task
from ..checks import check_samples
from ..tasks.base import Task
from ..tokenization import Tokenizer, require_tokenizer
from .causes import MASS_ON, heads_word, ref
from .heads import ExplainOptions, ExplainSettings, choose, edit_hooks, merge_options, read
from .sample import head_name


@dataclass(frozen=True)
class LengthOptions(ExplainOptions):
    """`ExplainOptions` and how the lengths are sampled; each field is also a keyword of `explain_lengths`."""

    n: int = 50  # samples per length
    seed: int = 0  # their seed (every length draws its own samples from it)
    batch_size: int = 50  # samples per forward
    progress: bool = False  # a progress bar over the lengths
    threshold: float = MASS_ON  # a head's attention leaves its references where its mean mass falls below this
    fwd_hooks: Any = None  # an edit (as `explain` takes it): the anatomy of the edited model

    def check(self) -> None:
        """ValueError naming the field of an impossible setting."""
        super().check()
        for name in ("n", "batch_size"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int) \
                    or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold!r}")


class LengthSettings(ExplainSettings, total=False):
    """`LengthOptions`' fields as typed keywords of `explain_lengths`."""

    n: int
    seed: int
    batch_size: int
    progress: bool
    threshold: float
    fwd_hooks: Any


@dataclass
class LengthAnatomy:
    """What `explain_lengths` found (see the module docstring). Tables:

    - `by_length`: length, n, exact, partial (per-token accuracy), mass (the heads' mean mass on their references),
      offset (mean offset of their top positions from the nearest reference), on_ref (share of rows whose top
      position is at ref+delta), failing (samples with an error), first_error (median first wrong token of those).
    - `by_position`: length, j, n, accuracy of output token j, first_error (samples whose first error is j).
    - `by_token`: length, name (head), j, rows, mass, offset, on_ref (means over the samples' rows with references).
    - `leaves`: name, length, first_token (the first token whose mean mass is below the threshold; NaN: none),
      mass there."""

    by_length: pd.DataFrame
    by_position: pd.DataFrame
    by_token: pd.DataFrame
    leaves: pd.DataFrame
    selected: list
    delta: int
    how: str
    threshold: float = MASS_ON
    causes: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        """The selected heads' names."""
        return [head_name(h) for h in self.selected]

    def figure(self):
        """Accuracy, mass, share on ref+delta and mean offset per length (`viz.anatomy_length_figure`)."""
        from ..viz.anatomy import anatomy_length_figure

        return anatomy_length_figure(self.by_length, self.delta, title=f"Per length: accuracy and the attention of "
                                     f"{', '.join(self.names)} on {ref(self.delta)} (teacher-forced)")

    def leave_figure(self):
        """Length x output token per head, its mean mass on ref+delta, where it leaves marked
        (`viz.anatomy_leave_figure`)."""
        from ..viz.anatomy import anatomy_leave_figure

        return anatomy_leave_figure(self.by_token, self.leaves, self.delta, self.threshold)

    def text(self) -> str:
        """The tables and sentences as plain text."""
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            table = self.by_length.to_string(index=False, float_format=lambda x: f"{x:.3f}")
        return "\n".join([f"heads: {', '.join(self.names)} ({self.how})", table, *(f"- {s}" for s in self.causes)])

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(s)}</li>" for s in self.causes)
        return (f"<p>heads: {html.escape(', '.join(self.names))} ({html.escape(self.how)})</p><ul>{items}</ul>"
                + self.by_length.to_html(index=False, float_format=lambda x: f"{x:.3f}"))


class _Sums:
    """Running sums per (length, head, token) and (length, token), and three numbers per sample (exact, partial,
    first error): no pattern, logit or per-token row is kept."""

    def __init__(self) -> None:
        self.heads: dict[tuple[int, str], np.ndarray] = {}  # [4, j]: rows, mass, offset, on_ref
        self.tokens: dict[int, np.ndarray] = {}  # [3, j]: n, correct, first errors
        self.samples: dict[int, list] = {}  # exact, partial, first error (-1: none) per sample, as numbers

    @staticmethod
    def _add(table: dict, key: Any, values: np.ndarray) -> None:
        old = table.get(key)
        if old is None:
            table[key] = values
            return
        width = max(old.shape[1], values.shape[1])
        table[key] = np.pad(old, ((0, 0), (0, width - old.shape[1]))) + np.pad(values, ((0, 0), (0, width
                                                                                                    - values.shape[1])))

    def add(self, length: int, out: dict[str, torch.Tensor], heads: dict[str, dict[str, torch.Tensor]],
            delta: int) -> None:
        """Fold one batch: `out` holds j [b, pos] (-1 off the output rows), correct [b, pos]; `heads` each
        selected head's readout."""
        j, correct = out["j"].numpy(), out["correct"].numpy()
        rows = j >= 0
        width = int(j.max()) + 1
        bins = lambda w=None: np.bincount(j[rows], weights=w, minlength=width)  # noqa: E731
        wrong = rows & ~correct
        first = np.where(wrong.any(1), np.where(wrong, j, width).min(1), -1)
        self._add(self.tokens, length, np.stack([bins(), bins(correct[rows].astype(float)),
                                                 np.bincount(first[first >= 0], minlength=width)]))
        chars = rows & out["char"].numpy()
        partial = (correct & chars).sum(1) / np.maximum(chars.sum(1), 1)
        self.samples.setdefault(length, []).extend(zip((~wrong.any(1)).tolist(), partial.tolist(), first.tolist()))
        for name, r in heads.items():
            mass, offset = r["mass"].float().numpy(), r["offset"].float().numpy()
            scored = rows & ~np.isnan(mass)
            jj = j[scored]
            stack = [np.bincount(jj, minlength=width), np.bincount(jj, mass[scored], width),
                     np.bincount(jj, offset[scored], width),
                     np.bincount(jj, (offset[scored] == delta).astype(float), width)]
            self._add(self.heads, (length, name), np.stack(stack))


def explain_lengths(
    model,
    tokenizer: Tokenizer,
    task: Task | str,
    lengths: Iterable[int],
    *,
    heads: Any = None,
    options: LengthOptions | None = None,
    **settings: Unpack[LengthSettings],
) -> LengthAnatomy:
    """The failure anatomy per length of `task` (a `Task`, or a name: its OOD preset), over `lengths` (the task's
    length parameter: reversal's string length, addition's digits, ...); see the module docstring. `heads`: as
    `explain` takes them (None: the ranking's on the task's ID preset). `options` / keywords: `LengthOptions`'
    fields (`n`, `seed`, `batch_size`, `delta`, `top`, `threshold`, `progress`, ...); `fwd_hooks` there, an edit
    as `explain` takes it, reads the edited model."""
    options = merge_options(LengthOptions, options, settings, "explain_lengths")
    require_tokenizer(tokenizer, "explain_lengths: tokenizer")
    task = tasks.preset(task, "ood") if isinstance(task, str) else task
    lengths = sorted({int(x) for x in lengths})
    if not lengths or lengths[0] < 1:
        raise ValueError(f"lengths must be integers >= 1, got {lengths}")
    per_length = {length: bucket_task(task, (length, length)) for length in lengths}
    models.check_context(model, per_length[lengths[-1]], tokenizer.offset)
    selected, delta, how = choose(model, tokenizer, (task.name, task.params()), heads, options)
    sums = _Sums()
    bar = tqdm(total=len(lengths) * options.n, desc="explain lengths", disable=not options.progress, leave=False)
    for length, sub in per_length.items():
        samples = check_samples(sub.generate(options.n, seed=options.seed), "explain_lengths")
        for i in range(0, len(samples), options.batch_size):
            stopping.check()  # a safe point between batches
            part = samples[i:i + options.batch_size]
            _fold(sums, length, (model, tokenizer, part, options.fwd_hooks), selected, delta, options.convention)
            bar.update(len(part))
    bar.close()
    return _result(sums, selected, delta, how, options.threshold)


def _fold(sums: _Sums, length: int, job: tuple, selected: list, delta: int, convention: str) -> None:
    """Read one batch (`job` = model, tokenizer, samples, edit or None) and fold it into `sums`."""
    model, tokenizer, part, fwd_hooks = job
    batch = make_batch(part, tokenizer, n_ctx=model.cfg.n_ctx).to(model.cfg.device)
    user = [] if fwd_hooks is None else edit_hooks(fwd_hooks, batch, model)[0]
    r = read(model, batch, user, selected, delta, (convention, ()))
    tidx = batch.target_index.cpu()
    n_target = torch.tensor([len(s.target) for s in part])[:, None]
    keep_eos = torch.tensor([tokenizer.eos_id is not None and scores_eos(s) for s in part])[:, None]
    j = torch.where((tidx >= 0) & ((tidx < n_target) | keep_eos), tidx, -1)
    out = {"j": j, "correct": (r.logits.argmax(-1).cpu() == batch.labels.cpu()), "char": tidx < n_target}
    sums.add(length, out, {head_name(h): {k: v.cpu() for k, v in r.rows[h].items()} for h in selected}, delta)


def _result(sums: _Sums, selected: list, delta: int, how: str, threshold: float) -> LengthAnatomy:
    """The tables and sentences from the running sums."""
    by_token = []
    for (length, name), (rows, mass, offset, on) in sums.heads.items():
        for j in np.nonzero(rows)[0]:
            by_token.append((length, name, int(j), int(rows[j]), mass[j] / rows[j], offset[j] / rows[j],
                             on[j] / rows[j]))
    by_token = pd.DataFrame(by_token, columns=["length", "name", "j", "rows", "mass", "offset", "on_ref"])
    by_position = pd.DataFrame([(length, j, int(n[j]), c[j] / n[j], int(f[j])) for length, (n, c, f)
                                in sums.tokens.items() for j in np.nonzero(n)[0]],
                               columns=["length", "j", "n", "accuracy", "first_error"])
    leaves = []
    for (length, name), g in by_token.groupby(["length", "name"], sort=False):
        low = g[g.mass < threshold].sort_values("j")
        leaves.append((name, length, low.j.iloc[0] if len(low) else np.nan, low.mass.iloc[0] if len(low) else np.nan))
    leaves = pd.DataFrame(leaves, columns=["name", "length", "first_token", "mass"])
    out = LengthAnatomy(_by_length(sums, by_token), by_position, by_token, leaves, selected, delta, how, threshold)
    out.causes = leave_causes(out)
    return out


def _by_length(sums: _Sums, by_token: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for length, samples in sums.samples.items():
        exact, partial, first = (np.array(x) for x in zip(*samples))
        mine = by_token[by_token.length == length]
        failing = first[first >= 0]
        rows.append((length, len(samples), exact.mean(), partial.mean(), *(_weighted(mine, c) for c in
                     ("mass", "offset", "on_ref")), len(failing),
                     float(np.median(failing)) if len(failing) else float("nan")))
    return pd.DataFrame(rows, columns=["length", "n", "exact", "partial", "mass", "offset", "on_ref", "failing",
                                       "first_error"]).sort_values("length", ignore_index=True)


def _weighted(rows: pd.DataFrame, col: str) -> float:
    """The mean of `col` over the rows the per-token means were taken on (weighted by `rows.rows`)."""
    w = rows.rows.to_numpy(float)
    return float((rows[col].to_numpy(float) * w).sum() / w.sum()) if w.sum() else float("nan")


def leave_causes(found: LengthAnatomy) -> list[str]:
    """Per head, in words: the first length and token at which its mean mass on the references falls below the
    threshold, at how many of the lengths from there it does, and where at the longest; or that it never does."""
    out = []
    lengths = sorted(found.by_length.length)
    thr, where = found.threshold, ref(found.delta)
    for name in found.names:
        mine = found.leaves[found.leaves.name == name].sort_values("length")
        off = mine[mine.first_token.notna()]
        if off.empty:
            out.append(f"head {name} keeps a mean mass of at least {thr:g} on {where} at every output token of "
                       f"lengths {lengths[0]}-{lengths[-1]}")
            continue
        first = off.iloc[0]
        later = mine[mine.length >= first.length]
        text = (f"head {name}'s attention first leaves {where} at length {int(first.length)}, token "
                f"{int(first.first_token)} (mean mass {first.mass:.2f} < {thr:g}); it leaves at {len(off)} of the "
                f"{len(later)} lengths from there")
        last = mine.iloc[-1]
        if last.length != first.length and last.first_token == last.first_token:
            text += f", at length {int(last.length)} from token {int(last.first_token)}"
        out.append(text)
    if len(found.names) > 1 and not out:
        out.append(f"{heads_word(found.names)}: no rows")
    return out
