"""Checks made before any long work starts: devices and output paths (each failure a one-line `UsageError`)."""
from __future__ import annotations

import numbers
import os
from pathlib import Path

from .errors import UsageError
from .tasks import Sample, check_sample

DEVICES = "auto, cpu, cuda, cuda:N or mps"


def check_device(device: str | None, what: str = "device") -> str | None:
    """`device` unchanged when this machine can use it (None and "auto" always can); UsageError otherwise.

    Catches a misspelt device (`potato`) and a backend that is absent here (`cuda` without CUDA, `cuda:3` on a
    one-GPU machine) before a model is loaded, instead of a torch RuntimeError half-way through.
    """
    if device is None or device == "auto":
        return device
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise UsageError(f"{what} {device!r}: not a device (use {DEVICES})") from None
    if d.type == "cpu":
        return device
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"{what} {device!r}: CUDA is not available on this machine (use --device cpu)")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise UsageError(f"{what} {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return device
    if d.type == "mps":
        if not torch.backends.mps.is_available():
            raise UsageError(f"{what} {device!r}: MPS is not available on this machine (use --device cpu)")
        return device
    raise UsageError(f"{what} {device!r}: not supported (use {DEVICES})")


def _check_parent(path: Path, what: str) -> None:
    """The nearest existing ancestor of `path` must be a writable directory."""
    parent = path.parent
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"{what} {path}: {parent} is a file, not a directory")
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {path}: no permission to write in {parent}")


def _check_not_empty(path: str | os.PathLike, what: str) -> None:
    """An empty path (`--out ""`) would mean the current directory: refused, never guessed."""
    if not str(path).strip():
        raise UsageError(f"{what}: empty path; give a path")


def check_output_file(path: str | os.PathLike, what: str = "output file") -> Path:
    """`path` as a Path when a file can be written there: not empty, not a directory, inside a (creatable) writable
    directory."""
    _check_not_empty(path, what)
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory; give a file path")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{what} {path}: no permission to overwrite it")
    _check_parent(path, what)
    return path


def check_output_dir(path: str | os.PathLike, what: str = "run directory") -> Path:
    """`path` as a Path when it is (or can become) a writable directory: not empty, not an existing file."""
    _check_not_empty(path, what)
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{what} {path} is a file; give a directory path")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {path}: no permission to write in it")
    _check_parent(path, what)
    return path


def check_offsets(deltas, n_tokens: int, what: str = "delta") -> list[int]:
    """Key offsets as a non-empty list of ints that some sequence of `n_tokens` tokens can hold
    (`abs(delta) < n_tokens`).

    A reference shifted by `n_tokens` or more leaves every sequence: its scores would be all NaN or zero and its
    edits no-ops, so it is refused instead of being reported as a result.
    """
    deltas = [deltas] if isinstance(deltas, numbers.Integral) else list(deltas)
    if not deltas:
        raise UsageError(f"{what}: no offsets given (give at least one, e.g. 0)")
    for d in deltas:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise UsageError(f"{what}: offsets must be integers, got {d!r}")
        if abs(d) >= n_tokens:
            raise UsageError(f"{what}: offset {d} is outside every sequence (the longest has {n_tokens} tokens, "
                             f"so offsets must lie in {-(n_tokens - 1)}..{n_tokens - 1})")
    return [int(d) for d in deltas]


def check_samples(samples, what: str) -> list:
    """`samples` as a list of `Sample`s, each checked against its task (`tasks.check_sample`; a sample checked once is
    not checked again): ValueError naming `what` and the first that is not a `Sample` (a string, a dict...) or that its
    task's rule contradicts (a hand-built sample with wrong references would be scored as if they were right)."""
    samples = list(samples)
    for i, s in enumerate(samples):
        if not isinstance(s, Sample):
            raise UsageError(f"{what}: sample {i} is a {type(s).__name__} ({str(s)[:40]!r}), not an aspan Sample: "
                             f"make samples with task.generate(n) or read them with aspan.tasks.read_samples")
        if id(s) not in _CHECKED or _CHECKED[id(s)] is not s:
            try:
                check_sample(s)
            except ValueError as e:
                raise UsageError(f"{what}: sample {i} ({s.text[:40]!r}): {e}") from None
            _CHECKED[id(s)] = s
            _forget_checked()
    return samples


# Samples already checked, by id (the sample itself kept, so an id is never reused for another while it is here);
# a training run evaluates the same samples at every curve point. Bounded: the oldest half goes when it is full.
_CHECKED: dict[int, object] = {}
_CHECKED_MAX = 1 << 14


