"""Where the docs build keeps the tutorials' executed outputs (myst-nb's jupyter-cache, `nb_execution_mode = "cache"`).

jupyter-cache reuses a notebook's outputs while the notebook's code cells are unchanged; it does not know what else
they depend on. The cache's folder is therefore named by a digest of that too: every file of `aspan` and `hooks`
(the shipped checkpoints included), the name and version of every installed distribution, Python's version and the
kernel's profile files (`plotly_offline.py`, `kernel_config.py`). Any change to them starts an empty cache, so the
site never shows outputs that this code, with these packages, would not print; the folders of other digests are
removed. `make docs` after a change to the pages alone reuses the outputs.
"""
from __future__ import annotations

import hashlib
import shutil
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
KERNEL_FILES = ("plotly_offline.py", "kernel_config.py")


def outputs_digest(root: Path = ROOT) -> str:
    """16 hex digits of sha256 over what the notebooks' outputs depend on beyond their own cells."""
    h = hashlib.sha256()
    for package in ("aspan", "hooks"):
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for name in KERNEL_FILES:
        h.update((HERE / name).read_bytes())
    installed = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    h.update("\n".join([sys.version, *installed]).encode())
    return h.hexdigest()[:16]


def cache_dir(root: Path) -> Path:
    """`root/<digest>`, the other digests' folders under `root` removed."""
    digest = outputs_digest()
    if root.is_dir():
        for old in root.iterdir():
            if old.name != digest:
                shutil.rmtree(old, ignore_errors=True)
    return root / digest
