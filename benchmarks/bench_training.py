"""Training step of the default tiny model (2 layers x 128, 8 heads, rotary) on string reversal: aspan's loop
step against a plain PyTorch model doing the same training work, interleaved in one process.

Both sides train on the same batches, made the same way (lean batches made ahead in a thread; pinned, non-blocking
copies on CUDA), with rotary positions, gradient clipping, the warm-up + cosine schedule and AdamW with the same
weight-decay groups (fused on CUDA); neither reads anything back inside a step (`aspan.applications.step_timing`).
Per batch size it prints one markdown table row: kernels per step (torch.profiler's leaf operators, a foreach or
fused one counted once; AdamW's share in brackets: per tensor on the CPU, one fused kernel on CUDA), reads and
blocking copies per step (each a device sync on a GPU), the median time per step of alternating bursts, and
aspan's speed relative to plain (plain's step time / aspan's: 1.00 = as fast).

Usage: python benchmarks/bench_training.py [--batches 1 64 256] [--rounds 8] [--burst 5] [--threads 1]
                                           [--device cpu|cuda] [--amp] [--capture]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings

import torch

warnings.filterwarnings(
    "ignore", message=r"HookedTransformer(\.from_pretrained)? is deprecated", category=DeprecationWarning
)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from aspan.applications.step_timing import Comparison, compare  # noqa: E402

HEADER = ("| batch | step | kernels/step (AdamW's) | x plain | reads + blocking copies | ms/step | speed vs plain |\n"
          "|---|---|---|---|---|---|---|")


def rows(batch: int, got: dict) -> list[str]:
    """The table rows of one batch size: plain first, then aspan (and its captured step)."""
    sec, costs, out = got["seconds"], got["costs"], []
    plain_kernels = costs["plain"]["kernels"]["total"]
    for name in ("plain", "aspan", "captured"):
        if name not in sec:
            continue
        k, c = costs[name]["kernels"], costs[name]
        out.append(f"| {batch} | {name} | {k['total']} ({k['optimizer']}) | {k['total'] / plain_kernels:.2f} | "
                   f"{c['reads']} + {c['blocking_copies']} | {1e3 * sec[name]:.2f} | "
                   f"{sec['plain'] / sec[name]:.2f} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--rounds", type=int, default=8, help="alternating bursts per side")
    ap.add_argument("--burst", type=int, default=5, help="steps per burst")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--amp", action="store_true", help="bf16 autocast (CUDA) for both sides")
    ap.add_argument("--capture", action="store_true", help="also aspan's captured step (CUDA graph; CUDA only)")
    a = ap.parse_args()
    if a.capture and not a.device.startswith("cuda"):
        ap.error("--capture needs --device cuda (a CUDA graph)")
    torch.set_num_threads(a.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, {a.device}{' bf16 autocast' if a.amp else ' fp32'}, {a.threads} thread(s), "
          f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), load average {load:.1f}")
    print(HEADER)
    t0 = time.perf_counter()
    for batch in a.batches:
        got = compare(Comparison(a.device, batch, a.rounds, a.burst, capture=a.capture, amp=a.amp))
        print("\n".join(rows(batch, got)), flush=True)
    print(f"({got['parameters']:,} parameters; {a.rounds} bursts of {a.burst} steps per side; "
          f"{time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
