"""Causal head profiling: rank heads by the measured effect of an attention edit applied to each head alone.

PASTA's model profiling (Zhang et al. 2023, "Tell your model where to attend", Section 3.2) chooses the heads to
steer by the effect of steering each one alone on a small selection set. Here the edit is any of the toolkit's
attention edits (additive reinforcement at key offset delta, pattern patching, PASTA steering), the effect is the
change of a metric on a selection set (mean target log-probability, per-token accuracy as in the paper's Eq. 1, or
exact accuracy), and heads are chosen by that effect: top k, or greedy forward selection (add the head that helps
most given those already chosen; stop when nothing helps or at k).

Exact profiling costs one evaluation of the selection set per head. The first-order estimate (attribution patching,
Nanda 2023; Syed, Rager & Conmy 2023, "Attribution patching outperforms automated circuit discovery") scores every
head from one forward and one backward pass:

    effect_h  ~=  sum_{rows q, keys k}  d log p(target) / d A_h[q, k]  *  dA_h[q, k]

where dA_h is the edit's change of head h's pattern. It is computed exactly as the derivative at eps = 0 of the
metric under A_h + eps_h * dA_h (one scalar probe per head), and is used to pick which heads to profile exactly.

    edit = Edit("reinforce", delta=2, strength=1.0)
    batches = selection_batches(model, tokenizer, ood_samples)
    est = attribution(model, batches, edit)                      # [layer, head], one forward + one backward
    table = profile(model, tokenizer, ood_samples, edit, ProfileConfig(candidates=8))
    chosen = greedy_select(model, batches, edit, candidates, k=4)
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from scipy import stats
from torch import Tensor
from tqdm.auto import tqdm

import hooks
from hooks import check_heads, check_mask, pattern_name
from hooks.masks import query_rows

from .. import stopping
from ..batching import IGNORE, Batch, make_batch, scores_eos
from ..options import PROFILE_METRICS, ProfileMetric
from ..tasks.base import Sample
from ..tokenization import Tokenizer
from .edit import Edit, atom_hooks

Head = tuple[int, int]
Metric = ProfileMetric
METRICS = PROFILE_METRICS


# ----------------------------------------------------------------------------------------------- the edit
# `Edit` (one attention edit: heads, method, strength, offset, gates) and `atom_hooks` live in `experiments.edit`.
def pattern_hooks(edit: Edit, ref_mask: Tensor, model=None) -> list[tuple[str, Callable]]:
    """Hooks replacing the pattern of each of the edit's heads by `edit.apply` of it (any method; KV-cache aware)."""
    sel = check_heads(edit.heads, *((model.cfg.n_layers, model.cfg.n_heads) if model is not None else ()))
    mask = hooks.shift_mask(edit.refs(check_mask(ref_mask)), edit.delta)
    by_layer: dict[int, list[int]] = {}
    for layer, head in sel:
        by_layer.setdefault(layer, []).append(head)

    def make(hs: list[int]):
        def hook(pattern: Tensor, hook) -> Tensor:
            b, _, q, k = pattern.shape
            m = query_rows(mask.to(pattern.device).expand(b, *mask.shape[-2:]), q, k)
            idx = torch.tensor(hs, device=pattern.device)
            out = pattern.clone()
            out[:, idx] = edit.apply(pattern[:, idx], m)
            return out

        return hook

    return [(pattern_name(layer), make(hs)) for layer, hs in sorted(by_layer.items())]


# ----------------------------------------------------------------------------------------------- metrics
def selection_batches(model, tokenizer: Tokenizer, samples: Sequence[Sample], batch_size: int = 32) -> list[Batch]:
    """The selection set as batches on the model's device (made once, reused by every evaluation)."""
    samples = list(samples)
    if not samples:
        raise ValueError("the selection set is empty")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n_ctx, device = model.cfg.n_ctx, model.cfg.device
    starts = range(0, len(samples), batch_size)
    return [make_batch(samples[i : i + batch_size], tokenizer, n_ctx=n_ctx).to(device) for i in starts]


