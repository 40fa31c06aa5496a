"""The experiment engine: a grid of attention interventions, each evaluated against a matched baseline.

Every grid point is a settings dict (JSON; its key is `settings_key(point)`) naming an intervention method, a head
selection, a strength, a key offset and the evaluation set it runs on. The engine evaluates it on that set and on
the ID set, both with and without the intervention on the same samples, and returns one row schema:

    key, set, method, heads, heads_list, n_heads, strength, threshold, renormalize, delta, mode, seed, ...settings
    exact, partial, n, baseline_exact, baseline_partial, gain_exact, gain_partial    (on the row's set)
    id_exact, id_partial, id_baseline_exact, id_baseline_partial, id_cost            (matched ID result)
    attn_{rollout,heads}_{sample,raw}, baseline_attn_..., by_length, baseline_by_length   (AttnScore conventions)

`id_cost` is the drop of ID exact accuracy (baseline minus intervened; negative when the edit helps ID).
The named sets are drawn from the task presets with fixed seed offsets: the ID set (`seed + 1`), the OOD
selection set (`seed + 2`) and the held-out OOD set (`seed + 3`), which skips every draw whose text is in the
selection set of the same seed and size, so the two share no sample by construction. A point on the held-out set
has its ID cost measured on a second ID set (`seed + 4`, "id_report", its row's `id_set`) that skips the texts of
the ID set the same way, so the ID samples that let an edit pass the selection rule's budget never report its ID
cost. A held-out set whose seed-only draw shared no text with the set it skips is that draw, sample for sample.

One selection rule (`select`): among the rows on the selection set whose ID cost is within the budget (default
1 pp), the largest OOD gain in exact accuracy (ties: per-token accuracy, then lower ID cost, then grid order);
only an edit that improves OOD counts. The chosen point is then reported on the held-out set, so the reported
number is not the maximum of many noisy draws. The paper's recipe (Spiegel et al. 2025, Appendix F: additive
reinforcement of the heads ranked by attention on the references) is the method "reinforce"; "patch" replaces
the heads' rows by the uniform distribution over the (shifted) references (the causal upper bound of an attention
edit) and "steer" is PASTA (Zhang et al. 2023: log alpha added to the scores outside the references); "atoms"
puts each head under its own edit (the causal search's proposals). A point's edit is one `experiments.edit.Edit`
(validated by its method's rules, stored flat by `Edit.to_dict`). A point's `gate` restricts any method to rows
past the longest ID sample ("beyond", after `edit.beyond_row`: ID samples are untouched by construction) or to
heads' rows whose attention on the references is below TAU ("below:TAU"). A point's `eos` "extrapolate" also edits
the end-of-sequence row (empty reference set) on the reference map continued one row (`hooks.extrapolate_mask`):
an edit target only, never a score. A new method is a kernel in `hooks` plus its rule in `aspan.methods`
(docs/extending.md).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence, get_args

import pandas as pd

from .. import tasks
from ..evaluation import SCORE_COLUMNS
from ..io import RowWriter, read_rows, settings_key, union_rows
from ..methods import check_method
from ..options import CONVENTIONS, EOS_REFS, ID_BUDGET, Convention, check_option
from ..tasks.split import unseen
from ..tokenization import require_tokenizer
from .edit import Edit, beyond_row, parse_gate

Head = tuple[int, int]
SetName = Literal["selection", "held_out", "id"]
SETS: tuple[SetName, ...] = get_args(SetName)
ID_REPORT = "id_report"  # the ID set of held-out points (apart from "id", which the selection rule reads)
SEED_OFFSET: dict[str, int] = {"id": 1, "selection": 2, "held_out": 3, ID_REPORT: 4}
# set -> (the set whose texts its draw skips, both sets in words for the error of a preset too small for both)
APART: dict[str, tuple[str, str, str]] = {
    "held_out": ("selection", "the held-out OOD set (held_out)", "the OOD selection set (selection)"),
    ID_REPORT: ("id", "the held-out ID set (id_report)", "the ID set (id)"),
}
ANY_TASK_HINT = "set any_task = true in the sweep config to run it anyway"
ATOMS = "atoms"  # a point's method when its edit is a list of atoms (an `Edit` of one head each: the causal search)


# ----------------------------------------------------------------------------------------------- what is run
@dataclass(frozen=True)
class Data:
    """The evaluation sets of a grid: `n` samples each from the ID preset and from the OOD (`split`) preset."""

    task: str
    ood_params: dict = field(default_factory=dict)  # overrides of the `split` preset (selection + held-out sets)
    id_params: dict = field(default_factory=dict)  # overrides of the ID preset (ID set)
    n: int = 100  # samples per set
    split: str = "ood"  # the preset the selection and held-out sets come from

    def samples(self, name: str, seed: int) -> list:
        """The samples of set `name` ("id", "selection", "held_out", or "id_report") for data seed `seed`."""
        return list(self.stream(name, seed))

    def stream(self, name: str, seed: int) -> Iterator:
        """The samples of `samples(name, seed)`, drawn one at a time (the engine evaluates them as they come)."""
        if name not in SEED_OFFSET:
            raise ValueError(f"unknown evaluation set {name!r}; choose one of {', '.join(SETS)} (or {ID_REPORT})")
        stream = _task(self, name).stream(seed + SEED_OFFSET[name])
        if name in APART:  # apart from the set the selection rule reads, sample for sample
            other, this, that = APART[name]
            stream = unseen(stream, {x.text for x in self.stream(other, seed)}, this, that,
                            "lower the samples per set (n)")
        return itertools.islice(stream, self.n)


@dataclass(frozen=True)
class Ranking:
    """How `top:N` / `fraction:F` head selections are resolved: the offset-scan ranking on ID samples."""

    by: str = "score_sum"  # ranking column (the paper's summed score, or the mean per target row)
    samples: int = 64  # ID samples ranked on
    seed: int = 10_000  # their seed
    params: dict = field(default_factory=dict)  # ID preset overrides for the ranking samples
    # AttnScore convention of the attention share (`aspan.options.Convention`); "raw", the engine's historical one,
    # is left out of the settings so points ranked in it keep their keys
    convention: Convention = "raw"

    def __post_init__(self) -> None:
        check_option("ranking convention", self.convention, CONVENTIONS)

    def settings(self, delta: int) -> dict[str, Any]:
        """The ranking's settings for offset `delta`, as recorded in a grid point."""
        s = {"by": self.by, "samples": self.samples, "seed": self.seed, "delta": delta, "params": self.params}
        return s if self.convention == "raw" else {**s, "convention": self.convention}


