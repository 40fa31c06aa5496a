"""The findings of the three studies (`aspan study qk|abc|parity`), each a claim of a paper tested at small scale.

qk: Spiegel et al.'s later abstract (one column of W_Q/W_K, or one RoPE pair, fine-tuned on longer sequences is
enough); abc: Duan & Shi 2023 (biased attention extrapolates from 6 to 60 digits); parity: Ebrahimi, Panchal &
Memisevic 2024 (the scratchpad's format decides length generalization).
"""
from __future__ import annotations

import re

import pandas as pd

from .tables import ABC_PAPER_TABLE, ABC_TABLE, ABC_TABLE_SD
from .words import Claim, Finding, pct, pp, sig

VANILLA = ("rotary", "learned", "alibi", "none")


def is_qk(summary: dict, settings: dict) -> bool:
    """Whether a run's summary is the Q/K study's."""
    return "by_replay" in (summary.get("findings") or {}) and "table" in summary


def is_abc(summary: dict, settings: dict) -> bool:
    """Whether a run's summary is the ABC study's."""
    return bool({ABC_TABLE, ABC_TABLE_SD} & set(summary.get("tables") or {}))


def is_parity(summary: dict, settings: dict) -> bool:
    """Whether a run's summary is the parity study's."""
    return summary.get("study") == "parity" and "summary" in (summary.get("tables") or {})


def _plus_minus(mean, sd) -> str:
    return sig(mean) if sd is None or sd != sd or not sd else f"{sig(mean)} ± {sig(sd)}"


def _interval(mean, lo, hi) -> str:
    """'0.21 [0.17, 0.25]': a mean and its 95 % interval (the mean alone where the interval is missing)."""
    return sig(mean) if lo is None or lo != lo else f"{sig(mean)} [{sig(lo)}, {sig(hi)}]"


def _replay(value) -> str:
    """A replay fraction as written in the study's options (0, 0.5)."""
    return f"{float(value):g}"


# ----------------------------------------------------------------------------------------------- qk
def qk(summary: dict, settings: dict) -> Finding:
    """Full fine-tuning against the best single parameter group, per replay fraction."""
    f = summary["findings"]
    ft, beyond = f["finetuned_bucket"], f["beyond_bucket"]
    buckets = [f"{a}-{b}" for a, b in (settings.get("config") or {}).get("buckets", [])] or [ft, beyond]
    id_bucket = buckets[0]
    if not f["by_replay"]:  # no full fine-tuning in this run (its `only` leaves it out): the single groups alone
        return _qk_singles(summary, settings, ft, beyond, buckets)
    no_replay = f["by_replay"].get("0.0") or next(iter(f["by_replay"].values()))
    full, best = no_replay["full"], no_replay["best_single"]
    verdict = "Yes" if no_replay["claim_met"] else "No"
    smallest = no_replay["smallest_within_5pp_exact"]
    answer = (f"{verdict}. Fine-tuning the whole model on lengths {ft} reaches exact accuracy "
              f"{sig(full[f'exact_{ft}'])} there; the best single group ({best['condition']}, "
              f"{pct(best['fraction'])} of the parameters) reaches {sig(best[f'exact_{ft}'])} (per-token "
              f"{sig(best[f'partial_{ft}'])}), {sig(no_replay['gap_exact_pp'])} pp below. ")
    answer += (f"The smallest group within 5 pp of full fine-tuning: {smallest['condition']}." if smallest else
               f"Full fine-tuning gains only {sig(no_replay['full_gain_exact_pp'])} pp of exact accuracy, too little "
               "to tell the groups apart.")
    rows = [("none", None)] + [(r[key]["condition"], float(replay)) for replay, r in f["by_replay"].items()
                               for key in ("full", "best_single")]
    table = pd.DataFrame(summary["table"])
    headline = pd.DataFrame([_qk_row(table, cond, replay, buckets, id_bucket) for cond, replay in dict.fromkeys(rows)])
    curves = (settings.get("config") or {}).get("protocol") == "curves"
    claims = [_qk_groups(f, ft, summary["runs"], curves), _qk_frequency(f), *_qk_spectrum(f, table, ft),
              _qk_replay(f, ft, id_bucket), _qk_beyond(table, beyond)] + (
        [_qk_curves(table, f, ft, settings["config"])] if curves and "fit" in table else [])
    return Finding(
        question=(f"Does fine-tuning one column (or one RoPE pair) of W_Q and W_K on lengths {ft} make the model work "
                  "at those lengths, as the later abstract of Spiegel et al. claims?"),
        answer=answer, headline=headline,
        rule=f"Selection rule: {settings.get('selection_rule', 'see run.json')}. Mean over seeds on held-out "
             f"samples; ID cost: drop of exact accuracy on lengths {id_bucket}.", claims=claims)


