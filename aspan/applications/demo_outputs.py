"""The stage results of `aspan demo` (`aspan.applications.demo`) and its outputs: summary.json, the tables,
records, figures and views of its run directory, and the short tables it prints, all from the stage results of one
run (`Stages`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd

from .. import evaluation
from ..anatomy import NamedEdit, explain
from ..anatomy.record import remove_anatomy, write_anatomy
from ..experiments.edit import Edit
from ..experiments.engine import Engine, Ranking, rule_text
from ..experiments.search import encode_atoms
from ..io import RunDir
from ..viz import pareto_figure, story
from . import causal


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


@dataclass
class Stages:
    """What the stages of one demo run produced, as the summary and the run directory's files read them."""

    setup: Setup  # stage 1: the model, its evaluation sets and the engine
    ranked: Ranked  # stage 2: the offset scan and the head ranking
    baseline: Baseline  # stage 3: the unedited model
    rows: pd.DataFrame  # stage 4: every grid point and search proposal on the OOD selection set
    chosen: dict[str, Chosen]  # stage 5: each condition's intervention on the held-out sets
    picked: dict[str, dict | None]  # the row each condition's rule picked (None: no edit qualified)
    searched: Any  # the causal search's result (`causal.search`): its proposal and how far it reached
    compared: pd.DataFrame  # the causal ranking beside the paper's attention-share rank


def _describe(model) -> str:
    c = model.cfg
    return f"{c.n_layers} layers x {c.n_heads} heads, d_model {c.d_model}, n_ctx {c.n_ctx}"


def _label(row: dict) -> str:
    if row["method"] == "atoms":
        return causal.label(row)
    names = "+".join(story.head_names([tuple(h) for h in row["heads_list"]]))
    return f"{row['method']} {names} at {story.ref_label(row['delta'])}, C={row['strength']:g}"


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


def make_summary(cfg: Any, stages: Stages) -> dict:
    """summary.json: the four conditions (held-out OOD and held-out ID), the rule, Table 3, the tables (`cfg`: the
    run's `DemoConfig`)."""
    r, base, chosen, rows = stages.ranked, stages.baseline, stages.chosen, stages.rows
    searched, compared = stages.searched, stages.compared
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
def write_outputs(run: RunDir, cfg: Any, stages: Stages) -> None:
    """Tables (CSV), records (JSONL) and the figures and views of the story (`cfg`: the run's `DemoConfig`)."""
    s, r, base, chosen, rows = stages.setup, stages.ranked, stages.baseline, stages.chosen, stages.rows
    searched, compared, picked = stages.searched, stages.compared, stages.picked
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
    run.write_csv(HELD_OUT_SAMPLES, held_out_samples(base, chosen))
    run.records("records_ood.jsonl", base.ood.records)
    id_s, ood_s = s.engine.samples("id", cfg.seed), s.engine.samples("held_out", cfg.seed)
    view_heads = list(dict.fromkeys([*(shown.heads if shown else []), *r.top_d]))[:4]
    story.write_attention_views(run, story.AttentionViews(s.model, s.tokenizer, id_s, ood_s, view_heads, r.top_d[0],
                                                          r.d_star, shown.edit if shown else None))
    write_failure(run, stages, shown, cfg.seed)
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


HELD_OUT_SAMPLES = "held_out_samples.csv"  # one row per condition, set and sample: every reported number, recomputable

# The sets of `held_out_samples` (what each condition was scored on) and the result each comes from.
SAMPLE_SETS = {"ood_held_out": ("ood", "ood"), "id_held_out": ("id_held", "id_held"), "id": ("id", "id"),
               "ood_held_out_generated": ("gen_ood", "gen"), "id_generated": ("gen_id", None)}


def held_out_samples(base: Baseline, chosen: dict[str, Chosen]) -> pd.DataFrame:
    """Per condition (the baseline and each chosen edit), set and sample: its length, exact (every scored token
    right, EOS included), per-token accuracy (the fraction of its target characters right) and whether its
    end-of-sequence token is right. Sets: the held-out OOD set (teacher-forced and, on its first samples,
    generated), the held-out ID set, and the engine's ID set (which priced the ID cost the rule read); the
    baseline is also generated on ID. The means of these rows are the numbers of summary.json."""
    parts = []
    for name in ("baseline", *causal.NAMES[1:]):
        source = base if name == "baseline" else chosen.get(name)
        for set_name, (on_base, on_chosen) in SAMPLE_SETS.items():
            attr = on_base if name == "baseline" else on_chosen
            if source is None or attr is None:
                continue
            result = getattr(source, attr)
            eos = result.records[result.records.eos].groupby("sample_id").correct.all()
            table = result.samples[["sample_id", "length", "exact", "partial"]].assign(
                eos_right=lambda t, eos=eos: t.sample_id.map(eos))
            parts.append(table.assign(condition=name, set=set_name))
    cols = ["condition", "set", "sample_id", "length", "exact", "partial", "eos_right"]
    return pd.concat(parts, ignore_index=True)[cols]


def write_failure(run: RunDir, stages: Stages, shown: Chosen | None, seed: int) -> None:
    """The anatomy of a failure for the report: the first held-out OOD sample the model gets wrong (teacher-forced),
    read on the best offset's two top heads, before and after the shown edit (the selected one, else the patching
    upper bound); nothing when every held-out sample is right."""
    s, r, samples = stages.setup, stages.ranked, stages.baseline.ood.samples
    wrong = samples.sample_id[~samples.exact.astype(bool)]
    if not len(wrong):
        remove_anatomy(run.path)
        return
    sample = s.engine.samples("held_out", seed)[int(wrong.iloc[0])]
    edit = NamedEdit(shown.edit, _label(shown.row)) if shown else None
    anatomy = explain(s.model, s.tokenizer, sample, heads=r.top_d[:2], delta=r.d_star, fwd_hooks=edit)
    which = "selected" if shown is stages.chosen.get("selected") else "patching upper bound's"
    write_anatomy(run.path, anatomy, context="The first held-out OOD sample the model gets wrong (teacher-forced), "
                  "read on the two top heads at the best offset" + (f", before and after the {which} edit, "
                                                                      f"{anatomy.edit}." if shown else "."))


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