def _forget_checked() -> None:
    if len(_CHECKED) > _CHECKED_MAX:
        for key in list(_CHECKED)[: len(_CHECKED) // 2]:
            del _CHECKED[key]


# ------------------------------------------------------------------------------------------ memory of a workload
# Bytes a generated sample takes in memory (a Python `Sample`: its text, reference tuples and parameters), bounded by
# a constant plus a share per character of the task's longest text: measured with tracemalloc on every task's OOD
# preset (about 1.2-4.4 kB a sample, at most 68 bytes per character of the mean text) and rounded up for the longest.
SAMPLE_BYTES, SAMPLE_CHAR_BYTES = 400, 48
RECORD_BYTES = 600  # one per-token evaluation record: its row tuple (prediction, flags, AttnScores), then a table row
# one sample's row of the per-sample table a streamed evaluation keeps (8 numeric columns and the index: ~70 bytes,
# twice while the chunks are joined, and the length-bucket name and table of `aspan eval --buckets`), rounded up
RESULT_BYTES = 300


MEMORY_SHARE = 0.8  # a model or a workload may take at most this share of the memory available when it starts
ALL_GPUS = "cuda:*"  # the device of a model placed by a device_map: every visible GPU's free memory together


def available_bytes(device: str | None = None) -> int:
    """Memory this machine can give a new model now: free memory of a CUDA device (of all of them together for
    `ALL_GPUS`), else `MemAvailable` from /proc/meminfo (the free physical pages where that file is absent)."""
    if device is not None and str(device).startswith("cuda"):
        import torch

        if torch.cuda.is_available() and device == ALL_GPUS:
            return sum(int(torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count()))
        if torch.cuda.is_available():
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def refuse_over_memory(needed: int, what: str, detail: str, device: str | None = None, verb: str = "needs",
                       available: int | None = None) -> None:
    """UsageError "`what`: `verb` about N GB (`detail`), more than this machine can hold" when `needed` bytes exceed
    MEMORY_SHARE of the `available` bytes (default: `available_bytes(device)`, the device's for CUDA); nothing is
    allocated to find out."""
    have = available_bytes(device) if available is None else available
    if needed > MEMORY_SHARE * have:
        raise UsageError(f"{what}: {verb} about {_gb(needed)} ({detail}), more than this machine can hold "
                         f"({_gb(have)} available{' on ' + str(device) if device else ''})")


def _gb(n: int) -> str:
    return f"{n / 2**30:,.1f} GB" if n < 2**70 else "more than 10^12 GB"


def check_memory(needed: int, what: str, detail: str, device: str | None = None) -> None:
    """UsageError naming `what`, the estimate and its `detail` when `needed` bytes exceed the share of this machine's
    available memory (the device's, for CUDA) a workload may take; nothing is allocated to find out."""
    refuse_over_memory(needed, what, detail, device)


def sample_bytes(n: int, longest: int, records: bool = False) -> int:
    """Bytes `n` samples of texts up to `longest` characters take when held in a list (with `records`: plus one
    evaluation record per target character, at most `longest` of them)."""
    return n * (SAMPLE_BYTES + longest * (SAMPLE_CHAR_BYTES + (RECORD_BYTES if records else 0)))


def check_sample_memory(n: int, longest: int, what: str, records: bool = False) -> None:
    """`check_memory` for holding `n` generated samples (and, with `records`, their evaluation records)."""
    check_memory(sample_bytes(n, longest, records), what,
                 f"{n:,} samples of up to {longest} characters{', with per-token records' if records else ''}")


def check_eval_memory(n: int, longest: int, chunk: int, what: str) -> None:
    """`check_memory` for a streamed evaluation (`evaluation.evaluate_stream`) of `n` samples of texts up to `longest`
    characters: one chunk of samples with their per-token records, and the per-sample row kept for each of the `n`."""
    held = min(n, chunk)
    check_memory(n * RESULT_BYTES + sample_bytes(held, longest, records=True), what,
                 f"{n:,} samples of up to {longest} characters, {held:,} at a time with per-token records and "
                 f"{RESULT_BYTES} bytes kept per sample")


def forward_bytes(cfg, batch: int, n_tokens: int, training: bool) -> int:
    """Activations of one forward (and backward, when `training`) of `batch` sequences of `n_tokens` tokens on a
    model with TransformerLens config `cfg`: per layer and token the residual stream and its hook copies, q/k/v/z, the
    attention scores and pattern rows (`n_tokens` each per head) and the MLP; then the logits and their gradient."""
    d_model, n_heads, d_head = cfg.d_model, cfg.n_heads, cfg.d_head
    d_mlp = getattr(cfg, "d_mlp", None) or 4 * d_model
    per_layer = 8 * d_model + 4 * n_heads * d_head + 3 * d_mlp + 3 * n_heads * n_tokens
    per_token = cfg.n_layers * per_layer + 3 * cfg.d_vocab
    return 4 * batch * n_tokens * per_token * (2 if training else 1)


def check_batch_memory(cfg, batch: int, n_tokens: int, what: str, training: bool, device: str | None = None) -> None:
    """`check_memory` for one batch through the model (`forward_bytes`)."""
    check_memory(forward_bytes(cfg, batch, n_tokens, training), what,
                 f"activations of {batch:,} sequences of {n_tokens} tokens through {cfg.n_layers} layers x "
                 f"{cfg.n_heads} heads, d_model {cfg.d_model}{', forward and backward' if training else ''}", device)


def parse_shard(text: str) -> tuple[int, int]:
    """`"I/N"` (0 <= I < N: shard I of a grid split into N) -> (I, N); UsageError otherwise."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"must look like I/N with integers, got {text!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise UsageError(f"{text!r} is not a shard: need 0 <= I < N")
    return i, n
