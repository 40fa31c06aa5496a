"""`aspan study abc`: attention biasing for length generalisation (Duan & Shi 2023, "From Interpolation to
Extrapolation: Complete Length Generalization for Arithmetic Transformers", arXiv 2310.11984).

Protocol (the paper's Section 6 and Tables 1 and 3, at the size a CPU allows): models trained from scratch on
numbers of 1 to 6 digits (bit strings of 1 to 6 bits for parity), the digit count drawn uniformly first; held-out
test sets of exactly 6, 10, 20 and 60 digits. Conditions, all at the same number of optimiser steps:

- `rotary`, `learned`, `alibi`, `none`: vanilla models with each positional encoding (none = NoPE);
- `abs`: attention bias scaffolding (Section 4): a fixed window of `abs_width` keys ending at each target row's
  aligned key (digit i of every operand for output digit i; bit i for parity), prompt rows see themselves and
  their predecessor; every other key gets a large negative score, in training and at evaluation;
- `abc`: attention bias calibration (Section 5): the lines of the trained `rotary` model's attention, averaged
  over the calibration samples it solves, threshold `mean + lam * std`, extended to every length; a fresh model
  is retrained under that bias for `retrain_steps` (the authors retrain for 1/100-1/10 of the original steps).

The bias models use `bias_positional` (default none: the bias carries all positional information; a rotary model
reads key distances it never saw at 60 digits). ABC can also run in arms (`abc_layouts`, `abc_layers`,
`abc_positionals`; `aspan.applications.studies.abc_arms`): the same calibration of the same rotary model, retrained
in Duan & Shi's padded layout, with one layer's lines on every layer, or with other positions. Every condition's
learning rate is chosen on seed 0 from `lrs` by mean exact accuracy on the selection sets (6 and 10 digits, their
own samples); the chosen rate then trains the other seeds; results are reported on the held-out test sets as the
mean over seeds with its 95 % interval (`aspan.intervals.seed_interval`). Exact accuracy is teacher-forced, which
equals greedy generation's exact match (a sequence is right under one iff under the other). Rows are keyed by their
settings in `runs.jsonl`: a rerun into the same directory computes only missing rows.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Sequence, get_args

from ... import tasks
from ...findings.tables import ABC_TABLE
from ...intervals import seed_interval
from ...io import RowWriter, settings_key
from ...tasks.base import Sample, Task
from ...tasks.draws import LengthMix
from ...tasks.split import distinct
from ...tokenization import CharTokenizer
from ...training import TrainConfig
from . import Study, Unit, protocol_fields, study_rows, unit_file, unit_index
from .abc_arms import AbcArm, PaddedDraw, arms, check_arms, layer_lines, padded_sample, prompt_lines
from .abc_outputs import AbcOutputs, write_abc_outputs

if TYPE_CHECKING:
    import pandas as pd

Condition = Literal["rotary", "learned", "alibi", "none", "abs", "abc"]
CONDITIONS: tuple[Condition, ...] = get_args(Condition)
StudyTask = Literal["successor", "addition", "parity"]
STUDY_TASKS: tuple[StudyTask, ...] = get_args(StudyTask)


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AbcStudyConfig:
    """Settings of one study run (defaults: the committed CPU run; `quick()` for tests; configs/ for a GPU)."""

    tasks: tuple[str, ...] = STUDY_TASKS  # tasks studied
    conditions: tuple[str, ...] = CONDITIONS  # conditions compared (abc needs rotary: its bias comes from it)
    seeds: tuple[int, ...] = (0, 1, 2)  # model/data seeds; the learning rate is chosen on the first
    lrs: tuple[float, ...] = (1e-3, 3e-3)  # learning-rate grid, chosen per task and condition
    steps: int = 300  # optimiser steps of every from-scratch training (equal budget)
    retrain_steps: int = 150  # ABC: steps of the retraining under the calibrated bias
    batch_size: int = 64
    warmup: int = 30
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 64
    train_max: int = 6  # longest training number (digits; bits for parity)
    buckets: tuple[int, ...] = (6, 10, 20, 60)  # held-out test lengths
    select_buckets: tuple[int, ...] = (6, 10)  # selection-set lengths (the learning rate is chosen on these)
    n_test: int = 100  # samples per test bucket
    n_select: int = 50  # samples per selection bucket
    n_calib: int = 192  # ABC calibration samples (training distribution; only the solved ones count)
    abs_width: int = 1  # ABS: keys per prompt segment in the window of a target row
    bias_positional: str = "none"  # positional encoding of the ABS and ABC models
    lam: float = 0.87  # ABC threshold: keep lines with sum >= mean + lam * std (the paper's self-attention value)
    abc_correct_only: bool = True  # ABC averages over correctly solved samples only (False: all, for --quick)
    # how the selection and test sets are drawn. "disjoint": each without repeats, and a test set never holds an
    # input of the selection set of its length (`disjoint_sets`); where a length has fewer inputs than n_select +
    # n_test (parity at 6 bits: 64), they are shared between the two in proportion to n_select : n_test, and
    # table.csv's n_test says how many each test set got. "with_replacement": the former independent draws
    # (repeats, and overlaps where the inputs are few); rows written before this setting existed carry no such key
    # and were drawn so
    set_draw: str = "disjoint"
    # ABC arms (`abc_arms`): every combination of these is one ABC condition, all calibrated on the same rotary
    # models. abc_layouts: the layout the fresh model trains and is tested in ("natural"; "padded": Duan & Shi's, every
    # operand zero-padded on the left to the longest test length); abc_layers: "each" (each layer's own lines) or the
    # index of the layer whose lines every layer gets (-1: the last, as Duan & Shi's Algorithm 1); abc_positionals:
    # the fresh model's positional encoding (empty: `bias_positional`); abc_prompts: the prompt rows' lines
    # ("calibrated"; "local": the diagonal ones only, no fixed position; "free": prompt rows unbiased, as Duan & Shi).
    # The defaults are the study's own ABC
    abc_layouts: tuple[str, ...] = ("natural",)
    abc_layers: tuple[int | str, ...] = ("each",)
    abc_positionals: tuple[str, ...] = ()
    abc_prompts: tuple[str, ...] = ("calibrated",)
    device: str = "cpu"

    @classmethod
    def toml_fields(cls, raw: dict[str, Any], path: Any = None) -> dict[str, Any]:
        """The fields a `--config` file sets (`aspan.config.load_config`'s hook): its keys, less a `[slurm]` table
        (the resources of `--launcher slurm`, `aspan.applications.launch`) and a `protocol = "aligned"` line
        (`protocol_fields`)."""
        return protocol_fields(raw, "aligned")

    @classmethod
    def quick(cls, **kw: Any) -> "AbcStudyConfig":
        """A tiny run for tests (well under a minute): every task and condition, one seed, one learning rate."""
        base = dict(seeds=(0,), lrs=(3e-3,), steps=12, retrain_steps=6, batch_size=8, warmup=2, n_layers=1,
                    n_heads=2, d_model=16, n_test=4, n_select=4, n_calib=8, abc_correct_only=False)
        return cls(**{**base, **kw})

    def check(self) -> None:
        """ValueError on impossible settings, before any work."""
        for name, values, allowed in (("tasks", self.tasks, STUDY_TASKS), ("conditions", self.conditions, CONDITIONS)):
            bad = [v for v in values if v not in allowed]
            if bad or not values:
                raise ValueError(f"{name} must be a non-empty subset of {', '.join(allowed)}, got {list(values)}")
        if "abc" in self.conditions and "rotary" not in self.conditions:
            raise ValueError("the abc condition calibrates on the rotary model: include rotary in conditions")
        for name in ("steps", "retrain_steps", "batch_size", "n_layers", "n_heads", "d_model", "train_max",
                     "n_test", "n_select", "n_calib", "abs_width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.seeds or not self.lrs or any(not 0 < lr < math.inf for lr in self.lrs):
            raise ValueError("seeds and lrs must be non-empty, learning rates finite and > 0")
        if min(self.buckets) < 1 or min(self.select_buckets) < 1:
            raise ValueError("bucket lengths must be >= 1")
        if self.set_draw not in ("disjoint", "with_replacement"):
            raise ValueError(f"set_draw must be disjoint or with_replacement, got {self.set_draw!r}")
        if self.bias_positional not in ("rotary", "learned", "alibi", "none"):
            raise ValueError(f"bias_positional must be rotary, learned, alibi or none, got {self.bias_positional!r}")
        check_arms(self.abc_layouts, self.abc_layers, self.positionals(), self.tasks, self.n_layers, self.abc_prompts)

    def positionals(self) -> tuple[str, ...]:
        """The ABC arms' positional encodings: `abc_positionals`, or else `bias_positional`."""
        return self.abc_positionals or (self.bias_positional,)

    def arms(self) -> list[AbcArm]:
        """The ABC arms: every combination of `abc_layouts`, `abc_layers`, `positionals()` and `abc_prompts`."""
        return arms(self.abc_layouts, self.abc_layers, self.positionals(), self.abc_prompts)

    def variants(self, condition: str) -> list[tuple[str, AbcArm | None]]:
        """(name, arm) of each table condition `condition` runs as: itself, or for abc one per arm
        (`AbcArm.variant`)."""
        if condition != "abc":
            return [(condition, None)]
        return [(arm.variant(self.bias_positional), arm) for arm in self.arms()]

    def variant_of(self, row: dict) -> str:
        """The table condition of a row of runs.jsonl (an ABC row: its arm's)."""
        if row["condition"] != "abc":
            return row["condition"]
        return AbcArm.of_row(row, self.bias_positional).variant(self.bias_positional)


# ----------------------------------------------------------------------------------------------- protocol presets
def length_task(name: str, n: int) -> Task:
    """The study's task with numbers of exactly `n` digits (parity: `n` bits, scratchpad format)."""
    if name == "successor":
        return tasks.get("successor", start=(10 ** (n - 1) if n > 1 else 0, 10**n - 1), numbers=2)
    if name == "addition":
        return tasks.get("addition", operands=2, digits=(n, n))
    if name == "parity":
        return tasks.get("parity", length=(n, n), format="scratchpad")
    raise ValueError(f"the ABC study has no task {name!r}; choose from {', '.join(STUDY_TASKS)}")


def train_task(name: str, longest: int = 6) -> LengthMix:
    """The training distribution: 1 to `longest` digits, the count uniform."""
    return LengthMix([length_task(name, n) for n in range(1, longest + 1)])


def protocol_context(name: str, buckets: Sequence[int], offset: int = 1) -> int:
    """The context the longest test sample needs (models.check_context on the longest bucket)."""
    from ... import models

    return models.check_context(10**9, length_task(name, max(buckets)), offset)


# ----------------------------------------------------------------------------------------------- one run
SELECT_SEED, TEST_SEED, CALIB_SEED = 10_000, 20_000, 30_000  # evaluation-set seeds (training batches use bit 62)


@dataclass
class _TaskSets:
    """Tokenizer, context and the evaluation sets of one task."""

    tokenizer: Any
    n_ctx: int
    select: dict[int, list[Sample]]
    test: dict[int, list[Sample]]
    calib: list[Sample]
    train: Task | None = None  # what a model of these sets trains on (None: `train_task` of the study)


def _task_sets(name: str, cfg: AbcStudyConfig) -> _TaskSets:
    mix = train_task(name, cfg.train_max)
    tok = CharTokenizer.for_alphabets(mix.alphabet)
    n_ctx = protocol_context(name, [*cfg.buckets, *cfg.select_buckets, cfg.train_max], tok.offset)
    if "padded" in cfg.abc_layouts:  # the padded layout's samples fit too
        from ... import models

        n_ctx = max(n_ctx, models.check_context(10**9, PaddedDraw(mix, max(cfg.buckets)), tok.offset))
    if cfg.set_draw == "with_replacement":
        select = {n: length_task(name, n).generate(cfg.n_select, seed=SELECT_SEED + n) for n in cfg.select_buckets}
        test = {n: length_task(name, n).generate(cfg.n_test, seed=TEST_SEED + n) for n in cfg.buckets}
    else:
        select, test = disjoint_sets(name, cfg)
    return _TaskSets(tok, n_ctx, select, test, mix.generate(cfg.n_calib, seed=CALIB_SEED))


def padded_sets(sets: _TaskSets, name: str, cfg: AbcStudyConfig) -> _TaskSets:
    """The same selection and test numbers, and training draw, in the padded layout of the longest test length (the
    calibration samples stay the rotary model's own)."""
    width = max(cfg.buckets)

    def pad(table):
        return {n: [padded_sample(s, width) for s in samples] for n, samples in table.items()}

    return _TaskSets(sets.tokenizer, sets.n_ctx, pad(sets.select), pad(sets.test), sets.calib,
                     PaddedDraw(train_task(name, cfg.train_max), width))


def inputs_of_length(name: str, n: int) -> int:
    """How many distinct prompts `length_task(name, n)` has (successor: its start numbers; addition: pairs)."""
    numbers = 10 if n == 1 else 9 * 10 ** (n - 1)
    return {"successor": numbers, "addition": numbers**2, "parity": 2**n}[name]


def disjoint_sets(name: str, cfg: AbcStudyConfig) -> tuple[dict[int, list[Sample]], dict[int, list[Sample]]]:
    """(selection, test) sets of `set_draw` "disjoint": every set without repeated prompts, every test set apart
    from the selection set of its length; each the stream of its seed with repeats and selection inputs skipped (so
    the former draw, sample for sample, where that had neither). A length with fewer inputs than both sets ask for
    is shared in proportion to n_select : n_test; ValueError where a set would be empty."""
    select, test = {}, {}
    for n in dict.fromkeys([*cfg.select_buckets, *cfg.buckets]):
        total, both = inputs_of_length(name, n), n in cfg.select_buckets and n in cfg.buckets
        k_select = cfg.n_select
        if both and total < cfg.n_select + cfg.n_test:
            k_select = max(1, round(total * cfg.n_select / (cfg.n_select + cfg.n_test)))
        if n in cfg.select_buckets:
            select[n] = distinct(length_task(name, n), k_select, SELECT_SEED + n, pool=total)
        if n in cfg.buckets:
            taken = {s.text[: s.prompt_len] for s in select.get(n, [])}
            if total - len(taken) < 1:
                raise ValueError(f"{name} at length {n}: no input left for the test set after the selection set's "
                                 f"{len(taken)} (lower n_select, or drop {n} from select_buckets)")
            test[n] = distinct(length_task(name, n), cfg.n_test, TEST_SEED + n, exclude=taken,
                               pool=total - len(taken))
    return select, test


def _model(sets: _TaskSets, cfg: AbcStudyConfig, positional: str, seed: int):
    from ... import models

    return models.tiny(sets.tokenizer, n_layers=cfg.n_layers, n_heads=cfg.n_heads, d_model=cfg.d_model,
                       n_ctx=sets.n_ctx, seed=seed, device=cfg.device, positional=positional)


def _train(model, sets: _TaskSets, name: str, cfg: AbcStudyConfig, run: tuple[int, float, int], bias=()) -> None:
    from ...training import train

    seed, lr, steps = run
    tc = TrainConfig.scratch(steps=steps, batch_size=cfg.batch_size, lr=lr, warmup=min(cfg.warmup, steps // 4),
                             seed=seed, device=cfg.device, log_every=max(1, steps))
    task = sets.train if sets.train is not None else train_task(name, cfg.train_max)
    train(model, sets.tokenizer, task, tc, fwd_hooks=bias, progress=False)


def _measure(model, sets: _TaskSets, bias) -> dict[str, float]:
    from ...accuracy import accuracy

    out: dict[str, float] = {}
    for split, table in (("select", sets.select), ("test", sets.test)):
        for n, samples in table.items():
            s = accuracy(model, sets.tokenizer, samples, fwd_hooks=bias, batch_size=50).summary()
            out[f"{split}_exact_{n}"], out[f"{split}_partial_{n}"] = s["exact"], s["partial"]
    return out


def _base_dir(out: Path, name: str, seed: int, lr: float) -> Path:
    return out / "models" / f"{name}-rotary-seed{seed}-lr{lr:g}"


def _bias_for(condition: str, name: str, sets: _TaskSets, ctx: "_Ctx", seed: int, arm: AbcArm | None = None):
    """(model, hook factory, notes) of a bias condition: ABS from the task's references, ABC (in `arm`) from the rotary
    model."""
    from ... import models
    from ...experiments.abc import ABCSettings, abc_bias, abc_lines, abs_window, every_head, lines_table

    cfg = ctx.cfg
    model = _model(sets, cfg, arm.positional if arm is not None else cfg.bias_positional, seed)
    if condition == "abs":
        window = abs_window(sets.calib, sets.tokenizer, cfg.abs_width)
        return model, abc_bias(every_head(model, window), model), {"lines": len(window.lines["aligned"])}
    lr_base = ctx.chosen[(name, "rotary")]
    base = models.load(_base_dir(ctx.out, name, seed, lr_base), device=cfg.device).model
    lines = abc_lines(base, sets.tokenizer, sets.calib, ABCSettings(lam=cfg.lam, directions=("aligned",), rows="all",
                                                                    correct_only=cfg.abc_correct_only, batch_size=64))
    if arm is not None:
        lines = prompt_lines(layer_lines(lines, arm.layer, cfg.n_layers), arm.prompt)
    kept = sum(len(v) for hl in lines.values() for v in hl.lines.values())
    table = lines_table(lines)  # every head's kept lines (aligned: segment * STRIDE + offset + STRIDE // 2)
    return model, abc_bias(lines, model), {"lines": kept, "base_lr": lr_base,
                                           "kept_lines": table.to_dict("records")}


def run_condition(ctx: "_Ctx", name: str, condition: str, seed: int, lr: float,
                  arm: AbcArm | None = None) -> dict[str, Any] | None:
    """Train (and for abs/abc bias) one model (abc: in `arm`, None for the study's own); its row: settings, key,
    selection and test accuracy per bucket. None when the row is not on disk and belongs to another unit than the one
    running (`ctx.unit`)."""
    from ... import models

    cfg, sets = ctx.cfg, ctx.sets[name]
    settings = {"task": name, "condition": condition, "seed": seed, "lr": lr, **ctx.shared,
                **(arm.settings(cfg.bias_positional) if arm is not None else {})}
    key = settings_key(settings)
    if key in ctx.rows:  # resumed: computed by an earlier run into this directory
        if ctx.bar is not None:
            ctx.bar.update(1)
        return ctx.rows[key]
    variant = arm.variant(cfg.bias_positional) if arm is not None else condition
    if ctx.unit is not None and ctx.unit != unit_key(cfg, name, variant, seed, lr):
        return None
    if arm is not None and arm.layout == "padded":  # the same numbers in the padded layout
        sets = ctx.padded.setdefault(name, padded_sets(sets, name, cfg))
    t0 = time.perf_counter()
    notes: dict[str, Any] = {}
    steps = cfg.steps
    if condition in ("rotary", "learned", "alibi", "none"):
        model, bias = _model(sets, cfg, condition, seed), ()
        _train(model, sets, name, cfg, (seed, lr, cfg.steps))
        if condition == "rotary":
            models.save(model, _base_dir(ctx.out, name, seed, lr), sets.tokenizer, task=name, seed=seed, lr=lr)
    else:
        if condition == "abc":
            _check_base(ctx, name, seed)
        try:
            model, bias, notes = _bias_for(condition, name, sets, ctx, seed, arm)
        except ValueError as e:  # ABC on a model that solves no calibration sample
            return ctx.write({**settings, "key": key, "status": f"skipped: {e}", "steps": steps})
        if condition == "abc":
            steps = cfg.steps + cfg.retrain_steps  # the rotary model's training plus the retraining
        _train(model, sets, name, cfg, (seed, lr, cfg.retrain_steps if condition == "abc" else cfg.steps), bias)
    row = {**settings, "key": key, "status": "ok", "steps": steps, "positional": models.positional_of(model),
           **notes, **_measure(model, sets, bias), "wall_s": time.perf_counter() - t0}
    return ctx.write(row)


def _check_base(ctx: "_Ctx", name: str, seed: int) -> None:
    """ValueError naming the unit to run first when the rotary model ABC calibrates on (its chosen rate, this seed)
    is not trained yet (a unit running alone)."""
    cfg = ctx.cfg
    lr = ctx.chosen.get((name, "rotary"))
    if lr is None:
        raise ValueError(f"ABC calibrates on the rotary model of the rate its grid chooses: run unit "
                         f"{unit_key(cfg, name, 'rotary', cfg.seeds[0], cfg.lrs[0])!r} and the rest of that grid first")
    if settings_key({"task": name, "condition": "rotary", "seed": seed, "lr": lr, **ctx.shared}) not in ctx.rows:
        raise ValueError(f"ABC at seed {seed} calibrates on that seed's rotary model: run unit "
                         f"{unit_key(cfg, name, 'rotary', seed, lr)!r} first")


def unavailable(cfg: AbcStudyConfig) -> dict[str, str]:
    """{condition: why} for the conditions this environment cannot build: a TransformerBridge model needs a Hugging
    Face form of its positional encoding (ALiBi's, Bloom, needs a power-of-two head count), and abs/abc need one of
    `bias_positional`. Probed with a one-layer model of the study's width and heads per encoding, before any
    training."""
    from ... import models

    why: dict[str, str | None] = {}
    out = {}
    for condition in cfg.conditions:
        positional = condition if condition in ("rotary", "learned", "alibi", "none") else cfg.bias_positional
        if positional not in why:
            try:
                models.tiny(8, n_layers=1, n_heads=cfg.n_heads, d_model=cfg.d_model, n_ctx=8, device="cpu",
                            positional=positional)
                why[positional] = None
            except ValueError as e:
                why[positional] = str(e)
        if why[positional] is not None:
            out[condition] = why[positional]
    return out


@dataclass
class _Ctx:
    """State of one study run: settings, output directory, evaluation sets, rows so far, chosen learning rates."""

    cfg: AbcStudyConfig
    out: Path
    sets: dict[str, _TaskSets]
    writer: Any
    rows: dict[str, dict]
    shared: dict[str, Any]
    chosen: dict[tuple[str, str], float]
    bar: Any = None
    missing: dict[str, str] = field(default_factory=dict)  # conditions this environment cannot build, and why
    unit: str | None = None  # the unit running alone (its runs only), or None: every run
    padded: dict[str, _TaskSets] = field(default_factory=dict)  # each task's sets in the padded layout, once built

    def write(self, row: dict) -> dict:
        self.writer.write(row)
        self.rows[row["key"]] = row
        if self.bar is not None:
            self.bar.update(1)
        return row


def select_score(row: dict, buckets: Sequence[int]) -> float:
    """Mean selection-set exact accuracy over `buckets` (NaN rows lose)."""
    vals = [row.get(f"select_exact_{n}", math.nan) for n in buckets]
    return -1.0 if any(v is None or math.isnan(v) for v in vals) else sum(vals) / len(vals)


def unit_key(cfg: AbcStudyConfig, name: str, condition: str, seed: int, lr: float) -> str:
    """The unit of a run: "TASK/CONDITION/lr LR" (a rate of the grid, on the first seed) or "TASK/CONDITION/seed S"
    (at the chosen rate)."""
    return f"{name}/{condition}/" + (f"lr {lr:g}" if seed == cfg.seeds[0] else f"seed {seed}")


def units(cfg: AbcStudyConfig) -> list[Unit]:
    """One unit per run. Stage 1: each rate of each condition's grid on the first seed; stage 2: the other seeds at
    the chosen rates, and ABC's grid (it calibrates on the rotary model of the rate rotary chose); stage 3: ABC's
    other seeds (on the rotary models of those seeds). The conditions this environment cannot build have none."""
    found = []
    for name in cfg.tasks:
        for condition in _order(cfg, unavailable(cfg)):
            stage = 2 if condition == "abc" else 1
            for variant, _ in cfg.variants(condition):
                found += [Unit(unit_key(cfg, name, variant, cfg.seeds[0], lr), stage) for lr in cfg.lrs]
                found += [Unit(unit_key(cfg, name, variant, seed, 0.0), stage + 1) for seed in cfg.seeds[1:]]
    return found


def _order(cfg: AbcStudyConfig, missing: dict[str, str]) -> list[str]:
    return [c for c in CONDITIONS if c in cfg.conditions and c not in missing]  # rotary before abc


def run_study(cfg: AbcStudyConfig, out: str | Path, progress: bool = True,
              unit: str | None = None) -> "pd.DataFrame | None":
    """Run (or resume) every task x condition x seed; choose learning rates on seed 0; write every output. With
    `unit` (a key of `units`): only that unit's run, its row into its unit file; returns None."""
    from tqdm.auto import tqdm

    cfg.check()
    out = Path(out)
    sets = {name: _task_sets(name, cfg) for name in cfg.tasks}  # context checked up front, before any training
    arm_fields = ("abc_layouts", "abc_layers", "abc_positionals", "abc_prompts")  # per ABC row, only what differs
    shared = {k: v for k, v in asdict(cfg).items()
              if k not in ("tasks", "conditions", "seeds", "lrs", "device", *arm_fields)}
    if cfg.set_draw == "with_replacement":  # the keys of rows written before `set_draw` existed
        del shared["set_draw"]
    index = unit_index(units(cfg), unit)
    writer = RowWriter(unit_file(out, "runs.jsonl", index), ("key",), "abc study")
    rows = {r["key"]: r for r in study_rows(out, "runs.jsonl", ("key",), "abc study")}
    ctx = _Ctx(cfg, out, sets, writer, rows, shared, {}, missing=unavailable(cfg), unit=unit)
    for condition, why in ctx.missing.items() if unit is None else ():
        logger.warning("abc study: condition %s not run: %s", condition, why)
    order = _order(cfg, ctx.missing)
    total = len(cfg.tasks) * sum(len(cfg.variants(c)) for c in order) * (len(cfg.lrs) + len(cfg.seeds) - 1)
    t0 = time.perf_counter()
    table = None
    with tqdm(total=total, desc="abc study", disable=not progress or unit is not None, dynamic_ncols=True) as ctx.bar:
        for name in cfg.tasks:
            for condition in order:
                for _, arm in cfg.variants(condition):
                    _run_condition_seeds(ctx, name, condition, arm)
            if unit is None:
                table = write_outputs(ctx, time.perf_counter() - t0)  # after every task: a cut run still reports
    return table


def _run_condition_seeds(ctx: _Ctx, name: str, condition: str, arm: AbcArm | None = None) -> None:
    """The grid of one task and condition (abc: in `arm`) on the first seed, then its other seeds at the chosen rate
    (of the unit running alone, only its run; the rate is chosen once its grid is on disk)."""
    cfg = ctx.cfg
    variant = arm.variant(cfg.bias_positional) if arm is not None else condition
    first = [run_condition(ctx, name, condition, cfg.seeds[0], lr, arm) for lr in cfg.lrs]
    mine = ctx.unit in (unit_key(cfg, name, variant, seed, 0.0) for seed in cfg.seeds[1:])
    if any(row is None for row in first):
        if mine:
            lr = cfg.lrs[first.index(None)]
            raise ValueError(f"unit {ctx.unit!r} needs the learning rate its grid chooses: run unit "
                             f"{unit_key(cfg, name, variant, cfg.seeds[0], lr)!r} first")
        return
    best = max(range(len(first)), key=lambda i: (select_score(first[i], cfg.select_buckets), -i))
    ctx.chosen[(name, variant)] = cfg.lrs[best]
    for seed in cfg.seeds[1:]:
        run_condition(ctx, name, condition, seed, cfg.lrs[best], arm)


# ----------------------------------------------------------------------------------------------- outputs
def summary_table(ctx: _Ctx) -> "pd.DataFrame":
    """One row per task, condition and test length: the chosen learning rate's seeds, exact mean, sd and 95 % interval
    (`exact_lo`, `exact_hi`: `intervals.seed_interval`, the wider of Student's t over the seeds and the Wilson
    interval of their answers, pooled); `n_test`: the size of that length's test set (below the setting where the
    length has fewer inputs, as parity at 6 bits)."""
    import pandas as pd

    out = []
    for (name, condition), lr in ctx.chosen.items():  # condition: a table condition (`AbcStudyConfig.variants`)
        rows = [r for r in ctx.rows.values() if r["task"] == name and ctx.cfg.variant_of(r) == condition
                and r["lr"] == lr and r["seed"] in ctx.cfg.seeds and r.get("status") == "ok"]
        for n in ctx.cfg.buckets:
            n_test = len(ctx.sets[name].test[n])
            ex = pd.Series([r[f"test_exact_{n}"] for r in rows], dtype=float)
            pa = pd.Series([r[f"test_partial_{n}"] for r in rows], dtype=float)
            out.append({"task": name, "condition": condition, "lr": lr, "steps": rows[0]["steps"] if rows else None,
                        "seeds": len(rows), "digits": n, "exact_mean": ex.mean(),
                        "exact_sd": ex.std(ddof=1) if len(ex) > 1 else 0.0,
                        **dict(zip(("exact_lo", "exact_hi"), seed_interval(ex.tolist(), n_test))),
                        "partial_mean": pa.mean(), "n_test": n_test})
    return pd.DataFrame(out)


def write_outputs(ctx: _Ctx, wall_s: float) -> "pd.DataFrame":
    """table.csv, summary.json (wide table at every length), runs.jsonl (already written), figures, run.json
    (`write_abc_outputs`)."""
    from ...viz.studies import abc_study_figure as study_figure  # loads plotly and torch: only when writing

    table = summary_table(ctx)
    wide = []
    for (name, condition), g in table.groupby(["task", "condition"], sort=False):
        row = {"task": name, "condition": condition, "lr": g.lr.iloc[0], "steps": g.steps.iloc[0],
               "seeds": g.seeds.iloc[0]}
        row.update({f"{n} digits": f"{m:.3f} [{lo:.3f}, {hi:.3f}]"
                    for n, m, lo, hi in zip(g.digits, g.exact_mean, g.exact_lo, g.exact_hi)})
        wide.append(row)
    rule = ("per task and condition, the learning rate with the highest mean exact accuracy on the selection sets "
            f"({', '.join(map(str, ctx.cfg.select_buckets))} digits) at seed {ctx.cfg.seeds[0]}; reported on held-out "
            "test sets")
    return write_abc_outputs(ctx.out, AbcOutputs(
        "study abc", ctx.cfg, table, ABC_TABLE, wide, ctx.missing,
        {f"abc_{name}": study_figure(table, name) for name in ctx.cfg.tasks},
        {"chosen_lr": {f"{t}/{c}": lr for (t, c), lr in ctx.chosen.items()}, "selection_rule": rule}),
        ctx.rows.values(), wall_s)


def run(config: AbcStudyConfig, out: Path, *, progress: bool = True, unit: str | None = None) -> "pd.DataFrame | None":
    """The aligned abc study's runner (`Study`): `run_study`; returns table.csv's table."""
    return run_study(config, out, progress=progress, unit=unit)


STUDY = Study("abc", AbcStudyConfig, run, units, ("runs.jsonl",))
