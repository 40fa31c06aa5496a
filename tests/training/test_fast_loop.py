"""The training step off the host: lean batches equal to `train_batch`'s, made ahead in a thread that never
outlives the run; no device read inside a step; the rows and weights of the loop equal, bit for bit, those of a
step-by-step reference that reads every value at once (the loop as it was before batches were made ahead)."""
import json
import threading

import pytest
import torch

import hooks
from aspan import tasks
from aspan.batching import IGNORE, scores_eos
from aspan.models import fused
from aspan.tokenization import CharTokenizer
from aspan.training import (
    BudgetSpent,
    DataStream,
    Replay,
    TimeBudget,
    TrainConfig,
    latest_checkpoint,
    lr_lambda,
    target_loss,
    time_budget,
    train,
    train_batch,
)
from aspan.training.batches import PREFETCH_THREAD, BatchPlan, Prefetcher, lean_batch, target_count, token_count
from aspan.training.costs import SyncCounter
from aspan.training.optim import _optimizer, decays

from .test_time_budget import ticks
from .test_training import TASK, TOK, cfg, same_weights, tiny

TASKS = [TASK, tasks.get("successor"), tasks.get("parity", format="interleaved", length=(1, 6)),
         tasks.preset("addition", "id"), tasks.preset("flipflop", "id")]


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_lean_batches_equal_train_batch(task):
    """tokens, labels and mask equal `train_batch`'s (successor's EOS unlabelled, parity's given bits ignored);
    the host-side counts equal what the tensors hold; a fixed shape only pads."""
    tok = CharTokenizer.for_alphabets(task.alphabet)
    for seed in range(3):
        samples = task.generate(9, seed=seed)
        full = train_batch(samples, tok)
        tokens, labels, mask = lean_batch(samples, tok)
        assert torch.equal(tokens, full.tokens) and torch.equal(labels, full.labels)
        assert torch.equal(mask, full.attention_mask)
        assert target_count(samples, tok) == int((full.labels != IGNORE).sum())
        assert token_count(samples, tok) == int(full.attention_mask.sum())
        rows, width = 12, tokens.shape[1] + 5
        padded = lean_batch(samples, tok, shape=(rows, width))
        for got, want, fill in zip(padded, (tokens, labels, mask), (tok.pad_id, IGNORE, 0)):
            assert got.shape == (rows, width) and torch.equal(got[:9, : want.shape[1]], want)
            assert (got[9:] == fill).all() and (got[:, want.shape[1] :] == fill).all()
    with pytest.raises(ValueError, match="n_ctx=3"):
        lean_batch(samples, tok, n_ctx=3)
    with pytest.raises(ValueError, match="fixed shape"):
        lean_batch(samples, tok, shape=(9, 2))


def test_a_rank_takes_its_share_and_the_global_counts():
    samples = TASK.generate(8, seed=1)
    one, two = BatchPlan(TOK, rank=1, world=2).make(samples), BatchPlan(TOK).make(samples)
    assert torch.equal(one.tokens, train_batch(samples[1::2], TOK).tokens)
    assert (one.n_target, one.n_tokens) == (two.n_target, two.n_tokens)  # the global batch's, on every rank


