"""The figures and head views of an intervention run (`aspan demo`, `aspan pretrained`), written into a run directory.

Each function takes one small dataclass of what the run computed and writes `figures/*.json` (plotly, read by
`aspan report`) and `views/*.html` (circuitsvis). The pictures follow Spiegel et al. 2025: the rollout over an
OOD sample (Fig. 1), one head from ID to OOD lengths, AttnScore of correct vs wrong tokens (Table 3), the head
ranking and its offset scan (Appendix F), accuracy against length and against the reinforcement strength (Fig. 2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pandas as pd
import torch

import hooks

from ..batching import make_batch
from ..io import RunDir
from .figures import (
    accuracy_vs_length,
    accuracy_vs_strength,
    correct_vs_error,
    layer_head_heatmap,
    offset_heatmap,
    pattern_across_lengths,
    rollout_heatmap,
)
from .views import head_view, save_view

Head = tuple[int, int]


def ref_label(delta: int) -> str:
    """0 -> 'ref', 2 -> 'ref+2'."""
    return f"ref{delta:+d}" if delta else "ref"


def head_names(heads: Sequence[Head]) -> list[str]:
    """Heads as `LxHy` labels."""
    return [f"L{layer}H{head}" for layer, head in heads]


def token_strings(tokenizer, ids) -> list[str]:
    """Readable token labels (BOS, EOS and padding named)."""
    names = {getattr(tokenizer, "bos_id", None): "<bos>", tokenizer.eos_id: "<eos>", tokenizer.pad_id: "<pad>"}
    return [names.get(i) or tokenizer.decode([i]) or f"#{i}" for i in ids.tolist()]


def one_sample(model, tokenizer, sample, heads: Sequence[Head], edit: Callable | None = None):
    """(tokens, reference mask, target rows, rollout, {head: pattern}) for one sample, under an optional edit."""
    batch = make_batch([sample], tokenizer, n_ctx=model.cfg.n_ctx).to(model.cfg.device)
    user = edit(batch) if edit else []
    with model.hooks(fwd_hooks=user):
        roll = hooks.rollout(model, batch.tokens)[0].cpu()
    pats = hooks.capture(model, batch.tokens, heads, fwd_hooks=user)
    rows = torch.nonzero(batch.target_rows[0]).flatten().tolist()
    toks = token_strings(tokenizer, batch.tokens[0].cpu())
    return toks, batch.ref_mask[0].cpu(), rows, roll, {k: v[0].cpu() for k, v in pats.items()}


def pick(samples, which: str):
    """The shortest, median or longest sample (by text length; ties by position)."""
    by_len = sorted(range(len(samples)), key=lambda i: (len(samples[i].text), i))
    return samples[by_len[{"short": 0, "median": len(by_len) // 2, "long": -1}[which]]]


@dataclass
class AttentionViews:
    """What the attention pictures show: samples, the heads to view, the best offset's top heads, the edit."""

    model: Any
    tokenizer: Any
    id_samples: list
    ood_samples: list
    view_heads: list[Head]  # heads shown in the circuitsvis views
    top_head: Head  # the head followed from ID to OOD lengths
    d_star: int  # the offset that head serves best
    edit: Callable | None = None  # the chosen intervention (fwd_hooks of a batch); None: no edited views


def write_attention_views(run: RunDir, a: AttentionViews) -> None:
    """Rollout on an OOD sample (baseline and edited), head views, and one head from ID to OOD lengths."""
    sample = pick(a.ood_samples, "median")
    edits = [("baseline", "01_rollout_ood", None)] + ([("reinforced", "02_rollout_ood_reinforced", a.edit)]
                                                      if a.edit else [])
    if not a.edit:
        run.remove("figures/02_rollout_ood_reinforced.json")
        run.remove("views/ood_sample_reinforced.html")
    for kind, name, edit in edits:
        toks, mask, rows, roll, pats = one_sample(a.model, a.tokenizer, sample, a.view_heads, edit)
        fig = rollout_heatmap(roll, mask, toks, rows=rows, cols=range(rows[-1] + 1),
                              title=f"Attention rollout on an OOD sample ({kind}); red: reference positions")
        run.figure(fig, name)
        save_view(head_view(torch.stack(list(pats.values())), toks, head_names(pats)),
                  run / f"views/ood_sample_{kind}.html")
    toks, _, _, _, pats = one_sample(a.model, a.tokenizer, pick(a.id_samples, "long"), a.view_heads)
    save_view(head_view(torch.stack(list(pats.values())), toks, head_names(pats)),
              run / "views/id_sample_baseline.html")
    panels = []
    for label, s in (("ID, longest", pick(a.id_samples, "long")), ("OOD, shortest", pick(a.ood_samples, "short")),
                     ("OOD, longest", pick(a.ood_samples, "long"))):
        _, mask, _, _, pats = one_sample(a.model, a.tokenizer, s, [a.top_head])
        panels.append((f"{label} ({len(s.target)} target chars)", pats[a.top_head], mask))
    layer, head = a.top_head
    run.figure(pattern_across_lengths(panels, title=f"Head L{layer}H{head} (best at {ref_label(a.d_star)}) from ID "
                                                    "to OOD; red: references"), "03_head_across_lengths")


