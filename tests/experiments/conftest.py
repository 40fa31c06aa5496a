"""Shared fixtures: a tiny random model on string reversal (fast on 2 CPU cores)."""
import warnings

import pytest
import torch

from aspan import models, tasks
from aspan.tokenization import CharTokenizer

warnings.filterwarnings("ignore", message=r"HookedTransformer(\.from_pretrained)? is deprecated", category=DeprecationWarning)


@pytest.fixture(scope="session")
def tok():
    return CharTokenizer()


@pytest.fixture(scope="session")
def tiny_model(tok):
    torch.set_num_threads(1)
    return models.tiny(tok, n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=64, seed=0, device="cpu")


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory, tiny_model, tok):
    path = tmp_path_factory.mktemp("ckpt") / "model"
    models.save(tiny_model, path, tok, task="reversal")
    return path


@pytest.fixture(scope="session")
def id_samples():
    return tasks.preset("reversal", "id").generate(10, seed=3)
