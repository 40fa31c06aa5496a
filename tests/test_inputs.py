"""Every file and value the toolkit reads is checked before it is trusted: a file that is not what it should be ends in
one line naming the file and line (or key), exit code 2, no traceback, before any model work and without a partial
file. Each CLI case runs the real command in a subprocess."""
import json
import tempfile
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hooks
from aspan import models, tasks
from aspan.evaluation import evaluate
from aspan.experiments.sweep import SweepConfig, grid
from aspan.io import settings_key
from aspan.tokenization import CharTokenizer
from hooks.reinforce import edit_pattern
from tests.cli import aspan_peak

from .test_hardening import SMALL, aspan, leftovers, one_line

SWEEP = """model = "reversal"
task = "reversal"
task_params = { length = [11, 12] }
n_samples = 2
strengths = [1.0]
deltas = [0]

[heads]
list = [[1, 0]]
"""


def sweep_config(tmp_path: Path, text: str = SWEEP) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------ sweep and study rows
def test_sweep_config_not_utf8_names_the_file(tmp_path):
    cfg = tmp_path / "latin1.toml"
    cfg.write_bytes(SWEEP.encode() + b'# caf\xe9\n')
    r = aspan("sweep", "--config", str(cfg), "--out", str(tmp_path / "run"), "--quiet", cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "run").exists()
    one_line(r.stderr, str(cfg), "UTF-8")


def test_sweep_rows_file_with_a_foreign_row_names_file_and_line(tmp_path):
    cfg = sweep_config(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "sweep.jsonl").write_text('{"x": 1}\n')
    r = aspan("sweep", "--config", str(cfg), "--out", str(run), "--quiet", cwd=tmp_path)
    assert r.returncode == 2
    one_line(r.stderr, f"{run / 'sweep.jsonl'} line 1: not a sweep row", "'key'")
    assert sorted(p.name for p in run.iterdir()) == ["sweep.jsonl"] and not leftovers(run)


def test_sweep_row_without_mode_names_file_and_line(tmp_path):
    cfg = sweep_config(tmp_path)
    point = grid(SweepConfig.from_toml(cfg))[0]
    row = {k: v for k, v in point.items() if k != "mode"}
    run = tmp_path / "run"
    run.mkdir()
    (run / "sweep.jsonl").write_text("\n" + json.dumps({**row, "key": settings_key(point)}) + "\n")
    r = aspan("sweep", "--config", str(cfg), "--out", str(run), "--quiet", cwd=tmp_path)
    assert r.returncode == 2
    one_line(r.stderr, f"{run / 'sweep.jsonl'} line 2: not a sweep row", "'mode'")
    assert sorted(p.name for p in run.iterdir()) == ["sweep.jsonl"]


def test_qk_study_row_without_key_or_condition_names_file_and_line(tmp_path):
    for i, row in enumerate(({"condition": "qk", "replay": 0.0, "seed": 0, "lr": 0.01},
                             {"key": "0123456789abcdef", "replay": 0.0, "seed": 0, "lr": 0.01})):
        run = tmp_path / f"qk{i}"
        run.mkdir()
        (run / "runs.jsonl").write_text(json.dumps(row) + "\n")
        r = aspan("study", "qk", "--quick", "--out", str(run), "--quiet", cwd=tmp_path)
        assert r.returncode == 2
        one_line(r.stderr, f"{run / 'runs.jsonl'} line 1: not a qk study row", "'key'" if i == 0 else "'condition'")
        assert {p.name for p in run.iterdir()} <= {"runs.jsonl", ".aspan.lock", "run.json"}


# ------------------------------------------------------------------------------------ JSONL samples
def sample_line(**changes) -> str:
    d = tasks.get("reversal", length=3, charset="abcd").generate(1, seed=0)[0].to_dict()
    return json.dumps({**d, **changes})