def _rows(batch: Batch) -> tuple[Tensor, Tensor]:
    """(target character rows, rows scored for exact accuracy: the characters and EOS where it is a target)."""
    n_chars = torch.tensor([len(s.target) for s in batch.samples], device=batch.tokens.device)
    eos = torch.tensor([scores_eos(s) for s in batch.samples], device=batch.tokens.device)
    ti = batch.target_index
    chars = (ti >= 0) & (ti < n_chars[:, None])
    return chars, chars | ((ti >= n_chars[:, None]) & eos[:, None] & (batch.labels != IGNORE))


def batch_metric(logits: Float[Tensor, "batch pos vocab"], batch: Batch, metric: Metric) -> Tensor:
    """Sum over the batch's samples of the per-sample metric (differentiable for `logprob`).

    logprob: mean log-probability of the target characters; partial: fraction of target characters predicted
    (the paper's Eq. 1, teacher-forced); exact: every scored token right (EOS included where it is a target).
    """
    chars, scored = _rows(batch)
    n = chars.sum(1).clamp(min=1)
    labels = batch.labels.clamp(min=0)
    if metric == "logprob":
        lp = logits.log_softmax(-1).gather(-1, labels[..., None])[..., 0]
        return (torch.where(chars, lp, torch.zeros((), dtype=lp.dtype, device=lp.device)).sum(1) / n).sum()
    ok = logits.argmax(-1) == labels
    if metric == "partial":
        return ((ok & chars).sum(1) / n).sum().to(logits.dtype)
    if metric == "exact":
        return (ok | ~scored).all(1).sum().to(logits.dtype)
    raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")


HookFactory = Callable[[Batch], list]


@torch.no_grad()
def measure(model, batches: Sequence[Batch], fwd_hooks: HookFactory | None = None, metric: Metric = "logprob") -> float:
    """The metric on the selection set (mean over samples), under the hooks `fwd_hooks(batch)` if given."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    total, n = 0.0, 0
    for batch in batches:
        with model.hooks(fwd_hooks=fwd_hooks(batch) if fwd_hooks else []):
            logits = model(batch.tokens, attention_mask=batch.attention_mask)
        total += float(batch_metric(logits, batch, metric))
        n += len(batch)
    return total / n


# ----------------------------------------------------------------------------------------------- attribution
@contextmanager
def _frozen(model) -> Iterator[None]:
    """No parameter requires grad inside (the backward then stops at the first probe); flags restored after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, f in flags:
            p.requires_grad_(f)


def attribution(model, batches: Sequence[Batch], edit: Edit | Sequence[Edit], base: Sequence[Edit] = ()) -> Tensor:
    """First-order estimate of every head's effect on the mean target log-probability: one forward + one backward.

    Each layer's pattern becomes A + sum_e eps_e * dA_e with eps_e = 0 a per-head probe and dA_e = e(A) - A
    (detached) for each edit e, so d metric / d eps_{e,h} = sum_{q,k} d metric / d A_h[q,k] * dA_{e,h}[q,k]
    (Nanda 2023; Syed et al. 2023). One edit gives [layer, head]; a list of edits [edit, layer, head], all from the
    same pass (the edits' own heads play no part). `base` edits (on their heads) are applied first: the estimate is
    then the effect of adding each edit to them.
    """
    edits = [edit] if isinstance(edit, Edit) else list(edit)
    if not edits:
        raise ValueError("no edit to estimate")
    cfg = model.cfg
    total = torch.zeros(len(edits), cfg.n_layers, cfg.n_heads, dtype=torch.float64)
    n = 0
    was_training = model.training
    model.eval()
    try:
        with _frozen(model), torch.enable_grad():
            for batch in batches:
                total += _attribution_batch(model, batch, edits, base)
                n += len(batch)
    finally:
        model.train(was_training)
    total /= n
    return total[0] if isinstance(edit, Edit) else total


