"""Where a GPU-campaign row's evaluation time goes, measured on the CPU at the `abc_paper` shape (6 layers, 8 heads,
d_model 128, the padded addition layout of 124 positions): drawing the test sets, building the evaluation batches
(`make_batch`), the teacher-forced forward, and `exact_flags` as a whole, at evaluation batches of 500 and 2,000.

On a GPU the forward of a 1.2M-parameter model is a few milliseconds, so what stays on the host (drawing and
tokenising samples, per-sample Python) sets a row's evaluation time there; this script says how large that host
part is, per 1,000 test numbers.

Usage: python benchmarks/bench_campaign_eval.py [--n 1000] [--threads 1] [--batches 500 2000] [--task addition]
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
from aspan.evaluation import exact_flags  # noqa: E402


def timed(fn, repeat: int = 1) -> float:
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="test numbers per length")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", type=int, nargs="+", default=[500, 2000])
    ap.add_argument("--task", default="addition")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = PaperConfig(n_layers=6, n_heads=8, d_model=128, n_test=a.n, n_check=1000, n_calib=1024)
    t = time.perf_counter()
    data = paper_data(a.task, cfg)
    draw_s = time.perf_counter() - t
    model = models.tiny(data.tokenizer, n_layers=6, n_heads=8, d_model=128, n_ctx=data.n_ctx, seed=0,
                        positional="learned")
    model.eval()
    samples = [s for n in cfg.buckets for s in data.test[n]]
    print(f"task {a.task}, {len(samples)} test samples ({a.n} per length), width {data.n_ctx}, "
          f"torch {torch.__version__}, threads {a.threads}")
    print(f"| what | seconds per 1,000 samples |\n|---|---|\n| draw the test sets (paper_data, all sets) | "
          f"{1000 * draw_s / len(samples):.3f} |")
    for bs in a.batches:
        batches = [samples[i:i + bs] for i in range(0, len(samples), bs)]
        build = timed(lambda batches=batches: [make_batch(b, data.tokenizer, n_ctx=model.cfg.n_ctx) for b in batches])
        built = [make_batch(b, data.tokenizer, n_ctx=model.cfg.n_ctx) for b in batches]
        with torch.no_grad():
            fwd = timed(lambda built=built: [model(b.tokens, attention_mask=b.attention_mask).argmax(-1)
                                              for b in built])
        whole = timed(lambda bs=bs: exact_flags(model, data.tokenizer, samples, (), bs))
        k = 1000 / len(samples)
        print(f"| batch {bs}: make_batch | {k * build:.3f} |\n| batch {bs}: forward (CPU) | {k * fwd:.3f} |\n"
              f"| batch {bs}: exact_flags, all of it | {k * whole:.3f} |")


if __name__ == "__main__":
    main()
