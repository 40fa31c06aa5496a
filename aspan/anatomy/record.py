"""An anatomy kept in a run directory for its report (`aspan report`'s "Anatomy of a failure" section):
`anatomy.json` (the sample, the header, the likely cause before and after the edit, the table), the figure
`figures/anatomy.json` and the attention view `views/anatomy.html`."""
from __future__ import annotations

from pathlib import Path

from ..io import PathLike, RunDir
from ..report import ANATOMY_FILE, ANATOMY_STEM
from ..viz.views import save_view
from .sample import Anatomy


def write_anatomy(run_dir: PathLike, anatomy: Anatomy, context: str = "") -> list[Path]:
    """Write `anatomy` into `run_dir` (`context`: which sample it is, in words, for the page); the paths written."""
    run = RunDir(run_dir)
    return [run.write_json(ANATOMY_FILE, {"context": context, **anatomy.to_dict()}),
            run.figure(anatomy.figure(), ANATOMY_STEM),
            save_view(anatomy.view(), run / f"views/{ANATOMY_STEM}.html")]


def remove_anatomy(run_dir: PathLike) -> None:
    """Remove the anatomy files a previous run into `run_dir` left (a rerun must not show a stale one)."""
    run = RunDir(run_dir)
    for name in (ANATOMY_FILE, f"figures/{ANATOMY_STEM}.json", f"views/{ANATOMY_STEM}.html"):
        run.remove(name)
