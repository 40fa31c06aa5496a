"""A `-q` docs build prints nothing when nothing is wrong: a small site built the way `make docs` builds
(furo, myst-nb executing a notebook, docs/_ext/quiet_build.py) writes nothing to stdout or stderr. Without
quiet_build the same build prints the kernel's TCP notice and nbclient's INFO line, so the check can fail. Skipped
without Sphinx (`make venv` installs it with the `docs` extra); under CI that is a failure."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXT = ROOT / "docs" / "_ext"


def _needs_sphinx() -> None:
    done = subprocess.run([sys.executable, "-c", "import sphinx, myst_nb, furo"], capture_output=True)
    if done.returncode != 0:
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail("Sphinx, myst-nb and furo are needed under CI (the `docs` extra of `make venv`)")
        pytest.skip("Sphinx, myst-nb or furo is not installed (the `docs` extra)")


def build(tmp_path: Path, extensions: list[str]) -> subprocess.CompletedProcess:
    """`sphinx -b html -E -W --keep-going -q` of a page and a notebook that prints, with these extensions."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(EXT)!r})\nextensions = {extensions!r}\nhtml_theme = 'furo'\n"
        "nb_execution_mode = 'force'\nnb_execution_raise_on_error = True\n")
    (src / "index.md").write_text("# Home\n\n```{toctree}\nnb\n```\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A notebook"),
                                         nbformat.v4.new_code_cell("print('ran')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, src / "nb.ipynb")
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    env.pop("IPYTHONDIR", None)
    return subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-E", "-W", "--keep-going", "-q",
                           str(src), str(tmp_path / "_build" / "html")], capture_output=True, text=True,
                          timeout=600, env=env, cwd=tmp_path)


def test_a_quiet_build_prints_nothing(tmp_path):
    _needs_sphinx()
    done = build(tmp_path, ["myst_nb", "quiet_build"])
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", ""), done.stdout + done.stderr
    assert "ran" in (tmp_path / "_build" / "html" / "nb.html").read_text(encoding="utf-8")  # the notebook ran


def test_without_quiet_build_the_same_build_prints_the_kernel_notice(tmp_path):
    _needs_sphinx()
    import ipykernel.kernelapp

    if "without encryption" not in Path(ipykernel.kernelapp.__file__).read_text(encoding="utf-8"):
        pytest.skip("this ipykernel has no notice about TCP without encryption to filter")
    done = build(tmp_path, ["myst_nb"])
    assert done.returncode == 0, done.stderr
    assert "running over TCP without encryption" in done.stderr, done.stderr


def _notebook_cache():
    import importlib.util

    spec = importlib.util.spec_from_file_location("notebook_cache", EXT / "notebook_cache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_notebook_cache_is_keyed_by_the_code_the_outputs_depend_on(tmp_path):
    """A changed, added or renamed file of aspan or hooks (a checkpoint too) names another cache folder; the same
    files name the same one; the other folders are removed."""
    cache = _notebook_cache()
    for package in ("aspan", "hooks"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("x = 1\n")
    (tmp_path / "aspan" / "checkpoints").mkdir()
    (tmp_path / "aspan" / "checkpoints" / "w.safetensors").write_bytes(b"\0\1")
    first = cache.outputs_digest(tmp_path)
    assert cache.outputs_digest(tmp_path) == first
    (tmp_path / "aspan" / "__pycache__").mkdir()
    (tmp_path / "aspan" / "__pycache__" / "x.pyc").write_bytes(b"compiled")
    assert cache.outputs_digest(tmp_path) == first  # bytecode is no input
    seen = {first}
    for change in (lambda: (tmp_path / "hooks" / "__init__.py").write_text("x = 2\n"),
                   lambda: (tmp_path / "aspan" / "checkpoints" / "w.safetensors").write_bytes(b"\0\2"),
                   lambda: (tmp_path / "aspan" / "new.py").write_text(""),
                   lambda: (tmp_path / "aspan" / "new.py").rename(tmp_path / "aspan" / "other.py")):
        change()
        digest = cache.outputs_digest(tmp_path)
        assert digest not in seen
        seen.add(digest)
    root = tmp_path / "cache"
    (root / "0123456789abcdef").mkdir(parents=True)
    assert cache.cache_dir(root).name == cache.outputs_digest() and not (root / "0123456789abcdef").exists()


def test_ci_runs_every_notebook_afresh():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    builds = [line.strip() for line in ci.splitlines() if line.strip().startswith("make docs")]
    assert builds and all('SPHINXOPTS="-D nb_execution_mode=force"' in line for line in builds), builds