def point(data: Data, model: str, heads: str, strength: float | None = None, **kw: Any) -> dict[str, Any]:
    """A grid point (settings dict). `heads` is `top:N`, `fraction:F` or `list:L.H,L.H`; the edit is validated
    as an `Edit` (its method's own rules: reinforce C >= 0, steer alpha in (0, 1], patch no strength, threshold or
    renormalisation) and stored by `Edit.to_dict`; `kw` sets method ("reinforce"), delta (0), threshold (None),
    renormalize (False), mode ("teacher"), seed (0), set ("selection"), gate (None: see `parse_gate`; stored only
    when set, so ungated points keep their keys), eos ("none" or "extrapolate"; stored only when "extrapolate"),
    rank (a `Ranking`, needed by top/fraction selections; its delta defaults to the point's) and, with method
    "atoms", atoms (a list of `Edit` objects of one head each)."""
    rank: Ranking | None = kw.pop("rank", None)
    rank_delta = kw.pop("rank_delta", None)
    gate = kw.pop("gate", None)
    atoms: list[Edit] | None = kw.pop("atoms", None)
    p = {"model": model, "task": data.task, "split": data.split, "task_params": data.ood_params,
         "id_params": data.id_params, "n_samples": data.n, "method": "reinforce", "heads": heads,
         "strength": strength, "threshold": None, "renormalize": False, "delta": 0, "mode": "teacher", "seed": 0,
         "set": "selection"}
    unknown = set(kw) - set(p) - {"eos"}
    if unknown:
        raise ValueError(f"unknown grid point setting {sorted(unknown)[0]!r}")
    p.update(kw)
    check_method(p["method"], extra=(ATOMS,), kind="intervention method")
    if p["method"] == ATOMS:
        if not atoms or gate is not None or "eos" in p:
            raise ValueError("a point of method 'atoms' needs atoms, a list of Edits of one head each, which carry "
                             "their own gates and eos")
        p["atoms"] = [edit.to_atom() for edit in atoms]
    else:
        kind, tau = parse_gate(gate)
        edit = Edit(p["method"], p["delta"], p["strength"], p["renormalize"], 0 if kind == "beyond" else None, tau,
                    check_option("eos", p.pop("eos", "none"), EOS_REFS), p["threshold"])
        p.update(edit.to_dict())
        if kind is not None:
            p["gate"] = gate  # as given ("below:0.30" keeps its spelling, and its key)
    if not heads.startswith("list:"):
        p["rank"] = (rank or Ranking()).settings(p["delta"] if rank_delta is None else rank_delta)
    return p


