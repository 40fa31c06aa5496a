"""A new attention edit method is a kernel plus one `Rule` in `aspan.methods.RULES`: a toy method defined here (its
kernel and strength check below, its rule registered for the test's duration) runs through `Edit`, the sweep grid,
the engine, the search's atoms and `aspan rank --method` with no other file changed; the rules load no torch."""
import subprocess
import sys

import pytest
import torch

import hooks
from aspan.experiments import engine as E
from aspan.experiments.edit import Edit, setting_label
from aspan.experiments.sweep import SweepConfig, grid
from aspan.io import settings_key
from aspan.methods import RULES, Rule

DATA = E.Data("reversal", ood_params={"length": [11, 12]}, n=4)
HEADS = [(1, 0), (1, 2)]


def check_factor(factor: float) -> float:
    if factor <= 0:
        raise ValueError(f"factor must be > 0, got {factor}")
    return factor


def scale_refs(heads, mask, *, factor, delta=0, model=None, rows=None, gate_below=None):
    """Toy kernel: each head's attention on its references (shifted by `delta`) multiplied by `factor`, rows
    renormalised; `rows` restricts the edited rows."""
    if gate_below is not None:
        raise ValueError("scale_refs takes no gate_below")
    refs = hooks.shift_mask(mask, delta)
    refs = refs if rows is None else refs & rows[..., None]
    layers = sorted({layer for layer, _ in heads})

    def make(layer):
        index = [h for l, h in heads if l == layer]

        def hook(pattern, hook):
            q, k = pattern.shape[-2:]
            weight = torch.where(refs[:, None, k - q:k, :k].to(pattern.device), factor, 1.0)
            out = pattern.clone()
            scaled = pattern[:, index] * weight
            out[:, index] = scaled / scaled.sum(-1, keepdim=True)
            return out

        return hook

    return [(hooks.pattern_name(layer), make(layer)) for layer in layers]


@pytest.fixture
def toy(monkeypatch):
    rule = Rule(f"{__name__}:scale_refs", lambda e: f"scale x{e.strength:g}", {"strength": "factor"}, 2.0,
                f"{__name__}:check_factor")
    monkeypatch.setitem(RULES, "scale", rule)
    return rule


def test_a_rule_is_checked_when_it_is_made():
    for bad, words in (({"kernel": "scale_refs"}, "module:function"), ({"params": {"alpha": "a"}}, "params"),
                       ({"strength": None}, "default strength")):
        fields = {"kernel": f"{__name__}:scale_refs", "describe": str, "params": {"strength": "factor"},
                  "strength": 2.0, **bad}
        with pytest.raises(ValueError, match=words):
            Rule(**fields)


def test_toy_method_is_validated_stored_and_described_by_its_rule(toy):
    assert Edit("scale").strength == 2.0
    with pytest.raises(ValueError, match="factor must be > 0"):
        Edit("scale", strength=0.0)
    with pytest.raises(ValueError, match="scale takes no threshold"):
        Edit("scale", threshold=0.1)
    edit = Edit("scale", 1, 3.0, below=0.5)
    assert edit.to_dict() == {"method": "scale", "strength": 3.0, "threshold": None, "renormalize": False,
                              "delta": 1, "gate": "below:0.5"}
    assert Edit.from_dict(edit.to_dict()) == edit and Edit.from_atom(edit.on([(1, 2)]).to_atom()) == edit.on([(1, 2)])
    assert edit.label == "scale x3 at ref+1 (head mass < 0.5)"
    assert Edit("reinforce", threshold=0.1).replace(method="scale") == Edit("scale")


def test_toy_method_hooks_change_the_logits(toy, tiny_model, tok):
    from aspan.batching import make_batch

    batch = make_batch(DATA.samples("selection", 0), tok)
    run = lambda fwd: tiny_model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask,  # noqa: E731
                                                fwd_hooks=fwd)
    plain = run([])
    edited = run(Edit("scale", 1, 4.0, heads=HEADS).batch_hooks(batch, tiny_model))
    direct = run(scale_refs(HEADS, batch.ref_mask, factor=4.0, delta=1))
    assert not torch.allclose(plain, edited) and torch.equal(edited, direct)
    pattern = torch.rand(2, 4, 5, 5).softmax(-1)
    mask = torch.rand(2, 5, 5) < 0.5
    want = pattern * torch.where(mask[:, None], 4.0, 1.0)
    assert torch.allclose(Edit("scale", 1, 4.0).apply(pattern, mask), want / want.sum(-1, keepdim=True))


def test_toy_method_runs_through_the_grid_and_the_engine(toy, tiny_model, tok):
    raw = {"model": "reversal", "task": "reversal", "strengths": [0.5, 4.0], "thresholds": ["none", 0.1],
           "renormalize": [False, True], "method": ["scale", "patch"], "heads": {"list": [[1, 0], [1, 2]]},
           "n_samples": 4}
    points = grid(SweepConfig.from_dict(raw))
    toys = [p for p in points if p["method"] == "scale"]
    assert [p["strength"] for p in toys] == [0.5, 4.0] and len(points) == 3  # the toy crosses strengths only
    eng = E.Engine(tiny_model, tok, DATA, batch_size=4)
    row = eng.row(E.point(DATA, "m", "list:1.0,1.2", 4.0, method="scale", delta=1))
    assert row["attn_heads_sample"] != row["baseline_attn_heads_sample"]  # the edit was active
    assert settings_key(E.point_of(row)) == row["key"] and setting_label(row) == "scale x4 at ref+1 on list:1.0,1.2"
    atoms = [Edit("scale", 1, 4.0, heads=[(1, 0)]), Edit("patch", 1, heads=[(1, 2)])]
    mixed = eng.row(E.point(DATA, "m", "list:1.0,1.2", method=E.ATOMS, atoms=atoms))
    assert settings_key(E.point_of(mixed)) == mixed["key"] and "L1H0 scale x4 at ref+1" in setting_label(mixed)
    assert mixed["attn_heads_sample"] != row["attn_heads_sample"]


def test_toy_method_is_a_choice_of_the_command_line_and_the_sweep_config(toy, capsys):
    from aspan.cli import build_parser

    argv = ["rank", "m", "--task", "reversal", "--by", "effect", "--method", "scale"]
    assert build_parser(argv).parse_args(argv).method == "scale"
    with pytest.raises(SystemExit):
        build_parser(["rank", "--help"]).parse_args(["rank", "--help"])
    assert "--method {reinforce,patch,steer,scale}" in capsys.readouterr().out
    with pytest.raises(ValueError, match="sweep config: method: must be one of reinforce, patch, steer, scale"):
        SweepConfig.from_dict({"model": "reversal", "task": "reversal", "heads": {"list": [[1, 0]]}, "strengths": [1],
                               "method": ["nudge"]})


def test_rules_and_the_rank_options_load_no_torch():
    code = ("import sys, aspan.methods, aspan.commands.rank, aspan.commands.sweep\n"
            "print(sorted(m for m in ('torch', 'transformer_lens', 'pandas', 'hooks') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
