"""GPU-minute estimates of the GPU campaign's plan (configs/gpu/campaign.toml), from measurements.

What is measured, and where:
- On the H200, with the loop of the first two slices (commit c5e23f5's code): the time of 250 training steps with
  their ID check (state/abc_paper/checks.jsonl: successor seeds 0-2 and addition seed 0, steps 250 -> 500), the
  training-only throughput of the addition base (its log, 234-240k tokens/s, quoted in the README), and each
  successor row's wall time (state/abc_paper/runs.jsonl), whose part after its training is the row's evaluation
  (40,000 test numbers, the 10,000 of the position rows, the saved model).
- On the H200, the fused training step at the `abc_paper` shape (fused_forward/: a development script's two runs
  of the current forward, its batches made beforehand).
- On this repository's CPU (timings/, `timings/measure.sh`, benchmarks/bench_campaign_host.py), under that code
  (old) and under this checkout's (new): the kernels of a training step of each run's shape, and the host's part
  of a row's evaluation.

How they combine (a launch-bound GPU runs at the host's pace):
- a step of a run's shape on the H200 = its kernels (counted on the CPU) x the H200's time per kernel of the fused
  step measured at the `abc_paper` shape, with 1 ms of the loop's own Python; for the d_model 1024 QK model at
  least its arithmetic at 200 TFLOP/s (a quarter of the H200's measured bf16 peak);
- evaluation factor = the H200's old successor row evaluation / the CPU's old host time of that evaluation; a new
  evaluation = its CPU host time under the new code x that factor, per sample scaled by the sample's positions;
- the steps each training takes until its stop rule are not measured at these sizes: STEPS gives the assumption of
  each (central, and high: the cap where a run may run to it), with its basis;
- the estimate is for K = 1 (every unit one after another): how much several at once save is measured by the probe
  on the GPU, not here; `concurrent_min` says what K = 2 would give if two processes ran at 1.7x one's throughput.

    python results/gpu_campaign/estimate.py    # prints the table, writes estimates.json beside this file
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

SLICE_S = 330 - 30  # a slice's usable seconds (configs/gpu/campaign.toml: budget_s - reserve_s)
LOAN_SLICES = 2  # slices per loan
CHECKS_S = 24  # the device checks, once per loan (slice 1 measured 23.7 s)
PROBE_S = 25  # the concurrency probe: start-up of 4 processes and 3 phases of 3 s, once per run and slice
UNIT_START_S = 10  # a process's imports and CUDA start-up (each slice a run runs in; each unit process at K > 1)
PEAK_FLOPS = 200e12  # what the d_model 1024 model's matrix work is assumed to run at (bf16, small shapes)
K2_GAIN = 1.7  # the throughput of two processes over one, for `concurrent_min` only (not measured)

# Steps each training runs, (central, high), and why. `high` is the cap where a run may run to it.
STEPS = {
    "abc_paper": {"addition base": (5000, 20000, "2-layer CPU bases fitted in 3,600-7,000 steps "
                                                 "(results/abc_paper_addition); the cap is 20,000"),
                  "addition ABC": (2500, 10000, "half the base: successor ABC took 250 of its bases' 500 on the "
                                                "H200; addition ABC 933 of 5,167 on CPU")},
    "abc_paper_abs": {"parity ABS": (6000, 6000, "the cap: the CPU run never fitted"),
                      "successor ABS": (500, 2000, "as the successor bases on the H200"),
                      "addition ABS": (5000, 6000, "as the addition bases")},
    "parity_formats": {"scratchpad": (5000, 10000, "2x its 2,400 at 1-10 bits on CPU"),
                       "interleaved-ab": (500, 2000, "2x its 200 at 1-10 bits"),
                       "mnemonic": (10000, 10000, "the cap: it did not fit 1-10 bits in 6,000 on CPU")},
    "qk_spectrum_1024": {"base": (6000, 12000, "the d_model 128 base took 6,000 (results/qk_study/paper_shape)"),
                         "fine-tune": (2000, 2000, "the budget protocol: every run 2,000 steps")},
}


# ----------------------------------------------------------------------------------------------- measured
def table(path: Path) -> dict[str, list[float]]:
    """The numbers of a markdown table's rows, by their first cell."""
    out = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 1 and not set(cells[0]) <= set("-") and re.fullmatch(r"[\d.]+", cells[-1]):
            out[cells[0]] = [float(c) for c in cells[1:]]
    return out


