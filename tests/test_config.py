"""`aspan.config.load_config`, the one way settings are built: defaults, then a TOML file's keys, then the flags that
were given, then the dataclass's check; every mistake one line naming the file and key (or the flag)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aspan.applications.demo import DemoConfig
from aspan.applications.pretrained import PretrainedConfig
from aspan.config import as_tuples, load_config
from aspan.errors import UsageError
from aspan.experiments.sweep import SweepConfig

from .test_hardening import aspan, one_line

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Settings:
    steps: int = 10
    lr: float = 1e-3
    seeds: tuple[int, ...] = (0,)
    buckets: tuple[tuple[int, int], ...] = ((1, 10),)
    device: str | None = None
    extra: dict = field(default_factory=lambda: {"a": 1, "b": 2})

    @classmethod
    def quick(cls) -> "Settings":
        return cls(steps=2)

    def check(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


def test_a_flag_beats_the_file_which_beats_the_default(tmp_path):
    path = toml(tmp_path, "steps = 5\nseeds = [1, 2]\n")
    assert load_config(Settings).steps == 10
    assert load_config(Settings, toml_path=path).steps == 5
    cfg = load_config(Settings, toml_path=path, flags={"steps": 7, "lr": 0.5})
    assert (cfg.steps, cfg.lr, cfg.seeds) == (7, 0.5, (1, 2))  # seeds: the file's, as a tuple


def test_a_flag_not_given_leaves_the_file_alone(tmp_path):
    """A flag the user did not give arrives as None (no argparse default): the file's value stands."""
    path = toml(tmp_path, 'steps = 5\ndevice = "cpu"\n')
    cfg = load_config(Settings, toml_path=path, flags={"steps": None, "device": None})
    assert (cfg.steps, cfg.device) == (5, "cpu")


def test_a_preset_is_the_default_layer(tmp_path):
    assert load_config(Settings, base=Settings.quick()).steps == 2
    assert load_config(Settings, toml_path=toml(tmp_path, "steps = 4\n"), base=Settings.quick()).steps == 4
    assert load_config(Settings, flags={"lr": 0.1}, base=Settings.quick()) == Settings(steps=2, lr=0.1)


def test_nested_arrays_become_tuples_and_a_dict_flag_sets_one_key(tmp_path):
    cfg = load_config(Settings, toml_path=toml(tmp_path, "buckets = [[1, 5], [6, 9]]\n[extra]\na = 3\n"),
                      flags={"extra.b": 4})
    assert cfg.buckets == ((1, 5), (6, 9)) and cfg.extra == {"a": 3, "b": 4}
    assert load_config(Settings, flags={"extra.b": 5}).extra == {"a": 1, "b": 5}  # on top of the default dict


