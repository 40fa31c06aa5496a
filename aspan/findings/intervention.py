"""The findings of the intervention runs: `aspan demo` (a tiny model) and `aspan pretrained` (a pretrained one).

Both ask the question of Spiegel et al. 2025: does a model fail out of distribution because its attention leaves
the reference positions, and does pushing attention back onto them fix it?
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from .words import Claim, Finding, pct, pp, sig

ACCURACY = ("ID exact", "ID per-token", "OOD exact", "OOD per-token")


def is_demo(summary: dict, settings: dict) -> bool:
    """Whether a run's summary is `aspan demo`'s."""
    return "headline" in (summary.get("tables") or {}) and "paper_recipe" in summary


def is_pretrained(summary: dict, settings: dict) -> bool:
    """Whether a run's summary is `aspan pretrained`'s."""
    return "table2" in (summary.get("tables") or {}) and "finetune" in summary


def _lengths(params: Any) -> str:
    """'lengths 11-20' from a task's parameters, or '' when they have no length range."""
    length = params.get("length") if isinstance(params, dict) else None
    return f"lengths {length[0]}–{length[1]}" if isinstance(length, (list, tuple)) and len(length) == 2 else ""


def _sets(settings: dict) -> str:
    """' (ID: lengths 1-10; OOD: lengths 11-20)' from run.json, or ''."""
    id_len, ood_len = _lengths(settings.get("id_params")), _lengths(settings.get("ood_params"))
    return f" (trained on {id_len}; tested on {ood_len})" if id_len and ood_len else ""


def headline_table(rows: list[dict]) -> pd.DataFrame:
    """Conditions x ID/OOD exact and per-token accuracy (3 significant figures) and ID cost in pp."""
    table = pd.DataFrame(rows)
    out = pd.DataFrame({"condition": table["model"], "mode": table["mode"]})
    for col in ACCURACY:
        out[col] = table[col].map(sig)
    out["ID cost (pp)"] = table["ID cost"].map(pp)
    return out


def change(what: str, before: float, after: float) -> str:
    """'raises WHAT from A to B', 'lowers ...' or 'leaves WHAT at A' (as the numbers read at 3 figures)."""
    a, b = sig(before), sig(after)
    if a == b:
        return f"leaves {what} at {a}"
    return f"{'raises' if after > before else 'lowers'} {what} from {a} to {b}"


def _verdict(base: dict, sel: dict | None) -> str:
    if sel is None or (sel["ood_exact"] <= base["ood_exact"] and sel["ood_partial"] <= base["ood_partial"]):
        return "No"
    return "Yes" if sel["ood_exact"] >= 0.95 else "Partly"


def demo(summary: dict, settings: dict) -> Finding:
    """`aspan demo`: the failure, attention on correct vs wrong tokens, which heads, the edits, the two rankings."""
    base, sel, paper = summary["baseline"], summary["selected"], summary["paper_recipe"]
    task, budget = summary["task"], pp(summary["id_budget"])
    verdict = _verdict(base, sel)
    if sel is None:
        answer = (f"{verdict}. No edit of the {summary['candidates']} evaluated improves held-out OOD accuracy within "
                  f"the ID budget of {budget} pp.")
    else:
        exact = change("held-out OOD exact accuracy", base["ood_exact"], sel["ood_exact"])
        token = change("per-token accuracy", base["ood_partial"], sel["ood_partial"])
        if token.split()[0] == exact.split()[0]:  # 'raises A ... and B ...', not 'raises A ... and raises B ...'
            token = token.split(" ", 1)[1]
        answer = (f"{verdict}. The edit the selection rule picks {exact} and {token}, at an ID cost of "
                  f"{pp(base['id_exact'] - sel['id_exact'])} pp.")
    if paper is not None:
        answer += (f" The paper's recipe reaches {sig(paper['ood_exact'])} exact / {sig(paper['ood_partial'])} "
                   f"per-token at an ID cost of {pp(base['id_exact'] - paper['id_exact'])} pp.")
    claims = [_failure(summary), _attention(summary), _heads(summary), _edits(summary), _rankings(summary)]
    return Finding(question=f"Does editing attention on the references fix OOD {task}{_sets(settings)}?",
                   answer=answer, headline=headline_table(summary["tables"]["headline"]),
                   rule=f"Selection rule: {summary['rule']}. ID cost: drop of ID exact accuracy on the held-out ID "
                        "set; all numbers on held-out sets no choice saw.", claims=claims)