def on_set(p: dict[str, Any], name: str) -> dict[str, Any]:
    """The same grid point evaluated on another set (e.g. the held-out set for the chosen point)."""
    return {**point_of(p), "set": name}


def point_of(row: dict[str, Any]) -> dict[str, Any]:
    """The grid point a results row (or point) evaluates: its settings, the edit read back through `Edit` (a
    method's own fields only: a patch row of an old grid loses the strength it never used). The key of every
    point this version builds, and of every committed row, is `settings_key(point_of(row))`."""
    p = {k: v for k, v in row.items() if k not in ROW_ONLY}
    if p["method"] == ATOMS:
        p["atoms"] = [Edit.from_atom(atom).to_atom() for atom in p["atoms"]]
        return p
    kind = parse_gate(p.get("gate"))[0]
    p.update(Edit.from_dict(p, beyond=0 if kind == "beyond" else None).to_dict())  # the gate's name is the setting
    if kind is not None:
        p["gate"] = row["gate"]
    return p


def parse_heads(label: str) -> list[Head]:
    """`list:L.H,L.H` -> [(L, H), ...]."""
    return [tuple(map(int, h.split("."))) for h in label.partition(":")[2].split(",")]  # type: ignore[misc]


# ----------------------------------------------------------------------------------------------- the engine
class Engine:
    """Evaluates grid points on a loaded model; caches samples, the ranking and the matched baselines."""

    def __init__(self, model, tokenizer, data: Data, batch_size: int = 32, attn: bool = True, any_task: bool = False):
        """`any_task`: evaluate a model on another task than the one it was trained on (refused otherwise)."""
        from ..models.fit import check_fit, workload
        from ..models.trained import check_task, trained_task

        require_tokenizer(tokenizer, "experiment engine: tokenizer")
        if not any_task:
            check_task(trained_task(model), set_tasks(data), "experiment engine", ANY_TASK_HINT)
        self.model, self.tok, self.data, self.batch_size, self.attn = model, tokenizer, data, batch_size, attn
        self.any_task = any_task
        for name in ("selection", "id"):  # hook points, vocabulary and context, before any forward
            check_fit(model, tokenizer, workload(_task(data, name)), "experiment engine")
        self._samples: dict[tuple[str, int], list] = {}
        self._offsets: dict[str, pd.DataFrame] = {}
        self._baselines: dict[tuple, tuple[dict, list]] = {}

    def samples(self, name: str, seed: int) -> list:
        """The samples of evaluation set `name` for `seed`, generated once and cached."""
        if (name, seed) not in self._samples:
            self._samples[(name, seed)] = self.data.samples(name, seed)
        return self._samples[(name, seed)]

    def offsets(self, rank: dict[str, Any], deltas: Sequence[int] = ()) -> pd.DataFrame:
        """The offset-scan table (layer, head, delta, score_sum, score_row) on the ranking samples of `rank`;
        computed once for `deltas` and `rank["delta"]` together, then again only for a new delta."""
        from .ranking import offset_table

        key = settings_key({k: v for k, v in rank.items() if k != "delta"})
        have = self._offsets.get(key)
        want = list(dict.fromkeys([rank["delta"], *deltas]))
        if have is None or not set(want) <= set(have.delta):
            samples = tasks.preset(self.data.task, "id", **rank["params"]).generate(rank["samples"], seed=rank["seed"])
            extra = [d for d in want if have is None or d not in set(have.delta)]
            convention = rank.get("convention", "raw")  # absent: `raw`, as rankings were computed before the option
            table = offset_table(self.model, self.tok, samples, extra, self.batch_size, convention=convention)
            self._offsets[key] = table if have is None else pd.concat([have, table], ignore_index=True)
        return self._offsets[key]

    def heads(self, p: dict[str, Any]) -> list[Head]:
        """The heads of point `p`: an explicit list, or the top of the ranking at the point's rank offset."""
        from .ranking import select_heads

        kind, _, arg = p["heads"].partition(":")
        if kind == "list":
            return parse_heads(p["heads"])
        table = self.offsets(p["rank"])
        table = table[table.delta == p["rank"]["delta"]]
        sel = {"top": int(arg)} if kind == "top" else {"fraction": float(arg)}
        return select_heads(table, by=p["rank"]["by"], **sel)

    def edit(self, p: dict[str, Any], heads: list[Head] | None = None) -> Callable:
        """The point's intervention as `fwd_hooks` for `evaluation.evaluate` (a function of the batch)."""
        edits = self.edits(p, self.heads(p) if heads is None else heads)
        return lambda batch: [h for e in edits for h in e.batch_hooks(batch, self.model)]

    def edits(self, p: dict[str, Any], heads: list[Head]) -> list[Edit]:
        """The point's edits: one on every head, or with method "atoms" one per atom (each on its own head); a
        "beyond" gate edits the rows after `beyond_row`."""
        if p["method"] == ATOMS:
            return [Edit.from_atom(atom) for atom in p["atoms"]]
        return [Edit.from_dict(p, beyond=self.beyond_row()).on(heads)]

    def beyond_row(self) -> int:
        """The last query row an ID sample trains (`edit.beyond_row` of the tokenizer's prefix and the ID preset's
        longest text): an edit gated "beyond" touches only rows after it, so it leaves every ID sample untouched."""
        longest = tasks.preset(self.data.task, "id", **self.data.id_params).max_text_len()
        return beyond_row(self.tok.offset, longest, self.tok.eos_id is not None)

    def _evaluate(self, p: dict[str, Any], name: str, heads: list[Head], edit: Callable | None) -> tuple[dict, list]:
        """Summary and per-length table of the point's samples of set `name`; AttnScores on the point's own set."""
        from ..evaluation import StreamTotals, evaluate_stream, summarize

        attn = self.attn and name == p["set"]
        if not attn and p["mode"] == "teacher":
            res = self._accuracy(p, name, edit)
            return res.summary(), summarize(res, by="length")[["length", "n", "exact", "partial"]].to_dict("records")
        totals = StreamTotals(p["mode"])  # streamed: one chunk of samples and records at a time
        for chunk in evaluate_stream(self.model, self.tok, self.data.stream(name, p["seed"]), fwd_hooks=edit or (),
                                     mode=p["mode"], batch_size=self.batch_size, heads=heads if attn else None,
                                     attn=attn, any_task=self.any_task):
            totals.add(chunk)
        res = totals.result()
        by_len = summarize(res, by="length")[["length", "n", "exact", "partial"]].to_dict("records")
        return res.summary(), by_len

    def _accuracy(self, p: dict[str, Any], name: str, edit: Callable | None):
        """`_evaluate`'s result when it measures no AttnScores, teacher-forced: the per-sample table from
        `aspan.accuracy` (the same numbers without per-token records, in larger batches), as an `EvalResult`."""
        from ..accuracy import accuracy
        from ..evaluation import RECORD_COLUMNS, EvalResult

        samples = list(self.data.stream(name, p["seed"]))
        acc = accuracy(self.model, self.tok, samples, edit or (), self.batch_size)
        table = acc.table(samples).assign(**{c: float("nan") for c in SCORE_COLUMNS})
        return EvalResult(pd.DataFrame(columns=RECORD_COLUMNS), table, "teacher")

    def baseline(self, p: dict[str, Any], name: str, heads: list[Head]) -> tuple[dict, list]:
        """The unedited model on set `name` (same samples, mode and AttnScore heads as the point); cached."""
        key = (name, p["seed"], p["mode"], tuple(heads) if self.attn and name == p["set"] else ())
        if key not in self._baselines:
            self._baselines[key] = self._evaluate(p, name, heads, None)
        return self._baselines[key]

    def row(self, p: dict[str, Any]) -> dict[str, Any]:
        """Evaluate point `p` on its set and on its ID set (`id_set`), each against its matched baseline: one row."""
        heads = self.heads(p)
        edit = self.edit(p, heads)
        res, res_len = self._evaluate(p, p["set"], heads, edit)
        base, base_len = self.baseline(p, p["set"], heads)
        id_name = id_set(p["set"])
        id_res = res if p["set"] == "id" else self._evaluate(p, id_name, heads, edit)[0]
        id_base = self.baseline(p, id_name, heads)[0]
        return {
            "key": settings_key(p), **p, "heads_list": [list(h) for h in heads], "n_heads": len(heads),
            "exact": res["exact"], "partial": res["partial"], "n": res["n"],
            "baseline_exact": base["exact"], "baseline_partial": base["partial"],
            "gain_exact": res["exact"] - base["exact"], "gain_partial": res["partial"] - base["partial"],
            "id_exact": id_res["exact"], "id_partial": id_res["partial"],
            "id_baseline_exact": id_base["exact"], "id_baseline_partial": id_base["partial"],
            "id_cost": id_base["exact"] - id_res["exact"], "id_set": id_name,
            **{c: res.get(c) for c in SCORE_COLUMNS}, **{f"baseline_{c}": base.get(c) for c in SCORE_COLUMNS},
            "by_length": res_len, "baseline_by_length": base_len,
        }