@pytest.mark.parametrize("text, words", [
    ("stepz = 3\n", ["unknown key 'stepz'", "known: buckets, device"]),
    ('steps = "3"\n', ["steps: must be an integer, got '3'"]),
    ("steps = 3.5\n", ["steps: must be an integer"]),
    ("lr = true\n", ["lr: must be a finite number, got True"]),
    ('seeds = [0, "1"]\n', ["seeds: must be a list of integers"]),
    ("buckets = [[1, 2, 3]]\n", ["buckets: must be a list of a list of 2"]),
    ("device = 3\n", ["device: must be a string or none"]),
    ("steps = 0\n", ["steps must be >= 1, got 0"]),  # the dataclass's own check
    ("steps = [\n", ["invalid TOML"]),
])
def test_bad_input_is_one_line_naming_the_file_and_key(tmp_path, text, words):
    path = toml(tmp_path, text)
    with pytest.raises(ValueError) as e:
        load_config(Settings, toml_path=path)
    message = str(e.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    for w in words:
        assert w in message, (w, message)


def test_a_bad_flag_is_named_as_the_flag(tmp_path):
    path = toml(tmp_path, "steps = 5\n")
    with pytest.raises(UsageError, match=r"^--steps: steps must be >= 1, got 0$"):
        load_config(Settings, toml_path=path, flags={"steps": 0})
    with pytest.raises(UsageError, match=r"^--lr: must be a finite number, got 'x'$"):
        load_config(Settings, flags={"lr": "x"})
    with pytest.raises(UsageError, match="no setting 'colour'"):
        load_config(Settings, flags={"colour": 1})


def test_a_required_key_the_file_lacks_is_named(tmp_path):
    path = toml(tmp_path, 'task = "reversal"\nstrengths = [1.0]\n[heads]\ntop = [1]\n')
    with pytest.raises(UsageError, match=f"^{path}: sweep config: missing required key 'model'"):
        load_config(SweepConfig, toml_path=path)


def test_sweep_config_flag_beats_its_file_and_a_bad_key_names_the_file(tmp_path):
    text = 'model = "reversal"\ntask = "reversal"\nstrengths = [1.0]\ndevice = "cpu"\n[heads]\ntop = [1]\n'
    path = toml(tmp_path, text)
    assert load_config(SweepConfig, toml_path=path).device == "cpu"
    assert load_config(SweepConfig, toml_path=path, flags={"device": "auto"}).device == "auto"
    assert load_config(SweepConfig, toml_path=path, flags={"device": None}).device == "cpu"
    path.write_text(text.replace('device = "cpu"', "mode = 3"))
    with pytest.raises(UsageError, match=f"^{path}: sweep config: mode: must be a non-empty string, got 3$"):
        load_config(SweepConfig, toml_path=path)


def test_pretrained_steps_flag_sets_one_finetune_key_over_the_file():
    path = ROOT / "configs" / "smollm2_smoke.toml"
    from_file = load_config(PretrainedConfig, toml_path=path)
    cfg = load_config(PretrainedConfig, toml_path=path, flags={"finetune.steps": 3, "out": None, "threads": 2})
    assert cfg.finetune == {**from_file.finetune, "steps": 3} and from_file.finetune["steps"] != 3
    assert (cfg.threads, cfg.out) == (2, from_file.out)


STUDIES = {"qk_study_": ["qk"], "qk_curves_": ["qk"], "qk_paper_shape_": ["qk"], "qk_spectrum_": ["qk"],
           "abc_study_": ["abc"], "abc_paper_": ["abc", "--protocol", "paper"], "parity_study_": ["parity"],
           "parity_curves_": ["parity"], "abc_arms_": ["abc"], "parity_mnemonic_": ["parity"]}


def study_config(argv: list[str]):
    """The settings `aspan study ARGV` would run with (its parser, then its `config_from_args`)."""
    from aspan.cli import build_parser

    args = build_parser(["study"]).parse_args(["study", *argv])
    return args._study_config(args)


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_loads_as_before(path):
    """Each file under configs/ builds, through the loader, the settings its own dataclass builds from it."""
    from aspan.io import read_toml

    raw = read_toml(path)
    study = [argv for prefix, argv in STUDIES.items() if path.name.startswith(prefix)]
    if study:
        cfg = study_config([*study[0], "--config", str(path), "--out", "x"])
        table = raw.get("parity", raw)
        assert {k: getattr(cfg, k) for k in table} == {k: as_tuples(v, object) for k, v in table.items()}
    elif {"strengths", "heads"} <= set(raw):
        cfg = load_config(SweepConfig, toml_path=path, check=lambda c: c.check(False))
        assert cfg == SweepConfig.from_dict(raw, check_model=False)
    elif path.name.startswith("smollm2_"):
        cfg = load_config(PretrainedConfig, toml_path=path)
        assert cfg.model == "smollm2" and cfg.finetune == raw["finetune"] and cfg.train_config().steps >= 1
    elif path.name.startswith("edit_"):  # an edit, as `aspan explain --edit` reads it
        from aspan.applications.explain import read_edit
        from aspan.experiments.edit import Edit

        assert read_edit(str(path)) == Edit(**{k: as_tuples(v, object) for k, v in raw.items()})
    else:
        raise AssertionError(f"{path.name}: which settings does it hold?")


def test_demo_flags_over_its_quick_preset():
    cfg = load_config(DemoConfig, flags={"samples": 8, "steps": None}, base=DemoConfig.quick_config())
    assert (cfg.samples, cfg.gen_samples, cfg.quick, cfg.steps) == (8, 8, True, None)


# ------------------------------------------------------------------------------------------- the real commands
def test_pretrained_command_steps_flag_beats_the_file(tmp_path):
    patch = ("import aspan.applications.pretrained as p\n"
             "p.run_pretrained = lambda cfg, command, **kw: print(cfg.finetune['steps'], cfg.threads, cfg.model)\n")
    config = ROOT / "configs" / "smollm2_smoke.toml"
    out = str(tmp_path / "run")
    r = aspan("pretrained", "--config", str(config), "--out", out, code=patch, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    file_steps = load_config(PretrainedConfig, toml_path=config).finetune["steps"]
    assert r.stdout.split() == [str(file_steps), "None", "smollm2"]
    r = aspan("pretrained", "--config", str(config), "--out", out + "2", "--steps", "3", "--threads", "1", code=patch,
              cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.split() == ["3", "1", "smollm2"], r.stderr


def test_pretrained_command_names_the_file_and_key_of_a_wrong_type(tmp_path):
    bad = toml(tmp_path, '[data]\neval_samples = "many"\n[finetune]\nsteps = 1\n')
    r = aspan("pretrained", "--config", str(bad), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "run").exists()
    one_line(r.stderr, str(bad), "eval_samples: must be an integer", "'many'")


# ------------------------------------------------------------------------------------------- the studies
# per study: its arguments, a file setting every option that has a flag to a value other than its default, and
# one flag with the value it must win with
STUDY_CASES = {
    "qk": (["qk"], "init = 'x'\nsteps = 7\nbatch_size = 3\nseeds = [4]\nreplays = [0.25]\ncolumns = [2]\n"
                   "pairs = [1]\nn_select = 9\nn_report = 8\n", ["--steps", "11"], ("steps", 11)),
    "abc": (["abc"], "tasks = ['parity']\nconditions = ['none']\nseeds = [5]\nlrs = [0.01]\nsteps = 9\n"
                     "retrain_steps = 4\nbatch_size = 5\nn_layers = 3\nn_heads = 3\nd_model = 24\nn_test = 7\n"
                     "device = 'meta'\n", ["--lrs", "0.5,0.25"], ("lrs", (0.5, 0.25))),
    "paper": (["abc", "--protocol", "paper"], "seeds = [7]\nlr = 0.01\nmax_steps = 9\nbatch_size = 5\n"
                                              "n_layers = 3\nn_heads = 3\nd_model = 24\nn_test = 7\n"
                                              "device = 'meta'\n", ["--steps", "13"], ("max_steps", 13)),
    "parity": (["parity"], "[parity]\nformats = ['plain']\ntrain_length = 4\nsteps = 9\nseeds = 4\n"
                           "lrs = [0.01]\npositional = 'none'\ndevice = 'auto'\nthreads = 3\n",
               ["--threads", "2"], ("threads", 2)),
}


@pytest.mark.parametrize("name", STUDY_CASES)
@pytest.mark.parametrize("quick", [False, True])
def test_study_flags_beat_the_file_and_no_argparse_default_overrides_it(tmp_path, name, quick):
    """Every setting a study's flag can set comes from the file when the flag is not given (an argparse default
    would override it), and the flag beats the file."""
    import tomllib

    argv, text, flag, (field_name, value) = STUDY_CASES[name]
    path = toml(tmp_path, text)
    base = [*argv, *(["--quick"] * quick), "--config", str(path), "--out", str(tmp_path / "run")]
    cfg = study_config(base)
    table = tomllib.loads(text)
    table = table.get("parity", table)
    assert {k: getattr(cfg, k) for k in table} == {k: as_tuples(v, object) for k, v in table.items()}
    assert getattr(study_config([*base, *flag]), field_name) == value != getattr(cfg, field_name)


@pytest.mark.parametrize("name", STUDY_CASES)
def test_a_bad_study_key_is_named_before_the_run_directory_is_touched(tmp_path, name):
    """The settings are built and checked before the run directory is claimed: a directory of another run (or one a
    live job holds) does not hide the mistake, and is left as it was."""
    argv = STUDY_CASES[name][0]
    path = toml(tmp_path, "[parity]\nstepz = 3\n" if name == "parity" else "stepz = 3\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".aspan-settings.json").write_text('{"study": "another"}\n')
    r = aspan("study", *argv, "--quick", "--config", str(path), "--out", str(run), cwd=tmp_path)
    assert r.returncode == 2
    one_line(r.stderr, str(path), "unknown key 'stepz'")
    assert [p.name for p in run.iterdir()] == [".aspan-settings.json"]


def test_verbose_is_not_part_of_a_study_configuration(tmp_path, monkeypatch, capsys):
    """`-v` only changes what is logged: a study directory claimed without it accepts the same study resumed with it
    (either spelling) and the other way round, and records the same settings; a changed setting is still refused.
    Claim only: the study itself is not run."""
    import json

    import aspan.commands.study as study_command
    from aspan.cli import main

    ran = []
    monkeypatch.setattr(study_command, "run_registered", lambda args, config: ran.append(args.out) or 0)
    out = str(tmp_path / "run")
    base = ["study", "parity", "--quick", "--out", out]
    assert main(base) == 0
    settings = tmp_path / "run" / ".aspan-settings.json"
    recorded = settings.read_text()
    assert "verbose" not in json.loads(recorded)
    for argv in ([*base, "-v"], ["-v", *base], [*base, "--verbose"], base):
        assert main(argv) == 0, argv
        assert settings.read_text() == recorded
    assert len(ran) == 5
    capsys.readouterr()
    assert main([*base, "--steps", "9", "-v"]) == 2 and len(ran) == 5
    one_line(capsys.readouterr().err, "another configuration", "steps")
    # a directory claimed by a version that still recorded the flag ("verbose": false) resumes, with -v or without
    settings.write_text(json.dumps({**json.loads(recorded), "verbose": False}, indent=2) + "\n")
    for argv in (base, [*base, "-v"]):
        assert main(argv) == 0, argv
    assert len(ran) == 7 and json.loads(settings.read_text())["verbose"] is False