BAD_SAMPLES = [  # (a line, the field its error must name)
    (sample_line(prompt_len=4.7), "'prompt_len'"),
    (sample_line(references=[[2.9]] * 3), "'references'"),
    (sample_line(references=[[True]] * 3), "'references'"),
    (sample_line(text="abc=abc"), "'text'"),  # the reversal of abc is cba
    (sample_line(references=[[0], [1], [2]]), "'references'"),  # mirrored positions are 2, 1, 0
    (sample_line(task="reversel"), "'task'"),
    (sample_line(extra=1), "'extra'"),
]


def test_train_data_file_fields_are_checked_naming_file_line_and_field(tmp_path):
    good = sample_line()
    for i, (bad, field) in enumerate(BAD_SAMPLES):
        data = tmp_path / f"bad{i}.jsonl"
        data.write_text(good + "\n" + bad + "\n")
        out = tmp_path / f"run{i}"
        r = aspan("train", "--data", str(data), "--out", str(out), "--steps", "1", "--batch-size", "2",
                  "--eval-samples", "0", "--quiet", cwd=tmp_path)
        assert r.returncode == 2, (bad, r.stderr)
        one_line(r.stderr, f"{data} line 2:", f"field {field}")
        assert not out.exists()
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes(good.encode() + b"\n" + good.encode().replace(b'"task"', b'"t\xe4sk"') + b"\n")
    r = aspan("train", "--data", str(latin), "--out", str(tmp_path / "run"), "--steps", "1", cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "run").exists()
    one_line(r.stderr, f"{latin} line 2:", "UTF-8")


def test_every_task_reads_back_what_it_writes(tmp_path):
    for name in tasks.NAMES:
        for split in tasks.SPLITS:
            samples = tasks.preset(name, split).generate(20, seed=1)
            path = tmp_path / f"{name}-{split}.jsonl"
            path.write_text("".join(s.to_json() + "\n" for s in samples))
            assert tasks.read_samples(path) == samples


WRONG_TYPE = {  # values of the wrong type for each field: the error must name exactly that field
    "prompt_len": st.one_of(st.floats(allow_nan=False).filter(lambda x: not x.is_integer()), st.booleans(),
                            st.text(max_size=3), st.none()),
    "references": st.one_of(st.just([[2.5]]), st.just([[True]]), st.lists(st.integers(), min_size=1),
                            st.text(max_size=3)),
    "text": st.one_of(st.integers(), st.just(""), st.none(), st.lists(st.text(max_size=2))),
    "task": st.one_of(st.integers(), st.none(), st.lists(st.text(max_size=2))),
    "params": st.one_of(st.integers(), st.lists(st.integers()), st.text(max_size=3)),
    "given": st.one_of(st.just([0.5]), st.just([True]), st.text(min_size=1, max_size=3)),
}
WRONG_VALUE = {  # well-typed values: a mutation must be refused naming its line (and a field), unless valid
    "prompt_len": st.integers(-2, 60),
    "references": st.lists(st.lists(st.integers(-3, 40), max_size=3), max_size=12),
    "text": st.text(alphabet="0123456789ab=+*:,", min_size=1, max_size=12),
    "task": st.sampled_from(["reversl", *tasks.NAMES]),
    "params": st.sampled_from([{"length": [1, 2], "charset": "a"}, {"digits": 3}, {"nope": 1}, {}]),
    "given": st.lists(st.integers(0, 9), min_size=1, max_size=3),
}


