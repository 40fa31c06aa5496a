"""One training loop for from-scratch training and fine-tuning: loss on target + EOS rows only.

    cfg = TrainConfig.scratch(steps=1500)          # or TrainConfig.finetune() (paper defaults)
    result = train(model, tokenizer, tasks.preset("reversal", "id"), cfg, out_dir="runs/rev",
                   eval_data={"id": id_samples, "ood": ood_samples})

Data is a Task (batches generated on the fly: batch `s` comes from seed `(seed, s)` alone, so a resumed run sees
the same data), a list of Samples, or an `aspan data` JSONL file (shuffled per epoch from `(seed, epoch)`).
AdamW, linear warm-up then cosine decay, gradient clipping, bf16 autocast on CUDA, DDP under `torchrun`.
`out_dir` gets `log.jsonl` (train rows; the last says why and at which step the run ended), `eval.jsonl` (periodic
ID/OOD evaluation), `curves.jsonl` (learning curves on held-out sets, which a stop rule may end the run on:
`aspan.curves`), `checkpoints/` (weights + optimizer/scheduler/step/RNG state, each checkpoint written whole into a
temporary directory and renamed, pointed to by `checkpoints/latest`) and, at the end, the final model itself
(`aspan.models.load(out_dir)` works). Nothing read back runs code: tensors are safetensors, everything else JSON
(`read_state`).

A step reads nothing back from the device: batches are made ahead in a thread (pinned, copied without blocking on
CUDA), and each step's loss and gradient norm stay on the device until a log row, evaluation, curve or checkpoint
reads them (a loss that is not finite stops the run there, naming its step). AdamW is fused on CUDA;
`TrainConfig(capture=True)` replays the whole step as a CUDA graph.

The modules: `config` (the settings: `TrainConfig`, `RunOptions`), `data` (deterministic batches, `Replay`),
`batches` (lean batches, made ahead), `loss` (the objective), `optim` (AdamW and its schedule), `tally` (the steps'
values until they are read), `graph` (the captured step), `state` (checkpoints and training state), `budget` (time
budgets), `run` (one run's set-up: device, optimiser, start or resume), `loop` (`train`, `train_resumable`) and
`costs` (kernels and syncs of a step, and the step driven one at a time, for benchmarks). Everything a caller needs
is importable from `aspan.training` itself.
"""
from __future__ import annotations

from ..lazy import lazy_exports

# submodule -> the names it defines, each imported from it on first access (PEP 562), as `aspan`'s own entry points
# are: the settings (`TrainConfig`, from `config`) then load without torch, so the command line reads and checks them
# before it pays for the training loop's imports
_LAZY: dict[str, tuple[str, ...]] = {
    "budget": ("BudgetSpent", "TimeBudget", "current_budget", "time_budget"),
    "config": ("ARCHITECTURE", "RESUME_FREE", "RunOptions", "TrainConfig", "TrainResult", "run_options"),
    "data": ("REPLAY_STREAM", "Data", "DataStream", "Replay", "batch_seed", "read_jsonl", "replay_count"),
    "loop": ("train", "train_resumable"),
    "loss": ("heldout_loss", "target_loss", "train_batch"),
    "optim": ("decays", "lr_lambda"),
    "run": ("resolve_device",),
    "state": ("LEGACY_STATE", "STATE_FORMAT", "STATE_JSON", "STATE_TENSORS", "check_resume", "latest_checkpoint",
              "read_state"),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY)
