"""Evaluate a model on task samples: teacher-forced or greedy (KV-cached) accuracy, per-token AttnScore.

AttnScore is Spiegel et al. 2025, Eq. 3.

    result = evaluate(model, tokenizer, samples, mode="generate", heads=[(1, 3)])
    result.summary()                      # {"exact", "partial", "n", "attn_rollout_sample", "attn_rollout_raw", ...}
    summarize(result, by="length")        # one row per target length (or bucket of lengths)
    correct_vs_error(result.records)      # the paper's Table 3: AttnScore on correct vs wrong tokens, Welch's t

Interventions: `fwd_hooks` is a list of `(hook_name, fn)` or a callable `f(batch) -> list` (for hooks that need
the batch's own reference mask, e.g. `lambda b: hooks.reinforce(heads, b.ref_mask, 1.0)`); it is active in the
logits forward, during KV-cached generation, and while the attention scores are measured.
Exact accuracy counts every target token and EOS (successor: EOS is not scored: its series has no natural end);
partial accuracy is the mean over samples of the fraction of correct target characters (paper Eq. 1). AttnScore
is measured on scored rows only (target rows with references); every other row is NaN, never 0.

AttnScore conventions (every score column is named `attn_{rollout|heads}_{convention}`):

- `sample` (the paper's; Table 3's default): the mass on the references divided by the mass on the sample's own
  columns (`Batch.sample_columns`: BOS, instruction and few-shot columns left out of the denominator), as the
  public code of Spiegel et al. 2025 (Appendix B, `compute_percentages`) computes it;
- `raw`: the mass on the references over the whole row (rows sum to 1).

On a pretrained model nearly all rollout mass sits on the prefix (attention sinks), so only `sample` is comparable
with the paper; with a BOS-only prefix they differ by the BOS column alone.
"""
from __future__ import annotations

import itertools
import os
from collections import defaultdict
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence, TypedDict, Unpack

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from scipy import stats
from torch import Tensor
from tqdm.auto import tqdm

import hooks
from hooks import check_heads, check_hook_points

from . import stopping
from .accuracy import FwdHooks, accuracy
from .batching import Batch, make_batch, scores_eos, shift_mask
from .checks import check_offsets, check_samples
from .generation import HookList, cached_step, greedy  # noqa: F401 (cached_step: kept importable here)
from .io import write_jsonl
from .models import fused
from .models.fit import check_fit, check_hookable, of_samples
from .models.trained import check_task, task_of, trained_task
from .options import CONVENTIONS, MODES, Convention, Mode, check_option
from .tasks.base import Sample
from .tokenization import Tokenizer, check_tokenizer, require_tokenizer  # check_tokenizer: `aspan eval`'s check

EOS_CHAR = "<eos>"
CHUNK = 1024  # samples `evaluate_stream` holds at once (with their per-token records), rounded up to whole batches
SOURCES = ("rollout", "heads")  # AttnScore of the attention rollout, and the mean over the selected heads


def score_column(source: str, convention: Convention = "sample") -> str:
    """The record column of an AttnScore: `attn_{source}_{convention}`, e.g. `attn_rollout_sample`."""
    check_option("convention", convention, CONVENTIONS)
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(map(repr, SOURCES))}, got {source!r}")
    return f"attn_{source}_{convention}"


SCORE_COLUMNS = [score_column(s, c) for s in SOURCES for c in CONVENTIONS]
RECORD_COLUMNS = [
    "sample_id", "length", "input_len", "target_index", "target_char", "pred_char",
    "correct", "scored", "eos", *SCORE_COLUMNS,
]


def hooks_for(fwd_hooks: FwdHooks, batch: Batch) -> list[tuple[str, Callable]]:
    """The hook list for `batch`: `fwd_hooks` itself, or `fwd_hooks(batch)` when it is a factory."""
    return list(fwd_hooks(batch) if callable(fwd_hooks) else fwd_hooks)


