"""The command-line grammar, checked on the argparse tree of every subcommand (`aspan.cli.build_parser`): every
option has a help text, every command that shows progress takes `--quiet`, every command that has settings takes
`--config`; old spellings still work with a one-line deprecation notice."""
import argparse
import shlex

import pytest

from aspan import cli
from aspan.commands import grammar

from .cli import aspan

# commands that show progress bars (a bar over samples, steps, runs or stages)
PROGRESS = {"data", "train", "eval", "rank", "sweep", "abc", "demo", "pretrained", "study qk", "study abc",
            "study parity"}
# commands that build a settings dataclass (their options are its fields)
SETTINGS = {"train", "eval", "rank", "sweep", "abc", "demo", "pretrained", "study qk", "study abc", "study parity"}
# not converted yet, and why: each entry leaves when its command follows the grammar (the test then demands it)
PENDING_QUIET: set[str] = set()  # every command that shows progress takes --quiet
PENDING_CONFIG: set[str] = set()  # every command with settings takes --config
# --config files of a shape of their own (sections, renamed keys), which to_toml cannot write: none (sweep and
# pretrained print theirs with their own `toml_text`)
NO_PRINT_CONFIG: set[str] = set()


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command's parser, by its words after `aspan` ("study qk", "gpu slice")."""
    out = {}

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if words:
            out[" ".join(words)] = parser
        for action in subs:
            for name, child in action.choices.items():
                walk(child, (*words, name))

    walk(cli.build_parser(), ())
    return out


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_the_walk_finds_every_command_and_the_nested_ones():
    names = set(commands())
    assert set(cli.COMMANDS) <= names
    assert {"study qk", "study abc", "study parity", "gpu slice", "gpu merge", "gpu status"} <= names
    assert PROGRESS <= names and SETTINGS <= names


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_option_and_positional_has_a_help_text(name):
    parser = commands()[name]
    missing = [a.option_strings or [a.dest] for a in parser._actions
               if not isinstance(a, argparse._SubParsersAction) and (not a.help or a.help == argparse.SUPPRESS)]
    assert missing == [], f"aspan {name}: no help text for {missing}"


def test_every_command_that_shows_progress_takes_quiet():
    found = {name for name, p in commands().items() if "--quiet" in options(p)}
    assert PROGRESS - found == PENDING_QUIET
    assert found <= PROGRESS  # a command with --quiet is listed above as one that shows progress
    for name in found:  # one spelling, one meaning
        action = next(a for a in commands()[name]._actions if "--quiet" in a.option_strings)
        assert action.dest == "quiet" and action.help == grammar.QUIET_HELP, name


def test_every_command_with_settings_takes_config():
    found = {name for name, p in commands().items() if "--config" in options(p)}
    assert SETTINGS - found == PENDING_CONFIG
    assert found <= SETTINGS
    printing = {name for name in found if "--print-config" in options(commands()[name])}
    assert found - printing == NO_PRINT_CONFIG  # the others give the file back


@pytest.mark.parametrize("name", ["rank", "sweep", "abc", "study qk", "study abc", "study parity"])
def test_no_progress_is_a_deprecated_alias_of_quiet(name):
    parser = commands()[name]
    required = {"rank": ["m", "--task", "reversal"], "sweep": ["c.toml"], "abc": ["m", "--task", "reversal"],
                "study qk": ["--out", "o"], "study parity": ["--out", "o"]}.get(name, [])
    assert parser.parse_args(required).quiet is False
    assert parser.parse_args([*required, "--quiet"]).quiet is True
    assert parser.parse_args([*required, "--no-progress"]).quiet is True


def test_the_deprecation_notice_is_one_line_on_stderr(tmp_path):
    quiet = aspan("sweep", "--config", str(tmp_path / "missing.toml"), "--quiet", cwd=tmp_path)
    old = aspan("sweep", "--config", str(tmp_path / "missing.toml"), "--no-progress", cwd=tmp_path)
    assert quiet.returncode == old.returncode == 2  # the file is missing: the same error either way
    notice, error = old.stderr.splitlines()
    assert notice == "aspan sweep: --no-progress is deprecated and goes in the next release; use --quiet"
    assert error == quiet.stderr.strip() and "missing.toml" in error
    assert "deprecated" not in quiet.stderr


