"""The rows the four studies' `--quick` runs write, as `test_study_registry.py` compares them with the rows recorded
in `data/study_quick_rows.json`.

Record (or re-record, after a change that is meant to change the numbers) with the command line, so the same
script records from any version of the code:

    python tests/applications/study_rows.py tests/applications/data/study_quick_rows.json
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# study -> (its `aspan` command line without --out, the row file its run directory keeps)
QUICK = {
    "qk": (["study", "qk", "--quick", "--threads", "1"], "runs.jsonl"),
    "parity": (["study", "parity", "--quick", "--threads", "1", "--no-report"], "rows.jsonl"),
    "abc": (["study", "abc", "--quick", "--threads", "1"], "runs.jsonl"),
    "abc-paper": (["study", "abc", "--protocol", "paper", "--quick", "--threads", "1"], "runs.jsonl"),
}
TIMING = re.compile(r"(_s|seconds|^time)$")  # keys that hold how long something took: they differ run to run


def rows(out: Path, name: str) -> list[dict]:
    """The rows of study `name`'s run directory `out`, without timings, in `by_key`'s order."""
    lines = (out / QUICK[name][1]).read_text(encoding="utf-8").splitlines()
    return by_key([{k: v for k, v in json.loads(line).items() if not TIMING.search(k)} for line in lines
                   if line.strip()])


def by_key(found: list[dict]) -> list[dict]:
    """Rows in one order whatever order the units ran in and whatever fields they gained: by condition, then
    settings key (then content, for rows without either)."""
    return sorted(found, key=lambda r: (str(r.get("condition")), str(r.get("key")), json.dumps(r, sort_keys=True)))


def record(path: Path) -> None:
    """Run the four quick studies with `python -m aspan.cli` (whatever `aspan` is importable) and write their rows."""
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (argv, _) in QUICK.items():
            out = Path(tmp) / name
            subprocess.run([sys.executable, "-m", "aspan.cli", *argv, "--out", str(out), "--quiet"], check=True)
            found[name] = rows(out, name)
    path.write_text(json.dumps(found, indent=0, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    record(Path(sys.argv[1]))
