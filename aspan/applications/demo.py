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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import evaluation, models, tasks
from ..checks import check_device, check_output_dir
from ..environment import run_environment
from ..experiments import ranking
from ..experiments.edit import Edit
from ..experiments.engine import (
    ID_BUDGET,
    Data,
    Engine,
    Ranking,
    Selection,
    on_set,
    point,
    rule_text,
    run_in_dir,
    select,
)
from ..experiments.search import SearchConfig, encode_atoms
from ..io import RunDir, settings_key
from ..options import CONVENTIONS, EOS_REFS, Convention, EosRefs, check_option
from ..report import write_report
from ..tokenization import CharTokenizer
from ..training import TrainConfig, train
from ..viz import pareto_figure, story
from . import causal
from .claims import claim_config

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
@dataclass
class DemoConfig:
    """What `aspan demo` runs; `quick_config()` gives tiny sizes for tests."""

    task: str = "reversal"
    out: str = "runs/demo"
    samples: int = 100  # per evaluation set (ID, OOD selection, OOD held-out, ID held-out)
    gen_samples: int = 32  # greedy generation is run on this many samples per split
    seed: int = 0
    train: bool = False
    steps: int | None = None
    quick: bool = False
    device: str | None = None
    threads: int | None = 1  # torch CPU threads: 1 is several times faster than 2 for a tiny model on busy cores
    tops: tuple[int, ...] = (1, 2, 4)
    strengths: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0)
    deltas: tuple[int, ...] = (-2, -1, 0, 1, 2, 3)
    ood: dict = field(default_factory=dict)  # overrides of the OOD preset (reversal: lengths 11-20)
    id_budget: float = ID_BUDGET  # the selection rule's budget on the drop of ID exact accuracy (a fraction)
    shard: tuple[int, int] | None = None  # only this shard of the grid (sweep.shard-I-of-N.jsonl), then stop
    rank_convention: Convention = "raw"  # AttnScore convention of the attention-share ranking (sample or raw)
    eos: tuple[EosRefs, ...] = EOS_REFS  # the search tries each treatment of the end-of-sequence row (Edit.eos)

    @classmethod
    def toml_fields(cls, raw: dict[str, Any], path: Any = None) -> dict[str, Any]:
        """The fields a `--config` file sets (`aspan.config.load_config`'s hook): its keys, less a `[slurm]` table
        (the resources of `--launcher slurm`, `aspan.applications.launch`)."""
        return {k: v for k, v in raw.items() if k != "slurm"}

    @classmethod
    def quick_config(cls, **kw: Any) -> "DemoConfig":
        """The `--quick` configuration (fewer samples, a smaller grid), `kw` overriding it."""
        base = dict(samples=24, gen_samples=8, tops=(1, 2), strengths=(1.0, 4.0), deltas=(-1, 0, 1, 2), quick=True)
        return cls(**{**base, **kw})

    def check(self) -> None:
        """ValueError on impossible settings, before any work."""
        tasks.task_class(self.task)  # unknown task -> ValueError naming the choices
        if self.samples < 4 or self.gen_samples < 1:
            raise ValueError(f"--samples must be >= 4 and gen_samples >= 1, got {self.samples}, {self.gen_samples}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {self.steps}")
        if not self.tops or min(self.tops) < 1 or not self.strengths or 0 not in self.deltas:
            raise ValueError("tops must be >= 1, strengths non-empty and deltas must contain 0")
        if not self.id_budget >= 0:
            raise ValueError(f"--id-budget must be >= 0, got {self.id_budget}")
        check_option("--rank-convention", self.rank_convention, CONVENTIONS)
        if not self.eos or any(e not in EOS_REFS for e in self.eos):
            raise ValueError(f"eos must be a non-empty tuple of {', '.join(map(repr, EOS_REFS))}, got {self.eos!r}")
        check_device(self.device, "--device")
        check_output_dir(self.out, "--out")


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