def _attribution_batch(model, batch: Batch, edits: list[Edit], base: Sequence[Edit]) -> Tensor:
    cfg = model.cfg
    masks = [hooks.shift_mask(e.refs(batch.ref_mask), e.delta) for e in edits]
    probes = torch.zeros(len(edits), cfg.n_layers, cfg.n_heads, device=cfg.device, dtype=cfg.dtype,
                         requires_grad=True)

    def hook(pattern: Tensor, hook) -> Tensor:
        layer = int(hook.name.split(".")[1])
        q, k = pattern.shape[-2:]
        out = pattern
        for i, (e, m) in enumerate(zip(edits, masks)):
            with torch.no_grad():
                d = e.apply(pattern.detach(), query_rows(m, q, k)) - pattern.detach()
            out = out + probes[i, layer][None, :, None, None] * d
        return out

    fwd = atom_hooks(base, batch.ref_mask, model) + [(pattern_name(layer), hook) for layer in range(cfg.n_layers)]
    with model.hooks(fwd_hooks=fwd):
        logits = model(batch.tokens, attention_mask=batch.attention_mask)
    objective = batch_metric(logits, batch, "logprob")
    (grad,) = torch.autograd.grad(objective, [probes])
    return grad.detach().double().cpu()


# ----------------------------------------------------------------------------------------------- exact profiling
def exact_effects(
    model, batches: Sequence[Batch], edit: Edit, heads: Sequence[Head], metric: Metric = "logprob",
    progress: bool = False,
) -> dict[Head, float]:
    """The measured effect (metric with the edit on that head alone minus the baseline metric) of each head of
    `heads` (the edit's own heads play no part)."""
    heads = check_heads(heads, model.cfg.n_layers, model.cfg.n_heads)
    base = measure(model, batches, None, metric)
    out = {}
    for h in tqdm(heads, desc="profile heads", disable=not progress, leave=False):
        stopping.check()  # a safe point between heads
        alone = edit.on([h])
        out[h] = measure(model, batches, lambda b, alone=alone: alone.hooks(b.ref_mask, model), metric) - base
    return out


@dataclass(frozen=True)
class GreedyRule:
    """What greedy forward selection maximises, which combinations it may take, and when it stops."""

    metric: Metric = "logprob"  # the quantity maximised on the selection set
    tiebreak: Metric | None = None  # compared when `metric` ties (e.g. exact accuracy, then per-token)
    min_gain: float = 0.0  # stop unless (metric, tiebreak) beats (current + min_gain, current tiebreak)
    allowed: Callable[[list[Edit]], bool] | None = None  # vetoes a combination of atoms when False (None: any)
    fallback: Mapping[Edit, Edit] | None = None  # the atom tried in place of one whose combination `allowed` vetoes


def greedy_select(
    model, batches: Sequence[Batch], edit: Edit, candidates: Sequence[Head], k: int,
    rule: GreedyRule | Metric = "logprob",
) -> pd.DataFrame:
    """Greedy forward selection of heads under one edit (see `greedy_atoms`; the edit's own heads play no part);
    `rule` a `GreedyRule`, or the name of the metric maximised (`GreedyRule(metric)`)."""
    candidates = check_heads(candidates, model.cfg.n_layers, model.cfg.n_heads)
    rule = rule if isinstance(rule, GreedyRule) else GreedyRule(rule)
    return greedy_atoms(model, batches, [edit.on([h]) for h in candidates], k, rule)