def _reference(model, config, steps: int, data=TASK) -> list[tuple[float, float, float]]:
    """The loop as it was: the batch made in the step, every value read back at once; (loss, grad norm, lr) of
    each step. Its forward is the loop's own (`fused.logits`, which picks the fused or the hooked forward), so
    only the step's bookkeeping differs."""
    model.zero_grad(set_to_none=True)
    stream = DataStream(data, config.batch_size, config.seed)
    params = list(model.named_parameters())  # AdamW's default (per-tensor) implementation, as the loop had it
    groups = [{"params": [p for n, p in params if decays(n, p)], "weight_decay": config.weight_decay},
              {"params": [p for n, p in params if not decays(n, p)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, config.warmup, steps, config.min_lr_ratio))
    rows = []
    for step in range(steps):
        samples = stream.batch(step)
        n_target = sum(len(s.target) - len(s.given) + scores_eos(s) for s in samples)
        batch = train_batch(samples, TOK, model.cfg.n_ctx)
        loss_sum = target_loss(fused.logits(model, batch.tokens), batch.labels)
        opt.zero_grad(set_to_none=True)
        (loss_sum * 1 / n_target).backward()
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
        opt.step()
        sched.step()
        rows.append((float(loss_sum.detach()) / n_target, norm, sched.get_last_lr()[0]))
    return rows


REPLAY = Replay(tasks.get("reversal", length=(4, 6), charset="abcd"), TASK, 0.25)


@pytest.mark.parametrize("log_every, prefetch, data", [(1, 2, TASK), (3, 0, TASK), (4, 3, REPLAY)])
def test_the_loop_trains_bit_for_bit_as_the_reference(tmp_path, log_every, prefetch, data):
    """log.jsonl's losses, gradient norms and learning rates, and the weights, equal the reference's exactly, with
    batches made ahead or not, values read every step or every few, and a replay mixture."""
    steps = 9
    ref_model = tiny()
    want = _reference(ref_model, cfg(steps=steps), steps, data)
    res = train(tiny(), TOK, data, cfg(steps=steps, log_every=log_every), out_dir=tmp_path, progress=False,
                prefetch=prefetch)
    rows = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [s for s in range(1, steps + 1) if s % log_every == 0 or s == steps]
    assert [(r["loss"], r["grad_norm"], r["lr"]) for r in rows] == [want[r["step"] - 1] for r in rows]
    assert same_weights(res.model, ref_model)


def test_a_step_reads_nothing_from_the_device(monkeypatch):
    """Inside the steps nothing is read back or copied blocking; the values are read once per log row."""
    from aspan.training import loop

    counts, step = SyncCounter(), loop.take_step

    def counted(*args):
        with counts:
            step(*args)

    monkeypatch.setattr(loop, "take_step", counted)
    reads = []
    monkeypatch.setattr(loop.Tally, "read", lambda self, read=loop.Tally.read: (reads.append(self.pending),
                                                                                read(self)))
    res = train(tiny(), TOK, TASK, cfg(steps=8, log_every=4), progress=False)
    assert counts.reads == 0 and counts.blocking_copies == 0
    assert reads == [True, True] and len([r for r in res.history if r["kind"] == "train"]) == 2


def test_the_counter_sees_the_reads_and_copies_of_a_step_that_makes_them():
    """`SyncCounter` on the old step's pattern (`Batch.to` of 8 tensors, then float(norm), float(loss),
    int(mask.sum())): 3 reads and 8 blocking copies; torch's own AdamW step-counter reads are not counted."""
    model, samples = tiny(), TASK.generate(8, seed=0)
    opt = _optimizer(model, cfg())
    counter = SyncCounter()
    with counter:
        batch = train_batch(samples, TOK).to("cpu")
        loss = target_loss(model(batch.tokens), batch.labels)
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        opt.step()
        values = float(loss.detach()), int(batch.attention_mask.sum()), norm
    assert (counter.reads, counter.blocking_copies) == (3, 8) and values[1] > 0


def _nan_after(step: int):
    """A hook factory that turns the embedding into NaN from training forward `step` on."""
    calls = []

    def factory(batch):
        calls.append(1)
        return [("hook_embed", lambda x, hook: x * float("nan"))] if len(calls) >= step else []

    return factory


def test_a_nan_loss_stops_the_run_before_its_next_checkpoint(tmp_path):
    """A loss that stops being finite between two reads stops the run at the next read, before anything else is
    logged or checkpointed, with one line naming the step it happened at; the rows before it are logged."""
    with pytest.raises(FloatingPointError) as info:
        train(tiny(), TOK, TASK, cfg(steps=12, log_every=4, ckpt_every=4), out_dir=tmp_path, progress=False,
              fwd_hooks=_nan_after(6))
    assert str(info.value) == "loss became nan at step 6; lower the learning rate"
    rows = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [4]
    assert latest_checkpoint(tmp_path).name == "step-00000004"
    # a checkpoint the time budget asks for between log rows reads first, too
    with pytest.raises(FloatingPointError, match="at step 2;"):
        with time_budget(TimeBudget(4, 1000, ticks())):
            train(tiny(), TOK, TASK, cfg(steps=12, log_every=10), out_dir=tmp_path / "b", progress=False,
                  fwd_hooks=_nan_after(2))
    assert latest_checkpoint(tmp_path / "b") is None


def _prefetchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == PREFETCH_THREAD]


