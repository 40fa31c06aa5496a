"""Attention Bias Calibration and Scaffolding: pre-softmax biases that carry to longer inputs.

Duan & Shi 2023, "From Interpolation to Extrapolation: Complete Length Generalization for Arithmetic
Transformers" (arXiv 2310.11984).

ABC: average each head's attention over correctly solved ID samples; along every line of four directions -- diagonal
(`q - k` constant), anti-diagonal (`q + k - 2*sep` constant, `sep` the prompt's last position, so it carries over
lengths), vertical (`k` constant) and aligned (in each segment of the text, the key's index minus the target index,
the index of a digit being its significance in either number layout: digit i of an operand for output digit i, the
decoder-only form of the paper's cross-attention diagonal) -- sum that average; keep lines whose sum is at least
`mean + lam * std` of the non-zero sums (pooled over directions); every cell on no kept line gets a large negative
bias. Lines are stored by index, so the bias exists at any length (the "extension"), per batch element (its own
coordinates). Prompt rows get their own lines (diagonal, vertical) with `rows="all"`.
ABS: a fixed window instead: `abs_window` from a task's references (the aligned keys), or `window_lines`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..options import DIRECTIONS, Direction, Mode, Rows, check_option
from ..tasks.base import SEPARATORS
from .calibration import calibrate  # noqa: F401  (the paper's Algorithm 1, beside the aligned variant below)

if TYPE_CHECKING:  # annotations only: pandas loads where a table is built, training where a run fine-tunes
    import pandas as pd

    from ..training.config import TrainConfig

PROMPT_DIRECTIONS = ("diagonal", "vertical")  # the directions that mean the same on prompt rows at any length
NEG = -1e4  # "large negative": zero after softmax, yet finite so a row without kept cells stays a softmax
STRIDE = 1 << 12  # aligned line index = segment * STRIDE + (local index of the key - target index) + STRIDE // 2
MISSING = -(1 << 30)  # line index of cells that lie on no line of a direction


@dataclass(frozen=True)
class Coords:
    """Where every position of a batch sits: the prompt's last position `sep` (the row predicting target char 0)
    and, for the aligned direction, each position's segment (the text split after every separator; -1 for the
    prefix) and its index inside that segment. Positions past the known ones continue the last segment (generated
    target digits), so the coordinates exist at any length."""

    sep: Int[Tensor, "batch"]
    segment: Int[Tensor, "batch pos"] | None = None
    local: Int[Tensor, "batch pos"] | None = None

    @classmethod
    def of(cls, x: "Coords | Tensor") -> "Coords":
        """`x` as `Coords` (a tensor is taken as the separator positions)."""
        return x if isinstance(x, Coords) else cls(sep=torch.as_tensor(x))

    def to(self, device) -> "Coords":
        """The coordinates moved to `device`."""
        move = (lambda t: None if t is None else t.to(device))  # noqa: E731
        return Coords(self.sep.to(device), move(self.segment), move(self.local))

    def _upto(self, n: int) -> tuple[Tensor, Tensor]:
        if self.segment is None or self.local is None:
            raise ValueError("the aligned direction needs segment coordinates: build them with coords(batch)")
        seg, loc = self.segment, self.local
        extra = n - seg.shape[1]
        if extra > 0:
            step = torch.arange(1, extra + 1, device=loc.device)
            seg = torch.cat([seg, seg[:, -1:].expand(-1, extra)], 1)
            loc = torch.cat([loc, loc[:, -1:] + step], 1)
        return seg[:, :n], loc[:, :n]

    def index(self, direction: str, q: Int[Tensor, "q"], k: Int[Tensor, "k"]) -> Int[Tensor, "batch q k"]:
        """Line index of every cell (query positions `q`, key positions `k`) in `direction`, per batch element."""
        b = self.sep.shape[0]
        qq, kk, s = q.view(1, -1, 1), k.view(1, 1, -1), self.sep.view(b, 1, 1).to(q.device)
        if direction == "aligned":
            seg, loc = self._upto(int(k[-1]) + 1)
            seg, loc = seg[:, k].unsqueeze(1), loc[:, k].unsqueeze(1)
            idx = seg * STRIDE + loc - (qq - s) + STRIDE // 2
            return torch.where((seg >= 0) & (qq >= s), idx, MISSING)
        return line_index(direction, qq, kk, s).expand(b, q.shape[0], k.shape[0])


def text_coords(text: str, offset: int, n: int, msd_width: int | None = None,
                prompt_len: int | None = None) -> tuple[Int[Tensor, "pos"], Int[Tensor, "pos"]]:
    """(segment, local index) of `n` positions: `offset` prefix positions (segment -1), then `text` split after
    every separator, then positions continuing the last segment (EOS, padding, generated characters).

    `msd_width`: the prompt's numbers are written most significant digit first, zero-padded to this width (Duan &
    Shi's padded layout, `layout="padded"` of successor and addition, whose answer stays least significant first):
    the local index of every position of the first `prompt_len` characters is then counted from its number's last
    digit (`msd_width - 1 - index`: the digit's significance, the separator -1), as the least-significant-first
    layout counts it from the first, so that an aligned line holds the same digits in both layouts."""
    seg = torch.full((n,), -1, dtype=torch.long)
    loc = torch.zeros(n, dtype=torch.long)
    sid = li = 0
    for j, ch in enumerate(text[: max(0, n - offset)]):
        seg[offset + j], loc[offset + j] = sid, li
        sid, li = (sid + 1, 0) if ch in SEPARATORS else (sid, li + 1)
    end = min(n, offset + len(text))
    seg[end:] = sid
    loc[end:] = torch.arange(li, li + n - end)
    if msd_width is not None:
        prompt = slice(offset, min(n, offset + (len(text) if prompt_len is None else prompt_len)))
        loc[prompt] = msd_width - 1 - loc[prompt]
    return seg, loc


def msd_width(sample) -> int | None:
    """The width of a sample whose numbers are written most significant digit first, zero-padded (successor and
    addition in `layout="padded"`; their answer is least significant first), else None (`text_coords`)."""
    padded = sample.params.get("layout") == "padded" and sample.task in ("successor", "addition")
    return sample.params.get("width") if padded else None


def coords(batch) -> Coords:
    """The coordinates of a batch (see `Coords`): segments split after each separator of the text; the local index
    of a digit is its significance in both number layouts (`text_coords`, `msd_width`)."""
    n = batch.tokens.shape[1]
    pairs = [text_coords(s.text, batch.offset, n, msd_width(s), s.prompt_len) for s in batch.samples]
    dev = batch.tokens.device
    seg, loc = (torch.stack(x).to(dev) for x in zip(*pairs))
    return Coords(separators(batch), seg, loc)


def line_index(
    direction: Direction, q: Int[Tensor, "..."], k: Int[Tensor, "..."], sep: Int[Tensor, "..."]
) -> Int[Tensor, "..."]:
    """Index of the line through cell (q, k) in `direction` (broadcasting); `sep` aligns anti-diagonals.

    The aligned direction needs segments: see `Coords.index`."""
    if direction == "diagonal":
        return q - k
    if direction == "anti":
        return q + k - 2 * sep
    if direction == "vertical":
        return k + 0 * q
    if direction == "aligned":
        raise ValueError("the aligned direction needs segment coordinates (Coords.index)")
    raise ValueError(f"direction must be one of {', '.join(map(repr, DIRECTIONS))}, got {direction!r}")


def _accumulate(acc: dict[str, dict[int, Tensor]], w: Tensor, idx: Tensor, present: Tensor) -> None:
    """Add the attention `w` [head, cells] of the `present` cells to the running line sums `acc` of one direction."""
    present = present & (idx != MISSING)
    sel = idx[present]
    if not sel.numel():
        return
    lines, inv = torch.unique(sel, return_inverse=True)
    out = torch.zeros(w.shape[0], lines.numel(), device=w.device).index_add_(1, inv, w[:, present])
    for j, line in enumerate(lines.tolist()):
        acc[line] = acc.get(line, torch.zeros(w.shape[0])) + out[:, j].cpu()


@dataclass
class LineSums:
    """Running sums of attention along lines per direction, `{direction: {line: Float[head]}}`, over `n` samples:
    `sums` over target rows, `prompt` over prompt rows (diagonal and vertical only)."""

    n_heads: int
    sums: dict[str, dict[int, Tensor]] = field(default_factory=lambda: {d: {} for d in DIRECTIONS})
    prompt: dict[str, dict[int, Tensor]] = field(default_factory=lambda: {d: {} for d in PROMPT_DIRECTIONS})
    n: int = 0

    def add(
        self,
        attn: Float[Tensor, "batch head q k"],
        coords: "Coords | Int[Tensor, 'batch']",
        rows: Bool[Tensor, "batch q"],
        prompt_rows: Bool[Tensor, "batch q"] | None = None,
    ) -> None:
        """Accumulate the attention of target `rows` (and `prompt_rows`) of every sample."""
        c = Coords.of(coords).to(attn.device)
        b, h, nq, nk = attn.shape
        if h != self.n_heads:
            raise ValueError(f"attention has {h} heads, expected {self.n_heads}")
        q, k = torch.arange(nq, device=attn.device), torch.arange(nk, device=attn.device)
        causal = k.view(1, 1, nk) <= q.view(1, nq, 1)
        w = attn.float().permute(1, 0, 2, 3).reshape(h, -1)  # [head, cells]
        for acc, rr in ((self.sums, rows), (self.prompt, prompt_rows)):
            if rr is None:
                continue
            present = (rr.view(b, nq, 1).to(attn.device) & causal).reshape(-1)
            for d in acc:
                if d == "aligned" and c.segment is None:
                    continue
                _accumulate(acc[d], w, c.index(d, q, k).reshape(-1), present)
        self.n += b

    def mean(self, direction: str, group: str = "target") -> tuple[list[int], Float[Tensor, "head line"]]:
        """(line indices, sums of the sample-averaged attention along each line) for one direction."""
        table = (self.sums if group == "target" else self.prompt).get(direction, {})
        lines = sorted(table)
        if not lines or self.n == 0:
            return [], torch.zeros(self.n_heads, 0)
        return lines, torch.stack([table[i] for i in lines], 1) / self.n


def select_lines(sums: Float[Tensor, "line"], lam: float = 0.87, eps: float = 1e-9) -> Bool[Tensor, "line"]:
    """Lines whose sum is >= mean + lam * std (population) of the non-zero sums."""
    nz = sums[sums > eps]
    if nz.numel() == 0:
        return torch.zeros_like(sums, dtype=torch.bool)
    thr = nz.mean() + lam * nz.std(unbiased=False)
    return (sums >= thr - 1e-12) & (sums > eps)


def _kept(lines: dict[str, tuple[int, ...]], c: Coords, q: Tensor, k: Tensor) -> Bool[Tensor, "batch q k"]:
    kept = torch.zeros(c.sep.shape[0], q.shape[0], k.shape[0], dtype=torch.bool, device=q.device)
    for d, ls in lines.items():
        if ls:
            kept |= torch.isin(c.index(d, q, k), torch.tensor(ls, device=q.device))
    return kept


@dataclass(frozen=True)
class HeadLines:
    """Kept lines of one head: `lines` `{direction: (line, ...)}` on target rows, `prompt` on prompt rows (None:
    prompt rows unbiased). A row left without any kept causal key keeps its own position, so that every biased
    row attends the same way at any length."""

    lines: dict[str, tuple[int, ...]]
    prompt: dict[str, tuple[int, ...]] | None = None

    def bias(
        self, coords: "Coords | Int[Tensor, 'batch']", q_len: int, k_len: int, neg: float = NEG
    ) -> Float[Tensor, "batch q k"]:
        """The bias for queries at positions `k_len - q_len .. k_len - 1` (KV cache) over keys `0 .. k_len - 1`."""
        c = Coords.of(coords)
        dev = c.sep.device
        q, k = torch.arange(k_len - q_len, k_len, device=dev), torch.arange(k_len, device=dev)
        target = q.view(1, -1, 1) >= c.sep.view(-1, 1, 1)
        other = torch.ones_like(target) if self.prompt is None else _kept(self.prompt, c, q, k)
        kept = torch.where(target, _kept(self.lines, c, q, k), other)
        diag = k.view(1, 1, -1) == q.view(1, -1, 1)
        empty = ~(kept & (k.view(1, 1, -1) <= q.view(1, -1, 1))).any(-1, keepdim=True)
        return torch.where(kept | (empty & diag), 0.0, neg)


def extract_lines(
    stats: LineSums, lam: float = 0.87, directions: Sequence[Direction] = DIRECTIONS, rows: Rows = "target",
    pooled: bool = True,
) -> list[HeadLines]:
    """Per head, the lines kept in each direction (the threshold rule of Duan & Shi 2023, Section 5).

    `pooled`: the mean and std come from the non-zero sums of all directions together (default), so that the
    lines of one direction crossing a strong line of another (every anti-diagonal crosses a diagonal once)
    are not kept for being uniform; `pooled=False` thresholds each direction on its own. `rows="all"` also
    keeps lines for the prompt rows (diagonal and vertical, from their own sums).
    """
    for d in directions:
        check_option("direction", d, DIRECTIONS)
    if lam < 0:
        raise ValueError(f"lambda must be >= 0, got {lam}")
    if rows not in ("target", "all"):
        raise ValueError(f"rows must be 'target' or 'all', got {rows!r}")
    target = _threshold(stats, lam, directions, pooled, "target")
    prompt = _threshold(stats, lam, PROMPT_DIRECTIONS, pooled, "prompt") if rows == "all" else None
    return [HeadLines(lines=t, prompt=None if prompt is None else prompt[h]) for h, t in enumerate(target)]


def _threshold(stats: LineSums, lam: float, directions: Sequence[str], pooled: bool, group: str) -> list[dict]:
    per_dir = {d: stats.mean(d, group) for d in directions}
    per_head: list[dict[str, tuple[int, ...]]] = [{} for _ in range(stats.n_heads)]
    for h in range(stats.n_heads):
        if pooled:
            flat = torch.cat([sums[h] for _, sums in per_dir.values()])
            keep = select_lines(flat, lam).split([len(lines) for lines, _ in per_dir.values()])
        else:
            keep = [select_lines(sums[h], lam) for _, sums in per_dir.values()]
        for (d, (lines, _)), k in zip(per_dir.items(), keep):
            per_head[h][d] = tuple(line for line, kk in zip(lines, k.tolist()) if kk)
    return per_head


def window_lines(direction: str, line: int, width: int) -> HeadLines:
    """A window of lines `line - width .. line + width` of one direction on target rows (prompt rows free)."""
    if width < 0:
        raise ValueError(f"window width must be >= 0, got {width}")
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; choose from {', '.join(DIRECTIONS)}")
    return HeadLines(lines={direction: tuple(range(line - width, line + width + 1))})


def aligned_line(segment: int, offset: int) -> int:
    """The aligned line holding, for target char t, the key at index `t + offset` of `segment`."""
    return segment * STRIDE + offset + STRIDE // 2


def reference_offsets(samples, tokenizer) -> dict[int, list[int]]:
    """Per prompt segment, the aligned offsets (key index in the segment minus target index) of the references."""
    from ..batching import make_batch

    b = make_batch(list(samples), tokenizer)
    c = coords(b)
    seen: dict[int, set[int]] = {}
    for i, s in enumerate(b.samples):
        for q, key in zip(*s.ref_pairs(b.offset)):
            if key < b.offset + s.prompt_len:  # a prompt reference
                t = q - int(c.sep[i])
                seen.setdefault(int(c.segment[i, key]), set()).add(int(c.local[i, key]) - t)
    return {seg: sorted(v) for seg, v in sorted(seen.items())}


def abs_window(samples, tokenizer, width: int = 1, prompt_width: int = 2) -> HeadLines:
    """ABS (Duan & Shi 2023, Section 4) defined by a task's references: on target rows, in every prompt segment
    that holds references, the `width` keys ending at the aligned key (the reference of largest offset, e.g.
    digit i of each operand for sum digit i, bit i for parity output i); every other key gets NEG. Prompt rows
    see the `prompt_width` last tokens (themselves and their predecessors), so no row's attention depends on
    the length."""
    if width < 1 or prompt_width < 1:
        raise ValueError(f"ABS widths must be >= 1, got width={width}, prompt_width={prompt_width}")
    offsets = reference_offsets(samples, tokenizer)
    if not offsets:
        raise ValueError("the samples have no prompt references to align the ABS window on")
    lines = tuple(aligned_line(seg, c) for seg, cs in offsets.items() for c in range(max(cs) - width + 1, max(cs) + 1))
    return HeadLines(lines={"aligned": lines}, prompt={"diagonal": tuple(range(prompt_width))})


# --- on a model ----------------------------------------------------------------------------------------------

Head = tuple[int, int]


def separators(batch) -> Int[Tensor, "batch"]:
    """Per sample, the position of the prompt's last token (the row predicting target char 0): anti-diagonal origin."""
    return torch.tensor([batch.offset + s.prompt_len - 1 for s in batch.samples], device=batch.tokens.device)


@torch.no_grad()
def line_stats(
    model, tokenizer, samples, batch_size: int = 32, rows: Rows = "target", progress: bool = False
) -> dict[int, LineSums]:
    """Per layer, line sums of every head's attention over `samples` (target rows; with rows="all" prompt rows too)."""
    from tqdm.auto import tqdm

    import hooks

    from ..batching import make_batch

    if rows not in ("target", "all"):
        raise ValueError(f"rows must be 'target' or 'all', got {rows!r}")
    cfg = model.cfg
    stats = {layer: LineSums(cfg.n_heads) for layer in range(cfg.n_layers)}
    for i in tqdm(range(0, len(samples), batch_size), desc="ABC line sums", disable=not progress, leave=False):
        batch = make_batch(samples[i : i + batch_size], tokenizer, n_ctx=cfg.n_ctx).to(cfg.device)
        pats = hooks.capture(model, batch.tokens, list(range(cfg.n_layers)), attention_mask=batch.attention_mask)
        real = batch.attention_mask.bool()
        c = coords(batch)
        prompt_rows = real & (torch.arange(real.shape[1], device=real.device)[None] < c.sep[:, None])
        for layer in range(cfg.n_layers):
            attn = torch.stack([pats[(layer, h)] for h in range(cfg.n_heads)], 1)
            stats[layer].add(attn, c, batch.target_rows & real, prompt_rows if rows == "all" else None)
    return stats


def correct_samples(model, tokenizer, samples, batch_size: int = 32) -> list:
    """The samples the model solves exactly (teacher-forced): ABC averages only over those."""
    from ..accuracy import accuracy

    samples = list(samples)
    acc = accuracy(model, tokenizer, samples, batch_size=batch_size)
    return [s for s, ok in zip(samples, (acc.exact & (acc.rows > 0)).tolist()) if ok]


@dataclass(frozen=True)
class ABCSettings:
    """The settings of ABC line extraction (`abc_lines`) and of an ABC/ABS run (`run_abc`)."""

    lam: float = 0.87  # keep lines whose attention sum is >= mean + lam * std (Duan & Shi 2023)
    directions: Sequence[Direction] = DIRECTIONS  # line directions considered
    rows: Rows = "target"  # query rows the lines are computed and applied on
    pooled: bool = True  # threshold on the statistics of every direction together (False: each on its own)
    correct_only: bool = True  # calibrate only on the ID samples the model solves exactly
    mode: Mode = "teacher"  # evaluation mode (teacher-forced or generated)
    batch_size: int = 32  # evaluation and calibration batch size
    finetune: "TrainConfig | None" = None  # also fine-tune under the bias with this config (None: no fine-tuning)
    finetune_data: object = None  # what fine-tuning trains on: a Task, samples or a JSONL path
    progress: bool = False  # show tqdm bars


def abc_lines(model, tokenizer, samples, settings: ABCSettings = ABCSettings()) -> dict[Head, HeadLines]:
    """ABC: the kept lines of every head, from its attention averaged over the (correctly solved) ID `samples`."""
    st = settings
    samples = list(samples)
    if st.correct_only:
        samples = correct_samples(model, tokenizer, samples, st.batch_size)
        if not samples:
            raise ValueError("the model solves none of the ID samples: ABC needs a model that interpolates")
    stats = line_stats(model, tokenizer, samples, st.batch_size, st.rows, st.progress)
    return {
        (layer, h): lines
        for layer, s in stats.items()
        for h, lines in enumerate(extract_lines(s, st.lam, st.directions, st.rows, st.pooled))
    }


def every_head(model, head_lines: HeadLines, heads: Sequence[Head] | None = None) -> dict[Head, HeadLines]:
    """The same lines on `heads` (default: every head of every layer)."""
    cfg = model.cfg
    heads = heads if heads is not None else [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    return {(int(l), int(h)): head_lines for l, h in heads}


def abs_lines(
    model, direction: str, line: int, width: int, heads: Sequence[Head] | None = None
) -> dict[Head, HeadLines]:
    """ABS: the same window of lines `line - width .. line + width` (one direction) on `heads` (default: all)."""
    return every_head(model, window_lines(direction, line, width), heads)


def bias_hooks(lines: dict[Head, HeadLines], where: "Coords | Tensor", model=None, neg: float = NEG) -> list:
    """`hooks.attn_bias` hooks adding each head's bias (per batch element, any length, KV cache) to its scores;
    `where` is the batch's `coords` (or only its separators when no head uses the aligned direction)."""
    import hooks

    c = Coords.of(where)
    by_layer: dict[int, list[int]] = {}
    for layer, h in sorted(lines):
        by_layer.setdefault(layer, []).append(h)
    out = []
    cache: dict[tuple, Tensor] = {}  # one bias per distinct HeadLines and shape, shared by heads and layers

    def one(hl: HeadLines, q_len: int, k_len: int, device) -> Tensor:
        key = (id(hl), q_len, k_len, str(device))
        if key not in cache:
            if len(cache) > 64:
                cache.clear()
            cache[key] = hl.bias(c.to(device), q_len, k_len, neg)
        return cache[key]

    for layer, hs in by_layer.items():
        per_head = [lines[(layer, h)] for h in hs]

        def fn(q_len: int, k_len: int, device=None, per_head=per_head) -> Tensor:
            return torch.stack([one(hl, q_len, k_len, device) for hl in per_head], 1)  # [batch, head, q, k]

        out += hooks.attn_bias(fn, heads=[(layer, h) for h in hs], model=model)
    return out


def abc_bias(lines: dict[Head, HeadLines], model=None, neg: float = NEG):
    """A hook factory `f(batch) -> hooks` for `evaluate(..., fwd_hooks=...)` and `train(..., fwd_hooks=...)`."""
    if not lines:
        raise ValueError("no heads to bias")
    return lambda batch: bias_hooks(lines, coords(batch), model, neg)


def abs_bias(model, direction: str, line: int, width: int, heads: Sequence[Head] | None = None, neg: float = NEG):
    """ABS hook factory: a fixed window around one line on `heads` (see `abs_lines`)."""
    return abc_bias(abs_lines(model, direction, line, width, heads), model, neg)


def lines_table(lines: dict[Head, HeadLines]) -> "pd.DataFrame":
    """One row per head, row group (target, prompt) and direction: the kept line indices (JSON-friendly)."""
    import pandas as pd

    return pd.DataFrame([
        {"layer": l, "head": h, "rows": group, "direction": d, "lines": list(v), "n_lines": len(v)}
        for (l, h), hl in sorted(lines.items())
        for group, table in (("target", hl.lines), ("prompt", hl.prompt or {}))
        for d, v in table.items()
    ])


@dataclass
class ABCResult:
    """What an ABC run returns: each head's lines, the table per variant, split and length, and the summaries."""
    lines: dict[Head, HeadLines]
    table: "pd.DataFrame"  # variant, split, length, n, exact, partial, attn_rollout_sample, attn_rollout_raw
    summary: dict  # {variant: {split: evaluate summary}}


def run_abc(
    model, tokenizer, id_samples, ood_samples, settings: ABCSettings = ABCSettings(),
    lines: dict[Head, HeadLines] | None = None,
) -> ABCResult:
    """ABC end to end: lines from correct ID samples (or given `lines`, e.g. ABS), then ID/OOD accuracy with and
    without the bias; with `settings.finetune` (a TrainConfig) also after fine-tuning on `settings.finetune_data`
    under the bias.

    Fine-tuning changes `model` in place.
    """
    import pandas as pd

    from ..evaluation import evaluate, summarize

    st = settings
    if lines is None:
        lines = abc_lines(model, tokenizer, id_samples, st)
    bias = abc_bias(lines, model)
    tables, summary = [], {}

    def measure(variant: str, fwd) -> None:
        summary[variant] = {}
        for split, samples in (("id", id_samples), ("ood", ood_samples)):
            res = evaluate(model, tokenizer, samples, fwd_hooks=fwd, mode=st.mode, batch_size=st.batch_size,
                           progress=st.progress)
            summary[variant][split] = res.summary()
            tables.append(summarize(res, by="length").assign(variant=variant, split=split))

    measure("baseline", ())
    measure("bias", bias)
    if st.finetune is not None:
        from ..training import train

        if st.finetune_data is None:
            raise ValueError("finetune needs finetune_data (a Task, samples or a JSONL path)")
        train(model, tokenizer, st.finetune_data, st.finetune, fwd_hooks=bias, progress=st.progress)
        measure("bias+finetune", bias)
        measure("finetune (no bias)", ())
    table = pd.concat(tables, ignore_index=True)
    cols = ["variant", "split", "length", "n", "exact", "partial", "attn_rollout_sample", "attn_rollout_raw"]
    return ABCResult(lines, table[cols], summary)


def abc_figure(table: "pd.DataFrame", split: str = "ood", metric: str = "exact"):
    """Accuracy vs length for each variant (baseline, bias, fine-tuned) on one split."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for variant, g in table[table.split == split].groupby("variant", sort=False):
        fig.add_scatter(x=g.length, y=g[metric], mode="lines+markers", name=variant)
    fig.update_layout(title=f"ABC/ABS: {metric} accuracy vs length ({split})", xaxis_title="target length",
                      yaxis_title=f"{metric} accuracy", yaxis={"range": [0, 1.02]})
    return fig


def bias_figure(head_lines: HeadLines, sample, offset: int = 1, title: str | None = None):
    """Heatmap of one head's bias on `sample` (0 kept, NEG elsewhere; causal part only; EOS row included)."""
    import plotly.graph_objects as go

    length = offset + len(sample.text) + 1
    seg, loc = text_coords(sample.text, offset, length)
    c = Coords(torch.tensor([offset + sample.prompt_len - 1]), seg[None], loc[None])
    b = head_lines.bias(c, length, length)[0]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    z = torch.where(causal, (b == 0).float(), torch.tensor(float("nan")))
    fig = go.Figure(go.Heatmap(z=z.tolist(), colorscale=[[0, "#eee"], [1, "#d62728"]], showscale=False,
                               hovertemplate="q %{y}, k %{x}: %{z}<extra></extra>"))
    fig.update_layout(title=title or "ABC bias: kept cells", xaxis_title="key position", yaxis_title="query position",
                      yaxis={"autorange": "reversed"})
    return fig