def greedy_atoms(
    model, batches: Sequence[Batch], atoms: Sequence[Edit], k: int, rule: GreedyRule | None = None,
) -> pd.DataFrame:
    """Greedy forward selection: repeatedly add the atom (an `Edit` of one head) that raises the metric most given
    those chosen.

    At most one atom per head; stops at `k` atoms or when no atom improves by `rule.min_gain`. `rule.allowed(atoms)`,
    if given, vetoes a combination (e.g. one that costs more in-distribution accuracy than a budget allows), and
    `rule.fallback[atom]` is tried in its place. One row per chosen atom: step, layer, head, edit, value, tiebreak,
    gain; `.attrs` has baseline, metric and `atoms`. Ties go to the earlier atom.
    """
    rule = rule or GreedyRule()
    allowed, fallback = rule.allowed, rule.fallback
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    for atom in atoms:
        if len(atom.heads) != 1:
            raise ValueError(f"an atom edits one head, got {atom.label!r} on {list(atom.heads)}")
        check_heads(atom.heads, model.cfg.n_layers, model.cfg.n_heads)

    def score(chosen: list[Edit]) -> tuple[float, float]:
        fwd = (lambda b: atom_hooks(chosen, b.ref_mask, model)) if chosen else None
        return (measure(model, batches, fwd, rule.metric),
                measure(model, batches, fwd, rule.tiebreak) if rule.tiebreak else 0.0)

    current = base = score([])
    chosen: list[Edit] = []
    rows = []
    while len(chosen) < k:
        best, best_value = None, None
        for atom in atoms:
            if any(atom.heads == c.heads for c in chosen):
                continue
            if allowed is not None and not allowed([*chosen, atom]):
                atom = (fallback or {}).get(atom)
                if atom is None or not allowed([*chosen, atom]):
                    continue
            value = score([*chosen, atom])
            if best_value is None or value > best_value:
                best, best_value = atom, value
        if best is None or best_value <= (current[0] + rule.min_gain, current[1]):
            break
        chosen.append(best)
        rows.append({"step": len(chosen), "layer": best.heads[0][0], "head": best.heads[0][1], "edit": best.label,
                     "value": best_value[0], "tiebreak": best_value[1], "gain": best_value[0] - current[0]})
        current = best_value
    table = pd.DataFrame(rows, columns=["step", "layer", "head", "edit", "value", "tiebreak", "gain"])
    table.attrs.update(baseline=base[0], metric=rule.metric, tiebreak=rule.tiebreak, atoms=chosen)
    return table


# ----------------------------------------------------------------------------------------------- the profile
@dataclass
class ProfileConfig:
    """How `profile` ranks heads."""

    metric: Metric = "logprob"  # what the exact effect measures (the estimate is always the log-probability)
    candidates: int | None = None  # profile exactly only the top-m heads by the estimate (None: every head)
    batch_size: int = 32  # samples per forward
    progress: bool = False  # tqdm bar over the heads profiled exactly

    def check(self, n_heads: int) -> None:
        """Validate the configuration for a model of `n_heads` heads; ValueError naming the field otherwise."""
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; choose one of {', '.join(METRICS)}")
        if self.candidates is not None and not 1 <= self.candidates <= n_heads:
            raise ValueError(f"candidates={self.candidates} must be in 1..{n_heads} (the number of heads)")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


def profile(
    model, tokenizer: Tokenizer, samples: Sequence[Sample], edit: Edit, cfg: ProfileConfig | None = None
) -> pd.DataFrame:
    """One row per head: estimate (attribution), estimate_rank, effect (exact; NaN where not profiled), effect_rank.

    Heads are profiled exactly in the order of the estimate, the top `cfg.candidates` of them (all by default).
    `.attrs` holds the edit, metric, baseline value and the Spearman correlation of estimate and effect over the
    heads profiled exactly (`spearman`, `spearman_p`; NaN with fewer than 3 heads or a constant column).
    """
    cfg = cfg or ProfileConfig()
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    cfg.check(n_layers * n_heads)
    batches = selection_batches(model, tokenizer, samples, cfg.batch_size)
    est = attribution(model, batches, edit)
    table = pd.DataFrame([{"layer": l, "head": h, "estimate": float(est[l, h])}
                          for l in range(n_layers) for h in range(n_heads)])
    table = _ranked(table, "estimate")
    m = cfg.candidates or len(table)
    picked = [(int(l), int(h)) for l, h in table.sort_values("estimate_rank")[["layer", "head"]].to_numpy()[:m]]
    effects = exact_effects(model, batches, edit, picked, cfg.metric, cfg.progress)
    table["effect"] = [effects.get((int(l), int(h)), float("nan")) for l, h in zip(table["layer"], table["head"])]
    table = _ranked(table, "effect")
    rho, p = spearman(table.estimate, table.effect)
    table.attrs.update(edit=edit.label, metric=cfg.metric, baseline=measure(model, batches, None, cfg.metric),
                       spearman=rho, spearman_p=p, n_profiled=len(picked), n_samples=len(list(samples)))
    return table


