"""The training benchmark's reference and harness: a plain PyTorch model of the tiny model's shape that trains
with aspan's settings and data handling, and the interleaved comparison the benchmark and the device check print."""
import math

import torch

from aspan import models, tasks
from aspan.applications.step_timing import PlainStepper, _rotary_tables, plain_model
from aspan.tokenization import CharTokenizer
from aspan.training import TrainConfig

TOK = CharTokenizer()


def test_the_plain_model_has_the_tiny_models_parameters_and_learns():
    torch.set_num_threads(1)
    model = models.tiny(TOK, task="reversal", device="cpu")
    plain = plain_model(model.cfg)
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in model.parameters())
    task = tasks.get("reversal", length=(1, 3), charset="abcd")
    cfg = TrainConfig.scratch(steps=40, batch_size=16, lr=3e-3, warmup=5, device="cpu")
    stepper = PlainStepper(model.cfg, TOK, task, cfg)
    try:
        losses = []
        for _ in range(40):
            stepper.step()
            losses.append(stepper.read())
    finally:
        stepper.close()
    assert all(math.isfinite(x) for x in losses) and losses[-1] < 0.5 * losses[0]


def test_rotary_scores_depend_on_relative_position_only():
    """q at position m and k at n score the same for every shift of both (rotate-half rotary, Su et al. 2021)."""
    cos, sin = _rotary_tables(40, 16, 8, 10000.0)
    q, k = torch.randn(16), torch.randn(16)

    def rotate(x, pos):
        turned = torch.cat((-x[4:8], x[:4], x[8:]))
        return x * cos[pos] + turned * sin[pos]

    scores = [float(rotate(q, m + s) @ rotate(k, m + s - 3)) for m, s in ((5, 0), (5, 7), (20, 11))]
    assert max(scores) - min(scores) < 1e-4 and abs(scores[0] - float(q @ k)) > 1e-3
    assert torch.equal(rotate(q, 0), q)  # position 0 is the identity


def test_the_training_check_compares_both_steps_on_the_cpu():
    """The GPU slice's training check, small, on the CPU: both sides timed, aspan's losses fall, nothing read
    back or copied blocking inside either step, and the ratio is the tokens/s ratio."""
    from aspan.applications.device_checks import check_training

    got = check_training("cpu", batch_size=16, rounds=3)
    assert got["ok"] and got["autocast"] == "none" and "captured_error" not in got
    assert math.isclose(got["aspan_over_plain"], got["aspan_tokens_per_s"] / got["plain_tokens_per_s"])
    for side in ("aspan", "plain"):
        costs = got["step_costs"][side]
        assert costs["reads"] == 0 and costs["blocking_copies"] == 0 and costs["kernels"]["total"] > 100
