"""`aspan study parity`: does the format decide length generalization? (Ebrahimi, Panchal & Memisevic 2024, §3-4)

For each parity format (plain, scratchpad, interleaved, mnemonic) a tiny model is trained from scratch on inputs
of 1..L bits, then tested on held-out samples of exactly 1x, 2x, 5x and 10x L bits: exact accuracy (every
scored character and EOS right, teacher-forced, which for these prompt-fixed targets equals greedy generation with
the given characters supplied) and per-token accuracy. Every format gets the same step budget; its learning rate
is chosen from a small grid on a separate selection set (seed 0's run; largest exact accuracy at 2x L, ties
broken by exact at 1x L, then by per-token accuracy at 2x L); the other seeds are trained at the chosen rate and
every number reported is a mean ± sd over seeds on the held-out test samples. One head's attention (the head
with the highest AttnScore on the references in distribution) is drawn on an ID sample and at the failure.

    aspan study parity --out runs/parity            # ~25 min on one CPU thread
    aspan study parity --quick --out /tmp/pq        # < 1 min, for tests
    aspan study parity --config configs/parity_study_gpu.toml --out runs/parity_gpu

Outputs (RUN_DIR): rows.jsonl (one row per run x evaluation set, keyed by its settings; a rerun skips finished
runs), selection.csv, summary.csv, summary.json, figures/*.json, views/*.html, models/*, run.json, report.html.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...models.tiny import POSITIONAL, Positional
from ...tasks.parity import FORMATS, Parity


@dataclass
class StudyConfig:
    """Settings of one parity study; every field can come from a TOML file (`--config`) or a flag."""

    formats: tuple[str, ...] = FORMATS  # parity formats compared
    train_length: int = 8  # training inputs have 1..train_length bits
    multiples: tuple[int, ...] = (1, 2, 5, 10)  # test inputs have exactly multiple * train_length bits
    select_multiple: int = 2  # the selection set's length, as a multiple of train_length
    seeds: int = 3  # training seeds per format (>= 3 for a mean ± sd)
    lrs: tuple[float, ...] = (1e-3, 3e-3)  # learning-rate grid, chosen per format on the selection set
    steps: int = 800  # optimiser steps per run (the same for every format)
    batch_size: int = 32  # samples per step
    warmup: int = 50  # linear warm-up steps
    n_layers: int = 2  # model depth
    n_heads: int = 4  # attention heads per layer
    d_model: int = 64  # residual width
    positional: Positional = "rotary"  # positional encoding of the models (models.tiny's `positional`)
    anchors: int = 100  # mnemonic anchor symbols (>= the longest test input)
    n_select: int = 100  # selection samples per selection length
    n_test: int = 200  # held-out test samples per test length
    eval_batch_size: int = 50  # samples per evaluation forward
    device: str = "cpu"  # "cpu", "cuda" or "auto"
    threads: int = 1  # torch CPU threads
    quick: bool = field(default=False, compare=False)  # tiny settings for tests

    @classmethod
    def quick_config(cls, **kw: Any) -> "StudyConfig":
        """Tiny settings that finish in well under a minute (for the tests), same code path."""
        base = dict(train_length=3, seeds=2, lrs=(1e-3, 3e-3), steps=8, warmup=2, n_layers=1, n_heads=2, d_model=16,
                    anchors=30, n_select=8, n_test=8, eval_batch_size=16, quick=True)
        return cls(**{**base, **kw})

    def check(self) -> None:
        """ValueError on impossible settings, before any work."""
        if not self.formats or any(f not in FORMATS for f in self.formats):
            raise ValueError(f"formats must be a non-empty subset of {', '.join(FORMATS)}, got {self.formats}")
        if len(set(self.formats)) != len(self.formats):
            raise ValueError(f"formats repeat: {self.formats}")
        for name in ("train_length", "seeds", "steps", "batch_size", "n_layers", "n_heads", "d_model", "n_select",
                     "n_test", "eval_batch_size", "threads", "select_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if not self.multiples or any(m < 1 for m in self.multiples) or 1 not in self.multiples:
            raise ValueError(f"multiples must be positive and include 1 (the training length), got {self.multiples}")
        if not self.lrs or any(not lr > 0 for lr in self.lrs):
            raise ValueError(f"lrs must be positive, got {self.lrs}")
        if self.positional not in POSITIONAL:
            raise ValueError(f"positional must be one of {', '.join(POSITIONAL)}, got {self.positional!r}")
        if "mnemonic" in self.formats:
            Parity(length=self.longest, format="mnemonic", anchors=self.anchors)  # enough anchors for 10x

    @classmethod
    def toml_fields(cls, raw: dict[str, Any], path: Any = None) -> dict[str, Any]:
        """The settings of a parsed config file (`aspan.config.load_config`'s hook): its `[parity]` table, or the
        whole file."""
        return raw.get("parity", raw)

    @property
    def longest(self) -> int:
        return max(max(self.multiples), self.select_multiple) * self.train_length


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (sd is NaN for a single value)."""
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else math.nan


def choose_lr(rows: pd.DataFrame) -> float:
    """The selection rule: largest exact at the selection length, then exact at 1x, then per-token at the
    selection length."""
    sel = rows[rows.split == "select"].pivot_table(index="lr", columns="which", values=["exact", "partial"])
    order = sel.sort_values([("exact", "ood"), ("exact", "id"), ("partial", "ood")], ascending=False)
    return float(order.index[0])



# ----------------------------------------------------------------------------------------------- the runs
def make_task(config: StudyConfig, fmt: str, length: int | tuple[int, int]) -> Parity:
    """The parity task of `fmt` (mnemonic tasks share one anchor set, so train and test symbols agree)."""
    return Parity(length=length, format=fmt, **({"anchors": config.anchors} if fmt == "mnemonic" else {}))


def eval_sets(config: StudyConfig, fmt: str) -> dict[tuple[str, str], list]:
    """Selection samples (1x and the selection length) and held-out test samples (every multiple), disjoint seeds."""
    L = config.train_length
    sets = {("select", "id"): make_task(config, fmt, L).generate(config.n_select, seed=10_001),
            ("select", "ood"): make_task(config, fmt, config.select_multiple * L).generate(
                config.n_select, seed=10_000 + config.select_multiple)}
    for m in config.multiples:
        sets[("test", str(m))] = make_task(config, fmt, m * L).generate(config.n_test, seed=20_000 + m)
    return sets


def run_settings(config: StudyConfig, fmt: str, lr: float, seed: int) -> dict[str, Any]:
    """What a run's rows depend on (their key): changing any of it reruns, changing nothing resumes."""
    keep = ("train_length", "multiples", "select_multiple", "steps", "batch_size", "warmup", "n_layers", "n_heads",
            "d_model", "positional", "anchors", "n_select", "n_test")
    return {"format": fmt, "lr": lr, "seed": seed, **{k: getattr(config, k) for k in keep}}


def run_id(fmt: str, lr: float, seed: int) -> str:
    return f"{fmt}-lr{lr:g}-seed{seed}"


@dataclass(frozen=True)
class Run:
    """One training run of the study."""

    format: str  # parity format
    lr: float  # learning rate
    seed: int  # training seed (model initialisation and data order)

    @property
    def id(self) -> str:
        return run_id(self.format, self.lr, self.seed)


def train_and_evaluate(config: StudyConfig, tok, n_ctx: int, spec: Run, out: Path) -> list[dict]:
    """Train one model from scratch, save it under RUN_DIR/models, and return its evaluation rows."""
    fmt, lr, seed = spec.format, spec.lr, spec.seed
    from ... import models
    from ...evaluation import evaluate
    from ...io import settings_key
    from ...training import TrainConfig, train

    settings = run_settings(config, fmt, lr, seed)
    model = models.tiny(tok, n_layers=config.n_layers, n_heads=config.n_heads, d_model=config.d_model, n_ctx=n_ctx,
                        seed=seed, device=_device(config), positional=config.positional)
    cfg = TrainConfig.scratch(steps=config.steps, batch_size=config.batch_size, lr=lr, warmup=config.warmup,
                              seed=seed, device=_device(config), log_every=max(1, config.steps // 10))
    t0 = time.perf_counter()
    result = train(model, tok, make_task(config, fmt, (1, config.train_length)), cfg, progress=False)
    seconds = time.perf_counter() - t0
    loss = [r["loss"] for r in result.history if r.get("kind") == "train"][-1]
    models.save(model, out / "models" / spec.id, tok, task="parity", study="parity", **settings)
    rows = []
    for (split, which), samples in eval_sets(config, fmt).items():
        res = evaluate(model, tok, samples, attn=False, batch_size=config.eval_batch_size).summary()
        bits = sum(c in "01" for c in samples[0].prompt)
        row = {**settings, "run": settings_key(settings), "split": split, "which": which, "bits": bits,
               "multiple": bits // config.train_length, "exact": res["exact"], "partial": res["partial"],
               "n": res["n"], "train_seconds": seconds, "final_loss": loss}
        rows.append({"key": settings_key({**settings, "split": split, "which": which}), **row})
    return rows


def _device(config: StudyConfig) -> str:
    from ...training import resolve_device

    return str(resolve_device(config.device))


def _done(rows: list[dict], config: StudyConfig, fmt: str, lr: float, seed: int) -> list[dict]:
    from ...io import settings_key

    key = settings_key(run_settings(config, fmt, lr, seed))
    mine = [r for r in rows if r.get("run") == key]
    return mine if len(mine) == 2 + len(config.multiples) else []


def run_study(config: StudyConfig, out: Path, command: str = "", report: bool = True) -> pd.DataFrame:
    """Every run (grid on seed 0, then the other seeds at each format's chosen rate), tables, figures, report."""
    import torch
    from tqdm.auto import tqdm

    from ... import models
    from ...environment import run_environment
    from ...io import RowWriter, read_rows, write_json
    from ...tokenization import CharTokenizer

    config.check()
    torch.set_num_threads(config.threads)
    start = time.time()
    tok = CharTokenizer.for_alphabets(*(make_task(config, f, config.longest).alphabet for f in config.formats))
    n_ctx = max(models.check_context(10**9, make_task(config, f, config.longest), tok.offset) for f in config.formats)
    for f in config.formats:  # every test sample fits, checked before any training
        models.check_context(n_ctx, make_task(config, f, config.longest), tok.offset)
    out.mkdir(parents=True, exist_ok=True)
    writer = RowWriter(out / "rows.jsonl")
    plan = [(f, lr, 0) for f in config.formats for lr in config.lrs]
    bar = tqdm(total=len(plan) + len(config.formats) * (config.seeds - 1), desc="parity study runs")

    def do(fmt: str, lr: float, seed: int) -> None:
        bar.set_postfix_str(run_id(fmt, lr, seed))
        if not _done(read_rows(writer.path), config, fmt, lr, seed):
            for row in train_and_evaluate(config, tok, n_ctx, Run(fmt, lr, seed), out):
                writer.write(row)
        bar.update(1)

    for fmt, lr, seed in plan:
        do(fmt, lr, seed)
    chosen = {}
    for fmt in config.formats:
        grid = pd.DataFrame([r for lr in config.lrs for r in _done(read_rows(writer.path), config, fmt, lr, 0)])
        chosen[fmt] = choose_lr(grid)
        for seed in range(1, config.seeds):
            do(fmt, chosen[fmt], seed)
    bar.close()
    rows = pd.DataFrame([r for f in config.formats for lr in config.lrs for s in range(config.seeds)
                         for r in _done(read_rows(writer.path), config, f, lr, s)])
    tables = write_tables(rows, chosen, config, out)
    write_figures(tables["summary"], config, out)
    write_views(config, chosen, tok, out, n_ctx)
    wall = time.time() - start
    write_json(out / "run.json", {"command": command, "config": asdict(config), "chosen_lr": chosen,
                                  "wall_seconds": wall, "torch_threads": config.threads,
                                  **run_environment(device=_device(config))})
    write_json(out / "summary.json", {"study": "parity", "wall_seconds": round(wall, 1),
                                      "tables": {k: v.to_dict("records") for k, v in tables.items()}})
    if report:
        from ...report import write_report

        write_report(out, title="aspan study parity")
    return tables["summary"]


# ----------------------------------------------------------------------------------------------- outputs
def write_tables(
    rows: pd.DataFrame, chosen: dict[str, float], config: StudyConfig, out: Path
) -> dict[str, pd.DataFrame]:
    """selection.csv (the grid on seed 0), results.csv (every test row of the chosen rates), summary.csv (mean ± sd)."""
    from ...io import write_csv

    sel = rows[(rows.split == "select") & (rows.seed == 0)]
    selection = sel.pivot_table(index=["format", "lr"], columns="which", values=["exact", "partial"]).reset_index()
    selection.columns = ["format", "lr", "exact_1x", "exact_select", "partial_1x", "partial_select"]
    selection["chosen"] = [chosen[f] == lr for f, lr in zip(selection.format, selection.lr)]
    test = rows[(rows.split == "test") & (rows.lr == rows.format.map(chosen))]
    results = test[["format", "lr", "seed", "multiple", "bits", "exact", "partial", "n", "train_seconds", "final_loss"]]
    results = results.sort_values(["format", "multiple", "seed"]).reset_index(drop=True)
    summary = []
    for (fmt, m), g in results.groupby(["format", "multiple"], sort=False):
        (em, es), (pm, ps) = mean_sd(g.exact.tolist()), mean_sd(g.partial.tolist())
        summary.append({"format": fmt, "multiple": int(m), "bits": int(g.bits.iloc[0]), "lr": chosen[fmt],
                        "seeds": len(g), "exact_mean": em, "exact_sd": es, "partial_mean": pm, "partial_sd": ps,
                        "exact": f"{100 * em:.1f} ± {100 * es:.1f}", "per_token": f"{100 * pm:.1f} ± {100 * ps:.1f}"})
    order = {f: i for i, f in enumerate(config.formats)}
    summary = pd.DataFrame(summary).sort_values(["format", "multiple"], key=lambda c: c.map(order) if c.name == "format"
                                                else c).reset_index(drop=True)
    tables = {"summary": summary, "selection": selection, "results": results}
    for name, df in tables.items():
        write_csv(out / f"{name}.csv", df)
    return tables


def write_figures(summary: pd.DataFrame, config: StudyConfig, out: Path) -> None:
    """Exact and per-token accuracy against the input length, one line per format, ± sd over seeds."""
    import plotly.graph_objects as go

    from ...io import save_figure

    for col, name in (("exact", "exact accuracy"), ("partial", "per-token accuracy")):
        fig = go.Figure()
        for fmt, g in summary.groupby("format", sort=False):
            fig.add_scatter(x=g.bits, y=g[f"{col}_mean"], error_y=dict(type="data", array=g[f"{col}_sd"].fillna(0)),
                            mode="lines+markers", name=fmt)
        fig.add_vline(x=config.train_length + 0.5, line_dash="dot", annotation_text="training lengths | longer")
        fig.update_layout(title=f"Parity: {name} vs input length (trained on 1-{config.train_length} bits; "
                                f"mean ± sd over {config.seeds} seeds)", xaxis_title="input bits", yaxis_title=name,
                          yaxis_range=[-0.02, 1.02])
        save_figure(fig, out / "figures" / f"{col}_vs_length.json")


def _pattern(model, tok, sample, head: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """One head's [query, key] pattern on `sample` (BOS + text) and the sample's reference mask, as arrays."""
    import torch

    import hooks

    ids = torch.tensor([tok.prefix_ids() + tok.encode(sample.text)])
    a = hooks.capture(model, ids, [head])[head][0].float().cpu().numpy()
    return np.round(a, 3), sample.mask(tok.offset).numpy()


def first_failure(model, tok, samples, batch: int) -> tuple[Any, int] | None:
    """(sample, target index) of the first wrong scored character among `samples` (teacher-forced), or None."""
    from ...evaluation import evaluate

    rec = evaluate(model, tok, samples, attn=False, batch_size=batch).records
    wrong = rec[~rec.correct & ~rec.eos]
    if wrong.empty:
        return None
    first = wrong.iloc[0]
    return samples[int(first.sample_id)], int(first.target_index)


def write_views(config: StudyConfig, chosen: dict[str, float], tok, out: Path, n_ctx: int) -> None:
    """Per format: the head reading the references most in distribution, drawn on an ID sample and at the failure.

    The drawn model is seed 0's at the chosen rate; when its checkpoint is gone (results committed without
    `models/`), that one run is trained again (same seed, same data: the rows already written are kept)."""
    import hooks

    from ... import models
    from ...batching import make_batch
    from ...io import save_figure, write_csv
    from ...viz import pattern_across_lengths

    rows = []
    for fmt in config.formats:
        path = out / "models" / run_id(fmt, chosen[fmt], 0)
        if not path.exists():
            train_and_evaluate(config, tok, n_ctx, Run(fmt, chosen[fmt], 0), out)
        model = models.load(path, device=_device(config)).model
        sets = eval_sets(config, fmt)
        ids = sets[("test", "1")][: config.eval_batch_size]
        b = make_batch(ids, tok, n_ctx=model.cfg.n_ctx)
        scores = hooks.head_scores(model, b.tokens, b.ref_mask, reduce="row", attention_mask=b.attention_mask)
        head = tuple(int(i) for i in np.unravel_index(int(scores.argmax()), tuple(scores.shape)))
        fail, where = None, None
        for m in sorted(config.multiples):
            found = first_failure(model, tok, sets[("test", str(m))], config.eval_batch_size)
            if found is not None:
                (fail, j), where = found, m
                break
        panels = [(f"{config.train_length} bits (ID)", *_pattern(model, tok, ids[0], head))]
        if fail is not None:
            a, mask = _pattern(model, tok, fail, head)
            q = tok.offset + fail.prompt_len - 1
            panels.append((f"{where}x: first error at target {j}", a[q:], mask[q:]))
        fig = pattern_across_lengths(panels, title=f"{fmt}: head L{head[0]}H{head[1]} (highest ID AttnScore)"
                                     + ("" if fail is not None else ", no error at any test length"))
        save_figure(fig, out / "figures" / f"head_{fmt}.json")
        rows.append({"format": fmt, "layer": head[0], "head": head[1], "id_attnscore": float(scores.max()),
                     "failure_multiple": where, "failure_target_index": j if fail is not None else None,
                     "failure_text": fail.text if fail is not None else None})
    write_csv(out / "heads.csv", pd.DataFrame(rows))