def _failure(s: dict) -> Claim:
    return Claim("The failure", (
        f"Unedited, the model is exact on {sig(s['id_exact'])} of ID samples but on {sig(s['ood_exact'])} of "
        f"held-out OOD samples, where it gets {sig(s['ood_partial'])} of the tokens right (teacher-forced; greedy "
        f"generation: exact {sig(s['ood_generate_exact'])}, per-token {sig(s['ood_generate_partial'])}). Per-token "
        "accuracy falls with length past the training lengths; the rollout of a median OOD sample shows where "
        "attention goes (red squares: the reference positions each output must read)."),
        ["08_accuracy_vs_length", "01_rollout_ood"])


def _attention(s: dict) -> Claim:
    rows = s["tables"]["correct_vs_error"]
    parts = [f"{r['score']}: {pct(r['mean_correct'])} vs {pct(r['mean_error'])} (Welch t = {sig(r['t'])}, "
             f"p = {sig(r['p'])})" for r in rows]
    goes = "goes with" if s["welch_t"] > 0 else "does not go with"
    return Claim("Attention on correct vs wrong tokens", (
        f"Attention on the references {goes} correct tokens on held-out OOD samples (Table 3 of the paper): the "
        f"share of a row's attention on its references for correct vs wrong tokens is {'; '.join(parts)}."),
        ["04_correct_vs_error"])


def _heads(s: dict) -> Claim:
    d = s["best_offset"]
    where = "the references themselves" if d == 0 else f"the references shifted by {d:+d} positions (ref{d:+d})"
    paper_heads = "+".join(f"L{layer}H{head}" for layer, head in (s["paper_recipe"] or {}).get("heads", []))
    text = (f"Ranked on ID samples with the offset scan, the heads that put the most attention per target row do so "
            f"on {where}: {s['best_offset_heads']}.")
    if paper_heads:
        text += f" Ranked by attention on the references alone (the paper's ranking) the top heads are {paper_heads}."
    return Claim("Which heads read the references", text,
                 ["05_offset_scan", "06_heads_ref", "07_heads_best_offset", "03_head_across_lengths"])


def _edits(s: dict) -> Claim:
    base, lines = s["baseline"], []
    for key, name in (("paper_recipe", "The paper's recipe"), ("selected", "The selected edit"),
                      ("upper_bound", "The patching upper bound")):
        c = s.get(key)
        if c is None:
            lines.append(f"{name}: none (no such edit improves OOD accuracy).")
            continue
        lines.append(f"{name} ({c['method']}): OOD exact {sig(c['ood_exact'])}, per-token {sig(c['ood_partial'])}, "
                     f"ID exact {sig(c['id_exact'])} (ID cost {pp(base['id_exact'] - c['id_exact'])} pp).")
    return Claim("The edits and their ID cost", (
        f"{s['candidates']} edits were evaluated on an OOD selection set, each with its ID cost; the rule picks one "
        f"within {pp(s['id_budget'])} pp. " + " ".join(lines)),
        ["10_pareto", "09_accuracy_vs_strength", "02_rollout_ood_reinforced"])


def _rankings(s: dict) -> Claim:
    ranks = pd.DataFrame(s["tables"]["rankings_compared"]).head(8)
    table = pd.DataFrame({
        "causal rank": ranks["causal_rank"], "head": [f"L{a}H{b}" for a, b in zip(ranks["layer"], ranks["head"])],
        "offset": [f"ref{d:+d}" if d else "ref" for d in ranks["delta"]], "estimate": ranks["estimate"].map(sig),
        "measured effect": ranks["effect"].map(sig), "attention rank": ranks["paper_rank"]})
    rho = s["search"]
    return Claim("The causal ranking vs the attention ranking", (
        "Heads ranked by the attribution estimate of patching each alone at its best offset (measured exactly for "
        "the top ones) against their rank by attention on the references: Spearman correlation of the attention "
        f"score with the causal estimate {sig(rho.get('spearman_paper_vs_estimate'))}, of the estimate with the "
        f"measured effect {sig(rho.get('spearman_estimate_vs_effect'))}."), [], table)


