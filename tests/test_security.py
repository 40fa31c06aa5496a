"""A run directory is never a way to write elsewhere: its files are not appended to, truncated or replaced through a
symbolic link someone else put there; the command refuses in one line naming the file and touches nothing."""
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from aspan import models
from aspan.tokenization import CharTokenizer
from tests.cli import aspan, one_line

ROOT = Path(__file__).resolve().parent.parent


def sweep_config(tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    models.save(models.tiny(CharTokenizer(), n_layers=1, n_heads=2, d_model=16, n_ctx=64, device="cpu"), ckpt,
                CharTokenizer(), task="reversal")
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'model = "{ckpt}"\ntask = "reversal"\nn_samples = 2\nbatch_size = 2\n'
                   'task_params = {length = [2, 3]}\nstrengths = [1.0]\n[heads]\nlist = [[0, 0]]\n')
    return cfg


def test_security_sweep_rows_are_not_appended_through_a_symlink(tmp_path):
    cfg, out, victim = sweep_config(tmp_path), tmp_path / "run", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("not the sweep's\n")
    (out / "sweep.jsonl").symlink_to(victim)
    r = aspan("sweep", "--config", str(cfg), "--out", str(out), "--quiet", cwd=tmp_path)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert f"{out / 'sweep.jsonl'} is a symbolic link" in r.stderr
    assert victim.read_text() == "not the sweep's\n" and (out / "sweep.jsonl").is_symlink()


def test_security_run_json_is_not_replaced_through_a_symlink(tmp_path):
    cfg, out, victim = sweep_config(tmp_path), tmp_path / "run", tmp_path / "victim.json"
    out.mkdir()
    victim.write_text("{}\n")
    (out / "run.json").symlink_to(victim)
    r = aspan("sweep", "--config", str(cfg), "--out", str(out), "--quiet", cwd=tmp_path)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert f"{out / 'run.json'} is a symbolic link" in r.stderr
    assert victim.read_text() == "{}\n" and (out / "run.json").is_symlink()
    assert not (out / "sweep.jsonl").exists()  # refused before any row was computed


# ------------------------------------------------------------------ model loading never touches the network
def hostile_checkpoints(tmp_path: Path) -> dict[Path, str]:
    """Aspan checkpoints whose config.json names a hub tokenizer, asks for remote code, or points its Hugging Face
    tokenizer outside the checkpoint; each with the key a refusal must name."""
    tok = CharTokenizer()
    src = models.save(models.tiny(tok, n_layers=1, n_heads=2, d_model=16, d_mlp=20, n_ctx=32, positional="alibi",
                                  device="cpu"), tmp_path / "src", tok, hf=False, task="reversal")
    cases = {"hub": ({"tokenizer_name": "gpt2", "trust_remote_code": True}, None, "model.tokenizer_name"),
             "remote": ({"trust_remote_code": True}, None, "model.trust_remote_code"),
             "hubtok": ({}, {"type": "hf_char", "hf_path": "gpt2"}, "tokenizer.hf_path"),
             "outside": ({}, {"type": "hf_char", "hf_path": str(tmp_path)}, "tokenizer.hf_path")}
    out = {}
    for name, (model, tokenizer, key) in cases.items():
        config = json.loads((src / "config.json").read_text())
        config["model"].update(model)
        config["tokenizer"] = tokenizer or config["tokenizer"]
        (tmp_path / name).mkdir()
        shutil.copy(src / "model.safetensors", tmp_path / name)
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        out[tmp_path / name] = key
    return out


def test_security_a_checkpoint_naming_a_hub_tokenizer_is_refused_at_once(tmp_path):
    """A config.json with `tokenizer_name` and `trust_remote_code: true` made `aspan eval` ask the model hub (DNS,
    five retries, about a minute) with the file's trust_remote_code; it is refused naming the file and key."""
    for ckpt, key in hostile_checkpoints(tmp_path).items():  # (no wall-time bound: the machine's load decides it;
        r = aspan("eval", str(ckpt), "-n", "2", "--no-attn", cwd=tmp_path)  # the next test blocks the network)
        assert r.returncode == 2, r.stderr[-2000:]
        one_line(r.stderr, str(ckpt / "config.json"), key)


