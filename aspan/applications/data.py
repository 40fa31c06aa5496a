"""`aspan data` and `aspan show` as functions a notebook can call: a task preset from key=value overrides, task
samples written as JSONL (one `Sample.to_dict()` per line, atomically), samples printed with each target character's
reference positions marked, and the list of tasks with their parameters and presets.

    from aspan.applications.data import task_preset, write_samples
    write_samples(task_preset("reversal", "ood", ["length=11-20"]), 100, seed=0, output="ood.jsonl")
"""
from __future__ import annotations

import json
import sys
from typing import Iterator, Sequence

from tqdm import tqdm

from .. import stopping, tasks
from ..checks import check_sample_memory
from ..errors import UsageError
from ..io import write_lines
from ..tasks import Sample
from ..tasks.params import parse_params, task_defaults

TASK_NAMES, SPLITS = tasks.NAMES, tasks.SPLITS
# The longest sample text `aspan data` and `aspan show` generate: a thousand times the longest context of the models
# studied here. One sample of 10^8 characters took 5.3 GB and 40 s before anything was written.
MAX_SAMPLE_CHARS = 1_000_000


def check_lengths(task: tasks.Task) -> None:
    """UsageError naming the task's length parameter when its samples can be longer than `MAX_SAMPLE_CHARS`, or when
    one of them (generated, held, and written or rendered) would not fit in the memory available; before any is
    generated."""
    longest = task.max_text_len()
    what = f"--param {task.length_param}={_range(task.params().get(task.length_param))}" if task.length_param \
        else "the task's parameters"
    if longest > MAX_SAMPLE_CHARS:
        raise UsageError(f"{what}: {task.name} samples of up to {longest:,} characters; at most "
                         f"{MAX_SAMPLE_CHARS:,} are generated (a thousand times any model's context here)")
    check_sample_memory(2, longest, what)  # the sample and its written or rendered text


def _range(value) -> str:
    return "-".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def task_preset(name: str | None, split: str, params: Sequence[str] = ()) -> tasks.Task:
    """Task `name` with its `split` preset and the key=value `params` overrides (one-line ValueError on a missing or
    unknown task or parameter)."""
    if not name:
        raise ValueError(f"a TASK is required; choose one of {', '.join(tasks.NAMES)}")
    tasks.task_class(name)  # unknown task: clear error before parsing parameters
    return tasks.preset(name, split, **parse_params(name, list(params)))


def describe_tasks() -> str:
    """Every task with its parameters (constructor defaults) and the full ID/OOD preset parameters."""
    out = []
    for name in tasks.NAMES:
        fmt = lambda d: "  ".join(f"{k}={v!r}" for k, v in d.items())  # noqa: E731
        doc = (sys.modules[tasks.task_class(name).__module__].__doc__ or "").strip()
        out += [f"{name}: {doc.splitlines()[0]}" if doc else name,
                f"  parameters: {fmt(task_defaults(name))}"]
        out += [f"  {split:<3}: {fmt(tasks.preset(name, split).params())}" for split in tasks.SPLITS]
    return "\n".join(out)


def write_samples(task: tasks.Task, n: int, seed: int = 0, output: str = "-", desc: str | None = None,
                  progress: bool = True) -> None:
    """`n` samples of `task` from `seed` as JSONL to `output` (a file, written atomically with a progress bar
    labelled `desc` unless `progress` is False; '-' for stdout, without one)."""
    if n < 0:
        raise ValueError(f"-n must be >= 0, got {n}")
    check_lengths(task)
    stream = task.stream(seed)
    bar = tqdm(range(n), desc=desc or task.name, disable=True if output == "-" or not progress else None)
    lines = (next(stream).to_json() for _ in bar)
    if output == "-":
        for line in lines:
            sys.stdout.write(line + "\n")
            stopping.check()  # a safe point between samples
        sys.stdout.flush()
    else:
        write_lines(output, lines)


def show_samples(task: tasks.Task, n: int, seed: int = 0, width: int = 100, split: str | None = None) -> Iterator[str]:
    """A header naming the task (its `split` preset), seed and parameters, then `n` samples, each `render`ed: the
    text `aspan show` prints, a block at a time (`-n` may be large; checked before the first)."""
    if n < 0:
        raise ValueError(f"-n must be >= 0, got {n}")
    check_lengths(task)
    return _shown(task, n, seed, width, split)


def _shown(task: tasks.Task, n: int, seed: int, width: int, split: str | None) -> Iterator[str]:
    yield f"# {task.name} [{split}] seed={seed} {json.dumps(task.params(), sort_keys=True)}"
    stream = task.stream(seed)  # one sample at a time
    for i, sample in enumerate(next(stream) for _ in range(n)):
        yield f"\n## sample {i}: " + render(sample, width)


def _positions(sample: Sample, refs: tuple[int, ...]) -> str:
    """`12='1' 13='f'`, runs of 4+ consecutive positions shortened to `0..49`."""
    out, i, refs = [], 0, sorted(refs)
    while i < len(refs):
        k = i
        while k + 1 < len(refs) and refs[k + 1] == refs[k] + 1:
            k += 1
        if k - i >= 3:
            out.append(f"{refs[i]}..{refs[k]}")
        else:
            out += [f"{p}={sample.text[p]!r}" for p in refs[i : k + 1]]
        i = k + 1
    return " ".join(out) or "(nothing)"


def render(sample: Sample, width: int = 100) -> str:
    """The text, then one line per target char: a marker line (`^` references, `*` the char) when the text fits
    `width`, otherwise just the referenced positions."""
    text, n = sample.text, sample.prompt_len
    lines = [f"prompt {n} chars, target {len(text) - n}: {sample.target!r}", text]
    fits = len(text) + 2 <= width
    for j, refs in enumerate(sample.references):
        label = f"t{j}={sample.target[j]!r} <- {_positions(sample, refs)}"
        if fits:
            marks = ["^" if p in refs else " " for p in range(len(text))]
            marks[n + j] = "*"
            lines.append("".join(marks).rstrip() + "  " + label)
        else:
            lines.append(label)
    return "\n".join(lines)
