"""Where a GPU-campaign row's evaluation time goes, measured on the CPU at the `abc_paper` layout (addition padded to
60 digits: 185 positions): the host's part of it.

An `abc_paper` row evaluates its model on 4 x 10,000 test numbers (`exact_flags`) and records the per-row accuracy of
its 10,000 10-digit numbers (the position rows). On a GPU the forward of the 1.2M-parameter model over a batch of
500 is a few milliseconds, so what stays on the host (tokenising samples into batches, per-sample Python, per-token
tables) sets a row's evaluation time there. This script times those host steps by running the same calls with a
stand-in model too small to cost anything (1 layer, d_model 16), per 1,000 test numbers, the best of `--repeat`
interleaved rounds: `exact_flags` at evaluation batches of 500 and 2,000, and the position rows computed the way the
study did before (`evaluate`'s per-token records, grouped in pandas) and now (`abc_paper.row_counts`, counted from
the predictions). `--model paper` times the real 6-layer model instead (its CPU forward included).

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
from aspan.applications.studies.abc_paper import row_counts  # noqa: E402
from aspan.applications.studies.abc_paper_data import PaperConfig, paper_data  # noqa: E402
from aspan.evaluation import evaluate, exact_flags  # noqa: E402


def by_records(model, tok, samples, batch_size: int) -> dict:
    """The position rows as the study computed them before: per-token records, grouped in pandas."""
    rec = evaluate(model, tok, samples, batch_size=batch_size, attn=False).records
    rec = rec[rec.scored]
    return {int(row): float(g.correct.mean()) for row, g in rec.groupby("target_index")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="test numbers per length")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--task", default="addition")
    ap.add_argument("--model", choices=("standin", "paper"), default="standin")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = PaperConfig(n_layers=6, n_heads=8, d_model=128, n_test=a.n, n_check=1000, n_calib=1024)
    t = time.perf_counter()
    data = paper_data(a.task, cfg)
    draw_s = time.perf_counter() - t
    shape = dict(n_layers=6, n_heads=8, d_model=128) if a.model == "paper" else dict(n_layers=1, n_heads=1, d_model=16)
    model = models.tiny(data.tokenizer, n_ctx=data.n_ctx, seed=0, positional="learned", **shape)
    tests = [s for n in cfg.buckets for s in data.test[n]]
    tens = data.test[10]
    tok = data.tokenizer
    work = {
        "exact_flags, batch 500 (4 lengths)": (len(tests), lambda: exact_flags(model, tok, tests, (), 500)),
        "exact_flags, batch 2,000 (4 lengths)": (len(tests), lambda: exact_flags(model, tok, tests, (), 2000)),
        "position rows from per-token records, batch 500 (before)": (len(tens), lambda: by_records(model, tok, tens,
                                                                                                   500)),
        "position rows by row_counts, batch 500": (len(tens), lambda: row_counts(model, tok, tens, (), 500)),
        "position rows by row_counts, batch 2,000": (len(tens), lambda: row_counts(model, tok, tens, (), 2000)),
    }
    best = {k: float("inf") for k in work}
    for _ in range(a.repeat):
        for k, (_, fn) in work.items():
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    print(f"task {a.task}, {a.n} test numbers per length of {list(cfg.buckets)}, width {data.n_ctx}, model "
          f"{a.model} {shape}, torch {torch.__version__}, threads {a.threads}, best of {a.repeat}")
    print("| what | seconds per 1,000 numbers |\n|---|---|")
    print(f"| drawing every set of the task (paper_data), per 1,000 test numbers | "
          f"{1000 * draw_s / len(tests):.3f} |")
    for k, (n, _) in work.items():
        print(f"| {k} | {1000 * best[k] / n:.3f} |")


if __name__ == "__main__":
    main()
