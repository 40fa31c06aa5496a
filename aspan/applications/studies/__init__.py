"""Studies that test the claims of the papers this toolkit follows; one module each, run by `aspan study NAME`.

A study module defines its settings dataclass (with a `check()`; `aspan.config.load_config` builds it from defaults,
a TOML file and flags) and a function a notebook can call, `run_study(config, out)`-style, that writes the run
directory; its command line (`HELP`, the options) lives in `aspan/commands/studies/<name>.py`.
"""
STUDIES = ("qk", "abc", "parity")


def use_threads(threads: int | None) -> None:
    """Run torch on `threads` CPU threads (None or 0: leave torch's choice)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
