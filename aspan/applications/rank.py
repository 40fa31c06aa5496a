"""`aspan rank` as a function a notebook can call: rank a model's heads by their attention on reference tokens
(Spiegel et al. 2025, Appendix F), or causally by the effect of an attention edit on each head alone (PASTA's model
profiling, Zhang et al. 2023) with the attribution-patching estimate (Nanda 2023; Syed et al. 2023) beside it,
into a run directory.

    from aspan.applications.rank import RankConfig, rank_heads
    summary = rank_heads(RankConfig("reversal", "reversal", top=4, out="runs/rank"))
"""
from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from .. import models, tasks
from ..checks import check_offsets
from ..environment import run_environment
from ..experiments import profiling
from ..experiments.profiling import ProfileConfig
from ..experiments.ranking import heatmap, n_selected, offset_heatmap, offset_table, ranking_from_offsets, select_heads
from ..io import RunDir, claim_run, write_json
from ..models.checkpoint import saved_task
from ..models.trained import check_task
from .settings import CAUSAL, RankConfig  # its settings, apart so that the command line imports them light
from .settings import Edit as Edit  # the causal ranking's edit, importable here as before

SHARE_COLS = ["rank", "layer", "head", "score_sum", "score_row", "best_delta", "best_delta_score", "convention"]


logger = logging.getLogger(__name__)


def check_rank(cfg: RankConfig):
    """Everything that can be checked before the model loads; (task, deltas, profiling task or None, profile
    config or None). ValueError naming the flag otherwise."""
    cfg.check()
    task = tasks.preset(cfg.task, cfg.split, **cfg.params)
    deltas = list(dict.fromkeys([0, *cfg.deltas]))
    prof_task = prof_cfg = None
    if cfg.by in CAUSAL:
        prof_task = tasks.preset(cfg.task, cfg.profile_split, **cfg.profile_params)
        if cfg.edit.delta not in deltas:
            deltas.append(cfg.edit.delta)  # the attention share at the edit's offset goes beside the causal ranking
        prof_cfg = ProfileConfig(metric=cfg.metric, candidates=cfg.candidates, batch_size=cfg.batch_size,
                                 progress=cfg.progress)
    check_offsets(deltas, task.max_text_len() + 1, "--deltas")
    if not cfg.any_task:  # from the checkpoint's metadata, before loading it
        check_task(saved_task(cfg.model), [(t.name, t.params()) for t in (task, prof_task) if t is not None],
                   f"--task {cfg.task}", "pass --any-task to rank it anyway")
    return task, deltas, prof_task, prof_cfg


def rank_heads(cfg: RankConfig) -> dict:
    """Rank the heads into run directory `cfg.out` (ranking.csv/jsonl, heatmaps, with a causal ranking profile.csv
    and rankings_compared.csv, run.json, summary.json), holding it for this job throughout (`claim_run`); the summary
    (`format_summary` writes its top of the ranking as text)."""
    with claim_run(cfg.out):
        return _rank_heads(cfg)


def _rank_heads(cfg: RankConfig) -> dict:
    task, deltas, prof_task, prof_cfg = check_rank(cfg)
    model, tokenizer, _ = models.load(cfg.model, device=cfg.device, dtype=cfg.dtype)
    models.check_context(model, task, tokenizer.offset)
    if prof_task is not None:
        models.check_context(model, prof_task, tokenizer.offset)
        prof_cfg.check(model.cfg.n_layers * model.cfg.n_heads)
    if cfg.top is not None:
        n_selected(model.cfg.n_layers * model.cfg.n_heads, top=cfg.top)
    samples = task.generate(cfg.samples, seed=cfg.seed)
    long = offset_table(model, tokenizer, samples, deltas, cfg.batch_size, progress=cfg.progress,
                        convention=cfg.convention)
    ranking = ranking_from_offsets(long)
    out = Path(cfg.out)
    _write_share(cfg, out, ranking, long, len(deltas) > 1)
    extra: dict = {}
    by_table = ranking
    if prof_task is not None:
        by_table, extra = _causal(cfg, model, tokenizer, ranking, (prof_task, prof_cfg), out)
    selected = None
    if cfg.top is not None or cfg.fraction is not None:
        selected = select_heads(by_table, top=cfg.top, fraction=cfg.fraction, by=cfg.by)
    write_json(out / "run.json", {
        "command": "rank", "model": str(cfg.model), "task": cfg.task, "split": cfg.split, "params": task.params(),
        "samples": cfg.samples, "seed": cfg.seed, "deltas": deltas, "convention": cfg.convention,
        **run_environment(model),
    })
    tables = {"head ranking (top 10)": ranking[SHARE_COLS].head(10).to_dict("records"), **extra.pop("tables", {})}
    summary = {"selected_heads": [list(h) for h in selected] if selected else None, "by": cfg.by,
               "convention": cfg.convention, **extra, "tables": tables}
    write_json(out / "summary.json", summary)
    logger.info("wrote %s", out / "ranking.csv")
    return summary


