"""The backend seam: everything that differs between the classes that run a model is a member of `ModelBackend`
(aspan/models/backend.py); no other module branches on a backend's name."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from aspan.models import backend as b
from aspan.options import BACKENDS

ROOT = Path(__file__).resolve().parents[2]


def name_branches(source: str) -> list[int]:
    """Lines of `source` that compare something with a backend's name ("hooked", "bridge")."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(x, ast.Constant) and x.value in BACKENDS for x in sides):
                found.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and isinstance(node.value, ast.Constant) \
                and node.value.value in BACKENDS:
            found.append(node.lineno)
    return found


def test_the_checker_finds_an_injected_branch():
    assert name_branches('if backend == "bridge":\n    pass\n') == [1]
    assert name_branches('x = "hooked" != name') == [1]
    assert name_branches('match backend:\n    case "hooked":\n        pass\n') == [2]
    assert name_branches('backend_named(backend).keeps_masks') == []


def test_no_module_outside_the_seam_branches_on_a_backend_name():
    seam = ROOT / "aspan" / "models" / "backend.py"
    offenders = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "aspan").rglob("*.py")) if p != seam
                 for lines in [name_branches(p.read_text())] if lines}
    assert offenders == {}


def test_every_registered_backend_implements_the_whole_contract():
    members = [n for n in b.ModelBackend.__dict__ if not n.startswith("_")] + list(b.ModelBackend.__annotations__)
    assert {"fresh", "from_hooked", "from_form", "from_hf_dir", "from_hf_model", "keeps_masks"} <= set(members)
    assert set(b.REGISTRY) == set(BACKENDS)
    for name, backend in b.REGISTRY.items():
        assert backend.name == name
        missing = [m for m in members if not hasattr(backend, m)]
        assert missing == [], (name, missing)
        assert b.backend_named(name) is backend


def test_an_unknown_backend_name_is_one_line():
    with pytest.raises(ValueError, match="backend must be one of 'hooked', 'bridge', got 'jax'"):
        b.backend_named("jax")


def test_memory_traits_differ_as_the_classes_do():
    """A HookedTransformer holds attention masks and converts a second copy of Hugging Face weights; the bridge
    wraps the Hugging Face model's own tensors."""
    assert (b.HOOKED.keeps_masks, b.HOOKED.converts_weights, b.HOOKED.takes_device_map) == (True, True, False)
    assert (b.BRIDGE.keeps_masks, b.BRIDGE.converts_weights, b.BRIDGE.takes_device_map) == (False, False, True)
