"""`aspan rank MODEL --task T`: rank heads by attention on reference tokens over ID samples (paper Appendix F)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "rank attention heads by their attention on reference tokens over ID samples (table + layer x head heatmap)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="aspan checkpoint dir, HF checkpoint dir, .gguf file, or 'smollm2'")
    p.add_argument("--task", required=True, help="task name (see `aspan data --list`)")
    p.add_argument("--split", default="id", choices=("id", "ood"), help="preset the samples come from (default: id)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="override a task parameter")
    p.add_argument("-n", "--samples", type=int, default=64, help="number of samples (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deltas", default="0", help="key offsets to scan, e.g. --deltas=-2..3 or 0,1,2 (default 0)")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--top", type=int, help="select the top N heads")
    sel.add_argument("--fraction", type=float, help="select the top fraction of heads (paper: 0.1)")
    p.add_argument("--by", default="score_sum", choices=("score_sum", "score_row"), help="ranking column for selection")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default=None)
    p.add_argument("--out", default="runs/rank", help="run directory (default runs/rank)")
    p.add_argument("--no-progress", action="store_true")


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
    from aspan.experiments.ranking import heatmap, n_selected, offset_heatmap, offset_table, ranking_from_offsets, select_heads
    from aspan.experiments.store import save_figure, versions, write_json, write_text

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

    from aspan import models

    model, tokenizer, _ = models.load(args.model, device=args.device)
    models.check_context(model, task, tokenizer.offset)
    if args.top is not None:
        n_selected(model.cfg.n_layers * model.cfg.n_heads, top=args.top)
    samples = task.generate(args.samples, seed=args.seed)
    long = offset_table(model, tokenizer, samples, deltas, args.batch_size, progress=not args.no_progress)
    ranking = ranking_from_offsets(long)

    out = Path(args.out)
    write_text(out / "ranking.csv", ranking.to_csv(index=False))
    write_text(out / "ranking.jsonl", ranking.to_json(orient="records", lines=True, double_precision=15))
    if len(deltas) > 1:
        write_text(out / "offsets.csv", long.to_csv(index=False))
        save_figure(offset_heatmap(long), out, "ranking_offsets")
    save_figure(heatmap(ranking, "score_sum", f"Head ranking on {args.task} ({args.split}): attention on references, summed"), out, "ranking_sum")
    save_figure(heatmap(ranking, "score_row", f"Head ranking on {args.task} ({args.split}): mean per target row"), out, "ranking_row")
    selected = None
    if args.top is not None or args.fraction is not None:
        selected = select_heads(ranking, top=args.top, fraction=args.fraction, by=args.by)
    write_json(out / "run.json", {
        "command": "rank", "model": str(args.model), "task": args.task, "split": args.split, "params": task.params(),
        "samples": args.samples, "seed": args.seed, "deltas": deltas, "versions": versions(),
    })
    cols = ["rank", "layer", "head", "score_sum", "score_row", "best_delta", "best_delta_score"]
    write_json(out / "summary.json", {
        "selected_heads": [list(h) for h in selected] if selected else None,
        "tables": {"head ranking (top 10)": ranking[cols].head(10).to_dict("records")},
    })
    print(ranking[cols].head(10).to_string(index=False))
    if selected:
        print("selected heads:", " ".join(f"{l}.{h}" for l, h in selected))
    print(f"wrote {out / 'ranking.csv'}", file=sys.stderr)
    return 0