def _describe(model) -> str:
    c = model.cfg
    return f"{c.n_layers} layers x {c.n_heads} heads, d_model {c.d_model}, n_ctx {c.n_ctx}"


# ----------------------------------------------------------------------------------------------- stages
def best_delta(offsets: pd.DataFrame, k: int) -> int:
    """The offset whose top-`k` heads put the most attention on the shifted references (the smallest
    `abs(delta)` on ties)."""
    top = offsets.sort_values("score_row", ascending=False).groupby("delta").head(k).groupby("delta").score_row.mean()
    return int(sorted(top.index, key=lambda d: (-round(float(top[d]), 12), abs(d), d))[0])


@dataclass
class Setup:
    """Stage 1: the model, its evaluation sets and the engine that evaluates interventions on them."""

    model: Any
    tokenizer: Any
    source: str  # where the model came from, in words
    meta: dict
    id_task: Any
    ood_task: Any
    engine: Engine
    model_id: str  # names the model in every grid point's key (a rerun reuses rows only for the same model)


@dataclass
class Ranked:
    """Stage 2: the offset scan on the ID set, the ranking, the best offset and its top heads."""

    offsets: pd.DataFrame
    table: pd.DataFrame
    rank: Ranking
    d_star: int
    k_max: int
    top0: list  # top heads at the references (AttnScore heads)
    top_d: list  # top heads at the best offset


@dataclass
class Baseline:
    """Stage 3: the unedited model, teacher-forced on the ID and held-out OOD sets, and generated."""

    id: evaluation.EvalResult
    ood: evaluation.EvalResult
    gen_id: evaluation.EvalResult
    gen_ood: evaluation.EvalResult
    id_held: evaluation.EvalResult  # the held-out ID set (seed + 4)


@dataclass
class Chosen:
    """Stage 5: an intervention the rule chose, on the held-out OOD set (engine row) with records and generation."""

    label: str  # what it is, for the tables
    row: dict  # the engine's row on the held-out set (matched baseline, ID result, ID cost)
    heads: list
    edit: Callable
    ood: evaluation.EvalResult
    id: evaluation.EvalResult
    gen: evaluation.EvalResult
    id_held: evaluation.EvalResult  # the held-out ID set (seed + 4): not used by any choice


def setup(cfg: DemoConfig, progress: bool = True) -> Setup:
    """Load (or train) the model; the engine on the demo's evaluation sets (seeds: ID +1, selection +2, held-out +3)."""
    id_t, ood_t = tasks.preset(cfg.task, "id"), ood_task(cfg)
    model, tokenizer, source, meta = get_model(cfg, progress)
    models.check_context(model, ood_t, tokenizer.offset)
    data = Data(cfg.task, ood_params=ood_t.params(), n=cfg.samples)
    model_id = cfg.task if source.startswith("shipped") else f"trained:{settings_key(meta)}"
    return Setup(model, tokenizer, source, meta, id_t, ood_t, Engine(model, tokenizer, data, attn=False), model_id)


def rank_heads(s: Setup, cfg: DemoConfig) -> Ranked:
    """Rank heads on the ID set with the offset scan; the best offset for the largest head selection."""
    rank = Ranking(by="score_row", samples=cfg.samples, seed=cfg.seed + 1, convention=cfg.rank_convention)  # ID set
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
    """The held-out ID set: ID samples no choice saw (the engine's ID set prices the ID cost of every edit)."""
    return s.id_task.generate(cfg.samples, seed=cfg.seed + causal.ID_HELD_OUT)


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