def _qk_singles(summary: dict, settings: dict, ft: str, beyond: str, buckets: list[str]) -> Finding:
    """A run of single groups without full fine-tuning to compare with: the best of them, every condition's row, and
    exact accuracy against rotation frequency (pairs, columns) and the learning curves as claims."""
    table = pd.DataFrame(summary["table"])
    singles = table[table.condition.astype(str).str.startswith(("qk-pair:", "qk-column:"))]
    best = singles.sort_values([f"exact_{ft}", f"partial_{ft}"], ascending=False).iloc[0]
    none = table[table.condition == "none"]
    untrained = f" (the untrained model: {sig(none.iloc[0][f'exact_{ft}'])})" if len(none) else ""
    answer = (f"This run compares single groups only (no full fine-tuning: its `only` leaves it out). The best, "
              f"{best['condition']} ({pct(best['fraction'])} of the parameters), reaches exact accuracy "
              f"{sig(best[f'exact_{ft}'])} on {ft}, per-token {sig(best[f'partial_{ft}'])}{untrained}.")
    rows = [(c, None if c == "none" else r) for c, r in zip(table.condition, table.replay)]
    headline = pd.DataFrame([_qk_row(table, c, r, buckets, buckets[0]) for c, r in rows])
    claims = [Claim(f"One {kind} at a time, against rotation frequency", (
        f"Exact accuracy on {ft} after fine-tuning one {kind} (of W_Q and W_K), against its pair's rotation "
        "frequency, with 95 % intervals."), [f"{kind}_frequency_exact_replay0"])
        for kind in ("pair", "column") if singles.condition.str.startswith(f"qk-{kind}:").sum() >= 2]
    claims += [Claim("Learning curves", f"Every condition's exact accuracy on {ft} as it trained.",
                     ["curves_finetuned_exact_replay0"]), _qk_beyond(table, beyond)]
    return Finding(
        question=(f"How far does fine-tuning one RoPE pair or one column of W_Q and W_K on lengths {ft} take the "
                  "model there?"),
        answer=answer, headline=headline,
        rule=f"Selection rule: {settings.get('selection_rule', 'see run.json')}. Mean over seeds on held-out "
             f"samples; ID cost: drop of exact accuracy on lengths {buckets[0]}.", claims=claims)


def _qk_row(table: pd.DataFrame, condition: str, replay: float | None, buckets: list[str], id_bucket: str) -> dict:
    pick = table[(table.condition == condition) & ((table.replay.isna()) if replay is None else
                                                   (table.replay == replay))].iloc[0]
    row = {"condition": condition, "replay": "–" if replay is None else _replay(replay),
           "trainable (%)": pp(pick["fraction"])}
    for b in buckets:
        mean = pick[f"exact_{b}"]
        row[f"exact {b.replace('-', '–')}"] = (_interval(mean, pick[f"exact_{b}_lo"], pick[f"exact_{b}_hi"])
                                               if f"exact_{b}_lo" in pick else
                                               _plus_minus(mean, pick.get(f"exact_{b}_sd")))
        row[f"per-token {b.replace('-', '–')}"] = sig(pick[f"partial_{b}"])
    row["ID cost (pp)"] = pp(pick["id_cost"])
    return row


