"""aspan leaves the process that imports it alone, and the first things a user runs answer at once.

- Importing every module of `aspan` and `hooks` changes no environment variable, logging configuration, warning
  filter, random state or global torch / Hugging Face switch (checked in a fresh interpreter).
- Loading, evaluating, ranking, editing and training leave `os.environ` and the random states as they were.
- No loader reaches the network, with Hugging Face's offline switches off (their arguments keep them local).
- `aspan --version` prints the version without importing torch, in well under a second.
- A `hooks.py` that shadows the `hooks` package is named in one line; plain `pytest` runs without pytest-xdist.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import hooks
from aspan import models, tasks
from aspan.evaluation import evaluate
from aspan.experiments.ranking import rank_heads, select_heads
from aspan.tokenization import CharTokenizer

from .cli import ENV, ROOT

# A snapshot of everything a library must not change in its host process; printed as JSON by a fresh interpreter.
SNAPSHOT = r"""
import json, logging, os, random, warnings
import numpy as np, torch

def snapshot():
    import huggingface_hub.constants as hub
    from transformers.utils import logging as hf_logging
    loggers = {name: (lg.level, len(lg.handlers), lg.propagate, lg.disabled)
               for name, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)
               and not name.startswith(("aspan", "hooks"))}
    root = logging.getLogger()
    return {
        "environ": dict(os.environ), "root": [root.level, [repr(h) for h in root.handlers]], "loggers": loggers,
        "disable": logging.root.manager.disable, "warnings": [repr(f) for f in warnings.filters],
        "random": repr(random.getstate()), "numpy": repr(np.random.get_state()),
        "torch_rng": torch.random.get_rng_state().tolist(), "threads": torch.get_num_threads(),
        "dtype": str(torch.get_default_dtype()), "grad": torch.is_grad_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "matmul": torch.get_float32_matmul_precision(), "hub_offline": hub.HF_HUB_OFFLINE,
        "hf_verbosity": hf_logging.get_verbosity(), "hf_bars": hf_logging.is_progress_bar_enabled(),
    }
"""


OURS = r"""
import importlib, pkgutil
import aspan, hooks
NAMES = [m.name for pkg in (aspan, hooks) for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
"""


def _python(code: str) -> str:
    env = {k: v for k, v in ENV.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_importing_every_module_changes_nothing_in_the_host_process():
    """Every third-party module that importing aspan brings in is imported first (what those packages do on import
    is theirs; listed by a first interpreter); then, in a second one, every module of aspan and hooks, and nothing of
    the snapshot may differ."""
    third = json.loads(_python(OURS + """
import json, sys
for name in NAMES:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] not in ("aspan", "hooks", "__main__"))))
"""))
    code = SNAPSHOT + f"""
import importlib, sys
for name in {third!r}:
    try:
        importlib.import_module(name)
    except Exception:
        pass
before = snapshot()
""" + OURS + """
for name in NAMES:
    importlib.import_module(name)
after = snapshot()
env = {k for k in set(before["environ"]) | set(after["environ"]) if before["environ"].get(k) != after["environ"].get(k)}
print(json.dumps({"names": len(NAMES), "diff": sorted(k for k in before if before[k] != after[k]),
                  "environ": sorted(env)}))
