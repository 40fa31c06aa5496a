"""The run-directory writer: every file aspan writes goes through here (it imports nothing from aspan).

A write goes to a unique temporary file beside its target and is renamed over it, so a reader (or a parallel
shard) never sees half a file and an exception leaves nothing behind. JSON is strict (NaN/inf become null) and
made by one sanitiser, `clean`. Resumable results are JSONL rows keyed by a stable hash of their settings.
Character devices and FIFOs are written in place (renaming over them would destroy the node); nothing is
appended, truncated or replaced through a symbolic link (the run directory could otherwise write anywhere).

    run = RunDir("runs/demo")
    run.write_json("run.json", {"command": "aspan demo", **run_environment(model)})  # aspan.environment
    run.write_csv("sweep.csv", table)
    run.figure(fig, "01_rollout")          # -> runs/demo/figures/01_rollout.json (`aspan report` reads it)
    writer = RowWriter(run.path / "sweep.jsonl")   # resumable rows: a killed run continues where it stopped

The modules: `files` (atomic files and directories), `formats` (JSON, JSONL, CSV, TOML, figures, hashes), `rows`
(resumable row stores) and `rundir` (a run directory's writer and the claim one job holds on it). Every name is
importable from `aspan.io` itself.
"""
from __future__ import annotations

from .files import (
    HOST,
    PathLike,
    atomic_dir,
    atomic_write,
    refuse_link,
    remove_stale_temps,
    temp_dir_beside,
    write_lines,
    write_text,
)
from .formats import (
    MAX_INT_DIGITS,
    clean,
    dump_frame,
    parse_json,
    read_json,
    read_toml,
    save_figure,
    settings_key,
    sha256_of,
    to_json,
    write_csv,
    write_json,
    write_jsonl,
)
from .rows import RowWriter, append_line, cut_rows, read_rows, union_rows
from .rundir import (
    LOCK,
    SETTINGS,
    RunDir,
    check_settings,
    claim,
    claim_run,
    command_line,
    hold,
    recorded_settings,
    run_lock,
)

__all__ = [
    "HOST", "LOCK", "MAX_INT_DIGITS", "PathLike", "RowWriter", "RunDir", "SETTINGS", "append_line", "atomic_dir",
    "atomic_write", "check_settings", "claim", "claim_run", "clean", "command_line", "cut_rows", "dump_frame", "hold",
    "parse_json", "read_json", "read_rows", "read_toml", "recorded_settings", "refuse_link", "remove_stale_temps",
    "run_lock", "save_figure", "settings_key", "sha256_of", "temp_dir_beside", "to_json", "union_rows", "write_csv",
    "write_json", "write_jsonl", "write_lines", "write_text",
]
