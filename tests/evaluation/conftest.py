"""Fixtures: a tiny random model and a tiny model trained on short reversals (a few seconds on CPU)."""
import warnings

import pytest
import torch

from aspan import models, tasks
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig, train

warnings.filterwarnings("ignore", message=r"HookedTransformer(\.from_pretrained)? is deprecated", category=DeprecationWarning)


@pytest.fixture(scope="session")
def tok():
    return CharTokenizer()


@pytest.fixture(scope="session")
def random_model(tok):
    torch.set_num_threads(1)
    return models.tiny(tok, n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=64, seed=1, device="cpu")


@pytest.fixture(scope="session")
def mixed_samples():
    """Different tasks, prompt and target lengths; successor (EOS not scored) included."""
    out = tasks.get("reversal", length=(1, 6), charset="abcd").generate(7, seed=2)
    out += tasks.get("addition", operands=2, digits=(1, 3)).generate(4, seed=3)
    out += tasks.get("successor").generate(3, seed=4)
    return out


@pytest.fixture(scope="session")
def trained(tok):
    """(model, task): reversal of 1-3 symbols over 'abcd', learnt to ~100% in 150 steps."""
    torch.set_num_threads(1)
    task = tasks.get("reversal", length=(1, 3), charset="abcd")
    model = models.tiny(tok, n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=64, seed=0, device="cpu")
    train(model, tok, task, TrainConfig.scratch(steps=150, batch_size=32, lr=3e-3, warmup=10), progress=False)
    return model, task
