"""`aspan study abc --protocol paper`: Duan & Shi's protocol end to end (quick), the "did not fit" path, the bias that
reaches the model against a direct computation of Algorithm 1 on the last layer, ABS windows, and the separation of
training, check and test numbers."""
import argparse
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from aspan import models
from aspan.applications.studies.abc_paper import (
    PaperConfig,
    abc_calibration,
    abs_bias,
    hooks_for_bias,
    number_split,
    paper_data,
    training_rows,
    wilson,
)
from aspan.batching import make_batch
from aspan.commands.studies.abc import add_arguments, paper_config_from_args
from aspan.experiments.abc import NEG
from aspan.experiments.calibration import calibrate, padded_blocks
from aspan.findings import finding
from tests.cli import aspan


def cli(*argv, cwd=None):
    """`aspan study abc --protocol paper ARGV` in a subprocess, warnings off (as PYTHONWARNINGS=ignore)."""
    return aspan("study", "abc", "--protocol", "paper", *argv, cwd=cwd or Path.cwd(),
                 code="import warnings\nwarnings.simplefilter('ignore')")


def rows_of(out):
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def test_quick_protocol_end_to_end_and_resumes(tmp_path):
    out = tmp_path / "paper"
    res = cli("--quick", "--out", str(out), "--quiet")
    assert res.returncode == 0, res.stderr
    cfg = PaperConfig.quick()
    rows = {(r["task"], r["condition"]): r for r in rows_of(out)}
    assert set(rows) == set(cfg.runs()) and len(rows) == len(cfg.plan)
    for (task, condition), r in rows.items():
        assert r["protocol"] == "paper" and r["seed"] == 0
        for n in cfg.buckets:  # at most min(10^L - 10^(L-1), n_test), all of them past the permutation's numbers
            assert 1 <= r[f"n_{n}"] <= min(10**n - 10 ** (n - 1), cfg.n_test)
            assert r[f"wilson_low_{n}"] <= r[f"exact_{n}"] <= r[f"wilson_high_{n}"]
        assert r[f"n_{max(cfg.buckets)}"] == cfg.n_test
        if condition == "abc":  # retrained until it fits, at most floor(1/10 of its base's steps), at least one
            base = rows[(task, "vanilla")]
            assert r["base_steps"] == base["steps"] and r["retrain_cap"] == max(1, math.floor(base["steps"] / 10))
            assert r["steps"] == min(cfg.check_every, r["retrain_cap"]) and r["status"] == "ok"  # fit_exact 0
            assert (out / "calibration" / f"{task}-seed0.pt").exists()
            assert (out / "models" / f"{task}-abc-seed0" / "config.json").exists()
        else:
            assert r["status"] == "fitted"
        assert r["checks"][-1] == [r["steps"], r["id_exact"]]
    assert rows[("parity", "abs")]["positional"] == "none"
    checks = [json.loads(line) for line in (out / "checks.jsonl").read_text().splitlines()]  # as they happened
    assert [(c["task"], c["condition"], c["step"], c["id_exact"]) for c in checks] == [
        (t, c, step, exact) for (t, c), r in rows.items() for step, exact in r["checks"]]
    table = pd.read_csv(out / "table.csv")
    assert len(table) == len(cfg.plan) * len(cfg.buckets) and table.exact_mean.between(0, 1).all()
    run = json.loads((out / "run.json").read_text())
    assert run["widths"] == {"successor": 4, "addition": 4, "parity": 14} and run["not_run"] == []
    for name in ("abc_paper_successor", "abc_paper_parity", "abc_bias_addition"):
        assert json.loads((out / "figures" / f"{name}.json").read_text())["data"]
    assert not (out / "scratch").exists()
    positions = pd.read_csv(out / "positions.csv")  # per answer row at the first length past the ID one (3 digits)
    assert set(zip(positions.task, positions.condition)) == {(t, c) for t, c in cfg.runs() if c != "abs"}
    assert set(positions.digits) == {3} and positions.accuracy.between(0, 1).all()
    assert positions.zero_for_nonzero.between(0, 1).all()
    per_model = positions.groupby(["task", "condition", "seed"])["row"]  # every answer row of each model, once
    assert (per_model.nunique() > 1).all() and (per_model.nunique() == per_model.size()).all()
    found = finding(json.loads((out / "summary.json").read_text()), run)  # what `aspan report` opens with
    assert "Table 1 hold" in found.question and found.answer.startswith(("Yes.", "No."))
    assert "successor: vanilla base fitted on 1 of 1 seeds, ABC 0." in found.answer
    assert set(found.headline.condition) == {"vanilla", "abc", "abs"}
    before = (out / "runs.jsonl").read_text()
    again = cli("--quick", "--out", str(out), "--quiet")
    assert again.returncode == 0, again.stderr
    assert (out / "runs.jsonl").read_text() == before  # every row found by its key: nothing retrained


