"""Bring your own model: a HookedTransformer the user builds from a HookedTransformerConfig (not through
`aspan.models`) goes through training, evaluation, head ranking, every edit (reinforce, patch, steer) and the sweep
engine as it is, and so does a TransformerBridge the user boots; a tokenizer that is not aspan's is refused in one
line saying what to pass."""
from __future__ import annotations

import warnings

import pandas as pd
import pytest
import torch

import hooks
from aspan import tasks
from aspan.batching import make_batch
from aspan.evaluation import evaluate
from aspan.experiments.engine import Engine
from aspan.experiments.ranking import rank_heads, select_heads
from aspan.experiments.sweep import SweepConfig, run_sweep
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig, train

TASK = tasks.get("reversal", length=(1, 3), charset="abcd")


def user_model(tok: CharTokenizer) -> torch.nn.Module:
    """What a researcher writes: TransformerLens's own classes, none of aspan's builders."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_heads=4, d_head=8, d_mlp=64, n_ctx=64,
                                  d_vocab=tok.vocab_size, act_fn="gelu", normalization_type="LN",
                                  positional_embedding_type="rotary", rotary_dim=8, device="cpu")
    with warnings.catch_warnings(), torch.random.fork_rng():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.manual_seed(0)
        return HookedTransformer(cfg).eval()


@pytest.fixture(scope="module")
def mine():
    """(model, tokenizer): the user's model, trained with aspan's loop on reversal of 1-3 symbols over 'abcd'."""
    from aspan.environment import torch_threads

    tok = CharTokenizer()
    model = user_model(tok)
    with torch_threads(1):  # a tiny model: one thread is fastest on a busy machine
        train(model, tok, TASK, TrainConfig.scratch(steps=150, batch_size=32, lr=3e-3, warmup=10), progress=False)
    return model.eval(), tok


@pytest.fixture(scope="module")
def samples():
    return TASK.generate(16, seed=5)


def test_evaluate_scores_the_users_model_as_trained(mine, samples):
    model, tok = mine
    result = evaluate(model, tok, samples)
    assert result.summary()["exact"] >= 0.9  # it learnt the task through aspan's training loop
    untrained = evaluate(user_model(tok), tok, samples).summary()
    assert untrained["exact"] <= 0.1
    batch = make_batch(samples, tok)  # the records are the model's own teacher-forced argmax
    with torch.no_grad():
        argmax = model(batch.tokens).argmax(-1)
    expected = float((argmax[batch.target_rows] == batch.labels[batch.target_rows]).float().mean())
    assert result.records["correct"].mean() == pytest.approx(expected)


def test_rank_heads_and_every_edit_act_on_the_users_model(mine, samples):
    model, tok = mine
    ranking = rank_heads(model, tok, samples, deltas=[0])
    assert len(ranking) == 8 and sorted(ranking["rank"]) == list(range(1, 9))
    heads = select_heads(ranking, top=2)
    base = evaluate(model, tok, samples, heads=heads).summary()
    edits = {
        "reinforce": lambda b: hooks.reinforce(heads, mask=b.ref_mask, strength=2.0),
        "patch": lambda b: hooks.patch_pattern(heads, mask=b.ref_mask),
        "steer": lambda b: hooks.steer(heads, mask=b.ref_mask, alpha=0.01),
    }
    for name, edit in edits.items():
        got = evaluate(model, tok, samples, fwd_hooks=edit, heads=heads).summary()
        assert got["attn_heads_sample"] > base["attn_heads_sample"] + 0.05, name  # more attention on the references
        assert not any(h._forward_hooks for h in model.hook_dict.values()), name  # no hook left on the model
    patched = evaluate(model, tok, samples, fwd_hooks=edits["patch"], heads=heads).summary()
    assert patched["attn_heads_sample"] == pytest.approx(1.0)  # every row of those heads on its references


SWEEP = {"task": "reversal", "split": "ood", "task_params": {"length": [4, 5], "charset": "abcd"},
         "id_params": {"length": [1, 3], "charset": "abcd"}, "n_samples": 4, "batch_size": 4, "strengths": [0.5, 3.0],
         "heads": {"list": [[1, 0], [1, 1]]}}


def test_the_sweep_engine_runs_on_the_users_model(mine, tmp_path):
    model, tok = mine
    config = SweepConfig.from_dict(SWEEP)  # no model entry: the model object is passed
    rows = run_sweep(config, tmp_path / "rows.jsonl", model=model, tokenizer=tok, progress=False)
    assert len(rows) == 2 and set(rows.strength) == {0.5, 3.0}
    assert rows.model.nunique() == 1 and rows.model[0].startswith("in-memory:")
    plain = evaluate(model, tok, config.data().samples("selection", 0)).summary()
    assert (rows.baseline_exact == plain["exact"]).all()
    strong, weak = rows.set_index("strength").loc[3.0], rows.set_index("strength").loc[0.5]
    assert strong.attn_heads_sample > weak.attn_heads_sample
    assert isinstance(rows, pd.DataFrame)


def test_a_sweep_of_an_unnamed_model_resumes_only_its_own_rows(mine, tmp_path):
    """The rows of a model object are named by its weights and tokenizer: the same model resumes its rows, another
    model (the untrained one) gets rows of its own in the same file, and a config naming no model needs the object
    (a config file, which `aspan sweep` runs, must name it)."""
    model, tok = mine
    config, path = SweepConfig.from_dict(SWEEP), tmp_path / "rows.jsonl"
    first = run_sweep(config, path, model=model, tokenizer=tok, progress=False)
    again = run_sweep(config, path, model=model, tokenizer=tok, progress=False, limit=0)
    assert again.equals(first)  # resumed: no new row
    other = run_sweep(config, path, model=user_model(tok), tokenizer=tok, progress=False)
    assert len(other) == 2 and set(other.model).isdisjoint(first.model)
    assert len(path.read_text().splitlines()) == 4
    with pytest.raises(ValueError, match="run_sweep: the sweep config names no model: set its model .* or pass the "
                                         "model object"):
        run_sweep(config, tmp_path / "none.jsonl", progress=False)
    file = tmp_path / "sweep.toml"
    file.write_text('task = "reversal"\nstrengths = [1.0]\n[heads]\nlist = [[0, 0]]\n')
    with pytest.raises(ValueError, match="missing required key 'model'"):
        SweepConfig.from_toml(file)


@pytest.mark.parametrize("what", ["none", "hf"])
def test_a_tokenizer_that_is_not_aspans_says_what_to_pass(mine, samples, what):
    from .models.hf_fixtures import char_tokenizer

    model, _ = mine
    wrong = model.tokenizer if what == "none" else char_tokenizer()  # None, or a bare Hugging Face tokenizer
    calls = {
        "evaluate": lambda: evaluate(model, wrong, samples),
        "rank_heads": lambda: rank_heads(model, wrong, samples),
        "make_batch": lambda: make_batch(samples, wrong),
        "train": lambda: train(model, wrong, TASK, TrainConfig.scratch(steps=1), progress=False),
        "experiment engine": lambda: Engine(model, wrong, SweepConfig.from_dict(
            {"model": "m", "task": "reversal", "strengths": [1.0], "heads": {"list": [[0, 0]]}},
            check_model=False).data()),
    }
    before = [p.detach().clone() for p in model.parameters()]
    for where, call in calls.items():
        with pytest.raises(TypeError) as e:
            call()
        text = str(e.value)
        assert "\n" not in text and text.startswith(f"{where}: tokenizer: got {type(wrong).__name__}")
        assert "aspan.CharTokenizer()" in text and "HFCharAdapter(hf_tokenizer)" in text
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # refused before any work


def test_a_bridge_the_user_boots_goes_through_the_same_calls(tmp_path):
    """A TransformerBridge the user boots from a Hugging Face directory (TransformerLens's defaults: weights processed
    in compatibility mode), with its tokenizer behind aspan's character adapter: evaluation, ranking and every edit."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    from aspan.hf_tokenization import HFCharAdapter

    from .models.hf_fixtures import save_random_model

    save_random_model("llama", tmp_path / "llama")
    bridge = TransformerBridge.boot_transformers(str(tmp_path / "llama"), device="cpu")
    bridge.enable_compatibility_mode(disable_warnings=True)
    tok = HFCharAdapter(AutoTokenizer.from_pretrained(str(tmp_path / "llama")))
    samples = tasks.get("reversal", length=(2, 4), charset="abcd").generate(4, seed=0)
    heads = select_heads(rank_heads(bridge, tok, samples), top=2)
    base = evaluate(bridge, tok, samples, heads=heads).summary()["attn_heads_sample"]
    for edit in (lambda b: hooks.reinforce(heads, mask=b.ref_mask, strength=2.0),
                 lambda b: hooks.patch_pattern(heads, mask=b.ref_mask),
                 lambda b: hooks.steer(heads, mask=b.ref_mask, alpha=0.01)):
        assert evaluate(bridge, tok, samples, fwd_hooks=edit, heads=heads).summary()["attn_heads_sample"] > base + 0.2
    with pytest.raises(TypeError, match="HFCharAdapter"):
        evaluate(bridge, AutoTokenizer.from_pretrained(str(tmp_path / "llama")), samples)