def read_error(path: Path) -> str:
    try:
        tasks.read_samples(path)
    except ValueError as e:
        return str(e)
    return ""


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(tasks.NAMES), st.integers(0, 10**6), st.integers(1, 5), st.booleans(), st.data())
def test_parser_round_trips_valid_rows_and_names_a_mutated_field(name, seed, n, typed, data):
    samples = tasks.preset(name, "id").generate(n, seed=seed)
    line = data.draw(st.integers(0, n - 1))
    field = data.draw(st.sampled_from(sorted(WRONG_TYPE)))
    value = data.draw((WRONG_TYPE if typed else WRONG_VALUE)[field])
    rows = [s.to_dict() for s in samples]
    rows[line] = {**rows[line], field: value}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "samples.jsonl"
        path.write_text("".join(s.to_json() + "\n" for s in samples))
        assert tasks.read_samples(path) == samples  # valid rows round-trip
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        message = read_error(path)
    if typed:
        assert message.startswith(f"{path} line {line + 1}: field {field!r}: must be "), message
    elif message:
        assert message.startswith(f"{path} line {line + 1}: field '"), message
    else:  # accepted: then it really is a sample of its task, solver and references included
        mutated = tasks.Sample.from_dict(rows[line])
        assert tasks.from_params(mutated.task, mutated.params).rebuild(mutated.prompt, mutated.target) == mutated


# ------------------------------------------------------------------------------------ API arguments
def test_negative_or_non_integer_seeds_are_refused():
    task = tasks.get("reversal")
    assert task.generate(3, seed=1) != task.generate(3, seed=2)
    for seed in (-1, 1.0, "1", True):
        with pytest.raises(ValueError, match="seed must be an int >= 0"):
            task.generate(3, seed=seed)
        with pytest.raises(ValueError, match="seed must be an int >= 0"):
            task.stream(seed)


def test_evaluate_refuses_an_empty_sample_list():
    model, tokenizer, _ = models.load("reversal", device="cpu")
    with pytest.raises(ValueError, match="no samples"):
        evaluate(model, tokenizer, [])


