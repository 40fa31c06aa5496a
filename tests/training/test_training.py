"""Training: exact resume, target-only loss, qk-column freezing, data order, replay, DDP on gloo, and learning."""
import json
import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from aspan import models, tasks
from aspan.batching import make_batch
from aspan.param_groups import qk_column_masks
from aspan.tokenization import CharTokenizer
from aspan.training import DataStream, Replay, TrainConfig, latest_checkpoint, lr_lambda, read_jsonl, target_loss, train

warnings.filterwarnings("ignore", message=r"HookedTransformer(\.from_pretrained)? is deprecated",
                        category=DeprecationWarning)
TOK = CharTokenizer()
TASK = tasks.get("reversal", length=(1, 3), charset="abcd")


def tiny(seed=0):
    torch.set_num_threads(1)
    return models.tiny(TOK, n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=32, seed=seed, device="cpu")


def cfg(**kw):
    return TrainConfig.scratch(**{"steps": 6, "batch_size": 8, "lr": 3e-3, "warmup": 2, "log_every": 1, **kw})


def same_weights(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_resume_gives_identical_weights(tmp_path):
    straight = train(tiny(), TOK, TASK, cfg(), out_dir=tmp_path / "a", progress=False).model
    half = train(tiny(), TOK, TASK, cfg(), out_dir=tmp_path / "b", progress=False, stop_after=3)
    assert not same_weights(straight, half.model)
    assert latest_checkpoint(tmp_path / "b").name == "step-00000003"
    assert not (tmp_path / "b" / "config.json").exists()  # no final model for an unfinished run
    resumed = train(tiny(seed=5), TOK, TASK, cfg(), out_dir=tmp_path / "b", resume=True, progress=False)
    assert same_weights(straight, resumed.model)
    log = [json.loads(line) for line in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["kind"] for r in log].count("params") == 1  # the size row, written once (not again on resume)
    final = models.load(tmp_path / "b", device="cpu")
    assert same_weights(final.model, straight) and final.meta["step"] == 6
    with pytest.raises(ValueError, match="seed"):
        train(tiny(), TOK, TASK, cfg(seed=1), out_dir=tmp_path / "b", resume=True, progress=False, stop_after=4)


def test_loss_counts_target_and_eos_rows_only():
    samples = TASK.generate(5, seed=1)
    b = make_batch(samples, TOK)
    logits = torch.randn(*b.tokens.shape, TOK.vocab_size)
    want = sum(
        -torch.log_softmax(logits[i, r], -1)[b.tokens[i, r + 1]]
        for i, s in enumerate(samples)
        for r in range(TOK.offset + s.prompt_len - 1, TOK.offset + len(s.text) + 1 - 1)
    )
    assert target_loss(logits, b.labels).item() == pytest.approx(want.item(), rel=1e-5)
    # prompt rows do not matter
    logits2 = logits.clone()
    logits2[:, 0] += 100 * torch.randn(TOK.vocab_size)
    assert target_loss(logits2, b.labels).item() == pytest.approx(want.item(), rel=1e-5)


def test_successor_eos_is_not_a_training_target():
    from aspan.training import train_batch

    samples = [tasks.get("successor").generate(1, seed=0)[0], TASK.generate(1, seed=0)[0]]
    full, b = make_batch(samples, TOK), train_batch(samples, TOK)
    eos_rows = full.lengths - 2
    assert b.labels[0, eos_rows[0]] == -100 and b.labels[1, eos_rows[1]] == TOK.eos_id
    assert (b.labels != full.labels).sum() == 1 and b.target_rows.sum() == full.target_rows.sum() - 1


def test_data_order_is_a_function_of_seed_and_step(tmp_path):
    a, b = DataStream(TASK, 8, seed=3), DataStream(TASK, 8, seed=3)
    assert a.batch(7) == b.batch(7) and a.batch(7) != a.batch(8) and a.batch(7) != DataStream(TASK, 8, 4).batch(7)
    samples = TASK.generate(10, seed=0)
    path = tmp_path / "d.jsonl"
    path.write_text("".join(s.to_json() + "\n" for s in samples))
    s = DataStream(path, 4, seed=0)
    assert read_jsonl(path) == samples and s.steps_per_epoch == 3
    epoch = [x for k in range(3) for x in s.batch(k)]
    assert sorted(epoch, key=lambda x: x.text) == sorted(samples, key=lambda x: x.text)  # each sample once per epoch
    assert [x for k in range(3, 6) for x in s.batch(k)] != epoch  # reshuffled next epoch


@pytest.mark.parametrize("share, batch", [(0.5, 8), (0.25, 8), (0.3, 10), (0.0, 4), (0.9, 4)])
def test_replay_mixes_the_stated_share_deterministically(share, batch):
    new = tasks.get("reversal", length=(5, 6), charset="abcd")
    old = tasks.get("reversal", length=(1, 3), charset="abcd")
    stream = DataStream(Replay(new, old, share), batch, seed=2)
    k = min(batch - 1, round(share * batch + 1e-9))
    for step in range(20):
        b = stream.batch(step)
        lengths = [len(s.target) for s in b]
        assert len(b) == batch and sum(n <= 3 for n in lengths) == k  # exactly k old samples per batch
        assert b == DataStream(Replay(new, old, share), batch, seed=2).batch(step)  # a function of (seed, step)
    assert stream.batch(0) != DataStream(Replay(new, old, share), batch, seed=3).batch(0)
    # the new-data part is the stream's own, independent of the replay samples drawn beside it
    assert stream.batch(4)[: batch - k] == DataStream(new, batch - k, seed=2).batch(4)
    with pytest.raises(ValueError, match="replay share"):
        Replay(new, old, 1.0)


def test_finetune_defaults_and_one_epoch(tmp_path):
    c = TrainConfig.finetune()
    assert (c.lr, c.betas, c.weight_decay, c.batch_size, c.epochs) == (5e-6, (0.95, 0.999), 0.2, 4, 1)
    samples = TASK.generate(10, seed=0)
    res = train(tiny(), TOK, samples, TrainConfig.finetune(log_every=1), progress=False)
    assert [r["step"] for r in res.history if r["kind"] == "train"] == [1, 2, 3]  # ceil(10 / 4) steps
    with pytest.raises(ValueError, match="step count"):
        train(tiny(), TOK, TASK, TrainConfig.finetune(), progress=False)


def test_schedule_warms_up_then_decays():
    lrs = [lr_lambda(s, 10, 100, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(x >= y for x, y in zip(lrs[9:], lrs[10:])) and lrs[-1] == pytest.approx(0.1, abs=1e-3)


@pytest.mark.hooked  # HookedTransformer's names; the bridge's masks: tests/training/test_param_groups_backends.py
def test_qk_column_trains_only_that_column(caplog):
    model = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    c = 3
    with caplog.at_level("INFO", logger="aspan"):  # reported through the aspan.training logger
        train(model, TOK, TASK, cfg(steps=2, weight_decay=0.5, lr=1e-2, train_only=f"qk-column:{c}"), progress=True)
    out = caplog.text
    n = 2 * model.cfg.n_layers * model.cfg.n_heads * model.cfg.d_model
    assert f"trainable parameters: {n:,} of" in out
    masks = qk_column_masks(model, c)
    assert sorted(masks) == [f"blocks.{l}.attn.{w}" for l in range(2) for w in ("W_K", "W_Q")]
    for name, p in model.named_parameters():
        if name in masks:
            assert torch.equal(p[..., :c], before[name][..., :c])
            assert torch.equal(p[..., c + 1 :], before[name][..., c + 1 :])
            assert not torch.equal(p[..., c], before[name][..., c]), name
        else:
            assert torch.equal(p, before[name]), name
        assert p.requires_grad  # flags restored after training
    with pytest.raises(ValueError, match="out of range"):
        train(tiny(), TOK, TASK, cfg(train_only="qk-column:99"), progress=False)
    with pytest.raises(ValueError, match="train_only"):
        cfg(train_only="mlps").check()


def test_fwd_hooks_are_active_while_training():
    import hooks

    calls = []

    def factory(batch):
        calls.append(batch.tokens.shape[0])
        return hooks.attn_bias(torch.full((32, 32), -5.0).triu(1).tril(-1) + torch.eye(32) * 3.0, layers=[0])

    a = train(tiny(), TOK, TASK, cfg(steps=2), progress=False).model
    b = train(tiny(), TOK, TASK, cfg(steps=2), fwd_hooks=factory, progress=False).model
    assert calls == [8, 8] and not same_weights(a, b)
    assert not b.hook_dict["blocks.0.attn.hook_attn_scores"].fwd_hooks  # removed afterwards
    # the periodic evaluations run under the same hooks (5 held-out samples at steps 1 and 2)
    calls.clear()
    held_out = TASK.generate(5, seed=9)
    res = train(tiny(), TOK, TASK, cfg(steps=2, eval_every=1), fwd_hooks=factory, eval_data={"x": held_out},
                progress=False)
    assert calls == [8, 5, 8, 5]
    plain = train(tiny(), TOK, TASK, cfg(steps=2, eval_every=1), eval_data={"x": held_out}, progress=False)
    ev = lambda r: [row["partial"] for row in r.history if row["kind"] == "eval"]  # noqa: E731
    assert ev(res) != ev(plain)


def test_bad_input_fails_before_training(tmp_path):
    with pytest.raises(ValueError, match="n_ctx"):
        train(tiny(), TOK, tasks.get("reversal", length=20), cfg(), progress=False)
    with pytest.raises(ValueError, match="one token"):
        train(tiny(), CharTokenizer("ab="), TASK, cfg(), progress=False)
    with pytest.raises(FileNotFoundError):
        train(tiny(), TOK, tmp_path / "missing.jsonl", cfg(), progress=False)
    with pytest.raises(ValueError, match="steps"):
        cfg(steps=0).check()


def test_tiny_model_learns_reversal():
    res = train(tiny(), TOK, TASK, cfg(steps=120, batch_size=32, warmup=10, log_every=10), progress=False,
                eval_data={"id": TASK.generate(30, seed=9)})
    losses = [r["loss"] for r in res.history if r["kind"] == "train"]
    assert losses[-1] < 0.25 * losses[0] and all(math.isfinite(x) for x in losses)
    ev = [r for r in res.history if r["kind"] == "eval"]
    assert ev[-1]["step"] == 120 and ev[-1]["partial"] > 0.8


def _ddp_worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    torch.set_num_threads(1)
    model = tiny(seed=rank)  # built before the process group, as under torchrun (a bridge boots from files that
    # transformers writes on rank 0 only once a group exists)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        res = train(model, TOK, TASK, cfg(steps=3), progress=False)  # DDP broadcasts rank 0's weights
        losses = [r["loss"] for r in res.history if r["kind"] == "train"]
        torch.save({"state": res.model.state_dict(), "loss": losses}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_ddp_two_processes_on_gloo(tmp_path):
    # fork: the children inherit the imported modules (a spawned child spends ~10 s importing TransformerLens)
    mp.start_processes(_ddp_worker, args=(2, f"file://{tmp_path}/init", str(tmp_path)), nprocs=2, join=True,
                       start_method="fork")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert all(torch.equal(r0["state"][k], r1["state"][k]) for k in r0["state"])
    assert r0["loss"] == r1["loss"] and all(math.isfinite(x) for x in r0["loss"])
    # the global batch is split across ranks and the loss normalised globally: same as one process
    single = train(tiny(), TOK, TASK, cfg(steps=3), progress=False).model.state_dict()
    for k, v in single.items():
        torch.testing.assert_close(r0["state"][k], v, atol=1e-5, rtol=1e-4)


def test_weight_decay_takes_every_matrix_and_the_attention_biases_on_either_backend():
    """HookedTransformer: exactly the tensors of two or more dimensions (its per-head b_Q/b_K/b_V included, as the
    committed results were trained); a TransformerBridge: its matrices and the q/k/v biases of the same heads."""
    from aspan.training import decays

    model = tiny()
    decayed = {n for n, p in model.named_parameters() if decays(n, p)}
    matrices = {n for n, p in model.named_parameters() if p.ndim >= 2}
    if hasattr(model, "original_model"):  # TransformerLens 4: a TransformerBridge over GPT-NeoX
        qkv_biases = {n for n in dict(model.named_parameters()) if n.endswith("_original_component.bias")
                      and n.replace("._original_component", "").split(".")[-2] in ("q", "k", "v", "qkv")}
        assert len(qkv_biases) == 2 * 4 and decayed == matrices | qkv_biases  # 2 layers x q, k, v, fused qkv
    else:
        assert decayed == matrices
        assert {"blocks.0.attn.b_Q", "blocks.0.attn.b_K", "blocks.0.attn.b_V"} <= decayed
        assert not {"blocks.0.attn.b_O", "blocks.0.mlp.b_in", "blocks.0.ln1.b", "unembed.b_U"} & decayed
    one = torch.zeros(4)
    for name, want in [("gpt_neox.layers.0._original_component.attention.q._original_component.bias", True),
                       ("transformer.h.0._original_component.attn.v._original_component.bias", True),
                       ("model.layers.0.self_attn.k_proj.bias", False),  # not a bridge name: a plain 1-D bias
                       ("gpt_neox.layers.0._original_component.attention.o._original_component.bias", False),
                       ("transformer.ln_f._original_component.weight", False)]:
        assert decays(name, one) is want, name


def _ddp_checkpoint_worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    torch.set_num_threads(1)
    model = tiny(seed=rank)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        train(model, TOK, TASK, cfg(steps=2), out_dir=Path(out), progress=False)
    finally:
        dist.destroy_process_group()


def test_a_run_trained_by_two_processes_is_not_resumed_by_one(tmp_path):
    """The world size is saved with the training state; a resume under another one is refused in one line (it
    was accepted and gave other weights than the two-process resume)."""
    run = tmp_path / "run"
    mp.start_processes(_ddp_checkpoint_worker, args=(2, f"file://{tmp_path}/init", str(run)), nprocs=2, join=True,
                       start_method="fork")
    from aspan.training import read_state

    assert read_state(latest_checkpoint(run))["world_size"] == 2
    with pytest.raises(ValueError, match=r"trained by 2 process\(es\).*now 1.*--nproc_per_node=2") as info:
        train(tiny(), TOK, TASK, cfg(steps=4), out_dir=run, resume=True, progress=False)
    assert "\n" not in str(info.value)


def test_run_options_and_their_keywords_give_the_same_run(tmp_path):
    """`train` takes its run settings as one `RunOptions` or as its fields' keywords (which override the object's):
    the two give the same weights, and a keyword that is no field is a TypeError naming it."""
    from aspan.training import RunOptions, train_resumable

    by_keywords = train(tiny(), TOK, TASK, cfg(), out_dir=tmp_path / "a", progress=False, meta={"note": 1})
    options = RunOptions(out_dir=tmp_path / "b", progress=True, meta={"note": 1})
    by_options = train(tiny(), TOK, TASK, cfg(), options, progress=False)
    assert same_weights(by_keywords.model, by_options.model)
    assert by_options.out_dir == tmp_path / "b" and options.progress and options.meta == {"note": 1}  # not changed
    assert models.load(tmp_path / "b", device="cpu").meta["note"] == 1
    with pytest.raises(TypeError, match="'outdir'"):
        train(tiny(), TOK, TASK, cfg(), outdir=tmp_path / "c")
    with pytest.raises(TypeError, match="out_dir"):
        train_resumable(tmp_path / "d", tiny(), TOK, TASK, cfg(), out_dir=tmp_path / "e")


def test_evaluations_are_logged_not_printed(tmp_path, caplog, capsys):
    """Each periodic evaluation is one line through the `aspan` logger (INFO), nothing on stdout; with
    progress=False there is none."""
    evals = {"id": TASK.generate(4, seed=3)}
    with caplog.at_level("INFO", logger="aspan"):
        train(tiny(), TOK, TASK, cfg(steps=4, eval_every=2), eval_data=evals, progress=True)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("aspan.training")]
    assert [line.split(":")[0] for line in lines if " exact " in line] == ["step 2", "step 4"]
    assert capsys.readouterr().out == ""
    caplog.clear()
    with caplog.at_level("INFO", logger="aspan"):
        train(tiny(), TOK, TASK, cfg(steps=4, eval_every=2), eval_data=evals, progress=False)
    assert not [r for r in caplog.records if " exact " in r.getMessage()]
