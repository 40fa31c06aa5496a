"""Parity in its four formats: examples, references, sufficiency, determinism, bad params, random params."""
import json
import os
import random
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aspan import tasks
from aspan.batching import IGNORE, make_batch
from aspan.tasks.parity import ANCHOR_POOL, FORMATS, INTERLEAVED, Parity
from aspan.tokenization import CharTokenizer
from tests.tasks.sufficiency import check_sufficiency
from tests.tasks.task_checks import check_determinism, check_samples


def brute_parity(bits: str) -> str:
    """Parity by counting, unlike both the generator and the solver (which XOR step by step)."""
    return str(sum(map(int, bits)) % 2)


def test_examples():
    assert Parity().solve("10110=") == "11011"
    assert Parity(scratchpad=False).solve("10110=") == "1"
    assert Parity(format="plain").solve("0=") == "0"
    assert Parity(format="interleaved").solve("10110=") == "1101101101"
    assert Parity(format="mnemonic").solve("a1b0c1=") == "a1b1c0"
    assert Parity(format="mnemonic", anchors=len(ANCHOR_POOL)).solve("ж0a1=") == "ж0a1"
    with pytest.raises(ValueError, match="anchor"):
        Parity(format="mnemonic").solve("ж0a1=")  # beyond the first 100 anchors


def test_default_format_unchanged():
    """The default is the running-parity scratchpad with the same samples as before formats existed."""
    t = Parity()
    assert t.format == "scratchpad" and t.scratchpad
    assert Parity(scratchpad=False).format == "plain"
    for s in t.generate(50, seed=0):
        n = s.prompt_len - 1
        assert s.target == "".join(brute_parity(s.text[: i + 1]) for i in range(n))
        assert s.references == tuple((0,) if i == 0 else (i, n + i) for i in range(n)) and s.given == ()
        assert "given" not in s.to_dict()


def test_plain_references_every_bit_and_every_bit_is_necessary():
    t = Parity(length=(1, 12), format="plain")
    for s in t.generate(50, seed=1):
        assert s.references == (tuple(range(s.prompt_len - 1)),)
        assert s.target == brute_parity(s.prompt[:-1])
        for p in s.references[0]:
            assert t.solve(s.prompt[:p] + "10"[int(s.prompt[p])] + s.prompt[p + 1 :]) != s.target