def _replay_stem(replay: str) -> str:
    return f"replay{float(replay):g}"


def _headline_replay(f: dict) -> str:
    """The replay share the headline claims speak of: no replay when it was run, else the first one run."""
    return "0.0" if "0.0" in f["by_replay"] else next(iter(f["by_replay"]))


def _qk_groups(f: dict, ft: str, runs: int, curves: bool = False) -> Claim:
    replay = _headline_replay(f)
    r, stem = f["by_replay"][replay], _replay_stem(replay)
    budget = "each trained until its learning curve stopped rising (or its cap)" if curves else \
        "at an equal step budget"
    return Claim("Full fine-tuning against one parameter group", (
        f"Over {runs} runs {budget}, full fine-tuning gains {sig(r['full_gain_exact_pp'])} pp of exact "
        f"accuracy on {ft} and {sig(r['full_gain_partial_pp'])} pp per-token; the best single group falls "
        f"{sig(r['gap_exact_pp'])} pp (exact) and {sig(r['gap_partial_pp'])} pp (per-token) short of it."),
        [f"by_bucket_exact_{stem}", f"by_bucket_partial_{stem}"])


def _qk_frequency(f: dict) -> Claim:
    rho = {k: v.get("spearman_frequency_vs_partial") for k, v in f["by_replay"].items()}
    said = "; ".join(f"replay {_replay(k)}: {sig(v)}" for k, v in rho.items() if v is not None)
    return Claim("Which rotation frequencies matter", (
        "Per-token accuracy after fine-tuning one RoPE pair, against the pair's rotation frequency"
        + (f" (Spearman correlation of frequency with per-token accuracy, {said})." if said else ".")),
        [f"pair_frequency_{_replay_stem(k)}" for k in f["by_replay"]])


SPECTRUM_POINTS = 4  # pairs and columns a run must try, each, for its exact and column frequency figures to be key


def _qk_spectrum(f: dict, table: pd.DataFrame, ft: str) -> list[Claim]:
    """A run that spans the rotary spectrum (at least SPECTRUM_POINTS pairs and as many columns): exact accuracy
    against rotation frequency for the pairs and for the columns, each a claim of its own so that its figure is a key
    one (with fewer points a frequency figure says little)."""
    groups = table.condition.astype(str)
    if min(groups.str.startswith(kind).sum() for kind in ("qk-pair:", "qk-column:")) < SPECTRUM_POINTS:
        return []
    replay = _headline_replay(f)
    rho = f["by_replay"][replay].get("spearman_frequency_vs_exact")
    stem = _replay_stem(replay)
    return [Claim("Exact accuracy across the rotary spectrum", (
        f"Exact accuracy on {ft} after fine-tuning one RoPE pair, against the pair's rotation frequency, with 95 % "
        "intervals" + (f" (Spearman correlation with frequency {sig(rho)})." if rho is not None else ".")),
        [f"pair_frequency_exact_{stem}"]),
        Claim("One column per pair", (
            f"Exact accuracy on {ft} after fine-tuning one column of W_Q and W_K (the first of a pair's two), "
            "against the pair's rotation frequency, with 95 % intervals (per token: the report's figure "
            f"column_frequency_{stem})."), [f"column_frequency_exact_{stem}", f"column_frequency_{stem}"])]


def _qk_replay(f: dict, ft: str, id_bucket: str) -> Claim:
    parts = [f"replay {_replay(k)}: full fine-tuning exact {sig(v['full'][f'exact_{ft}'])} on {ft}, ID cost "
             f"{pp(v['full']['id_cost'])} pp" for k, v in f["by_replay"].items()]
    others = [s for k in f["by_replay"] if k != "0.0" for s in (f"by_bucket_exact_{_replay_stem(k)}",
                                                                  f"by_bucket_partial_{_replay_stem(k)}")]
    return Claim("What fine-tuning costs on the training lengths", (
        f"Replaying ID samples (lengths {id_bucket}) while fine-tuning keeps them: {'; '.join(parts)}."), others)