@dataclass(frozen=True)
class EvalOptions:
    """How `evaluate` and `evaluate_stream` score samples; each field is also a keyword of theirs
    (`evaluate(model, tokenizer, samples, mode="generate")` equals `evaluate(..., options=EvalOptions(mode=...))`)."""

    fwd_hooks: FwdHooks = ()  # (hook name, fn) pairs, or a factory f(batch) -> pairs, active in every forward
    mode: Mode = "teacher"  # "teacher" (teacher-forced) or "generate" (greedy, KV-cached)
    batch_size: int = 32  # samples per forward
    heads: Sequence[tuple[int, int]] | None = None  # (layer, head) pairs: adds their mean AttnScore (attn_heads_*)
    delta: int = 0  # reference offset: AttnScore on the reference columns shifted by delta
    attn: bool = True  # measure AttnScore (False: accuracy only, cheaper)
    progress: bool = False  # a progress bar counting samples
    any_task: bool = False  # score samples of another task than the one the model was trained on


class EvalSettings(TypedDict, total=False):
    """`EvalOptions`' fields as typed keywords of `evaluate` and `evaluate_stream` (the defaults are `EvalOptions`';
    a test keeps the two lists equal)."""

    fwd_hooks: FwdHooks
    mode: Mode
    batch_size: int
    heads: Sequence[tuple[int, int]] | None
    delta: int
    attn: bool
    progress: bool
    any_task: bool


def eval_options(options: EvalOptions | None, settings: Mapping[str, object], where: str = "evaluate") -> EvalOptions:
    """`options` (default `EvalOptions()`) with the keywords `settings` over it; TypeError naming an unknown keyword,
    as Python names one (`where`: the function's name)."""
    known = {f.name for f in fields(EvalOptions)}
    for key in settings:
        if key not in known:
            raise TypeError(f"{where}() got an unexpected keyword argument {key!r} (known: {', '.join(sorted(known))})")
    return replace(options or EvalOptions(), **settings)


@dataclass
class EvalResult:
    """What `evaluate` returns: one row per scored target token (`records`) and one per sample (`samples`)."""
    records: pd.DataFrame  # one row per scored target token (RECORD_COLUMNS)
    samples: pd.DataFrame  # one row per sample: sample_id, length, exact, partial, SCORE_COLUMNS
    mode: Mode

    def summary(self) -> dict:
        """Headline numbers: exact, partial, n, and every AttnScore column's mean (per sample mean over scored rows,
        then over samples), named by source and convention."""
        s = self.samples
        return {
            "exact": float(s.exact.mean()) if len(s) else float("nan"),
            "partial": float(s.partial.mean()) if len(s) else float("nan"),
            "n": int(len(s)),
            **{c: float(s[c].mean()) for c in SCORE_COLUMNS},
        }



# ----------------------------------------------------------------------------------------------- attention
def attn_rows(
    model,
    tokens: Int[Tensor, "batch pos"],
    mask: Bool[Tensor, "batch pos pos"],
    attention_mask: Tensor | None,
    heads: Sequence[tuple[int, int]] | None,
    columns: Bool[Tensor, "batch pos"],
) -> dict[str, Float[Tensor, "batch pos"]]:
    """Per-row AttnScores {column name: [batch, pos]} of the rollout and of the mean over `heads` (left out without
    heads), in both conventions (`sample`: denominator `columns`; `raw`: the whole row); every row (callers select)."""
    R = hooks.rollout(model, tokens, attention_mask=attention_mask)  # one rollout serves both conventions
    cols = {"sample": columns, "raw": None}
    out = {score_column("rollout", c): hooks.share(R, mask.to(R.device), cols[c]) for c in CONVENTIONS}
    if heads:
        for c in CONVENTIONS:
            rows = hooks.head_row_scores(model, tokens, mask, heads=list(heads), attention_mask=attention_mask,
                                         columns=cols[c])
            out[score_column("heads", c)] = rows.mean(-1)
    return {k: v.float().cpu() for k, v in out.items()}


