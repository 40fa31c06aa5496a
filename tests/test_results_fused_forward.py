"""results/gpu_campaign/fused_forward: every number its README quotes, recomputed from the two JSON files the
development script wrote (gpu_run1.json, gpu_run2.json), and the script kept as it ran."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "results" / "gpu_campaign" / "fused_forward"
RUNS = [json.loads((RUN / f"gpu_run{i}.json").read_text(encoding="utf-8")) for i in (1, 2)]
README = (RUN / "README.md").read_text(encoding="utf-8")
FLAT = re.sub(r"\s+", " ", README)
ABC = "abc_paper"


def _pairs() -> list[tuple[dict, dict]]:
    """The speed rows of the two runs, side by side (the same shapes in the same order)."""
    one, two = RUNS[0]["speed"], RUNS[1]["speed"]
    assert [(r["shape"], r["amp"]) for r in one] == [(r["shape"], r["amp"]) for r in two]
    return list(zip(one, two))


def _says(text: str) -> None:
    assert text in FLAT, text


def test_the_machine_and_the_stack():
    assert {r["gpu"] for r in RUNS} == {"NVIDIA H200"} and {r["torch"] for r in RUNS} == {"2.11.0+cu130"}
    _says("NVIDIA H200 (torch 2.11.0+cu130, TF32 off)")
    assert "allow_tf32 = False" in (RUN / "fastfwd_gpu.py").read_text(encoding="utf-8")


def test_the_step_table_is_the_runs():
    for a, b in _pairs():
        kernels = " / ".join(str(a["kernels"][s]) if a["kernels"][s] == b["kernels"][s]
                             else f"{a['kernels'][s]} ({b['kernels'][s]})" for s in ("hooked", "fused", "plain"))
        ms = {s: f"{a['step_ms'][s]:.1f}, {b['step_ms'][s]:.1f}" for s in ("hooked", "fused", "plain")}
        row = (f"| {a['shape']} | {'bf16' if a['amp'] else 'fp32'} | {kernels} | {ms['hooked']} | {ms['fused']} | "
               f"{ms['plain']} | {a['fused_vs_plain']:.2f}, {b['fused_vs_plain']:.2f} | "
               f"{a['hooked_vs_plain']:.2f}, {b['hooked_vs_plain']:.2f} |")
        assert row in README, row
        for r in (a, b):  # the ratios are the step times', and tokens/s's
            assert abs(r["fused_vs_plain"] - r["step_ms"]["plain"] / r["step_ms"]["fused"]) < 1e-9
            assert abs(r["fused_vs_plain"] - r["fused_tokens_per_s"] / r["plain_tokens_per_s"]) < 1e-9


def test_the_sentences_about_the_steps():
    pairs = _pairs()
    b64 = [r for p in pairs for r in p if r["shape"] == "tiny reversal batch 64" and r["amp"]]
    fused, hooked = sorted(r["fused_vs_plain"] for r in b64), sorted(r["hooked_vs_plain"] for r in b64)
    _says(f"**{fused[0]:.2f}-{fused[1]:.2f}x** a plain model's tokens/s, the hooked step {hooked[0]:.2f}-"
          f"{hooked[1]:.2f}x")
    bias = [(a["kernels"]["fused"] - b["kernels"]["fused"]) for a, b in pairs if "bias" in a["shape"]]
    _says(f"run 2's biased steps launch {min(bias)}-{max(bias)} fewer kernels")
    tiny = [r["step_ms"][s] for p in pairs for r in p if r["shape"].startswith("tiny") for s in ("fused", "plain")]
    _says(f"both take {min(tiny):.0f}-{max(tiny):.0f} ms whatever the batch")
    abc = [p for p in pairs if p[0]["shape"].startswith(ABC)]
    fused_ms = [r["step_ms"]["fused"] for p in abc for r in p]
    hooked_ms = [r["step_ms"]["hooked"] for p in abc for r in p]
    _says(f"takes **{min(fused_ms):.1f}-{max(fused_ms):.1f} ms** (bf16, fp32, with and without the bias), against "
          f"{min(hooked_ms):.0f}-{max(hooked_ms):.0f} ms for the hooked step")
    gains = [1 - b["step_ms"][s] / a["step_ms"][s] for a, b in abc for s in ("hooked", "fused", "plain")]
    assert min(gains) > 0  # run 2 faster on every side
    _says(f"on every side at this shape, by {100 * min(gains):.0f}-{100 * max(gains):.0f} %")
    ratios = [r["fused_vs_plain"] for p in abc for r in p]
    _says(f"its ratios ({min(ratios):.2f}-{max(ratios):.2f}) are not one number")
    moved = max(abs(a["fused_vs_plain"] - b["fused_vs_plain"]) for a, b in abc)
    _says(f"the ratios moved by up to {moved:.2f} between runs at the `abc_paper` shape")


def test_the_evaluation_forward():
    ev = [r["eval_forward_ms"] for r in RUNS]
    _says(f"hooked **{ev[0]['hooked']:.1f} ms** and **{ev[1]['hooked']:.1f} ms**, fused **{ev[0]['fused']:.1f} ms** "
          f"and **{ev[1]['fused']:.1f} ms** (run 1, run 2)")


def test_the_equivalence_table():
    def largest(run: dict, amp: bool, cases: tuple[str, ...], what: str) -> float:
        rows = [e for e in run["equivalence"] if e["amp"] == amp and e["case"] in cases]
        assert len(rows) == 4 * len(cases)  # four encodings
        return max(e[what] for e in rows if e[what] == e[what])  # NaN: the dead row's gradients, not compared

    def fmt(x: float) -> str:
        return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}" if x >= 1e-4 else f"{x:.1e}"

    def cell(amp, cases, what):
        values = [fmt(largest(run, amp, cases, what)) for run in RUNS]
        return values[0] if values[0] == values[1] else ", ".join(values)

    plain, masked = ("none", "heads", "dead_row"), ("bias",)
    for label, cases in (("no bias, a normal bias on some heads, a dead row", plain),
                         ("-1e4 on half the cells", masked)):
        row = (f"| {label} | {cell(False, cases, 'logits')} | {cell(False, cases, 'grads')} | "
               f"{cell(True, cases, 'logits')} | {cell(True, cases, 'grads')} |")
        assert row in README, row
    fp32 = max(largest(run, False, plain, "logits") for run in RUNS)
    assert fp32 < 1.8e-6 + 5e-8 and "**within 1.8e-6**" in FLAT
    scales = [e["logit_scale"] for run in RUNS for e in run["equivalence"]]
    _says(f"logits of absolute size {min(scales):.1f}-{max(scales):.1f}")
    assert all(e["finite"] and e["same_keys"] for run in RUNS for e in run["equivalence"])
    def bf16_grads(run: dict, alibi: bool) -> float:
        return max(e["grads"] for e in run["equivalence"] if e["amp"] and e["case"] in ("none", "heads")
                   and (e["positional"] == "alibi") == alibi)

    _says(f"Run 1's ALiBi gradients differed by up to {bf16_grads(RUNS[0], True):.2g}; run 2's (the mask built as "
          f"the merged code builds it) by at most {bf16_grads(RUNS[1], True):.2g}, the other encodings' by at most "
          f"{bf16_grads(RUNS[1], False):.2g}")


def test_the_script_is_the_one_that_ran():
    """Its code parses and writes what the JSON holds: the keys of a run, the shapes of its speed rows."""
    source = (RUN / "fastfwd_gpu.py").read_text(encoding="utf-8")
    ast.parse(source)
    assert set(RUNS[0]) == set(RUNS[1]) == {"torch", "gpu", "aspan_fused", "equivalence", "speed", "eval_forward_ms"}
    for key in ("equivalence", "speed", "eval_forward_ms"):
        assert f'RES["{key}"]' in source
    assert 'f"tiny reversal batch {bs}"' in source and "abc_paper 6x128 batch 128 p {p}" in source