def test_security_no_load_path_reaches_the_network(tmp_path, monkeypatch):
    """Every loader (aspan format, the shipped Hugging Face form on both backends, a Llama directory on both, the
    hostile checkpoints) runs with socket connections and name lookups failing loudly: none is attempted."""
    from tests.models.hf_fixtures import block_network, load_every_kind

    attempts = block_network(monkeypatch)
    load_every_kind(tmp_path)
    for ckpt, key in hostile_checkpoints(tmp_path / "hostile").items():
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            models.load(ckpt, device="cpu", backend="hooked")
    assert attempts == []


# ------------------------------------------------------------------------------------ reports meant to be shared
def test_security_report_embeds_only_regular_files_inside_the_run_directory(tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwd").write_text("root:x:0:0:SECRET-ROOT-LINE:/root:/bin/bash\n")
    (secret / "figs").mkdir()
    (secret / "figs" / "f.json").write_text('{"data": [], "layout": {"title": {"text": "SECRET-FIGURE"}}}')
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"command": "aspan eval reversal"}))
    (run / "ranking.csv").write_text("layer,head\n1,2\n")
    (run / "leak.csv").symlink_to(secret / "passwd")  # a link to a file outside
    (run / "summary.json").symlink_to(secret / "passwd")
    (run / "figures").symlink_to(secret / "figs")  # a linked folder
    (run / "views").mkdir()
    (run / "views" / "v.html").symlink_to(secret / "passwd")
    os.mkfifo(run / "pipe.jsonl")  # reading it would block the report for ever
    r = aspan("report", str(run), "-o", str(tmp_path / "report.html"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "report.html").read_text()
    assert "SECRET" not in page and "ranking.csv" in page and "aspan eval reversal" in page
    assert "Left out" in page and all(n in page for n in ("leak.csv", "summary.json", "pipe.jsonl"))
    (run / "run.json").unlink()
    (run / "ranking.csv").unlink()
    r = aspan("report", str(run), "-o", str(tmp_path / "nothing.html"), cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "nothing.html").exists()
    one_line(r.stderr, "nothing to report", "leak.csv")


def test_security_report_views_run_in_a_sandboxed_frame(tmp_path):
    run = tmp_path / "run"
    (run / "views").mkdir(parents=True)
    (run / "views" / "note.html").write_text("<script>parent.document.title = 'owned'</script><p>hand-made</p>")
    r = aspan("report", str(run), "-o", str(tmp_path / "report.html"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    frames = re.findall(r"<iframe[^>]*>", (tmp_path / "report.html").read_text())
    assert len(frames) == 1 and ' sandbox="allow-scripts" ' in frames[0] and "allow-same-origin" not in frames[0]


def test_security_only_plain_circuitsvis_views_run_in_the_report_page(tmp_path):
    from aspan import viz

    run = tmp_path / "run"
    view = viz.head_view(torch.rand(1, 3, 3).tril(), list("<ab"), names=["L0H0"]).local_src
    (run / "views").mkdir(parents=True)
    (run / "views" / "plain.html").write_text(view)
    (run / "views" / "extra.html").write_text(view.replace("\n    )", "\n    ); document.title = 'EXTRA-CODE'"))
    (run / "views" / "wrapped.html").write_text("<script>document.title = 'WRAPPED-CODE'</script>" + view)
    r = aspan("report", str(run), "-o", str(tmp_path / "report.html"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "report.html").read_text()
    frames = re.findall(r'<iframe sandbox="allow-scripts" srcdoc="([^"]*)"', page)
    assert len(frames) == 2 and all("-CODE" in f for f in frames)  # each left in its sandboxed frame
    outside = re.sub(r"<iframe[^>]*>", "", page)
    assert "-CODE" not in outside and outside.count("CircuitsVis.render(") == 1  # only the plain view runs here