# ----------------------------------------------------------------------------------------------- evaluation
def _token_str(tokenizer: Tokenizer, cache: dict, i: int) -> str:
    if i not in cache:
        if i == tokenizer.eos_id:
            cache[i] = EOS_CHAR
        elif i < 0:
            cache[i] = ""
        else:
            cache[i] = tokenizer.decode([i]) if i != tokenizer.pad_id else "<pad>"
    return cache[i]


def _check(model, tokenizer: Tokenizer, samples: Sequence[Sample], options: EvalOptions) -> None:
    """Fail before any work: no samples, anything but checked `Sample`s (`check_samples`), samples of another task
    than the model's (unless `any_task`), bad mode, batch size, a sample longer than the model's context, or a
    reference offset `delta` outside every sequence (as the command line refuses it)."""
    mode, batch_size, delta = options.mode, options.batch_size, options.delta
    require_tokenizer(tokenizer, "evaluate: tokenizer")
    if not samples:
        raise ValueError("evaluate: no samples (accuracies of an empty set are undefined): give at least one")
    check_samples(samples, "evaluate")
    if not options.any_task:
        check_task(trained_task(model), task_of(samples), "evaluate", "pass any_task=True to score them anyway")

    need = of_samples(samples)
    check_hookable(model, "evaluate")
    try:
        check_tokenizer(tokenizer, need.chars)
    except ValueError as e:
        names = ", ".join(sorted({s.task for s in samples if s.task})) or "unnamed"
        raise ValueError(f"evaluate: samples of task {names} that this model's tokenizer cannot read ({e}): "
                         "evaluate a model on the task it was trained on") from None
    check_fit(model, tokenizer, need, "evaluate")  # the vocabulary and the context too, before any forward
    check_option("mode", mode, MODES)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    longest = tokenizer.offset + need.longest + (tokenizer.eos_id is not None)
    check_offsets(delta, longest, "evaluate: delta")


def _batches(samples: Sequence[Sample], tokenizer: Tokenizer, mode: Mode, batch_size: int) -> list[list[int]]:
    """Sample indices per batch: in order (teacher), or grouped by prompt length so prompts need no padding
    (generate)."""
    idx = list(range(len(samples)))
    if mode == "teacher":
        return [idx[i : i + batch_size] for i in range(0, len(idx), batch_size)]
    groups: dict[int, list[int]] = defaultdict(list)
    for i in idx:
        groups[samples[i].prompt_len].append(i)
    return [g[i : i + batch_size] for _, g in sorted(groups.items()) for i in range(0, len(g), batch_size)]


def _forced(batch: Batch, p: int, n_new: int) -> Int[Tensor, "batch new"] | None:
    """The `given` target characters' ids at their generation steps (-1 elsewhere); None when no sample has any."""
    if not any(s.given for s in batch.samples):
        return None
    forced = torch.full((len(batch), n_new), -1, dtype=torch.long)
    for i, s in enumerate(batch.samples):
        for j in s.given:
            forced[i, j] = batch.tokens[i, p + j]
    return forced


