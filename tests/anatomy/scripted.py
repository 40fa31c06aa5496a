"""A model whose attention is set, so that every column of a failure anatomy is known by hand.

Two layers of two heads, attention only, no LayerNorm, one-hot embeddings (d_model = 2 x vocab: block A holds the
token, block B what layer 0 moved there). Each head's pattern is replaced by a script (a permanent hook on its
`hook_pattern`), so the weights only route values:

- L0H0, the mover: row p attends to p - delta (BOS below 0) and writes that token into block B: position p then
  carries the token at p - delta, as the previous-token heads of a trained model do.
- L0H1: writes nothing (its pattern is the model's own: uniform, as its queries and keys are zero).
- L1H0, the reader (weight 3): copies block B of the key it attends to into block A, i.e. the token delta left of
  that key. Reading at ref+delta gives the expected token.
- L1H1, the distractor (weight `distractor`, 0 by default): copies the token at the key it attends to.

The unembedding reads block A, and its BOS direction votes for EOS: a reader on the position that carries BOS (key
`delta`) predicts EOS, as the shipped model does when its heads reach the start of the sequence.
At a query row r whose reader attends key c alone: logits = onehot(token[r]) + 3 onehot(token[c - delta]) (EOS for
BOS) + distractor onehot(token[c']), so the margin of a right answer is 3 - 1 = 2 and of a wrong one -3 (when the
expected token is not token[r]).
"""
from __future__ import annotations

from typing import Callable

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from aspan.tokenization import CharTokenizer

READER, DISTRACTOR, MOVER, QUIET = (1, 0), (1, 1), (0, 0), (0, 1)
CHARS = "abcdefgh="
Script = Callable[[int], torch.Tensor]  # sequence length T -> [T, T] pattern


def tokenizer() -> CharTokenizer:
    return CharTokenizer(CHARS)


def one_hot_rows(T: int, keys: dict[int, dict[int, float]] | Callable[[int], dict[int, float] | None]) -> torch.Tensor:
    """A [T, T] pattern: row r puts `keys[r]` = {key: weight} (or keys(r)); other rows attend to themselves."""
    A = torch.eye(T)
    for r in range(T):
        row = keys(r) if callable(keys) else keys.get(r)
        if row:
            A[r] = 0
            for k, w in row.items():
                A[r, k] = w
    return A


class Scripted:
    """The model and its scripts: `scripts[(layer, head)]` is a function of T (or a [T, T] tensor) or absent."""

    def __init__(self, delta: int = 1, distractor: float = 0.0, reader: float = 3.0):
        tok = tokenizer()
        self.tok, self.delta, V = tok, delta, tok.vocab_size
        cfg = HookedTransformerConfig(n_layers=2, n_heads=2, d_model=2 * V, d_head=V, d_vocab=V, n_ctx=48,
                                      attn_only=True, normalization_type=None, act_fn="relu", d_mlp=4, seed=0)
        model = HookedTransformer(cfg)
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
            eye = torch.eye(V)
            model.embed.W_E[:, :V] = eye
            a0, a1 = model.blocks[0].attn, model.blocks[1].attn
            a0.W_V[0, :V] = eye
            a0.W_O[0, :, V:] = eye
            a1.W_V[0, V:] = eye
            a1.W_O[0, :, :V] = reader * eye
            a1.W_V[1, :V] = eye
            a1.W_O[1, :, :V] = distractor * eye
            model.unembed.W_U[:V] = eye
            model.unembed.W_U[tok.bos_id, tok.bos_id] = 0
            model.unembed.W_U[tok.bos_id, tok.eos_id] = 1
        self.model = model.eval()
        self.scripts: dict[tuple[int, int], Script | torch.Tensor] = {
            MOVER: lambda T: one_hot_rows(T, lambda r: {max(r - delta, 0): 1.0})}
        for layer in (0, 1):
            model.blocks[layer].attn.hook_pattern.add_perma_hook(self._hook(layer))

    def _hook(self, layer: int):
        def hook(pattern: torch.Tensor, hook) -> torch.Tensor:
            T = pattern.shape[-1]
            for head in range(pattern.shape[1]):
                script = self.scripts.get((layer, head))
                if script is not None:
                    A = script(T) if callable(script) else script
                    pattern[:, head] = A.to(pattern.dtype)
            return pattern

        return hook
