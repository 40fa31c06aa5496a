"""`aspan explain MODEL --task T --seed S`: why did the model get this sample wrong: one row per output token (the
answer, its margin, every followed head's attention on the references, its top position and that position's offset),
the likely cause in words, before and after an edit (`--edit FILE`); the page of the run directory shows the table,
the figure and the attention view (`aspan.applications.explain`)."""
from __future__ import annotations

import argparse

from aspan.applications.explain_config import ExplainRun
from aspan.config import load_config, to_toml
from aspan.errors import UsageError
from aspan.options import CONVENTIONS, MODEL_DTYPES
from aspan.shipped import check_model_name

from .argtypes import config_file, device, nonneg_int, output_dir, output_file, positive_int
from .grammar import add_config, from_settings, given

HELP = "why did this answer fail: one sample's anatomy per output token and head, the likely cause, and a page"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan explain reversal --task reversal --seed 2 --param length=11-20 --out runs/explain",
    "aspan explain reversal --task reversal --failing --edit edit_reversal_ref2 --out runs/explain",
    "aspan explain reversal --task reversal --seed 0 --heads 1.7,1.0 --delta 2 -o explain.html",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `ExplainRun`'s fields, by the same names; none has an argparse default (a flag not given is
    None), so the defaults live on `ExplainRun` alone and `--help` shows them from there."""
    p.add_argument("checkpoint", metavar="MODEL", nargs="?",
                   help="aspan checkpoint or training run directory, HF checkpoint dir, .gguf file, or 'smollm2' "
                        "(required unless the --config file names it)")
    p.add_argument("--task", help="task name (default: the checkpoint's training task)")
    p.add_argument("--any-task", action="store_true", default=None,
                   help="explain a model on another task than the one it was trained on (refused otherwise)")
    p.add_argument("--split", choices=("id", "ood"), help="preset the sample comes from")
    p.add_argument("--param", action="append", dest="params", metavar="KEY=VALUE",
                   help="override a task parameter (repeatable), e.g. length=11-20")
    p.add_argument("--seed", type=nonneg_int, help="the sample: the first of this seed's stream")
    p.add_argument("--failing", action="store_true", default=None,
                   help="instead, the first sample of the seed's stream the model gets wrong (teacher-forced)")
    p.add_argument("--heads", metavar="L.H,...",
                   help="heads to follow, e.g. 1.7,1.0 (when not given: the ranking's on ID samples of the task)")
    p.add_argument("--delta", type=int,
                   help="key offset the heads read at (when not given: the ranking's best, or 0 with --heads)")
    p.add_argument("--top", type=positive_int, help="how many heads the ranking selects")
    p.add_argument("--convention", choices=CONVENTIONS,
                   help="attention mass over the whole row (raw) or over the sample's own columns (sample)")
    p.add_argument("--edit", metavar="FILE", type=config_file,
                   help="a TOML file of an edit (method, strength, delta, heads, ...), or one aspan ships, by name "
                        "(edit_reversal_ref2): the rows after it, side by side")
    p.add_argument("--device", type=device, help="cpu, cuda, cuda:N, or auto (CUDA when present)")
    p.add_argument("--dtype", choices=MODEL_DTYPES,
                   help="precision the model is loaded in (bfloat16 and float16 take half the memory)")
    p.add_argument("--out", type=output_dir, metavar="DIR", help="run directory (anatomy.json, figures/, views/)")
    p.add_argument("-o", "--output", type=output_file, metavar="FILE", help="the page (when not given: "
                   "DIR/report.html)")
    add_config(p, "ExplainRun")
    from_settings(p, "aspan.applications.explain_config:ExplainRun")


FIELDS = ("checkpoint", "task", "any_task", "split", "seed", "failing", "heads", "delta", "top", "convention",
          "edit", "device", "dtype", "out", "output")


def run(args: argparse.Namespace) -> int:
    """Run `aspan explain` with the parsed arguments; the exit code (every setting, and the model's name, checked
    before the explanation's imports: torch, pandas)."""
    if args.checkpoint is None and args.config is None:
        raise UsageError("MODEL is required (or a --config file that names its checkpoint)")
    flags = {**given(args, FIELDS), "params": args.params and tuple(args.params)}
    cfg = load_config(ExplainRun, toml_path=args.config, flags=flags, name="explain")
    if args.print_config:
        print(to_toml(cfg), end="")
        return 0
    check_model_name(cfg.checkpoint)
    from aspan.applications.explain import run_explain

    run_explain(cfg, echo=print)
    return 0
