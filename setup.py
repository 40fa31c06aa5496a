"""The package's files beyond its code, for setuptools (everything else is in pyproject.toml).

The repository keeps the sweep and study configs in `configs/` and the tutorial notebooks in `notebooks/`, where its
documents and results name them; the wheel carries them inside the package, as `aspan/configs/` and
`aspan/tutorials/`, so that `aspan sweep --config reversal_reinforce` and `aspan tutorials DIR` work from an installed
wheel (`aspan.shipped` finds them in either place). Builds go to `.build/` rather than `build/`: a `build/` directory
left in the checkout by `pip wheel .` would shadow the `build` package, and `python -m build` would fail there.
"""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = (("configs", "aspan/configs", "**/*.toml"), ("notebooks", "aspan/tutorials", "*.ipynb"))


class BuildWithShipped(build_py):
    """`build_py`, then the configs and notebooks copied into the built package (not for an editable install, whose
    package is the checkout itself)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for source, target, pattern in SHIPPED:
            for path in sorted((ROOT / source).glob(pattern)):
                dest = Path(self.build_lib) / target / path.relative_to(ROOT / source)
                self.mkpath(str(dest.parent))
                self.copy_file(str(path), str(dest))


setup(cmdclass={"build_py": BuildWithShipped}, options={"build": {"build_base": ".build"}})