def pretrained(summary: dict, settings: dict) -> Finding:
    """`aspan pretrained`: the pretrained model prompted, fine-tuned, and fine-tuned with the selected edit."""
    s, model, task = summary, summary["model"], summary["task"]
    shots = sorted({k.split("_")[1] for k in s if k.startswith("pretrained_") and k.endswith("_ood_teacher_exact")})
    rows = [{"model": f"pretrained, {n.replace('shot', '-shot')}", "mode": "teacher-forced",
             **_accuracy(s, f"pretrained_{n}")} for n in shots]
    ft = _accuracy(s, "finetuned")
    rows.append({"model": f"fine-tuned ({s['finetune']})", "mode": "teacher-forced", **ft})
    held = s.get("selected_held_out")
    if held is not None:
        rows.append({"model": f"fine-tuned + selected edit ({s['selected']['head_names'].count('+') + 1} heads, "
                              f"C={sig(held['strength'])})", "mode": "teacher-forced", "ID exact": held["id_exact"],
                     "ID per-token": None, "OOD exact": held["exact"], "OOD per-token": held["partial"],
                     "ID cost": held["id_cost"]})
    for row in rows:
        row.setdefault("ID cost", None)
    verdict = _verdict({"ood_exact": ft["OOD exact"], "ood_partial": ft["OOD per-token"]},
                       None if held is None else {"ood_exact": held["exact"], "ood_partial": held["partial"]})
    answer = (f"Fine-tuned, {model} is exact on {sig(ft['ID exact'])} of ID and {sig(ft['OOD exact'])} of OOD samples "
              f"(per-token {sig(ft['OOD per-token'])}). ")
    answer += (f"{verdict}: no reinforcement was selected." if held is None else
               f"{verdict}: reinforcing the top heads' attention on the references gives OOD exact "
               f"{sig(held['exact'])}, per-token {sig(held['partial'])} on held-out samples (ID cost "
               f"{pp(held['id_cost'])} pp).")
    return Finding(question=f"Does {model} fail OOD {task}{_sets(settings)}, and does reinforcing attention on the "
                            "references help?", answer=answer, headline=headline_table(rows),
                   rule=f"Selection rule: {s['rule']}. A negative ID cost is an ID gain.",
                   claims=_pretrained_claims(s))


def _accuracy(s: dict, who: str) -> dict:
    return {"ID exact": s.get(f"{who}_id_teacher_exact"), "ID per-token": s.get(f"{who}_id_teacher_partial"),
            "OOD exact": s.get(f"{who}_ood_teacher_exact"), "OOD per-token": s.get(f"{who}_ood_teacher_partial")}


def _pretrained_claims(s: dict) -> list[Claim]:
    t, p, sel = s.get("welch_t_sample"), s.get("welch_p_sample"), s.get("selected")
    goes = "goes with" if t is not None and t > 0 and p is not None and p < 0.05 else "does not clearly go with"
    return [
        Claim("The failure", (
            f"After fine-tuning ({s['finetune']}; loss {sig(s['train_loss_first'])} → {sig(s['train_loss_last'])}), "
            f"per-token accuracy is {sig(s.get('finetuned_id_teacher_partial'))} on ID and "
            f"{sig(s.get('finetuned_ood_teacher_partial'))} on OOD lengths."), ["03_accuracy_vs_length"]),
        Claim("Attention on correct vs wrong tokens", (
            f"Attention on the references {goes} correct OOD tokens: the rollout puts "
            f"{pct(s.get('attn_rollout_sample_correct'))} of a row's attention on its sample's references for correct "
            f"and {pct(s.get('attn_rollout_sample_error'))} for wrong tokens (Welch t = {sig(t)}, p = {sig(p)})."),
            ["02_correct_vs_error"]),
        Claim("Which heads", f"The heads with the most attention on the references: {s['top_heads']}.",
              ["01_heads_ref", "05_offset_scan", "06_heads_best_offset"]),
        Claim("The edits and their ID cost", (
            "Reinforcement of the top heads at several strengths, each with its ID cost; "
            + ("none was selected." if sel is None else
               f"the rule selected {sel['heads']} at C={sig(sel['strength'])} (selection set: OOD exact "
               f"{sig(sel['exact'])}, ID cost {pp(sel['id_cost'])} pp).")),
            ["04_accuracy_vs_strength"]),
    ]
