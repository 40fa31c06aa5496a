"""Training settings are checked by name before any work: every number of `TrainConfig` must be finite and in its
range (lr = inf, weight_decay = nan and a beta of 1.5 train to NaN), and the settings loader refuses nan and inf for
every float setting of every command, so `aspan train`, the sweeps and the studies stop before a run directory exists.
"""
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan.config import load_config
from aspan.errors import UsageError
from aspan.training import TrainConfig
from tests.cli import aspan, one_line

# The valid range of every float setting, written out independently of the check: (low, high, low open, high open)
RANGES = {
    "lr": (0.0, math.inf, True, True),
    "weight_decay": (0.0, math.inf, False, True),
    "min_lr_ratio": (0.0, 1.0, False, False),
    "grad_clip": (0.0, math.inf, True, True),
    "betas[0]": (0.0, 1.0, False, True),
    "betas[1]": (0.0, 1.0, False, True),
    "target": (0.0, 1.0, False, False),
}

hostile = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, 1.0, 1.5, -1e-300, 1e300, 1 - 1e-16, 5e-324]),
    st.integers(-2, 2), st.just(10**400),
)


def valid(name: str, value) -> bool:
    low, high, open_low, open_high = RANGES[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        value = float(value)
    except OverflowError:
        return False
    if value != value or value in (math.inf, -math.inf):
        return False
    above = value > low if open_low else value >= low
    below = value < high if open_high else value <= high
    return above and below


def with_setting(name: str, value) -> TrainConfig:
    cfg = TrainConfig.scratch()
    if name.startswith("betas["):
        betas = list(cfg.betas)
        betas[int(name[6])] = value
        return replace(cfg, betas=tuple(betas))
    return replace(cfg, **{name: value})


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(RANGES)), value=hostile)
def test_every_float_setting_is_finite_and_in_its_range(name, value):
    cfg = with_setting(name, value)
    if valid(name, value):
        cfg.check()
        return
    with pytest.raises(ValueError) as e:
        cfg.check()
    message = str(e.value)
    assert "\n" not in message and name.split("[")[0] in message, message


@pytest.mark.parametrize("name,value", [
    ("lr", "1e-3"), ("lr", None), ("lr", True), ("weight_decay", [0.1]), ("betas", (0.9,)), ("betas", 0.9),
    ("betas", (0.9, 0.98, 0.99)), ("steps", 1.5), ("steps", True), ("batch_size", "64"), ("seed", -1),
    ("seed", 2**30), ("warmup", 0.5), ("curve_every", -1), ("amp", "no"), ("capture", "yes"), ("capture", 1),
    ("device", 0), ("grad_clip", "1"), ("target", True),
])
def test_a_setting_of_the_wrong_type_is_refused_by_name(name, value):
    with pytest.raises(ValueError, match=name):
        replace(TrainConfig.scratch(), **{name: value}).check()


def test_the_presets_and_legal_edges_pass():
    TrainConfig.scratch().check()
    TrainConfig.finetune().check()
    TrainConfig.scratch(betas=(0.0, 0.0), weight_decay=0, min_lr_ratio=1, grad_clip=None, lr=1e-12, steps=None,
                        warmup=0, seed=2**30 - 1, target=1.0, curve_every=0).check()


@pytest.mark.parametrize("table,key", [
    ("lr = inf", "lr"), ("lr = nan", "lr"), ("weight_decay = nan", "weight_decay"), ("weight_decay = -inf",
                                                                                      "weight_decay"),
    ("betas = [1.5, 0.98]", "betas"), ("betas = [0.9, nan]", "betas"), ("min_lr_ratio = inf", "min_lr_ratio"),
    ("grad_clip = nan", "grad_clip"), ("target = nan", "target"), ("lr = 1e400", "lr"),
])
def test_the_settings_loader_names_the_file_and_key(tmp_path, table, key):
    from aspan.applications.train import TrainRun

    path = tmp_path / "t.toml"
    path.write_text(f'task = "reversal"\n\n[train]\n{table}\n')
    with pytest.raises(UsageError) as e:
        load_config(TrainRun, toml_path=path, base=TrainRun(), name="train")
    assert str(e.value).startswith(str(path)) and key in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999"])
def test_a_float_flag_is_finite(value):
    from aspan.applications.train import TrainRun

    with pytest.raises(UsageError, match=r"^--lr: must be a finite number"):
        load_config(TrainRun, flags={"train.lr": float(value)}, base=TrainRun(), name="train")
    with pytest.raises(UsageError, match=r"^--replay: must be a finite number"):
        load_config(TrainRun, flags={"replay": float(value)}, base=TrainRun(), name="train")


@pytest.mark.parametrize("argv,toml,words", [
    (["train"], "[train]\nlr = inf\n", ["c.toml", "lr", "finite"]),
    (["train"], "[train]\nweight_decay = nan\n", ["c.toml", "weight_decay", "finite"]),
    (["train"], "[train]\nbetas = [1.5, 0.98]\n", ["betas[0]", "[0, 1)", "1.5"]),
    (["train", "--lr", "inf"], "", ["--lr", "finite"]),
    (["study", "parity", "--quick", "--lrs", "1e-3,inf"], "", ["--lrs", "finite"]),
    (["study", "qk", "--quick"], "weight_decay = nan\n", ["c.toml", "weight_decay", "finite"]),
])
def test_the_commands_stop_before_a_run_directory_exists(tmp_path, argv, toml, words):
    """Through the command line: one line naming the setting, exit 2, and no run directory."""
    args = [*argv, "--out", "run"]
    if toml:
        (tmp_path / "c.toml").write_text(('task = "reversal"\n' if argv == ["train"] else "") + toml)
        args += ["--config", "c.toml"]
    if argv[0] == "train":
        args += ["--task", "reversal", "--steps", "2"]
    r = aspan(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    one_line(r.stderr, *words)
    assert not (tmp_path / "run").exists()


def test_the_study_configs_refuse_a_non_finite_learning_rate():
    """Studies built in Python (not through the loader) check their grids too."""
    from aspan.applications.studies.abc import AbcStudyConfig
    from aspan.applications.studies.abc_paper_data import PaperConfig
    from aspan.applications.studies.parity_config import ParityStudyConfig
    from aspan.applications.studies.qk_config import QKStudyConfig

    makers = (lambda v: AbcStudyConfig.quick(lrs=(v,)), lambda v: PaperConfig(lr=v),
              lambda v: ParityStudyConfig.quick(lrs=(v,)), lambda v: QKStudyConfig.quick(lr_qk=(v,)),
              lambda v: QKStudyConfig.quick(weight_decay=v))
    for bad in (math.inf, math.nan, -1.0):
        for make in makers:
            with pytest.raises(ValueError, match="lr|weight_decay|learning"):
                make(bad).check()
