"""`aspan study parity`: does the format decide length generalization? (Ebrahimi, Panchal & Memisevic 2024, §3-4)

For each parity format (plain, scratchpad, interleaved, mnemonic) a tiny model is trained from scratch on inputs
of 1..L bits, then tested on held-out samples of exactly 1x, 2x, 5x and 10x L bits: exact accuracy (every
scored character and EOS right, teacher-forced, which for these prompt-fixed targets equals greedy generation with
the given characters supplied) and per-token accuracy. Every format gets the same step budget; its learning rate
is chosen from a small grid on a separate selection set (seed 0's run; largest exact accuracy at 2x L, ties
broken by exact at 1x L, then by per-token accuracy at 2x L); the other seeds are trained at the chosen rate and
every number reported is a mean over seeds with its 95 % interval on the held-out test samples. One head's
attention (the head with the highest AttnScore on the references in distribution) is drawn on an ID sample and at
the failure.

    aspan study parity --out runs/parity            # ~25 min on one CPU thread
    aspan study parity --quick --out /tmp/pq        # < 1 min, for tests
    aspan study parity --config configs/parity_study_gpu.toml --out runs/parity_gpu
    aspan study parity --protocol curves --out runs/parity_curves   # every run until it fits (or a cap)

With `protocol = "curves"` every run trains until its learning curve on held-out training-length inputs reaches
`fit_exact` (or `cap` steps); a format that did not fit claims no accuracy beyond its training length.

Outputs (RUN_DIR): rows.jsonl (one row per run x evaluation set, keyed by its settings; a rerun skips finished
runs), selection.csv, summary.csv, summary.json, `figures/*.json`, `views/*.html`, `models/*`, run.json, report.html;
with the curves protocol also learning_curves.jsonl (one row per run, step and curve set) and convergence.csv.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...environment import run_environment, torch_threads
from ...intervals import mean_sd, seed_interval, t_interval
from ...io import RowWriter, read_rows, save_figure, settings_key, write_csv, write_json
from ...tasks.parity import Parity as Parity  # the task, as the study named it before
from ...tokenization import CharTokenizer
from ...training import TrainConfig
from . import Study, Unit, study_rows, unit_file, unit_index
from .parity_config import PROTOCOLS as PROTOCOLS  # the settings' names, as the study's before
from .parity_config import SET_DRAWS as SET_DRAWS
from .parity_config import ParityStudyConfig
from .parity_sets import ENUMERATED_BITS as ENUMERATED_BITS  # the sets' names, as the study's before
from .parity_sets import FIT_SET, curve_sets, eval_sets, make_task
from .parity_sets import ID_PARTS as ID_PARTS
from .parity_sets import _bits_key as _bits_key
from .parity_sets import _pool as _pool
from .parity_sets import draw_set as draw_set

CURVES_ROWS = "learning_curves.jsonl"  # the curves protocol's learning curves: one row per (run, step, set)


def choose_lr(rows: pd.DataFrame) -> float:
    """The selection rule: largest exact at the selection length, then exact at 1x, then per-token at the
    selection length."""
    sel = rows[rows.split == "select"].pivot_table(index="lr", columns="which", values=["exact", "partial"])
    order = sel.sort_values([("exact", "ood"), ("exact", "id"), ("partial", "ood")], ascending=False)
    if "fitted" in rows:  # curves protocol: a rate whose run fit its training lengths comes first
        fitted = rows.groupby("lr").fitted.all()
        return float(next((lr for lr in order.index if fitted[lr]), order.index[0]))
    return float(order.index[0])



# ----------------------------------------------------------------------------------------------- the runs
def run_settings(config: ParityStudyConfig, fmt: str, lr: float, seed: int) -> dict[str, Any]:
    """What a run's rows depend on (their key): changing any of it reruns, changing nothing resumes."""
    keep = ("train_length", "multiples", "select_multiple", "steps", "batch_size", "warmup", "n_layers", "n_heads",
            "d_model", "positional", "anchors", "n_select", "n_test")
    curves = {"protocol": "curves", "steps": config.cap, "curve_every": config.curve_every, "n_curve": config.n_curve,
              "fit_exact": config.fit_exact} if config.protocol == "curves" else {}
    split = {"held_out_share": config.held_out_share} if config.held_out_share else {}  # rows before it: no split
    draw = {} if config.set_draw == "with_replacement" else {"set_draw": config.set_draw}  # rows before it: none
    return {"format": fmt, "lr": lr, "seed": seed, **{k: getattr(config, k) for k in keep}, **curves, **split,
            **draw}