def _qk_curves(table: pd.DataFrame, f: dict, ft: str, config: dict) -> Claim:
    """Curves protocol: where each condition (no replay) stopped, whether it fit (by its exact accuracy at the last
    evaluation against the target, never by the rule that stopped it), and the steps it took."""
    replay = _headline_replay(f)
    stem = _replay_stem(replay)
    rows = table[(table.condition != "none") & (table.replay == float(replay))]
    target = config.get("fit_exact", 0.9)
    rule = {"plateau": f"its learning curve on {ft} stopped rising ({config.get('stop_metric', 'partial')})",
            "target": f"its exact accuracy on {ft} reached {sig(target)}",
            "none": "no stop rule"}[config.get("stop", "plateau")]
    said = "; ".join(f"{r.condition} {r.fit} (exact {sig(r.plateau_exact)} at its last evaluation; stopped: "
                     f"{r.stop_reason}, mean step {sig(r.stop_step)})" for r in rows.itertuples())
    return Claim("Learning curves: where each run stopped and whether it fit", (
        f"Every run trained until {rule} or its cap; a condition fits when every seed's exact accuracy on {ft} at its "
        f"last evaluation is at least {sig(target)}, whichever rule stopped it: {said}."),
        [f"curves_finetuned_exact_{stem}", f"curves_finetuned_partial_{stem}"])


def _qk_beyond(table: pd.DataFrame, beyond: str) -> Claim:
    col = f"exact_{beyond}"
    best = table.loc[table[col].idxmax()]
    return Claim(f"Beyond the fine-tuned lengths ({beyond})", (
        f"The best exact accuracy on lengths {beyond} of any condition is {sig(best[col])} ({best['condition']}); "
        f"per-token at most {sig(table[f'partial_{beyond}'].max())}."))


# ----------------------------------------------------------------------------------------------- abc
def _mean(cell: str) -> float:
    """0.057 from '0.057 [0.021, 0.093]' (or, in a run written before intervals, '0.057 ± 0.025')."""
    return float(re.split(r"\s*[±\[]\s*", str(cell))[0])


def abc(summary: dict, settings: dict) -> Finding:
    """Vanilla positional encodings, ABS and ABC per task at every test length."""
    tables = summary["tables"]
    table = pd.DataFrame(tables[ABC_TABLE] if ABC_TABLE in tables else tables[ABC_TABLE_SD])
    digits = [c for c in table.columns if c.endswith(" digits")]
    longest = max(digits, key=lambda c: int(c.split()[0]))
    parts = []
    for task, rows in table.groupby("task", sort=False):
        at = {r["condition"]: _mean(r[longest]) for r in rows.to_dict("records")}
        vanilla = [at[c] for c in VANILLA if c in at]
        said = [f"vanilla at most {sig(max(vanilla))}"] if vanilla else []
        said += [f"{c.upper()} {sig(at[c])}" for c in ("abs", "abc") if c in at]
        parts.append(f"{task}: {', '.join(said)}")
    biased = [_mean(r[longest]) for r in table.to_dict("records") if r["condition"] in ("abs", "abc")]
    verdict = ("Yes" if biased and min(biased) >= 0.99 else "Partly" if biased and max(biased) >= 0.5 else "No")
    answer = f"{verdict}. Exact accuracy at {longest}: " + "; ".join(parts) + "."
    headline = table[["task", "condition", "seeds", *digits]].astype(str)
    config = settings.get("config") or {}
    claims = [Claim(f"{task.capitalize()}", _abc_task_text(rows, digits, longest), [f"abc_{task}"])
              for task, rows in table.groupby("task", sort=False)]
    not_run = summary.get("not_run") or {}
    if not_run:
        claims.append(Claim("Conditions not run here", "; ".join(f"{k}: {v}" for k, v in not_run.items()) + "."))
    return Finding(
        question=(f"Do models trained on up to {config.get('train_max', digits[0].split()[0])} digits extrapolate to "
                  f"{longest} once their attention is biased to the right tokens (ABS, ABC), as Duan & Shi (2023) "
                  "report?"), answer=answer, headline=headline,
        rule=f"Selection rule: {settings.get('selection_rule', 'see run.json')}. Exact accuracy, mean over seeds "
             + ("[95 % interval]." if ABC_TABLE in tables else "± sd."), claims=claims)