def format_summary(summary: dict) -> str:
    """What `aspan rank` prints: the top of the ranking (with a causal ranking: the rankings compared and their
    agreement) and the selected heads."""
    tables = summary["tables"]
    if "rankings compared" in tables:
        lines = _causal_lines(tables["rankings compared"], summary)
    else:
        lines = [pd.DataFrame(tables["head ranking (top 10)"])[SHARE_COLS].to_string(index=False)]
    if summary["selected_heads"]:
        lines.append("selected heads: " + " ".join(f"{l}.{h}" for l, h in summary["selected_heads"]))
    return "\n".join(lines)


def _write_share(cfg: RankConfig, out: Path, ranking, long, offsets: bool) -> None:
    """The attention-share ranking: CSV, JSONL, the offset scan and heatmaps."""
    run = RunDir(out)
    run.write_csv("ranking.csv", ranking)
    run.records("ranking.jsonl", ranking, double_precision=15)
    if offsets:
        run.write_csv("offsets.csv", long)
        run.figure(offset_heatmap(long), "ranking_offsets")
    where = f"{cfg.task} ({cfg.split}), AttnScore convention {cfg.convention}"
    run.figure(heatmap(ranking, "score_sum", f"Head ranking on {where}: attention on references, summed"),
               "ranking_sum")
    run.figure(heatmap(ranking, "score_row", f"Head ranking on {where}: mean per target row"), "ranking_row")


def _causal(cfg: RankConfig, model, tokenizer, ranking, setup, out: Path):
    """Profile the heads, write profile.csv, rankings_compared.csv and figures; (table to select by, summary extra)."""
    run = RunDir(out)
    edit, (prof_task, prof_cfg) = cfg.edit, setup
    samples = prof_task.generate(cfg.samples, seed=cfg.seed + 1)  # not the samples the attention share saw
    prof = profiling.profile(model, tokenizer, samples, edit, prof_cfg)
    compared = profiling.compare_rankings(ranking, prof, delta=edit.delta)
    run.write_csv("profile.csv", prof)
    run.write_csv("rankings_compared.csv", compared)
    for col in CAUSAL:
        if prof[col].notna().any():
            metric = prof_cfg.metric if col == "effect" else "logprob"
            run.figure(heatmap(prof, col, f"Causal head ranking: {col} of '{edit.label}' on each head alone "
                                           f"({cfg.profile_split}, {metric})"), f"ranking_{col}")
    extra = {"edit": edit.label, "metric": prof_cfg.metric, "profile_split": cfg.profile_split,
             "profile_params": prof_task.params(), "baseline": prof.attrs["baseline"],
             "spearman_estimate_vs_effect": prof.attrs["spearman"], **compared.attrs,
             "tables": {"rankings compared": compared.head(10).to_dict("records")}}
    if cfg.greedy:
        batches = profiling.selection_batches(model, tokenizer, samples, prof_cfg.batch_size)
        pool = profiling.top_heads(prof, len(prof), by="effect" if prof.effect.notna().any() else "estimate")
        chosen = profiling.greedy_select(model, batches, edit, pool, cfg.greedy, prof_cfg.metric)
        run.write_csv("greedy.csv", chosen)
        extra["greedy_heads"] = [[int(l), int(h)] for l, h in zip(chosen.layer, chosen["head"])]
    return prof, extra


def _causal_lines(rows: list[dict], extra: dict) -> list[str]:
    cols = ["layer", "head", "effect_rank", "effect", "estimate_rank", "estimate", "paper_rank", "share_rank", "share"]
    lines = [f"edit: {extra['edit']} | metric: {extra['metric']} | baseline {extra['baseline']:.4f}",
             pd.DataFrame(rows)[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"),
             f"Spearman: estimate vs effect {extra['spearman_estimate_vs_effect']:.3f}; paper's attention share vs "
             f"effect {extra['spearman_paper_vs_effect']:.3f}; share at the edit's offset vs effect "
             f"{extra['spearman_share_vs_effect']:.3f}"]
    if "greedy_heads" in extra:
        lines.append("greedy selection: " + " ".join(f"{l}.{h}" for l, h in extra["greedy_heads"]))
    return lines