def _label(row: dict) -> str:
    if row["method"] == "atoms":
        return causal.label(row)
    names = "+".join(story.head_names([tuple(h) for h in row["heads_list"]]))
    return f"{row['method']} {names} at {story.ref_label(row['delta'])}, C={row['strength']:g}"


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
    compared = causal.rankings_compared(r.table, searched.proposal)
    summary = make_summary(cfg, s, r, base, chosen, rows, (searched, compared))
    write_outputs(run, cfg, s, r, base, chosen, rows, (searched, compared, picked))
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
        "eos": list(cfg.eos),
        **run_environment(s.model, extra=("circuitsvis", "plotly")),
        "data_seeds": {"id": cfg.seed + 1, "ood_selection": cfg.seed + 2, "ood_held_out": cfg.seed + 3,
                       "id_held_out": cfg.seed + causal.ID_HELD_OUT},
    }
    if "trained here" in s.source:
        models.save(s.model, Path(cfg.out) / "model", s.tokenizer, **s.meta)
        info["saved_model"] = str(Path(cfg.out) / "model")
    info["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return info


# ----------------------------------------------------------------------------------------------- results
def _acc(result) -> tuple[float, float]:
    s = result.summary()
    return s["exact"], s["partial"]


def _result(id_res, ood_res, method: str, heads: list, rule: str) -> dict[str, Any]:
    """One condition of summary.json (fixed keys): held-out ID and held-out OOD accuracy, what it is, how chosen."""
    (ie, ip), (oe, op) = _acc(id_res), _acc(ood_res)
    return {"id_exact": ie, "id_partial": ip, "ood_exact": oe, "ood_partial": op, "method": method,
            "heads": [list(h) for h in heads], "rule": rule}


RULES = {"paper_recipe": "paper's recipe (additive C on the top heads by attention share at the references); C by "
                         "the largest OOD exact gain at any ID cost, as in the paper",
         "upper_bound": "pattern patching only (uniform attention on the shifted references)"}


def make_summary(cfg, s: Setup, r: Ranked, base: Baseline, chosen: dict[str, Chosen], rows, extra) -> dict:
    """summary.json: the four conditions (held-out OOD and held-out ID), the rule, Table 3, the tables.

    Seven arguments: the stage results of the run (as `write_outputs`), each summarised by its own part below.
    """
    searched, compared = extra
    cve = correct_vs_error(base.ood.records, r.d_star)
    entries = {"baseline": _result(base.id_held, base.ood, "none", [], "no intervention")}
    details = {}
    for name in causal.NAMES[1:]:
        c = chosen.get(name)
        budget = cfg.id_budget if name == "selected" else None
        why = rule_text(budget) if name == "selected" else f"{RULES[name]}; {rule_text(budget)}"
        entries[name] = None if c is None else _result(c.id_held, c.ood, _label(c.row), c.heads, why)
        details[name] = None if c is None else {
            "id_cost": c.row["id_cost"], "id_exact_engine_set": _acc(c.id)[0], "grid_key": c.row["key"],
            "method": c.row["method"], "delta": c.row["delta"], "strength": c.row["strength"],
            "heads": c.row["heads"], "ood_generate_exact": _acc(c.gen)[0], "ood_generate_partial": _acc(c.gen)[1],
            **eos_split(c.ood.records)}
    details["baseline"] = eos_split(base.ood.records)
    roll = cve["rollout (ref, sample)"]
    flat = {
        "task": cfg.task, "rule": rule_text(cfg.id_budget), "id_budget": cfg.id_budget, "candidates": len(rows),
        "eos": list(cfg.eos),
        "id_exact": _acc(base.id)[0], "id_partial": _acc(base.id)[1],
        "ood_exact": _acc(base.ood)[0], "ood_partial": _acc(base.ood)[1],
        "ood_generate_exact": _acc(base.gen_ood)[0], "ood_generate_partial": _acc(base.gen_ood)[1],
        "best_offset": r.d_star, "best_offset_heads": "+".join(story.head_names(r.top_d)),
        "attn_rollout_sample_correct": roll["mean_correct"], "attn_rollout_sample_error": roll["mean_error"],
        "welch_t": roll["t"], "welch_p": roll["p"],
        "search": {"atoms": encode_atoms(searched.proposal.atoms), "beyond": searched.beyond,
                   **{k: _num(v) for k, v in compared.attrs.items()}},
    }
    keep = ("mean_correct", "sem_correct", "n_correct", "mean_error", "sem_error", "n_error", "t", "p")
    cve_rows = [{"score": k, **{m: v[m] for m in keep}} for k, v in cve.items()]
    headline = _headline(entries, chosen, base, min(cfg.gen_samples, cfg.samples))
    tables = {"headline": headline.to_dict("records"), "correct_vs_error": cve_rows,
              "rankings_compared": compared.head(10).to_dict("records")}
    return {**flat, **entries, "details": details, "tables": tables}


def eos_split(records: pd.DataFrame) -> dict[str, float]:
    """What exact accuracy is made of on held-out OOD: samples with every target character right, and the
    accuracy of the end-of-sequence token (a target without a reference set, which no reference edit reaches)."""
    chars, eos = records[~records.eos], records[records.eos]
    return {"ood_all_chars_right": float(chars.groupby("sample_id").correct.all().mean()),
            "ood_eos_accuracy": float(eos.correct.mean()) if len(eos) else float("nan")}


def _num(x) -> float | None:
    return None if x is None or x != x else float(x)


CONDITIONS = {"baseline": "baseline", "paper_recipe": "paper's recipe", "selected": "selected (within budget)",
              "upper_bound": "patching upper bound"}


def _headline(entries: dict, chosen: dict[str, Chosen], base: Baseline, g: int) -> pd.DataFrame:
    """Teacher-forced held-out numbers of each condition (ID cost on the held-out ID set), then generation."""
    nan, b = float("nan"), entries["baseline"]
    rows = [(CONDITIONS[k], "teacher-forced", e["id_exact"], e["id_partial"], e["ood_exact"], e["ood_partial"],
             b["id_exact"] - e["id_exact"]) for k, e in entries.items() if e is not None]
    rows.append(("baseline", f"generated ({g} samples)", *_acc(base.gen_id), *_acc(base.gen_ood), nan))
    if "selected" in chosen:
        rows.append((CONDITIONS["selected"], f"generated ({g} samples)", nan, nan, *_acc(chosen["selected"].gen), nan))
    return pd.DataFrame(rows, columns=["model", "mode", "ID exact", "ID per-token", "OOD exact", "OOD per-token",
                                       "ID cost"])


def correct_vs_error(records: pd.DataFrame, d_star: int) -> dict[str, dict]:
    """AttnScore of correct vs wrong OOD tokens (Table 3): rollout (both conventions) and top heads on references,
    and at ref+delta*; `sample` divides by the mass on the sample's own columns, `raw` by the whole row."""
    cols = {"rollout (ref, sample)": "attn_rollout_sample", "rollout (ref, raw)": "attn_rollout_raw",
            "top heads (ref, sample)": "attn_heads_sample"}
    if d_star:
        cols[f"top heads ({story.ref_label(d_star)}, sample)"] = f"attn_heads_sample_{story.ref_label(d_star)}"
    return {label: evaluation.correct_vs_error(records, col) for label, col in cols.items()}


# ----------------------------------------------------------------------------------------------- files
def write_outputs(run: RunDir, cfg, s: Setup, r: Ranked, base: Baseline, chosen: dict[str, Chosen], rows, extra
                  ) -> None:
    """Tables (CSV), records (JSONL) and the figures and views of the story.

    Eight arguments: the stage results of the run, each written by its own part below.
    """
    searched, compared, picked = extra
    shown = chosen.get("selected") or chosen.get("upper_bound")
    run.write_csv("ranking.csv", r.table)
    run.write_csv("offsets.csv", r.offsets)
    run.write_csv("sweep.csv", rows.drop(columns=["by_length", "baseline_by_length"]))
    run.write_csv("rankings_compared.csv", compared)
    run.write_csv("search_estimates.csv", searched.proposal.estimates)
    run.write_csv("search_greedy.csv", searched.proposal.greedy)
    parts = [evaluation.summarize(base.id).assign(split="id", model="baseline"),
             evaluation.summarize(base.ood).assign(split="ood", model="baseline")]
    if shown:
        parts += [evaluation.summarize(shown.id).assign(split="id", model="reinforced"),
                  evaluation.summarize(shown.ood).assign(split="ood", model="reinforced")]
        run.records("records_ood_reinforced.jsonl", shown.ood.records)
    else:
        run.remove("records_ood_reinforced.jsonl")
    run.write_csv("by_length.csv", pd.concat(parts, ignore_index=True))
    run.records("records_ood.jsonl", base.ood.records)
    id_s, ood_s = s.engine.samples("id", cfg.seed), s.engine.samples("held_out", cfg.seed)
    view_heads = list(dict.fromkeys([*(shown.heads if shown else []), *r.top_d]))[:4]
    story.write_attention_views(run, story.AttentionViews(s.model, s.tokenizer, id_s, ood_s, view_heads, r.top_d[0],
                                                          r.d_star, shown.edit if shown else None))
    story.write_ranking_figures(run, story.RankingFigures(r.offsets, r.table, s.model.cfg.n_layers,
                                                          s.model.cfg.n_heads, r.d_star),
                                ("05_offset_scan", "06_heads_ref", "07_heads_best_offset"))
    id_max = int(base.id.samples.length.max())
    curves = {"baseline": pd.concat(parts[:2])}
    if shown:
        curves["reinforced"] = pd.concat(parts[2:])
    cve = correct_vs_error(base.ood.records, r.d_star)
    grid = rows[rows.method == "reinforce"]
    story.write_accuracy_figures(run, story.AccuracyFigures(
        curves, grid.assign(offset=grid.delta.map(story.ref_label)), ["offset", "top"],
        float(rows.baseline_partial.iloc[0]), id_max if id_max < int(base.ood.samples.length.min()) else None,
        "", cve), ("04_correct_vs_error", "08_accuracy_vs_length", "09_accuracy_vs_strength"))
    marked = {k: row for k, row in picked.items() if row is not None}
    run.figure(pareto_figure(rows.assign(method=[_family(x) for x in rows.to_dict("records")]), marked=marked,
                             budget=cfg.id_budget,
                             title="OOD exact gain vs ID cost of every edit evaluated (OOD selection set)"),
               "10_pareto")


def _family(row: dict) -> str:
    """The colour group of an edit in the Pareto figure."""
    if row["method"] != "atoms":
        return f"{row['method']} (attention-share ranking)"
    edits = [Edit.from_atom(atom) for atom in row["atoms"]]
    (method, renorm, gated), *_ = sorted({(e.method, e.renormalize, e.beyond is not None) for e in edits})
    eos = any(e.eos != "none" for e in edits)
    return (f"{'renormalised ' if renorm else ''}{method} (causal search{', gated' if gated else ''}"
            f"{', EOS row extrapolated' if eos else ''})")


# ----------------------------------------------------------------------------------------------- printing
def _f(x: float | None, pct: bool = False) -> str:
    return "-" if x is None or x != x else (f"{100 * x:.2f}" if pct else f"{x:.3f}")


def format_summary(summary: dict, s: Setup, g: int) -> str:
    """The short tables `aspan demo` prints: the four conditions, Table 3, the two rankings, the rule."""
    head = pd.DataFrame(summary["tables"]["headline"])
    for col in ("ID exact", "ID per-token", "OOD exact", "OOD per-token", "ID cost"):
        head[col] = head[col].map(_f)
    cve = pd.DataFrame(summary["tables"]["correct_vs_error"])
    cve_txt = pd.DataFrame({
        "AttnScore (OOD tokens)": cve.score,
        "correct (%)": [f"{_f(m, True)} ± {_f(e, True)}" for m, e in zip(cve.mean_correct, cve.sem_correct)],
        "wrong (%)": [f"{_f(m, True)} ± {_f(e, True)}" for m, e in zip(cve.mean_error, cve.sem_error)],
        "Welch t": cve.t.map(lambda t: "-" if t is None or t != t else f"{t:.1f}"),
        "p": cve.p.map(lambda p: "-" if p is None else f"{p:.2g}"),
    })
    lines = [
        "", f"aspan demo: {summary['task']} | model: {s.source} ({_describe(s.model)})",
        f"ID: {_params(s.id_task)} | OOD: {_params(s.ood_task)} | held-out OOD and ID sets; generation on {g} "
        "samples per split", "",
        _text_table(head, 2), "",
        *[f"{CONDITIONS[k]}: {summary[k]['method'] if summary[k] else 'none (no edit improves OOD)'}"
          for k in causal.NAMES[1:]],
        f"Selection rule: {summary['rule']}.", *_eos_line(summary), "", _text_table(cve_txt), "",
        f"Best offset on ID: {story.ref_label(summary['best_offset'])} (top heads {summary['best_offset_heads']}).",
        *_rankings_lines(summary),
        f"Report: {summary['report']}  ({summary['wall_seconds']:.0f} s)",
    ]
    return "\n".join(lines)


def _eos_line(summary: dict) -> list[str]:
    d, b = summary["details"].get("selected"), summary["details"]["baseline"]
    if d is None or d["ood_eos_accuracy"] != d["ood_eos_accuracy"]:
        return []
    extrapolated = "EOS row extrapolated" in summary["selected"]["method"]
    why = ("the selected edit also edits its row on the reference map continued one row" if extrapolated else
           "its row has no references of its own (the search's edits of it on the reference map continued one "
           "row were not selected)" if "extrapolate" in summary.get("eos", []) else
           "its row has no references for an edit to act on")
    return [f"Exact accuracy counts the end-of-sequence token: with the selected edit {_f(d['ood_all_chars_right'])} "
            f"of held-out OOD samples get every character right; EOS is right in {_f(d['ood_eos_accuracy'])} "
            f"(baseline {_f(b['ood_eos_accuracy'])}); {why}."]


def _rankings_lines(summary: dict) -> list[str]:
    """The causal ranking beside the paper's attention-share rank, and their rank correlation."""
    ranks = pd.DataFrame(summary["tables"]["rankings_compared"])
    txt = pd.DataFrame({
        "causal rank": ranks.causal_rank, "head": [f"L{l}H{h}" for l, h in zip(ranks.layer, ranks["head"])],
        "offset": ranks.delta.map(story.ref_label), "estimate": ranks.estimate.map(lambda x: f"{x:.3f}"),
        "effect (per-token)": ranks.effect.map(_f), "paper's rank": ranks.paper_rank,
    })
    rho = summary["search"]
    return ["Heads ranked causally (attribution estimate of patching each head alone at its best offset; measured "
            "effect on per-token accuracy for the heads profiled exactly) beside the paper's attention-share rank:",
            _text_table(txt),
            f"Spearman: paper's score vs causal estimate {_f(rho.get('spearman_paper_vs_estimate'))}, estimate vs "
            f"measured effect {_f(rho.get('spearman_estimate_vs_effect'))}."]


def _text_table(df: pd.DataFrame, n_text: int = 1) -> str:
    """Plain-text table: the first `n_text` columns left-aligned, the others right-aligned."""
    cells = [[str(c) for c in df.columns]] + [[str(v) for v in row] for row in df.itertuples(index=False)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(df.columns))]
    left = [i < n_text for i in range(len(df.columns))]
    return "\n".join("  ".join(c.ljust(w) if lf else c.rjust(w) for c, w, lf in zip(r, widths, left)).rstrip()
                     for r in cells)


def _params(task) -> str:
    items = task.params().items()
    return ", ".join(f"{k}={tuple(v) if isinstance(v, list) else v}" for k, v in items if k != "charset")