def test_resume_with_prefetching_is_exact_and_leaves_no_thread(tmp_path):
    """A run paused by stop_after and one paused by the time budget, each resumed, end with the losses and weights
    of the uninterrupted run; no prefetching thread outlives a run, whichever way it ended."""
    config = cfg(steps=10, log_every=1)
    straight = train(tiny(), TOK, TASK, config, out_dir=tmp_path / "a", progress=False, prefetch=3)
    train(tiny(), TOK, TASK, config, out_dir=tmp_path / "b", progress=False, prefetch=3, stop_after=4)
    assert not _prefetchers()
    with pytest.raises(BudgetSpent):
        with time_budget(TimeBudget(4, 1000, ticks())):
            train(tiny(seed=2), TOK, TASK, config, out_dir=tmp_path / "b", resume=True, progress=False, prefetch=3)
    assert not _prefetchers()
    resumed = train(tiny(seed=3), TOK, TASK, config, out_dir=tmp_path / "b", resume=True, progress=False,
                    prefetch=3)
    assert not _prefetchers()
    loss = lambda r: [(x["step"], x["loss"], x["grad_norm"]) for x in r.history if x["kind"] == "train"]  # noqa
    full = [json.loads(x) for x in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert [(x["step"], x["loss"], x["grad_norm"]) for x in full if x["kind"] == "train"] == loss(straight)
    assert same_weights(straight.model, resumed.model)


def test_the_prefetcher_hands_out_batches_in_order_and_stops():
    made = []

    def make(step):
        made.append(step)
        if step == 5:
            raise ValueError("bad sample at step 5")
        return step * 10

    with Prefetcher(make, range(2, 9), depth=2) as p:
        assert [p.get(s) for s in (2, 3, 4)] == [20, 30, 40]
        with pytest.raises(ValueError, match="step 5"):
            p.get(5)
    assert not _prefetchers() and max(made) == 5  # nothing made after the failure
    with Prefetcher(lambda s: s, range(1000), depth=2) as p:  # left early: the blocked thread is stopped
        assert p.get(0) == 0
    assert not _prefetchers()
    assert Prefetcher(lambda s: -s, range(3), depth=0).get(2) == -2  # no thread: made when asked
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="prefetch must be an int >= 0"):
            train(tiny(), TOK, TASK, cfg(), progress=False, prefetch=bad)


def test_a_captured_step_is_refused_where_it_cannot_run():
    """capture=True needs one CUDA process training a HookedTransformer without hooks: elsewhere one line says
    why, before any step."""
    with pytest.raises(ValueError, match="capture=True needs a CUDA device") as info:
        train(tiny(), TOK, TASK, cfg(capture=True, device="cpu"), progress=False)
    assert "\n" not in str(info.value)
    from types import SimpleNamespace

    from aspan.training.graph import check_capture

    def run(**kw):  # what check_capture reads of a run, on a CUDA device
        base = dict(config=cfg(capture=True), device=torch.device("cuda", 0), world=1, opts=SimpleNamespace(
            fwd_hooks=()), model=tiny())
        return SimpleNamespace(**{**base, **kw})

    check_capture(run())  # a single CUDA process training a HookedTransformer without hooks: taken
    check_capture(run(config=cfg(), device=torch.device("cpu")))  # not asked for: nothing to refuse
    model = tiny()
    bias = hooks.attn_bias(torch.randn(12, 12), layers=1, heads=[0, 2], model=model)
    check_capture(run(model=model, opts=SimpleNamespace(fwd_hooks=bias)))  # tensor attention biases: taken
    hooked = bias + [("hook_embed", lambda x, hook: x)]
    for kw, why in [(dict(world=2), "single process"), (dict(opts=SimpleNamespace(fwd_hooks=[("x", None)])),
                                                         "forward hooks"),
                    (dict(opts=SimpleNamespace(fwd_hooks=hooked)), "forward hooks other than attention biases"),
                    (dict(opts=SimpleNamespace(fwd_hooks=hooks.attn_bias(lambda q, k, device: torch.zeros(q, k),
                                                                         model=model))), "given as tensors"),
                    (dict(opts=SimpleNamespace(fwd_hooks=lambda batch: bias)), "hook factory")]:
        with pytest.raises(ValueError, match=why) as info:
            check_capture(run(**kw))
        assert "\n" not in str(info.value) and "capture=False" in str(info.value)


