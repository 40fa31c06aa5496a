"""Development measurement of the fused training forward (aspan.models.fused) on a GPU, kept as it ran (only this
docstring was rewritten): equivalence on CUDA, CUDA kernels per training step, and step times against a plain
PyTorch model, interleaved, bf16 autocast and fp32. Each side is a step written here (forward, loss, backward,
clipping, fused AdamW, schedule) on batches made before timing, not aspan's `train()` loop.

Run on the lent machine from a copy of the repository's `aspan` and `hooks` while the fused forward was developed:
python3 fastfwd_gpu.py, with the output folder in $OUT (it writes fastfwd_gpu.json there; gpu_run1.json and
gpu_run2.json are two runs). README.md says what the numbers show and what they do not.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

warnings.filterwarnings("ignore")
import hooks  # noqa: E402
from aspan import models, tasks  # noqa: E402
from aspan.models import fused  # noqa: E402
from aspan.tokenization import CharTokenizer  # noqa: E402
from aspan.training import TrainConfig, lr_lambda, target_loss, train_batch  # noqa: E402
from aspan.training.optim import _optimizer  # noqa: E402

DEV = "cuda"
OUT = os.environ.get("OUT", ".")
RES: dict = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "aspan_fused": fused.__file__}
T0 = time.perf_counter()


def say(*a):
    print(f"[{time.perf_counter() - T0:6.1f}s]", *a, flush=True)


def save():
    with open(os.path.join(OUT, "fastfwd_gpu.json"), "w") as f:
        json.dump(RES, f, indent=1, default=str)


def jitter(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 or name.endswith(("b_Q", "b_K", "b_V")):
                p.add_(0.1 * torch.randn(p.shape, generator=g).to(p.device))
    return model


def hooked(model, tokens, fwd=()):
    with model.hooks(fwd_hooks=list(fwd)):
        return model(tokens)


def grads(model, fn, tokens, labels, amp):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        out = fn(tokens)
    F.cross_entropy(out.float().flatten(0, 1), labels.flatten()).backward()
    g = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.float().detach(), g


def equivalence():
    tok = CharTokenizer()
    task = tasks.get("reversal", length=(2, 12), charset="abcd")
    rows = []
    for positional in ("rotary", "learned", "alibi", "none"):
        torch.manual_seed(0)
        model = jitter(models.tiny(tok, n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=64, seed=0, device=DEV,
                                   positional=positional))
        b = train_batch(task.generate(16, seed=1), tok, 64).to(DEV)
        p = b.tokens.shape[1]
        labels = torch.randint(0, tok.vocab_size, b.tokens.shape, device=DEV)
        g = torch.Generator().manual_seed(2)
        neg = torch.where(torch.rand(len(b), 4, p, p, generator=g) < 0.5, -1e4, 0.0)
        dead = torch.zeros(p, p)
        dead[3] = float("-inf")
        cases = {"none": [], "bias": hooks.attn_bias(neg.to(DEV), model=model),
                 "heads": hooks.attn_bias(torch.randn(2, p, p, generator=g).to(DEV), layers=1, heads=[0, 3],
                                          model=model),
                 "dead_row": hooks.attn_bias(dead.to(DEV), layers=0, heads=[1], model=model)}
        for case, fwd in cases.items():
            for amp in (False, True):
                assert fused.why_not(model, fwd) is None
                ref, rg = grads(model, lambda t: hooked(model, t, fwd), b.tokens, labels, amp)  # noqa: B023
                out, fg = grads(model, lambda t: fused.logits(model, t, fwd), b.tokens, labels, amp)  # noqa: B023
                finite = bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(x).all()) for x in fg.values())
                gd = max((fg[n] - rg[n]).abs().max().item() for n in rg) if case != "dead_row" else float("nan")
                row = dict(positional=positional, case=case, amp=amp, logits=(out - ref).abs().max().item(),
                           logit_scale=ref.abs().max().item(), grads=gd, same_keys=fg.keys() == rg.keys(),
                           finite=finite)
                rows.append(row)
                say(row)
    RES["equivalence"] = rows
    save()


class Plain(nn.Module):
    def __init__(self, vocab, d=128, heads=8, layers=2, n_ctx=256, learned=False):
        super().__init__()
        self.h, self.dh, self.learned = heads, d // heads, learned
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(n_ctx, d) if learned else None
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(
            ln1=nn.LayerNorm(d), qkv=nn.Linear(d, 3 * d), o=nn.Linear(d, d), ln2=nn.LayerNorm(d),
            up=nn.Linear(d, 4 * d), down=nn.Linear(4 * d, d))) for _ in range(layers))
        self.lnf, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)
        inv = 1.0 / (10000 ** (torch.arange(0, self.dh, 2).float() / self.dh))
        ang = torch.arange(n_ctx).float()[:, None] * inv[None]
        ang = torch.cat([ang, ang], -1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def rot(self, x, p):
        if self.learned:
            return x
        x1, x2 = x.chunk(2, -1)
        return x * self.cos[:p] + torch.cat([-x2, x1], -1) * self.sin[:p]

    def forward(self, tokens, mask=None):
        b, p = tokens.shape
        x = self.emb(tokens)
        if self.learned:
            x = x + self.pos.weight[:p]
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).view(b, p, 3, self.h, self.dh).permute(2, 0, 3, 1, 4)
            z = F.scaled_dot_product_attention(self.rot(q, p), self.rot(k, p), v, attn_mask=mask,
                                               is_causal=mask is None)
            x = x + blk["o"](z.transpose(1, 2).reshape(b, p, -1))
            x = x + blk["down"](F.gelu(blk["up"](blk["ln2"](x))))
        return self.head(self.lnf(x))


def stepper(net, forward, cfg, amp):
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in _optimizer(net, cfg).param_groups]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, cfg.warmup, 10**6, cfg.min_lr_ratio))

    def step(tokens, labels, n):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            logits = forward(tokens)
        loss = target_loss(logits, labels)
        opt.zero_grad(set_to_none=True)
        (loss / n).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_clip, foreach=True)
        opt.step()
        sched.step()
    return step


def cuda_kernels(step, args):
    from torch.autograd import DeviceType

    step(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        step(*args)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)


def timed(sides, args_list, rounds, steps):
    for s in sides.values():
        for a in args_list[:3]:
            s(*a)
    torch.cuda.synchronize()
    times = {k: [] for k in sides}
    for r in range(rounds):
        for k, s in sides.items():
            for i in range(steps):
                a = args_list[(r * steps + i) % len(args_list)]
                torch.cuda.synchronize()
                t = time.perf_counter()
                s(*a)
                torch.cuda.synchronize()
                times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def shape_rows(name, make_model, make_plain, batches, bias_fwd=None, rounds=8, steps=10, plain_mask=None):
    cfg = TrainConfig.scratch()
    rows = []
    for amp in (True, False):
        model, plain = make_model(), make_plain()
        tf = fused.TrainingForward(model)
        fwd = bias_fwd(model) if bias_fwd else []
        sides = {"hooked": stepper(model, lambda t: hooked(model, t, fwd), cfg, amp),  # noqa: B023
                 "fused": stepper(model, lambda t: tf(t, fwd), cfg, amp),  # noqa: B023
                 "plain": stepper(plain, lambda t: plain(t, plain_mask), cfg, amp)}  # noqa: B023
        kern = {k: cuda_kernels(s, batches[0]) for k, s in sides.items()}
        med = timed(sides, batches, rounds, steps)
        tokens = batches[0][0].numel()
        row = dict(shape=name, amp=amp, kernels=kern, step_ms={k: 1e3 * v for k, v in med.items()},
                   fused_vs_plain=med["plain"] / med["fused"], hooked_vs_plain=med["plain"] / med["hooked"],
                   fused_tokens_per_s=tokens / med["fused"], plain_tokens_per_s=tokens / med["plain"])
        rows.append(row)
        say(row)
    return rows


def speed():
    tok = CharTokenizer()
    task = tasks.preset("reversal", "id")
    rows = []
    for bs in (1, 64, 256):
        batches = []
        for i in range(6):
            b = train_batch(task.generate(bs, seed=100 + i), tok, 256).to(DEV)
            batches.append((b.tokens, b.labels, int((b.labels != -100).sum())))
        rows += shape_rows(f"tiny reversal batch {bs}", lambda: models.tiny(tok, task="reversal", device=DEV),
                           lambda: Plain(tok.vocab_size).to(DEV), batches)
        RES["speed"] = rows
        save()
    # the ABC paper's GPU shape: 6 layers, 8 heads, d_model 128, learned positions, batch 128, ~190 positions, a
    # static [pos, pos] bias on every layer (ABS) or none (vanilla)
    p, vocab = 190, 16
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, vocab, (128, p), generator=g).to(DEV),
                torch.randint(0, vocab, (128, p), generator=g).to(DEV), 128 * 60) for _ in range(4)]
    bias = torch.where(torch.rand(p, p, generator=g) < 0.7, -1e4, 0.0)
    causal_bias = (bias.to(DEV) + torch.full((p, p), float("-inf"), device=DEV).triu(1))[None, None]

    def paper_model():
        return models.tiny(vocab, n_layers=6, n_heads=8, d_model=128, n_ctx=256, device=DEV, positional="learned")

    for biased in (False, True):
        rows += shape_rows(f"abc_paper 6x128 batch 128 p {p}{' ABS bias' if biased else ''}", paper_model,
                           lambda: Plain(vocab, layers=6, learned=True).to(DEV), batches,
                           (lambda m: hooks.attn_bias(bias.to(DEV), model=m)) if biased else None, rounds=5, steps=6,
                           plain_mask=causal_bias if biased else None)
        RES["speed"] = rows
        save()
    # evaluation forward of that shape (no grad), batch 250, with the bias
    model = paper_model().eval()
    fwd = hooks.attn_bias(bias.to(DEV), model=model)
    toks = torch.randint(0, vocab, (250, p), generator=g).to(DEV)
    ev = {}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        sides = {"hooked": lambda t: hooked(model, t, fwd), "fused": lambda t: fused.logits(model, t, fwd)}
        ev = timed({k: (lambda t, f=f: f(t).argmax(-1)) for k, f in sides.items()}, [(toks,)], 5, 6)
    RES["eval_forward_ms"] = {k: 1e3 * v for k, v in ev.items()}
    say("eval forward (abc_paper shape, batch 250, bias, bf16)", RES["eval_forward_ms"])
    save()


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        equivalence()
        speed()
    except Exception as e:  # keep what was measured
        RES["error"] = repr(e)
        save()
        raise
    say("done")
    sys.exit(0)