@torch.no_grad()
def _run_batch(model, tokenizer, batch: Batch, options: EvalOptions):
    """Predicted id per row ([batch, pos], -1 where nothing was predicted), the per-row AttnScores by column name
    (NaN where nothing was predicted) and the rows with (shifted) references, under `evaluate`'s `options`."""
    user = check_hook_points(model, hooks_for(options.fwd_hooks, batch))
    delta = options.delta
    if options.mode == "teacher":
        tokens, am = batch.tokens, batch.attention_mask
        pred = fused.logits(model, tokens, user, attention_mask=am).argmax(-1).cpu()  # fused where it applies
        width = tokens.shape[1]
    else:
        p = batch.offset + batch.samples[0].prompt_len
        n_new = max(len(s.target) + (tokenizer.eos_id is not None and scores_eos(s)) for s in batch.samples)
        gen = greedy(model, batch.tokens[:, :p], n_new, tokenizer.eos_id, fwd_hooks=user,
                     forced=_forced(batch, p, n_new)).cpu()
        # rows after a sample's first EOS were never predicted (-1); tokens = prompt + what the model wrote
        width = p + gen.shape[1]
        pred = torch.full((len(batch), batch.tokens.shape[1]), -1, dtype=torch.long)
        pred[:, p - 1 : width - 1] = gen
        if tokenizer.eos_id is not None:
            after = (gen == tokenizer.eos_id).long().cumsum(1) - (gen == tokenizer.eos_id).long() > 0
            pred[:, p - 1 : width - 1][after] = -1
        tokens = torch.cat([batch.tokens[:, :p].cpu(), gen], 1).to(batch.tokens.device)
        am = torch.ones_like(tokens)
    scores: dict[str, Tensor] = {}
    if options.attn:
        mask = shift_mask(batch.ref_mask[:, :width, :width], delta)
        # the sample's own columns (Batch.sample_columns), also for generated tokens: real and past the prefix
        columns = am.bool() & (torch.arange(width, device=am.device) >= batch.offset)
        with model.hooks(fwd_hooks=user):
            scores = attn_rows(model, tokens, mask, am, options.heads, columns)
        pad = (0, batch.tokens.shape[1] - width)
        scores = {k: torch.nn.functional.pad(v, pad, value=float("nan")).masked_fill(pred < 0, float("nan"))
                  for k, v in scores.items()}
    return pred, scores, shift_mask(batch.ref_mask, delta).any(-1).cpu()


def evaluate(
    model,
    tokenizer: Tokenizer,
    samples: Sequence[Sample],
    *,
    options: EvalOptions | None = None,
    **settings: Unpack[EvalSettings],
) -> EvalResult:
    """Score `samples` teacher-forced or by greedy generation; per-token records and per-sample accuracy.

    The settings are `EvalOptions`' fields, given as `options=EvalOptions(...)`, as keywords
    (`evaluate(model, tokenizer, samples, mode="generate", heads=[(1, 3)])`), or both (the keywords win).
    Never trains or changes the model: no gradients, the `training` flag is restored, weights untouched.
    Records carry the rollout AttnScore in both conventions (`attn_rollout_sample`, `attn_rollout_raw`); `heads`
    adds `attn_heads_sample` and `attn_heads_raw` (mean over those heads' per-row AttnScore); `delta` shifts
    references. Samples of another task than the one the model was trained on (`aspan.models.trained`) are refused
    unless `any_task`. Every sample is checked before the first forward; the work is done `evaluate_stream`'s
    chunks at a time, so the result equals the concatenation of its chunks exactly.
    """
    options = eval_options(options, settings)
    samples = list(samples)
    _check(model, tokenizer, samples, options)
    parts = _stream(model, tokenizer, samples, CHUNK, options, checked=True)
    records = pd.concat([r.records for r in parts], ignore_index=True)
    return EvalResult(records, sample_table(records), options.mode)


def exact_flags(model, tokenizer: Tokenizer, samples: Sequence[Sample], fwd_hooks: FwdHooks = (),
                batch_size: int = 64) -> Bool[Tensor, " n"]:
    """Per sample, whether teacher forcing gets every row it scores right (`evaluate`'s `exact`), counted on the
    model's device without building records (`aspan.accuracy.accuracy`, at least `batch_size` samples per forward):
    for the large test sets of the studies (tens of thousands of samples), where `evaluate`'s per-token table costs
    far more than the forward passes."""
    samples = list(samples)
    if not samples:
        raise ValueError("exact_flags: no samples")
    return accuracy(model, tokenizer, samples, fwd_hooks, batch_size).exact


def evaluate_stream(model, tokenizer: Tokenizer, samples: Iterable[Sample], chunk: int = CHUNK, *,
                    options: EvalOptions | None = None, **settings: Unpack[EvalSettings]) -> Iterator[EvalResult]:
    """`evaluate` (same `options` and keywords) over `samples` a chunk at a time, one `EvalResult` per chunk: an
    iterator of samples (e.g. `itertools.islice(task.stream(seed), n)`) is drawn as it goes, so memory does not grow
    with their number.
    Sample ids run on across chunks (the i-th sample is `sample_id` i). A chunk holds `chunk` samples rounded up to
    whole batches, so teacher-forced batches are those of one `evaluate` call; generation groups prompts of one
    length within a chunk. Each chunk is checked (`evaluate`'s checks) before its first forward."""
    options = eval_options(options, settings, "evaluate_stream")
    return _stream(model, tokenizer, samples, chunk, options, checked=False)


