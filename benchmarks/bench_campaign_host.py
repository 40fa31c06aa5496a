"""What the GPU campaign's estimates scale by, counted on the CPU for each run's shape, under whichever version of
the code runs it (results/gpu_campaign/timings/measure.sh runs it under the code of the H200 slices and this one's):

- kernels per training step: torch.profiler's leaf operators (a foreach/fused one once, view and metadata operators
  none), for one more step of `aspan.training.train` (steps N + 1 against N, so set-up cancels); on a launch-bound
  GPU a step's time follows this count (`aspan.training.costs` counts the same way);
- host seconds per 1,000 test numbers of the `abc_paper` addition layout for the pieces of a row's evaluation that
  never reach the GPU: tokenising into evaluation batches (`make_batch`, and `lean_batch` where this version has
  it), and the per-token records the position rows were grouped from (`evaluation._batch_rows`, before
  `abc_paper.row_counts`), or the reference rows `row_counts` reads instead.

The model's width does not change the count, so the stand-ins are d_model 16: the shapes' layers, heads, batch and
sequence lengths. Prints one markdown table per part.

`--plain` (under the code of the H200 slices): the kernels and tokens per step of the plain PyTorch model their
training check timed at 175,339 tokens/s, which calibrates a kernel's time on that GPU.

Usage: python benchmarks/bench_campaign_host.py [--n 1000] [--plain]
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

NO_KERNEL = frozenset(f"aten::{n}" for n in (
    "empty", "empty_strided", "empty_like", "as_strided", "view", "_unsafe_view", "_reshape_alias", "reshape",
    "alias", "detach", "resolve_conj", "resolve_neg", "result_type", "t", "transpose", "permute", "expand",
    "expand_as", "view_as", "slice", "select", "unsqueeze", "squeeze", "split", "split_with_sizes", "unsafe_split",
    "unbind", "chunk", "narrow", "movedim", "flatten", "unflatten", "lift_fresh", "_local_scalar_dense", "item",
    "resize_", "scalar_tensor", "to", "_to_copy", "contiguous", "numpy_T", "mT", "is_nonzero", "new_empty",
    "new_empty_strided", "clone", "zeros", "ones", "full", "new_zeros", "zeros_like", "ones_like", "full_like",
    "_has_compatible_shallow_copy_type"))  # aspan.training.costs's list, copied: the old code has no such module


def _kernels(event) -> int:
    if event.name.startswith(("aten::_foreach_", "aten::_fused_")):
        return 1
    calls = [c for c in event.cpu_children if c.name.startswith("aten::")]
    own = event.name.startswith("aten::") and event.name not in NO_KERNEL and all(c.name in NO_KERNEL for c in calls)
    return sum(_kernels(c) for c in calls) + own


def kernels(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(_kernels(e) for e in prof.events() if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def paper(task: str, condition: str):
    from aspan.applications.studies import abc_paper as ap

    cfg = ap.PaperConfig(n_layers=6, n_heads=8, d_model=16, n_check=8, n_calib=8, n_test=8)
    data = ap.paper_data(task, cfg)
    model = models.tiny(data.tokenizer, n_layers=6, n_heads=8, d_model=16, n_ctx=data.n_ctx, seed=0,
                        positional="learned" if condition == "vanilla" else "none")
    hooks = () if condition == "vanilla" else ap.hooks_for_bias(ap.abs_bias(data.check[0], data.tokenizer, 1), model)
    return model, data.tokenizer, data.train, 128, hooks


def reversal(lengths, layers, heads, batch):
    task = tasks.preset("reversal", "id", length=lengths)
    tok = CharTokenizer.for_alphabets(task.alphabet)
    return models.tiny(tok, n_layers=layers, n_heads=heads, d_model=16, n_ctx=128, seed=0), tok, task, batch, ()


def parity_formats():
    task = tasks.get("parity", length=(1, 20), format="mnemonic", anchors=100)
    tok = CharTokenizer.for_alphabets(task.alphabet)
    longest = tasks.get("parity", length=(100, 100), format="mnemonic", anchors=100)
    n_ctx = models.check_context(10**9, longest, tok.offset)
    return models.tiny(tok, n_layers=4, n_heads=4, d_model=16, n_ctx=n_ctx, seed=0), tok, task, 64, ()


SHAPES = {
    "addition (abc_paper)": lambda: paper("addition", "vanilla"),
    "successor (abc_paper)": lambda: paper("successor", "vanilla"),
    "parity with ABS (abc_paper_abs)": lambda: paper("parity", "abs"),
    "parity formats": parity_formats,
    "qk base": lambda: reversal((1, 20), 4, 1, 64),
    "qk fine-tune": lambda: reversal((21, 40), 4, 1, 32),
}


def step_kernels(model, tok, data, batch: int, hooks) -> tuple[int, int]:
    """(operators of one training step on the host's critical path, of which those building its batch). This
    version's `aspan.training.costs.Stepper` where it has one (batches made inside the step, prefetch 0, so no other
    thread's operators are counted; they are `lean_batch`'s few), else one more step of `train` (steps 3 against 2),
    whose batch `train_batch` builds inside the step."""
    from aspan.training import loss

    cfg = TrainConfig.scratch(steps=50, batch_size=batch, seed=0, log_every=100)
    samples = data.generate(batch, seed=1) if hasattr(data, "generate") else data.batch(batch, seed=1)
    built = kernels(lambda: loss.train_batch(samples, tok, model.cfg.n_ctx))
    try:
        from aspan.training.costs import Stepper
    except ImportError:
        def run(steps: int) -> int:
            short = TrainConfig.scratch(steps=steps, batch_size=batch, seed=0, log_every=100)
            return kernels(lambda: train(model, tok, data, short, fwd_hooks=hooks, progress=False))
        return run(3) - run(2), built
    from aspan.training.batches import lean_batch

    stepper = Stepper(model, tok, data, cfg, prefetch=0) if not hooks else None
    if stepper is None:  # a hooked run (ABS): the Stepper takes no hooks; one more step of `train`, no prefetch
        from aspan.training import RunOptions

        def run(steps: int) -> int:
            short = TrainConfig.scratch(steps=steps, batch_size=batch, seed=0, log_every=100)
            opts = RunOptions(progress=False, prefetch=0, fwd_hooks=hooks)
            return kernels(lambda: train(model, tok, data, short, opts))
        return run(3) - run(2), kernels(lambda: lean_batch(samples, tok, model.cfg.n_ctx))
    try:
        stepper.step()
        stepper.step()
        return kernels(stepper.step), kernels(lambda: lean_batch(samples, tok, model.cfg.n_ctx))
    finally:
        stepper.close()


def host(n: int) -> list[tuple[str, float]]:
    from aspan import batching, evaluation
    from aspan.applications.studies.abc_paper_data import PaperConfig, paper_data

    data = paper_data("addition", PaperConfig(n_test=n, n_check=8, n_calib=8))
    samples, tok = data.test[10] + data.test[60], data.tokenizer
    parts = [samples[i:i + 500] for i in range(0, len(samples), 500)]
    per = 1000 / len(samples)

    def timed(fn) -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return per * best

    out = [("drawing a task's sets (paper_data, addition, per 1,000 test numbers)",
            timed(lambda: paper_data("addition", PaperConfig(n_test=n // 2, n_check=8, n_calib=8))) * len(samples)
            / (4 * (n // 2)))]
    out += [("make_batch (evaluation batches, before)",
            timed(lambda: [batching.make_batch(p, tok, n_ctx=data.n_ctx) for p in parts]))]
    if hasattr(batching, "lean_batch"):
        out.append(("lean_batch (evaluation batches, now)",
                    timed(lambda: [batching.lean_batch(p, tok, data.n_ctx) for p in parts])))
        out.append(("reference rows of row_counts (now)",
                    timed(lambda: [[set(s.ref_pairs(tok.offset)[0]) for s in p] for p in parts])))
    else:
        built = [batching.make_batch(p, tok, n_ctx=data.n_ctx) for p in parts]

        def records():
            for b, p in zip(built, parts):
                scored = (b.labels.clone(), {}, b.ref_mask.any(-1))
                evaluation._batch_rows(b, list(enumerate(p)), scored, tok, {})
        out.append(("per-token records of the position rows (before)", timed(records)))
    return out


def plain() -> tuple[int, float]:
    """(kernels per step, tokens per timed step) of the plain PyTorch model the H200 slices' training check timed
    against aspan's loop (`device_checks.plain_model`, the code of those slices only), on the check's own batches."""
    from aspan.applications.device_checks import TRAIN_STEPS, WARM_STEPS, plain_model
    from aspan.training import target_loss, train_batch

    task, tok = tasks.preset("reversal", "id"), CharTokenizer()
    c = models.tiny(tok, task="reversal").cfg
    net = plain_model(c.n_layers, c.d_model, c.n_heads, c.d_mlp, c.d_vocab, c.n_ctx)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=True)  # CUDA's default
    batches = [train_batch(task.generate(64, seed=900 + i), tok, c.n_ctx) for i in range(WARM_STEPS + TRAIN_STEPS)]

    def step(b) -> None:
        loss = target_loss(net(b.tokens).float(), b.labels) / (b.labels >= 0).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    step(batches[0])
    tokens = [int(b.attention_mask.sum()) for b in batches[WARM_STEPS:]]
    return kernels(lambda: step(batches[1])), sum(tokens) / len(tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="test numbers per length (10 and 60 digits)")
    ap.add_argument("--plain", action="store_true", help="only the slices' plain model (their code only)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.plain:
        k, tokens = plain()
        print(f"| plain model of the training check (batch 64) | kernels per step | tokens per step |\n|---|---|---|\n"
              f"| reversal 1-10 | {k} | {tokens:.2f} |")
        return
    print(f"torch {torch.__version__}, one thread\n")
    print("| shape | batch | positions | operators per step | of which its batch |\n|---|---|---|---|---|")
    for name, make in SHAPES.items():
        model, tok, data, batch, hooks = make()
        total, built = step_kernels(model, tok, data, batch, hooks)
        print(f"| {name} | {batch} | {model.cfg.n_ctx} | {total} | {built} |", flush=True)
    print("\n| host work of an evaluation | seconds per 1,000 numbers |\n|---|---|")
    for name, seconds in host(a.n):
        print(f"| {name} | {seconds:.3f} |", flush=True)


if __name__ == "__main__":
    main()
