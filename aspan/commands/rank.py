"""`aspan rank MODEL --task T`: rank heads by attention on reference tokens over ID samples (paper Appendix F), or
with `--by effect` causally (PASTA's model profiling, Zhang et al. 2023), through `aspan.applications.rank`."""
from __future__ import annotations

import argparse

from aspan.methods import RULES
from aspan.options import CONVENTIONS, MODEL_DTYPES, PROFILE_METRICS, RANK_BY

from .argtypes import device, finite_float, nonneg_int, output_dir, positive_float, positive_int
from .grammar import add_quiet

RUN_DIR = "out"  # held for the job by the dispatcher (one job per run directory)
HELP = "rank attention heads by their attention on reference tokens (default) or by the causal effect of an edit"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="aspan checkpoint dir, HF checkpoint dir, .gguf file, or 'smollm2'")
    p.add_argument("--task", required=True, help="task name (see `aspan data --list`)")
    p.add_argument("--any-task", action="store_true",
                   help="rank a model's heads on another task than the one it was trained on (refused otherwise)")
    p.add_argument("--split", default="id", choices=("id", "ood"), help="preset the samples come from (default: id)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="override a task parameter")
    p.add_argument("-n", "--samples", type=positive_int, default=64, help="number of samples (default 64)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="sample seed (default 0)")
    p.add_argument("--deltas", default="0", help="key offsets to scan, e.g. --deltas=-2..3 or 0,1,2 (default 0)")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--top", type=positive_int, help="select the top N heads")
    sel.add_argument("--fraction", type=positive_float, help="select the top fraction of heads (paper: 0.1)")
    p.add_argument("--by", default="score_sum", choices=RANK_BY,
                   help="ranking for selection: the paper's attention share (score_sum, score_row; default) or the "
                        "causal effect of an edit on each head alone (effect) or its first-order estimate (estimate)")
    p.add_argument("--convention", default="sample", choices=CONVENTIONS,
                   help="AttnScore convention of the attention share: sample (default, the paper's public code: mass "
                        "on the references over the mass on the sample's own columns) or raw (over the whole row)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="batch size of the forwards (default 32)")
    p.add_argument("--device", type=device, default=None, help="cpu, cuda, cuda:N (default: CUDA when present)")
    p.add_argument("--dtype", default="float32", choices=MODEL_DTYPES,
                   help="precision the model is loaded in (default float32; bfloat16 and float16 take half the memory)")
    p.add_argument("--out", type=output_dir, default="runs/rank", help="run directory (default runs/rank)")
    add_quiet(p)
    c = p.add_argument_group("causal ranking (--by effect / estimate)")
    c.add_argument("--method", default="reinforce", choices=RULES, help="the edit")
    c.add_argument("--delta", type=int, default=0, help="key offset of the edit's references (default 0)")
    c.add_argument("--strength", type=finite_float, default=None,
                   help="the edit's strength (default: " + ", ".join(
                       f"{name} {rule.strength:g}" for name, rule in RULES.items() if rule.takes_strength) + ")")
    c.add_argument("--renormalize", action="store_true", help="reinforce: renormalise edited rows")
    c.add_argument("--metric", default="logprob", choices=PROFILE_METRICS,
                   help="what the exact effect measures (default: mean target log-probability)")
    c.add_argument("--candidates", type=positive_int, default=None, metavar="M",
                   help="profile exactly only the top M heads by the attribution estimate (default: all)")
    c.add_argument("--greedy", type=positive_int, default=None, metavar="K",
                   help="also greedy forward selection of <= K heads")
    c.add_argument("--profile-split", default="ood", choices=("id", "ood"), help="preset of the profiling set")
    c.add_argument("--profile-param", action="append", default=[], metavar="KEY=VALUE",
                   help="override a parameter of the profiling preset (e.g. length=11-20)")


def parse_deltas(text: str) -> list[int]:
    """`-2..3` -> [-2, ..., 3]; `0,2` -> [0, 2]."""
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split(".."))
            if hi < lo:
                raise ValueError
            return list(range(lo, hi + 1))
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--deltas must look like -2..3 or 0,1,2, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from aspan.applications.rank import CAUSAL, RankConfig, rank_heads
    from aspan.tasks.params import parse_params

    flags = {k: getattr(args, k) for k in ("model", "task", "split", "samples", "seed", "top", "fraction", "by",
                                           "convention", "batch_size", "device", "dtype", "out", "any_task", "metric",
                                           "candidates", "greedy", "profile_split")}
    causal = {"edit": _edit(args), "profile_params": parse_params(args.task, [*args.param, *args.profile_param])} \
        if args.by in CAUSAL else {}
    rank_heads(RankConfig(**flags, params=parse_params(args.task, args.param), deltas=parse_deltas(args.deltas),
                          progress=not args.quiet, **causal))
    return 0


def _edit(args: argparse.Namespace):
    """The causal ranking's edit from --method, --strength, --delta and --renormalize (no --strength: the method's
    default, reinforce C 1, steer alpha 0.01; patch takes none); an error names the flags."""
    from aspan.experiments.profiling import Edit

    try:
        return Edit(args.method, delta=args.delta, strength=args.strength, renormalize=args.renormalize)
    except ValueError as e:
        strength = "" if args.strength is None else f" --strength {args.strength:g}"
        raise ValueError(f"--method {args.method}{strength} --delta {args.delta}: {e}") from None