def _stream(model, tokenizer: Tokenizer, samples: Iterable[Sample], chunk: int, options: EvalOptions,
            checked: bool) -> Iterator[EvalResult]:
    """`evaluate_stream`; `checked`: the caller already checked every sample (`evaluate`), so chunks are not
    checked again."""
    size = -(-max(chunk, 1) // options.batch_size) * options.batch_size
    stream, first = iter(samples), 0
    total = len(samples) if isinstance(samples, Sequence) else None
    with tqdm(total=total, desc=f"eval ({options.mode})", unit="sample", disable=not options.progress,
              leave=False) as bar:
        while part := list(itertools.islice(stream, size)):
            if not checked:
                _check(model, tokenizer, part, options)
            yield _evaluate_chunk(model, tokenizer, part, first, options, bar=bar)
            first += len(part)


def _evaluate_chunk(model, tokenizer: Tokenizer, samples: list[Sample], first: int, options: EvalOptions,
                    bar=None) -> EvalResult:
    """`evaluate` of one chunk of checked samples whose first sample has id `first` (`bar`: a progress bar counting
    samples)."""
    mode, batch_size = options.mode, options.batch_size
    if options.heads:
        options = replace(options, heads=check_heads(options.heads, model.cfg.n_layers, model.cfg.n_heads))
    was_training = model.training
    model.eval()
    rows: list[tuple] = []
    names: dict[int, str] = {}
    try:
        groups = _batches(samples, tokenizer, mode, batch_size)
        for ids in groups:
            batch = make_batch([samples[i] for i in ids], tokenizer, n_ctx=model.cfg.n_ctx).to(model.cfg.device)
            scored = _run_batch(model, tokenizer, batch, options)
            rows += _batch_rows(batch, [(first + i, samples[i]) for i in ids], scored, tokenizer, names)
            if bar is not None:
                bar.update(len(ids))
            stopping.check()  # a safe point between batches
    finally:
        model.train(was_training)
    records = pd.DataFrame(rows, columns=RECORD_COLUMNS).sort_values(["sample_id", "target_index"], ignore_index=True)
    return EvalResult(records, sample_table(records), mode)


def _batch_rows(batch: Batch, numbered: list[tuple[int, Sample]], scored, tokenizer: Tokenizer,
                names: dict[int, str]) -> list[tuple]:
    """One record row (RECORD_COLUMNS) per scored target token of a batch's (sample id, sample) pairs, from what
    `_run_batch` returned (predictions, AttnScores, rows with references)."""
    pred, scores, has_refs = scored
    labels, tidx = batch.labels.cpu(), batch.target_index.cpu()
    rows = []
    for b, (i, s) in enumerate(numbered):
        n_target = len(s.target)
        for r in torch.nonzero(tidx[b] >= 0).flatten().tolist():
            j = int(tidx[b, r])
            is_eos = j >= n_target
            if is_eos and not scores_eos(s):
                continue
            p, y = int(pred[b, r]), int(labels[b, r])
            ok = bool(has_refs[b, r])
            rows.append((
                i, n_target, s.prompt_len, j, EOS_CHAR if is_eos else s.target[j],
                _token_str(tokenizer, names, p), p == y, ok, is_eos,
                *(float(scores[c][b, r]) if c in scores and ok else float("nan") for c in SCORE_COLUMNS),
            ))
    return rows


# ----------------------------------------------------------------------------------------------- tables
def _records(records_or_result: pd.DataFrame | EvalResult) -> pd.DataFrame:
    return records_or_result.records if isinstance(records_or_result, EvalResult) else records_or_result


def sample_table(records: pd.DataFrame) -> pd.DataFrame:
    """Per sample: exact (every scored token right, EOS included), partial (fraction of target chars right),
    AttnScores."""
    r = _records(records)
    if r.empty:
        return pd.DataFrame(columns=["sample_id", "length", "exact", "partial", *SCORE_COLUMNS])
    chars = r[~r.eos]
    g = r.groupby("sample_id", sort=True)
    out = pd.DataFrame({
        "length": g.length.first(),
        "exact": g.correct.all(),
        "partial": chars.groupby("sample_id").correct.mean().reindex(g.length.first().index),
        **{c: r[r.scored].groupby("sample_id")[c].mean().reindex(g.length.first().index) for c in SCORE_COLUMNS},
    })
    return out.reset_index()


def summarize(
    records_or_result: pd.DataFrame | EvalResult, by: str | None = "length", bucket: int | None = None
) -> pd.DataFrame:
    """Accuracy and AttnScore per `by` value (e.g. target length; `bucket` groups lengths into bins of that width)."""
    s = records_or_result.samples if isinstance(records_or_result, EvalResult) else sample_table(records_or_result)
    if by is None:
        key, name = pd.Series("all", index=s.index), "all"
    elif bucket and bucket > 1:
        key, name = (s[by] - 1) // bucket * bucket + 1, f"{by}_bucket"
    else:
        key, name = s[by], by
    agg = s.groupby(key.rename(name)).agg(
        n=("exact", "size"), exact=("exact", "mean"), partial=("partial", "mean"),
        **{c: (c, "mean") for c in SCORE_COLUMNS if c in s},
    )
    if by is not None and bucket and bucket > 1:
        agg.index = [f"{lo}-{lo + bucket - 1}" for lo in agg.index]
        agg.index.name = name
    return agg.reset_index()


@dataclass(frozen=True)
class Moments:
    """Count, mean and sum of squared deviations of a set of values; merged exactly in the way of Chan et al.
    (1979), so a stream of chunks needs no more than these three numbers."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    @classmethod
    def of(cls, x: np.ndarray) -> "Moments":
        """Count, mean and sum of squared deviations of `x` (empty: all zero)."""
        if not len(x):
            return cls()
        mean = float(x.mean())
        return cls(len(x), mean, float(((x - mean) ** 2).sum()))

    def __add__(self, other: "Moments") -> "Moments":
        if not self.n or not other.n:
            return other if not self.n else self
        n, d = self.n + other.n, other.mean - self.mean
        return Moments(n, self.mean + d * other.n / n, self.m2 + other.m2 + d * d * self.n * other.n / n)

    def mean_sem(self) -> tuple[float, float]:
        """(mean, standard error of the mean with ddof 1); NaN where undefined."""
        return (self.mean if self.n else float("nan"),
                float(np.sqrt(self.m2 / (self.n - 1) / self.n)) if self.n > 1 else float("nan"))


def correct_vs_error_moments(records: pd.DataFrame, column: str) -> tuple[Moments, Moments]:
    """Moments of `column` on the correct and on the wrong scored tokens of `records`."""
    r = records[records.scored & records[column].notna()]
    return Moments.of(r.loc[r.correct, column].to_numpy(float)), Moments.of(r.loc[~r.correct, column].to_numpy(float))


def welch(good: Moments, bad: Moments) -> dict:
    """Mean ± SEM on correct (`good`) and wrong (`bad`) tokens and Welch's t-test between them (from their moments)."""
    (mc, sc), (me, se) = good.mean_sem(), bad.mean_sem()
    t = p = float("nan")
    if good.n > 1 and bad.n > 1:
        res = stats.ttest_ind_from_stats(mc, sc * np.sqrt(good.n), good.n, me, se * np.sqrt(bad.n), bad.n,
                                         equal_var=False)
        t, p = float(res.statistic), float(res.pvalue)
    return dict(mean_correct=mc, sem_correct=sc, n_correct=good.n, mean_error=me, sem_error=se, n_error=bad.n,
                t=t, p=p)


def correct_vs_error(records: pd.DataFrame | EvalResult, column: str = "attn_rollout_sample") -> dict:
    """Mean ± SEM of `column` on correct and on wrong scored tokens, Welch's t-test (Spiegel et al. 2025, Table 3)."""
    return welch(*correct_vs_error_moments(_records(records), column))


def _parse_column(col: str) -> tuple[str, str]:
    """(source, convention) of a score column `attn_{source}_{convention}`; ("", "") for any other name."""
    for s in SOURCES:
        for c in CONVENTIONS:
            if col == score_column(s, c):
                return s, c
    return "", ""


def _pct(mean: float, sem: float) -> str:
    """Mean ± SEM in percent, 3 significant digits (raw shares on pretrained models are ~1e-6 %)."""
    return f"{100 * mean:.3g} ± {100 * sem:.2g}"


def correct_vs_error_table(
    records: pd.DataFrame | EvalResult | Mapping[str, pd.DataFrame | EvalResult],
    columns: Iterable[str] = tuple(SCORE_COLUMNS),
) -> pd.DataFrame:
    """Table 3 of the paper: one row per (label, score column) with AttnScore (%) mean ± SEM on correct / error, t, p.

    Every row names its `source` (rollout or heads) and `convention` (sample or raw; "" for other columns); columns
    that are all NaN (e.g. heads not given) are left out.
    """
    named = records if isinstance(records, Mapping) else {"": records}
    return cve_table({label: {col: correct_vs_error_moments(_records(rec), col) for col in columns
                              if col in _records(rec)} for label, rec in named.items()})


def cve_table(moments: Mapping[str, Mapping[str, tuple[Moments, Moments]]]) -> pd.DataFrame:
    """`correct_vs_error_table` from {label: {score column: (moments on correct, on wrong tokens)}}; columns without
    a value are left out."""
    rows = []
    for label, by_column in moments.items():
        for col, (good, bad) in by_column.items():
            if not good.n + bad.n:
                continue
            c = welch(good, bad)
            source, convention = _parse_column(col)
            rows.append({
                "label": label, "score": col, "source": source, "convention": convention,
                "correct (%)": _pct(c["mean_correct"], c["sem_correct"]),
                "error (%)": _pct(c["mean_error"], c["sem_error"]),
                **c,
            })
    cols = ["label", "score", "source", "convention", "correct (%)", "error (%)", "n_correct", "n_error", "t", "p",
            "mean_correct", "sem_correct", "mean_error", "sem_error"]
    return pd.DataFrame(rows, columns=cols)


class StreamTotals:
    """What `evaluate_stream`'s chunks add up to once their records are gone (written to a file, or dropped): the
    per-sample table, one row per sample (every accuracy table is computed from it), and per AttnScore column the
    moments on correct and on wrong tokens (Table 3's means, SEMs and Welch's t)."""

    def __init__(self, mode: Mode):
        self.mode, self.parts = mode, []
        self.moments: dict[str, tuple[Moments, Moments]] = {}

    def add(self, chunk: EvalResult) -> None:
        """Fold one chunk's evaluation into the totals (its sample rows and the moments of each score column)."""
        self.parts.append(chunk.samples)
        for col in SCORE_COLUMNS:
            good, bad = correct_vs_error_moments(chunk.records, col)
            had = self.moments.get(col, (Moments(), Moments()))
            self.moments[col] = (had[0] + good, had[1] + bad)

    def result(self) -> EvalResult:
        """The per-sample table as an `EvalResult` whose records are not kept (an empty table)."""
        if len(self.parts) != 1:  # joined once
            self.parts = [pd.concat(self.parts, ignore_index=True) if self.parts else sample_table(pd.DataFrame())]
        return EvalResult(pd.DataFrame(columns=RECORD_COLUMNS), self.parts[0], self.mode)

    def correct_vs_error_table(self) -> pd.DataFrame:
        """The correct-vs-error table (see `correct_vs_error_table`) of everything added so far."""
        return cve_table({"": self.moments})


def write_records(records: pd.DataFrame | EvalResult, path: str | os.PathLike) -> Path:
    """Write per-token records as JSONL (pandas `read_json(lines=True)` reads it back), atomically."""
    return write_jsonl(path, _records(records))