def test_a_base_that_does_not_fit_gets_no_abc_row_and_says_so(tmp_path):
    config = tmp_path / "nofit.toml"
    config.write_text('plan = ["successor:vanilla", "successor:abc"]\nfit_exact = 0.99\nmax_steps = 2\n'
                      'check_every = 2\n')
    out = tmp_path / "nofit"
    res = cli("--quick", "--config", str(config), "--out", str(out), "--quiet")
    assert res.returncode == 0, res.stderr
    (row,) = rows_of(out)  # the vanilla row alone
    assert row["condition"] == "vanilla" and row["status"] == "did not fit" and not row["fitted"]
    assert row["steps"] == 2 and row["id_exact"] < 0.99
    assert "successor seed 0: no ABC row, its vanilla base did not fit" in res.stderr
    assert json.loads((out / "summary.json").read_text())["not_run"] == json.loads(
        (out / "run.json").read_text())["not_run"] != []
    assert set(pd.read_csv(out / "table.csv").condition) == {"vanilla"}


@pytest.mark.parametrize("argv, msg", [
    (["--conditions", "abc"], "add successor:vanilla"),
    (["--lrs", "0.1,0.2"], "one learning rate"),
    (["--retrain-steps", "5"], "retrain_fraction"),
    (["--tasks", "reversal"], "--tasks must be a subset"),
])
def test_bad_settings_fail_in_one_line_before_any_work(tmp_path, argv, msg):
    out = tmp_path / "bad"
    res = cli("--quick", "--out", str(out), *argv)
    assert res.returncode == 2 and msg in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()


