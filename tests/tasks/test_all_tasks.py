"""Every task, both presets: independent solver, sufficiency, alphabet, length bound, determinism, OOD really longer."""
import json
import os
import random
import subprocess
import sys

import pytest

from aspan import tasks
from tests.tasks.sufficiency import check_sufficiency

N = {"id": 300, "ood": 150}
CASES = [(name, split) for name in tasks.NAMES for split in tasks.SPLITS]


@pytest.mark.parametrize("name, split", CASES)
def test_solver_sufficiency_alphabet_length(name, split):
    task = tasks.preset(name, split)
    rng = random.Random(f"{name}-{split}")
    alphabet = set(task.alphabet)
    checked = 0
    for s in task.generate(N[split], seed=11):
        assert s.task == name and s.params == task.params()
        assert task.solve_like(s.prompt, s.target) == s.target
        assert set(s.text) <= alphabet, set(s.text) - alphabet
        assert len(s.text) <= task.max_text_len()
        assert len(s.references) == len(s.target)
        assert all(list(r) == sorted(set(r)) for r in s.references), "references must be sorted and unique"
        assert tasks.Sample.from_dict(json.loads(s.to_json())) == s
        checked += check_sufficiency(task, s, rng, tries_per_row=max(2, 10 // len(s.references)))
    assert checked >= N[split], f"only {checked} perturbations checked"


@pytest.mark.parametrize("name, split", CASES)
def test_alphabet_sorted_unique(name, split):
    """Task.alphabet's contract (base.py): sorted, no duplicates."""
    a = tasks.preset(name, split).alphabet
    assert a == "".join(sorted(set(a)))


@pytest.mark.parametrize("name", tasks.NAMES)
def test_ood_is_longer(name):
    ids, ood = tasks.preset(name, "id"), tasks.preset(name, "ood")
    longest_id = max(len(s.text) for s in ids.generate(300, seed=1))
    assert longest_id <= ids.max_text_len()
    assert min(len(s.text) for s in ood.generate(300, seed=1)) > ids.max_text_len()
    assert ood.max_text_len() > ids.max_text_len()


@pytest.mark.parametrize("name", tasks.NAMES)
def test_params_round_trip(name):
    for split in tasks.SPLITS:
        task = tasks.preset(name, split)
        again = tasks.from_params(name, json.loads(json.dumps(task.params())))
        assert again.params() == task.params()
        assert again.generate(20, seed=4) == task.generate(20, seed=4)
        assert task.generate(20, seed=4) != task.generate(20, seed=5)


_SCRIPT = """
import sys
from aspan import tasks
from aspan.cli import main
for name in tasks.NAMES:
    for split in tasks.SPLITS:
        out = f"{sys.argv[1]}/{name}-{split}.jsonl"
        assert main(["data", "--task", name, "--split", split, "-n", "40", "--seed", "9", "-o", out]) == 0
"""


def test_same_seed_same_jsonl_across_processes_and_hash_seeds(tmp_path):
    outs = []
    for hashseed in ("0", "12345"):
        d = tmp_path / hashseed
        d.mkdir()
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        r = subprocess.run(
            [sys.executable, "-c", _SCRIPT, str(d)], capture_output=True, text=True, env=env, timeout=300
        )
        assert r.returncode == 0, r.stderr
        outs.append({p.name: p.read_text() for p in d.iterdir()})
    assert len(outs[0]) == 2 * len(tasks.NAMES)
    assert outs[0] == outs[1]
    for name, split in CASES:  # and equal to this process's samples
        lines = outs[0][f"{name}-{split}.jsonl"].splitlines()
        assert lines == [s.to_json() for s in tasks.preset(name, split).generate(40, seed=9)]


@pytest.mark.parametrize("name", tasks.NAMES)
def test_task_facts_live_on_the_task(name):
    """The instruction a pretrained model gets, the length parameter buckets set and the demo's OOD overrides are
    attributes of the task class, each usable as it is."""
    cls = tasks.task_class(name)
    assert isinstance(cls.instruction, str) and cls.instruction.strip()
    ood = tasks.preset(name, "ood")
    assert cls.length_param in ood.params() and ood.params() != tasks.preset(name, "id").params()
    narrowed = cls(**{**ood.params(), cls.length_param: (3, 3)})
    assert narrowed.params()[cls.length_param] == [3, 3] and narrowed.generate(2, seed=0)
    if cls.length_is_target:
        assert {len(s.target) for s in narrowed.generate(20, seed=0)} == {3}
    for overrides in (cls.demo_ood, cls.quick_ood):
        assert set(overrides) <= set(ood.params())
        assert tasks.preset(name, "ood", **overrides).params() == {**ood.params(), **{
            k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()}}


def test_task_facts_of_reversal():
    cls = tasks.task_class("reversal")
    assert (cls.length_param, cls.demo_ood, cls.quick_ood) == ("length", {"length": (11, 20)}, {"length": (11, 14)})
    lengths = {n: (tasks.task_class(n).length_param, tasks.task_class(n).length_is_target) for n in tasks.NAMES}
    assert lengths == {"reversal": ("length", True), "addition": ("digits", False), "multiplication": ("digits", False),
                       "flipflop": ("instructions", False), "assign": ("length", True), "successor": ("numbers", False),
                       "parity": ("length", True)}
