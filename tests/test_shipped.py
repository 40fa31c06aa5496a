"""What aspan ships besides code (`aspan.shipped`): configs found by name, the tutorials copied out, a model argument
checked before anything loads; the settings' one convention and its old spellings; an edit built light."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from aspan import shipped
from aspan.cli import main
from aspan.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent


def test_every_config_of_the_repository_is_shipped_by_name():
    names = shipped.config_names()
    assert names == sorted(p.relative_to(ROOT / "configs").with_suffix("").as_posix()
                           for p in (ROOT / "configs").rglob("*.toml"))
    assert {"reversal_reinforce", "gpu/campaign", "smollm2_smoke"} <= set(names)
    for name in names:
        assert Path(shipped.config_path(name)).read_bytes() == (ROOT / "configs" / f"{name}.toml").read_bytes()


@pytest.mark.parametrize("given", ["reversal_reinforce", "reversal_reinforce.toml", "configs/reversal_reinforce.toml"])
def test_a_name_finds_the_shipped_config_wherever_the_command_runs(given, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    assert Path(shipped.config_path(given)) == shipped.configs_dir() / "reversal_reinforce.toml"


def test_a_path_always_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reversal_reinforce").write_text("mine = 1\n")  # a file named like a shipped config
    assert shipped.config_path("reversal_reinforce") == "reversal_reinforce"
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "reversal_reinforce.toml").write_text("mine = 1\n")
    assert shipped.config_path("configs/reversal_reinforce.toml") == "configs/reversal_reinforce.toml"


def test_an_unknown_name_is_one_line_listing_the_shipped_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"^nope: no such file, and no shipped config of that name \(shipped: .*"
                                         r"reversal_reinforce.*\)$"):
        shipped.config_path("nope")
    assert main(["sweep", "--config", "nope.toml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.toml: no such file" in err and "gpu/campaign" in err


def test_the_sweep_prints_the_shipped_config_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--config", "reversal_reinforce", "--print-config"]) == 0
    assert 'model = "reversal"' in capsys.readouterr().out


def test_the_tutorials_are_copied_out_and_not_overwritten(tmp_path, capsys):
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert main(["tutorials", str(tmp_path / "t")]) == 0
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == notebooks
    assert capsys.readouterr().out.split() == [str(tmp_path / "t" / n) for n in notebooks]
    (tmp_path / "t" / notebooks[0]).write_text("my edits")
    assert main(["tutorials", str(tmp_path / "t")]) == 2  # refused, nothing touched
    assert "exists already" in capsys.readouterr().err and (tmp_path / "t" / notebooks[0]).read_text() == "my edits"
    assert main(["tutorials", str(tmp_path / "t"), "--force"]) == 0
    assert json.loads((tmp_path / "t" / notebooks[0]).read_text())["cells"]


def test_a_model_argument_is_checked_before_anything_loads(tmp_path):
    assert shipped.check_model_name("reversal") == "reversal" and shipped.check_model_name("SmolLM2") == "SmolLM2"
    assert shipped.check_model_name(str(tmp_path)) == str(tmp_path)
    with pytest.raises(UsageError, match=r"no model at nope \(expected a checkpoint directory, a \.gguf file, or one "
                                         r"of 'reversal', 'smollm2'\)"):
        shipped.check_model_name("nope")
    from aspan.models.checkpoint import SHIPPED
    from aspan.models.checkpoint import shipped as names  # the loader's names are these

    assert SHIPPED == shipped.CHECKPOINTS and names() == shipped.checkpoint_names() == ["reversal"]


# ----------------------------------------------------------------------------------------------- one convention
def test_every_ranking_defaults_to_the_sample_convention():
    from aspan.applications.pretrained import PretrainedConfig
    from aspan.applications.settings import DemoConfig, RankConfig
    from aspan.experiments.engine import Ranking
    from aspan.experiments.ranking import SCAN_DEFAULTS
    from aspan.experiments.sweep import SweepConfig

    assert DemoConfig().convention == PretrainedConfig().convention == Ranking().convention == "sample"
    assert RankConfig("m", "reversal").convention == SweepConfig("m", "reversal", (1.0,)).convention == "sample"
    assert SCAN_DEFAULTS["convention"] == "sample"  # `rank_heads` and `offset_table` in Python
    from aspan.anatomy.heads import ExplainOptions
    from aspan.applications.explain_config import ExplainRun

    assert ExplainOptions().convention == ExplainRun("m").convention == "sample"  # `explain` ranks when not given
    import contextlib
    import io

    for command in ("rank", "demo", "explain"):  # one flag name, the same default shown in --help
        with contextlib.redirect_stdout(io.StringIO()) as shown:
            assert main([command, "--help"]) == 0
        text = " ".join(shown.getvalue().split())
        entry = text.rsplit("--convention {sample,raw}", 1)[1][:400]  # the option's entry, after the usage line
        assert "(default: sample)" in entry


def test_the_old_spellings_of_convention_still_work_and_say_so(tmp_path, capsys, caplog):
    from aspan.applications.pretrained import PretrainedConfig
    from aspan.applications.settings import DemoConfig
    from aspan.config import load_config

    assert main(["demo", "--rank-convention", "raw", "--print-config", "--out", str(tmp_path / "d")]) == 0
    out, err = capsys.readouterr()
    assert 'convention = "raw"' in out and "rank_convention" not in out
    assert err.strip() == "aspan demo: --rank-convention is deprecated and goes in the next release; use --convention"
    (tmp_path / "demo.toml").write_text('rank_convention = "raw"\n')
    with caplog.at_level(logging.WARNING, logger="aspan"):
        assert load_config(DemoConfig, toml_path=tmp_path / "demo.toml").convention == "raw"
    assert "rank_convention is deprecated" in caplog.text
    (tmp_path / "p.toml").write_text('[analysis]\nrank_convention = "raw"\n[finetune]\nsteps = 1\n')
    assert PretrainedConfig.from_toml(tmp_path / "p.toml").convention == "raw"
    (tmp_path / "both.toml").write_text('convention = "raw"\nrank_convention = "raw"\n')
    with pytest.raises(UsageError, match="give it once"):
        load_config(DemoConfig, toml_path=tmp_path / "both.toml")


def test_a_run_directory_recorded_with_the_old_name_resumes(tmp_path):
    from aspan.applications.claims import claim_config
    from aspan.applications.settings import DemoConfig
    from aspan.io import recorded_settings

    out = tmp_path / "run"
    with claim_config(out, "demo", DemoConfig(convention="raw"), ("out",)):
        pass
    recorded = recorded_settings(out)
    recorded["rank_convention"] = recorded.pop("convention")  # as an earlier version wrote it
    (out / ".aspan-settings.json").write_text(json.dumps(recorded))
    with claim_config(out, "demo", DemoConfig(convention="raw"), ("out",)):
        pass  # the same settings under the former name: resumes
    with pytest.raises(ValueError, match="another configuration"), \
            claim_config(out, "demo", DemoConfig(convention="sample"), ("out",)):
        pass  # another convention is another run


def test_an_edit_with_default_settings_builds_without_torch():
    """`RankConfig`'s default edit is built while the command line checks its settings: no kernel check (which
    imports torch through `hooks`) runs for a method's own default strength, which each rule's check accepts."""
    import subprocess
    import sys

    code = ("import sys\nfrom aspan.applications.settings import Edit, RankConfig\nRankConfig('m', 'reversal')\n"
            "Edit('steer', delta=2)\nprint([m for m in ('torch', 'hooks') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.stdout.strip() == "[]", done.stderr[-2000:]
    from aspan.methods import RULES

    for rule in RULES.values():
        if rule.takes_strength:
            rule.check(rule.strength)  # the default passes the kernel's own check
    from aspan.experiments.edit import Edit

    with pytest.raises(ValueError, match="strength"):
        Edit("reinforce", strength=-1.0)  # a given strength still goes through it