def test_a_config_key_the_protocol_does_not_have_is_named(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("lam = 0.5\n")  # an aligned-variant setting
    res = cli("--quick", "--config", str(config), "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and str(config) in res.stderr and "'lam'" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "x").exists()


@pytest.mark.parametrize("name,layer", [("successor", -1), ("addition", -1), ("addition", 0)])
def test_the_bias_in_every_layer_is_calibrate_of_the_chosen_layers_averaged_blocks(name, layer):
    data = paper_data(name, PaperConfig.quick())
    model = models.tiny(data.tokenizer, n_layers=3, n_heads=2, d_model=16, n_ctx=data.n_ctx, seed=1)
    samples = data.calib
    with pytest.raises(ValueError, match="interpolates"):  # an untrained model answers none of them
        abc_calibration(model, data.tokenizer, samples, correct_only=True)
    m = training_rows(name, PaperConfig.quick().number_bits)  # successor 65: 2 digits; addition 128: 3
    cal = abc_calibration(model, data.tokenizer, samples, correct_only=False, calib_rows=m, layer=layer)
    # direct: the paper's blocks written out for width 4 (BOS at 0; successor "dddd," then 5 digits, no EOS row;
    # addition "dddd+dddd=" then 5 digits and the EOS row)
    tokens = make_batch(samples, data.tokenizer).tokens
    _, cache = model.run_with_cache(tokens)
    mean = cache["pattern", layer % 3].mean(0)  # -1: the last layer, [head, q, k]
    sep, n_rows = (5, 5) if name == "successor" else (10, 6)
    rows, cross_cols, self_cols = torch.arange(sep, sep + n_rows), torch.arange(1, sep), torch.arange(sep, sep + n_rows)
    want = torch.zeros_like(mean)
    for cols, kappa in ((cross_cols, 4.5), (self_cols, 0.87)):
        block = mean[:, rows][:, :, cols]
        # the lines are measured on the m rows the training numbers reach and extended to every target row
        want[:, rows[:, None], cols[None, :]] = calibrate(block[:, :m], tuple(block.shape[1:]), kappa=kappa)
    want = want.clamp(min=NEG)
    assert torch.allclose(cal.bias, want, atol=1e-6)
    assert (want[:, rows[:, None], self_cols[None, :]] == NEG).any()  # the bias does cut cells
    # (the cross block of width 4 has too few lines for kappa 4.5: no line mean is 4.5 sigma above the others)
    # what reaches the pre-softmax scores of every layer: scores after the bias hooks minus scores before them
    seen = {}

    def keep(tag):
        def hook(scores, hook):
            seen[(hook.layer(), tag)] = scores.detach().clone()
        return hook

    fwd = []
    for layer in range(3):
        fwd.append((f"blocks.{layer}.attn.hook_attn_scores", keep("before")))
    fwd += hooks_for_bias(cal.bias, model)
    for layer in range(3):
        fwd.append((f"blocks.{layer}.attn.hook_attn_scores", keep("after")))
    with torch.no_grad(), model.hooks(fwd_hooks=fwd):
        model(tokens)
    causal = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).tril()
    for layer in range(3):
        added = seen[(layer, "after")] - seen[(layer, "before")]
        assert torch.allclose(added[:, :, causal], want[None][:, :, causal].expand_as(added[:, :, causal]), atol=1e-3)


def test_training_rows_are_the_digits_of_the_largest_training_answer():
    assert training_rows("successor", 20) == len("1048577") == 7  # 2^20 + 1
    assert training_rows("addition", 20) == len("2097152") == 7  # 2^20 + 2^20
    assert training_rows("parity", 20) == 21  # 2^20 in binary
    assert training_rows("successor", 3) == 1 and training_rows("addition", 6) == 3  # 9; 128


def test_abs_window_is_the_papers_w1_on_the_papers_example():
    data = paper_data("addition", PaperConfig.quick())
    sample = data.train.base.build([123, 748])
    assert sample.text == "0123+0748=17800"
    bias = abs_bias(sample, data.tokenizer, width=1)
    open_cols = {r: set(torch.nonzero(bias[r] == 0).flatten().tolist()) for r in range(10, 16)}
    # operand a's digit d sits at 1 + 3 - d, operand b's at 6 + 3 - d; target row 10 + t; the BOS column stays open
    for t in range(5):
        window = {c for d in (t - 1, t, t + 1) if 0 <= d < 4 for c in (4 - d, 9 - d)}
        assert open_cols[10 + t] & set(range(1, 10)) == window, t
        assert open_cols[10 + t] & set(range(10, 16)) == {c for c in (9 + t, 10 + t) if c >= 10}
        assert 0 in open_cols[10 + t]
    assert open_cols[15] & set(range(1, 10)) == set()  # the EOS row has no references: no operand digit
    assert (bias[:10] == 0).all() and bias.min() == NEG  # prompt rows unbiased


def test_padded_blocks_need_one_layout():
    data = paper_data("parity", PaperConfig.quick())
    batch = make_batch(data.check[:3], data.tokenizer)
    rows, cross, self_cols = padded_blocks(batch)
    assert rows.tolist() == list(range(15, 30)) and cross.tolist() == list(range(1, 15))  # 14 bits, '=', 14 + EOS
    assert torch.equal(rows, self_cols)
    other = paper_data("parity", PaperConfig.quick(buckets=(2, 3)))
    with pytest.raises(ValueError, match="one padded layout"):
        padded_blocks(make_batch([data.check[0], other.check[0]], data.tokenizer))


def numbers_of(sample):
    body = sample.prompt[:-1]
    return [int(body, 2)] if sample.task == "parity" else [int(x) for x in body.split("+")]


@pytest.mark.parametrize("name", ["successor", "addition", "parity"])
def test_training_check_and_test_numbers_are_disjoint(name):
    cfg = PaperConfig.quick(number_bits=12, id_digits=3, buckets=(3, 4, 5), n_test=30, n_check=20, n_calib=30)
    train, check, test = number_split(12)
    assert len(train) == 4097 * 7 // 8 and sorted(train + check + test) == list(range(4097))
    assert not set(check) & set(test)
    data = paper_data(name, cfg)
    train_set = set(train)
    drawn = [x for s in data.train.generate(300, seed=5) + data.calib for x in numbers_of(s)]
    assert set(drawn) <= train_set  # training and calibration: training numbers only
    check_numbers = [x for s in data.check for x in numbers_of(s)]
    assert set(check_numbers) <= set(check) and {len(str(x)) for x in check_numbers} == {3}
    seen_test = set()
    for n, samples in data.test.items():
        xs = [numbers_of(s) for s in samples]
        assert {len(str(x)) for row in xs for x in row} == {n}
        assert not {x for row in xs for x in row} & (train_set | set(check_numbers))
        assert len({row[0] for row in xs}) == len(xs)  # distinct first operands
        assert len(xs) == min(10**n - 10 ** (n - 1), cfg.n_test)
        seen_test |= {x for row in xs for x in row}
    assert seen_test <= set(test) | set(range(4097, 10**5))


@pytest.mark.parametrize("name", ["successor", "addition", "parity"])
def test_quick_check_and_test_sets_repeat_nothing_and_share_no_sample(name):
    """On the --quick settings, built only: the check set (which decides the fit) and every test set hold no
    repeated prompt, and no test prompt is a check prompt (by construction: disjoint number pools)."""
    data = paper_data(name, PaperConfig.quick())
    check = [s.prompt for s in data.check]
    assert check and len(set(check)) == len(check)
    for n, samples in data.test.items():
        prompts = [s.prompt for s in samples]
        assert prompts and len(set(prompts)) == len(prompts) and not set(prompts) & set(check), n


def test_wilson_interval():
    assert wilson(0, 10) == (0.0, pytest.approx(1.96**2 / (10 + 1.96**2)))
    assert wilson(10, 10) == (pytest.approx(10 / (10 + 1.96**2)), 1.0)
    lo, hi = wilson(500, 1000)
    assert lo == pytest.approx(0.469, abs=1e-3) and hi == pytest.approx(0.531, abs=1e-3)
    assert all(math.isnan(v) for v in wilson(0, 0))


@pytest.mark.parametrize("path", ["configs/abc_paper_cpu.toml", "configs/abc_paper_gpu.toml"])
def test_the_shipped_configs_are_the_paper_protocol_at_full_length(path):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    root = Path(__file__).resolve().parents[2]
    cfg = paper_config_from_args(parser.parse_args(["--protocol", "paper", "--config", str(root / path)]))
    assert cfg.buckets == (6, 10, 20, 60) and cfg.number_bits == 20 and cfg.n_test >= 1000 and len(cfg.seeds) == 3
    assert cfg.fit_exact == 0.99 and cfg.abs_width == 1
    # the paper retrains ABC for 1/100 to 1/10 of the base's time; the CPU config allows up to the base's steps
    # (its bases stop at the first check past 99 %), and says so
    assert cfg.retrain_fraction <= (1.0 if "cpu" in path else 0.1)
    assert {"successor:abc", "addition:abc", "parity:abs"} <= set(cfg.plan)


def test_a_fitted_base_that_answers_no_calibration_sample_gets_a_skipped_row(tmp_path):
    config = tmp_path / "calib.toml"  # fit_exact 0: the base "fits"; correct_only: it answers none of them
    config.write_text('plan = ["successor:vanilla", "successor:abc"]\ncorrect_only = true\nmax_steps = 2\n'
                      'check_every = 2\n')
    out = tmp_path / "calib"
    res = cli("--quick", "--config", str(config), "--out", str(out), "--quiet")
    assert res.returncode == 0, res.stderr
    rows = {r["condition"]: r for r in rows_of(out)}
    assert rows["vanilla"]["status"] == "fitted" and rows["abc"]["status"].startswith("skipped: the base model")
    assert "exact_4" not in rows["abc"] and set(pd.read_csv(out / "table.csv").condition) == {"vanilla"}
    said = json.loads((out / "summary.json").read_text())["not_run"]
    assert len(said) == 1 and "answers none" in said[0]
    assert cli("--quick", "--config", str(config), "--out", str(out), "--quiet").returncode == 0  # resumed
    assert json.loads((out / "summary.json").read_text())["not_run"] == said and len(rows_of(out)) == 2


def test_calib_layer_keys_only_abc_rows_and_only_when_it_is_not_the_last_layer(tmp_path):
    from aspan.applications.studies.abc_paper import _Ctx

    def keys(**kw) -> tuple[str, str]:
        ctx = _Ctx(PaperConfig.quick(n_layers=2, **kw), tmp_path, {}, None, {}, {})
        return ctx.key("addition", "vanilla", 0)[1], ctx.key("addition", "abc", 0)[1]

    default, last, first = keys(), keys(calib_layer=1), keys(calib_layer=0)
    assert default == last  # -1 and 1 name the same layer of two: rows written before the field stay found
    assert first[0] == default[0] and first[1] != default[1]  # the base is not retrained; its ABC row is new
    with pytest.raises(ValueError, match="calib_layer"):
        PaperConfig.quick(n_layers=2, calib_layer=2).check()


def test_a_calib_layer_the_model_does_not_have_fails_in_one_line_naming_the_file(tmp_path):
    config = tmp_path / "layer.toml"
    config.write_text("calib_layer = 5\n")  # the quick model has 2 layers
    out = tmp_path / "x"
    res = cli("--quick", "--config", str(config), "--out", str(out))
    assert res.returncode == 2 and str(config) in res.stderr
    assert "calib_layer must name one of the 2 layers" in res.stderr
    assert "Traceback" not in res.stderr and not out.exists()


def test_without_keep_models_the_models_go_once_their_rows_are_recorded(tmp_path):
    kept, pruned = tmp_path / "kept", tmp_path / "pruned"
    config = tmp_path / "prune.toml"
    config.write_text("keep_models = false\n")
    assert cli("--quick", "--out", str(kept), "--quiet").returncode == 0
    res = cli("--quick", "--config", str(config), "--out", str(pruned), "--quiet")
    assert res.returncode == 0, res.stderr
    assert not list((pruned / "models").iterdir()), "every model's position rows and ABC row are written"
    assert list((kept / "models").iterdir())
    assert rows_of(kept) == [{**r, "wall_s": k["wall_s"]} for r, k in zip(rows_of(pruned), rows_of(kept))]
    assert pd.read_csv(kept / "positions.csv").equals(pd.read_csv(pruned / "positions.csv"))


def test_the_gpu_campaign_configs_carry_the_cpu_runs_corrections():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    root = Path(__file__).resolve().parents[2]
    for name in ("abc_paper", "abc_paper_abs"):
        cfg = paper_config_from_args(parser.parse_args(["--protocol", "paper", "--config",
                                                        str(root / "configs" / "gpu" / f"{name}.toml")]))
        assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.number_bits) == (6, 8, 128, 20)
        assert cfg.n_test == 10_000 and cfg.buckets == (6, 10, 20, 60) and len(cfg.seeds) == 3
        assert cfg.retrain_fraction == 1.0 and cfg.calib_layer == 0 and cfg.abc_positional == "none"
        assert not cfg.keep_models


