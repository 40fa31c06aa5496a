"""Every boolean option of the hooks takes True or False only (a truthy "no" would switch it on), and the positions
`capture` keeps are checked by name: a float, a negative position or one past the pattern is a one-line ValueError,
not a raw torch error from inside a hook.

The boolean options are found by introspection (the `bool` fields of the options classes and the `bool` parameters
of every public function of the package), so a new one must be added to `CALLS` below or this test fails."""
import dataclasses
import importlib
import inspect
import pkgutil

import numpy as np
import pytest
import torch

import hooks
import hooks.options
from tests.conftest import padded_batch

HEADS = [(0, 1), (1, 0)]


def boolean_options() -> set[str]:
    """`Class.field` and `module.function(param)` of every option typed bool in `hooks`."""
    found = set()
    for _, kind in inspect.getmembers(hooks.options, inspect.isclass):
        if dataclasses.is_dataclass(kind) and kind.__module__ == "hooks.options":
            found |= {f"{kind.__name__}.{f.name}" for f in dataclasses.fields(kind) if f.type in ("bool", bool)}
    for info in pkgutil.walk_packages(hooks.__path__, "hooks."):
        module = importlib.import_module(info.name)
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("_") or fn.__module__ != module.__name__:
                continue
            for p in inspect.signature(fn).parameters.values():
                if p.annotation in ("bool", bool):
                    found.add(f"{module.__name__}.{name}({p.name})")
    return found


def _model():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=16, d_vocab=10, act_fn="relu",
                                  seed=0)
    return HookedTransformer(cfg)


TOKENS, _, MASK = padded_batch([8, 8], pos=8, seed=3)
TOKENS = TOKENS % 10
A = torch.softmax(torch.randn(2, 8, 8), -1)


# How to call each boolean option with `value` (the other arguments valid)
CALLS = {
    "ReinforceOptions.renormalize": lambda v, m: hooks.ReinforceOptions(renormalize=v),
    "hooks.reinforce.edit_pattern(renormalize)": lambda v, m: importlib.import_module("hooks.reinforce").edit_pattern(
        A[:, None].clone(), MASK, 0.5, renormalize=v),
    "hooks.rollout.rollout(normalize)": lambda v, m: hooks.rollout(m, TOKENS, normalize=v),
    "hooks.rollout.rollout_scores(normalize)": lambda v, m: hooks.rollout_scores(m, TOKENS, MASK, normalize=v),
    "hooks.rollout.rollout_step(normalize)": lambda v, m: importlib.import_module("hooks.rollout").rollout_step(
        None, A.clone(), normalize=v),
    "hooks.rollout.rollout_step(causal)": lambda v, m: importlib.import_module("hooks.rollout").rollout_step(
        A.clone(), A.clone(), causal=v),
    # the same options as keywords of the functions that take them
    "reinforce(renormalize=)": lambda v, m: hooks.reinforce(HEADS, MASK, 0.5, renormalize=v),
    "reinforce(options=)": lambda v, m: hooks.reinforce(HEADS, MASK, 0.5, options=hooks.ReinforceOptions(
        renormalize=v)),
}
KEYWORD_FORMS = {"reinforce(renormalize=)", "reinforce(options=)"}
NOT_BOOL = ["no", "", "False", 1, 0, 0.0, None, torch.tensor(True), np.bool_(True), [True]]


def test_every_boolean_option_is_covered():
    assert boolean_options() == set(CALLS) - KEYWORD_FORMS


@pytest.fixture(scope="module")
def small():
    return _model()


@pytest.mark.parametrize("option", sorted(CALLS))
def test_a_boolean_option_takes_only_a_bool(option, small):
    name = option.split("(")[-1].rstrip(")=").split(".")[-1] if "(" in option else option.split(".")[-1]
    name = "renormalize" if option.startswith("reinforce(") else name
    for value in NOT_BOOL:
        with pytest.raises(TypeError, match=rf"^{name} must be True or False, got "):
            CALLS[option](value, small)
    for value in (True, False):
        CALLS[option](value, small)


def test_renormalize_no_does_not_renormalise(small):
    """The reported case: `renormalize="no"` used to renormalise (any truthy value did)."""
    with pytest.raises(TypeError, match="renormalize"):
        hooks.reinforce(HEADS, MASK, 0.5, renormalize="no")
    with pytest.raises(TypeError, match="renormalize"):
        hooks.reinforce(HEADS, MASK, 0.5, options=hooks.ReinforceOptions(threshold=0.1), renormalize=1)


# ----------------------------------------------------------------------------------------------- capture positions
@pytest.mark.parametrize("option", ["rows", "cols"])
@pytest.mark.parametrize("value,words", [
    ([100], "position 100 out of range 0..7"),
    ([3, 8], "position 8 out of range 0..7"),
    (torch.tensor([9]), "position 9 out of range 0..7"),
    ([-1], "position -1 is negative"),
    (torch.tensor([2, -3]), "position -3 is negative"),
    ([0.5], "must hold integer positions, got 0.5"),
    ([True], "must hold integer positions, got True"),
    (["1"], "must hold integer positions, got '1'"),
    (torch.tensor([0.5]), "1-d integer tensor"),
    (torch.tensor([True]), "1-d integer tensor"),
    (torch.tensor([[1]]), "1-d integer tensor"),
    ("1", "got str"),
    (3, "got int"),
    (slice(0.5, 3), "slice of ints"),
    (slice(None, None, -1), "step >= 1"),
    (slice(0, 4, 0), "step >= 1"),
])
def test_capture_positions_are_checked_by_name(small, option, value, words):
    with pytest.raises(ValueError) as e:
        hooks.capture(small, TOKENS, HEADS, **{option: value})
    message = str(e.value)
    assert message.startswith(option) and words in message and "\n" not in message, message


def test_the_bad_positions_fail_before_or_at_the_first_forward_and_good_ones_crop(small):
    store = {}
    with pytest.raises(ValueError, match="rows"):  # a float fails while the hooks are built, before any forward
        hooks.capture_hooks(HEADS, store, rows=[0.5])
    fwd = hooks.capture_hooks(HEADS, store, cols=[20])  # past the pattern: known only at the forward
    with pytest.raises(ValueError, match=r"^cols: position 20 out of range 0\.\.7"):
        small.run_with_hooks(TOKENS, fwd_hooks=fwd)
    _, cache = small.run_with_cache(TOKENS)
    for rows, cols in (([7, 0, 7], np.array([1, 2])), (torch.tensor([3]), range(8)), (slice(2, 100), [])):
        got = hooks.capture(small, TOKENS, [(1, 1)], rows=rows, cols=cols)[(1, 1)]
        want = cache["pattern", 1][:, 1][:, torch.arange(8)[rows] if isinstance(rows, slice) else
                                           torch.as_tensor(rows)][:, :, torch.as_tensor(list(cols), dtype=torch.long)]
        assert torch.equal(got, want)


def test_offset_bias_keys_are_integer_offsets():
    for bad in (0.5, "1", True):
        with pytest.raises(ValueError, match="per_offset keys must be integer offsets"):
            hooks.offset_bias({bad: 1.0})
    assert hooks.offset_bias({np.int64(1): 2.0})(2, 2).tolist() == [[0.0, 0.0], [2.0, 0.0]]
