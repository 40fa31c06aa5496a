"""results/parity_study/mnemonic_cap12000: every number its README, the parity README's section and sentences on it
and the parity study page state, recomputed from the committed rows (rows.jsonl, results.csv,
learning_curves.jsonl, convergence.csv, selection.csv, heads.csv, run.json, time.txt) and, for the 6,000-step run it
is compared with, from curves/."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from aspan.intervals import seed_interval, t_interval
from aspan.tasks.parity import Parity

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "results" / "parity_study"
RUN = STUDY / "mnemonic_cap12000"


def _flat(path: Path) -> str:
    return re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))


OWN, PARENT = _flat(RUN / "README.md"), _flat(STUDY / "README.md")
PAGE = _flat(ROOT / "docs" / "studies" / "parity_study.md")
RES = pd.read_csv(RUN / "results.csv")
OLD = pd.read_csv(STUDY / "curves" / "results.csv")
CFG = json.loads((RUN / "run.json").read_text(encoding="utf-8"))
TARGET = CFG["config"]["fit_exact"]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _pct(mean: float, lo: float, hi: float) -> str:
    """'35.1 [17.8, 52.3]': a rate and its interval in %, as the parity READMEs print them."""
    return f"{100 * mean:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]".replace("100.0]", "100]")


def _exact(g: pd.DataFrame) -> str:
    e = g.exact.tolist()
    return _pct(sum(e) / len(e), *seed_interval(e, int(g.n.iloc[0])))


def _per_token(g: pd.DataFrame) -> str:
    p = g.partial.tolist()
    return _pct(sum(p) / len(p), *t_interval(p))


def _count(rate: float, n: int) -> int:
    assert abs(rate * n - round(rate * n)) < 1e-9, (rate, n)
    return round(rate * n)


def _at(multiple: int) -> pd.DataFrame:
    return RES[RES.multiple == multiple].sort_values("seed")


def _train_curve(seed: int) -> list[tuple[int, int]]:
    """(step, curve inputs right) of one seed's held-out 1-10 bit curve set."""
    rows = [r for r in _jsonl(RUN / "learning_curves.jsonl") if r["seed"] == seed and r["bucket"] == "train"]
    return [(r["step"], _count(r["exact"], r["n"])) for r in sorted(rows, key=lambda r: r["step"])]


def test_the_run_is_the_curves_settings_for_mnemonic_with_the_cap_doubled():
    curves = json.loads((STUDY / "curves" / "run.json").read_text(encoding="utf-8"))
    cfg, old, old_lr = CFG["config"], curves["config"], curves["chosen_lr"]["mnemonic"]
    assert cfg["formats"] == ["mnemonic"] and cfg["lrs"] == [old_lr] == [0.001] and cfg["seeds"] == 3
    assert cfg["cap"] == 2 * old["cap"] == 12000 and TARGET == old["fit_exact"] == 0.99
    same = ("train_length", "multiples", "batch_size", "warmup", "n_layers", "n_heads", "d_model",
            "positional", "anchors", "held_out_share", "set_draw", "n_select", "n_test", "curve_every", "n_curve")
    assert {k: cfg[k] for k in same} == {k: old[k] for k in same}
    assert cfg["model_formats"] == old["formats"]  # the curves run's five formats size vocabulary and context
    assert (cfg["n_layers"], cfg["n_heads"], cfg["d_model"], cfg["positional"]) == (2, 4, 64, "rotary")
    assert (cfg["batch_size"], cfg["warmup"], cfg["curve_every"], cfg["anchors"]) == (32, 50, 200, 100)
    sel = pd.read_csv(RUN / "selection.csv")
    assert list(sel.lr) == [old_lr] and "rate 0.001, seeds 0-2" in PARENT
    assert "that run's choice for `mnemonic`, 0.001, not chosen again" in OWN
    assert sorted(set(RES.seed)) == [0, 1, 2] and (RES.lr == old_lr).all()