def slice2_draw_bound(h: dict[str, float]) -> float:
    """H200 seconds per 1,000 test numbers drawn (paper_data), at most: slice 2 (245.99 s of abc_paper) drew both
    tasks' sets (2 x 42,024 numbers), then ran the ABC rows of successor seeds 1 and 2 (79.8 s and 84.8 s) and
    696 steps of the addition base (the rest): what is left bounds the draw (and the two ABC models' position rows)."""
    record = json.loads((HERE / "slices" / "slice-2026-11-27T082546Z.json").read_text())
    spent = record["runs"][0]["seconds"]
    rows = [json.loads(x) for x in (HERE / "state" / "abc_paper" / "runs.jsonl").read_text().splitlines()]
    abc = sum(r["wall_s"] for r in rows if r["task"] == "successor" and r["condition"] == "abc" and r["seed"] > 0)
    addition = 696 / 250 * h["addition_block_s"]
    return (spent - abc - addition) / (2 * 42.024)


def h200() -> dict[str, float]:
    """What the first two slices measured on the H200 (old loop): seconds per 250 steps with a check, per row."""
    state = HERE / "state" / "abc_paper"
    checks = [json.loads(x) for x in (state / "checks.jsonl").read_text().splitlines()]
    by = {(r["task"], r["condition"], r["seed"], r["step"]): r["time"] for r in checks}
    block = {t: [by[(t, "vanilla", s, 500)] - by[(t, "vanilla", s, 250)] for s in (0, 1, 2)
                 if (t, "vanilla", s, 500) in by] for t in ("successor", "addition")}
    rows = [json.loads(x) for x in (state / "runs.jsonl").read_text().splitlines()]
    vanilla = [r for r in rows if r["task"] == "successor" and r["condition"] == "vanilla"]
    per250 = sum(block["successor"]) / len(block["successor"])
    evals = [r["wall_s"] - r["steps"] / 250 * per250 for r in vanilla]
    return {"successor_block_s": per250, "addition_block_s": sum(block["addition"]) / len(block["addition"]),
            "successor_row_eval_s": sum(evals) / len(evals)}


def host_table(side: str) -> tuple[dict[str, list[float]], dict[str, float]]:
    """(operators per step by shape: [batch, positions, operators, of which the batch], host seconds per 1,000
    numbers by piece) under `side`'s code (timings/host-SIDE.md)."""
    rows = table(HERE / "timings" / f"host-{side}.md")
    steps = {k: v for k, v in rows.items() if len(v) == 4}
    return steps, {k: v[0] for k, v in rows.items() if len(v) == 1}


def fused_step_ms() -> dict[str, float]:
    """The fused training step at the `abc_paper` shape on the H200, bf16 autocast (as aspan's loop trains on CUDA),
    without and with an ABS-like bias: the mean of the two runs of fused_forward/ (a development script's, with its
    batches made beforehand, as the loop now makes them ahead)."""
    got: dict[str, list[float]] = {}
    for run in (1, 2):
        for row in json.loads((HERE / "fused_forward" / f"gpu_run{run}.json").read_text())["speed"]:
            if row["amp"] and row["shape"].startswith("abc_paper"):
                got.setdefault("bias" if "bias" in row["shape"] else "plain", []).append(row["step_ms"]["fused"])
    return {k: sum(v) / len(v) for k, v in got.items()}