"""
    result = json.loads(_python(code))
    assert result["names"] > 100  # every module, not a few
    assert result["diff"] == [] and result["environ"] == [], result


def test_importing_and_using_aspan_in_a_fresh_process_changes_nothing(tmp_path):
    """In a fresh interpreter that has torch and transformers (as a user's would): import aspan, load every kind of
    model (the shipped one and a Llama directory, on both backends), evaluate with an edit, rank heads, train and save.
    Nothing of the snapshot changes: TransformerLens, imported on first use, sets an environment variable (through
    torch's inductor), the `transformers` logger's level and warning filters, all undone by aspan; loggers that modules
    create on import are new, not changed, and are left out."""
    code = SNAPSHOT + f"""
import sys
from pathlib import Path
from tests.models.hf_fixtures import save_random_model
save_random_model("llama", Path({str(tmp_path / "llama")!r}))
before = snapshot()
import hooks
from aspan import models, tasks
from aspan.evaluation import evaluate
from aspan.experiments.ranking import rank_heads, select_heads
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig, train
model, tok, _ = models.load("reversal", device="cpu")
samples = tasks.preset("reversal", "ood", length=(11, 12)).generate(4, seed=0)
heads = select_heads(rank_heads(model, tok, samples, deltas=[2]), top=2, by="score_row_d2")
evaluate(model, tok, samples, fwd_hooks=lambda b: hooks.reinforce(heads, mask=b.ref_mask, strength=2.0, delta=2))
for source in ("reversal", {str(tmp_path / "llama")!r}):
    for backend in ("hooked", "bridge"):
        loaded = models.load(source, device="cpu", backend=backend, dtype="bfloat16")
        evaluate(loaded.model, loaded.tokenizer, samples[:2], any_task=True)
small = models.tiny(CharTokenizer(), n_layers=1, n_heads=2, d_model=16, n_ctx=32, device="cpu")
train(small, CharTokenizer(), tasks.get("reversal", length=(1, 3), charset="abcd"),
      TrainConfig.scratch(steps=2, batch_size=4), progress=False)
models.save(small, {str(tmp_path / "small")!r}, CharTokenizer())
after = snapshot()
after["loggers"] = {{k: v for k, v in after["loggers"].items() if k in before["loggers"]}}
diff = {{k: [str(before[k])[:300], str(after[k])[:300]] for k in before if before[k] != after[k]}}
print(json.dumps(diff))
"""
    assert json.loads(_python(code)) == {}


def real_umask_now() -> int:
    """The umask, read from /proc (Linux) without setting it."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))


def _state() -> tuple:
    import logging
    import warnings

    root = logging.getLogger()
    return (dict(os.environ), random.getstate(), repr(np.random.get_state()), torch.random.get_rng_state(),
            torch.get_num_threads(), torch.is_grad_enabled(), root.level, list(root.handlers), list(warnings.filters),
            torch.get_default_dtype())


def test_using_aspan_leaves_the_environment_and_random_states_alone(tmp_path, monkeypatch):
    """Load (aspan format, the shipped model, a Hugging Face directory on both backends), evaluate with an edit,
    rank heads, train a step and save in both forms (the Hugging Face form builds a randomly initialised model):
    `os.environ`, Python's, numpy's and torch's random states, torch's threads, grad mode and default dtype, the root
    logger and the warning filters are as they were, and the process umask was never set, not even for a moment (a
    race for the host's other threads)."""
    from aspan.training import TrainConfig, train

    from .models.hf_fixtures import save_random_model

    save_random_model("llama", tmp_path / "plain")
    umask_calls = []
    real_umask = os.umask
    monkeypatch.setattr(os, "umask", lambda mask: umask_calls.append(mask) or real_umask(mask))
    before = _state()
    model, tok, _ = models.load("reversal", device="cpu")
    samples = tasks.preset("reversal", "ood", length=(11, 12)).generate(4, seed=0)
    ranking = rank_heads(model, tok, tasks.preset("reversal", "id").generate(4, seed=1), deltas=[2], progress=False)
    heads = select_heads(ranking, top=2, by="score_row_d2")
    evaluate(model, tok, samples, fwd_hooks=lambda b: hooks.reinforce(heads, mask=b.ref_mask, strength=2.0, delta=2))
    for backend in ("hooked", "bridge"):
        loaded = models.load(tmp_path / "plain", device="cpu", backend=backend)
        evaluate(loaded.model, loaded.tokenizer, samples[:2])
    small = models.tiny(CharTokenizer(), n_layers=1, n_heads=2, d_model=16, n_ctx=32, device="cpu")
    train(small, CharTokenizer(), tasks.get("reversal", length=(1, 3), charset="abcd"),
          TrainConfig.scratch(steps=2, batch_size=4), progress=False)
    models.save(small, tmp_path / "small", CharTokenizer(), hf=False)
    fresh = models.tiny(CharTokenizer(), n_layers=1, n_heads=2, d_model=16, n_ctx=32, device="cpu")
    models.save(fresh, tmp_path / "fresh", CharTokenizer())  # the default form: Hugging Face's (it has one)
    assert (tmp_path / "fresh" / "tokenizer.json").is_file()  # only the Hugging Face form writes one
    assert (tmp_path / "fresh" / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~real_umask_now()
    after = _state()
    assert umask_calls == []
    assert after[0] == before[0]  # os.environ
    assert after[1] == before[1] and after[2] == before[2] and torch.equal(after[3], before[3])
    assert after[4:] == before[4:]


def test_no_loader_reaches_the_network_with_the_offline_switches_off(tmp_path, monkeypatch):
    """Socket connections and name lookups fail loudly, and Hugging Face's offline switches are off (as in a user's
    process): the aspan format, the shipped model, a Llama directory (both backends) and SmolLM2's GGUF file (both
    backends) load by their arguments alone (`local_files_only=True`), attempting no connection."""
    import huggingface_hub.constants

    from .models.hf_fixtures import block_network, load_every_kind

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    attempts = block_network(monkeypatch)
    load_every_kind(tmp_path)
    models.load("smollm2", device="cpu", dtype="bfloat16")  # the GGUF path, at half the memory
    assert attempts == []


# ----------------------------------------------------------------------------------------------- first contact
def test_version_prints_at_once_without_importing_torch(tmp_path):
    code = "import sys\nfrom aspan.cli import main\nmain(['--version'])\nprint('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, capture_output=True, text=True)
    from aspan import __version__

    assert done.stdout.splitlines() == [f"aspan {__version__}", "False"], done.stderr
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "aspan.cli", "--version"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    assert done.returncode == 0 and done.stdout == f"aspan {__version__}\n"
    assert wall < 1.0, f"aspan --version took {wall:.2f} s"


def test_one_version_and_the_changelog_names_it():
    """pyproject.toml takes the version from `aspan.__version__` (one place); CHANGELOG.md's first release heading
    and CITATION.cff name that version; the licence is MIT everywhere."""
    import re
    import tomllib

    from aspan import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" in project["project"]["dynamic"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "aspan.__version__"}
    first = re.search(r"^## \[?(\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert first and first[1] == __version__
    import yaml

    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert citation["cff-version"] == "1.2.0" and citation["version"] == __version__
    assert citation["license"] == project["project"]["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")


@pytest.mark.parametrize("shadow", ["hooks.py", "hooks/__init__.py"])
def test_a_shadowed_hooks_package_is_named_in_one_line(tmp_path, shadow):
    (tmp_path / shadow).parent.mkdir(exist_ok=True)
    (tmp_path / shadow).write_text("x = 1\n")
    for statement in ("import aspan", "from aspan.evaluation import evaluate"):
        done = subprocess.run([sys.executable, "-c", statement], cwd=tmp_path, env=ENV, capture_output=True,
                              text=True)
        assert done.returncode == 1
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError: aspan needs its own `hooks` package"), done.stderr[-2000:]
        assert str(tmp_path / shadow) in last and str(ROOT / "hooks") in last


def test_no_shadow_no_error(tmp_path):
    (tmp_path / "hooks").mkdir()  # a directory without __init__.py (a namespace portion) loses to the package
    done = subprocess.run([sys.executable, "-c", "import aspan, hooks; print(hooks.__file__)"], cwd=tmp_path,
                          env=ENV, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == str(ROOT / "hooks" / "__init__.py"), done.stderr


def test_plain_pytest_runs_without_pytest_xdist():
    """The suite's xdist scheduling hook is optional: with the plugin off, pytest loads conftest.py and runs."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
                           "tests/test_layering.py"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "passed" in done.stdout and "INTERNALERROR" not in done.stdout + done.stderr


def test_applications_called_from_python_restore_torch_threads(tmp_path):
    """`run_eval` and `train_run` with `threads` run torch on that many threads and hand the caller's number back."""
    from aspan.applications.eval import EvalRun, run_eval
    from aspan.applications.train import TrainRun, train_run
    from aspan.training import TrainConfig

    before = torch.get_num_threads()
    wanted = 2 if before != 2 else 3
    seen = []
    original = torch.set_num_threads

    def spy(n):
        seen.append(n)
        original(n)

    torch.set_num_threads = spy
    try:
        run_eval(EvalRun("reversal", split="id", samples=2, attn=False, device="cpu", threads=wanted))
        train_run(TrainRun(task="reversal", params=("length=1-3", "charset=abcd"), progress=False, threads=wanted,
                           train=TrainConfig.scratch(steps=1, batch_size=4, device="cpu", eval_samples=2),
                           n_layers=1, n_heads=2, d_model=16), str(tmp_path / "run"))
    finally:
        torch.set_num_threads = original
    assert seen.count(wanted) == 2 and torch.get_num_threads() == before


def test_process_kept_puts_back_only_what_loading_changes(monkeypatch):
    """`process_kept` restores the variable TransformerLens's import sets and removes the root-logger handler its
    config conversion adds, but a variable the host sets meanwhile (another thread, say) stays as the host set it."""
    import logging

    from aspan.models.loaded import process_kept

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("ASPAN_TEST_HOST_VARIABLE", raising=False)
    root, handler = logging.getLogger(), logging.NullHandler()
    with process_kept():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/set-by-loading"
        os.environ["ASPAN_TEST_HOST_VARIABLE"] = "kept"
        root.addHandler(handler)
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    assert os.environ["ASPAN_TEST_HOST_VARIABLE"] == "kept"
    assert handler not in root.handlers