# ------------------------------------------------------------------------------------ nonsense values
def test_edit_values_that_overflow_or_mean_nothing_are_refused():
    mask = torch.eye(6, dtype=torch.bool)
    for make in (lambda **kw: hooks.reinforce([(0, 0)], mask, 1.0, **kw),
                 lambda **kw: hooks.steer([(0, 0)], mask, **kw),
                 lambda **kw: hooks.patch_pattern([(0, 0)], mask, **kw)):
        assert make(delta=2) and make(delta=np.int64(-1))
        for bad in (2.7, "2", True, None):
            with pytest.raises(ValueError, match="delta must be an integer"):
                make(delta=bad)
    with pytest.raises(ValueError, match="delta must be an integer"):
        hooks.offset_scores(models.load("reversal", device="cpu").model, torch.zeros(1, 6, dtype=torch.long), mask,
                            deltas=[0, 1.5])
    with pytest.raises(ValueError, match="strength 1e\\+300 overflows the attention's float32"):
        hooks.reinforce([(0, 0)], mask, strength=1e300)
    with pytest.raises(ValueError, match="threshold must be < 1"):
        hooks.reinforce([(0, 0)], mask, strength=1.0, threshold=1.5)
    half = torch.full((1, 1, 6, 6), 1 / 6, dtype=torch.float16)
    with pytest.raises(ValueError, match="strength 20000 overflows the attention's float16"):
        edit_pattern(half, mask, 2e4)  # finite in float16 alone (65504 is its largest), not over a row of 6 keys
    assert torch.isfinite(edit_pattern(half, mask, 1e3)).all()
    with pytest.raises(ValueError, match="overflows"):  # fits one key in float32, not a row of 40 at run time
        (_, hook), = hooks.reinforce([(0, 0)], torch.eye(40, dtype=torch.bool), strength=3e37)
        hook(torch.full((1, 1, 40, 40), 1 / 40), None)
    for source in (torch.full((6, 6), float("nan")), -torch.eye(6), torch.eye(6, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"source pattern of head \(0, 0\) must hold finite attention weights"):
            hooks.patch_pattern([(0, 0)], source={(0, 0): source})


def test_sweep_strengths_that_overflow_and_thresholds_that_never_fire_are_refused(tmp_path):
    for line, words in (("strengths = [1.0, 1e300]", ["sweep config: strengths", "1e+300", "float32"]),
                        ("thresholds = [0.1, 1.5]", ["sweep config: thresholds", "below 1", "1.5"])):
        text = SWEEP.replace("strengths = [1.0]", line if "strengths" in line else "strengths = [1.0]\n" + line)
        cfg = sweep_config(tmp_path, text)
        r = aspan("sweep", "--config", str(cfg), "--out", str(tmp_path / "run"), "--quiet", cwd=tmp_path)
        assert r.returncode == 2 and not (tmp_path / "run").exists()
        one_line(r.stderr, *words)


def test_sweep_steer_with_strengths_past_alpha_is_refused_at_config_load(tmp_path):
    """The sweep example's strengths [1.0, 4.0] (docs/cli-examples.md) with method steer (PASTA's alpha must be in (0,
    1]): one line naming the key and the method before the model loads, no run directory; without steer the same
    strengths are a grid."""
    text = SWEEP.replace("strengths = [1.0]", 'strengths = [1.0, 4.0]\nmethod = ["reinforce", "steer"]')
    r = aspan("sweep", "--config", str(sweep_config(tmp_path, text)), "--out", str(tmp_path / "run"), "--quiet",
              cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "run").exists(), r.stderr
    one_line(r.stderr, "sweep config: strengths", "method steer", "4")
    raw = tomllib.loads(text)
    assert len(grid(SweepConfig.from_dict({**raw, "method": ["reinforce", "patch"]}))) == 2 + 1  # patch: no strength


# ------------------------------------------------------------------------------------ arguments before any work
def test_rank_by_effect_refuses_a_bad_edit_before_any_work(tmp_path):
    for extra, words in ((["--strength", "-1"], ["--strength -1", "must be >= 0"]),
                         (["--method", "steer", "--strength", "2"], ["--strength 2", "alpha"]),
                         (["--strength", "1e300"], ["--strength 1e+300", "overflows"])):
        out = tmp_path / "rank"
        r = aspan("rank", "reversal", "--task", "reversal", "-n", "4", "--by", "effect", *extra, "--out", str(out),
                  "--quiet", cwd=tmp_path)
        assert r.returncode == 2 and not out.exists(), r.stderr
        one_line(r.stderr, *words)


# ------------------------------------------------------------------------------------ resource limits
def gb_peak(*args: str, cwd: Path) -> tuple[int, str, float]:
    code, err, peak = aspan_peak(*args, cwd=cwd)
    return code, err, peak / 2**30


def test_sample_counts_and_batches_that_cannot_fit_are_refused_before_allocating(tmp_path):
    train = ["train", *SMALL, "--steps", "1"]
    for args, words in (([*train, "--batch-size", "1000000000"], ["--batch-size", "1,000,000,000 sequences", "GB"]),
                        ([*train, "--eval-samples", "1000000000"], ["--eval-samples", "samples", "GB"]),
                        (["eval", "reversal", "-n", "1000000000"], ["-n", "1,000,000,000 samples", "GB"]),
                        (["eval", "reversal", "-n", "4", "--batch-size", "1000000000"], ["--batch-size", "GB"])):
        out = tmp_path / "run"
        code, err, peak = gb_peak(*args, *(["--out", str(out)] if args[0] == "train" else []), cwd=tmp_path)
        assert code == 2 and not out.exists(), err
        one_line(err, *words, "more than this machine can hold")
        assert peak < 2, f"{args}: peak {peak:.1f} GB before refusing"
    cfg = sweep_config(tmp_path, SWEEP.replace("n_samples = 2", "n_samples = 1000000000"))
    code, err, peak = gb_peak("sweep", "--config", str(cfg), "--out", str(tmp_path / "sw"), cwd=tmp_path)
    assert code == 2 and not (tmp_path / "sw").exists() and peak < 2
    one_line(err, "sweep config: n_samples", "GB")


def test_sizes_that_fit_are_accepted_and_the_estimate_bounds_real_samples():
    import tracemalloc

    from aspan.checks import check_batch_memory, check_sample_memory, sample_bytes

    for name in tasks.NAMES:
        task = tasks.preset(name, "ood")
        tracemalloc.start()
        samples = task.generate(500, seed=0)
        used = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert used < sample_bytes(len(samples), task.max_text_len()), name
    check_sample_memory(500, 101, "-n", records=True)  # the eval default on reversal OOD
    check_batch_memory(models.load("reversal", device="cpu").model.cfg, 64, 103, "--batch-size", training=True)


def test_evaluate_refuses_samples_its_model_cannot_read_before_any_forward():
    rev = tasks.get("reversal", length=(1, 4), charset="abcd")
    tok = CharTokenizer(rev.alphabet)
    model = models.tiny(tok, n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    forwards = []
    model.blocks[0].attn.hook_pattern.add_hook(lambda x, hook: forwards.append(1))
    samples = rev.generate(40, seed=0) + tasks.get("addition", digits=(1, 2)).generate(4, seed=0)
    with pytest.raises(ValueError, match=r"samples of task addition, reversal that this model's tokenizer cannot read"):
        evaluate(model, tok, samples, batch_size=8)
    assert not forwards  # refused before the first batch
    assert len(evaluate(model, tok, samples[:8], attn=False).samples) == 8 and forwards


def test_sweep_seeds_below_zero_are_refused_by_the_config():
    for text, key in ((SWEEP + "rank_seed = -3\n", "heads.rank_seed"),
                      (SWEEP.replace("n_samples = 2", "n_samples = 2\nseeds = [0, -1]"), "seeds")):
        with pytest.raises(ValueError, match=f"sweep config: {key}: must be an integer >= 0, got -"):
            SweepConfig.from_dict(tomllib.loads(text), check_model=False)


def test_id_budget_points_become_one_fraction_for_sweep_and_demo(tmp_path):
    """`--id-budget PP` is read by one argument type in both commands: points to a fraction, and a value that is not
    a number >= 0 is refused while the command line is parsed (one line naming the flag), before the config is read
    or the run directory is touched."""
    from aspan.cli import Parser
    from aspan.commands.argtypes import points_fraction
    from aspan.commands.demo import add_arguments as demo_arguments
    from aspan.commands.sweep import add_arguments as sweep_arguments

    assert points_fraction("1.5") == pytest.approx(0.015) and points_fraction("0") == 0.0
    for add in (sweep_arguments, demo_arguments):
        parser = Parser(prog="aspan")
        add(parser)
        argv = ["c.toml"] if add is sweep_arguments else []
        assert parser.parse_args([*argv, "--id-budget", "2"]).id_budget == pytest.approx(0.02)
        assert parser.parse_args(argv).id_budget is None  # not given: the settings dataclass keeps its default
    unread = tmp_path / "unread.toml"  # exists (its name is checked while parsing), never read: not TOML
    unread.write_text("not [ toml")
    for command, bads in ((["sweep", "--config", str(unread)], ("-1", "nan", "x")),
                          (["demo"], ("-1",))):
        for bad in bads:
            r = aspan(*command, "--id-budget", bad, "--out", str(tmp_path / "run"), cwd=tmp_path)
            assert r.returncode == 2, r.stderr
            one_line(r.stderr, "--id-budget", bad)
            assert not (tmp_path / "run").exists()


def test_shard_is_one_argument_type_for_sweep_demo_and_pretrained(tmp_path):
    """`--shard I/N` is parsed by one argument type (`argtypes.shard`) into (I, N); a malformed or out-of-range shard
    is refused while the command line is parsed, one line naming the flag, before a config is read."""
    from aspan.cli import Parser
    from aspan.commands import demo, pretrained, sweep
    from aspan.commands.argtypes import shard

    assert shard("2/5") == (2, 5)
    for module, argv in ((sweep, ["c.toml"]), (demo, []), (pretrained, ["c.toml"])):
        parser = Parser(prog="aspan")
        module.add_arguments(parser)
        assert parser.parse_args([*argv, "--shard", "1/3"]).shard == (1, 3)
    missing = tmp_path / "unread.toml"  # exists (its name is checked while parsing), never read: not TOML
    missing.write_text("not [ toml")
    missing = str(missing)
    for command, bad in ((["sweep", "--config", missing], "2/2"), (["pretrained", "--config", missing], "x"),
                         (["demo"], "1")):
        r = aspan(*command, "--shard", bad, "--out", str(tmp_path / "run"), cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        one_line(r.stderr, "--shard", repr(bad))
        assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------ learning curves and stop rules
def test_bad_curve_and_stop_flags_are_refused_in_one_line_before_training(tmp_path):
    train = ["train", *SMALL, "--steps", "2", "--eval-samples", "4"]
    for flags, words in ((["--stop", "target"], ["target stop rule needs a target"]),
                         (["--stop", "soon"], ["--stop", "invalid choice"]),
                         (["--stop", "target", "--target", "1.5"], ["--target", "[0, 1]"]),
                         (["--stop", "plateau", "--stop-bucket", "21-30"], ["--stop-bucket", "length 21-30",
                                                                             "not a curve set"]),
                         (["--stop", "plateau", "--curve-every", "0"], ["--stop plateau needs learning curves"]),
                         (["--curve-buckets", "1-10,5-12"], ["--curve-buckets", "overlaps"]),
                         (["--curve-buckets", "id,oops"], ["--curve-buckets", "'oops'"]),
                         (["--curve-every", "-1"], ["--curve-every", ">= 0"]),
                         (["--eval-samples", "0", "--curve-every", "5"], ["--curve-every", "--eval-samples above 0"])):
        out = tmp_path / "run"
        r = aspan(*train, *flags, "--out", str(out), cwd=tmp_path)
        assert r.returncode == 2 and not out.exists(), (flags, r.stderr)
        one_line(r.stderr, *words)


VARIANTS = [("addition", {"padding": True}), ("addition", {"layout": "padded", "width": 6}),
            ("successor", {"layout": "padded", "width": 4, "numbers": 2}),
            ("parity", {"layout": "padded", "width": 12}),
            ("parity", {"scratchpad": False}), ("multiplication", {"digits": (2, 3), "digits_b": (1, 2)}),
            ("assign", {"pairs": (3, 6), "length": (2, 7)}), ("flipflop", {"instructions": (3, 12)})]


@pytest.mark.parametrize("name, params", VARIANTS)
def test_every_generated_sample_is_admitted_by_its_own_parameters(name, params):
    task = tasks.get(name, **params)
    for sample in task.generate(40, seed=3):
        assert tasks.checked_sample(sample.to_dict()) == sample


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(1, 30), st.integers(0, 10), st.integers(0, 10**6))
def test_a_sample_whose_params_do_not_hold_its_text_is_refused(length, lo, span, seed):
    """A reversal sample of `length` characters claiming `length=lo-(lo+span)`: read when the range holds it,
    refused naming params and length otherwise (it was accepted, so `train --data` trained on a mislabelled
    distribution)."""
    sample = tasks.get("reversal", length=length).generate(1, seed=seed)[0]
    row = {**sample.to_dict(), "params": {**sample.params, "length": [lo, lo + span]}}
    if lo <= length <= lo + span:
        assert tasks.checked_sample(row).text == sample.text
    else:
        with pytest.raises(ValueError, match=f"field 'params': length is {lo}-{lo + span} .* has length {length}"):
            tasks.checked_sample(row)


def test_train_data_with_a_mislabelled_length_is_one_line(tmp_path):
    row = {**tasks.get("reversal", length=5).generate(1, seed=0)[0].to_dict()}
    row["params"] = {**row["params"], "length": [1, 3]}
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(row) + "\n")
    r = aspan("train", "--data", str(data), "--out", str(tmp_path / "run"), "--steps", "1", "--batch-size", "2",
              "--eval-samples", "0", "--quiet", cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(r.stderr, f"{data} line 1:", "field 'params'", "length is 1-3", "has length 5")
    assert not (tmp_path / "run").exists()
