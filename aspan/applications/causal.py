"""The causal side of `aspan demo`: the toolkit's own search for an edit that repairs OOD failures within an ID-cost
budget, as grid points for the experiment engine, and the two head rankings side by side.

- The paper's recipe (Spiegel et al. 2025, Appendix F) is the demo's reinforcement grid at the references: additive
  C on the top heads by attention share, chosen as the paper does, by the largest OOD gain at any ID cost.
- The search (`experiments.search.propose`: causal head profiling and greedy selection of pattern-patching atoms)
  proposes heads with per-head key offsets; `search_points` turns the greedy prefixes and variants of the full
  proposal (reinforcement, renormalised reinforcement, PASTA steering, each also gated to rows past the longest
  training position, after `experiments.edit.beyond_row`) into grid points of the engine's method "atoms" (each
  head under its own `Edit`). With the search's `eos` options holding "extrapolate", each of these edits is also
  evaluated with every atom leaving the end-of-sequence row alone and with every atom editing it on the reference
  map continued one row (a hypothesis the rule tests, not a choice).
  The engine's one rule then chooses among every evaluated edit (largest OOD exact gain with ID cost <= the
  budget), reported on held-out samples.
- The patching upper bound: pattern patching only (uniform attention on the shifted references; the limit of
  renormalised reinforcement as C grows) at any ID cost.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd

from ..experiments import engine as E
from ..experiments.edit import Edit
from ..experiments.profiling import spearman
from ..experiments.search import Proposal, SearchConfig, decode_atoms, describe, encode_atoms, propose

NAMES = ("baseline", "paper_recipe", "selected", "upper_bound")  # the conditions of summary.json
S_KEYS = ("id_exact", "id_partial", "ood_exact", "ood_partial", "method", "heads", "rule")  # each condition's keys

# variants tried on the heads and offsets the search proposes: name -> Edit fields
VARIANTS: dict[str, dict[str, Any]] = {
    "patch": {},
    "reinforce C=1": {"method": "reinforce", "strength": 1.0},
    "reinforce C=5": {"method": "reinforce", "strength": 5.0},
    "renormalised reinforce C=20": {"method": "reinforce", "strength": 20.0, "renormalize": True},
    "steer alpha=0.01": {"method": "steer", "strength": 0.01},
}

@dataclass
class Searched:
    """What the search proposed and the grid points it adds."""

    proposal: Proposal
    points: list[dict]  # method "atoms" grid points on the selection set
    beyond: int  # the longest training row; gated edits touch only rows past it


def search(eng: E.Engine, model_id: str, seed: int, cfg: SearchConfig, variants: Sequence[str] = tuple(VARIANTS)
           ) -> Searched:
    """Propose heads and offsets on the engine's selection and ID sets; the grid points that evaluate them."""
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"unknown edit variant {v!r}; choose from {', '.join(VARIANTS)}")
    beyond = eng.beyond_row()  # the engine's one "beyond" gate: the last row an ID sample trains
    prop = propose(eng.model, eng.tok, eng.samples("selection", seed), eng.samples("id", seed), beyond, cfg)
    points = _search_points(eng.data, model_id, prop, (beyond, seed), variants, cfg.eos)
    return Searched(prop, points, beyond)


def _eos_versions(combo: list, eos: Sequence[str]) -> list[list]:
    """The combination with every atom's end-of-sequence treatment set to each option."""
    return [[e.replace(eos=opt) for e in combo] for opt in eos]


def is_patch(row: dict) -> bool:
    """Whether an engine row is pattern patching only (the upper bound's family)."""
    if row["method"] == "patch":
        return True
    return row["method"] == "atoms" and all(a["method"] == "patch" for a in row["atoms"])


def _search_points(data: E.Data, model_id: str, prop: Proposal, where: tuple[int, int], variants: Sequence[str],
                   eos: Sequence[str] = ("none",)) -> list[dict]:
    """Greedy prefixes (patch), variants of the full proposal (each also gated), and patching every helpful head;
    each as chosen, then (appended, so the points without it come first and unchanged) with every atom's `eos` set
    to each option in `eos` where that is a new edit.
    `where` is (the longest training row, the data seed)."""
    beyond, seed = where
    atoms = prop.atoms
    sets: list[tuple[str, list]] = [(f"patch, first {k} of the greedy choice", atoms[:k]) for k in range(1, len(atoms))]
    for name in variants:
        for gate in (None, beyond):
            fields = {**VARIANTS[name], "beyond": gate}
            sets.append((name, [e.replace(**fields) for e in atoms]))
    helpful = prop.profiled[prop.profiled.effect > 0]
    every = [Edit("patch", delta=int(d), heads=((int(l), int(h)),))
             for l, h, d in zip(helpful.layer, helpful["head"], helpful.delta)]
    if every and every != atoms:
        sets.append(("patch, every head with a positive effect", every))
    combos = [combo for _, combo in sets if combo]
    seen = {str(encode_atoms(c)) for c in combos}
    for version in [v for _, combo in sets for v in _eos_versions(combo, eos)]:
        if version and str(encode_atoms(version)) not in seen:  # each new treatment of the EOS row, once
            seen.add(str(encode_atoms(version)))
            combos.append(version)
    points = []
    for combo in combos:
        heads = "list:" + ",".join(f"{l}.{h}" for e in combo for l, h in e.heads)
        points.append(E.point(data, model_id, heads, 0.0, method=E.ATOMS, seed=seed, atoms=combo))
    return points


def label(row: dict) -> str:
    """A search row in words, e.g. 'L1H7 patch at ref+2; L0H0 patch at ref (rows > 21)'."""
    return describe(decode_atoms(row["atoms"]))


def rankings_compared(share: pd.DataFrame, prop: Proposal) -> pd.DataFrame:
    """The paper's attention-share ranking beside the causal one: per head, paper rank (score at delta 0),
    attention share at the head's best causal offset, the attribution estimate of patching there (best offset) and,
    for the heads profiled exactly, the measured per-token effect; sorted by the estimate."""
    est = prop.estimates[~prop.estimates.gated].sort_values("estimate", ascending=False, kind="stable")
    best = est.drop_duplicates(["layer", "head"])[["layer", "head", "delta", "estimate"]]
    best = best.merge(prop.profiled[["layer", "head", "effect"]], on=["layer", "head"], how="left")
    out = best.merge(share[["layer", "head", "rank", "score_sum"]].rename(columns={"rank": "paper_rank"}),
                     on=["layer", "head"])
    shares = [float(share.loc[(share.layer == l) & (share["head"] == h), f"score_row_d{d}"].iloc[0])
              if f"score_row_d{d}" in share.columns else float("nan")
              for l, h, d in zip(out.layer, out["head"], out.delta)]
    out = out.assign(share_at_delta=shares, causal_rank=range(1, len(out) + 1))
    cols = ["causal_rank", "layer", "head", "delta", "estimate", "effect", "paper_rank", "score_sum", "share_at_delta"]
    out = out[cols].reset_index(drop=True)
    out.attrs.update(spearman_paper_vs_estimate=spearman(out.score_sum, out.estimate)[0],
                     spearman_share_vs_estimate=spearman(out.share_at_delta, out.estimate)[0],
                     spearman_estimate_vs_effect=spearman(out.estimate, out.effect)[0])
    return out