def test_interleaved_layout_and_fixed_offsets():
    """Bit i is replayed (given) at target 2i, its running parity at 2i+1; each parity reads offsets 0 and 1."""
    t = Parity(length=(1, 30), format="interleaved")
    for s in t.generate(100, seed=2):
        bits, n, p = s.prompt[:-1], s.prompt_len - 1, s.prompt_len
        assert s.target[0::2] == bits and s.given == tuple(range(0, 2 * n, 2))
        assert s.target[1::2] == "".join(brute_parity(bits[: i + 1]) for i in range(n))
        for j in range(2 * n):
            q = p + j - 1  # text position of the query row's token (the token before target char j)
            if j % 2 == 0:
                assert s.references[j] == ()
            else:
                assert s.references[j] == ((q,) if j == 1 else (q - 1, q))
                assert s.text[q] == bits[j // 2]  # the bit sits at the query row itself: no lookup by index


def test_interleaved_ab_replays_bits_on_tokens_of_their_own():
    """interleaved-ab is interleaved with the replayed bits spelt a (0) / b (1): never the parity outputs' tokens;
    the old spelling stays under `interleaved` (committed results read as before)."""
    assert Parity(format="interleaved-ab").solve("10110=") == "b1a1b0b1a1"
    assert Parity(format="interleaved").solve("10110=") == "1101101101"
    old, new = Parity(length=(1, 30), format="interleaved"), Parity(length=(1, 30), format="interleaved-ab")
    assert set(new.alphabet) == set(old.alphabet) | {"a", "b"} and new.max_text_len() == old.max_text_len()
    for a, b in zip(old.generate(100, seed=2), new.generate(100, seed=2)):
        bits, n = b.prompt[:-1], b.prompt_len - 1
        assert a.prompt == b.prompt and a.references == b.references and a.given == b.given
        assert b.target[0::2] == bits.replace("0", "a").replace("1", "b") and b.target[1::2] == a.target[1::2]
        assert set(b.target[0::2]) <= {"a", "b"} and set(b.target[1::2]) <= {"0", "1"}
        for j in range(1, 2 * n, 2):  # parity j reads its replayed bit at the query row and the parity before it
            q = b.prompt_len + j - 1
            assert b.text[q] == "ab"[int(bits[j // 2])] and b.references[j] == ((q,) if j == 1 else (q - 1, q))


def test_mnemonic_layout_and_content_lookup():
    t = Parity(length=(1, 40), format="mnemonic")
    for s in t.generate(100, seed=3):
        body = s.prompt[:-1]
        marks, bits = body[0::2], body[1::2]
        assert len(set(marks)) == len(marks) and set(marks) <= set(ANCHOR_POOL[:100])
        assert s.target[0::2] == marks
        assert s.target[1::2] == "".join(brute_parity(bits[: i + 1]) for i in range(len(bits)))
        for i, m in enumerate(marks):
            assert s.references[2 * i] == (2 * i,) and s.text[2 * i] == m
            bit_pos = s.prompt.index(m) + 1  # found by content: the bit after the matching anchor
            assert bit_pos in s.references[2 * i + 1] and s.text[bit_pos] == bits[i]


@pytest.mark.parametrize("fmt", FORMATS)
def test_contract_sufficiency_and_determinism(fmt):
    task = Parity(length=(1, 14), format=fmt)
    samples, checked = check_samples(task, 150, seed=5)
    assert checked >= (0 if fmt == "plain" else 150)  # plain references every prompt bit: nothing lies outside
    check_determinism(task)
    assert tasks.from_params("parity", json.loads(json.dumps(task.params()))).format == fmt


@pytest.mark.parametrize("fmt", FORMATS)
def test_ood_presets_with_format(fmt):
    ids, ood = tasks.preset("parity", "id", format=fmt), tasks.preset("parity", "ood", format=fmt)
    assert min(len(s.text) for s in ood.generate(100, seed=1)) > ids.max_text_len()
    check_samples(ood, 20, seed=2)


@pytest.mark.parametrize("prompt", ["", "=", "10", "102=", "1=1", "1==", "a1="])
def test_invalid_prompts(prompt):
    for fmt in ("plain", "scratchpad", "interleaved"):
        with pytest.raises(ValueError):
            Parity(format=fmt).solve(prompt)


@pytest.mark.parametrize("prompt", ["", "=", "a1", "a=", "1a=", "a1b=", "a1a0=", "a2=", "=1=", "é1="])
def test_invalid_mnemonic_prompts(prompt):
    with pytest.raises(ValueError):
        Parity(format="mnemonic").solve(prompt)


@pytest.mark.parametrize("params", [
    dict(length=0), dict(length=(4, 2)), dict(length=(-1, 2)), dict(scratchpad=1), dict(length="x"),
    dict(format="tape"), dict(format=1), dict(format="mnemonic", scratchpad=False),
    dict(format="interleaved", scratchpad=False), dict(format="mnemonic", anchors=0),
    dict(format="mnemonic", anchors=len(ANCHOR_POOL) + 1), dict(format="mnemonic", anchors=True),
    dict(format="mnemonic", length=(1, 20), anchors=10), dict(format="scratchpad", anchors=7),
])
def test_bad_params(params):
    with pytest.raises(ValueError, match=list(params)[-1]):  # the last key is the offending one
        Parity(**params)


def test_bad_params_one_line_through_the_cli(capsys):
    from aspan.cli import main

    assert main(["data", "--task", "parity", "-n", "1", "--param", "format=tape"]) == 2
    err = capsys.readouterr().err.strip()
    assert "format" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_data_and_show(fmt, capsys):
    from aspan.cli import main

    assert main(["data", "--task", "parity", "-n", "3", "--seed", "4", "--param", f"format={fmt}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(x) for x in lines] == [s.to_dict() for s in Parity(format=fmt).generate(3, seed=4)]
    assert main(["show", "--task", "parity", "--param", f"format={fmt}", "--seed", "4"]) == 0
    out = capsys.readouterr().out
    assert f'"format": "{fmt}"' in out and Parity(format=fmt).generate(1, seed=4)[0].text in out


def test_tokenizer_covers_anchors():
    task = Parity(length=(1, 40), format="mnemonic", anchors=len(ANCHOR_POOL))
    tok = CharTokenizer.for_alphabets(task.alphabet)
    tok.check(task.alphabet)
    for s in task.generate(20, seed=0):
        assert len(tok.encode(s.text)) == len(s.text) and tok.decode(tok.encode(s.text)) == s.text


@pytest.mark.parametrize("fmt", INTERLEAVED)
def test_given_characters_are_not_targets(fmt):
    """Batching: the rows that would predict a replayed input bit carry no label and no target index."""
    task = Parity(length=(2, 6), format=fmt)
    samples = task.generate(8, seed=1)
    tok = CharTokenizer()
    b = make_batch(samples, tok)
    for i, s in enumerate(samples):
        first = tok.offset + s.prompt_len - 1
        for j in range(len(s.target)):
            if j in s.given:
                assert b.labels[i, first + j] == IGNORE and b.target_index[i, first + j] == -1
            else:
                assert b.labels[i, first + j] == tok.encode(s.target[j])[0] and b.target_index[i, first + j] == j
        assert int(b.target_rows[i].sum()) == len(s.target) - len(s.given) + 1  # + EOS


@pytest.mark.parametrize("fmt", INTERLEAVED)
def test_generation_forces_given_characters(fmt):
    """Greedy generation supplies the given bits; exact accuracy then equals the teacher-forced one."""
    from aspan import models
    from aspan.evaluation import evaluate, greedy

    task = Parity(length=(2, 6), format=fmt)
    tok = CharTokenizer()
    model = models.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=32, seed=0)
    samples = task.generate(12, seed=2)
    gen = evaluate(model, tok, samples, mode="generate", attn=False)
    teach = evaluate(model, tok, samples, mode="teacher", attn=False)
    for res in (gen, teach):
        r = res.records[~res.records.eos]
        assert len(r) == sum(len(s.target) - len(s.given) for s in samples)
        assert (r.target_index % 2 == 1).all()  # only the parities are scored
    assert gen.samples.exact.tolist() == teach.samples.exact.tolist()
    unforced_differs = False
    for s in samples:
        ids = torch.tensor([tok.prefix_ids() + tok.encode(s.prompt)])
        forced = torch.full((1, len(s.target)), -1)
        forced[0, list(s.given)] = torch.tensor(tok.encode(s.target[0::2]))
        bits = tok.encode(s.target[0::2])  # the replayed bits as this format spells them
        out = greedy(model, ids, len(s.target), None, forced=forced)[0].tolist()
        free = greedy(model, ids, len(s.target), None)[0].tolist()
        assert out[0::2] == bits
        unforced_differs |= free[0::2] != bits
    assert unforced_differs  # the untrained model does not write the bits by itself: forcing did it


_SCRIPT = """
import sys
from aspan.tasks.parity import Parity
for fmt in ("plain", "scratchpad", "interleaved", "interleaved-ab", "mnemonic"):
    for s in Parity(length=(1, 30), format=fmt).generate(30, seed=9):
        print(s.to_json())
"""


def test_same_seed_same_samples_across_hash_seeds():
    outs = []
    for hashseed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    assert outs[0] == outs[1] and len(outs[0].splitlines()) == 150


@settings(max_examples=30, deadline=None)
@given(lo=st.integers(1, 30), extra=st.integers(0, 20), fmt=st.sampled_from(FORMATS), seed=st.integers(0, 2**32))
def test_random_params(lo, extra, fmt, seed):
    t = Parity(length=(lo, lo + extra), format=fmt)
    rng = random.Random(seed)
    for s in t.generate(10, seed=seed):
        assert t.solve(s.prompt) == s.target
        assert set(s.text) <= set(t.alphabet) and len(s.text) <= t.max_text_len()
        n_bits = sum(c in "01" for c in s.prompt[:-1])
        assert lo <= n_bits <= lo + extra
        assert s.target[-1] == brute_parity([c for c in s.prompt if c in "01"])
        check_sufficiency(t, s, rng)


@settings(max_examples=50, deadline=None)
@given(bits=st.text("01", min_size=1, max_size=60), fmt=st.sampled_from(FORMATS), data=st.data())
def test_solver_on_arbitrary_prompts(bits, fmt, data):
    """The parser accepts every well-formed prompt and the solver's last character is the parity by counting."""
    t = Parity(length=(1, 100), format=fmt)
    if fmt == "mnemonic":
        marks = data.draw(st.permutations(list(t.anchor_symbols)))[: len(bits)]
        prompt = "".join(m + b for m, b in zip(marks, bits)) + "="
    else:
        prompt = bits + "="
    out = t.solve(prompt)
    assert out[-1] == brute_parity(bits)
    assert len(out) == {"plain": 1, "scratchpad": len(bits)}.get(fmt, 2 * len(bits))
    with pytest.raises(ValueError):
        t.solve(prompt[:-1] + "2=")
