"""Attention Bias Calibration and Scaffolding (seed 003, SPEC 6): pre-softmax biases that carry to longer inputs.

ABC: average each head's attention over correctly solved ID samples; along every line of three directions --
diagonal (`q - k` constant), anti-diagonal (`q + k - 2*sep` constant, `sep` the prompt's last position, so it
carries over lengths) and vertical (`k` constant) -- sum that average; keep lines whose sum is at least
`mean + lam * std` of the non-zero sums (pooled over directions); every cell on no kept line gets a large negative bias. Lines are
stored by index, so the bias exists at any length (the "extension"), per batch element (its own `sep`).
ABS: a fixed window of width `w` around one line instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

DIRECTIONS = ("diagonal", "anti", "vertical")
NEG = -1e4  # "large negative": zero after softmax, yet finite so a row without kept cells stays a softmax


def line_index(direction: str, q: Int[Tensor, "..."], k: Int[Tensor, "..."], sep: Int[Tensor, "..."]) -> Int[Tensor, "..."]:
    """Index of the line through cell (q, k) in `direction` (broadcasting); `sep` aligns anti-diagonals."""
    if direction == "diagonal":
        return q - k
    if direction == "anti":
        return q + k - 2 * sep
    if direction == "vertical":
        return k + 0 * q
    raise ValueError(f"unknown direction {direction!r}; choose from {', '.join(DIRECTIONS)}")


@dataclass
class LineSums:
    """Running sums of attention along lines, per direction: `{direction: {line: Float[head]}}`, over `n` samples."""

    n_heads: int
    sums: dict[str, dict[int, Tensor]] = field(default_factory=lambda: {d: {} for d in DIRECTIONS})
    n: int = 0

    def add(
        self,
        attn: Float[Tensor, "batch head q k"],
        sep: Int[Tensor, "batch"],
        rows: Bool[Tensor, "batch q"],
    ) -> None:
        """Accumulate the attention of `rows` (query positions) of every sample; `sep[b]` is its prompt's last position."""
        b, h, nq, nk = attn.shape
        if h != self.n_heads:
            raise ValueError(f"attention has {h} heads, expected {self.n_heads}")
        q = torch.arange(nq, device=attn.device).view(1, nq, 1)
        k = torch.arange(nk, device=attn.device).view(1, 1, nk)
        keep = rows.view(b, nq, 1) & (k <= q)  # causal cells of the chosen rows
        w = (attn.float() * keep.unsqueeze(1)).permute(1, 0, 2, 3).reshape(h, -1)  # [head, cells]
        for d in DIRECTIONS:
            idx = line_index(d, q, k, sep.view(b, 1, 1).to(attn.device)).expand(b, nq, nk).reshape(-1)
            lo = int(idx.min())
            width = int(idx.max()) - lo + 1
            acc = torch.zeros(h, width, device=attn.device).scatter_add_(1, (idx - lo).expand(h, -1), w)
            present = (keep.reshape(-1)).nonzero().squeeze(1)
            for line in torch.unique(idx[present]).tolist():
                s = acc[:, line - lo].cpu()
                self.sums[d][line] = self.sums[d].get(line, torch.zeros(h)) + s
        self.n += b

    def mean(self, direction: str) -> tuple[list[int], Float[Tensor, "head line"]]:
        """(line indices, sums of the sample-averaged attention along each line) for one direction."""
        lines = sorted(self.sums[direction])
        if not lines or self.n == 0:
            return [], torch.zeros(self.n_heads, 0)
        return lines, torch.stack([self.sums[direction][i] for i in lines], 1) / self.n


def select_lines(sums: Float[Tensor, "line"], lam: float = 0.87, eps: float = 1e-9) -> Bool[Tensor, "line"]:
    """Lines whose sum is >= mean + lam * std (population) of the non-zero sums."""
    nz = sums[sums > eps]
    if nz.numel() == 0:
        return torch.zeros_like(sums, dtype=torch.bool)
    thr = nz.mean() + lam * nz.std(unbiased=False)
    return (sums >= thr - 1e-12) & (sums > eps)


@dataclass(frozen=True)
class HeadLines:
    """Kept lines of one head: `{direction: (line, ...)}`, and whether the bias covers every row or only target rows."""

    lines: dict[str, tuple[int, ...]]
    rows: str = "target"

    def bias(
        self, sep: Int[Tensor, "batch"], q_len: int, k_len: int, neg: float = NEG
    ) -> Float[Tensor, "batch q k"]:
        """The bias for queries at positions `k_len - q_len .. k_len - 1` (KV cache) over keys `0 .. k_len - 1`."""
        b = sep.shape[0]
        q = torch.arange(k_len - q_len, k_len, device=sep.device).view(1, q_len, 1)
        k = torch.arange(k_len, device=sep.device).view(1, 1, k_len)
        s = sep.view(b, 1, 1)
        kept = torch.zeros(b, q_len, k_len, dtype=torch.bool, device=sep.device)
        for d, lines in self.lines.items():
            if lines:
                idx = line_index(d, q, k, s).expand(b, q_len, k_len)
                kept |= torch.isin(idx, torch.tensor(lines, device=sep.device))
        if self.rows == "target":
            kept |= q < s  # prompt rows stay unbiased
        return torch.where(kept, 0.0, neg)


def extract_lines(
    stats: LineSums, lam: float = 0.87, directions: Sequence[str] = DIRECTIONS, rows: str = "target", pooled: bool = True
) -> list[HeadLines]:
    """Per head, the lines kept in each direction (SPEC 6 threshold rule).

    `pooled`: the mean and std come from the non-zero sums of all directions together (default), so that the
    lines of one direction crossing a strong line of another (every anti-diagonal crosses a diagonal once)
    are not kept for being uniform; `pooled=False` thresholds each direction on its own.
    """
    for d in directions:
        if d not in DIRECTIONS:
            raise ValueError(f"unknown direction {d!r}; choose from {', '.join(DIRECTIONS)}")
    if lam < 0:
        raise ValueError(f"lambda must be >= 0, got {lam}")
    if rows not in ("target", "all"):
        raise ValueError(f"rows must be 'target' or 'all', got {rows!r}")
    per_dir = {d: stats.mean(d) for d in directions}
    per_head: list[dict[str, tuple[int, ...]]] = [{} for _ in range(stats.n_heads)]
    for h in range(stats.n_heads):
        if pooled:
            flat = torch.cat([sums[h] for _, sums in per_dir.values()])
            keep = select_lines(flat, lam).split([len(lines) for lines, _ in per_dir.values()])
        else:
            keep = [select_lines(sums[h], lam) for _, sums in per_dir.values()]
        for (d, (lines, _)), k in zip(per_dir.items(), keep):
            per_head[h][d] = tuple(line for line, kk in zip(lines, k.tolist()) if kk)
    return [HeadLines(lines=p, rows=rows) for p in per_head]


def window_lines(direction: str, line: int, width: int) -> HeadLines:
    """ABS: the lines `line - width .. line + width` of one direction (a window around the aligned key)."""
    if width < 0:
        raise ValueError(f"window width must be >= 0, got {width}")
    line_index(direction, torch.tensor(0), torch.tensor(0), torch.tensor(0))  # validates the direction
    return HeadLines(lines={direction: tuple(range(line - width, line + width + 1))})