def factors() -> dict[str, float]:
    """What the H200 takes per kernel of a training step and per unit of an evaluation's host work, and the new
    code's host work per 1,000 numbers.

    - kernel_s: the fused step at the `abc_paper` shape measured on the H200 (`fused_step_ms`, 19 ms) over the
      kernels the current loop's step of that shape launches, counted on the CPU (timings/host-new.md): a step of
      another shape takes its own count x kernel_s. The other calibrations, which the estimate does not use, bracket
      it: the slices' plain PyTorch model (175,339 tokens/s, 103 kernels: `plain_kernel_s`) and the old loop's
      addition step (100 ms for 4,612 host operators: `op_s`) make the same step 15 and 6 ms.
    - eval_factor: the successor rows' evaluation on the H200 (49 s a row) over its host work counted on the CPU
      under the old code (40,000 test numbers and 10,000 position rows: make_batch and the per-token records,
      scaled from the 185 positions measured to successor's 124); the new code's host work per 1,000 numbers is
      put in the same units through make_batch, timed in both runs."""
    old_steps, old_eval = host_table("old")
    new_steps, new_eval = host_table("new")
    h = h200()
    record = json.loads((HERE / "slices" / "slice-2026-11-27T081839Z.json").read_text())
    kernels, tokens = table(HERE / "timings" / "plain-old.md")["reversal 1-10"]
    add = new_steps["addition (abc_paper)"]
    fused = fused_step_ms()
    mb_old, mb_new = old_eval[MAKE], new_eval[MAKE]
    row_host_old = (50 * mb_old + 10 * old_eval[RECORDS]) * 124 / 185
    norm = mb_old / mb_new  # the new run's seconds in the old run's (the two ran under different loads)
    return {"kernel_s": fused["plain"] / 1000 / (add[2] - add[3]), "fused_step_ms": fused["plain"],
            "fused_bias_step_ms": fused["bias"],
            "plain_kernel_s": tokens / record["checks"]["training"]["plain_tokens_per_s"] / kernels,
            "op_s": TRAIN_STEP_S / old_steps["addition (abc_paper)"][2], **h,
            "eval_factor": h["successor_row_eval_s"] / row_host_old,
            "lean_per_1000_cpu_s": new_eval[LEAN] * norm, "refs_per_1000_cpu_s": new_eval[REFS] * norm,
            "draw_per_1000_s": slice2_draw_bound(h),
            "old_row_host_cpu_s": row_host_old,
            "new_row_host_cpu_s": (50 * new_eval[LEAN] + 10 * new_eval[REFS]) * norm * 124 / 185}


MAKE = "make_batch (evaluation batches, before)"
RECORDS = "per-token records of the position rows (before)"
LEAN = "lean_batch (evaluation batches, now)"
REFS = "reference rows of row_counts (now)"
DRAW = "drawing a task's sets (paper_data, addition, per 1,000 test numbers)"
TRAIN_STEP_S = 23_680 / 237_000  # the addition base's steps on the H200: 128 x 185 tokens at 234-240k tokens/s
LOOP_S = 0.001  # per step, the loop's own Python (schedule, budget, batch queue) beside its operators


def step_s(shape: str, f: dict, flops: float = 0.0) -> float:
    """A new training step of `shape` on the H200: its kernels (counted on the CPU; its batch is made ahead, off the
    step) at `kernel_s` each (so the `abc_paper` shape's is the measured fused step) and the loop's own Python, or its
    arithmetic at PEAK_FLOPS, whichever is longer."""
    new_steps, _ = host_table("new")
    ops = new_steps[shape][2] - new_steps[shape][3]
    return max(ops * f["kernel_s"] + LOOP_S, flops / PEAK_FLOPS)


def eval_s(numbers: int, positions: int, f: dict, rows_with_positions: int = 0) -> float:
    """Host seconds on the H200 of evaluating `numbers` samples of `positions` tokens (lean batches), and the
    position rows of `rows_with_positions` more."""
    scale = positions / 185
    per = f["lean_per_1000_cpu_s"] * scale
    return f["eval_factor"] * (numbers / 1000 * per + rows_with_positions / 1000 * (per + f["refs_per_1000_cpu_s"]))


def qk_flops(tokens: int) -> float:
    """Training FLOPs of one step of the d_model 1024 QK model over `tokens` tokens (6 x parameters x tokens)."""
    params = 4 * (4 * 1024**2 + 2 * 1024 * 4096)
    return 6 * params * tokens


