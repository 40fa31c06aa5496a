"""The main job, `aspan demo`: a tiny model's OOD failure, tied to attention, and repaired by editing attention.

On string reversal with the checkpoint shipped in `aspan/checkpoints/reversal/` (trained by
`scripts/train_default.py`), in stages: rank heads on ID with the shifted-reference offset scan (Spiegel et al.
2025, Appendix F); evaluate ID and OOD (teacher-forced and generated); search for edits causally (`causal`: head
profiling with the attribution estimate, greedy selection of pattern-patching atoms under an ID-cost veto, and
method / strength / gate variants); evaluate the reinforcement grid (top heads x strengths, at the best offset and
at offset 0) and the search's proposals through the experiment engine on an OOD selection set, each with its matched
ID cost; tell the causal story on held-out samples: the paper's recipe, the edit the engine's one rule selects
(largest OOD exact gain within the ID budget), the patching upper bound, and the two head rankings side by side;
print short tables and write a run directory with figures (a Pareto front among them), views and one offline HTML
report.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import evaluation, models, tasks
from ..environment import run_environment
from ..experiments import ranking
from ..experiments.engine import (
    ID_REPORT,
    SEED_OFFSET,
    Data,
    Engine,
    Ranking,
    Selection,
    on_set,
    point,
    run_in_dir,
    select,
)
from ..experiments.search import SearchConfig
from ..io import RunDir, settings_key
from ..report import write_report
from ..tokenization import CharTokenizer
from ..training import TrainConfig, train
from ..viz import story
from . import causal
from .claims import claim_config
from .demo_outputs import (  # noqa: F401 (re-exported: the demo's outputs and stage results were defined here)
    CONDITIONS,
    RULES,
    Baseline,
    Chosen,
    Ranked,
    Setup,
    Stages,
    _describe,
    _label,
    correct_vs_error,
    eos_split,
    format_summary,
    make_summary,
    write_outputs,
)
from .settings import DemoConfig  # its settings, defined apart so that the command line imports them light

RUNTIME = ("out", "device", "threads", "shard", "id_budget")  # how the demo runs, not what it computes
CHECKPOINTS = models.SHIPPED
TRAIN_STEPS = 1500  # the shipped reversal model (scripts/train_default.py)
OTHER_TASK_STEPS = 1000  # a modest budget for tasks without a shipped model
MODEL = dict(n_layers=2, d_model=128, n_heads=8, d_mlp=512)
QUICK_MODEL = dict(n_layers=2, d_model=32, n_heads=4, d_mlp=64)
MIN_CTX = 128  # 1 BOS + 50 + '=' + 50 + EOS = 103 for reversal OOD


logger = logging.getLogger(__name__)


def train_model(task: str, steps: int = TRAIN_STEPS, seed: int = 0, quick: bool = False, progress: bool = True):
    """Train the default tiny model on `task`'s ID preset; returns (model, tokenizer, meta with ID/OOD accuracy)."""
    tokenizer = CharTokenizer()
    id_task, ood_task = tasks.preset(task, "id"), tasks.preset(task, "ood")
    n_ctx = max(MIN_CTX, models.check_context(10**9, ood_task, tokenizer.offset))
    model = models.tiny(tokenizer, **(QUICK_MODEL if quick else MODEL), n_ctx=n_ctx, seed=seed, task=ood_task)
    config = TrainConfig.scratch(steps=steps, seed=seed, warmup=min(100, steps // 10), log_every=50)
    n_eval = 32 if quick else 200
    eval_data = {"id": id_task.generate(n_eval, seed=10_001), "ood": ood_task.generate(n_eval, seed=10_002)}
    result = train(model, tokenizer, id_task, config, eval_data=eval_data, progress=progress)
    evals = {r["split"]: {k: r[k] for k in ("exact", "partial", "n")}
             for r in result.history if r.get("kind") == "eval"}
    meta: dict[str, Any] = {"task": task, "task_params": id_task.params(), "ood_params": ood_task.params(),
                            "steps": steps, "seed": seed, "eval": evals, "train_config": asdict(config),
                            "architecture": dict(QUICK_MODEL if quick else MODEL, n_ctx=n_ctx)}
    return result.model.eval(), tokenizer, meta


# ----------------------------------------------------------------------------------------------- settings
def ood_task(cfg: DemoConfig):
    """The OOD task of the demo: the preset with the task's own demo overrides (`Task.demo_ood`, `quick_ood` under
    --quick: reversal lengths 11-20, 11-14) unless `cfg.ood` says otherwise."""
    cls = tasks.task_class(cfg.task)
    return tasks.preset(cfg.task, "ood", **{**(cls.quick_ood if cfg.quick else cls.demo_ood), **cfg.ood})


# ----------------------------------------------------------------------------------------------- model
def get_model(cfg: DemoConfig, progress: bool = True):
    """(model, tokenizer, description, meta): the shipped checkpoint, or a freshly trained model (with a progress
    bar unless `progress` is False)."""
    shipped = CHECKPOINTS / cfg.task
    if cfg.model is not None:
        model, tokenizer, meta = models.load(cfg.model, device=cfg.device)
        return model, tokenizer, f"checkpoint {cfg.model}", dict(meta)
    if not cfg.train and (shipped / "config.json").is_file():
        model, tokenizer, meta = models.load(shipped, device=cfg.device)
        return model, tokenizer, f"shipped checkpoint aspan/checkpoints/{cfg.task}", dict(meta)
    steps = cfg.steps or (30 if cfg.quick else TRAIN_STEPS if cfg.task == "reversal" else OTHER_TASK_STEPS)
    why = ("--train given" if cfg.train else f"no checkpoint ships for {cfg.task!r}, only for reversal"
           if cfg.task != "reversal" else f"the shipped checkpoint {shipped} is missing")
    logger.info("training a tiny model on %s for %d steps (%s); this takes a few minutes on CPU", cfg.task, steps, why)
    model, tokenizer, meta = train_model(cfg.task, steps=steps, seed=cfg.seed, quick=cfg.quick, progress=progress)
    if cfg.device:
        model.to(cfg.device)
    return model, tokenizer, f"trained here for {steps} steps", meta


# ----------------------------------------------------------------------------------------------- stages
def best_delta(offsets: pd.DataFrame, k: int) -> int:
    """The offset whose top-`k` heads put the most attention on the shifted references (the smallest
    `abs(delta)` on ties)."""
    top = offsets.sort_values("score_row", ascending=False).groupby("delta").head(k).groupby("delta").score_row.mean()
    return int(sorted(top.index, key=lambda d: (-round(float(top[d]), 12), abs(d), d))[0])


def setup(cfg: DemoConfig, progress: bool = True) -> Setup:
    """Load (or train) the model; the engine on the demo's evaluation sets (seeds: ID +1, selection +2, held-out +3)."""
    id_t, ood_t = tasks.preset(cfg.task, "id"), ood_task(cfg)
    model, tokenizer, source, meta = get_model(cfg, progress)
    models.check_context(model, ood_t, tokenizer.offset)
    data = Data(cfg.task, ood_params=ood_t.params(), n=cfg.samples)
    model_id = (cfg.task if source.startswith("shipped") else f"checkpoint:{weights_digest(cfg.model)}"
                if cfg.model is not None else f"trained:{settings_key(meta)}")
    return Setup(model, tokenizer, source, meta, id_t, ood_t, Engine(model, tokenizer, data, attn=False), model_id)


def weights_digest(path: str) -> str:
    """A checkpoint's identity in grid keys: the SHA-256 (first 16 hex digits) of its weight files, so a run
    directory reuses rows only for the same weights, wherever the checkpoint lies."""
    import hashlib

    digest = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")) or sorted(Path(path).glob("*.bin")):
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def rank_heads(s: Setup, cfg: DemoConfig) -> Ranked:
    """Rank heads on the ID set with the offset scan; the best offset for the largest head selection."""
    rank = Ranking(by="score_row", samples=cfg.samples, seed=cfg.seed + 1, convention=cfg.convention)  # ID set
    offsets = s.engine.offsets(rank.settings(0), cfg.deltas)
    k_max = min(max(cfg.tops), s.model.cfg.n_layers * s.model.cfg.n_heads)
    d_star = best_delta(offsets, k_max)
    at = lambda d: ranking.select_heads(offsets[offsets.delta == d], top=k_max, by="score_row")  # noqa: E731
    return Ranked(offsets, ranking.ranking_from_offsets(offsets), rank, d_star, k_max, at(0), at(d_star))


def baseline(s: Setup, r: Ranked, cfg: DemoConfig) -> Baseline:
    """The unedited model on the ID and held-out OOD sets (AttnScores on the top heads at ref and at ref+d*)."""
    g, eng = min(cfg.gen_samples, cfg.samples), s.engine
    id_s, ood_s = eng.samples("id", cfg.seed), eng.samples("held_out", cfg.seed)
    ev = lambda samples, **kw: evaluation.evaluate(s.model, s.tokenizer, samples, **kw)  # noqa: E731
    base_id, base_ood = ev(id_s, heads=r.top0), ev(ood_s, heads=r.top0)
    shifted = ev(ood_s, heads=r.top_d, delta=r.d_star).records.attn_heads_sample
    base_ood.records[f"attn_heads_sample_{story.ref_label(r.d_star)}"] = shifted.to_numpy()
    return Baseline(base_id, base_ood, ev(id_s[:g], mode="generate", attn=False),
                    ev(ood_s[:g], mode="generate", attn=False), ev(id_held_out(s, cfg), attn=False))


def id_held_out(s: Setup, cfg: DemoConfig) -> list:
    """The held-out ID set: ID samples no choice saw, none of them in the engine's ID set (which prices the ID cost
    of every edit and ranks the heads): the engine's `id_report` set."""
    return s.engine.data.samples(ID_REPORT, cfg.seed)


def search_config(cfg: DemoConfig) -> tuple[SearchConfig, tuple[str, ...]]:
    """The causal search's sizes and the variants tried on its proposal (small with --quick)."""
    if cfg.quick:
        return (SearchConfig(deltas=(0, 2), profile=3, max_heads=3, id_budget=cfg.id_budget, eos=cfg.eos),
                ("patch", "reinforce C=5"))
    deltas = tuple(d for d in cfg.deltas if d >= -1)
    return SearchConfig(deltas=deltas, id_budget=cfg.id_budget, eos=cfg.eos), tuple(causal.VARIANTS)


def grid_points(s: Setup, r: Ranked, cfg: DemoConfig) -> list[dict]:
    """Top heads x strengths, at the best offset and at offset 0 (heads ranked at the same offset)."""
    tops = sorted({min(k, r.k_max) for k in cfg.tops})
    return [point(s.engine.data, s.model_id, f"top:{k}", c, delta=d, seed=cfg.seed, rank=r.rank)
            for d in dict.fromkeys([r.d_star, 0]) for k in tops for c in cfg.strengths]


def sweep(s: Setup, r: Ranked, cfg: DemoConfig, run: RunDir, extra: list[dict]) -> pd.DataFrame:
    """The grid and the search's `extra` points on the OOD selection set (rows resumable in sweep.jsonl, or one
    shard's file with `cfg.shard`)."""
    points = grid_points(s, r, cfg) + extra
    rows = pd.DataFrame(run_in_dir(points, run.path, cfg.shard, s.engine))
    rows["top"] = [int(h.partition(":")[2]) if h.startswith("top:") else len(hl)
                   for h, hl in zip(rows.heads, rows.heads_list)]
    rows["head_names"] = ["+".join(story.head_names([tuple(x) for x in h])) for h in rows.heads_list]
    rows["label"] = [_label(row) for row in rows.to_dict("records")]
    return rows


def conditions(rows: pd.DataFrame, cfg: DemoConfig) -> dict[str, Selection]:
    """The engine's rule on the selection rows: the paper's recipe (reinforcement at the references by attention
    share, any ID cost), the selected edit (every row, within the budget), the patching upper bound (any ID cost)."""
    paper = rows[(rows.method == "reinforce") & (rows.delta == 0)]
    patch = rows[[causal.is_patch(row) for row in rows.to_dict("records")]]
    return {"paper_recipe": select(paper, None), "selected": select(rows, cfg.id_budget),
            "upper_bound": select(patch, None)}


def held_out(s: Setup, cfg: DemoConfig, row: dict, label: str) -> Chosen:
    """The chosen point on the held-out OOD set: the engine's row, plus records, ID records and generation."""
    p = on_set(row, "held_out")
    heads = [tuple(h) for h in row["heads_list"]]
    edit = s.engine.edit(p, heads)
    ev = lambda name, **kw: evaluation.evaluate(  # noqa: E731
        s.model, s.tokenizer, s.engine.samples(name, cfg.seed), fwd_hooks=edit, **kw)
    g = min(cfg.gen_samples, cfg.samples)
    gen = evaluation.evaluate(s.model, s.tokenizer, s.engine.samples("held_out", cfg.seed)[:g], fwd_hooks=edit,
                              mode="generate", attn=False)
    id_held = evaluation.evaluate(s.model, s.tokenizer, id_held_out(s, cfg), fwd_hooks=edit, attn=False)
    return Chosen(label, s.engine.row(p), heads, edit, ev("held_out", attn=False), ev("id", attn=False), gen, id_held)


# ----------------------------------------------------------------------------------------------- the run
def run_demo(cfg: DemoConfig, command: str = "aspan demo", log: Callable[[str], None] | None = None,
             progress: bool = True) -> dict[str, Any]:
    """Run the demo end to end, holding `cfg.out` for this job and configuration; writes it (run dir + report.html)
    and returns the summary dict. `progress`: the progress bars (over the stages, and over training when it
    trains). The summary's text goes to `log` (`aspan demo` prints it; the default logs it at INFO)."""
    cfg.check()
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # one job per shard, one configuration per run directory (shards and the ID budget share the rows)
    try:
        with claim_config(cfg.out, "demo", cfg, RUNTIME, shard=cfg.shard, command=command):
            return _run(cfg, command, log or logger.info, progress)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: DemoConfig, command: str, log, progress: bool) -> dict[str, Any]:
    """The stages in order, with a progress bar (unless `progress` is False); the outputs; the printed tables."""
    t0, run = time.perf_counter(), RunDir(cfg.out)
    bar = tqdm(total=8, desc="demo", dynamic_ncols=True, disable=not progress)
    s = setup(cfg, progress)
    r = rank_heads(s, cfg)
    bar.update(1)
    searched = causal.search(s.engine, s.model_id, cfg.seed, *search_config(cfg))
    bar.update(1)
    rows = sweep(s, r, cfg, run, searched.points)
    bar.update(1)
    if cfg.shard is not None:
        bar.close()
        logger.info("shard %d/%d: %d grid rows in %s; run without --shard to finish", *cfg.shard, len(rows), run.path)
        return {"rows": len(rows)}
    base = baseline(s, r, cfg)
    bar.update(1)
    chosen: dict[str, Chosen] = {}
    done: dict[str, Chosen] = {}  # one held-out evaluation per distinct edit
    picked = {name: sel.row for name, sel in conditions(rows, cfg).items()}
    for name, row in picked.items():
        if row is not None:
            if row["key"] not in done:
                done[row["key"]] = held_out(s, cfg, row, name)
            chosen[name] = done[row["key"]]
    bar.update(1)
    stages = Stages(s, r, base, rows, chosen, picked, searched, causal.rankings_compared(r.table, searched.proposal))
    summary = make_summary(cfg, stages)
    write_outputs(run, cfg, stages)
    bar.update(2)
    run.write_json("run.json", run_info(cfg, s, command, t0))
    summary["wall_seconds"] = round(time.perf_counter() - t0, 1)
    run.write_json("summary.json", summary)
    summary["report"] = str(write_report(run.path))
    bar.update(1)
    bar.close()
    log(format_summary(summary, s, min(cfg.gen_samples, cfg.samples)))
    return summary


def run_info(cfg: DemoConfig, s: Setup, command: str, t0: float) -> dict[str, Any]:
    """run.json: what was run, on what, with which versions; the trained model is saved beside it."""
    info = {
        "command": command, "task": cfg.task, "id_params": s.id_task.params(), "ood_params": s.ood_task.params(),
        "model": s.source, "model_config": _describe(s.model), "model_meta": s.meta, "seed": cfg.seed,
        "samples": cfg.samples, "gen_samples": min(cfg.gen_samples, cfg.samples), "tops": list(cfg.tops),
        "strengths": list(cfg.strengths), "deltas": list(cfg.deltas), "quick": cfg.quick, "id_budget": cfg.id_budget,
        "eos": list(cfg.eos), "convention": cfg.convention,
        **run_environment(s.model, extra=("circuitsvis", "plotly")),
        "data_seeds": {"id": cfg.seed + 1, "ood_selection": cfg.seed + 2, "ood_held_out": cfg.seed + 3,
                       "id_held_out": cfg.seed + SEED_OFFSET[ID_REPORT]},
    }
    if "trained here" in s.source:
        models.save(s.model, Path(cfg.out) / "model", s.tokenizer, **s.meta)
        info["saved_model"] = str(Path(cfg.out) / "model")
    info["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return info
