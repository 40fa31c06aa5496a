"""`aspan sweep` as a function a notebook can call: a resumable grid of attention interventions in a run directory,
each point against a matched baseline, then the table, the figures and (once the grid is complete) the selection
rule's choice reported on held-out samples.

The interventions are those of Spiegel et al. 2025, Appendix F (see `aspan.experiments.sweep` for the grid).

    from aspan.applications.sweep import SweepRun, run_sweep_dir
    from aspan.experiments.sweep import SweepConfig
    summary = run_sweep_dir(SweepConfig.from_toml("configs/reversal_reinforce.toml"), "runs/sweep")
    summary = run_sweep_dir(config, "runs/sweep", SweepRun(shard=(0, 4), progress=False))  # one shard of four

`SweepConfig` says what the grid computes (the run directory's configuration); `SweepRun` how one job runs it.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from ..checks import check_output_dir
from ..environment import run_environment
from ..experiments.engine import ANY_TASK_HINT, ID_BUDGET, ROW_FIELDS, set_tasks
from ..experiments.sweep import (
    SweepConfig,
    checkpoint_dims,
    grid,
    report_selection,
    run_sweep,
    selected_curves,
    shard_points,
    summary_table,
)
from ..io import PathLike, RunDir, claim_run, settings_key, union_rows, write_json
from ..models.backend import default_backend
from ..models.checkpoint import content_hash, saved_task
from ..models.trained import check_task

RESULT_FREE = ("device", "any_task")  # config keys that are not part of a run directory's configuration


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepRun:
    """How one job runs a sweep's grid (`run_sweep_dir`, `launch.launch_sweep`): none of it is part of the run
    directory's configuration, so jobs with different `SweepRun` values share one run directory."""

    config_file: str | None = None  # the TOML file the configuration came from (recorded in run.json, in messages)
    shard: tuple[int, int] | None = None  # run only shard I of N of the grid (None: all of it)
    limit: int | None = None  # stop after this many new rows (0: only rebuild the tables and figures)
    id_budget: float = ID_BUDGET  # the selection rule: the largest drop of ID exact accuracy allowed (a fraction)
    progress: bool = True  # progress bars
    command: str | None = None  # the command line the claim records (None: `aspan sweep CONFIG_FILE`)


def rows_file(out: Path, shard: tuple[int, int] | None) -> Path:
    """`sweep.jsonl`, or `sweep.shard-I-of-N.jsonl` so parallel shards never write the same file."""
    return out / ("sweep.jsonl" if shard is None else f"sweep.shard-{shard[0]}-of-{shard[1]}.jsonl")


def existing_rows(out: Path) -> list[dict]:
    """The rows of every `sweep*.jsonl` in `out` (all shards so far); ValueError naming the file and line of one
    that is not a sweep row."""
    return union_rows(sorted(out.glob("sweep*.jsonl")), ROW_FIELDS, "sweep")


def check_sweep(config: SweepConfig, source: str) -> None:
    """What can be checked before any model loads: the model's training task (from its metadata; `source` names
    the config in the message) and the heads against the checkpoint's dimensions."""
    if config.model is None:
        raise ValueError(f"{source}: model: a run directory needs the model named (a checkpoint path or name); a "
                         "model object goes to aspan.experiments.sweep.run_sweep(config, rows_file, model=..., "
                         "tokenizer=...)")
    if not config.any_task:
        check_task(saved_task(config.model), set_tasks(config.data()), f"{source}: model {config.model}",
                   ANY_TASK_HINT)
    dims = checkpoint_dims(config.model)
    if dims:
        config.check_heads(*dims)


def sweep_settings(config: SweepConfig) -> dict:
    """The configuration a sweep's run directory holds results of (`aspan.io.check_settings`)."""
    # the backend and the weights (a model directory may be replaced by another of the same shape) are settings too
    # (the device and any_task do not change what a row holds)
    # (a float32 dtype, the default, stays unrecorded: the runs made before the option computed in float32, and resume)
    return {"command": "sweep", "config": {k: v for k, v in asdict(config).items() if k not in RESULT_FREE
                                           and not (k == "dtype" and v == "float32")},
            "backend": default_backend(), "model_sha256": content_hash(config.model)}