ROW_ONLY = {"key", "heads_list", "n_heads", "exact", "partial", "n", "baseline_exact", "baseline_partial",
            "gain_exact", "gain_partial", "id_exact", "id_partial", "id_baseline_exact", "id_baseline_partial",
            "id_cost", "id_set", *SCORE_COLUMNS, *(f"baseline_{c}" for c in SCORE_COLUMNS), "by_length",
            "baseline_by_length"}


# What every row of a grid's JSONL file holds (its settings and the numbers the tables read): a file with a row
# lacking one is refused, naming the line, before any point is evaluated.
ROW_FIELDS = ("key", "set", "mode", "method", "heads", "strength", "threshold", "renormalize", "delta", "seed", "n",
              "exact", "partial", "baseline_exact", "baseline_partial", "id_exact", "id_partial", "id_baseline_exact",
              "id_baseline_partial")


def id_set(name: str) -> str:
    """The ID set whose samples give a point on set `name` its ID cost: "id_report" for the held-out set (apart
    from the samples the selection rule's ID budget read), "id" otherwise. Rows without an `id_set` column predate
    the split and used "id" for every set."""
    return ID_REPORT if name == "held_out" else "id"


def _task(data: Data, name: str):
    return tasks.preset(data.task, "id", **data.id_params) if name in ("id", ID_REPORT) else \
        tasks.preset(data.task, data.split, **data.ood_params)


