"""The public surface: `import aspan` is light and its entry points resolve; `hooks` exports only what a user calls."""
import subprocess
import sys

import pytest

import aspan
import hooks


def test_import_aspan_loads_neither_torch_nor_transformer_lens():
    code = "import sys, aspan; print(sorted(m for m in ('torch', 'transformer_lens', 'pandas') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", aspan.__all__)
def test_every_entry_point_resolves_to_its_module_object(name):
    import importlib

    module, attr = aspan._EXPORTS[name]
    expected = importlib.import_module(module) if attr is None else getattr(importlib.import_module(module), attr)
    assert getattr(aspan, name) is expected
    assert name in dir(aspan)


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        aspan.nope  # noqa: B018


def test_readme_names_work_from_the_top_level():
    samples = aspan.preset("reversal", "id").generate(3, seed=0)
    assert all(isinstance(s, aspan.Sample) for s in samples)
    batch = aspan.make_batch(samples, aspan.CharTokenizer())
    assert batch.tokens.shape[0] == 3


def test_hooks_exports_only_user_functions():
    private = {"pattern_name", "scores_name", "rollout_step", "edit_pattern", "query_rows"}
    assert not any(n.startswith("check_") or n in private for n in hooks.__all__)
    for name in hooks.__all__:
        assert callable(getattr(hooks, name)), name
    for name in ("edit_pattern", "query_rows", "rollout_step", "scores_name"):
        assert not hasattr(hooks, name), name
    from hooks import check_heads, pattern_name  # for aspan's own use: importable, outside __all__

    assert check_heads([(0, 1)], 2, 2) == [(0, 1)] and pattern_name(1) == "blocks.1.attn.hook_pattern"


def test_option_sets_are_literal_aliases_with_their_tuples():
    from typing import get_args

    from aspan import options

    assert options.MODES == get_args(options.Mode) == ("teacher", "generate")
    assert options.DIRECTIONS == ("diagonal", "anti", "vertical", "aligned") == get_args(options.Direction)
    assert options.ROWS == get_args(options.Rows) == ("target", "all")
    assert set(options.RANK_KEYS) == {"score_sum", "score_row"}
    with pytest.raises(ValueError, match="mode must be one of 'teacher', 'generate', got 'greedy'"):
        options.check_option("mode", "greedy", options.MODES)
