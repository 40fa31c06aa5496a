"""The training step of each GPU-campaign run, timed on the CPU with a stand-in of its shape whose width costs
nothing (`--width 16`: the run's layers, heads, batch size and sequence length, d_model 16), so that what is timed is
the host's part of a step: Python, the operators dispatched one by one, the batches made. That part sets a step's
time on a GPU while the model is too small to keep it busy (a launch-bound device: one H200 trained the `abc_paper`
model at about 100 ms a step through the old loop). Run it under two versions of the code and the ratio of their
host times scales the GPU step measured with the one to an estimate for the other (results/gpu_campaign/README.md).

Each shape: `--warm` untimed steps, then `--steps` timed steps through `aspan.training.train`, the best of
`--repeat` rounds; prints one markdown row per shape (ms per step).

Usage: python benchmarks/bench_campaign_steps.py [--shapes addition successor parity_abs parity_formats qk_base
                                                  qk_finetune] [--width 16] [--steps 20] [--repeat 3] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from aspan import models, tasks  # noqa: E402
from aspan.tokenization import CharTokenizer  # noqa: E402
from aspan.training import TrainConfig, train  # noqa: E402


def paper_shape(task: str, condition: str, width: int):
    """The `abc_paper` model, data and hooks of one task (numbers of [0, 2^20], padded to 60 digits)."""
    from aspan.applications.studies import abc_paper as ap

    cfg = ap.PaperConfig(n_layers=6, n_heads=8, d_model=width, n_check=8, n_calib=8, n_test=8)
    data = ap.paper_data(task, cfg)
    positional = "learned" if condition == "vanilla" else "none"
    model = models.tiny(data.tokenizer, n_layers=6, n_heads=8, d_model=width, n_ctx=data.n_ctx, seed=0,
                        positional=positional)
    hooks = () if condition == "vanilla" else ap.hooks_for_bias(ap.abs_bias(data.check[0], data.tokenizer, 1), model)
    return model, data.tokenizer, data.train, 128, hooks


def parity_shape(width: int):
    """The parity formats run's model at 1-20 bits (4 layers, 4 heads, batch 64), the mnemonic format (the longest)."""
    task = tasks.get("parity", length=(1, 20), format="mnemonic", anchors=100)
    tok = CharTokenizer.for_alphabets(task.alphabet)
    longest = tasks.get("parity", length=(100, 100), format="mnemonic", anchors=100)
    model = models.tiny(tok, n_layers=4, n_heads=4, d_model=width, n_ctx=models.check_context(10**9, longest,
                                                                                                tok.offset), seed=0)
    return model, tok, task, 64, ()


def qk_shape(width: int, lengths: tuple[int, int], batch: int):
    """The QK spectrum run's model (4 layers, 1 head) on reversal at `lengths`."""
    task = tasks.preset("reversal", "id", length=lengths)
    tok = CharTokenizer.for_alphabets(task.alphabet)
    model = models.tiny(tok, n_layers=4, n_heads=1, d_model=width, n_ctx=128, seed=0)
    return model, tok, task, batch, ()


SHAPES = {
    "addition": lambda w: paper_shape("addition", "vanilla", w),
    "successor": lambda w: paper_shape("successor", "vanilla", w),
    "parity_abs": lambda w: paper_shape("parity", "abs", w),
    "parity_formats": parity_shape,
    "qk_base": lambda w: qk_shape(w, (1, 20), 64),
    "qk_finetune": lambda w: qk_shape(w, (21, 40), 32),
}


def step_ms(model, tok, data, batch: int, hooks, steps: int, seed: int) -> float:
    cfg = TrainConfig.scratch(steps=steps, batch_size=batch, seed=seed, log_every=steps)
    t0 = time.perf_counter()
    train(model, tok, data, cfg, fwd_hooks=hooks, progress=False)
    return 1000 * (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--width", type=int, default=16, help="d_model of the stand-in (the run's own: 128 or 1024)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, threads {a.threads}, d_model {a.width}, best of {a.repeat} x {a.steps} steps")
    print("| shape | batch | positions | ms per step |\n|---|---|---|---|")
    for name in a.shapes:
        model, tok, data, batch, hooks = SHAPES[name](a.width)
        step_ms(model, tok, data, batch, hooks, a.warm, 0)
        best = min(step_ms(model, tok, data, batch, hooks, a.steps, 1 + r) for r in range(a.repeat))
        print(f"| {name} | {batch} | {model.cfg.n_ctx} | {best:.1f} |", flush=True)


if __name__ == "__main__":
    main()
