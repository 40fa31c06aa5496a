"""What the results tests share: a run's committed rows and table, and a README as one line of text."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def flat(path: Path) -> str:
    """A text file with every run of whitespace made one space, so that a sentence matches across line breaks."""
    return re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))


def run_rows(run: Path) -> tuple[list[dict], pd.DataFrame]:
    """A study run's `runs.jsonl` rows and its `table.csv` indexed by condition."""
    return jsonl(run / "runs.jsonl"), pd.read_csv(run / "table.csv").set_index("condition")


def abc_name(row: dict) -> str:
    """An ABC study row's condition as its table names it: "rotary", "abc" or "abc[...]" (what differs)."""
    from aspan.applications.studies.abc_arms import AbcArm

    return row["condition"] if row["condition"] == "rotary" else AbcArm.of_row(row, "none").variant("none")


def chosen(rows: list[dict], table: pd.DataFrame, condition: str) -> list[dict]:
    """A QK study condition's rows at the learning rate its table chose, by seed (seeds 0, 1 and 2, asserted)."""
    lr = table.loc[condition, "lr"]
    found = sorted((r for r in rows if r["condition"] == condition and r["lr"] == lr), key=lambda r: r["seed"])
    assert [r["seed"] for r in found] == [0, 1, 2], condition
    return found
