"""Models: a tiny from-scratch HookedTransformer, checkpoints, and pretrained HF / GGUF / SmolLM2 loading.

    model = models.tiny(tokenizer, task="reversal")          # n_ctx checked against the OOD preset
    models.check_model(model, tokenizer, "reversal")         # any model: hook points, vocabulary, context
    models.save(model, "runs/rev", tokenizer, task="reversal", steps=1500)
    model, tokenizer, meta = models.load("runs/rev")  # or "reversal" (shipped), an HF dir, a .gguf file, "smollm2"
"""
from .backend import default_backend, has_hooked
from .checkpoint import SHIPPED, default_device, load, resolve, save, shipped
from .fit import check_model
from .loaded import LoadedModel
from .tiny import POSITIONAL, Positional, build, check_context, positional_of, tiny

__all__ = [
    "POSITIONAL", "SHIPPED", "LoadedModel", "Positional", "build", "check_context", "check_model", "default_backend",
    "default_device", "has_hooked", "load", "positional_of", "resolve", "save", "shipped", "tiny",
]