def test_quiet_turns_the_bars_of_data_and_eval_off(tmp_path, monkeypatch):
    """tqdm hides its bar off a terminal by itself (disable=None), so the switch is read where the bar is made."""
    import aspan.applications.data as data
    import aspan.applications.eval as eval_app

    made = []
    monkeypatch.setattr(data, "tqdm", lambda *a, **kw: made.append(kw["disable"]) or a[0])
    task = data.task_preset("reversal", "id", [])
    for quiet in (False, True):
        args = cli.build_parser().parse_args(["data", "--task", "reversal", "-n", "3",
                                              "-o", str(tmp_path / f"{quiet}.jsonl"), *["--quiet"] * quiet])
        assert args._run(args) == 0
    assert made == [None, True]
    assert (tmp_path / "False.jsonl").read_text() == (tmp_path / "True.jsonl").read_text()
    data.write_samples(task, 2, output=str(tmp_path / "c.jsonl"), progress=False)
    assert made[-1] is True
    runs = []
    monkeypatch.setattr(eval_app, "run_eval", lambda run, echo=None: runs.append(run))
    for quiet in (False, True):
        args = cli.build_parser().parse_args(["eval", "ckpt", *["--quiet"] * quiet])
        assert args._run(args) == 0
    assert [r.progress for r in runs] == [True, False]


# ----------------------------------------------------------------------------------------------- defaults in --help
# commands whose flags fill a settings dataclass that --help reads the defaults from
CONVERTED = {"eval": {"EvalRun"}, "rank": {"RankConfig", "Edit"}, "abc": {"ABCRun"},
             "train": {"TrainConfig", "TrainRun"},
             "demo": {"DemoConfig", "SlurmResources"}, "sweep": {"SlurmResources"}, "pretrained": {"SlurmResources"}}


def marked(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if getattr(a, "setting", None)]