def run_sweep_dir(config: SweepConfig, out: PathLike, run: SweepRun | None = None) -> dict:
    """Run (or resume) `config`'s grid, or shard I of N of it (`run.shard`), into run directory `out`, holding it for
    this job and this configuration; rebuild the table and figures from every shard's rows, and once the grid is
    complete apply the selection rule (`run.id_budget`: the largest ID exact drop allowed, a fraction) and report its
    choice on held-out samples. Returns the summary (also `out/summary.json`). `run.limit` stops after that many new
    rows."""
    run = run or SweepRun()
    config_file, shard, id_budget, progress = run.config_file, run.shard, run.id_budget, run.progress
    source = config_file or "sweep config"
    check_sweep(config, source)
    out = check_output_dir(out)
    path = rows_file(out, shard)
    settings = sweep_settings(config)
    existing_rows(out)  # a corrupt rows file is refused before any model work
    # one job per rows file (parallel shards write their own), one configuration per run directory
    with claim_run(out, settings, shard=shard, command=run.command or f"aspan sweep {source}"):
        write_json(out / "run.json", {"command": "sweep", "config": asdict(config), "config_file": config_file,
                                      "id_budget": id_budget,
                                      **run_environment(device=config.device, dtype=config.dtype)})
        run_sweep(config, path, shard=shard or (0, 1), progress=progress, limit=run.limit)
        summary = write_outputs(config, out, id_budget)
        rows = summary.pop("_rows", None)
        if summary["complete"]:
            summary["selection"] = held_out_selection(config, out, rows, id_budget, progress)
            write_json(out / "summary.json", summary)
    n_grid, n_mine = len(grid(config)), len(shard_points(grid(config), shard or (0, 1)))
    logger.info("%s: shard has %d of %d grid points; %d rows in %s so far", path, n_mine, n_grid, summary["rows"], out)
    return summary


def write_outputs(config: SweepConfig, out: Path, id_budget: float | None) -> dict:
    """Rebuild the table, figures and summary from every rows file in `out` (all shards so far); the summary, with
    the rows as a frame under `_rows`."""
    import pandas as pd

    from ..viz import length_figure, strength_figure

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


def held_out_selection(config: SweepConfig, out: Path, rows, id_budget: float | None, progress: bool) -> dict:
    """The selection rule on the complete grid, the chosen setting on the held-out set; summary entries."""
    sel, held = report_selection(config, rows, out / "held_out.jsonl", id_budget, progress=progress)
    entry: dict = {"rule": sel.rule, "candidates": sel.candidates, "selected": None}
    if sel.row is not None:
        cols = ["mode", "method", "heads", "strength", "threshold", "renormalize", "delta", "exact", "partial",
                "gain_exact", "gain_partial", "id_exact", "id_cost", "seeds"]
        held_table = summary_table(held, "held_out")
        entry["selected"] = {k: sel.row[k] for k in cols}
        entry["held_out"] = held_table[[c for c in cols if c in held_table]].iloc[0].to_dict()
    return entry


def format_selection(entry: dict) -> str:
    """The selection rule and its choice, with the held-out result (what `aspan sweep` prints on a complete grid)."""
    from ..experiments.edit import setting_label

    rule = f"selection rule: {entry['rule']}"
    if entry["selected"] is None:
        return f"{rule}\nno setting improves OOD within the ID budget ({entry['candidates']} settings within it)"
    s, h = entry["selected"], entry["held_out"]
    return (f"{rule}\nselected: {setting_label(s)} ({s['mode']}): selection set "
            f"exact gain {s['gain_exact']:+.3f}, ID cost {s['id_cost']:+.3f}; held-out OOD exact {h['exact']:.3f} "
            f"(gain {h['gain_exact']:+.3f}), per-token {h['partial']:.3f} (gain {h['gain_partial']:+.3f}), "
            f"ID cost {h['id_cost']:+.3f}")
