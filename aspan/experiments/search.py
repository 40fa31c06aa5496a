"""The toolkit's own search for an attention edit that repairs OOD failures within an ID-cost budget.

Causal head profiling proposes the heads and offsets; greedy forward selection combines them; the experiment
engine evaluates the proposals and their variants (method, strength, failure gate) on named sets and applies its
one selection rule (the largest OOD gain whose ID cost is within the budget, chosen on the selection set, reported
on the held-out set). Nothing is hand-picked: heads, offsets and methods all come out of measurements.

    prop = propose(model, tokenizer, selection_samples, id_samples, beyond=21)
    prop.atoms            # [Edit of one head], e.g. [patch at ref+2 on L1H7, patch at ref on L0H0, ...]

1. Score every (head, key offset delta, gate) atom at once with the attribution estimate of pattern patching
   (uniform attention on the references shifted by delta; Nanda 2023, Syed et al. 2023).
2. Profile exactly the best atom of the top heads by the estimate (one evaluation each, PASTA's model profiling,
   Zhang et al. 2023), keeping the heads whose measured effect is positive.
3. Greedy forward selection over those atoms, vetoing any combination whose ID exact accuracy drops by more than
   the budget on the ID set; a vetoed atom is tried again gated (editing only rows past the longest training
   position, which leaves ID inputs untouched). With `SearchConfig.eos` holding "extrapolate", every head's atom
   is offered both ways: leaving the end-of-sequence row alone, and editing it on the reference map continued one
   row (`Edit.eos`); the selection keeps whichever measures better, per head.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd

from ..options import EOS_REFS, EosRefs
from ..tasks.base import Sample
from ..tokenization import Tokenizer
from .profiling import (
    Edit,
    GreedyRule,
    atom_hooks,
    attribution,
    exact_effects,
    greedy_atoms,
    measure,
    selection_batches,
)


@dataclass
class SearchConfig:
    """How `propose` searches."""

    deltas: tuple[int, ...] = (-1, 0, 1, 2, 3)  # key offsets every head is scored at
    profile: int = 8  # heads profiled exactly: the top by the attribution estimate
    max_heads: int = 8  # greedy forward selection stops at this many heads
    id_budget: float = 0.01  # veto: largest drop of ID exact accuracy (on the ID set) a combination may cost
    metric: str = "exact"  # greedy maximises this on the selection set ...
    tiebreak: str = "partial"  # ... then this
    batch_size: int = 64  # samples per forward
    eos: tuple[EosRefs, ...] = ("none",)  # how each atom may treat the end-of-sequence row (greedy tries each)

    def check(self, n_heads: int) -> None:
        """Validate the configuration for a model of `n_heads` heads; ValueError naming the field otherwise."""
        if not self.deltas:
            raise ValueError("deltas is empty: give at least one key offset")
        if not 1 <= self.profile <= n_heads:
            raise ValueError(f"profile={self.profile} must be in 1..{n_heads} (the number of heads)")
        if self.max_heads < 1:
            raise ValueError(f"max_heads must be >= 1, got {self.max_heads}")
        if not 0 <= self.id_budget <= 1:
            raise ValueError(f"id_budget must be in [0, 1], got {self.id_budget}")
        if not self.eos or any(e not in EOS_REFS for e in self.eos):
            raise ValueError(f"eos must be a non-empty tuple of {', '.join(map(repr, EOS_REFS))}, got {self.eos!r}")


@dataclass
class Proposal:
    """What the search proposes, with the measurements behind it."""

    estimates: pd.DataFrame  # layer, head, delta, gated, estimate (every atom scored by attribution)
    profiled: pd.DataFrame  # layer, head, delta, estimate, effect (the atoms profiled exactly)
    greedy: pd.DataFrame  # one row per greedy step (see profiling.greedy_atoms)
    atoms: list[Edit] = field(default_factory=list)  # the greedy choice, in order (an edit of one head each)


def propose(
    model, tokenizer: Tokenizer, selection: Sequence[Sample], id_samples: Sequence[Sample], beyond: int,
    cfg: SearchConfig | None = None,
) -> Proposal:
    """Heads and offsets for pattern patching, chosen by measurement on `selection` (OOD) under the ID veto."""
    cfg = cfg or SearchConfig()
    cfg.check(model.cfg.n_layers * model.cfg.n_heads)
    sel = selection_batches(model, tokenizer, selection, cfg.batch_size)
    ids = selection_batches(model, tokenizer, id_samples, cfg.batch_size)
    estimates = _estimates(model, sel, cfg.deltas, beyond)
    ungated = estimates[~estimates.gated].sort_values(["estimate", "layer", "head"], ascending=[False, True, True],
                                                      kind="stable")
    best = ungated.drop_duplicates(["layer", "head"]).head(cfg.profile)
    atoms = {(int(r.layer), int(r["head"])): Edit("patch", delta=int(r.delta)) for _, r in best.iterrows()}
    effects = {h: exact_effects(model, sel, e, [h], "partial")[h] for h, e in atoms.items()}
    profiled = best.assign(effect=[effects[(int(l), int(h))] for l, h in zip(best.layer, best["head"])])
    pool = [edit.on([head]).replace(eos=e) for head, edit in atoms.items() if effects[head] > 0
            for e in dict.fromkeys(cfg.eos)]
    gated = {edit: edit.replace(beyond=beyond) for edit in pool}
    id_base = measure(model, ids, None, "exact")

    def allowed(combo: list[Edit]) -> bool:
        if all(e.beyond is not None and e.beyond >= beyond for e in combo):
            return True  # rows past the longest training position: ID inputs are untouched by construction
        fwd = lambda b: atom_hooks(combo, b.ref_mask, model)  # noqa: E731
        return id_base - measure(model, ids, fwd, "exact") <= cfg.id_budget + 1e-12

    rule = GreedyRule(metric=cfg.metric, tiebreak=cfg.tiebreak, allowed=allowed, fallback=gated)
    greedy = greedy_atoms(model, sel, pool, cfg.max_heads, rule) if pool else pd.DataFrame()
    return Proposal(estimates, profiled.reset_index(drop=True), greedy, list(greedy.attrs.get("atoms", [])))


def _estimates(model, batches, deltas: Sequence[int], beyond: int) -> pd.DataFrame:
    """Attribution estimate of patching every head at every offset, ungated and gated, from one pass."""
    edits = [Edit("patch", delta=d, beyond=b) for b in (None, beyond) for d in deltas]
    est = attribution(model, batches, edits)
    rows = [{"layer": l, "head": h, "delta": e.delta, "gated": e.beyond is not None, "estimate": float(est[i, l, h])}
            for i, e in enumerate(edits) for l in range(est.shape[1]) for h in range(est.shape[2])]
    return pd.DataFrame(rows)


def encode_atoms(atoms: Sequence[Edit]) -> list[dict]:
    """Atoms (edits of one head each) as JSON-able dicts (for grid points and summaries): `Edit.to_atom` of each."""
    return [edit.to_atom() for edit in atoms]


def decode_atoms(items: Sequence[dict]) -> list[Edit]:
    """The inverse of `encode_atoms`: `Edit.from_atom` of each."""
    return [Edit.from_atom(d) for d in items]


def describe(atoms: Sequence[Edit]) -> str:
    """'L1H7 patch at ref+2; L0H0 patch at ref (rows > 21)' — one clause per atom."""
    return "; ".join(f"L{l}H{h} {e.label}" for e in atoms for l, h in e.heads)