def set_tasks(data: Data) -> list[tuple[str, dict[str, Any]]]:
    """(name, parameters) of the tasks the sets of `data` are drawn from (OOD and ID presets), for
    `models.trained.check_task`."""
    return [(t.name, t.params()) for t in (_task(data, "selection"), _task(data, "id"))]


# ----------------------------------------------------------------------------------------------- running a grid
def shard_points(points: list[dict[str, Any]], shard: tuple[int, int] = (0, 1)) -> list[dict[str, Any]]:
    """Shard `i` of `n`: every n-th point from i (round robin keeps shards balanced); shards partition the grid."""
    i, n = shard
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"shard {i}/{n}: need 0 <= i < n")
    return points[i::n]


@dataclass
class Job:
    """Where and how a grid runs: rows appended to `path` (resumable), this `shard`, at most `limit` new rows."""

    path: Any  # the JSONL rows file
    shard: tuple[int, int] = (0, 1)
    limit: int | None = None  # stop after this many new rows (None: all)
    progress: bool = True
    on_row: Callable[[dict[str, Any]], None] | None = None  # called after each row is safely written


def run_grid(points: list[dict[str, Any]], job: Job, engine: Engine | Callable[[], Engine]) -> list[dict[str, Any]]:
    """Evaluate this shard's points whose key is not yet in `job.path`, appending one row each; return the rows
    of `points` (this shard's) found in the file afterwards, in grid order.

    `engine` may be a function that builds it: it is called only if a point is missing (a finished run, or a
    resumed one with nothing left, loads no model).
    """
    from tqdm.auto import tqdm

    mine = shard_points(points, job.shard)
    writer = RowWriter(job.path, ROW_FIELDS, "sweep")
    todo = [p for p in mine if settings_key(p) not in writer.keys]
    if job.limit is not None:
        todo = todo[: max(job.limit, 0)]
    if todo:
        eng = engine if isinstance(engine, Engine) else engine()
        for p in tqdm(todo, desc=f"grid {job.shard[0]}/{job.shard[1]}", disable=not job.progress):
            row = eng.row(p)
            writer.write(row)
            if job.on_row is not None:
                job.on_row(row)
    by_key = {r["key"]: r for r in read_rows(job.path, ROW_FIELDS, "sweep")}
    return [by_key[k] for k in (settings_key(p) for p in mine) if k in by_key]


