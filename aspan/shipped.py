"""What aspan ships besides its code: trained checkpoints, the sweep and study configs, the tutorial notebooks.

In a checkout they are the repository's `aspan/checkpoints/`, `configs/` and `notebooks/`; the wheel carries the
configs as `aspan/configs/` and the notebooks as `aspan/tutorials/` (setup.py copies them in), so that every command
a help text or a page shows works from an installed wheel too:

    config_path("reversal_reinforce")          # the shipped configs/reversal_reinforce.toml, found by name
    config_path("my_sweep.toml")               # a file that exists is always that file
    copy_tutorials("my-tutorials")             # the notebooks, to open with `jupyter lab my-tutorials`

Nothing here imports torch: the command line resolves a `--config` name and checks a model argument while it parses.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from .errors import UsageError

PACKAGE = Path(__file__).resolve().parent
CHECKPOINTS = PACKAGE / "checkpoints"  # loadable by name: `aspan.models.load("reversal")`
CHECKPOINT_CONFIG = "config.json"  # the file every shipped checkpoint directory holds
PRETRAINED_NAMES = ("smollm2",)  # models named by a word that are not shipped checkpoints (SmolLM2's own package)


def _shipped_dir(installed: str, checkout: str) -> Path | None:
    """The directory of the installed package's `installed`, or in a checkout (a `pyproject.toml` beside the package)
    the repository's `checkout`; None when neither exists."""
    if (PACKAGE / installed).is_dir():
        return PACKAGE / installed
    root = PACKAGE.parent
    return root / checkout if (root / "pyproject.toml").is_file() and (root / checkout).is_dir() else None


def configs_dir() -> Path | None:
    """Where the shipped configs are (None: this installation has none)."""
    return _shipped_dir("configs", "configs")


def tutorials_dir() -> Path | None:
    """Where the tutorial notebooks are (None: this installation has none)."""
    return _shipped_dir("tutorials", "notebooks")


def config_names() -> list[str]:
    """The shipped configs by name: their paths under the configs directory, without `.toml` (`gpu/campaign`)."""
    where = configs_dir()
    return sorted(p.relative_to(where).with_suffix("").as_posix() for p in where.rglob("*.toml")) if where else []


def config_path(text: str) -> str:
    """The TOML file `text` names: itself when it exists (a path always wins), else the shipped config of that name,
    given with or without `.toml` and with or without the repository's `configs/` in front (`reversal_reinforce`,
    `configs/gpu/campaign.toml`); UsageError in one line listing the shipped names otherwise."""
    if os.path.exists(text):
        return text
    name = text.removesuffix(".toml").replace(os.sep, "/").removeprefix("./").removeprefix("configs/")
    names = config_names()
    if name in names:
        return str(configs_dir() / f"{name}.toml")
    shipped = ", ".join(names) or "none"
    raise UsageError(f"{text}: no such file, and no shipped config of that name (shipped: {shipped})")


def checkpoint_names() -> list[str]:
    """Names of the checkpoints shipped in the package."""
    if not CHECKPOINTS.is_dir():
        return []
    return sorted(p.name for p in CHECKPOINTS.iterdir() if (p / CHECKPOINT_CONFIG).is_file())


def check_model_name(text: str, what: str = "MODEL") -> str:
    """`text` when it can name a model (an existing path, a shipped checkpoint, `smollm2`), else the one-line
    UsageError `aspan.models.load` would raise, before anything is imported to load it."""
    if os.path.exists(text) or text in checkpoint_names() or text.lower() in PRETRAINED_NAMES:
        return text
    names = ", ".join(repr(n) for n in [*checkpoint_names(), *PRETRAINED_NAMES])
    raise UsageError(f"{what}: no model at {text} (expected a checkpoint directory, a .gguf file, or one of {names})")


def copy_tutorials(dest: str | os.PathLike, overwrite: bool = False) -> list[Path]:
    """Copy the tutorial notebooks into the directory `dest` (created); the files written. UsageError when this
    installation has none, or when a notebook is there already and `overwrite` is false (nothing is then written)."""
    where = tutorials_dir()
    notebooks = sorted(where.glob("*.ipynb")) if where else []
    if not notebooks:
        raise UsageError("this installation of aspan ships no tutorial notebooks")
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest} is a file; give a directory to copy the tutorials into")
    there = [dest / nb.name for nb in notebooks if (dest / nb.name).exists()]
    if there and not overwrite:
        raise UsageError(f"{there[0]} exists already (pass --force to overwrite the {len(there)} notebooks there)")
    dest.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copyfile(nb, dest / nb.name)) for nb in notebooks]
