"""Which layer of the 2-layer addition bases reads the operands: for each seed and layer, Algorithm 1 on that layer
(256 calibration samples, the rows the training numbers reach), and how peaked its cross-block attention is.

Run from the repository root: `.venv/bin/python results/abc_paper_addition/layers.py RUN_DIR` (RUN_DIR: the study's
run directory, holding models/addition-vanilla-seed*)."""
import sys
from pathlib import Path

import torch

from aspan import models
from aspan.applications.studies.abc_paper import PaperConfig, abc_calibration, paper_data, training_rows
from aspan.experiments.abc import NEG
from aspan.io import read_toml

torch.set_num_threads(1)
run = Path(sys.argv[1] if len(sys.argv) > 1 else "results/abc_paper_addition")
raw = read_toml("configs/abc_paper_addition_cpu.toml")
cfg = PaperConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})
data = paper_data("addition", cfg)
rows = training_rows("addition", cfg.number_bits)
print("| seed | layer | heads with a kept cross line | mean over heads of the largest attention on one operand digit "
      "(rows 0-6) |")
print("|---|---|---|---|")
for seed in cfg.seeds:
    base = models.load(run / "models" / f"addition-vanilla-seed{seed}").model
    for layer in range(cfg.n_layers):
        cal = abc_calibration(base, data.tokenizer, data.calib[:256], True, rows, layer)
        cross = cal.bias[:, cal.rows[:, None], cal.prompt_cols[None, :]]
        kept = int((cross <= NEG).flatten(1).any(1).sum())  # a head with a kept line cuts every other cell
        attn = cal.attn[:, cal.rows[:rows, None], cal.prompt_cols[None, :]]  # [head, row, operand column]
        peak = float(attn.max(-1).values.mean())
        print(f"| {seed} | {layer} | {kept} of {cfg.n_heads} | {peak:.2f} |")