def run_in_dir(points: list[dict[str, Any]], directory: Any, shard: tuple[int, int] | None,
               engine: Engine | Callable[[], Engine]) -> list[dict[str, Any]]:
    """`run_grid` for an application's run directory: rows go to `sweep.jsonl`, or with `shard=(i, n)` to
    `sweep.shard-i-of-n.jsonl` (only that shard's points); rows any `sweep*.jsonl` there already holds are reused,
    so a run without a shard after all shards computes nothing again. Returns the rows found for `points` (grid
    order; with a shard, only those present so far)."""
    from pathlib import Path

    directory = Path(directory)
    name = "sweep.jsonl" if shard is None else f"sweep.shard-{shard[0]}-of-{shard[1]}.jsonl"
    others = (p for p in sorted(directory.glob("sweep*.jsonl")) if p.name != name)
    done = {r["key"]: r for r in union_rows(others, ROW_FIELDS, "sweep")}
    todo = [p for p in shard_points(points, shard or (0, 1)) if settings_key(p) not in done]
    found = {**done, **{r["key"]: r for r in run_grid(todo, Job(directory / name, progress=False), engine)}}
    return [found[k] for k in map(settings_key, points) if k in found]


# ----------------------------------------------------------------------------------------------- the rule
@dataclass(frozen=True)
class Selection:
    """The point chosen by `select` (None when no edit improves OOD within the budget) and the rule, in words."""

    row: dict[str, Any] | None
    rule: str
    candidates: int  # rows the rule chose among (within the budget)


def rule_text(id_budget: float | None = ID_BUDGET, metric: str = "exact") -> str:
    """The selection rule in one sentence (printed with every result it chooses)."""
    other = "partial" if metric == "exact" else "exact"
    budget = "any ID cost" if id_budget is None else f"ID cost (drop of ID exact accuracy) <= {100 * id_budget:g} pp"
    return (f"largest OOD {metric} gain (ties: {other} gain, then lower ID cost) with {budget}, chosen on the OOD "
            f"selection set, reported on the held-out OOD set")


def select(rows: Iterable[dict[str, Any]] | pd.DataFrame, id_budget: float | None = ID_BUDGET,
           metric: Literal["exact", "partial"] = "exact") -> Selection:
    """The one selection rule: among `rows` on the selection set with `id_cost <= id_budget` (None: no budget),
    the largest gain in `metric` (ties: the other metric's gain, then lower ID cost, then order); a row counts only
    if it improves OOD (gain in `metric` > 0, or equal and a positive gain in the other)."""
    if isinstance(rows, pd.DataFrame):
        rows = rows.to_dict("records")
    other = "partial" if metric == "exact" else "exact"
    rows = [r for r in rows if r.get("set", "selection") == "selection"]
    ok = [r for r in rows if id_budget is None or r["id_cost"] <= id_budget + 1e-12]
    better = [r for r in ok if (r[f"gain_{metric}"], r[f"gain_{other}"]) > (0.0, 0.0)]
    best = None
    if better:
        order = sorted(range(len(better)), key=lambda i: (-_num(better[i][f"gain_{metric}"]),
                                                           -_num(better[i][f"gain_{other}"]),
                                                           _num(better[i]["id_cost"]), i))
        best = better[order[0]]
    return Selection(best, rule_text(id_budget, metric), len(ok))


def _num(x: Any) -> float:
    return float("inf") if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)