def help_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text `--help` prints for `action`, on one line."""
    formatter = parser._get_formatter()
    return " ".join(formatter._expand_help(action).split())


@pytest.mark.parametrize("name", sorted(CONVERTED))
def test_help_shows_each_default_from_the_settings_dataclass(name):
    import dataclasses

    parser = commands()[name]
    actions = marked(parser)
    assert {grammar.settings_class(a.setting[0]).__name__ for a in actions} == CONVERTED[name]
    shown = 0
    for action in actions:
        spec, field, _ = action.setting
        fields = {f.name: f for f in dataclasses.fields(grammar.settings_class(spec))}
        text = help_of(parser, action)
        f = fields.get(field)
        default = dataclasses.MISSING if f is None else (
            f.default if f.default_factory is dataclasses.MISSING else f.default_factory())
        if default is dataclasses.MISSING:
            assert "(default: " not in text, (name, action.dest, text)
            continue
        assert action.default in (None, default), (name, action.dest, action.default, default)  # no second copy
        value = grammar.show_value(default)
        if value is None:
            continue
        expected = f"default: {value}"
        for flag, preset in action.setting[2].items():  # a preset's own default, where it differs
            other = grammar.show_value(getattr(getattr(grammar.settings_class(spec), preset)(), field))
            expected += f"; {flag}: {other}" if other not in (None, value) else ""
        assert text.endswith(f"({expected})"), (name, action.dest, text)
        assert "default" not in action.help, (name, action.dest, action.help)  # not typed in by hand as well
        shown += 1
    assert shown >= 5


def test_a_flag_not_given_leaves_the_dataclass_default(monkeypatch):
    import aspan.applications.eval as eval_app

    runs = []
    monkeypatch.setattr(eval_app, "run_eval", lambda run, echo=None: runs.append(run))
    for argv in (["eval", "ckpt"], ["eval", "ckpt", "-n", "7", "--param", "length=3", "--no-attn", "--any-task"]):
        args = cli.build_parser().parse_args(argv)
        assert args._run(args) == 0
    assert runs[0] == eval_app.EvalRun("ckpt")
    assert runs[1] == eval_app.EvalRun("ckpt", samples=7, params=("length=3",), attn=False, any_task=True)


def test_rank_and_abc_given_no_flags_run_with_their_dataclass_defaults(monkeypatch, tmp_path):
    import aspan.applications.abc as abc_app
    import aspan.applications.rank as rank_app
    from aspan.applications.rank import Edit

    runs = []
    monkeypatch.setattr(rank_app, "rank_heads", runs.append)
    monkeypatch.setattr(abc_app, "abc_run", runs.append)
    monkeypatch.setattr(rank_app, "format_summary", lambda summary: "")
    monkeypatch.setattr(abc_app, "format_summary", lambda summary: "")
    for argv in (["rank", "m", "--task", "reversal"], ["abc", "m", "--task", "reversal"],
                 ["rank", "m", "--task", "reversal", "--by", "effect", "--deltas", "0..2", "--param", "length=3",
                  "--quiet"],
                 ["abc", "m", "--task", "reversal", "--lambda", "0.5", "--ood-param", "length=11-12", "--quiet"]):
        args = cli.build_parser().parse_args(argv)
        assert args._run(args) == 0
    assert runs[0] == rank_app.RankConfig("m", "reversal")
    assert runs[1] == abc_app.ABCRun("m", "reversal")
    assert runs[2] == rank_app.RankConfig("m", "reversal", by="effect", deltas=[0, 1, 2], params={"length": 3},
                                          progress=False, edit=Edit("reinforce"),
                                          profile_params={"length": 3})
    assert runs[3] == abc_app.ABCRun("m", "reversal", lam=0.5, ood_params=("length=11-12",), progress=False)


def test_presets_show_their_own_defaults_beside():
    p = argparse.ArgumentParser(formatter_class=grammar.HelpFormatter)
    p.add_argument("--lr", type=float, help="learning rate")
    p.add_argument("--epochs", type=int, help="passes")
    grammar.from_settings(p, "aspan.training:TrainConfig", presets={"--finetune": "finetune"})
    text = " ".join(p.format_help().split())
    assert "learning rate (default: 0.001; --finetune: 5e-06)" in text
    assert "passes (default: 1)" in text  # the same under both


def test_train_given_no_flags_runs_with_the_defaults_of_its_preset(monkeypatch, tmp_path):
    import aspan.applications.train as train_app
    from aspan.training import TrainConfig

    runs = []
    monkeypatch.setattr(train_app, "train_run", lambda run, out: runs.append(run))
    monkeypatch.setattr(train_app, "format_result", lambda result, out: "")
    out = str(tmp_path / "t")
    for argv in (["train", "--out", out], ["train", "--out", out, "--init", "c", "--finetune"],
                 ["train", "--out", out, "--init", "c", "--finetune", "--lr", "1e-4", "--n-layers", "3", "--quiet"]):
        args = cli.build_parser().parse_args(argv)
        assert args._run(args) == 0
    assert runs[0] == train_app.TrainRun()
    assert runs[1] == train_app.TrainRun(train=TrainConfig.finetune(), init="c", finetune=True)
    assert runs[2] == train_app.TrainRun(train=TrainConfig.finetune(lr=1e-4), init="c", finetune=True, n_layers=3,
                                         progress=False)


# ----------------------------------------------------------------------------------------------- examples in --help
# the examples that run here, in this order (later ones read what earlier ones wrote); the rest are parsed
RUN = ["aspan data --list", "aspan data --task reversal -n 2",
       "aspan data --task addition --split ood -n 100 -o addition_ood.jsonl --param digits=5-8",
       "aspan show --task reversal -n 2", "aspan show --task flipflop --param instructions=6 --seed 3",
       "aspan doctor", "ASPAN_BACKEND=bridge aspan doctor",
       "aspan gpu status --plan configs/gpu/campaign.toml --campaign results/gpu_campaign/state",
       "aspan eval reversal -n 16 --no-attn --quiet",
       "aspan rank reversal --task reversal -n 4 --top 3 --out runs/rank --quiet",
       "aspan report runs/rank -o rank.html"]
NEEDS_ROOT = {"aspan gpu"}  # examples that name the repository's files: run from its root (they only read)


def examples(parser: argparse.ArgumentParser) -> list[str]:
    text = parser.epilog or ""
    assert text.startswith("examples:\n"), text
    return [line.strip() for line in text.splitlines()[1:] if line.strip()]


def every_example() -> list[str]:
    out = []
    for parser in commands().values():
        out += [e for e in examples(parser) if e not in out] if parser.epilog else []
    return out


def argv_of(example: str) -> tuple[dict[str, str], list[str]]:
    """(environment variables set before it, the arguments after `aspan`)."""
    words = shlex.split(example)
    i = words.index("aspan")
    assert all("=" in w for w in words[:i]), example
    return dict(w.split("=", 1) for w in words[:i]), words[i + 1:]


def test_every_command_ends_its_help_with_examples_naming_it():
    parsers = commands()
    for name, parser in parsers.items():
        if " " in name and name.split()[0] == "gpu":  # `aspan gpu`'s examples show each action
            assert any(e.startswith(f"aspan {name} ") for e in examples(parsers["gpu"])), name
            continue
        mine = examples(parser)
        assert 2 <= len(mine) <= 3, (name, mine)
        assert all(e.split("aspan ", 1)[1].startswith(name) for e in mine), (name, mine)
        help_text = parser.format_help()
        assert help_text.rstrip().endswith(mine[-1]), name  # the help ends with them, as written


def test_every_example_parses():
    for example in every_example():
        _, argv = argv_of(example)
        try:
            cli.build_parser(argv).parse_args(argv)
        except SystemExit as e:
            raise AssertionError(f"{example!r} does not parse") from e


def test_the_cheap_examples_run(tmp_path):
    import os

    from .cli import ENV, ROOT

    shown = every_example()
    assert set(RUN) <= set(shown)  # each one is in some command's help
    for example in RUN:
        env, argv = argv_of(example)
        cwd = ROOT if any(example.startswith(p) for p in NEEDS_ROOT) else tmp_path
        r = aspan(*argv, cwd=cwd, env={**ENV, **env})
        assert r.returncode == 0, (example, r.stderr[-2000:])
        assert r.stdout or os.listdir(tmp_path), example
    assert len((tmp_path / "addition_ood.jsonl").read_text().splitlines()) == 100
    assert (tmp_path / "rank.html").stat().st_size > 1000


def test_quiet_reaches_the_demo_and_the_pretrained_run(monkeypatch, tmp_path):
    import aspan.applications.demo as demo_app
    import aspan.applications.pretrained as pretrained_app

    from .cli import ROOT

    calls = []
    monkeypatch.setattr(demo_app, "run_demo", lambda cfg, command, log, progress: calls.append(progress))
    monkeypatch.setattr(pretrained_app, "run_pretrained", lambda cfg, command, log, progress: calls.append(progress))
    config = str(ROOT / "configs" / "smollm2_smoke.toml")
    for argv in (["demo", "--quick", "--out", str(tmp_path / "d")], ["demo", "--quick", "--quiet"],
                 ["pretrained", "--config", config], ["pretrained", "--config", config, "--quiet"]):
        args = cli.build_parser().parse_args(argv)
        assert args._run(args) == 0
    assert calls == [True, False, True, False]


def test_demo_takes_config_under_its_flags(monkeypatch, tmp_path):
    import aspan.applications.demo as demo_app

    cfgs = []
    monkeypatch.setattr(demo_app, "run_demo", lambda cfg, command, log, progress: cfgs.append((cfg, command)))
    toml = tmp_path / "demo.toml"
    toml.write_text('samples = 7\ngen_samples = 3\ntops = [1]\nout = "runs/from-file"\n')
    for argv in (["demo"], ["demo", "--config", str(toml)], ["demo", "--config", str(toml), "--samples", "9"],
                 ["demo", "--quick", "--eos", "both"]):
        args = cli.build_parser().parse_args(argv)
        assert args._run(args) == 0
    assert cfgs[0][0] == demo_app.DemoConfig()
    assert cfgs[1][0] == demo_app.DemoConfig(samples=7, gen_samples=3, tops=(1,), out="runs/from-file")
    assert cfgs[2][0] == demo_app.DemoConfig(samples=9, gen_samples=3, tops=(1,), out="runs/from-file")
    assert cfgs[3][0] == demo_app.DemoConfig.quick_config()
    assert f"--config {toml}" in cfgs[1][1] and "--samples 9" in cfgs[2][1]
    toml.write_text("sampels = 7\n")
    args = cli.build_parser().parse_args(["demo", "--config", str(toml)])
    with pytest.raises(ValueError, match="sampels"):
        args._run(args)


def test_task_parameters_and_heads_are_spelled_alike_everywhere():
    """A task parameter is `--param KEY=VALUE` (repeatable; `--id-param`, `--ood-param`, `--profile-param` where a
    command has several presets), heads are `L.H,...`."""
    params = heads = 0
    for name, parser in commands().items():
        for action in parser._actions:
            flags = [s for s in action.option_strings if s.startswith("--")]
            if any(s == "--param" or s.endswith("-param") for s in flags):
                assert isinstance(action, argparse._AppendAction) and action.metavar == "KEY=VALUE", (name, flags)
                assert "repeatable" in action.help, (name, flags)
                params += 1
            if "--heads" in flags and name.split()[0] in ("eval", "abc"):
                assert action.metavar == "L.H,...", (name, flags)
                heads += 1
    assert params >= 8 and heads == 2


# ----------------------------------------------------------------------------------------------- --print-config
# (settings given by flags, the same command reading them back from the printed file: FILE)
PRINTABLE = [(["demo"], ["demo"]), (["demo", "--quick", "--samples", "30"], ["demo"]),
             (["train"], ["train"]),
             (["train", "--task", "reversal", "--param", "length=3-5", "--lr", "3e-3", "--stop-bucket", "11-20",
               "--n-layers", "3", "--quiet"], ["train"]),
             (["train", "--init", "c", "--finetune", "--lr", "1e-4", "--buckets", "1-5,6-9"], ["train"]),
             (["eval", "m"], ["eval"]),
             (["eval", "m", "-n", "7", "--param", "length=3", "--no-attn", "--heads", "1.3,0.2", "--quiet"], ["eval"]),
             (["rank", "m", "--task", "reversal"], ["rank"]),
             (["rank", "m", "--task", "reversal", "--by", "effect", "--method", "patch", "--delta", "2",
               "--deltas=-1..2", "--param", "length=3-6", "--top", "4"], ["rank"]),
             (["abc", "m", "--task", "reversal"], ["abc"]),
             (["abc", "m", "--task", "reversal", "--lambda", "0.5", "--ood-param", "length=11-12", "--abs", "anti:1:0"],
              ["abc"]),
             (["study", "qk", "--out", "o"], ["study", "qk", "--out", "o"]),
             (["study", "qk", "--quick", "--protocol", "curves", "--out", "o"], ["study", "qk", "--out", "o"]),
             (["study", "abc", "--quick", "--out", "o"], ["study", "abc", "--out", "o"]),
             (["study", "abc", "--protocol", "paper", "--quick", "--tasks", "parity", "--out", "o"],
              ["study", "abc", "--protocol", "paper", "--out", "o"]),
             (["study", "parity", "--quick", "--lrs", "1e-3,3e-3", "--out", "o"], ["study", "parity", "--out", "o"])]


@pytest.mark.parametrize("argv,back", PRINTABLE, ids=[" ".join(a) for a, _ in PRINTABLE])
def test_print_config_reads_back_through_config_unchanged(argv, back, tmp_path, capsys, monkeypatch):
    from aspan.config import load_config

    monkeypatch.chdir(tmp_path)
    assert cli.main([*argv, "--print-config"]) == 0
    printed = capsys.readouterr().out
    (tmp_path / "c.toml").write_text(printed)
    assert cli.main([*back, "--config", "c.toml", "--print-config"]) == 0
    assert capsys.readouterr().out == printed  # every field, as resolved, the same
    if argv[0] == "study":
        args = cli.build_parser(argv).parse_args(argv)
        built = args._study_config(args)
        assert load_config(type(built), toml_path=tmp_path / "c.toml") == built
    assert not (tmp_path / "o").exists() and " = " in printed  # printed, nothing run


# commands whose --config file has a shape of its own: (command, a file, flags over it)
OWN_SHAPE = [
    ("sweep", 'model = "reversal"\ntask = "reversal"\nstrengths = [0.5, 3]\nthresholds = ["none", 0.2]\n'
              'gates = ["none", "beyond"]\nmode = "generate"\nn_samples = 7\ntask_params = {length = [11, 13]}\n'
              '[heads]\ntop = [2]\nlist = [[0, 1]]\nrank_delta = 1\nrank_params = {length = [3, 5]}\n',
     ["--device", "cpu"]),
    ("pretrained", 'seed = 3\n[prompt]\nshots = 2\ninstruction = "Reverse:"\n[data]\nid_params = {length = [2, 4]}\n'
                   'eval_samples = 9\n[finetune]\nsteps = 7\nlr = 0.001\n[analysis]\ntop = [3, 5]\nid_budget = 0.02\n',
     ["--steps", "9", "--dtype", "bfloat16", "--shard", "1/2"]),
]


@pytest.mark.parametrize("name,text,flags", OWN_SHAPE, ids=[c for c, _, _ in OWN_SHAPE])
def test_sweep_and_pretrained_print_a_config_that_reads_back_to_the_same_settings(name, text, flags, tmp_path,
                                                                                 capsys, monkeypatch):
    from dataclasses import replace

    from aspan.applications.pretrained import PretrainedConfig
    from aspan.config import load_config
    from aspan.experiments.sweep import SweepConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.toml").write_text(text)
    assert cli.main([name, "--config", "a.toml", *flags, "--print-config"]) == 0
    printed = capsys.readouterr().out
    (tmp_path / "c.toml").write_text(printed)
    assert cli.main([name, "--config", "c.toml", "--print-config"]) == 0
    assert capsys.readouterr().out == printed
    if name == "sweep":
        built = load_config(SweepConfig, toml_path="a.toml", flags={"device": "cpu"})
        assert load_config(SweepConfig, toml_path="c.toml") == built and built.device == "cpu"
        assert built.rank_delta == 1 and built.gates == (None, "beyond") and built.explicit == ((0, 1),)
    else:
        built = load_config(PretrainedConfig, toml_path="a.toml",
                            flags={"finetune.steps": 9, "dtype": "bfloat16", "shard": (1, 2)})
        assert load_config(PretrainedConfig, toml_path="c.toml") == replace(built, shard=None)  # --shard: a flag only
        assert built.finetune == {"steps": 9, "lr": 0.001} and built.shots == (2,) and built.seed == 3
    assert not (tmp_path / "runs").exists()  # printed, nothing run
    assert ("[heads]" if name == "sweep" else "[analysis]") in printed


def test_to_toml_refuses_what_toml_cannot_say():
    from aspan.applications.demo import DemoConfig
    from aspan.config import to_toml

    assert "threads" not in to_toml(DemoConfig(steps=None, device=None)).replace("threads = 1", "")
    with pytest.raises(ValueError, match="threads is None"):
        to_toml(DemoConfig(threads=None))


def test_out_names_a_directory_and_o_a_file_everywhere(tmp_path):
    from aspan.commands import argtypes

    outs = files = 0
    for name, parser in commands().items():
        for action in parser._actions:
            if "--out" in action.option_strings and not isinstance(action, grammar._Deprecated):
                assert action.type is argtypes.output_dir or action.metavar == "DIR", name
                outs += 1
            if "-o" in action.option_strings:
                assert action.type in (argtypes.output_file, argtypes.output_file_or_stdout), name
                assert "--output" in action.option_strings, name
                files += 1
    assert outs >= 10 and files == 3  # data, eval, report
    parser = commands()["eval"]  # eval's run directory: --out, as everywhere (--run-dir its old spelling)
    assert parser.parse_args(["m", "--run-dir", "d"]).run_dir == parser.parse_args(["m", "--out", "d"]).run_dir == "d"
    parser = commands()["report"]
    assert parser.parse_args(["run", "--out", "x.html"]).out == parser.parse_args(["run", "-o", "x.html"]).out
    old = aspan("report", str(tmp_path / "missing"), "--out", str(tmp_path / "r.html"), cwd=tmp_path)
    new = aspan("report", str(tmp_path / "missing"), "--output", str(tmp_path / "r.html"), cwd=tmp_path)
    assert old.returncode == new.returncode == 2
    assert old.stderr.splitlines() == [
        "aspan report: --out is deprecated and goes in the next release; use -o/--output", new.stderr.strip()]


def test_the_model_is_the_positional_model_where_a_command_takes_one():
    for name in ("eval", "rank", "abc"):
        first = next(a for a in commands()[name]._actions if not a.option_strings and a.dest != "help")
        assert first.metavar == "MODEL" and "smollm2" in first.help, name


# the settings each command with --print-config builds from its flags (`settings(args)` of its module)
SETTINGS_OF = {"train": lambda args: args._run.__globals__["settings"](args)[0],
               "eval": lambda args: args._run.__globals__["settings"](args),
               "rank": lambda args: args._run.__globals__["settings"](args),
               "abc": lambda args: args._run.__globals__["settings"](args)}


@pytest.mark.parametrize("argv,back", [(a, b) for a, b in PRINTABLE if a[0] in SETTINGS_OF],
                         ids=[" ".join(a) for a, _ in PRINTABLE if a[0] in SETTINGS_OF])
def test_the_printed_settings_read_back_to_equal_settings(argv, back, tmp_path, capsys, monkeypatch):
    """Not only the same text: the same dataclass, nested settings (train's TrainConfig, rank's Edit) included."""
    monkeypatch.chdir(tmp_path)
    assert cli.main([*argv, "--print-config"]) == 0
    (tmp_path / "c.toml").write_text(capsys.readouterr().out)
    built = SETTINGS_OF[argv[0]](cli.build_parser(argv).parse_args(argv))
    again = [*back, "--config", "c.toml"]
    assert SETTINGS_OF[argv[0]](cli.build_parser(again).parse_args(again)) == built


def test_flags_override_the_file_key_by_key(tmp_path, monkeypatch):
    from aspan.applications.rank import Edit
    from aspan.training import TrainConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.toml").write_text('task = "reversal"\nn_layers = 3\n\n[train]\nlr = 0.01\nsteps = 30\n')
    args = cli.build_parser().parse_args(["train", "--config", "t.toml", "--steps", "40", "--n-heads", "2"])
    run, _ = args._run.__globals__["settings"](args)
    assert run.train == TrainConfig(lr=0.01, steps=40) and (run.task, run.n_layers, run.n_heads) == ("reversal", 3, 2)
    (tmp_path / "f.toml").write_text('finetune = true\ninit = "c"\n')  # the file picks the fine-tuning preset
    args = cli.build_parser().parse_args(["train", "--config", "f.toml", "--epochs", "2"])
    assert args._run.__globals__["settings"](args)[0].train == TrainConfig.finetune(epochs=2)
    (tmp_path / "r.toml").write_text('model = "m"\ntask = "reversal"\nby = "effect"\nparams = {length = [3, 5]}\n'
                                     '\n[edit]\nmethod = "steer"\ndelta = 1\n')
    args = cli.build_parser().parse_args(["rank", "--config", "r.toml", "--param", "charset=ab", "--delta", "2"])
    cfg = args._run.__globals__["settings"](args)
    assert cfg.params == {"length": [3, 5], "charset": "ab"} and cfg.edit == Edit("steer", delta=2)
    args = cli.build_parser().parse_args(["rank", "--config", "r.toml", "--method", "patch"])
    assert args._run.__globals__["settings"](args).edit == Edit("patch", delta=1)  # patch takes no strength


@pytest.mark.parametrize("argv,words", [
    (["train", "--config", "bad.toml"], ["bad.toml", "train.lr", "must be a finite number"]),
    (["eval", "--config", "e.toml"], ["e.toml", "sampels"]),
    (["rank", "--task", "reversal"], ["MODEL is required"]),
    (["abc", "m"], ["--task is required"]),
    (["train", "--print-config", "--lr", "-1"], ["--lr", "must be > 0"]),
    (["train"], ["--out DIR is required"]),
])
def test_a_bad_settings_file_or_flag_is_one_line(argv, words, tmp_path):
    (tmp_path / "bad.toml").write_text('[train]\nlr = "fast"\n')
    (tmp_path / "e.toml").write_text('checkpoint = "m"\nsampels = 3\n')
    r = aspan(*argv, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and all(w in r.stderr for w in words), r.stderr


def test_the_task_is_always_the_task_option():
    """`--task TASK` wherever a command takes a task; the positional TASK of `data` and `show` is only the old
    spelling (help says so)."""
    tasks = 0
    for name, parser in commands().items():
        for action in parser._actions:
            if action.dest == "task" or "--task" in action.option_strings:
                assert action.option_strings == ["--task"] and action.dest == "task", name
                tasks += 1
            if not action.option_strings and "TASK" in str(action.metavar):
                assert action.help.startswith("deprecated spelling of --task"), name
    assert tasks >= 7  # data, show, train, eval, rank, abc, demo


@pytest.mark.parametrize("old,new", [
    (["data", "reversal", "-n", "2"], ["data", "--task", "reversal", "-n", "2"]),
    (["show", "reversal", "-n", "1"], ["show", "--task", "reversal", "-n", "1"]),
    (["sweep", "missing.toml"], ["sweep", "--config", "missing.toml"]),
    (["pretrained", "missing.toml"], ["pretrained", "--config", "missing.toml"]),
])
def test_old_positional_spellings_still_work_with_one_line_notice(old, new, tmp_path):
    was, now = aspan(*old, cwd=tmp_path), aspan(*new, cwd=tmp_path)
    assert was.returncode == now.returncode and was.stdout == now.stdout
    notice, *rest = was.stderr.splitlines()
    assert notice.startswith(f"aspan {old[0]}: the positional ") and "is deprecated and goes in the next release" \
        in notice and rest == now.stderr.splitlines()
    assert "deprecated" not in now.stderr
    both = aspan(*old, new[1], new[2], cwd=tmp_path)
    assert both.returncode == 2 and "once" in both.stderr


def test_every_command_takes_verbose():
    for name, parser in commands().items():
        assert {"-v", "--verbose"} <= options(parser), name
    assert cli.build_parser().parse_args(["-v", "doctor"]).verbose is True
    assert cli.build_parser().parse_args(["doctor", "-v"]).verbose is True
    assert cli.build_parser().parse_args(["doctor"]).verbose is False
    assert cli.build_parser().parse_args(["study", "qk", "--out", "o", "-v"]).verbose is True


def test_the_command_line_sets_the_level_for_one_command_and_restores_the_host_logging(capsys):
    import logging

    logger, root = logging.getLogger("aspan"), logging.getLogger()
    before = (logger.level, list(logger.handlers), logger.propagate, root.level, list(root.handlers))
    seen = {}

    def probe(args):
        log = logging.getLogger("aspan.probe")
        log.debug("a debug line")
        log.info("an info line")
        log.warning("a warning line")
        seen[args.quiet, args.verbose] = True
        return 0

    for argv in (["data", "--list"], ["data", "--list", "--quiet"], ["data", "--list", "-v"]):
        args = cli.build_parser(argv).parse_args(argv)
        args._run = probe
        with cli.reporting(args):
            args._run(args)
        err = capsys.readouterr().err.splitlines()
        if "--quiet" in argv:
            assert err == ["warning: a warning line"]
        elif "-v" in argv:
            assert err == ["a debug line", "an info line", "warning: a warning line"]
        else:
            assert err == ["an info line", "warning: a warning line"]
    assert (logger.level, list(logger.handlers), logger.propagate, root.level, list(root.handlers)) == before
    assert len(seen) == 3
    outer = cli.build_parser().parse_args(["doctor"])
    with cli.reporting(outer), cli.reporting(cli.build_parser().parse_args(["doctor", "-v"])):  # a command in one
        logging.getLogger("aspan.probe").debug("once")
    assert capsys.readouterr().err.splitlines() == ["once"]
    assert (logger.level, list(logger.handlers), logger.propagate, root.level, list(root.handlers)) == before


LOGS = """
import logging
import aspan.applications.data as data
original = data.write_samples
def write_samples(*a, **kw):
    log = logging.getLogger("aspan.applications.data")
    log.debug("a debug line"); log.info("an info line"); log.warning("a warning line")
    return original(*a, **kw)
