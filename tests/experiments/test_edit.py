"""One `Edit`: the method's own rules at construction, every committed results row read back to its key, the sweep
grid's meaningful combinations per method, and one definition of the "beyond" gate for the engine and the search."""
import ast
import csv
import json
from pathlib import Path

import pytest
import torch

from aspan import models, tasks
from aspan.applications import causal
from aspan.batching import make_batch
from aspan.experiments import engine as E
from aspan.experiments.edit import Edit, beyond_row, setting_label, setting_of
from aspan.experiments.profiling import Edit as ProfilingEdit
from aspan.experiments.search import SearchConfig, decode_atoms, encode_atoms
from aspan.experiments.sweep import SweepConfig, grid
from aspan.io import settings_key

RESULTS = Path(__file__).resolve().parents[2] / "results"


def _csv_rows(path: Path) -> list[dict]:
    """A committed sweep.csv (pandas' writing of engine rows): each cell read back as the Python value it was;
    a blank cell is a key the point did not have (rank, atoms) or None (threshold)."""
    def cell(v: str):
        if v == "":
            return None
        try:
            return ast.literal_eval(v)
        except (ValueError, SyntaxError):
            return v

    csv.field_size_limit(1 << 30)
    with path.open(newline="") as f:
        return [{k: cell(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _committed_rows() -> list[tuple[str, dict]]:
    rows = [(str(p), json.loads(line)) for p in sorted(RESULTS.rglob("sweep*.jsonl"))
            for line in p.read_text().splitlines() if line.strip()]
    for path in sorted(RESULTS.rglob("sweep.csv")):  # the engine's rows (a table of the JSONL rows has no key)
        for row in (r for r in _csv_rows(path) if "key" in r):
            settings = {k: v for k, v in row.items() if not (k in ("rank", "atoms", "gate", "eos") and v is None)}
            rows.append((str(path), {k: v for k, v in settings.items() if k not in ("top", "head_names", "label")}))
    return rows


def test_every_committed_row_resolves_to_its_key():
    rows = _committed_rows()
    files = {str(Path(w).relative_to(RESULTS)) for w, _ in rows}
    assert len(rows) >= 80 and {"causal_demo/sweep.csv", "causal_demo/model_seeds/seed3/sweep.csv"} <= files
    assert {r["method"] for _, r in rows} >= {"reinforce", "atoms"}
    for where, row in rows:
        assert settings_key(E.point_of(row)) == row["key"], (where, row["key"])
        assert setting_of(row)["method"] == row["method"]
    atoms = json.loads((RESULTS / "causal_demo" / "summary.json").read_text())["search"]["atoms"]
    assert encode_atoms(decode_atoms(atoms)) == atoms


@pytest.mark.parametrize("kwargs,words", [
    ({"method": "steer", "strength": 4.0}, "alpha"),
    ({"method": "steer", "strength": 0.0}, "alpha"),
    ({"method": "patch", "strength": 1.0}, "patch takes no strength"),
    ({"method": "patch", "threshold": 0.1}, "patch takes no threshold"),
    ({"method": "steer", "strength": 0.5, "renormalize": True}, "steer takes no renormalize"),
    ({"method": "reinforce", "strength": -1.0}, ">= 0"),
    ({"method": "reinforce", "threshold": 1.5}, "threshold"),
    ({"method": "reinforce", "below": 2.0}, "below"),
    ({"method": "nudge"}, "unknown edit method"),
    ({"method": "reinforce", "renormalize": "no"}, "renormalize must be true or false"),
    ({"method": "reinforce", "renormalize": 1}, "renormalize must be true or false"),
])
def test_each_method_has_its_own_rules(kwargs, words):
    with pytest.raises(ValueError, match=words):
        Edit(**kwargs)


def test_settings_round_trip_and_defaults():
    assert Edit("steer").strength == 0.01 and Edit("reinforce").strength == 1.0 and Edit("patch").strength is None
    edit = Edit("reinforce", 2, 3.0, True, threshold=0.2, eos="extrapolate", below=0.4)
    assert edit.to_dict() == {"method": "reinforce", "strength": 3.0, "threshold": 0.2, "renormalize": True,
                              "delta": 2, "gate": "below:0.4", "eos": "extrapolate"}
    assert Edit.from_dict(edit.to_dict()) == edit
    gated = Edit("steer", -1, 0.05, beyond=21)
    assert Edit.from_dict(gated.to_dict(), beyond=21) == gated
    with pytest.raises(ValueError, match="needs the last ID row"):
        Edit.from_dict(gated.to_dict())
    # a patch row of an old grid (the grid's strength, threshold, renormalisation) reads as the one patch edit
    assert Edit.from_dict({"method": "patch", "strength": 4.0, "threshold": 0.1, "renormalize": True}) == Edit("patch")
    assert Edit("patch", 1).replace(method="reinforce") == Edit("reinforce", 1, 1.0)
    assert ProfilingEdit is Edit


def test_grid_crosses_each_method_only_with_what_it_takes():
    raw = {"model": "reversal", "task": "reversal", "strengths": [0.5, 1.0], "thresholds": ["none", 0.1],
           "renormalize": [False, True], "method": ["reinforce", "patch", "steer"], "heads": {"list": [[1, 0]]},
           "deltas": [0, 1], "n_samples": 4}
    points = grid(SweepConfig.from_dict(raw))
    by_method = {m: [p for p in points if p["method"] == m] for m in ("reinforce", "patch", "steer")}
    assert [len(v) for v in by_method.values()] == [2 * 2 * 2 * 2, 2, 2 * 2]
    assert len({settings_key(p) for p in points}) == len(points)
    assert len({settings_key(setting_of(p)) for p in points}) == len(points)  # no edit twice under two keys
    assert all(p["strength"] is None and p["threshold"] is None and not p["renormalize"] for p in by_method["patch"])


def _edited_rows(model, batch, fwd) -> set[int]:
    """Query rows of head L1H7 whose pattern the hooks `fwd` change."""
    seen = []
    record = ("blocks.1.attn.hook_pattern", lambda pattern, hook: seen.append(pattern[:, 7].clone()))
    model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask, fwd_hooks=[record])
    model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask, fwd_hooks=[*fwd, record])
    return set((seen[0] != seen[1]).any(-1).any(0).nonzero().flatten().tolist())


def test_sweep_and_demo_gate_beyond_at_the_same_row():
    """The engine's gate "beyond" (aspan sweep) and the causal search's gated atoms (aspan demo) edit the same rows:
    from the row that predicts the first token past the longest ID sample (its EOS row) on."""
    torch.set_num_threads(1)
    model, tok, _ = models.load("reversal", device="cpu")
    data = E.Data("reversal", ood_params={"length": [12, 12]}, n=8)
    eng = E.Engine(model, tok, data, batch_size=8)
    searched = causal.search(eng, "reversal", 0, SearchConfig(deltas=(2,), profile=1, max_heads=1, batch_size=8))
    longest = tasks.preset("reversal", "id").max_text_len()
    assert searched.beyond == beyond_row(tok.offset, longest, tok.eos_id is not None) == tok.offset + longest - 1
    batch = make_batch(eng.samples("selection", 0), tok)
    sweep_rows = _edited_rows(model, batch, eng.edit(E.point(data, "reversal", "list:1.7", 3.0, delta=2,
                                                             gate="beyond"))(batch))
    demo_rows = _edited_rows(model, batch, ProfilingEdit("reinforce", delta=2, strength=3.0, beyond=searched.beyond)
                             .on([(1, 7)]).hooks(batch.ref_mask, model))
    assert sweep_rows == demo_rows and min(sweep_rows) == tok.offset + longest


def test_a_selected_patch_setting_is_printed():
    """`aspan sweep` prints the chosen setting through `setting_label`: a patch setting has no strength to print."""
    from aspan.applications.sweep import format_selection

    selected = {"mode": "teacher", "method": "patch", "heads": "list:1.0", "strength": None, "threshold": "none",
                "renormalize": False, "delta": 1, "gate": "beyond", "eos": "extrapolate", "gain_exact": 0.25,
                "id_cost": 0.0}
    held = {"exact": 0.5, "gain_exact": 0.25, "partial": 0.75, "gain_partial": 0.1, "id_cost": 0.0}
    out = format_selection({"rule": "r", "selected": selected, "held_out": held, "candidates": 1})
    assert "selected: patch at ref+1 (EOS row extrapolated) on list:1.0 (gate beyond) (teacher)" in out
    assert setting_label({**selected, "method": "reinforce", "strength": 2.0, "gate": "none", "eos": "none",
                          "threshold": 0.1}) == "reinforce C=2 tau=0.1 at ref+1 on list:1.0"


def test_atoms_points_carry_their_edits():
    data = E.Data("reversal", n=4)
    atoms = [Edit("patch", 2, heads=[(1, 7)]),
             Edit("reinforce", strength=5.0, beyond=21, eos="extrapolate", heads=[(0, 0)])]
    p = E.point(data, "m", "list:1.7,0.0", 0.0, method=E.ATOMS, atoms=atoms)
    assert decode_atoms(p["atoms"]) == atoms and settings_key(E.point_of(p)) == settings_key(p)
    for bad in ({}, {"atoms": atoms, "gate": "beyond"}, {"atoms": atoms, "eos": "extrapolate"}):
        with pytest.raises(ValueError, match="carry their own"):
            E.point(data, "m", "list:1.7,0.0", 0.0, method=E.ATOMS, **bad)


def test_an_edit_carries_its_heads(tiny_model, tok):
    """`Edit.heads`: validated and normalised at construction, used by `hooks`, one head per atom, out of the grid
    settings (the point names its heads), and set by the engine from the point's selection."""
    edit = Edit("patch", 1, heads=[[1, 0], (1, 2)])
    assert edit.heads == ((1, 0), (1, 2)) and edit == Edit("patch", 1).on([(1, 0), (1, 2)])
    for bad in ("1.0", [(1,)], [(0, -1)], [(0, True)], 3):
        with pytest.raises(ValueError, match="heads must be"):
            Edit("patch", heads=bad)
    assert edit.to_dict() == Edit("patch", 1).to_dict()
    with pytest.raises(ValueError, match="an atom edits one head, this edit has 2"):
        edit.to_atom()
    assert Edit.from_atom(edit.on([(1, 2)]).to_atom()).heads == ((1, 2),)
    mask = torch.zeros(1, 4, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="has no heads to edit"):
        Edit("patch").hooks(mask)
    assert [name for name, _ in edit.hooks(mask)] == ["blocks.1.attn.hook_pattern"]
    data = E.Data("reversal", ood_params={"length": [11, 12]}, n=4)
    eng = E.Engine(tiny_model, tok, data, batch_size=4)
    plain = E.point(data, "m", "list:1.0,1.2", 2.0, delta=1)
    assert eng.edits(plain, eng.heads(plain)) == [Edit("reinforce", 1, 2.0, heads=((1, 0), (1, 2)))]
    atoms = E.point(data, "m", "list:1.0", method=E.ATOMS, atoms=[edit.on([(1, 0)])])
    assert eng.edits(atoms, eng.heads(atoms)) == [edit.on([(1, 0)])]


def test_per_head_offsets_edit_each_head_at_its_own_offset(tiny_model, tok):
    """`Edit.offsets`: one key offset per head, checked at construction (equal offsets are `delta`); its hooks edit
    exactly as the edits of one head each at their offsets, and differently from every head at one offset."""
    heads = ((1, 0), (1, 2), (0, 1))
    edit = Edit("reinforce", strength=3.0, heads=heads, offsets=(0, 1, 0))
    assert edit.head_offsets() == (0, 1, 0) and "ref+(+0, +1, +0)" in edit.label
    assert Edit("reinforce", heads=heads, offsets=(2, 2, 2)) == Edit("reinforce", 2, heads=heads)
    for bad in ((0, 1), (0, 1, 1.5), (0, True, 1)):
        with pytest.raises(ValueError, match="offsets must be one integer per head"):
            Edit("reinforce", heads=heads, offsets=bad)
    with pytest.raises(ValueError, match="per-head offsets"):
        edit.to_dict()
    assert edit.on([(1, 1)]).offsets == ()
    batch = make_batch(tasks.preset("reversal", "ood", length=(11, 12)).generate(4, seed=5), tok)
    singles = [Edit("reinforce", o, 3.0, heads=(h,)) for h, o in zip(heads, edit.head_offsets())]

    def logits(edits):
        with tiny_model.hooks(fwd_hooks=[hook for e in edits for hook in e.batch_hooks(batch, tiny_model)]):
            return tiny_model(batch.tokens, attention_mask=batch.attention_mask)

    combined = logits([edit])
    assert torch.equal(combined, logits(singles))
    assert not torch.equal(combined, logits([Edit("reinforce", 0, 3.0, heads=heads)]))
    assert not torch.equal(combined, logits([]))