def runs(f: dict, which: int) -> dict[str, dict]:
    """Every run's serial GPU seconds by part, at the central (which=0) or high (1) steps."""
    add = step_s("addition (abc_paper)", f)
    par = step_s("parity with ABS (abc_paper_abs)", f)
    fmt = step_s("parity formats", f)
    base = step_s("qk base", f, qk_flops(64 * 42))
    tune = step_s("qk fine-tune", f, qk_flops(32 * 82))
    check = eval_s(1000, 185, f)  # the abc studies' ID check: 1,000 numbers every 250 steps
    draw = f["draw_per_1000_s"]  # per 1,000 test numbers, on the H200's host
    s = {k: {n: v[which] for n, v in d.items()} for k, d in STEPS.items()}
    out = {}
    a = s["abc_paper"]
    out["abc_paper"] = {
        "train": 3 * (a["addition base"] + a["addition ABC"]) * add,
        "checks": 3 * ((a["addition base"] + a["addition ABC"]) / 250 + 2) * check,
        "rows": 6 * eval_s(40_000, 185, f, 10_000) + 3 * eval_s(1024, 185, f),  # + ABC's calibration numbers
        "sets": 84 * draw, "units": 6}
    b = s["abc_paper_abs"]
    lengths = {"parity": 403, "successor": 124, "addition": 185}
    out["abc_paper_abs"] = {
        "train": 3 * (b["parity ABS"] * par + (b["successor ABS"] + b["addition ABS"]) * add),
        "checks": 3 * sum(b[f"{t} ABS"] / 250 + 1 for t in lengths) * check * 1.4,
        "rows": 3 * sum(eval_s(8_000, n, f) for n in lengths.values()),
        "sets": 3 * 10 * draw, "units": 9}
    p = s["parity_formats"]
    out["parity_formats"] = {
        "train": 3 * sum(p.values()) * fmt,
        "checks": 3 * sum(v / 250 + 1 for v in p.values()) * eval_s(500, 130, f) * 2,  # per-token records: x2
        "rows": 9 * eval_s(500 + 6_000, 250, f) * 2, "sets": 0.0, "units": 9}
    q = s["qk_spectrum_1024"]
    out["qk_spectrum_1024"] = {
        "train": q["base"] * base + 16 * q["fine-tune"] * tune,
        "checks": (q["base"] / 250 + 1) * eval_s(500, 42, f) * 2,
        "rows": 17 * eval_s(500 + 6_000, 82, f) * 2, "sets": 0.0, "units": 18}
    return out


def minutes(parts: dict[str, float], k: int = 1) -> tuple[float, int]:
    """(GPU minutes, slices) of a run at K units at once: its work (at K > 1 on K2_GAIN times the throughput, each
    unit a process of its own that draws its sets again), a start-up and a probe per slice it runs in, the device
    checks once per loan it spans."""
    work = sum(v for n, v in parts.items() if n != "units")
    if k > 1:
        work = (work + parts["units"] * (UNIT_START_S + parts["sets"] / max(1, parts["units"]))) / K2_GAIN
    slices = max(1, math.ceil(work / (SLICE_S - PROBE_S - UNIT_START_S)))
    total = work + slices * (PROBE_S + UNIT_START_S) + math.ceil(slices / LOAN_SLICES) * CHECKS_S
    return total / 60, slices


def main() -> dict:
    f = factors()
    plan_done = {"abc_paper": (371.830670298 + 245.993039135) / 60}  # the first two slices (slices/*.json)
    result = {"factors": f, "runs": {}}
    for name in ("abc_paper", "abc_paper_abs", "parity_formats", "qk_spectrum_1024"):
        central, high = (runs(f, i)[name] for i in (0, 1))
        left, slices = minutes(central)
        left_high, _ = minutes(high)
        left_k2, _ = minutes(central, 2)
        done = plan_done.get(name, 0.0)
        work = sum(v for n, v in central.items() if n != "units")
        result["runs"][name] = {
            "parts_s": {k: round(v, 1) for k, v in central.items()}, "left_min": round(left, 1),
            "left_high_min": round(left_high, 1), "left_k2_min": round(left_k2, 1), "slices": slices,
            "done_min": round(done, 1), "total_min": round(done + left, 1),
            "unit_s": round(work / central["units"] + UNIT_START_S)}
    for key in ("left_min", "left_high_min", "left_k2_min"):
        result[key] = round(sum(r[key] for r in result["runs"].values()), 1)
    return result


if __name__ == "__main__":
    got = main()
    (HERE / "estimates.json").write_text(json.dumps(got, indent=1) + "\n")
    print("| run | GPU minutes left (central) | high | slices | by part (s) |\n|---|---|---|---|---|")
    for name, r in got["runs"].items():
        print(f"| {name} | {r['left_min']} | {r['left_high_min']} | {r['slices']} | {r['parts_s']} |")
    print(f"left: {got['left_min']} min (high {got['left_high_min']}); with two units at once at "
          f"{K2_GAIN}x: {got['left_k2_min']}")
