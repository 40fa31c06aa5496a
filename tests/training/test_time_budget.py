"""The time budget of a GPU slice (`time_budget`): a training paused at its deadline continues exactly, a running one
is checkpointed every `checkpoint_s`, and a run starts clean of gradients an earlier run left behind."""
import itertools
import json

import pytest
import torch

from aspan.training import (
    BudgetSpent,
    TimeBudget,
    current_budget,
    latest_checkpoint,
    time_budget,
    train,
    train_resumable,
)

from .test_training import TASK, TOK, tiny
from .test_training import cfg as base_cfg


def cfg(**kw):
    return base_cfg(**{"steps": 8, "device": "cpu", **kw})


def ticks(start=0.0):
    """A clock that advances one unit per reading."""
    counter = itertools.count(start)
    return lambda: float(next(counter))


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("deadline", [2, 4, 7])
def test_a_paused_run_resumes_to_the_same_weights_and_curves(tmp_path, deadline):
    held_out = {"id": TASK.generate(6, seed=9)}
    straight = train_resumable(tmp_path / "a", tiny(), TOK, TASK, cfg(curve_every=2), progress=False,
                               curve_data=held_out)
    with pytest.raises(BudgetSpent) as paused:
        with time_budget(TimeBudget(deadline, 1000, ticks())):
            train_resumable(tmp_path / "b", tiny(), TOK, TASK, cfg(curve_every=2), progress=False,
                            curve_data=held_out)
    assert 0 < paused.value.step < 8 and latest_checkpoint(tmp_path / "b").name == f"step-{paused.value.step:08d}"
    resumed = train_resumable(tmp_path / "b", tiny(seed=3), TOK, TASK, cfg(curve_every=2), progress=False,
                              curve_data=held_out)
    assert all(torch.equal(p, q) for p, q in zip(weights(straight.model), weights(resumed.model)))
    curves = lambda r: [(x["step"], x["exact"], x["loss"]) for x in r.history if x.get("kind") == "curve"]  # noqa
    assert curves(resumed) == curves(straight)
    assert not (tmp_path / "b").exists(), "the scratch directory goes once the run ends"


def test_a_running_training_is_checkpointed_every_checkpoint_s(tmp_path, monkeypatch):
    from aspan.training import loop

    saved, save = [], loop._checkpoint
    monkeypatch.setattr(loop, "_checkpoint", lambda run, step: (saved.append(step), save(run, step)))
    # the clock is read at the start (0), by the check before the first step (1) and once after every step (2, 3,
    # ...): with checkpoint_s 3 the run is checkpointed after steps 2 and 5 (clock 3 and 6), and at its end
    with time_budget(TimeBudget(10**6, 3, ticks())):
        train(tiny(), TOK, TASK, cfg(), out_dir=tmp_path, progress=False)
    assert saved == [2, 5, 8]
    saved.clear()
    train(tiny(), TOK, TASK, cfg(), out_dir=tmp_path / "plain", progress=False)
    assert saved == [8], "without a budget only the end is checkpointed (ckpt_every 0)"


def test_a_budget_spent_before_the_first_step_saves_nothing(tmp_path):
    with pytest.raises(BudgetSpent, match="after step 0 \\(nothing new to save\\)"):
        with time_budget(TimeBudget(0, 10, ticks())):
            train(tiny(), TOK, TASK, cfg(), out_dir=tmp_path, progress=False)
    assert latest_checkpoint(tmp_path) is None


def test_the_budget_is_scoped_to_its_block():
    assert current_budget() is None
    with time_budget(TimeBudget(5)) as b:
        assert current_budget() is b
    assert current_budget() is None
    train(tiny(), TOK, TASK, cfg(steps=2), progress=False)  # no budget: nothing pauses


def test_gradients_left_on_frozen_tensors_do_not_change_a_run():
    clean = train(tiny(), TOK, TASK, cfg(train_only="qk"), progress=False).model
    dirty = tiny()
    for p in dirty.parameters():  # what an earlier run that trained other tensors leaves behind
        p.grad = torch.full_like(p, 100.0)
    dirty = train(dirty, TOK, TASK, cfg(train_only="qk"), progress=False).model
    assert all(torch.equal(p, q) for p, q in zip(weights(clean), weights(dirty)))


def test_the_paused_run_writes_no_stop_row(tmp_path):
    with pytest.raises(BudgetSpent):
        with time_budget(TimeBudget(4, 1000, ticks())):
            train(tiny(), TOK, TASK, cfg(), out_dir=tmp_path, progress=False)
    log = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert not [r for r in log if r["kind"] == "stop"] and not (tmp_path / "config.json").exists()
