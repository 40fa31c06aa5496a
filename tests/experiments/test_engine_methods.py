"""Engine methods patch and steer, and failure gates, against direct evaluations with the hooks."""
import pytest

import hooks
from aspan import tasks
from aspan.evaluation import evaluate
from aspan.experiments.engine import Data, Engine, parse_gate, point
from aspan.experiments.sweep import SweepConfig, grid
from aspan.io import settings_key

DATA = Data("reversal", ood_params={"length": [11, 12]}, n=4)
HEADS = [(1, 0), (1, 2)]


def _check(row, model, tok, edit):
    """The row's selection and ID numbers equal evaluations with `edit` (and without) on the same samples."""
    for name, prefix in (("selection", ""), ("id", "id_")):
        samples = DATA.samples(name, 0)
        ed = evaluate(model, tok, samples, fwd_hooks=edit, attn=False).summary()
        base = evaluate(model, tok, samples, attn=False).summary()
        assert row[f"{prefix}exact"] == ed["exact"] and row[f"{prefix}partial"] == pytest.approx(ed["partial"])
        b = "baseline_" if not prefix else "id_baseline_"
        assert row[f"{b}partial"] == pytest.approx(base["partial"])


@pytest.mark.parametrize("method,kw", [
    ("patch", {}), ("steer", {"alpha": 0.05}),
])
def test_patch_and_steer_rows_equal_direct_evaluation(tiny_model, tok, method, kw):
    strength = kw.get("alpha")  # patch takes none
    row = Engine(tiny_model, tok, DATA, batch_size=3).row(point(DATA, "m", "list:1.0,1.2", strength, delta=1,
                                                                method=method))
    factory = {"patch": hooks.patch_pattern, "steer": hooks.steer}[method]
    _check(row, tiny_model, tok, lambda b: factory(HEADS, b.ref_mask, delta=1, **kw))
    assert row["attn_heads_sample"] != row["baseline_attn_heads_sample"]  # the edit was active


def test_beyond_gate_leaves_id_untouched_and_equals_rows_beyond(tiny_model, tok):
    eng = Engine(tiny_model, tok, DATA, batch_size=3)
    # the first row gated: the longest ID sample's EOS row (it predicts the first position past that sample)
    start = tok.offset + tasks.preset("reversal", "id").max_text_len()
    assert eng.beyond_row() + 1 == start
    for method in ("reinforce", "patch", "steer"):
        strength = {"steer": 0.05, "patch": None}.get(method, 3.0)
        row = eng.row(point(DATA, "m", "list:1.0,1.2", strength, method=method, gate="beyond"))
        assert row["id_exact"] == row["id_baseline_exact"] and row["id_cost"] == 0  # no ID row is edited
        assert row["id_partial"] == row["id_baseline_partial"]
        assert row["attn_heads_sample"] != row["baseline_attn_heads_sample"]  # OOD rows past `start` were edited
    rows = lambda b: hooks.rows_beyond(b.tokens, start)  # noqa: E731
    row = eng.row(point(DATA, "m", "list:1.0,1.2", 3.0, gate="beyond"))
    _check(row, tiny_model, tok, lambda b: hooks.reinforce(HEADS, b.ref_mask, 3.0, rows=rows(b)))
    # on ID samples the gated edit is the identity (bit-identical AttnScores), the ungated one is not
    ids = DATA.samples("id", 0)
    base = evaluate(tiny_model, tok, ids, heads=HEADS).records
    gated = evaluate(tiny_model, tok, ids, heads=HEADS,
                     fwd_hooks=lambda b: hooks.reinforce(HEADS, b.ref_mask, 3.0, rows=rows(b))).records
    ungated = evaluate(tiny_model, tok, ids, heads=HEADS,
                       fwd_hooks=lambda b: hooks.reinforce(HEADS, b.ref_mask, 3.0)).records
    col = "attn_heads_sample"
    assert gated[col].equals(base[col]) and not ungated[col].equals(base[col])


def test_below_gate_equals_gate_below(tiny_model, tok):
    eng = Engine(tiny_model, tok, DATA, batch_size=3)
    row = eng.row(point(DATA, "m", "list:1.0,1.2", method="patch", delta=1, gate="below:0.2"))
    _check(row, tiny_model, tok, lambda b: hooks.patch_pattern(HEADS, b.ref_mask, delta=1, gate_below=0.2))


def test_gates_in_points_and_sweep_configs():
    plain = point(DATA, "m", "list:1.0", 1.0)
    assert "gate" not in plain and settings_key(point(DATA, "m", "list:1.0", 1.0, gate="none")) == settings_key(plain)
    assert settings_key(point(DATA, "m", "list:1.0", 1.0, gate="beyond")) != settings_key(plain)
    assert parse_gate("below:0.25") == ("below", 0.25) and parse_gate(None) == (None, None)
    for bad in ("above:0.1", "below:2", "below:x", "beyond:3"):
        with pytest.raises(ValueError, match="gate must be"):
            parse_gate(bad)
    raw = {"model": "reversal", "task": "reversal", "strengths": [0.5], "method": ["patch", "steer"],
           "gates": ["none", "beyond", "below:0.3"], "heads": {"list": [[1, 0]]}, "n_samples": 4}
    points = grid(SweepConfig.from_dict(raw))
    assert len(points) == 2 * 3 and {p.get("gate") for p in points} == {None, "beyond", "below:0.3"}
    assert {p["method"] for p in points} == {"patch", "steer"}
    with pytest.raises(ValueError, match="sweep config: gates"):
        SweepConfig.from_dict({**raw, "gates": ["sometimes"]})
