"""Teacher-forced accuracy of an `abc_paper`-shaped test set: `evaluate(..., attn=False).summary()`, which builds a
record per target token, against `aspan.accuracy.accuracy` (the same exact, partial and n without records, in
batches filled by tokens), interleaved in one process; and the host-side batching alone (`make_batch`, 250 samples a
batch as the GPU config evaluates, against `lean_batch` at the GPU's batches by tokens), the part of an evaluation a
GPU's forwards do not hide.

The model has configs/abc_paper_cpu.toml's shape (1 layer x 64, 4 heads, learned positions; untrained: the numbers
do not matter here), the samples are the study's test numbers of every length (successor, padded to the longest).

Usage: python benchmarks/bench_accuracy.py [--task successor] [--n 1000] [--rounds 3] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore", category=DeprecationWarning)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from aspan import models  # noqa: E402
from aspan.accuracy import EVAL_TOKENS, accuracy, rows_per_forward  # noqa: E402
from aspan.applications.studies.abc_paper import PaperConfig, paper_data  # noqa: E402
from aspan.batching import lean_batch, make_batch  # noqa: E402
from aspan.evaluation import evaluate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="successor", choices=["successor", "addition", "parity"])
    ap.add_argument("--n", type=int, default=1000, help="test numbers per length")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    data = paper_data(a.task, PaperConfig(n_test=a.n, seeds=(0,)))
    tok, samples = data.tokenizer, [s for v in data.test.values() for s in v]
    model = models.tiny(tok, n_layers=1, d_model=64, n_heads=4, positional="learned", n_ctx=data.n_ctx, seed=0)
    width = tok.offset + max(len(s.text) for s in samples) + 1
    gpu_rows = rows_per_forward(width, model.cfg.d_vocab_out, 250, EVAL_TOKENS["cuda"])
    sides = {
        "evaluate(attn=False).summary()": lambda: evaluate(model, tok, samples, batch_size=100, attn=False).summary(),
        "accuracy(...).summary()": lambda: accuracy(model, tok, samples, batch_size=100).summary(),
        "make_batch, 250 a batch": lambda: [make_batch(samples[i : i + 250], tok) for i in range(0, len(samples), 250)],
        f"lean_batch, {gpu_rows} a batch": lambda: [lean_batch(samples[i : i + gpu_rows], tok)
                                                   for i in range(0, len(samples), gpu_rows)],
    }
    names = list(sides)
    ref, got = sides[names[0]](), sides[names[1]]()  # the same numbers (and a warm-up)
    assert {k: ref[k] for k in got} == got, (ref, got)
    times: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(a.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - t0)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, cpu, {a.threads} thread(s), load average {load:.1f}; {len(samples):,} "
          f"{a.task} test numbers of {width} tokens; median of {a.rounds}")
    print("| what | s | x the first of its pair |\n|---|---|---|")
    med = {k: statistics.median(v) for k, v in times.items()}
    for i, name in enumerate(names):
        print(f"| {name} | {med[name]:.2f} | {med[name] / med[names[i - i % 2]]:.2f} |")


if __name__ == "__main__":
    main()
