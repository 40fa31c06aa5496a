"""Held-out diagnostics of the end-of-sequence option (not a selection): the demo's selected edit, its twin that
leaves the EOS row alone on every atom, and its version that extrapolates the EOS row on every atom, on the demo's
held-out OOD set and held-out ID set (the engine's `held_out` and `id_report` sets of data seed 0, each drawn apart
from the set the selection rule reads, as `aspan demo` draws them): exact and per-token accuracy, the share of
samples with every target character right, and EOS accuracy overall and per input length; and, unedited, the mean
attention of each selected layer-1 head at the EOS row on columns 0-3 (BOS and the first three characters); and the
paired held-out OOD comparison of the selected edit with its twin (samples made exact, samples lost, two-sided sign
test).

    python results/causal_demo/eos_twins.py RUN_DIR OUT.json     # RUN_DIR: an `aspan demo --samples 200` run
"""
from __future__ import annotations

import dataclasses
import json
import sys

import torch
from scipy.stats import binomtest

from aspan import evaluation, models, tasks
from aspan.batching import make_batch
from aspan.experiments.engine import ID_REPORT, Data
from aspan.experiments.search import decode_atoms, describe


def measure(model, tok, samples, atoms) -> dict:
    fwd = (lambda b: [h for e in atoms for h in e.batch_hooks(b, model)]) if atoms else ()  # as the engine does
    res = evaluation.evaluate(model, tok, samples, fwd_hooks=fwd, attn=False)
    rec, summary = res.records, res.summary()
    eos = rec[rec.eos]
    return {"per_sample_exact": [bool(x) for x in rec.groupby("sample_id").correct.all()],
            "exact": summary["exact"], "partial": summary["partial"], "eos_accuracy": float(eos.correct.mean()),
            "all_chars_right": float(rec[~rec.eos].groupby("sample_id").correct.all().mean()),
            "eos_accuracy_by_length": {int(k): float(v) for k, v in eos.groupby("length").correct.mean().items()}}


def eos_row_attention(model, tok, samples, heads) -> dict:
    """Unedited: mean attention of each head at the EOS row (the row predicting EOS) on columns 0-3."""
    batch = make_batch(samples, tok)
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    rows = batch.lengths - 2
    out = {}
    for layer, head in heads:
        at = cache["pattern", layer][torch.arange(len(samples)), head, rows, :4].mean(0)
        out[f"L{layer}H{head}"] = [round(float(x), 3) for x in at]
    return out


def main(run: str, out: str) -> None:
    torch.set_num_threads(1)
    model, tok, _ = models.load("reversal", device="cpu")
    summary = json.load(open(f"{run}/summary.json"))
    key = summary["details"]["selected"]["grid_key"]  # the selected point on the held-out set
    rows = [json.loads(line) for line in open(f"{run}/sweep.jsonl")]
    heads = summary["details"]["selected"]["heads"]
    chosen = [r for r in rows if r["method"] == "atoms" and r["heads"] == heads and r["key"] != key]
    selected = [decode_atoms(r["atoms"]) for r in chosen if describe(decode_atoms(r["atoms"])) ==
                summary["selected"]["method"]][0]
    every = lambda eos: [dataclasses.replace(e, eos=eos) for e in selected]  # noqa: E731
    variants = {"selected": selected, "EOS row left alone": every("none"),
                "EOS row extrapolated on every atom": every("extrapolate"), "baseline": []}
    data = Data("reversal", ood_params=tasks.preset("reversal", "ood", length=(11, 20)).params(), n=200)
    sets = {"held_out_ood": data.samples("held_out", 0), "held_out_id": data.samples(ID_REPORT, 0)}
    result = {"selected_edit": describe(selected)}
    for name, atoms in variants.items():
        result[name] = {s: measure(model, tok, samples, atoms) for s, samples in sets.items()}
    x, y = (result[k]["held_out_ood"]["per_sample_exact"] for k in ("selected", "EOS row left alone"))
    for name in variants:  # per-sample flags only feed the paired comparison
        for per_set in result[name].values():
            per_set.pop("per_sample_exact")
    gained, lost = sum(a and not b for a, b in zip(x, y)), sum(b and not a for a, b in zip(x, y))
    result["paired_selected_vs_left_alone"] = {"gained": gained, "lost": lost,
                                               "sign_test_p": binomtest(gained, gained + lost).pvalue}
    layer1 = [h for e in selected for h in e.heads if h[0] == 1]
    result["eos_row_attention_columns_0_3"] = {s: eos_row_attention(model, tok, samples, layer1)
                                               for s, samples in sets.items()}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:3])
