"""`aspan rank MODEL --task T`: rank heads by attention on reference tokens over ID samples (paper Appendix F), or
with `--by effect` causally (PASTA's model profiling, Zhang et al. 2023), through `aspan.applications.rank`."""
from __future__ import annotations

import argparse

from aspan.applications.settings import CAUSAL, RankConfig
from aspan.config import load_config, to_toml
from aspan.methods import RULES
from aspan.options import CONVENTIONS, MODEL_DTYPES, PROFILE_METRICS, RANK_BY
from aspan.shipped import check_model_name
from aspan.tasks.params import parse_params

from .abc import required
from .argtypes import device, finite_float, nonneg_int, output_dir, positive_float, positive_int
from .grammar import add_config, add_quiet, from_settings, given

HELP = "rank attention heads by their attention on reference tokens (default) or by the causal effect of an edit"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan rank reversal --task reversal -n 4 --top 3 --out runs/rank --quiet",
    "aspan rank reversal --task reversal --deltas=-2..3 --fraction 0.1 --out runs/rank",
    "aspan rank reversal --task reversal --by effect --method reinforce --delta 2 --top 4 --out runs/rank-effect",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options and arguments of `aspan rank` to its parser."""
    p.add_argument("model", metavar="MODEL", nargs="?",
                   help="aspan checkpoint dir, HF checkpoint dir, .gguf file, or 'smollm2' (required unless the "
                        "--config file names it)")
    p.add_argument("--task", help="task name, see `aspan data --list` (required unless the --config file names it)")
    p.add_argument("--any-task", action="store_true", default=None,
                   help="rank a model's heads on another task than the one it was trained on (refused otherwise)")
    p.add_argument("--split", choices=("id", "ood"), help="preset the samples come from")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",  # an empty list: none given
                   help="override a task parameter (repeatable)")
    p.add_argument("-n", "--samples", type=positive_int, help="number of samples")
    p.add_argument("--seed", type=nonneg_int, help="sample seed")
    p.add_argument("--deltas", help="key offsets to scan, e.g. --deltas=-2..3 or 0,1,2")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--top", type=positive_int, help="select the top N heads")
    sel.add_argument("--fraction", type=positive_float, help="select the top fraction of heads (paper: 0.1)")
    p.add_argument("--by", choices=RANK_BY,
                   help="ranking for selection: the paper's attention share (score_sum, score_row) or the "
                        "causal effect of an edit on each head alone (effect) or its first-order estimate (estimate)")
    p.add_argument("--convention", choices=CONVENTIONS,
                   help="AttnScore convention of the attention share: sample (the paper's public code: mass "
                        "on the references over the mass on the sample's own columns) or raw (over the whole row)")
    p.add_argument("--batch-size", type=positive_int, help="batch size of the forwards")
    p.add_argument("--device", type=device, help="cpu, cuda, cuda:N (when not given: CUDA when present)")
    p.add_argument("--dtype", choices=MODEL_DTYPES,
                   help="precision the model is loaded in (bfloat16 and float16 take half the memory)")
    p.add_argument("--out", type=output_dir, help="run directory")
    add_quiet(p)
    add_config(p, "RankConfig", "the causal ranking's edit as an [edit] table")
    c = p.add_argument_group("causal ranking (--by effect / estimate)")
    c.add_argument("--method", choices=RULES, help="the edit")
    c.add_argument("--delta", type=int, help="key offset of the edit's references")
    c.add_argument("--strength", type=finite_float,
                   help="the edit's strength (default: " + ", ".join(
                       f"{name} {rule.strength:g}" for name, rule in RULES.items() if rule.takes_strength) + ")")
    c.add_argument("--renormalize", action="store_true", default=None, help="reinforce: renormalise edited rows")
    c.add_argument("--metric", choices=PROFILE_METRICS,
                   help="what the exact effect measures (logprob: mean target log-probability)")
    c.add_argument("--candidates", type=positive_int, metavar="M",
                   help="profile exactly only the top M heads by the attribution estimate (when not given: all)")
    c.add_argument("--greedy", type=positive_int, metavar="K",
                   help="also greedy forward selection of <= K heads")
    c.add_argument("--profile-split", choices=("id", "ood"), help="preset of the profiling set")
    c.add_argument("--profile-param", action="append", default=[], metavar="KEY=VALUE",
                   help="override a parameter of the profiling preset, e.g. length=11-20 (repeatable)")
    from_settings(p, "aspan.applications.settings:RankConfig",
                  only=("split", "samples", "seed", "deltas", "top", "fraction", "by", "convention", "batch_size",
                        "device", "dtype", "out", "metric", "candidates", "greedy", "profile_split"))
    from_settings(p, "aspan.applications.settings:Edit", only=("method", "delta"))


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


FIELDS = ("model", "task", "split", "samples", "seed", "top", "fraction", "by", "convention", "batch_size", "device",
          "dtype", "out", "any_task", "metric", "candidates", "greedy", "profile_split")


def settings(args: argparse.Namespace):
    """`RankConfig` from its defaults, then --config, then the flags given (task parameters and the causal
    ranking's edit over the file's, key by key), then its check."""
    from dataclasses import replace

    required(args, "rank")
    flags = {**given(args, FIELDS), "deltas": args.deltas and parse_deltas(args.deltas),
             "progress": False if args.quiet else None}
    cfg = load_config(RankConfig, toml_path=args.config, flags=flags, name="rank")
    if args.param:
        cfg = replace(cfg, params={**cfg.params, **parse_params(cfg.task, args.param)})
    if cfg.by in CAUSAL:
        profile = parse_params(cfg.task, [*args.param, *args.profile_param])
        cfg = replace(cfg, edit=_edit(args, cfg.edit), profile_params={**cfg.profile_params, **profile})
    return cfg


def run(args: argparse.Namespace) -> int:
    """Run `aspan rank` with the parsed arguments; the exit code."""
    cfg = settings(args)  # every setting checked before the ranking's imports (torch, pandas)
    if args.print_config:
        print(to_toml(cfg), end="")
        return 0
    check_model_name(cfg.model)
    from aspan.applications.rank import format_summary, rank_heads

    print(format_summary(rank_heads(cfg)))  # rank_heads holds the run directory for this job
    return 0


def _edit(args: argparse.Namespace, edit):
    """The causal ranking's edit: `edit` (the default's or the file's) with --method, --strength, --delta and
    --renormalize as given (a new --method without --strength: that method's default strength, reinforce C 1, steer
    alpha 0.01; patch takes none); an error names the flags."""
    from dataclasses import replace

    kw = {k: v for k, v in dict(method=args.method, delta=args.delta, strength=args.strength,
                                renormalize=args.renormalize).items() if v is not None}
    if "method" in kw and "strength" not in kw:
        kw["strength"] = None  # the method's own default
    try:
        return replace(edit, **kw)
    except ValueError as e:
        words = " ".join(f"--{k} {v:g}" if isinstance(v, float) else f"--{k} {v}" for k, v in kw.items()
                         if v is not None)
        raise ValueError(f"{words or '--config'}: {e}") from None
