"""Tiny random Hugging Face models and tokenizers built offline (no downloads), for loader and adapter tests."""
from __future__ import annotations

from pathlib import Path

import torch

from aspan.tokenization import DEFAULT_CHARS

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def char_tokenizer(chars: str = DEFAULT_CHARS + "\n "):
    """A character-level `PreTrainedTokenizerFast` (WordLevel over single characters, fused decoding)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate([*SPECIALS, *chars])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def bpe_tokenizer():
    """A byte-level BPE tokenizer trained on a few words: ASCII letters are single tokens, 'é' is two bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tk.train_from_iterator(["abc=cba", "12+34=46", "hello world"] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")


def hf_config(arch: str, vocab_size: int):
    """A 2-layer, d_model 64, 4-head (2 KV heads) random config of `arch` ("llama", "qwen2", "gemma3")."""
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    if arch == "llama":
        return LlamaConfig(**common, tie_word_embeddings=False)
    if arch == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=False)
    if arch == "gemma3":
        # A short window and a global last layer, so local attention and both rope bases matter for parity.
        return Gemma3TextConfig(
            **common, head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=16,
        )
    raise ValueError(arch)


def save_random_model(arch: str, directory: Path, seed: int = 0):
    """Save a random HF causal LM of `arch` plus the char tokenizer into `directory`; return the HF model."""
    from transformers import AutoModelForCausalLM

    tok = char_tokenizer()
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(hf_config(arch, len(tok)), dtype=torch.float32).eval()
    with torch.no_grad():  # random biases too (Qwen2's q/k/v have them), so that a dropped bias shows
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    hf.save_pretrained(directory)
    tok.save_pretrained(directory)
    return hf


def block_network(monkeypatch) -> list:
    """Make every socket connection and name lookup fail loudly (an AssertionError); returns the list the attempts
    are recorded in, which a test asserts empty."""
    import socket

    attempts: list = []

    def no_network(*args, **kwargs):
        attempts.append(args)
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    return attempts


def load_every_kind(directory: Path) -> None:
    """Load a model of every on-disk kind (the aspan format, the shipped Hugging Face form, a Llama directory) on
    both backends, on the CPU."""
    from aspan import models
    from aspan.tokenization import CharTokenizer

    save_random_model("llama", directory / "plain")
    tok = CharTokenizer()
    aspan_format = models.save(models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=32, device="cpu"),
                               directory / "aspan", tok, hf=False)
    for source in (aspan_format, "reversal", directory / "plain"):
        for backend in ("hooked", "bridge"):
            models.load(source, device="cpu", backend=backend)
