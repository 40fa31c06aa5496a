"""Experiments on attention: head ranking (`ranking`), intervention sweeps (`sweep`), ABC/ABS biases (`abc`).

    ranking = rank_heads(model, tokenizer, id_samples, deltas=range(-2, 4))
    heads = select_heads(ranking, fraction=0.1)
    rows = run_sweep(SweepConfig.from_toml("configs/reversal_reinforce.toml"), "runs/sweep/sweep.jsonl")
    result = run_abc(model, tokenizer, id_samples, ood_samples)
"""
from __future__ import annotations

from ..lazy import lazy_exports

# submodule -> the names it defines, each imported from it on first access (PEP 562): a light submodule (`edit`, whose
# `Edit` the command line's settings hold) then loads without the others' torch and pandas
_LAZY: dict[str, tuple[str, ...]] = {
    "abc": ("ABCSettings", "HeadLines", "abc_bias", "abc_lines", "abs_bias", "abs_lines", "run_abc"),
    "ranking": ("heatmap", "offset_table", "rank_heads", "select_heads"),
    "sweep": ("SweepConfig", "grid", "run_sweep", "summary_table"),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY)
