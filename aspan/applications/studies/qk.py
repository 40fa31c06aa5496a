"""`aspan study qk`: which attention parameters must change for a model to work at longer lengths?

The later abstract of "Attend or Perish" (Spiegel et al., ICLR 2026 submission) claims that fine-tuning a single
column of the query and key projections in every head, on sequences longer than those seen in training, makes the
model perform well at those lengths (and not beyond), and blames fast-rotating RoPE dimensions. This study tests the
claim on a trained checkpoint (the shipped reversal model by default): it fine-tunes on the lengths of
`finetune` (11-20) under each condition (no training, everything, all attention weights, all of W_Q and W_K,
each RoPE rotation pair, a set of single columns), with and without a replay share of the ID preset, at an equal
step budget (protocol "budget"), or each run until its learning curve on the fine-tuned lengths plateaus or a cap
(protocol "curves"). With a `base` table the model is first trained here from scratch (`BaseSpec`). The learning
rate of every (condition, replay) is chosen from a small grid on a selection set (seed 0, per-token accuracy on
held-out strings of the fine-tuned lengths), then every seed is trained at that rate and reported on other
held-out samples of every length bucket (training lengths, fine-tuned lengths, beyond).

Outputs (RUN_DIR): `runs.jsonl` (one row per training run, keyed by its settings, so a killed study resumes),
`table.csv` (per condition and replay: trainable parameters, the learning-rate grid tried and the chosen rate, mean,
sd and 95 % intervals over seeds of exact and per-token accuracy per bucket, ID cost), `selection.csv`,
`summary.json` (the findings), `figures/` (accuracy by bucket per condition; exact and per-token accuracy against the
rotation frequency of the trained pair or of a single column's pair) and `report.html`; with the
curves protocol also `learning_curves.jsonl` (one row per run, step and bucket), the stop and fit columns of
`table.csv` and a learning-curve figure per condition; with a base, `base/` (its checkpoint and `base.json`).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ... import tasks
from ...buckets import Bucket, bucket_name, bucket_sets
from ...environment import run_environment
from ...io import RowWriter, RunDir, settings_key, write_json
from ...tokenization import CharTokenizer, check_tokenizer
from . import Study, Unit, study_rows, unit_file, unit_index
from .qk_config import (  # noqa: F401 (re-exported: the study's settings, imported from here)
    CURVES_ROWS,
    PROTOCOLS,
    STOPS,
    BaseSpec,
    Condition,
    QKStudyConfig,
    Setup,
    base_spec,
    conditions,
)
from .qk_tables import (  # noqa: F401 (re-exported: the study's tables, imported from here)
    _select_lr,
    aggregate,
    bucket_columns,
    curve_columns,
    findings,
    headline_table,
    lr_edge,
    lr_grid,
    selection_table,
    within_full,
)


def setup(cfg: QKStudyConfig, device: str = "cpu", out: Path | None = None) -> Setup:
    """Load the checkpoint (with `base`: train it into `out`/base first), build the fine-tuning task and the
    selection, report and curve sets (`held_out_sets`: pairwise apart by construction)."""
    from ... import models

    cfg.check()
    if cfg.base:
        if out is None:
            raise ValueError("a study with a base trains it into its run directory: give one")
        model, tokenizer, _ = base_model(cfg, Path(out) / "base", device)
    else:
        model, tokenizer, _ = models.load(cfg.init, device=device)
    ft_task, id_task = study_tasks(cfg)
    for t in (ft_task, id_task, *(tasks.preset(cfg.task, "id", length=b) for b in cfg.buckets)):
        check_tokenizer(tokenizer, t.alphabet)
        models.check_context(model, t, tokenizer.offset)
    select, report, curves = held_out_sets(cfg, ft_task, id_task)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return Setup(cfg, model, tokenizer, base, ft_task, id_task, select, report, conditions(cfg, model), curves,
                 None if out is None else Path(out))


def study_tasks(cfg: QKStudyConfig):
    """(fine-tuning task, ID task): the task at the `finetune` lengths, and at the model's training lengths
    (`id_length`, the base's lengths with a base, else the ID preset's); the buckets are the ID task's."""
    id_length = base_spec(cfg).length if cfg.base else cfg.id_length
    return (tasks.preset(cfg.task, "id", length=cfg.finetune),
            tasks.preset(cfg.task, "id", **({"length": tuple(id_length)} if id_length else {})))


