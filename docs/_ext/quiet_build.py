"""A `-q` build prints warnings and errors only, and the notebooks' kernel starts with the build's own IPython profile.

- Root logger: accessible-pygments (a dependency of furo, imported when the highlighter looks its styles up) calls
  `logging.basicConfig(level=INFO)` at import, after which every INFO record of any library (nbclient's "Executing
  notebook with kernel" per notebook) reaches the terminal. `basicConfig` does nothing where the root logger already
  has a handler, so the build gives it one first: a stderr handler for WARNING and above, what Python prints without
  any configuration. Sphinx's own messages go through its own handlers and are not affected.
- The kernel: an IPython directory in the build directory (`IPYTHONDIR`, which the kernel myst-nb starts inherits)
  whose profile holds `ipython_kernel_config.py` (`kernel_config.py`: the kernel's notice that TCP on 127.0.0.1 is
  not encrypted, dropped) and the start-up file `plotly_offline.py` (plotly figures drawn by the page's own
  `plotly.min.js`, nothing loaded from a CDN).
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from sphinx.application import Sphinx

HERE = Path(__file__).resolve().parent


def guard_root_logger() -> None:
    """Give the root logger a WARNING stderr handler unless it has one, so a later `basicConfig` is a no-op."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setLevel(logging.WARNING)
        root.addHandler(handler)


def kernel_profile(app: Sphinx) -> None:
    """The IPython directory of the notebooks' kernel: its kernel configuration and plotly start-up file."""
    profile = Path(app.outdir).parent / ".ipython" / "profile_default"
    (profile / "startup").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / "kernel_config.py", profile / "ipython_kernel_config.py")
    shutil.copyfile(HERE / "plotly_offline.py", profile / "startup" / "00-plotly-offline.py")
    os.environ["IPYTHONDIR"] = str(profile.parent)  # the kernel myst-nb starts inherits this process's environment


def setup(app: Sphinx) -> dict:
    guard_root_logger()
    app.connect("builder-inited", kernel_profile)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