def _ranked(table: pd.DataFrame, col: str) -> pd.DataFrame:
    """Add `{col}_rank` (1 = largest; ties by layer, head; NaN rows last and unranked)."""
    order = table.sort_values([col, "layer", "head"], ascending=[False, True, True], kind="stable", na_position="last")
    ranks = pd.Series(range(1, len(order) + 1), index=order.index, dtype="Int64")
    ranks[order[col].isna()] = pd.NA
    return table.assign(**{f"{col}_rank": ranks})


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Spearman's rank correlation (scipy) over the pairs where both are defined; NaN when it is undefined."""
    both = pd.DataFrame({"x": list(x), "y": list(y)}).dropna()
    if len(both) < 3 or both.x.nunique() < 2 or both.y.nunique() < 2:
        return float("nan"), float("nan")
    res = stats.spearmanr(both.x, both.y)
    return float(res.statistic), float(res.pvalue)


def top_heads(table: pd.DataFrame, k: int, by: str = "effect") -> list[Head]:
    """The `k` best heads of a profile by `effect` or `estimate` (only heads with a value; ties by layer, head)."""
    if by not in ("effect", "estimate"):
        raise ValueError(f"by must be 'effect' or 'estimate', got {by!r}")
    order = table.dropna(subset=[by]).sort_values(f"{by}_rank")
    return [(int(l), int(h)) for l, h in order[["layer", "head"]].to_numpy()[:k]]


def compare_rankings(share: pd.DataFrame, prof: pd.DataFrame, delta: int = 0) -> pd.DataFrame:
    """The paper's attention-share ranking (`ranking.rank_heads`) beside the causal one, one row per head.

    Columns: layer, head, paper_rank (the paper's summed score at delta 0), score_sum, share (mass per target row
    on the references shifted by `delta`), share_rank, effect, effect_rank, estimate, estimate_rank; sorted by the
    causal ranking. `.attrs`: Spearman of the paper's score, and of the share at `delta`, with the measured effect.
    """
    col = f"score_row_d{delta}"
    if col not in share.columns:
        if delta:
            raise ValueError(f"the attention-share ranking has no offset {delta}: rank with deltas including {delta}")
        col = "score_row"
    left = share[["layer", "head", "rank", "score_sum", col]].rename(columns={"rank": "paper_rank", col: "share"})
    left = _ranked(left, "share")
    causal = prof[["layer", "head", "effect", "effect_rank", "estimate", "estimate_rank"]]
    out = left.merge(causal, on=["layer", "head"])
    out = out.sort_values(["effect_rank", "estimate_rank"], na_position="last", kind="stable").reset_index(drop=True)
    out.attrs.update(spearman_paper_vs_effect=spearman(out.score_sum, out.effect)[0],
                     spearman_share_vs_effect=spearman(out.share, out.effect)[0], delta=delta)
    return out


__all__ = [
    "METRICS", "Edit", "GreedyRule", "ProfileConfig", "atom_hooks", "attribution",
    "batch_metric", "compare_rankings", "exact_effects", "greedy_atoms", "greedy_select", "measure", "pattern_hooks",
    "profile", "selection_batches", "spearman", "top_heads",
]