def held_out_sets(cfg: QKStudyConfig, ft_task, id_task) -> tuple[list, dict[str, list], dict[str, list]]:
    """The study's held-out sets: the selection set (`n_select` samples of `ft_task`, seed `select_seed`), the
    report sets (`n_report` per bucket of `id_task`, seed `report_seed`) and, with the curves protocol, the curve
    sets (`n_curve` per curve bucket, seed `curve_seed`; {} otherwise). Each set's draw skips every text of the sets
    drawn before it (report sets: the selection set; curve sets: the selection set, the report sets and the curve
    sets before them), so no two sets share a sample; a set whose seed-only draw shared no text with those is that
    draw, sample for sample (so are sets of lengths no earlier set holds)."""
    select = ft_task.generate(cfg.n_select, seed=cfg.select_seed)
    taken = {x.text for x in select}
    report = _drawn_apart(id_task, cfg.buckets, (cfg.n_report, cfg.report_seed), taken,
                          ("report set", "the selection set and the report sets before it"))
    if cfg.protocol != "curves":
        return select, report, {}
    curves = _drawn_apart(id_task, curve_buckets(cfg), (cfg.n_curve, cfg.curve_seed), taken,
                          ("curve set", "the selection set, the report sets and the curve sets before it"))
    return select, report, curves


def _drawn_apart(task, buckets: list[Bucket], spec: tuple[int, int], taken: set[str], names: tuple[str, str]):
    """`bucket_sets` of `spec` = (n, seed), one bucket at a time: each skips the texts in `taken`, then adds its own
    (so two buckets sharing lengths share no sample either)."""
    out: dict[str, list] = {}
    for b in buckets:
        out.update(bucket_sets(task, [b], *spec, taken, names))
        taken |= {x.text for x in out[bucket_name(b)]}
    return out


BASE_RECORD = "base.json"  # in RUN_DIR/base: the base's settings, where and why its training stopped, its fit


def base_training_dir(path: Path) -> Path:
    """Where the base model at `path` trains (log, curves, checkpoints every `curve_every` steps) until it is done."""
    return path.with_name(path.name + "-training")


