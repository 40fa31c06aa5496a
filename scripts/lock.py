"""Print the lock (pip constraints) of the environment this interpreter runs in: one `name==version` per installed
distribution, sorted, aspan itself and pip's own tooling left out, local version labels dropped (torch 2.13.0+cpu is
pinned as 2.13.0, which the local CPU wheel satisfies). `make lock` runs it in .venv-new after the suite passed there.
"""
import platform
import re
import sys
from importlib import metadata

TOOLING = {"pip", "wheel", "aspan"}  # setuptools stays: a runtime requirement of the stack


def canonical(name: str) -> str:
    """The distribution name as PEP 503 normalises it (`Jinja2` and `jinja2` are one package)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> list[str]:
    found = {canonical(d.metadata["Name"]): d.version.split("+")[0] for d in metadata.distributions()}
    return [f"{name}=={version}" for name, version in sorted(found.items()) if name not in TOOLING]


if __name__ == "__main__":
    print("# The versions the whole suite passed on (`make lock` writes this file; `make venv` installs it).")
    print(f"# Python {platform.python_version()} on {sys.platform}.")
    print("\n".join(pins()))