def test_sets_sizes_and_draw():
    rows = _jsonl(RUN / "rows.jsonl")
    assert all(r["held_out_share"] == 0.2 and r["set_draw"] == "disjoint" for r in rows)
    n = {(r["split"], r["which"]) for r in rows}
    sizes = {k: {r["n"] for r in rows if (r["split"], r["which"]) == k} for k in n}
    assert sizes == {("test", "1"): {66}, ("test", "2"): {200}, ("test", "5"): {200}, ("select", "id"): {73},
                     ("select", "ood"): {100}}
    curves = _jsonl(RUN / "learning_curves.jsonl")
    assert {r["n"] for r in curves if r["bucket"] == "train"} == {133} and \
        {r["n"] for r in curves if r["bucket"] == "2x"} == {200}
    assert "66 of exactly 10 bits (the whole test third of the held-out side), 200 of 20 bits and 200 of 50 bits" in OWN
    assert "133 held-out inputs of 1–10 bits (200 of 20 bits are scored beside it)" in OWN
    assert "73 of 10 bits and 100 of 20 bits" in OWN
    assert f"`held_out_share` {rows[0]['held_out_share']}, `set_draw` \"{rows[0]['set_draw']}\"" in OWN


def test_fit_is_a_label_from_accuracy_and_the_per_seed_table():
    one = _at(1)
    assert (RES.fitted == (RES.fit_curve_exact >= TARGET)).all()  # the label is accuracy against the target
    conv = pd.read_csv(RUN / "convergence.csv").iloc[0]
    assert conv.fit == "did not fit" and not one.fitted.all() and f"(`convergence.csv`: \"{conv.stop_reason}\")" in OWN
    assert conv.stop_reason == "cap 1, target 2"
    for s in (0, 1, 2):
        r = one[one.seed == s].iloc[0]
        right, last = _count(r.fit_curve_exact, 133), _train_curve(s)[-1]
        assert last == (r.stop_step, right)  # the curve where it stopped is the one the row reports
        fit = "fit" if r.fit_curve_exact >= TARGET else "did not fit"
        stopped = f"{r.stop_reason}, step {r.stop_step:,}"
        cells = [str(s), stopped, f"{right} ({r.fit_curve_exact:.3f})", fit, str(_count(r.exact, int(r.n))),
                 *(str(_count(_at(m)[_at(m).seed == s].exact.iloc[0], 200)) for m in (2, 5)),
                 *(f"{100 * _at(m)[_at(m).seed == s].partial.iloc[0]:.1f}" for m in (2, 5))]
        assert "| " + " | ".join(cells) + " |" in OWN, cells
    assert int((one.fit_curve_exact >= TARGET).sum()) == 2 and list(one[one.fitted].seed) == [0, 1]


def test_the_answer():
    fitted = RES[RES.fitted]
    s0, s1, s2 = (RES[(RES.seed == s) & (RES.multiple == 1)].iloc[0] for s in (0, 1, 2))
    assert f"seed 0 at step {s0.stop_step:,} and seed 1 at step {s1.stop_step:,}, each with " \
           f"{_count(s0.fit_curve_exact, 133)} of the 133 curve inputs right ({s1.fit_curve_exact:.3f})" in OWN
    assert _count(s0.fit_curve_exact, 133) == _count(s1.fit_curve_exact, 133) == 132
    assert f"Seed 2 ran to the {s2.stop_step:,}-step cap and ended at {_count(s2.fit_curve_exact, 133)} of 133 " \
           f"({s2.fit_curve_exact:.3f})" in OWN and s2.stop_reason == "cap"
    late = [right for step, right in _train_curve(2) if step >= 9200]
    assert (min(late), max(late)) == (128, 130) and max(r for _, r in _train_curve(2)) == 130
    assert "from step 9,200 to the cap it stayed between 128 and 130, and 130 was its best of the whole run" in OWN
    past = RES[RES.multiple > 1]
    assert (past.exact == 0).all() and set(past.n) == {200} and int(past.n.sum()) == 1200
    for m in (2, 5):
        assert _exact(_at(m)) == "0.0 [0.0, 0.6]" and _exact(fitted[fitted.multiple == m]) == "0.0 [0.0, 1.0]"
    assert "0 of its 200 test answers right: 0.0 % [0.0, 0.6] over the 600 answers of the three seeds at each " \
           "length, and 0.0 % [0.0, 1.0] over the 400 of the two fitted seeds alone" in OWN
    assert "the exact intervals already rest on 1,200 answers past 1x, none right" in OWN