def base_model(cfg: QKStudyConfig, path: Path, device: str):
    """The study's base model from `path`, trained there first (from scratch, `BaseSpec`) unless its record exists:
    a tiny model whose context holds the longest bucket, trained on the task at the base's lengths until exact on
    held-out samples of them reaches the base's `fit_exact`, or its cap."""
    from ... import models
    from ...training import TrainConfig, latest_checkpoint, train

    spec = base_spec(cfg)
    if not (path / BASE_RECORD).exists():
        model, tok, task = base_untrained(cfg, device)
        config = TrainConfig.scratch(steps=spec.cap, batch_size=spec.batch_size, lr=spec.lr, warmup=spec.warmup,
                                     seed=spec.seed, device=device, log_every=max(1, spec.cap // 20),
                                     curve_every=spec.curve_every, stop="target", stop_bucket="id",
                                     target=spec.fit_exact, ckpt_every=spec.curve_every)
        held_out = task.generate(spec.n_curve, seed=cfg.curve_seed + 1)  # its own seed (not filtered by texts)
        work = base_training_dir(path)  # checkpointed as it trains: a study stopped mid-base resumes it exactly
        result = train(model, tok, task, config, out_dir=work, resume=latest_checkpoint(work) is not None,
                       progress=False, curve_data={"id": held_out})
        exact = [r["exact"] for r in result.history if r.get("kind") == "curve"][-1]
        models.save(model, path, tok, task=cfg.task, study="qk base")
        write_json(path / BASE_RECORD, {"base": asdict(spec), "stop": result.stop, "id_exact": exact,
                                        "fitted": exact >= spec.fit_exact})
    return models.load(path, device=device)


def base_untrained(cfg: QKStudyConfig, device: str = "cpu"):
    """(model, tokenizer, task) of the base before its training: a tiny model whose context holds the longest
    bucket, initialised with the base's seed."""
    from ... import models

    spec = base_spec(cfg)
    task = tasks.preset(cfg.task, "id", length=spec.length)
    longest = max(spec.length[1], cfg.finetune[1], *(b[1] for b in cfg.buckets))
    tok = CharTokenizer.for_alphabets(task.alphabet)
    n_ctx = models.check_context(10**9, tasks.preset(cfg.task, "id", length=(1, longest)), tok.offset)
    model = models.tiny(tok, n_layers=spec.n_layers, n_heads=spec.n_heads, d_model=spec.d_model, n_ctx=n_ctx,
                        seed=spec.seed, device=device, positional=spec.positional)
    return model, tok, task


def curve_buckets(cfg: QKStudyConfig) -> list[Bucket]:
    """The buckets the curves protocol scores as it trains: the report buckets, with the fine-tuned one added."""
    return list(cfg.buckets) + ([] if tuple(cfg.finetune) in map(tuple, cfg.buckets) else [cfg.finetune])


# ----------------------------------------------------------------------------------------------- one run
def run_settings(s: Setup, cond: Condition, replay: float, lr: float | None, seed: int | None) -> dict:
    """Everything that determines one row (its key is a hash of this)."""
    c = s.cfg
    return {"study": "qk", "init": c.init, "task": c.task, "finetune": list(c.finetune), "condition": cond.name,
            "train_only": cond.train_only, "replay": replay, "lr": lr, "seed": seed, "steps": c.steps,
            "batch_size": c.batch_size, "warmup": c.warmup, "weight_decay": c.weight_decay,
            "select": [c.n_select, c.select_seed], "report": [[list(b) for b in c.buckets], c.n_report, c.report_seed],
            **(_curve_settings(c) if c.protocol == "curves" else {}),
            **({"base": asdict(base_spec(c))} if c.base else {}),
            **({"id_length": list(c.id_length)} if c.id_length is not None else {})}


def _curve_settings(c: QKStudyConfig) -> dict:
    """The curves protocol's part of a row's key (the budget protocol's keys stay those of before it existed)."""
    rule = {} if c.stop == "plateau" else {"stop": c.stop, **({"target": c.fit_exact} if c.stop == "target" else {})}
    return {"protocol": "curves", "steps": c.cap, "curve_every": c.curve_every, "stop_metric": c.stop_metric,
            "curve": [[list(b) for b in curve_buckets(c)], c.n_curve, c.curve_seed], **rule}


def _scores(s: Setup) -> dict[str, float]:
    """Exact and per-token accuracy on the selection set and on every report bucket (flat keys)."""
    from ...accuracy import accuracy

    out: dict[str, float] = {}
    for name, samples in {"select": s.select, **s.report}.items():
        summ = accuracy(s.model, s.tokenizer, samples, batch_size=s.cfg.eval_batch_size).summary()
        tag = name.removeprefix("length ")
        out[f"exact_{tag}"], out[f"partial_{tag}"] = summ["exact"], summ["partial"]
    return out


def train_one(s: Setup, settings: dict) -> tuple[dict, list[dict]]:
    """Reset the model to its initial weights, fine-tune under `settings` (unless the condition is none), score it.
    Returns the run's row and (curves protocol) its learning-curve rows, each keyed by the run, step and bucket;
    the row records where and why the run stopped (cap or plateau)."""
    import torch

    from ...param_groups import trainable_count
    from ...training import Replay, TrainConfig, train, train_resumable

    with torch.no_grad():
        s.model.load_state_dict(s.base)
    t0 = time.perf_counter()
    n_train, n_all = trainable_count(s.model, settings["train_only"])
    curves, stop = [], {}
    if settings["condition"] == "none":
        n_train = 0
    else:
        data = Replay(s.finetune_task, s.id_task, settings["replay"]) if settings["replay"] else s.finetune_task
        by_curves = settings.get("protocol") == "curves"
        config = TrainConfig.scratch(steps=settings["steps"], batch_size=settings["batch_size"], lr=settings["lr"],
                                     warmup=settings["warmup"], weight_decay=settings["weight_decay"],
                                     seed=settings["seed"], train_only=settings["train_only"],
                                     device=str(s.model.cfg.device), log_every=max(1, settings["steps"]),
                                     curve_every=settings["curve_every"] if by_curves else 0,
                                     stop=settings.get("stop", "plateau") if by_curves else "none",
                                     target=settings.get("target"), stop_bucket=bucket_name(s.cfg.finetune),
                                     stop_metric="exact" if settings.get("stop") == "target"
                                     else settings.get("stop_metric", "exact"))
        options = dict(progress=False, curve_data=s.curves if by_curves else None)
        if s.out is None:
            result = train(s.model, s.tokenizer, data, config, **options)
        else:  # a run paused by a time budget (aspan.training.time_budget) continues from its checkpoint
            result = train_resumable(s.out / "scratch" / settings["key"], s.model, s.tokenizer, data, config,
                                     **options)
        curves = [r for r in result.history if r.get("kind") == "curve"]
        if by_curves:
            stop = {"stop_reason": result.stop["reason"], "stop_step": result.stop["step"]}
    train_s = time.perf_counter() - t0
    row = {**settings, "trainable": n_train, "total": n_all, "fraction": n_train / n_all, **stop, **_scores(s),
           "train_s": train_s, "wall_s": time.perf_counter() - t0}
    keyed = [{"key": f"{settings['key']}/{r['step']}/{r['bucket']}", "run": settings["key"],
              **{k: settings[k] for k in ("condition", "replay", "lr", "seed")},
              **{k: r[k] for k in ("step", "bucket", "n", "exact", "partial", "loss")}} for r in curves]
    return row, keyed


def plan(s: Setup, rows: list[dict], unit: str | None = None) -> list[dict]:
    """Settings still to run, given the rows so far, for the first replay share not finished yet: its grid at seed 0,
    then (once the grid is complete) the other seeds at the chosen rate. A resumed study continues exactly. With
    `unit` (a key of `units`), that unit's settings still to run, of every replay share; ValueError naming the unit
    it waits for when it is a seed's and its grid is not complete."""
    have = {r["key"] for r in rows}
    found: list[dict] = []
    for replay in s.cfg.replays:
        todo = []
        for cond in s.conds:
            if not cond.lrs:
                todo.append(run_settings(s, cond, 0.0, None, None))
            elif replay == 0 or s.cfg.replay_conditions is None or {"*", cond.name} & set(s.cfg.replay_conditions):
                grid, lr = lr_grid(rows, cond, replay, s.cfg.seeds[0])
                todo += [run_settings(s, cond, replay, rate, s.cfg.seeds[0]) for rate in grid]
                todo += [run_settings(s, cond, replay, lr, seed) for seed in s.cfg.seeds[1:]] if lr else []
                if lr is None and unit in (unit_key(s.cfg, cond.name, replay, seed) for seed in s.cfg.seeds[1:]):
                    raise ValueError(f"unit {unit!r} needs the learning rate that unit "
                                     f"{unit_key(s.cfg, cond.name, replay, s.cfg.seeds[0])!r} chooses: run it first")
        todo = [{**st, "key": k} for st in todo if (k := settings_key(st)) not in have and
                (unit is None or unit_key(s.cfg, st["condition"], st["replay"], st["seed"]) == unit)]
        if todo and unit is None:
            return list({t["key"]: t for t in todo}.values())
        found += todo
    return list({t["key"]: t for t in found}.values())


def unit_key(cfg: QKStudyConfig, condition: str, replay: float, seed: int | None) -> str:
    """The unit of a run: "none" (the untrained model), "CONDITION/replay R/select" (the learning-rate grid on the
    first seed) or "CONDITION/replay R/seed S"."""
    if seed is None:
        return condition
    return f"{condition}/replay {replay:g}/" + ("select" if seed == cfg.seeds[0] else f"seed {seed}")


def units(cfg: QKStudyConfig) -> list[Unit]:
    """The study's units: with a base, "base" (stage 0: training it); the untrained model and each (condition,
    replay)'s learning-rate grid on the first seed (stage 1); each other seed at the chosen rate (stage 2). The
    conditions come from the model's architecture (its rotary pairs), read from the checkpoint or the base's
    settings; nothing is trained to list them."""
    from ... import models

    model = base_untrained(cfg)[0] if cfg.base else models.load(cfg.init, device="cpu").model
    found = [Unit("base", 0)] if cfg.base else []
    for cond in conditions(cfg, model):
        if not cond.lrs:
            found.append(Unit(cond.name, 1))
            continue
        for replay in cfg.replays:
            if replay == 0 or cfg.replay_conditions is None or {"*", cond.name} & set(cfg.replay_conditions):
                found.append(Unit(unit_key(cfg, cond.name, replay, cfg.seeds[0]), 1))
                found += [Unit(unit_key(cfg, cond.name, replay, seed), 2) for seed in cfg.seeds[1:]]
    return list({u.key: u for u in found}.values())


# What every row of runs.jsonl holds for planning and selection (a row lacking one is refused, naming its line).
RUN_FIELDS = ("key", "condition", "replay", "seed", "lr")


CURVE_FIELDS = ("key", "run", "step", "bucket", "exact")


def run_study(cfg: QKStudyConfig, out_dir: str | Path, progress: bool = True, device: str = "cpu",
              unit: str | None = None) -> "StudyResult | None":
    """Run (or resume) the study into `out_dir`; returns the rows and the aggregated table. With `unit` (a key of
    `units`): only that unit's runs, their rows into its unit files; returns None."""
    from tqdm.auto import tqdm

    cfg.check()
    out = Path(out_dir)
    index = unit_index(units(cfg), unit) if unit is not None else None
    writer = RowWriter(unit_file(out, "runs.jsonl", index), RUN_FIELDS, "qk study")  # corrupt: refused before work
    curve_writer = RowWriter(unit_file(out, CURVES_ROWS, index), CURVE_FIELDS, "qk study learning-curve")
    if unit == "base":
        base_model(cfg, out / "base", device)
        return None
    if unit is not None and cfg.base and not (out / "base" / BASE_RECORD).exists():
        raise ValueError(f"unit {unit!r} fine-tunes the base that unit 'base' trains: run it first")
    s = setup(cfg, device, out)
    t0 = time.perf_counter()
    bar = tqdm(desc="qk study" + (f" ({unit})" if unit else ""), unit="run", disable=not progress, dynamic_ncols=True)
    while todo := plan(s, study_rows(out, "runs.jsonl", RUN_FIELDS, "qk study"), unit):
        bar.total = bar.n + len(todo)
        for settings in todo:  # the grid runs first; the seeds at the chosen rate are planned once it is complete
            row, curve_rows = train_one(s, settings)
            for r in curve_rows:  # before the run's row: a run is done (never retrained) once its row is written
                curve_writer.write(r)
            writer.write(row)
            bar.update(1)
    bar.close()
    if unit is not None:
        return None
    rows = study_rows(out, "runs.jsonl", RUN_FIELDS, "qk study")
    curves = study_rows(out, CURVES_ROWS, CURVE_FIELDS, "qk study learning-curve")
    return StudyResult(rows, aggregate(s, rows, curves), selection_table(s, rows), time.perf_counter() - t0, curves)


@dataclass
class StudyResult:
    """What the Q/K study returns: its rows, its tables, its wall time and its learning-curve rows."""
    rows: list[dict]  # one per training run (and one for the untrained model)
    table: Any  # pandas DataFrame: one row per (condition, replay)
    selection: Any  # pandas DataFrame: the learning-rate grid on the selection set
    wall_s: float  # wall time of this invocation
    curves: list[dict] = field(default_factory=list)  # learning-curve rows (curves protocol)
    summary: dict = field(default_factory=dict)  # summary.json as `write_outputs` wrote it


def write_outputs(cfg: QKStudyConfig, res: StudyResult, out_dir: str | Path, command: str, device: str = "cpu") -> dict:
    """table.csv, selection.csv, summary.json, run.json, figures/ and report.html in `out_dir` (`device`: the one
    the study ran on)."""
    from ...report import write_report

    out = RunDir(out_dir)
    out.write_csv("table.csv", res.table)
    out.write_csv("selection.csv", res.selection)
    summary = {"findings": findings(cfg, res.table), "table": res.table.to_dict("records"), "runs": len(res.rows),
               "wall_s_this_invocation": res.wall_s, "train_s_total": sum(r["wall_s"] for r in res.rows)}
    if cfg.base:  # the model the study started from: where and why its training stopped, whether it fit
        summary["base"] = json.loads((Path(out_dir) / "base" / BASE_RECORD).read_text())
    out.write_json("summary.json", summary)
    out.write_json("run.json", {"command": command, "config": asdict(cfg), "selection_rule": SELECTION_RULE,
                                **run_environment(device=device)})
    from ...viz.qk import qk_curve_figures, qk_figures

    for name, fig in {**qk_figures(cfg, res.table), **qk_curve_figures(cfg, res.table, res.curves)}.items():
        out.figure(fig, name)
    write_report(out.path, title="aspan study qk: which attention parameters must change for longer lengths")
    return summary


SELECTION_RULE = ("per (condition, replay): the learning rate of the grid with the highest per-token accuracy on "
                  "the selection set (held-out strings of the fine-tuned lengths, runs of the first seed; ties: "
                  "exact, then the smaller rate); every seed is then trained at that rate and reported on other "
                  "held-out samples of every bucket")


def run(config: QKStudyConfig, out: Path, *, progress: bool = True, unit: str | None = None,
        command: str = "") -> StudyResult | None:
    """The qk study's runner (`Study`): `run_study` on `config.device`, then (the whole study) `write_outputs`
    (`command`: the command line run.json records); the result carries summary.json."""
    result = run_study(config, out, progress=progress, device=config.device, unit=unit)  # checks `config` first
    if result is not None:
        result.summary = write_outputs(config, result, out, command, config.device)
    return result


STUDY = Study("qk", QKStudyConfig, run, units, ("runs.jsonl", CURVES_ROWS))