def _abc_task_text(rows: pd.DataFrame, digits: list[str], longest: str) -> str:
    by = {r["condition"]: r for r in rows.to_dict("records")}
    best = max(by, key=lambda c: _mean(by[c][longest]))
    first = digits[0]
    return (f"Best at {longest}: {best} ({by[best][longest]}). At {first} (the training length): "
            + ", ".join(f"{c} {sig(_mean(r[first]))}" for c, r in by.items()) + ".")


def is_abc_paper(summary: dict, settings: dict) -> bool:
    """Whether a run's summary is the ABC paper study's."""
    return ABC_PAPER_TABLE in (summary.get("tables") or {})


def abc_paper(summary: dict, settings: dict) -> Finding:
    """The paper's protocol: does Table 1 hold (ABC at the longest length), with each base's fit and ABS beside."""
    table = pd.DataFrame(summary["tables"][ABC_PAPER_TABLE])
    digits = [c for c in table.columns if c.endswith(" digits")]
    longest = max(digits, key=lambda c: int(c.split()[0]))
    by = {(r["task"], r["condition"]): r for r in table.to_dict("records")}
    parts, claims = [], []
    for task in dict.fromkeys(table.task):
        base, said = by.get((task, "vanilla")), []
        if base is not None:
            said.append(f"vanilla base fitted on {base['fitted']} of {base['seeds']} seeds")
        said += [f"{c.upper()} {by[task, c][longest]}" for c in ("abc", "abs") if (task, c) in by]
        parts.append(f"{task}: {', '.join(said)}")
        claims.append(Claim(task.capitalize(), f"At {longest}: " + "; ".join(
            f"{c} {r[longest]}" for (t, c), r in by.items() if t == task) + ".", [f"abc_paper_{task}"]))
        if (task, "abc") in by:
            claims.append(Claim(f"{task.capitalize()}: the calibrated bias", "The last layer's attention averaged "
                                "over the correctly answered calibration samples (cross block: target rows x operand "
                                "columns) beside the bias Algorithm 1 builds from it (blank: -inf), first seed.",
                                [f"abc_bias_{task}"]))
    abc_rows = [by[k] for k in by if k[1] == "abc"]
    held = bool(abc_rows) and all(float(str(r[longest]).split()[0]) >= 0.99 for r in abc_rows)  # "0.991 [..]"
    verdict = "No ABC row: no base interpolated" if not abc_rows else "Yes" if held else "No"
    if summary.get("not_run"):
        claims.append(Claim("Not run", "; ".join(summary["not_run"]) + "."))
    return Finding(
        question=(f"Does Duan & Shi's Table 1 hold at this size: with their protocol (numbers of [0, 2^20], the "
                  f"padded layout, a base that interpolates, Algorithm 1 from its last layer), does ABC reach ~100 % "
                  f"exact at {longest}?"),
        answer=f"{verdict}. Exact accuracy at {longest} [pooled Wilson 95 %]: " + "; ".join(parts) + ".",
        headline=table.astype(str), claims=claims,
        rule="A base counts only when it reaches the ID threshold on held-out numbers (else 'did not fit', no ABC "
             "row); exact accuracy mean over seeds, the interval pooled over them, the paper's number in brackets.")


