"""`aspan rank MODEL --task T`: rank heads by attention on reference tokens over ID samples (paper Appendix F).

`--by effect` ranks them causally instead (PASTA's model profiling, Zhang et al. 2023): the measured effect of an
attention edit applied to each head alone on a profiling set (OOD by default), with the attribution-patching
estimate (Nanda 2023; Syed et al. 2023) beside it, and a table that puts both rankings side by side.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aspan.options import CONVENTIONS, EDIT_METHODS, PROFILE_METRICS, RANK_BY

from .argtypes import device, finite_float, nonneg_int, output_dir, positive_float, positive_int

RUN_DIR = "out"  # held for the job by the dispatcher (one job per run directory)
HELP = "rank attention heads by their attention on reference tokens (default) or by the causal effect of an edit"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="aspan checkpoint dir, HF checkpoint dir, .gguf file, or 'smollm2'")
    p.add_argument("--task", required=True, help="task name (see `aspan data --list`)")
    p.add_argument("--any-task", action="store_true",
                   help="rank a model's heads on another task than the one it was trained on (refused otherwise)")
    p.add_argument("--split", default="id", choices=("id", "ood"), help="preset the samples come from (default: id)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="override a task parameter")
    p.add_argument("-n", "--samples", type=positive_int, default=64, help="number of samples (default 64)")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--deltas", default="0", help="key offsets to scan, e.g. --deltas=-2..3 or 0,1,2 (default 0)")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--top", type=positive_int, help="select the top N heads")
    sel.add_argument("--fraction", type=positive_float, help="select the top fraction of heads (paper: 0.1)")
    p.add_argument("--by", default="score_sum", choices=RANK_BY,
                   help="ranking for selection: the paper's attention share (score_sum, score_row; default) or the "
                        "causal effect of an edit on each head alone (effect) or its first-order estimate (estimate)")
    p.add_argument("--convention", default="sample", choices=CONVENTIONS,
                   help="AttnScore convention of the attention share: sample (default, the paper's public code: mass "
                        "on the references over the mass on the sample's own columns) or raw (over the whole row)")
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--device", type=device, default=None)
    p.add_argument("--out", type=output_dir, default="runs/rank", help="run directory (default runs/rank)")
    p.add_argument("--no-progress", action="store_true")
    c = p.add_argument_group("causal ranking (--by effect / estimate)")
    c.add_argument("--method", default="reinforce", choices=EDIT_METHODS, help="the edit")
    c.add_argument("--delta", type=int, default=0, help="key offset of the edit's references (default 0)")
    c.add_argument("--strength", type=finite_float, default=None,
                   help="reinforce: C (default 1); steer: alpha (default 0.01)")
    c.add_argument("--renormalize", action="store_true", help="reinforce: renormalise edited rows")
    c.add_argument("--metric", default="logprob", choices=PROFILE_METRICS,
                   help="what the exact effect measures (default: mean target log-probability)")
    c.add_argument("--candidates", type=positive_int, default=None, metavar="M",
                   help="profile exactly only the top M heads by the attribution estimate (default: all)")
    c.add_argument("--greedy", type=positive_int, default=None, metavar="K",
                   help="also greedy forward selection of <= K heads")
    c.add_argument("--profile-split", default="ood", choices=("id", "ood"), help="preset of the profiling set")
    c.add_argument("--profile-param", action="append", default=[], metavar="KEY=VALUE",
                   help="override a parameter of the profiling preset (e.g. length=11-20)")


def parse_deltas(text: str) -> list[int]:
    """`-2..3` -> [-2, ..., 3]; `0,2` -> [0, 2]."""
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split(".."))
            if hi < lo:
                raise ValueError
            return list(range(lo, hi + 1))
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--deltas must look like -2..3 or 0,1,2, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from aspan import tasks
    from aspan.commands.data import parse_params
    from aspan.environment import run_environment
    from aspan.experiments.ranking import n_selected, offset_table, ranking_from_offsets, select_heads
    from aspan.io import write_json

    # validate everything before loading the model
    params = parse_params(args.task, args.param)
    task = tasks.preset(args.task, args.split, **params)
    deltas = list(dict.fromkeys([0, *parse_deltas(args.deltas)]))
    if args.samples < 1 or args.batch_size < 1:
        raise ValueError("--samples and --batch-size must be >= 1")
    if args.fraction is not None and not 0 < args.fraction <= 1:
        raise ValueError(f"--fraction must be in (0, 1], got {args.fraction}")
    if args.top is not None and args.top < 1:
        raise ValueError(f"--top must be >= 1, got {args.top}")
    causal = _causal_setup(args, deltas) if args.by in ("effect", "estimate") else None

    from aspan import models
    from aspan.checks import check_offsets

    check_offsets(deltas, task.max_text_len() + 1, "--deltas")
    if not args.any_task:  # from the checkpoint's metadata, before loading it
        from aspan.models.checkpoint import saved_task
        from aspan.models.trained import check_task

        check_task(saved_task(args.model), [(t.name, t.params()) for t in (task, *(causal[1:2] if causal else ()))],
                   f"--task {args.task}", "pass --any-task to rank it anyway")
    model, tokenizer, _ = models.load(args.model, device=args.device)
    models.check_context(model, task, tokenizer.offset)
    if causal:
        models.check_context(model, causal[1], tokenizer.offset)
        causal[2].check(model.cfg.n_layers * model.cfg.n_heads)
    if args.top is not None:
        n_selected(model.cfg.n_layers * model.cfg.n_heads, top=args.top)
    samples = task.generate(args.samples, seed=args.seed)
    long = offset_table(model, tokenizer, samples, deltas, args.batch_size, progress=not args.no_progress,
                        convention=args.convention)
    ranking = ranking_from_offsets(long)

    out = Path(args.out)
    _write_share(args, out, ranking, long, len(deltas) > 1)
    extra: dict = {}
    by_table = ranking
    if causal:
        by_table, extra = _causal(args, model, tokenizer, ranking, causal, out)
    selected = None
    if args.top is not None or args.fraction is not None:
        selected = select_heads(by_table, top=args.top, fraction=args.fraction, by=args.by)
    write_json(out / "run.json", {
        "command": "rank", "model": str(args.model), "task": args.task, "split": args.split, "params": task.params(),
        "samples": args.samples, "seed": args.seed, "deltas": deltas, "convention": args.convention,
        **run_environment(model),
    })
    tables = {"head ranking (top 10)": ranking[SHARE_COLS].head(10).to_dict("records"), **extra.pop("tables", {})}
    write_json(out / "summary.json", {"selected_heads": [list(h) for h in selected] if selected else None,
                                      "by": args.by, "convention": args.convention, **extra, "tables": tables})
    if causal:
        _print_causal(tables["rankings compared"], extra)
    else:
        print(ranking[SHARE_COLS].head(10).to_string(index=False))
    if selected:
        print("selected heads:", " ".join(f"{l}.{h}" for l, h in selected))
    print(f"wrote {out / 'ranking.csv'}", file=sys.stderr)
    return 0


SHARE_COLS = ["rank", "layer", "head", "score_sum", "score_row", "best_delta", "best_delta_score", "convention"]


def _write_share(args: argparse.Namespace, out: Path, ranking, long, offsets: bool) -> None:
    """The attention-share ranking: CSV, JSONL, the offset scan and heatmaps."""
    from aspan.experiments.ranking import heatmap, offset_heatmap
    from aspan.io import RunDir

    run = RunDir(out)
    run.write_csv("ranking.csv", ranking)
    run.records("ranking.jsonl", ranking, double_precision=15)
    if offsets:
        run.write_csv("offsets.csv", long)
        run.figure(offset_heatmap(long), "ranking_offsets")
    where = f"{args.task} ({args.split}), AttnScore convention {args.convention}"
    run.figure(heatmap(ranking, "score_sum", f"Head ranking on {where}: attention on references, summed"),
               "ranking_sum")
    run.figure(heatmap(ranking, "score_row", f"Head ranking on {where}: mean per target row"), "ranking_row")


def _causal_setup(args: argparse.Namespace, deltas: list[int]):
    """(edit, profiling task, profile config) from the arguments, checked before the model loads."""
    from aspan import tasks
    from aspan.commands.data import parse_params
    from aspan.experiments.profiling import Edit, ProfileConfig

    try:  # no --strength: the method's default (reinforce C 1, steer alpha 0.01; patch takes none)
        edit = Edit(args.method, delta=args.delta, strength=args.strength, renormalize=args.renormalize)
    except ValueError as e:
        strength = "" if args.strength is None else f" --strength {args.strength:g}"
        raise ValueError(f"--method {args.method}{strength} --delta {args.delta}: {e}") from None
    params = parse_params(args.task, [*args.param, *args.profile_param])
    prof_task = tasks.preset(args.task, args.profile_split, **params)
    if args.candidates is not None and args.candidates < 1:
        raise ValueError(f"--candidates must be >= 1, got {args.candidates}")
    if args.greedy is not None and args.greedy < 1:
        raise ValueError(f"--greedy must be >= 1, got {args.greedy}")
    if args.delta not in deltas:
        deltas.append(args.delta)  # the attention share at the edit's offset goes beside the causal ranking
    cfg = ProfileConfig(metric=args.metric, candidates=args.candidates, batch_size=args.batch_size,
                        progress=not args.no_progress)
    return edit, prof_task, cfg


def _causal(args: argparse.Namespace, model, tokenizer, ranking, setup, out: Path):
    """Profile the heads, write profile.csv, rankings_compared.csv and figures; (table to select by, summary extra)."""
    from aspan.experiments import profiling
    from aspan.experiments.ranking import heatmap
    from aspan.io import RunDir

    run = RunDir(out)
    edit, prof_task, cfg = setup
    samples = prof_task.generate(args.samples, seed=args.seed + 1)  # not the samples the attention share saw
    prof = profiling.profile(model, tokenizer, samples, edit, cfg)
    compared = profiling.compare_rankings(ranking, prof, delta=edit.delta)
    run.write_csv("profile.csv", prof)
    run.write_csv("rankings_compared.csv", compared)
    for col in ("effect", "estimate"):
        if prof[col].notna().any():
            run.figure(heatmap(prof, col, f"Causal head ranking: {col} of '{edit.label}' on each head alone "
                                           f"({args.profile_split}, {cfg.metric if col == 'effect' else 'logprob'})"),
                       f"ranking_{col}")
    extra = {"edit": edit.label, "metric": cfg.metric, "profile_split": args.profile_split,
             "profile_params": prof_task.params(), "baseline": prof.attrs["baseline"],
             "spearman_estimate_vs_effect": prof.attrs["spearman"], **compared.attrs,
             "tables": {"rankings compared": compared.head(10).to_dict("records")}}
    if args.greedy:
        batches = profiling.selection_batches(model, tokenizer, samples, cfg.batch_size)
        pool = profiling.top_heads(prof, len(prof), by="effect" if prof.effect.notna().any() else "estimate")
        chosen = profiling.greedy_select(model, batches, edit, pool, args.greedy, cfg.metric)
        run.write_csv("greedy.csv", chosen)
        extra["greedy_heads"] = [[int(l), int(h)] for l, h in zip(chosen.layer, chosen["head"])]
    return prof, extra


def _print_causal(rows: list[dict], extra: dict) -> None:
    import pandas as pd

    print(f"edit: {extra['edit']} | metric: {extra['metric']} | baseline {extra['baseline']:.4f}")
    cols = ["layer", "head", "effect_rank", "effect", "estimate_rank", "estimate", "paper_rank", "share_rank", "share"]
    print(pd.DataFrame(rows)[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"Spearman: estimate vs effect {extra['spearman_estimate_vs_effect']:.3f}; paper's attention share vs "
          f"effect {extra['spearman_paper_vs_effect']:.3f}; share at the edit's offset vs effect "
          f"{extra['spearman_share_vs_effect']:.3f}")
    if "greedy_heads" in extra:
        print("greedy selection:", " ".join(f"{l}.{h}" for l, h in extra["greedy_heads"]))