@dataclass
class RankingFigures:
    """The head ranking of a run: the long offset table, the wide ranking and the best offset."""

    offsets: pd.DataFrame  # layer, head, delta, score_row
    table: pd.DataFrame  # ranking_from_offsets
    n_layers: int
    n_heads: int
    d_star: int = 0
    title: str = "ID"  # what the ranking was computed on, for the titles
    prefix: str = ""  # figure-name prefix


def offset_cube(offsets: pd.DataFrame, deltas: Sequence[int], n_layers: int, n_heads: int) -> torch.Tensor:
    """[delta, layer, head] of `score_row` from the long offset table (one pivot for every figure)."""
    wide = offsets.pivot_table(index="delta", columns=["layer", "head"], values="score_row").loc[list(deltas)]
    return torch.tensor(wide.to_numpy()).reshape(len(deltas), n_layers, n_heads)


def write_ranking_figures(run: RunDir, r: RankingFigures, names: Sequence[str]) -> None:
    """The offset scan (when several offsets), the ranking heatmap, and the ranking at the best offset.

    `names`: the figure names for (offset scan, heads at ref, heads at the best offset).
    """
    deltas = sorted(r.offsets.delta.unique())
    if len(deltas) > 1:
        order = [(int(layer), int(head)) for layer, head in
                 r.table.sort_values(f"score_row_d{r.d_star}", ascending=False)[["layer", "head"]].to_numpy()]
        cube = offset_cube(r.offsets, deltas, r.n_layers, r.n_heads)
        run.figure(offset_heatmap(cube, deltas, order[:20] if len(order) > 20 else order,
                                  title=f"{r.title}: attention per target row on references shifted by δ"), names[0])
    run.figure(layer_head_heatmap(r.table, value="score_row", zlabel="mass/row",
                                  title=f"Head ranking on {r.title}: attention on the references (per row)"), names[1])
    if r.d_star:
        run.figure(layer_head_heatmap(r.table, value=f"score_row_d{r.d_star}", zlabel="mass/row",
                                      title=f"Head ranking on {r.title}: attention on {ref_label(r.d_star)}"), names[2])
    else:  # a rerun into the same directory must not leave a stale figure behind
        run.remove(f"figures/{names[2]}.json")


@dataclass
class AccuracyFigures:
    """Accuracy curves of a run: per-length tables per condition, the sweep rows and its baseline."""

    curves: dict[str, pd.DataFrame]  # condition -> summarize(...) over ID and OOD lengths
    sweep: pd.DataFrame  # strength, partial, and the grouping columns
    group: list[str] | str  # how sweep lines are grouped
    sweep_baseline: float  # per-token accuracy without intervention on the sweep's set
    id_max: int | None = None  # longest ID length (marks the ID/OOD boundary)
    title: str = ""  # title prefix
    cve: dict = field(default_factory=dict)  # label -> correct_vs_error statistics (Table 3)


def write_accuracy_figures(run: RunDir, a: AccuracyFigures, names: Sequence[str]) -> None:
    """Correct vs wrong AttnScore, accuracy vs length, accuracy vs strength (names in that order)."""
    if a.cve:
        run.figure(correct_vs_error(a.cve, title=f"{a.title}AttnScore of correct vs wrong tokens (Welch's t-test)"),
                   names[0])
    run.figure(accuracy_vs_length(a.curves, y="partial", id_max=a.id_max,
                                  title=f"{a.title}per-token accuracy vs target length (teacher-forced)"), names[1])
    if not a.sweep.empty:
        run.figure(accuracy_vs_strength(a.sweep, group=a.group, baseline=a.sweep_baseline,
                                        title=f"{a.title}OOD per-token accuracy vs reinforcement strength "
                                              "(selection set)"), names[2])
