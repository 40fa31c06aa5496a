"""What the tutorial notebooks share, so no notebook pastes it: one sample as a batch on the model's device, token
labels, the rollout figure with the reference cells outlined, summary tables that show only the columns computed,
the checkpoint's own evaluation in words, and the task presets as a table.

    view = Inspector(model, tokenizer)
    batch, n = view.one(sample)                       # a batch of one sample, its length in tokens
    view.rollout_figure(sample, "Rollout").show()     # paper Fig. 1, the references outlined
    summaries({"ID": id_result, "OOD": ood_result})   # one row per result, all-NaN columns left out
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

import hooks

from .. import tasks, viz
from ..batching import Batch, make_batch
from ..evaluation import EvalResult
from ..tasks import Sample


@dataclass(frozen=True)
class Inspector:
    """One model and its tokenizer, looked at one sample at a time."""

    model: Any  # a HookedTransformer or TransformerBridge
    tokenizer: Any  # the model's character tokenizer (CharTokenizer or HFCharAdapter)

    def one(self, sample: Sample) -> tuple[Batch, int]:
        """A batch of one sample on the model's device, and its length in tokens (prefix and EOS included)."""
        batch = make_batch([sample], self.tokenizer).to(self.model.cfg.device)
        return batch, int(batch.lengths[0])

    def labels(self, ids: Sequence[int]) -> list[str]:
        """One axis label per token id: the character, or <bos>/<eos>/<pad>."""
        tok = self.tokenizer
        special = {getattr(tok, "bos_id", None): "<bos>", tok.pad_id: "<pad>", tok.eos_id: "<eos>"}
        return [special.get(i) or tok.decode([i], stop_at_eos=False) for i in ids]

    def rollout_figure(self, sample: Sample, title: str, fwd_hooks=()) -> go.Figure:
        """The attention rollout of one sample (rows: its target rows, columns: every position) with its reference
        cells outlined, measured through `fwd_hooks` (an edit, say)."""
        batch, n = self.one(sample)
        with self.model.hooks(fwd_hooks):
            R = hooks.rollout(self.model, batch.tokens)[0, :n, :n]
        rows = [sample.query_row(j, batch.offset) for j in range(len(sample.target))]
        names = self.labels(batch.tokens[0, :n].tolist())
        return viz.rollout_heatmap(R, batch.ref_mask[0, :n, :n], names, rows=rows, title=title)


def computed(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame without its all-NaN columns (scores that were not measured: `attn_heads_*` without `heads=`, every
    AttnScore with `attn=False`)."""
    return frame.dropna(axis=1, how="all")


def summaries(results: Mapping[str, EvalResult | Mapping[str, float]]) -> pd.DataFrame:
    """One row per named result (`EvalResult.summary()` or a summary dict): exact, partial, n and the AttnScores that
    were measured; `n` as an integer."""
    rows = {name: r.summary() if isinstance(r, EvalResult) else dict(r) for name, r in results.items()}
    frame = computed(pd.DataFrame(rows).T)
    return frame.astype({"n": int}) if "n" in frame else frame


def checkpoint_eval(meta: Mapping[str, Any]) -> str:
    """A shipped checkpoint's own evaluation, recorded when it was trained, in words with the lengths it used, e.g.
    'ID 1-10: exact 1.000, per-token 1.000 (200 samples); OOD 11-50: exact 0.000, per-token 0.099 (200 samples)'."""
    evaluation = meta.get("eval") or {}
    lengths = {"id": (meta.get("task_params") or {}).get("length"), "ood": (meta.get("ood_params") or {}).get("length")}
    parts = []
    for split, r in evaluation.items():
        span = lengths.get(split)
        where = f"{split.upper()} {span[0]}-{span[1]}" if span else split.upper()
        parts.append(f"{where}: exact {r['exact']:.3f}, per-token {r['partial']:.3f} ({r['n']} samples)")
    return "; ".join(parts) or "no evaluation recorded"


def _short(value: Any) -> Any:
    """A symbol set (a string of more than 8 distinct characters) as its ends and size; anything else as it is."""
    if isinstance(value, str) and len(value) > 8 and len(set(value)) == len(value):
        return f"{value[:3]}..{value[-2:]} ({len(value)} symbols)"
    return value


def preset_table(names: Sequence[str] = tuple(tasks.NAMES)) -> pd.DataFrame:
    """The ID and OOD presets of each task, parameters as `key=value` (symbol sets shortened, words such as the
    parity format kept whole)."""
    def fmt(params: Mapping[str, Any]) -> str:
        return ", ".join(f"{k}={_short(v)}" for k, v in params.items())

    return pd.DataFrame([{"task": name, "ID preset": fmt(tasks.preset(name, "id").params()),
                          "OOD preset": fmt(tasks.preset(name, "ood").params())} for name in names]).set_index("task")
