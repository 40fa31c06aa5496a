"""The run directory both abc studies write (`aspan study abc`, aligned and `--protocol paper`): table.csv,
summary.json (the wide table under the name the findings know it by, and what was not run), the figures and
run.json; runs.jsonl is written row by row as the study runs."""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from ...environment import run_environment
from ...io import RunDir

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class AbcOutputs:
    """What one abc study writes beside its rows."""

    command: str  # run.json's command ("study abc" or "study abc --protocol paper")
    config: Any  # the study's settings dataclass (run.json's config; its `device` is the one recorded)
    table: pd.DataFrame  # table.csv: one row per task, condition and length
    table_name: str  # the name summary.json files the wide table under (`aspan.findings.tables`)
    wide: list[dict]  # that wide table: one row per task and condition
    not_run: list[str]  # what was not run, and why
    figures: dict[str, Any] = field(default_factory=dict)  # file stem -> plotly figure
    run_fields: dict[str, Any] = field(default_factory=dict)  # run.json's fields of this study alone


def write_abc_outputs(out: str | Path, outputs: AbcOutputs, rows: Iterable[dict], wall_s: float) -> pd.DataFrame:
    """table.csv, summary.json, the figures and run.json in `out` (`rows`: every row of runs.jsonl, whose train and
    evaluation time run.json sums; `wall_s`: this invocation's wall time). Returns the table."""
    run = RunDir(out)
    run.write_csv("table.csv", outputs.table)
    run.write_json("summary.json", {"tables": {outputs.table_name: outputs.wide}, "not_run": outputs.not_run})
    for name, figure in outputs.figures.items():
        run.figure(figure, name)
    run.write_json("run.json", {
        "command": outputs.command, "argv": sys.argv, "config": asdict(outputs.config),
        "wall_s_this_invocation": wall_s, "train_eval_s_all_rows": sum(r.get("wall_s", 0.0) for r in rows),
        "not_run": outputs.not_run, **outputs.run_fields, **run_environment(device=outputs.config.device),
    })
    return outputs.table