def test_fixed_width_padding_gives_the_loss_and_gradients_of_the_tight_batch():
    """Padding rows and columns (a captured step's fixed shape) change no scored row: causal attention, padding
    after every scored row."""
    model, samples = tiny(), TASK.generate(8, seed=4)
    results = []
    for shape in (None, (11, 30)):
        model.zero_grad(set_to_none=True)
        tokens, labels, _ = lean_batch(samples, TOK, shape=shape)
        loss = target_loss(model(tokens), labels)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (tight, g1), (fixed, g2) = results
    assert tokens.shape == (11, 30) and torch.allclose(tight, fixed, rtol=1e-6, atol=0)
    # float rounding only: every gradient within 1e-6 of its tensor's largest entry
    assert all(float((a - b).abs().max()) <= 1e-6 * float(a.abs().max()) for a, b in zip(g1, g2))


def capture_eagerly(monkeypatch) -> list:
    """From here on, `train` steps through a captured step that runs its body eagerly (everything but the recording,
    on the CPU: static buffers of the fixed shape, the target count and learning rate in tensors, three warm-up
    steps undone); returns the list the captured steps it makes are added to."""
    from aspan.training import graph, loop

    real, made = loop.stepping, []

    class Unrecorded(graph.CapturedStep):
        def __init__(self, run, step, shape):
            super().__init__(run, step, shape, graph=False)
            made.append(self)

    def eager_capture(run):
        shape = graph.fixed_shape(run)
        run.config.capture = True  # the batches are made at the fixed shape ...
        monkeypatch.setattr(loop, "CapturedStep", Unrecorded)
        monkeypatch.setattr(loop, "capture_autocast", lambda r: torch.autocast("cpu", enabled=False))
        assert shape == (8, TOK.offset + TASK.max_text_len() + 1)
        return real(run)  # ... and stepped by a CapturedStep that runs its body eagerly

    monkeypatch.setattr(loop, "stepping", eager_capture)
    return made


WIDTH = TOK.offset + TASK.max_text_len() + 1  # the captured step's fixed width


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "bias"])
def test_the_captured_step_without_its_graph_trains_as_the_loop(monkeypatch, bias):
    """Everything of the captured step but the recording trains as the loop does, up to float rounding; the
    warm-up leaves no trace (undone, it would move the weights by far more). With an attention bias (a tensor, on
    some heads of one layer) the step reads the mask its warm-up made, and keeps it."""
    table = torch.randn(WIDTH, WIDTH, generator=torch.Generator().manual_seed(0))
    fwd = (lambda m: hooks.attn_bias(table, layers=1, heads=[0, 2], model=m)) if bias else (lambda m: [])
    m1, m2 = tiny(), tiny()
    eager = train(m1, TOK, TASK, cfg(steps=8), progress=False, fwd_hooks=fwd(m1))
    made = capture_eagerly(monkeypatch)
    captured = train(m2, TOK, TASK, cfg(steps=8), progress=False, fwd_hooks=fwd(m2))
    losses = lambda r: [x["loss"] for x in r.history if x["kind"] == "train"]  # noqa: E731
    assert losses(captured) == pytest.approx(losses(eager), rel=1e-5) and len(losses(eager)) == 8
    for p, q in zip(eager.model.parameters(), captured.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=2e-5)  # a kept warm-up: ~1e-2
    (step,) = made
    kept = {id(x) for x in step.kept}
    assert step.biases == ([(table, table._version)] if bias else []) and step.kept
    assert all(id(x) in kept for x in fused.tables(m2).values())  # what the steps read is kept with the step
    if bias:  # the same training without the bias differs: the bias reached the captured step
        plain = train(tiny(), TOK, TASK, cfg(steps=8), progress=False)
        assert losses(plain)[1:] != pytest.approx(losses(captured)[1:], rel=1e-3)


