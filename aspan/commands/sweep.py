"""`aspan sweep CONFIG`: a resumable grid of attention interventions, each against a matched baseline.

The interventions are those of Spiegel et al. 2025, Appendix F.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .argtypes import device, nonneg_int, output_dir, points_fraction

HELP = "run a resumable grid of attention reinforcement settings from a TOML config (rows to JSONL, figures)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="TOML sweep config (see configs/*.toml)")
    p.add_argument("--out", type=output_dir, default=None, help="run directory (default runs/sweep-<config name>)")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run only shard I of N (0 <= I < N), e.g. $SLURM_ARRAY_TASK_ID/8")
    p.add_argument("--limit", type=nonneg_int, default=None,
                   help="stop after this many new rows (0: only rebuild tables and figures)")
    p.add_argument("--device", type=device, default=None, help="override the config's device")
    p.add_argument("--id-budget", type=points_fraction, default="1", metavar="PP",
                   help="selection rule: largest OOD exact gain whose ID exact drop is at most PP percentage points "
                        "(default 1)")
    p.add_argument("--no-progress", action="store_true")


def rows_file(out: Path, shard: tuple[int, int] | None) -> Path:
    """`sweep.jsonl`, or `sweep.shard-I-of-N.jsonl` so parallel shards never write the same file."""
    return out / ("sweep.jsonl" if shard is None else f"sweep.shard-{shard[0]}-of-{shard[1]}.jsonl")


def existing_rows(out: Path) -> list[dict]:
    """The rows of every `sweep*.jsonl` in `out` (all shards so far); ValueError naming the file and line of one
    that is not a sweep row."""
    from aspan.experiments.engine import ROW_FIELDS
    from aspan.io import union_rows

    return union_rows(sorted(out.glob("sweep*.jsonl")), ROW_FIELDS, "sweep")


def write_outputs(config, out: Path, id_budget: float | None) -> dict:
    """Rebuild the table, figures and summary from every rows file in `out` (all shards so far); the summary."""
    import pandas as pd

    from aspan.experiments.sweep import grid, selected_curves, summary_table
    from aspan.io import RunDir, settings_key
    from aspan.viz import length_figure, strength_figure

    keys = {settings_key(p) for p in grid(config)}
    rows = pd.DataFrame([r for r in existing_rows(out) if r["key"] in keys])
    if rows.empty:
        return {"rows": 0, "grid_points": len(keys), "complete": False}
    table = summary_table(rows)
    run = RunDir(out)
    run.write_csv("sweep.csv", table)
    for mode in sorted(rows["mode"].unique()):
        run.figure(length_figure(selected_curves(rows, mode, id_budget)), f"sweep_length_{mode}")
        run.figure(strength_figure(summary_table(rows[rows["mode"] == mode]), mode), f"sweep_strength_{mode}")
    summary = {"rows": int(len(rows)), "grid_points": len(keys), "complete": len(rows) == len(keys),
               "tables": {"all settings (mean over seeds, selection set)": table.to_dict("records")}}
    run.write_json("summary.json", summary)
    return {**summary, "_rows": rows}


def _held_out(config, out: Path, rows, id_budget: float | None, progress: bool) -> dict:
    """The selection rule on the complete grid, the chosen setting on the held-out set; summary entries."""
    from aspan.experiments.sweep import report_selection, summary_table

    sel, held = report_selection(config, rows, out / "held_out.jsonl", id_budget, progress=progress)
    entry: dict = {"rule": sel.rule, "candidates": sel.candidates, "selected": None}
    if sel.row is not None:
        cols = ["mode", "method", "heads", "strength", "threshold", "renormalize", "delta", "exact", "partial",
                "gain_exact", "gain_partial", "id_exact", "id_cost", "seeds"]
        held_table = summary_table(held, "held_out")
        entry["selected"] = {k: sel.row[k] for k in cols}
        entry["held_out"] = held_table[[c for c in cols if c in held_table]].iloc[0].to_dict()
    return entry


RESULT_FREE = ("device", "any_task")  # config keys that are not part of a run directory's configuration


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict, replace

    from aspan.checks import check_output_dir
    from aspan.environment import run_environment
    from aspan.experiments.engine import ANY_TASK_HINT, set_tasks
    from aspan.experiments.sweep import SweepConfig, checkpoint_dims, grid, parse_shard, run_sweep, shard_points
    from aspan.io import claim_run, write_json
    from aspan.models.backend import default_backend
    from aspan.models.checkpoint import content_hash, saved_task
    from aspan.models.trained import check_task

    config = SweepConfig.from_toml(args.config)  # full validation before any model work
    if not config.any_task:  # the model's training task, from its metadata: before the run directory is touched
        check_task(saved_task(config.model), set_tasks(config.data()), f"{args.config}: model {config.model}",
                   ANY_TASK_HINT)
    dims = checkpoint_dims(config.model)
    if dims:
        config.check_heads(*dims)
    if args.device:
        config = replace(config, device=args.device)
    shard = parse_shard(args.shard) if args.shard else None
    if args.limit is not None and args.limit < 0:
        raise ValueError(f"--limit must be >= 0, got {args.limit}")
    budget = args.id_budget  # a fraction (argtypes.points_fraction)
    out = check_output_dir(args.out or f"runs/sweep-{Path(args.config).stem}")
    path = rows_file(out, shard)
    n_grid = len(grid(config))
    n_mine = len(shard_points(grid(config), shard or (0, 1)))
    # one job per rows file (parallel shards write their own), one configuration per run directory
    # the backend and the weights (a model directory may be replaced by another of the same shape) are settings too
    # (the device and any_task do not change what a row holds)
    settings = {"command": "sweep", "config": {k: v for k, v in asdict(config).items() if k not in RESULT_FREE},
                "backend": default_backend(), "model_sha256": content_hash(config.model)}
    existing_rows(out)  # a corrupt rows file is refused before any model work
    with claim_run(out, settings, shard=shard, command=f"aspan sweep {args.config}"):
        write_json(out / "run.json", {"command": "sweep", "config": asdict(config), "config_file": str(args.config),
                                      "id_budget": budget,
                                      **run_environment(device=config.device)})
        run_sweep(config, path, shard=shard or (0, 1), progress=not args.no_progress, limit=args.limit)
        summary = write_outputs(config, out, budget)
        if summary["complete"]:
            rows = summary.pop("_rows")
            summary["selection"] = _held_out(config, out, rows, budget, not args.no_progress)
            write_json(out / "summary.json", summary)
            _print_selection(summary["selection"])
    print(f"{path}: shard has {n_mine} of {n_grid} grid points; {summary['rows']} rows in {out} so far",
          file=sys.stderr)
    return 0


def _print_selection(entry: dict) -> None:
    print(f"selection rule: {entry['rule']}")
    if entry["selected"] is None:
        print(f"no setting improves OOD within the ID budget ({entry['candidates']} settings within it)")
        return
    from aspan.experiments.edit import setting_label

    s, h = entry["selected"], entry["held_out"]
    print(f"selected: {setting_label(s)} ({s['mode']}): selection set "
          f"exact gain {s['gain_exact']:+.3f}, ID cost {s['id_cost']:+.3f}; held-out OOD exact {h['exact']:.3f} "
          f"(gain {h['gain_exact']:+.3f}), per-token {h['partial']:.3f} (gain {h['gain_partial']:+.3f}), "
          f"ID cost {h['id_cost']:+.3f}")
