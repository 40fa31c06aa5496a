"""What a result was computed with: package versions, the model backend, its dtype and the device actually used.

One record, `run_environment`, goes into every `run.json` aspan writes and is what `aspan --version` and
`aspan doctor` print, so a result always says which stack, backend and device produced it.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from . import __version__

PACKAGES = ("torch", "transformer-lens", "transformers")  # distributions every result depends on, besides aspan


def versions(*extra: str) -> dict[str, str]:
    """Versions of Python and of the packages a result depends on, `extra` distributions too, keyed by import name
    (`transformer_lens`); "unknown" for one that is not installed."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    out = {"aspan": "unknown", "python": platform.python_version()}
    for name in ("aspan", *PACKAGES, *extra):
        try:
            out[name.replace("-", "_")] = version(name)
        except PackageNotFoundError:
            out[name.replace("-", "_")] = "unknown"
    if out["aspan"] == "unknown":  # run from a source tree that was never installed (e.g. on a lent GPU machine)
        out["aspan"] = f"{__version__} (source tree)"
    return out


def device_name(device: Any = None) -> str:
    """The device as a run records it: "cpu", "mps", "cuda:0 (NVIDIA H100 80GB HBM3)" (index and GPU name);
    None or "auto" is the device `aspan.models.load` picks (CUDA when present)."""
    import torch

    from .models.checkpoint import default_device

    d = torch.device(default_device() if device in (None, "auto") else device)
    if d.type != "cuda":
        return d.type if d.index is None else str(d)
    index = torch.cuda.current_device() if d.index is None else d.index
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def model_device(model: Any) -> Any:
    """The device holding `model`'s weights (a HookedTransformer's or a TransformerBridge's)."""
    return next(model.parameters()).device


def model_dtype(model: Any) -> str:
    """The precision of `model`'s weights ("float32", "bfloat16", ...): its first floating-point parameter's."""
    return next((str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.is_floating_point()),
                "float32")


def run_environment(model: Any = None, device: Any = None, extra: tuple[str, ...] = (),
                    dtype: str = "float32") -> dict[str, Any]:
    """`versions` (with `extra` distributions), `backend` ("hooked" or "bridge"), `dtype` and `device` of a run:
    `model`'s own when given, else the backend `aspan.models.load` uses now (`ASPAN_BACKEND`), `dtype` (float32, the
    precision models are trained and loaded in unless asked otherwise) and `device` as it resolves; `machine`: the
    platform, its CPU count, torch's threads and the CPU kernels torch selected (`cpu_kernels`: "AVX2", "AVX512",
    ...; the same training can round differently, and so end differently, under different kernels)."""
    import os
    import platform

    import torch

    from .models.backend import backend_of, default_backend

    if model is not None:
        backend, device, dtype = backend_of(model).name, model_device(model), model_dtype(model)
    else:
        backend = default_backend()
    machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
               "cpu_kernels": torch.backends.cpu.get_cpu_capability()}
    return {"versions": versions(*extra), "backend": backend, "dtype": dtype, "device": device_name(device),
            "machine": machine}


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch on `threads` CPU threads inside the block (None or 0: torch's own choice), the caller's number restored
    afterwards: an application called from Python leaves its host process as it found it."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def describe_environment() -> list[str]:
    """`name: value` lines of this machine's record (what `aspan doctor` prints)."""
    env = run_environment()
    return [*(f"{k}: {v}" for k, v in env["versions"].items()), f"backend: {env['backend']}",
            f"device: {env['device']}"]