def test_a_bias_changed_after_the_recording_is_refused(monkeypatch):
    """The recorded step would not see a bias changed in place: the next step says so, in one line."""
    table = torch.zeros(WIDTH, WIDTH)
    model = tiny()
    capture_eagerly(monkeypatch)
    with pytest.raises(ValueError, match="changed in place after it was recorded") as info:
        train(model, TOK, TASK, cfg(steps=8, curve_every=2), progress=False, curve_data={"id": TASK.generate(4)},
              fwd_hooks=hooks.attn_bias(table, model=model), on_curve=lambda rows: table.add_(1.0))
    assert "\n" not in str(info.value) and "capture=False" in str(info.value)


def test_adamw_is_fused_on_cuda_and_multi_tensor_on_the_cpu():
    """CUDA float tensors take the fused AdamW, CPU ones the multi-tensor one (whose numbers the loop's bit-for-bit
    test above checks against the default per-tensor loop); mixed devices keep PyTorch's default."""
    from aspan.training.optim import adamw_options, fused_ok

    assert _optimizer(tiny(), TrainConfig.scratch()).defaults["foreach"] is True

    class Cuda(torch.Tensor):  # reports CUDA without a GPU
        is_cuda = True

        @property
        def device(self):
            return torch.device("cuda", 0)

    cpu, fake = [torch.zeros(2)], [torch.zeros(2).as_subclass(Cuda)]
    assert not fused_ok(cpu) and fused_ok(fake) and not fused_ok(fake + cpu) and not fused_ok([])
    assert not fused_ok([torch.zeros(2, dtype=torch.long).as_subclass(Cuda)])
    assert (adamw_options(fake), adamw_options(cpu), adamw_options(fake + cpu)) == ({"fused": True},
                                                                                  {"foreach": True}, {})


def _ddp_budget_worker(rank: int, world: int, init: str, out: str) -> None:
    import warnings

    import torch.distributed as dist

    from aspan.training import loop

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    torch.set_num_threads(1)
    model = tiny(seed=rank)
    saved, save = [], loop._checkpoint
    loop._checkpoint = lambda run, step: (saved.append(step), save(run, step))
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:  # the two clocks disagree on when a checkpoint is due: rank 0's decides for both
        budget = TimeBudget(10**6, 3 if rank == 0 else 10**6, ticks())
        with time_budget(budget):
            train(model, TOK, TASK, cfg(steps=8, log_every=8), out_dir=f"{out}/run", progress=False)
        torch.save(saved, f"{out}/saved{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_ddp_processes_take_the_budgets_checkpoints_together(tmp_path):
    """A checkpoint reads the steps' values (an all-reduce under DDP), so every process takes it at the same step,
    whatever its own clock says."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(_ddp_budget_worker, args=(2, f"file://{tmp_path}/init", str(tmp_path)), nprocs=2,
                             join=False, start_method="fork")
    deadline = 120
    while not ctx.join(timeout=1):
        deadline -= 1
        if deadline == 0:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the processes deadlocked")
    assert torch.load(tmp_path / "saved0.pt") == torch.load(tmp_path / "saved1.pt") == [2, 5, 8]
