"""The study settings the GPU plan trims with: the QK study's `only` and `lr_of`, the parity study's `format_lrs`,
and the paper-protocol ABC study's `bf16_bases` (a base saved in bfloat16, read back exactly, its ABC row keyed so)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from aspan import models
from aspan.applications.studies import study
from aspan.applications.studies.abc_paper import PaperConfig, run_paper_study
from aspan.applications.studies.parity_config import ParityStudyConfig
from aspan.applications.studies.qk_config import QKStudyConfig, conditions


def test_qk_only_keeps_the_named_conditions_and_lr_of_sets_their_rates():
    model = models.load("reversal", device="cpu").model
    cfg = QKStudyConfig.quick(pairs=(0, 1), columns=(0,), only=("qk", "qk-pair:1"), lr_of={"qk-pair:1": [0.005]})
    got = {c.name: c.lrs for c in conditions(cfg, model)}
    assert got == {"none": (), "qk": cfg.lr_qk, "qk-pair:1": (0.005,)}
    with pytest.raises(ValueError, match="no condition 'qk-pair:9'"):
        conditions(QKStudyConfig.quick(pairs=(0,), only=("qk-pair:9",)), model)
    with pytest.raises(ValueError, match="learning-rate grids"):
        QKStudyConfig.quick(lr_of={"qk": []}).check()


def test_parity_format_lrs_give_a_format_its_own_grid():
    cfg = ParityStudyConfig.quick(formats=("plain", "scratchpad"), format_lrs={"plain": [0.002]})
    keys = [u.key for u in study("parity").units(cfg)]
    assert keys[:3] == ["plain/lr 0.002", "scratchpad/lr 0.001", "scratchpad/lr 0.003"]
    assert cfg.grid("plain") == (0.002,) and cfg.grid("scratchpad") == cfg.lrs
    for bad, message in (({"mnemonic": [0.1]}, "not one of the formats"), ({"plain": [0]}, "format_lrs.plain")):
        with pytest.raises(ValueError, match=message):
            ParityStudyConfig.quick(formats=("plain",), format_lrs=bad).check()


@pytest.mark.hooked  # copies the base (a TransformerBridge cannot be deep-copied: refused by name before training)
def test_bf16_bases_saves_the_base_abc_reads_in_bfloat16_and_keys_its_abc_row(tmp_path):
    torch.set_num_threads(1)
    cfg = PaperConfig.quick(plan=("successor:vanilla", "successor:abc"), bf16_bases=("successor",))
    run_paper_study(cfg, tmp_path, progress=False)
    saved = load_file(str(tmp_path / "models" / "successor-vanilla-seed0" / "model.safetensors"))
    assert {t.dtype for t in saved.values() if t.is_floating_point()} == {torch.bfloat16}
    rows = {r["condition"]: r for r in map(json.loads, (tmp_path / "runs.jsonl").read_text().splitlines())}
    assert rows["abc"]["base_dtype"] == "bfloat16" and "base_dtype" not in rows["vanilla"]
    base = models.load(tmp_path / "models" / "successor-vanilla-seed0", device="cpu").model
    assert all(p.dtype == torch.float32 for p in base.parameters()), "read back in float32"
    with pytest.raises(ValueError, match="bf16_bases"):
        PaperConfig.quick(bf16_bases=("sorting",)).check()
