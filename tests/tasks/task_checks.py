"""Generic checks shared by the per-task tests: solver agreement, reference validity, sufficiency, determinism."""
from __future__ import annotations

import json
import random

from aspan.tasks import Sample, Task, from_params
from tests.tasks.sufficiency import check_sufficiency


def check_samples(task: Task, n: int, seed: int = 0, tries_per_row: int = 2) -> tuple[list[Sample], int]:
    """Generate `n` samples, assert the `Sample` contract on each; return them and the sufficiency perturbation
    count."""
    rng = random.Random(seed + 1)
    samples = task.generate(n, seed)
    assert task.alphabet == "".join(sorted(set(task.alphabet))), "alphabet must be sorted, without duplicates"
    alphabet = set(task.alphabet)
    checked = 0
    for s in samples:
        assert s.task == task.name and s.params == task.params()
        assert len(s.text) <= task.max_text_len()
        assert set(s.text) <= alphabet
        assert task.solve_like(s.prompt, s.target) == s.target
        for j, refs in enumerate(s.references):
            assert list(refs) == sorted(set(refs)), f"refs of row {j} not sorted/unique: {refs}"
            assert all(0 <= p < s.prompt_len + j for p in refs)
        assert Sample.from_dict(json.loads(s.to_json())) == s
        assert task.rebuild(s.prompt, s.target) == s  # the reference builder a file's samples are checked with
        checked += check_sufficiency(task, s, rng, tries_per_row=tries_per_row)
    return samples, checked


def check_determinism(task: Task) -> None:
    """Same seed -> same samples; different seeds differ; params round-trip through JSON."""
    a, b, c = task.generate(50, seed=3), task.generate(50, seed=3), task.generate(50, seed=4)
    assert a == b
    assert a != c
    rebuilt = from_params(task.name, json.loads(json.dumps(task.params())))
    assert rebuilt.params() == task.params()
    assert rebuilt.generate(20, seed=5) == task.generate(20, seed=5)