data.write_samples = write_samples
"""


@pytest.mark.parametrize("flags,err", [([], ["an info line", "warning: a warning line"]),
                                       (["--quiet"], ["warning: a warning line"]),
                                       (["-v"], ["a debug line", "an info line", "warning: a warning line"])])
def test_library_messages_reach_stderr_and_results_stdout(flags, err, tmp_path):
    """In a fresh process, as a user runs it: a library module's log records on stderr at the level the flags
    choose, the command's result alone on stdout."""
    r = aspan("data", "--task", "reversal", "-n", "2", *flags, cwd=tmp_path, code=LOGS)
    assert r.returncode == 0 and r.stderr.splitlines() == err
    assert len(r.stdout.splitlines()) == 2 and all(line.startswith("{") for line in r.stdout.splitlines())


def test_sweep_id_budget_defaults_to_the_one_constant_and_shows_it(monkeypatch):
    import aspan.commands.sweep as sweep_cmd
    from aspan.applications.sweep import SweepRun
    from aspan.options import ID_BUDGET

    parser = commands()["sweep"]
    action = next(a for a in parser._actions if a.dest == "id_budget")
    assert action.default is None and help_of(parser, action).endswith(f"(default: {ID_BUDGET * 100:g})")
    assert SweepRun().id_budget == ID_BUDGET  # a flag not given keeps the dataclass default, the constant
    assert sweep_cmd.sweep_run(parser.parse_args(["--config", "c.toml"]), "c.toml") == SweepRun(config_file="c.toml")
    given = parser.parse_args(["--config", "c.toml", "--id-budget", "2.5", "--shard", "1/4", "--limit", "0", "--quiet"])
    assert sweep_cmd.sweep_run(given, "c.toml") == SweepRun("c.toml", (1, 4), 0, 0.025, progress=False)
    monkeypatch.setattr(sweep_cmd, "ID_BUDGET", 0.04)  # the help reads the constant, not a number typed beside it
    parser = commands()["sweep"]
    action = next(a for a in parser._actions if a.dest == "id_budget")
    assert help_of(parser, action).endswith("(default: 4)")