def test_the_interval_table():
    for m, bits in ((1, 10), (2, 20), (5, 50)):
        g = _at(m)
        assert set(g.bits) == {bits}
        assert f"| {m}x ({bits} bits) | {_exact(g)} | {_per_token(g)} |" in OWN
    assert f"pooled answers ({int(_at(1).n.sum())} at 1x, {int(_at(2).n.sum())} at 2x and 5x" in OWN
    summary = pd.read_csv(RUN / "summary.csv").set_index("multiple")
    assert summary.loc[1, "exact"].replace("100.0]", "100]") == _exact(_at(1))  # as the run wrote it
    assert (summary.loc[[2, 5], "exact"] == "did not fit").all()
    tied = _at(1).set_index("seed")
    assert _count(tied.exact[1], 66) == _count(tied.exact[2], 66) == 65 and f"{100 * tied.exact[1]:.1f}" == "98.5"
    assert "seeds 1 and 2 each get one wrong (98.5 %)" in OWN


def test_per_token_against_chance():
    """Per token counts 2n characters (an anchor and a parity per step, EOS not counted), so 25 % is no anchor right
    and every parity guessed, 75 % every anchor right and every parity guessed."""
    n = 3
    assert len(Parity(format="mnemonic").solve("a1b0c1=")) == 2 * n  # the task's own answer
    seed1 = RES[(RES.seed == 1) & (RES.multiple == 1)].iloc[0]
    assert abs(seed1.partial - (1 - 1 / (66 * 20))) < 1e-12  # one of 66 x 20 characters wrong: EOS not counted
    none, every = (0.5 * n) / (2 * n), (n + 0.5 * n) / (2 * n)
    assert (none, every) == (0.25, 0.75)
    assert "a model that copies no anchor and guesses every parity scores 25 %, one that copies every anchor and " \
           "guesses every parity 75 %" in OWN
    five, two = _at(5), _at(2)
    lo, hi = t_interval(five.partial.tolist())
    assert lo <= none <= hi
    assert f"At 5x every seed lies near the first ({100 * five.partial.min():.1f}–{100 * five.partial.max():.1f} %, " \
           f"interval [{100 * lo:.1f}, {100 * hi:.1f}])" in OWN
    assert (two.partial < 20 / 40).all()  # fewer characters right than the first 10 steps (20 of 40) hold
    assert f"2x every seed gets fewer than half of the 40 characters right ({100 * two.partial.min():.1f}–" \
           f"{100 * two.partial.max():.1f} %)" in OWN
    head = pd.read_csv(RUN / "heads.csv").iloc[0]
    assert (head.failure_multiple, head.failure_target_index, head.layer, head["head"]) == (2, 0, 1, 1)
    prompt, answer = head.failure_text.split("=")
    assert answer[0] == prompt[0] and answer[0] in Parity(format="mnemonic").anchor_symbols  # target 0: an anchor
    assert "first error at 2x on the first character of the answer (target 0, the first anchor" in OWN
    assert "seed 0's head L1H1" in OWN
    assert f"the mean is {100 * two.partial.mean():.1f} % at 2x and {100 * five.partial.mean():.1f} % at 5x" in PARENT


def test_command_machine_and_time():
    timed = (RUN / "time.txt").read_text(encoding="utf-8")
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", timed)[1])
    system = float(re.search(r"System time \(seconds\): ([\d.]+)", timed)[1])
    share = re.search(r"Percent of CPU this job got: (\d+)%", timed)[1]
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\d+):([\d.]+)", timed)
    assert "--config configs/parity_mnemonic_cap12000_cpu.toml --out runs/parity_mnemonic_cap12000 --threads 1 " \
           "--quiet" in timed and "Exit status: 0" in timed
    assert f"{wall[1]} min {round(float(wall[2]))} s wall, {user:,.0f} s of user CPU and {system:,.0f} s of system " \
           f"CPU ({share} % of one core" in OWN
    assert "`aspan study parity --config configs/parity_mnemonic_cap12000_cpu.toml --out " \
           "runs/parity_mnemonic_cap12000 --threads 1 --quiet`" in OWN
    assert CFG["command"].startswith("aspan study parity --out runs/parity_mnemonic_cap12000 --config "
                                     "configs/parity_mnemonic_cap12000_cpu.toml")
    assert f"`run.json` records {CFG['wall_seconds']:,.0f} s inside the study" in OWN
    m, v = CFG["machine"], CFG["versions"]
    assert (m["cpus"], m["torch_threads"], m["cpu_kernels"], CFG["device"]) == (2, 1, "AVX512", "cpu")
    assert "the 2-core x86 machine (Intel Xeon, AVX-512 kernels in `run.json`), one torch thread, no GPU, shared" in OWN
    assert f"Python {v['python']}, torch {v['torch']}, TransformerLens {v['transformer_lens']} (`run.json`)" in OWN


