"""`aspan study qk`: the command line of `aspan.applications.studies.qk` (which attention parameters must change for a
model to work at longer lengths)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...config import load_config
from ..argtypes import output_dir
from ..grammar import add_quiet
from . import flag_list, preset

HELP = "fine-tune only some attention parameters (qk, RoPE pairs, single columns) on longer lengths; per-bucket table"
EXAMPLES = (  # the end of `--help`; the tests run the cheap ones and parse the rest
    "aspan study qk --quick --out runs/qk",
    "aspan study qk --config configs/qk_study_gpu.toml --out runs/qk --device cuda",
    "aspan study qk --quick --protocol curves --out runs/qk-curves",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options of `aspan study qk` to its parser."""
    p.add_argument("--out", type=output_dir,
                   help="run directory (resumable: rerun the same command to continue); required, except with "
                        "--list-units and --print-config")
    p.add_argument("--config", metavar="TOML",
                   help="study settings (fields of QKStudyConfig; see configs/qk_study_*.toml); flags below override")
    p.add_argument("--quick", action="store_true", help="a complete but tiny study (seconds; for tests)")
    p.add_argument("--init", help="checkpoint to fine-tune (default: the shipped reversal model)")
    p.add_argument("--steps", type=int, help="optimiser steps per run (equal for every condition)")
    p.add_argument("--batch-size", type=int, help="fine-tuning batch size")
    p.add_argument("--seeds", help="comma-separated data-order seeds (the first runs the learning-rate grid)")
    p.add_argument("--replays", help="comma-separated replay shares of the ID preset, e.g. 0,0.5")
    p.add_argument("--columns", help="comma-separated single qk columns to try")
    p.add_argument("--pairs", help="comma-separated RoPE pairs to try (default: every pair)")
    p.add_argument("--n-select", type=int, help="selection samples (fine-tuned lengths)")
    p.add_argument("--n-report", type=int, help="report samples per bucket")
    p.add_argument("--protocol", choices=("budget", "curves"),
                   help="budget (default): every run trains --steps steps; curves: until the plateau rule fires on "
                        "the fine-tuned lengths' learning curve, or --cap steps")
    p.add_argument("--cap", type=int, help="curves protocol: the most steps a run trains (default 3000)")
    p.add_argument("--device", help="cpu (default), cuda, cuda:N")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    add_quiet(p)


def config_from_args(args: argparse.Namespace):
    """QKStudyConfig: the defaults (or --quick's), then --config (TOML), then the flags given; checked."""
    from ...applications.studies.qk import QKStudyConfig

    flags = {name: getattr(args, name) for name in ("init", "steps", "batch_size", "n_select", "n_report",
                                                       "protocol", "cap", "device")}
    flags.update(seeds=flag_list(args, "seeds", int), columns=flag_list(args, "columns", int),
                 pairs=flag_list(args, "pairs", int), replays=flag_list(args, "replays", float))
    return load_config(QKStudyConfig, toml_path=args.config, flags=flags, base=preset(QKStudyConfig, args),
                       name="qk study")


def registered(args: argparse.Namespace) -> str:
    """The study of `aspan.applications.studies.REGISTRY` this subcommand runs."""
    return "qk"


def run_options(args: argparse.Namespace) -> dict:
    """What `run` takes besides the settings: the command line run.json records."""
    return {"command": "aspan " + " ".join(sys.argv[1:])}


def show(args: argparse.Namespace, cfg, res) -> int:
    """The table and the findings, on stdout."""
    from ...applications.studies.qk import headline_table

    print(headline_table(cfg, res.table))
    for replay, f in res.summary["findings"]["by_replay"].items():
        print(f"replay {replay}: best single pair/column {f['best_single']['condition']} is "
              f"{f['gap_exact_pp']:.1f} pp (exact) / {f['gap_partial_pp']:.1f} pp (per-token) below full fine-tuning; "
              f"full fine-tuning gains {f['full_gain_exact_pp']:.1f} pp exact over no training; "
              f"claim met: {f['claim_met']}")
    if "base" in res.summary:
        b = res.summary["base"]
        print(f"base ({b['base']['n_layers']} layers x {b['base']['n_heads']} heads, d_model {b['base']['d_model']}): "
              f"ID exact {b['id_exact']:.3g} at step {b['stop']['step']} ({b['stop']['reason']}); "
              f"{'fit' if b['fitted'] else 'did not fit'}")
    print(f"{len(res.rows)} runs; this invocation {res.wall_s:.0f} s; report: {Path(args.out) / 'report.html'}")
    return 0
