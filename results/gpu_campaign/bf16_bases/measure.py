"""What saving a base in bfloat16 changes, measured on the CPU on committed bases and the sets their studies used.

A base that another run reads (ABC calibrates on the vanilla addition base; the QK study fine-tunes its base) has to
travel between GPU slices with the campaign's state; in bfloat16 it takes half the bytes. This script takes each
committed float32 base, rounds it to bfloat16 and loads it back as float32 (what `models.save` of a bfloat16 copy and
`models.load` give, exactly), and compares the two on the studies' own sets:

- the 2-layer addition bases of `results/abc_paper_addition` (seeds 0, 1, 2): exact accuracy on the run's test sets
  (1,000 numbers per length of 6, 10, 20, 60 digits), and ABC's calibration (Algorithm 1 on layer 0 over the run's
  512 calibration numbers): how many bias cells change, and the largest change among the kept lines;
- the paper-shaped QK base of `results/qk_study/paper_shape/base` (d_model 128): exact and per-token accuracy on the
  spectrum study's report sets (500 strings per bucket 1-20, 21-40, 41-60) and its selection set, then one
  fine-tuning run from each copy (all of W_Q/W_K, the spectrum's chosen rate 3e-4, 300 steps, seed 0) scored on the
  same sets.

    python results/gpu_campaign/bf16_bases/measure.py   # writes rows.json beside this file (about 20 min, 1 core)
"""
from __future__ import annotations

import copy
import json
import sys
import time
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from aspan import models  # noqa: E402
from aspan.applications.studies import abc_paper as ap  # noqa: E402
from aspan.applications.studies import qk  # noqa: E402
from aspan.applications.studies.qk_config import QKStudyConfig  # noqa: E402
from aspan.config import load_config  # noqa: E402
from aspan.evaluation import evaluate, exact_flags  # noqa: E402
from aspan.experiments.abc import NEG  # noqa: E402
from aspan.training import TrainConfig, train  # noqa: E402


def bf16_copy(model):
    """The model as a bfloat16 checkpoint loads back: every float parameter rounded to bfloat16, held in float32."""
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for p in copied.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return copied


def addition_rows() -> list[dict]:
    run = ROOT / "results" / "abc_paper_addition"
    cfg = ap.PaperConfig(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in json.loads((run / "run.json").read_text())["config"].items()})
    data = ap.paper_data("addition", cfg)
    rows = []
    for seed in cfg.seeds:
        base = models.load(run / "models" / f"addition-vanilla-seed{seed}", device="cpu").model
        half = bf16_copy(base)
        row = {"what": "abc_paper_addition base", "seed": seed, "layers": cfg.n_layers, "d_model": cfg.d_model}
        for name, m in (("fp32", base), ("bf16", half)):
            for n, samples in data.test.items():
                row[f"{name}_correct_{n}"] = int(exact_flags(m, data.tokenizer, samples, (), 500).sum())
                row[f"n_{n}"] = len(samples)
        cals = [ap.abc_calibration(m, data.tokenizer, data.calib, cfg.correct_only,
                                   ap.training_rows("addition", cfg.number_bits), ap.calibration_layer(cfg))
                for m in (base, half)]
        a, b = cals[0].bias, cals[1].bias
        kept_a, kept_b = a > NEG, b > NEG
        row.update(calibration_samples=[c.n_samples for c in cals], bias_cells=a.numel(),
                   kept_cells_differ=int((kept_a != kept_b).sum()),
                   max_abs_diff_kept=float((a - b)[kept_a & kept_b].abs().max()) if (kept_a & kept_b).any() else 0.0)
        rows.append(row)
        print(row, flush=True)
    return rows


def qk_scores(model, s) -> dict:
    out = {}
    for name, samples in {"select": s.select, **s.report}.items():
        summ = evaluate(model, s.tokenizer, samples, batch_size=250, attn=False).summary()
        tag = name.removeprefix("length ")
        out[f"exact_{tag}"], out[f"partial_{tag}"] = summ["exact"], summ["partial"]
    return out


def qk_rows() -> list[dict]:
    cfg = load_config(QKStudyConfig, toml_path=ROOT / "configs" / "qk_spectrum_cpu.toml")
    cfg.init = str(ROOT / cfg.init)
    s = qk.setup(cfg, "cpu")
    base = s.model
    rows = []
    for name, m in (("fp32", base), ("bf16", bf16_copy(base))):
        row = {"what": "qk paper_shape base", "dtype": name, "n_report": cfg.n_report, **qk_scores(m, s)}
        tuned = copy.deepcopy(m)
        t0 = time.perf_counter()
        config = TrainConfig.scratch(steps=300, batch_size=cfg.batch_size, lr=3e-4, warmup=cfg.warmup,
                                     weight_decay=cfg.weight_decay, seed=0, train_only="qk", log_every=300)
        train(tuned, s.tokenizer, s.finetune_task, config, progress=False)
        row["finetuned_qk_300"] = {**qk_scores(tuned, s), "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(row, flush=True)
    return rows


if __name__ == "__main__":
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = {"addition": addition_rows(), "qk": qk_rows(), "wall_s": None, "torch": torch.__version__}
    rows["wall_s"] = round(time.perf_counter() - t0, 1)
    (Path(__file__).parent / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