def run_id(fmt: str, lr: float, seed: int) -> str:
    """A run's identifier, `FORMAT-lrLR-seedSEED` (e.g. `scratchpad-lr0.001-seed0`)."""
    return f"{fmt}-lr{lr:g}-seed{seed}"


@dataclass(frozen=True)
class Run:
    """One training run of the study."""

    format: str  # parity format
    lr: float  # learning rate
    seed: int  # training seed (model initialisation and data order)

    @property
    def id(self) -> str:
        """The run's identifier, `FORMAT-lrLR-seedSEED` (see `run_id`)."""
        return run_id(self.format, self.lr, self.seed)


def train_and_evaluate(config: ParityStudyConfig, tok, n_ctx: int, spec: Run, out: Path,
                       index: int | None = None) -> list[dict]:
    """Train one model from scratch, save it under RUN_DIR/models, and return its evaluation rows (`index`: the
    unit whose files its learning-curve rows go to, `unit_file`)."""
    fmt, lr, seed = spec.format, spec.lr, spec.seed
    from ... import models
    from ...accuracy import accuracy
    from ...training import train_resumable

    settings = run_settings(config, fmt, lr, seed)
    model = models.tiny(tok, n_layers=config.n_layers, n_heads=config.n_heads, d_model=config.d_model, n_ctx=n_ctx,
                        seed=seed, device=_device(config), positional=config.positional)
    by_curves = config.protocol == "curves"
    steps = config.cap if by_curves else config.steps
    cfg = TrainConfig.scratch(steps=steps, batch_size=config.batch_size, lr=lr, warmup=config.warmup, seed=seed,
                              device=_device(config), log_every=max(1, steps // 10),
                              curve_every=config.curve_every if by_curves else 0,
                              stop="target" if by_curves else "none", stop_bucket=FIT_SET,
                              target=config.fit_exact if by_curves else None)
    t0 = time.perf_counter()
    # in RUN_DIR/scratch/ID until it ends: a run paused by a time budget (aspan.training.time_budget) continues there
    train_task = make_task(config, fmt, (1, config.train_length), "train")
    result = train_resumable(out / "scratch" / spec.id, model, tok, train_task, cfg, progress=False,
                             curve_data=curve_sets(config, fmt) if by_curves else None)
    curves = [r for r in result.history if r.get("kind") == "curve"]
    seconds = time.perf_counter() - t0
    # the last logged training loss (None when the stop rule ended the run before its first log row)
    loss = next((r["loss"] for r in reversed(result.history) if r.get("kind") == "train"), None)
    models.save(model, out / "models" / spec.id, tok, task="parity", study="parity", **settings)
    run_key = settings_key(settings)
    outcome = write_curves(config, spec, run_key, curves, result.stop, unit_file(out, CURVES_ROWS, index)) \
        if by_curves else {}
    rows = []
    for (split, which), samples in eval_sets(config, fmt).items():
        res = accuracy(model, tok, samples, batch_size=config.eval_batch_size).summary()  # no per-token records
        bits = sum(c in "01" for c in samples[0].prompt)
        row = {**settings, **outcome, "run": run_key, "split": split, "which": which, "bits": bits,
               "multiple": bits // config.train_length, "exact": res["exact"], "partial": res["partial"],
               "n": res["n"], "train_seconds": seconds, "final_loss": loss, "n_ctx": n_ctx, "vocab": tok.vocab_size}
        rows.append({"key": settings_key({**settings, "split": split, "which": which}), **row})
    return rows


def write_curves(config: ParityStudyConfig, spec: Run, run_key: str, curves: list[dict], stop: dict,
                 path: Path) -> dict:
    """Append a run's learning-curve rows (keyed by run, step and set) to `path` (`CURVES_ROWS` or its unit file),
    before the run's own rows (a run is done, never retrained, once those are written); returns where and why it
    stopped and its fit."""
    writer = RowWriter(path)
    for r in curves:
        writer.write({"key": f"{run_key}/{r['step']}/{r['bucket']}", "run": run_key, "format": spec.format,
                      "lr": spec.lr, "seed": spec.seed,
                      **{k: r[k] for k in ("step", "bucket", "n", "exact", "partial", "loss")}})
    fit = [r["exact"] for r in curves if r["bucket"] == FIT_SET and r["step"] == stop["step"]][-1]
    return {"stop_reason": stop["reason"], "stop_step": stop["step"], "fit_curve_exact": fit,
            "fitted": fit >= config.fit_exact}


def _device(config: ParityStudyConfig) -> str:
    from ...training import resolve_device

    return str(resolve_device(config.device))


def _done(rows: list[dict], config: ParityStudyConfig, fmt: str, lr: float, seed: int) -> list[dict]:
    key = settings_key(run_settings(config, fmt, lr, seed))
    mine = [r for r in rows if r.get("run") == key]
    return mine if len(mine) == 2 + len(config.multiples) else []


def run_study(config: ParityStudyConfig, out: Path, command: str = "", report: bool = True,
              progress: bool = True, unit: str | None = None) -> pd.DataFrame | None:
    """Every run (grid on seed 0, then the other seeds at each format's chosen rate), tables, figures, report; torch
    on `config.threads` CPU threads meanwhile (the caller's number restored afterwards). With `unit` (a key of
    `units`): only that unit's run, its rows into its unit files; returns None."""

    config.check()
    with torch_threads(config.threads):
        return _run_study(config, out, command, report, progress, unit)


def unit_key(config: ParityStudyConfig, fmt: str, lr: float, seed: int) -> str:
    """The unit of a run: "FORMAT/lr LR" (a rate of the grid, on seed 0) or "FORMAT/seed S" (at the chosen rate)."""
    return f"{fmt}/lr {lr:g}" if seed == 0 else f"{fmt}/seed {seed}"


def units(config: ParityStudyConfig) -> list[Unit]:
    """One unit per run: each format's learning-rate grid on seed 0 (stage 1, one unit per rate), then each other
    seed at the format's chosen rate (stage 2)."""
    return [*(Unit(unit_key(config, f, lr, 0), 1) for f in config.formats for lr in config.grid(f)),
            *(Unit(unit_key(config, f, 0.0, s), 2) for f in config.formats for s in range(1, config.seeds))]


def _chosen(config: ParityStudyConfig, out: Path, fmt: str) -> float:
    """The learning rate the grid of `fmt` on seed 0 chose; ValueError naming a unit of it still to run."""
    rows = study_rows(out, "rows.jsonl")
    for lr in config.grid(fmt):
        if not _done(rows, config, fmt, lr, 0):
            raise ValueError(f"format {fmt}'s seeds need the learning rate its grid chooses: run unit "
                             f"{unit_key(config, fmt, lr, 0)!r} first")
    return choose_lr(pd.DataFrame([r for lr in config.grid(fmt) for r in _done(rows, config, fmt, lr, 0)]))


def _run_study(config: ParityStudyConfig, out: Path, command: str, report: bool, progress: bool,
               unit: str | None) -> pd.DataFrame | None:
    from tqdm.auto import tqdm

    from ... import models

    start = time.time()
    index = unit_index(units(config), unit)
    sizing = config.sizing_formats  # the vocabulary and the context: a model's initialisation depends on both
    tok = CharTokenizer.for_alphabets(*(make_task(config, f, config.longest).alphabet for f in sizing))
    n_ctx = max(models.check_context(10**9, make_task(config, f, config.longest), tok.offset) for f in sizing)
    for f in config.formats:  # every test sample fits, and every held-out set has inputs, checked before training
        models.check_context(n_ctx, make_task(config, f, config.longest), tok.offset)
        if config.protocol == "curves":
            curve_sets(config, f)  # draws the evaluation sets too
        else:
            eval_sets(config, f)
    out.mkdir(parents=True, exist_ok=True)
    writer = RowWriter(unit_file(out, "rows.jsonl", index))
    plan = [(f, lr, 0) for f in config.formats for lr in config.grid(f)]
    bar = tqdm(total=len(plan) + len(config.formats) * (config.seeds - 1), desc="parity study runs",
               disable=not progress or unit is not None)

    def do(fmt: str, lr: float, seed: int) -> None:
        bar.set_postfix_str(run_id(fmt, lr, seed))
        if unit in (None, unit_key(config, fmt, lr, seed)) and \
                not _done(study_rows(out, "rows.jsonl"), config, fmt, lr, seed):
            for row in train_and_evaluate(config, tok, n_ctx, Run(fmt, lr, seed), out, index):
                writer.write(row)
        bar.update(1)

    for fmt, lr, seed in plan:
        do(fmt, lr, seed)
    chosen = {}
    for fmt in config.formats:
        mine = unit in (unit_key(config, fmt, 0.0, s) for s in range(1, config.seeds))
        if unit is None or mine:
            chosen[fmt] = _chosen(config, out, fmt)
            for seed in range(1, config.seeds):
                do(fmt, chosen[fmt], seed)
    bar.close()
    if unit is not None:
        return None
    rows = pd.DataFrame([r for f in config.formats for lr in config.grid(f) for s in range(config.seeds)
                         for r in _done(study_rows(out, "rows.jsonl"), config, f, lr, s)])
    tables = write_tables(rows, chosen, config, out)
    write_figures(tables["summary"], config, out)
    if config.protocol == "curves":
        write_curve_figures(config, chosen, out)
    write_views(config, chosen, tok, out, n_ctx)
    wall = time.time() - start
    write_json(out / "run.json", {"command": command, "config": asdict(config), "chosen_lr": chosen,
                                  "wall_seconds": wall, "torch_threads": config.threads,
                                  **run_environment(device=_device(config))})
    write_json(out / "summary.json", {"study": "parity", "wall_seconds": round(wall, 1),
                                      "tables": {k: v.to_dict("records") for k, v in tables.items()}})
    if report:
        from ...report import write_report

        write_report(out, title="aspan study parity")
    return tables["summary"]


# ----------------------------------------------------------------------------------------------- outputs
def write_tables(
    rows: pd.DataFrame, chosen: dict[str, float], config: ParityStudyConfig, out: Path
) -> dict[str, pd.DataFrame]:
    """selection.csv (the grid on seed 0), results.csv (every test row of the chosen rates), summary.csv (mean, sd and
    95 % intervals: exact accuracy `intervals.seed_interval`, the union of t over seeds and Wilson with every seed's
    answers pooled; per-token t over seeds)."""

    sel = rows[(rows.split == "select") & (rows.seed == 0)]
    selection = sel.pivot_table(index=["format", "lr"], columns="which", values=["exact", "partial"]).reset_index()
    selection.columns = ["format", "lr", "exact_1x", "exact_select", "partial_1x", "partial_select"]
    selection["chosen"] = [chosen[f] == lr for f, lr in zip(selection.format, selection.lr)]
    test = rows[(rows.split == "test") & (rows.lr == rows.format.map(chosen))]
    by_curves = config.protocol == "curves"
    stops = ["stop_reason", "stop_step", "fit_curve_exact", "fitted"] if by_curves else []
    results = test[["format", "lr", "seed", "multiple", "bits", "exact", "partial", "n", "train_seconds", "final_loss",
                    *stops]]
    results = results.sort_values(["format", "multiple", "seed"]).reset_index(drop=True)
    summary = []
    for (fmt, m), g in results.groupby(["format", "multiple"], sort=False):
        (em, es), (pm, ps) = mean_sd(g.exact.tolist()), mean_sd(g.partial.tolist())
        elo, ehi = seed_interval(g.exact.tolist(), int(g.n.iloc[0]))
        plo, phi = t_interval(g.partial.tolist())
        row = {"format": fmt, "multiple": int(m), "bits": int(g.bits.iloc[0]), "lr": chosen[fmt], "seeds": len(g),
               "exact_mean": em, "exact_sd": es, "partial_mean": pm, "partial_sd": ps, "exact_lo": elo,
               "exact_hi": ehi, "partial_lo": plo, "partial_hi": phi,
               "exact": f"{100 * em:.1f} [{100 * elo:.1f}, {100 * ehi:.1f}]",
               "per_token": f"{100 * pm:.1f} [{100 * plo:.1f}, {100 * phi:.1f}]"}
        if by_curves:
            row["fit"] = "fit" if g.fitted.all() else "did not fit"
            if row["fit"] != "fit" and m > 1:  # no extrapolation claimed for a format that did not fit
                row |= {k: math.nan for k in ("exact_mean", "exact_sd", "partial_mean", "partial_sd", "exact_lo",
                                              "exact_hi", "partial_lo", "partial_hi")}
                row |= {"exact": "did not fit", "per_token": "did not fit"}
        summary.append(row)
    order = {f: i for i, f in enumerate(config.formats)}
    summary = pd.DataFrame(summary).sort_values(["format", "multiple"], key=lambda c: c.map(order) if c.name == "format"
                                                else c).reset_index(drop=True)
    tables = {"summary": summary, "selection": selection, "results": results}
    if by_curves:
        tables["convergence"] = convergence(results[results.multiple == 1], config)
    for name, df in tables.items():
        write_csv(out / f"{name}.csv", df)
    return tables


def rewrite_outputs(out: Path) -> dict[str, pd.DataFrame]:
    """Write the tables, summary.json and the accuracy figures of the finished study in `out` again from its
    rows.jsonl and run.json (its settings and chosen rates), training and evaluating nothing: a study's outputs
    redrawn by newer code. Rows count only when their key is the one those settings give (settings the run.json
    lacks take the values of the code that wrote it: no held-out split, sets drawn with replacement). run.json and
    the head figures stay."""
    import json

    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    known = {f.name for f in fields(ParityStudyConfig)}
    before = {"held_out_share": 0.0, "set_draw": "with_replacement"}  # what rows without these settings had
    config = ParityStudyConfig(**{**before, **{k: tuple(v) if isinstance(v, list) else v
                                               for k, v in run["config"].items() if k in known}})
    chosen = run["chosen_lr"]
    rows = read_rows(out / "rows.jsonl")
    mine = [r for f in config.formats for lr in config.grid(f) for s in range(config.seeds)
            for r in _done(rows, config, f, lr, s)]
    if not all(_done(rows, config, f, chosen[f], s) for f in config.formats for s in range(config.seeds)):
        raise ValueError(f"{out / 'rows.jsonl'}: not every run of the chosen rates has its rows; run the study")
    tables = write_tables(pd.DataFrame(mine), chosen, config, out)
    write_figures(tables["summary"], config, out)
    old = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    write_json(out / "summary.json", {**old, "tables": {k: v.to_dict("records") for k, v in tables.items()}})
    return tables


def convergence(runs: pd.DataFrame, config: ParityStudyConfig) -> pd.DataFrame:
    """Curves protocol, per format at its chosen rate: the stop reasons (e.g. "target 2, cap 1"), the mean stop step,
    the mean training-length exact on the curve set where the runs stopped, how many seeds fit, "fit" only when all
    did, and the mean steps to `fit_exact` (None unless every seed reached it)."""
    out = []
    for fmt, g in runs.groupby("format", sort=False):
        reasons = g.stop_reason.value_counts().sort_index()
        out.append({"format": fmt, "lr": g.lr.iloc[0], "seeds": len(g),
                    "stop_reason": ", ".join(f"{k} {n}" for k, n in reasons.items()),
                    "stop_step": g.stop_step.mean(), "fit_curve_exact": g.fit_curve_exact.mean(),
                    "n_fit": int(g.fitted.sum()), "fit": "fit" if g.fitted.all() else "did not fit",
                    "steps_to_target": g.stop_step.mean() if g.fitted.all() else None,
                    "target": config.fit_exact})
    return pd.DataFrame(out)


def write_figures(summary: pd.DataFrame, config: ParityStudyConfig, out: Path) -> None:
    """Exact and per-token accuracy against the input length, one line per format, the mean over seeds with its 95 %
    interval."""
    from ...viz.studies import parity_length_figure

    for col in ("exact", "partial"):
        fig = parity_length_figure(summary, col, config.train_length, config.seeds)
        save_figure(fig, out / "figures" / f"{col}_vs_length.json")


def write_curve_figures(config: ParityStudyConfig, chosen: dict[str, float], out: Path) -> None:
    """Curves protocol: per format, the learning curves (exact per curve set) of every seed at the chosen rate; and
    every format's mean curve on the training lengths on one figure (`curves_fit`)."""
    from ...viz.curves import learning_curves

    rows = pd.DataFrame(study_rows(out, CURVES_ROWS))
    for fmt in config.formats:
        mine = rows[(rows.format == fmt) & (rows.lr == chosen[fmt])]
        fig = learning_curves({f"seed {seed}": d for seed, d in mine.groupby("seed")},
                              title=f"{fmt}: exact accuracy on held-out sets while training (lr {chosen[fmt]:g}; "
                                    f"target {config.fit_exact:g} on {FIT_SET})")
        save_figure(fig, out / "figures" / f"curves_{fmt}.json")
    fit = rows[rows.bucket == FIT_SET]  # every format on one figure: mean over the seeds still training
    means = {fmt: fit[(fit.format == fmt) & (fit.lr == chosen[fmt])].groupby("step", as_index=False)["exact"].mean()
             .assign(bucket=f"1-{config.train_length} bits") for fmt in config.formats}
    fig = learning_curves(means, title=f"exact accuracy on held-out 1-{config.train_length} bit inputs while training "
                                       "(mean of the seeds still training)")
    save_figure(fig, out / "figures" / "curves_fit.json")


def _pattern(model, tok, sample, head: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """One head's [query, key] pattern on `sample` (BOS + text) and the sample's reference mask, as arrays."""
    import torch

    import hooks

    ids = torch.tensor([tok.prefix_ids() + tok.encode(sample.text)])
    a = hooks.capture(model, ids, [head])[head][0].float().cpu().numpy()
    return np.round(a, 3), sample.mask(tok.offset).numpy()


def first_failure(model, tok, samples, batch: int) -> tuple[Any, int] | None:
    """(sample, target index) of the first wrong scored character among `samples` (teacher-forced), or None."""
    from ...evaluation import evaluate

    rec = evaluate(model, tok, samples, attn=False, batch_size=batch).records
    wrong = rec[~rec.correct & ~rec.eos]
    if wrong.empty:
        return None
    first = wrong.iloc[0]
    return samples[int(first.sample_id)], int(first.target_index)


def write_views(config: ParityStudyConfig, chosen: dict[str, float], tok, out: Path, n_ctx: int) -> None:
    """Per format: the head reading the references most in distribution, drawn on an ID sample and at the failure.

    The drawn model is seed 0's at the chosen rate; when its checkpoint is gone (results committed without
    `models/`), that one run is trained again (same seed, same data: the rows already written are kept)."""
    import hooks

    from ... import models
    from ...batching import make_batch
    from ...viz import pattern_across_lengths

    rows = []
    for fmt in config.formats:
        path = out / "models" / run_id(fmt, chosen[fmt], 0)
        if not path.exists():
            train_and_evaluate(config, tok, n_ctx, Run(fmt, chosen[fmt], 0), out)
        model = models.load(path, device=_device(config)).model
        sets = eval_sets(config, fmt)
        ids = sets[("test", "1")][: config.eval_batch_size]
        b = make_batch(ids, tok, n_ctx=model.cfg.n_ctx)
        scores = hooks.head_scores(model, b.tokens, b.ref_mask, reduce="row", attention_mask=b.attention_mask)
        head = tuple(int(i) for i in np.unravel_index(int(scores.argmax()), tuple(scores.shape)))
        fail, where = None, None
        for m in sorted(config.multiples):
            found = first_failure(model, tok, sets[("test", str(m))], config.eval_batch_size)
            if found is not None:
                (fail, j), where = found, m
                break
        panels = [(f"{config.train_length} bits (ID)", *_pattern(model, tok, ids[0], head))]
        if fail is not None:
            a, mask = _pattern(model, tok, fail, head)
            q = tok.offset + fail.prompt_len - 1
            panels.append((f"{where}x: first error at target {j}", a[q:], mask[q:]))
        fig = pattern_across_lengths(panels, title=f"{fmt}: head L{head[0]}H{head[1]} (highest ID AttnScore)"
                                     + ("" if fail is not None else ", no error at any test length"))
        save_figure(fig, out / "figures" / f"head_{fmt}.json")
        rows.append({"format": fmt, "layer": head[0], "head": head[1], "id_attnscore": float(scores.max()),
                     "failure_multiple": where, "failure_target_index": j if fail is not None else None,
                     "failure_text": fail.text if fail is not None else None})
    write_csv(out / "heads.csv", pd.DataFrame(rows))


StudyConfig = ParityStudyConfig  # its former name


def run(config: ParityStudyConfig, out: Path, *, progress: bool = True, unit: str | None = None, command: str = "",
        report: bool = True) -> pd.DataFrame | None:
    """The parity study's runner (`Study`): `run_study` (`command`: the command line run.json records; `report`:
    write report.html too); returns the summary table."""
    return run_study(config, Path(out), command=command, report=report, progress=progress, unit=unit)


STUDY = Study("parity", ParityStudyConfig, run, units, ("rows.jsonl", CURVES_ROWS))
