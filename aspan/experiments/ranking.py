"""Head ranking: attention on reference tokens over ID samples, per head and key offset.

The paper's ranking is Spiegel et al. 2025, §5.2 and Appendix F.

`score_sum` is the paper's score (post-softmax mass on references summed over target rows and samples);
`score_row` the mean per target row (a fraction, not biased towards long samples). The offset scan scores every
head on references shifted by delta (column k+delta) and reports the offset each head serves best.

Both scores come in one of the two AttnScore conventions (Spiegel et al. 2025, Appendix B; `aspan.options`):
`sample` divides each row's mass on the references by its mass on the sample's own columns
(`Batch.sample_columns`: BOS, instruction and few-shot columns left out, as the paper's public code does), `raw`
by the whole row. Every table carries the convention in a `convention` column.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence, TypedDict, Unpack

import pandas as pd
import plotly.graph_objects as go
import torch
from tqdm.auto import tqdm

import hooks

from .. import stopping
from ..batching import make_batch
from ..checks import check_offsets, check_samples
from ..models.fit import check_fit, of_samples
from ..options import CONVENTIONS, Convention, RankKey
from ..tasks.base import Sample
from ..tokenization import Tokenizer, require_tokenizer


class ScanSettings(TypedDict, total=False):
    """The optional keywords of `offset_table` and `rank_heads` (their defaults: `SCAN_DEFAULTS`)."""

    progress: bool  # a progress bar over the batches
    convention: Convention  # the AttnScore convention of every score, "sample" or "raw" (module docstring)


SCAN_DEFAULTS: ScanSettings = {"progress": False, "convention": "sample"}


def scan_settings(settings: dict, where: str) -> ScanSettings:
    """`SCAN_DEFAULTS` with `settings` over them; TypeError naming an unknown keyword (`where`: the function)."""
    for key in settings:
        if key not in SCAN_DEFAULTS:
            raise TypeError(f"{where}() got an unexpected keyword argument {key!r} (known: progress, convention)")
    return {**SCAN_DEFAULTS, **settings}


@torch.no_grad()
def offset_table(
    model,
    tokenizer: Tokenizer,
    samples: Sequence[Sample],
    deltas: Iterable[int] = (0,),
    batch_size: int = 32,
    **settings: Unpack[ScanSettings],
) -> pd.DataFrame:
    """Long table (layer, head, delta, score_sum, score_row, n_rows, convention): per-head mass on references
    shifted by each delta (`settings`: `progress`, `convention`; `ScanSettings`).

    Sums are accumulated over batches; `score_row = score_sum / n_rows` with `n_rows` the (unshifted) target rows
    that have references, i.e. exactly `hooks.head_scores(..., reduce="row", columns=...)` over all samples at once,
    with `columns = Batch.sample_columns` for the `sample` convention and None (the whole row) for `raw`.
    """
    settings = scan_settings(settings, "offset_table")
    convention, progress = settings["convention"], settings["progress"]
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {', '.join(CONVENTIONS)}, got {convention!r}")
    samples, deltas = list(samples), list(deltas)
    if not samples:
        raise ValueError("no samples to rank heads on")
    check_samples(samples, "rank heads")
    check_fit(model, tokenizer, of_samples(samples), "rank heads")  # before any forward
    longest = max(tokenizer.offset + len(s.text) + (tokenizer.eos_id is not None) for s in samples)
    deltas = list(dict.fromkeys(check_offsets(deltas, longest, "deltas")))  # as the command line refuses them
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    cfg = model.cfg
    sums = torch.zeros(len(deltas), cfg.n_layers, cfg.n_heads, dtype=torch.float64)
    n_rows = 0
    starts = range(0, len(samples), batch_size)
    for i in tqdm(starts, desc="rank heads", disable=not progress, leave=False):
        stopping.check()  # a safe point between batches
        batch = make_batch(samples[i : i + batch_size], tokenizer, n_ctx=cfg.n_ctx).to(cfg.device)
        rows = hooks.target_rows(batch.ref_mask, batch.attention_mask)
        if not bool(rows.any()):
            continue  # no references in this batch (e.g. only empty-reference targets)
        columns = batch.sample_columns if convention == "sample" else None
        s = hooks.offset_scores(
            model, batch.tokens, batch.ref_mask, deltas, attention_mask=batch.attention_mask, reduce="sum",
            columns=columns,
        )
        sums += s.double().cpu()
        n_rows += int(rows.sum())
    if n_rows == 0:
        raise ValueError("the samples have no target row with references: nothing to rank")
    out = []
    for di, d in enumerate(deltas):
        for layer in range(cfg.n_layers):
            for head in range(cfg.n_heads):
                v = float(sums[di, layer, head])
                row = {"layer": layer, "head": head, "delta": d, "score_sum": v, "score_row": v / n_rows}
                out.append({**row, "n_rows": n_rows, "convention": convention})
    return pd.DataFrame(out)


def rank_heads(
    model,
    tokenizer: Tokenizer,
    samples: Sequence[Sample],
    deltas: Iterable[int] = (0,),
    batch_size: int = 32,
    **settings: Unpack[ScanSettings],
) -> pd.DataFrame:
    """One row per head: layer, head, score_sum, score_row (delta 0), best_delta, best_delta_score (by score_row), rank,
    convention.

    `rank` orders heads by score_sum at delta 0 (1 = best; ties broken by layer, head). Also one column
    `score_row_d{delta}` per scanned delta. `settings`: `progress`, and `convention`, the AttnScore convention of every
    score (module docstring; `ScanSettings`).
    """
    require_tokenizer(tokenizer, "rank_heads: tokenizer")
    deltas = list(dict.fromkeys([0, *(int(d) for d in deltas)]))
    long = offset_table(model, tokenizer, samples, deltas, batch_size, **scan_settings(settings, "rank_heads"))
    return ranking_from_offsets(long)


def ranking_from_offsets(long: pd.DataFrame) -> pd.DataFrame:
    """The `rank_heads` table from an `offset_table` (which must contain delta 0)."""
    if not (long.delta == 0).any():
        raise ValueError("the offset table has no delta 0")
    base = long[long.delta == 0].set_index(["layer", "head"])[["score_sum", "score_row"]]
    wide = long.pivot(index=["layer", "head"], columns="delta", values="score_row")
    best = wide.idxmax(axis=1)  # first maximum: the smallest delta wins a tie (columns sorted)
    table = base.assign(
        best_delta=best.astype(int),
        best_delta_score=wide.max(axis=1),
        **{f"score_row_d{d}": wide[d] for d in wide.columns},
    ).reset_index()
    table = table.sort_values(["score_sum", "layer", "head"], ascending=[False, True, True], kind="stable")
    table["rank"] = range(1, len(table) + 1)
    if "convention" in long.columns:  # offset tables written before conventions existed have none
        conventions = long.convention.unique()
        if len(conventions) != 1:
            raise ValueError(f"the offset table mixes AttnScore conventions {sorted(conventions)}")
        table["convention"] = conventions[0]
    return table.reset_index(drop=True)


def n_selected(n_total: int, top: int | None = None, fraction: float | None = None) -> int:
    """How many heads `top` / `fraction` select out of `n_total` (a fraction rounds up, at least one)."""
    if (top is None) == (fraction is None):
        raise ValueError("give exactly one of top or fraction")
    if top is not None:
        if top < 1 or top > n_total:
            raise ValueError(f"top={top} must be in 1..{n_total} (the number of heads)")
        return int(top)
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction} must be in (0, 1]")
    return max(1, math.ceil(fraction * n_total - 1e-9))


def select_heads(
    ranking: pd.DataFrame, top: int | None = None, fraction: float | None = None, by: RankKey | str = "score_sum"
) -> list[tuple[int, int]]:
    """The best `top` heads, or the best `fraction` of them, by `by` (descending; ties by layer, head).

    `by` is a `RankKey` or an offset column `score_row_d{delta}` of the ranking.
    """
    if by not in ranking.columns:
        raise ValueError(
            f"ranking has no column {by!r}; choose one of "
            f"{', '.join(c for c in ranking.columns if c.startswith('score'))}"
        )
    k = n_selected(len(ranking), top, fraction)
    order = ranking.sort_values([by, "layer", "head"], ascending=[False, True, True], kind="stable")
    return [(int(l), int(h)) for l, h in zip(order["layer"][:k], order["head"][:k])]


def heatmap(ranking: pd.DataFrame, value: str = "score_sum", title: str | None = None) -> go.Figure:
    """Layer x head heatmap of one ranking column (plotly); the default title names the AttnScore convention."""
    grid = ranking.pivot(index="layer", columns="head", values=value).sort_index().sort_index(axis=1)
    fig = go.Figure(go.Heatmap(
        z=grid.values, x=[str(h) for h in grid.columns], y=[str(l) for l in grid.index],
        colorscale="Viridis", colorbar={"title": value},
        hovertemplate="layer %{y}, head %{x}: %{z:.4g}<extra></extra>",
    ))
    fig.update_layout(
        title=title or f"Head ranking: {value}{_named(ranking)}", xaxis_title="head", yaxis_title="layer",
        yaxis={"autorange": "reversed", "type": "category"}, xaxis={"type": "category"},
    )
    return fig


def offset_heatmap(long: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Heads x delta heatmap of the mean mass per row on references shifted by delta (offset scan)."""
    wide = long.pivot(index=["layer", "head"], columns="delta", values="score_row").sort_index().sort_index(axis=1)
    labels = [f"L{l}H{h}" for l, h in wide.index]
    fig = go.Figure(go.Heatmap(
        z=wide.values, x=[str(d) for d in wide.columns], y=labels, colorscale="Viridis",
        colorbar={"title": "mass/row"}, hovertemplate="%{y}, delta %{x}: %{z:.3f}<extra></extra>",
    ))
    fig.update_layout(
        title=title or f"Attention on references shifted by delta (mean per target row){_named(long)}",
        xaxis_title="key offset delta", yaxis_title="head", yaxis={"autorange": "reversed", "type": "category"},
        xaxis={"type": "category"},
    )
    return fig


def _named(table: pd.DataFrame) -> str:
    """`" (AttnScore convention: sample)"` for a table that carries its convention, else ""."""
    if "convention" not in table.columns or table.empty:
        return ""
    return f" (AttnScore convention: {table.convention.iloc[0]})"