# ----------------------------------------------------------------------------------------------- parity
def parity(summary: dict, settings: dict) -> Finding:
    """Exact and per-token accuracy of each scratchpad format at multiples of the training length."""
    rows = pd.DataFrame(summary["tables"]["summary"])
    config = settings.get("config") or {}
    multiples = sorted(rows.multiple.unique())
    cell = {(r["format"], r["multiple"]): r for r in rows.to_dict("records")}
    formats = list(dict.fromkeys(rows.format))

    def shown(fmt: str, m: int, text: str) -> str:  # the curves protocol claims nothing past a format that did not fit
        unfit = cell[fmt, m].get("fit") == "did not fit" and cell[fmt, m]["exact_mean"] != cell[fmt, m]["exact_mean"]
        return "did not fit" if unfit else text

    exact = {k: shown(*k, _interval(c["exact_mean"], c.get("exact_lo"), c.get("exact_hi")) if "exact_lo" in c
                      else _plus_minus(c["exact_mean"], c["exact_sd"])) for k, c in cell.items()}
    headline = pd.DataFrame([{"format": fmt, **{f"exact {m}x ({cell[fmt, m]['bits']} bits)": exact[fmt, m]
                                                for m in multiples if (fmt, m) in cell},
                              **{f"per-token {m}x": shown(fmt, m, sig(cell[fmt, m]["partial_mean"])) for m in multiples
                                 if (fmt, m) in cell}} for fmt in formats])
    target = 5 if 5 in multiples else multiples[-1]
    at = {fmt: cell[fmt, target]["exact_mean"] for fmt in formats if (fmt, target) in cell}
    fixed = [f for f in ("interleaved", "interleaved-ab", "mnemonic") if f in at]
    goal = bool(fixed) and all(at[f] >= 0.9 for f in fixed) and at.get("scratchpad", 0) < 0.1
    second = multiples[1] if len(multiples) > 1 else multiples[0]
    answer = (f"{'Yes' if goal else 'No'}. Exact accuracy at {target}x the training length: "
              + ", ".join(f"{f} {shown(f, target, sig(v))}" for f, v in at.items())
              + f"; at {second}x: " + ", ".join(f"{f} {shown(f, second, sig(cell[f, second]['exact_mean']))}"
                                                 for f in formats if (f, second) in cell) + ".")
    claims = [
        Claim("Exact accuracy by length", "Exact accuracy of each format at multiples of the training length "
              f"({config.get('train_length', '?')} bits), mean over seeds [95 % interval: t over seeds or Wilson "
              "pooled, the wider].",
              ["exact_vs_length"]),
        Claim("Per-token accuracy by length", "Per-token accuracy: " + "; ".join(
            f"{f} " + " / ".join(sig(cell[f, m]["partial_mean"]) for m in multiples if (f, m) in cell)
            for f in formats) + f" at {' / '.join(f'{m}x' for m in multiples)}.", ["partial_vs_length"]),
        Claim("Attention at the failure", "One head of each format's model on a sample past the training length.",
              [f"head_{f}" for f in sorted(formats, key=lambda f: f != "interleaved")]),
    ]
    if config.get("protocol") == "curves" and "convergence" in summary["tables"]:
        conv = summary["tables"]["convergence"]
        claims.append(Claim("Learning curves: trained until each format fits", "Every run trained until exact "
                            f"accuracy on held-out training-length inputs reached {config.get('fit_exact')} or "
                            f"{config.get('cap')} steps: " + "; ".join(
                                f"{c['format']} {c['fit']} ({c['stop_reason']}, mean step {sig(c['stop_step'])})"
                                for c in conv) + ".", ["curves_fit"]))
    return Finding(
        question=("Does the scratchpad's format decide length generalization on parity (Ebrahimi, Panchal & "
                  "Memisevic 2024): do interleaved or mnemonic scratchpads reach ≥ 0.9 exact accuracy at 5x the "
                  "training length where the running scratchpad stays below 0.1?"),
        answer=answer, headline=headline,
        rule=f"Learning rate per format chosen on a selection set at {config.get('select_multiple', '?')}x the "
             "training length (seed 0); mean over seeds "
             + ("[95 % interval]" if all("exact_lo" in c for c in cell.values()) else "± sd")
             + " on held-out samples.", claims=claims)