def records_position_rows(ctx, name, condition, seed, digits):
    """The position rows as they were computed: from `evaluate`'s per-token records."""
    from aspan.applications.studies import abc_paper as ap
    from aspan.evaluation import evaluate

    data = ctx.data[name]
    model = models.load(ap.model_dir(ctx.out, name, condition, seed)).model
    bias = ()
    if condition == "abc":
        bias = hooks_for_bias(torch.load(ap.calibration_file(ctx.out, name, seed), weights_only=True)["bias"], model)
    rec = evaluate(model, data.tokenizer, data.test[digits], fwd_hooks=bias, batch_size=4, attn=False).records
    rec, out = rec[rec.scored], []
    for row, g in rec.groupby("target_index"):
        wrong_zero = (g.pred_char == "0") & (g.target_char != "0")
        out.append({"task": name, "condition": condition, "seed": seed, "digits": digits, "row": int(row),
                    "accuracy": float(g.correct.mean()),
                    "zero_for_nonzero": float(wrong_zero.sum() / max(1, (g.target_char != "0").sum()))})
    return out


def test_position_rows_are_those_of_evaluates_records(tmp_path):
    """Counted from the predictions at the target rows (no records), under the ABC bias too: the same rows, the same
    numbers, as from `evaluate`'s records."""
    from aspan.applications.studies import abc_paper as ap

    cfg = PaperConfig.quick(plan=("successor:vanilla", "successor:abc", "addition:vanilla"), max_steps=30,
                            check_every=30, n_test=40)
    ap.run_paper_study(cfg, tmp_path, progress=False)
    ctx = ap._Ctx(cfg, tmp_path, {t: paper_data(t, cfg) for t in ("successor", "addition")}, None, {}, {})
    mixed = 0
    for name, condition in cfg.runs():
        for digits in cfg.buckets:
            got = ap.position_rows(ctx, name, condition, 0, digits)
            assert got == records_position_rows(ctx, name, condition, 0, digits) and got
            mixed += sum(0 < r["accuracy"] < 1 for r in got)
    assert mixed  # rows neither all right nor all wrong
