"""Where a GPU-campaign row's evaluation time goes, measured on the CPU at the `abc_paper` layout (addition padded to
60 digits: 185 positions): the host's part of it.

An `abc_paper` row evaluates its model on 4 x 10,000 test numbers (`exact_flags`) and records the per-row accuracy of
its 10,000 10-digit numbers (the position rows). On a GPU the forward of the 1.2M-parameter model over a batch of
500 is a few milliseconds, so what stays on the host (tokenising samples into batches, per-sample Python, per-token
tables) sets a row's evaluation time there. This script times those host steps by running the same calls with a
stand-in model too small to cost anything (1 layer, d_model 16), per 1,000 test numbers, the best of `--repeat`
interleaved rounds: `exact_flags` at evaluation batches of 500 and 2,000, and the position rows as the version of the
study it runs under computes them (before: `evaluate`'s per-token records, grouped in pandas; now:
`abc_paper.row_counts`, counted from the predictions). The forwards alone are timed over batches made beforehand and
subtracted: the rest is the host's part. `--model paper` uses the real 6-layer model instead.

Usage: python benchmarks/bench_campaign_eval.py [--n 1000] [--repeat 3] [--threads 1] [--task addition]
                                                [--model standin|paper]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore", message=r"HookedTransformer(\.from_pretrained)? is deprecated",
                        category=DeprecationWarning)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from aspan import models  # noqa: E402
from aspan.applications.studies.abc_paper_data import PaperConfig, paper_data  # noqa: E402
from aspan.batching import make_batch  # noqa: E402
from aspan.evaluation import evaluate, exact_flags  # noqa: E402


def by_records(model, tok, samples, batch_size: int) -> dict:
    """The position rows as the study computed them before `row_counts`: per-token records, grouped in pandas."""
    rec = evaluate(model, tok, samples, batch_size=batch_size, attn=False).records
    rec = rec[rec.scored]
    return {int(row): float(g.correct.mean()) for row, g in rec.groupby("target_index")}


def positions(model, tok, samples, batch_size: int) -> dict:
    """The position rows as this version of the study computes them."""
    try:
        from aspan.applications.studies.abc_paper import row_counts
    except ImportError:
        return by_records(model, tok, samples, batch_size)
    return row_counts(model, tok, samples, (), batch_size)


def forwards(model, tok, samples, batch_size: int) -> None:
    """The teacher-forced forwards alone, over batches made beforehand (the device's part of the evaluation)."""
    batches = [make_batch(samples[i:i + batch_size], tok, n_ctx=model.cfg.n_ctx)
               for i in range(0, len(samples), batch_size)]
    try:  # the forward this version's evaluation runs: the fused one where there is one
        from aspan.models.fused import logits
    except ImportError:
        def logits(model, tokens, hooks, mask):
            return model(tokens, attention_mask=mask)
    t0 = time.perf_counter()
    with torch.no_grad():
        for b in batches:
            logits(model, b.tokens, [], b.attention_mask).argmax(-1)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="test numbers per length")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--task", default="addition")
    ap.add_argument("--batches", type=int, nargs="+", default=[500, 2000])
    ap.add_argument("--model", choices=("standin", "paper"), default="standin")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = PaperConfig(n_layers=6, n_heads=8, d_model=128, n_test=a.n, n_check=8, n_calib=8)
    data = paper_data(a.task, cfg)
    shape = dict(n_layers=6, n_heads=8, d_model=128) if a.model == "paper" else dict(n_layers=1, n_heads=1, d_model=16)
    model = models.tiny(data.tokenizer, n_ctx=data.n_ctx, seed=0, positional="learned", **shape).eval()
    tests = [s for n in cfg.buckets for s in data.test[n]]
    tens, tok = data.test[10], data.tokenizer
    best: dict[str, float] = {}
    for _ in range(a.repeat):
        for bs in a.batches:
            for name, samples, fn in ((f"exact_flags, batch {bs}", tests, lambda bs=bs: exact_flags(
                    model, tok, tests, (), bs)), (f"position rows, batch {bs}", tens, lambda bs=bs: positions(
                    model, tok, tens, bs))):
                t0 = time.perf_counter()
                fn()
                total = time.perf_counter() - t0
                fwd = forwards(model, tok, samples, bs)
                per = 1000 / len(samples)
                row = (per * total, per * fwd, per * (total - fwd))
                best[name] = min(best.get(name, row), row, key=lambda r: r[2])
    print(f"task {a.task}, {a.n} test numbers per length of {list(cfg.buckets)}, width {data.n_ctx}, model "
          f"{a.model} {shape}, torch {torch.__version__}, threads {a.threads}, best of {a.repeat} (by host time)")
    print("| what | seconds per 1,000 numbers | of which the forwards | host (the rest) |\n|---|---|---|---|")
    for name, (total, fwd, host) in best.items():
        print(f"| {name} | {total:.3f} | {fwd:.3f} | {host:.3f} |")


if __name__ == "__main__":
    main()
