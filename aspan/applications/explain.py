"""`aspan explain` as a function a notebook can call: why did the model get one sample wrong (`aspan.anatomy.explain`),
printed as a table with the likely cause in words, and kept in a run directory whose page (`aspan report`) shows the
table, the figure and the attention view, before and after an edit.

    from aspan.applications.explain import ExplainRun, run_explain
    anatomy = run_explain(ExplainRun("reversal", task="reversal", seed=2, params=("length=11-20",)))

The edit file (`--edit FILE`) is a TOML file of the fields of `aspan.experiments.edit.Edit`: method, strength, delta,
heads (`[[1, 7], [1, 0]]`; left out: the heads the anatomy follows), renormalize, threshold, beyond, below, eos.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Callable

from ..anatomy import Anatomy, ExplainOptions, explain
from ..anatomy.record import write_anatomy
from ..config import load_config
from ..environment import run_environment
from ..errors import UsageError
from ..evaluation import evaluate
from ..experiments.edit import Edit
from ..io import claim_run, write_json
from ..report import write_report
from ..tasks.base import Sample, Task
from .eval import model_and_task, parse_heads
from .explain_config import ExplainRun

logger = logging.getLogger(__name__)
SEARCH = 1024  # samples `failing` searches at most
CHUNK = 64  # ... scored at a time


def read_edit(path: str) -> Edit:
    """The edit of a TOML file (the fields of `Edit`); one UsageError line naming the file and what is wrong."""
    try:
        return load_config(Edit, toml_path=path, name="edit")
    except ValueError as e:  # the edit's own checks (a negative strength, a method's unknown option)
        message = str(e)
        raise UsageError(message if message.startswith(str(path)) else f"{path}: {message}") from None


def pick_sample(model, tokenizer, task: Task, cfg: ExplainRun) -> tuple[int, Sample]:
    """(index in the seed's stream, sample): the first, or with `failing` the first the model gets wrong
    (teacher-forced, among the first `SEARCH`); ValueError when none is."""
    stream = task.stream(cfg.seed)
    if not cfg.failing:
        return 0, next(stream)
    for start in range(0, SEARCH, CHUNK):
        chunk = list(itertools.islice(stream, CHUNK))
        rows = evaluate(model, tokenizer, chunk, attn=False, any_task=cfg.any_task).samples
        wrong = rows.sample_id[~rows.exact.astype(bool)]
        if len(wrong):
            i = int(wrong.iloc[0])
            return start + i, chunk[i]
    raise ValueError(f"--failing: the model gets all of the first {SEARCH} samples of seed {cfg.seed} right "
                     "(teacher-forced): there is no failure to explain")


def run_explain(cfg: ExplainRun, echo: Callable[[str], None] | None = None) -> Anatomy:
    """Explain one sample: the anatomy's text to `echo` (`aspan explain` prints it; the default logs it at INFO),
    the run directory `cfg.out` written (holding it for this job) and its page; the `Anatomy`."""
    echo = echo or logger.info
    edit = read_edit(cfg.edit) if cfg.edit else None  # a bad file fails before the model loads
    heads = parse_heads(cfg.heads)
    options = ExplainOptions(delta=cfg.delta, top=cfg.top, convention=cfg.convention)
    options.check()
    with claim_run(cfg.out):
        model, tokenizer, name, task = model_and_task(cfg)
        index, sample = pick_sample(model, tokenizer, task, cfg)
        anatomy = explain(model, tokenizer, sample, heads=heads, fwd_hooks=edit, options=options)
        echo(anatomy.text())
        which = f"sample {index} of seed {cfg.seed} ({name}, {cfg.split})" + (
            ", the first the model gets wrong (teacher-forced)" if cfg.failing else "")
        write_json(f"{cfg.out}/run.json", {
            "command": "explain", "model": str(cfg.checkpoint), "task": name, "split": cfg.split,
            "params": task.params(), "seed": cfg.seed, "failing": cfg.failing, "index": index,
            "heads": [list(h) for h in anatomy.selected], "delta": anatomy.delta, "edit": _settings(edit),
            **run_environment(model)})
        write_anatomy(cfg.out, anatomy, context=f"The anatomy of {which}" + (
            f", before and after the edit {anatomy.edit}." if edit else "."))
        page = write_report(cfg.out, cfg.output, title=f"aspan explain: {name} {cfg.split}, {which.split(' (')[0]}")
        echo(f"page: {page}")
    return anatomy


def _settings(edit: Edit | None) -> dict[str, Any] | None:
    """The edit as run.json keeps it (None without one)."""
    if edit is None:
        return None
    return {"label": edit.label, "method": edit.method, "strength": edit.strength, "delta": edit.delta,
            "heads": [list(h) for h in edit.heads], "renormalize": edit.renormalize, "threshold": edit.threshold,
            "beyond": edit.beyond, "below": edit.below, "eos": edit.eos}