def test_against_the_six_thousand_step_run():
    old = OLD[(OLD.format == "mnemonic") & (OLD.multiple == 1)].set_index("seed")
    assert list(old[old.fitted].index) == [1] and old.stop_step[1] == 4200
    assert f"there seed 1 fit at step {old.stop_step[1]:,} and seeds 0 and 2 ended at the cap at " \
           f"{old.fit_curve_exact[0]:.3f} and {old.fit_curve_exact[2]:.3f}" in OWN
    both = pd.concat([OLD[OLD.format == "mnemonic"], RES])
    assert (both[both.multiple > 1].exact == 0).all()
    assert "Every seed of both runs scores 0 % exact at 2x and 5x" in OWN


def test_the_parity_readme_and_page_quote_the_run():
    one = _at(1)
    s0, s1, s2 = (one[one.seed == s].iloc[0] for s in (0, 1, 2))
    fitted = RES[RES.fitted & (RES.multiple > 1)]
    assert f"fit on two seeds (seed 0 at step {s0.stop_step:,}, seed 1 at {s1.stop_step:,}, each with " \
           f"{_count(s0.fit_curve_exact, 133)} of the 133 curve inputs right); seed 2 ran to the cap at " \
           f"{_count(s2.fit_curve_exact, 133)} of 133 ({s2.fit_curve_exact:.3f})" in PARENT
    assert "0 of its 200 test answers right at 2x and at 5x: 0.0 % [0.0, 0.6] over the three seeds' 600 answers" \
        in PARENT and "copying no anchor and guessing the parities gives" in PARENT
    assert (fitted.exact == 0).all() and fitted.groupby("multiple").n.sum().tolist() == [400, 400]
    assert f"seed 2 stayed at {s2.fit_curve_exact:.3f}, so the label is still \"did not fit\"; both fitted seeds " \
           "score 0 % exact at 2x and 5x (none of their 400 answers at each length, 0.0 % [0.0, 1.0])" in PARENT
    assert "one of three did not within 12,000" in PARENT and "(on two of three with a 12,000-step cap)" in PARENT
    assert f"two of its three seeds fit and seed 2 stayed at {s2.fit_curve_exact:.3f}, so it still did not fit, and " \
           "all three seeds, both fitted ones included, score 0 % exact at 2x and 5x (0.0 % [0.0, 0.6] over 600 " \
           "answers at each length)" in PAGE
    assert "```{include} ../../results/parity_study/mnemonic_cap12000/README.md" in PAGE


def test_the_project_readme_line_on_content_addressing():
    """The project README's line on parity: the ten-seed 2x cells of both formats, none whole-right at 5x, and the
    12,000-step mnemonic run's fits and its exact 2x and 5x cells, from the rows."""
    project = re.sub(r"\s+", " ", (ROOT / "README.md").read_text(encoding="utf-8"))
    ten = pd.read_csv(STUDY / "ten_seeds" / "results.csv")
    cell = {(f, m): _exact(g.sort_values("seed")).replace(" [", " % [", 1)
            for (f, m), g in ten.groupby(["format", "multiple"])}
    assert ten[(ten.format == "interleaved-ab") & (ten.multiple == 5)].exact.max() == 0
    assert (f"`interleaved-ab`) gets {cell['interleaved-ab', 2]} of the 20-bit answers whole-right against the "
            f"running scratchpad's {cell['scratchpad', 2]}, and none at 50 bits") in project
    one = _at(1)
    fitted = int((one.fit_curve_exact >= TARGET).sum())  # fit: accuracy against the target, per seed
    assert _exact(_at(2)) == _exact(_at(5))
    said = (f"fit {fitted} of {RES.seed.nunique()} seeds and get {_exact(_at(2)).replace(' [', ' % [', 1)} "
            "whole-right at 20 and at 50 bits")
    assert said in project, said
