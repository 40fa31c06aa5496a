"""Each cause sentence on a sample built to show that cause (the scripted model of tests/anatomy/scripted.py), each
rule silent where its cause is absent, and nothing said where no rule fires."""
from __future__ import annotations

import hooks
from aspan.anatomy import causes as C

from .scripted import READER
from .test_explain import reader_keys, run


def test_a_right_answer_says_nothing():
    assert run(reader_keys()).causes == []


def test_the_model_does_not_stop():
    # every character right; at the EOS row the reader reads key 7 (carrying 'f'): the model writes 'f'
    a = run(reader_keys(eos_key=7))
    assert a.causes == ["the answer is right up to the EOS row (token 6), where the model does not stop: it "
                        "predicts 'f'"]


def test_the_model_stops_early_at_the_start_of_the_sequence():
    # from token 3 on the reader reads key 1 (carrying BOS, text position 0): EOS where 'c', 'b', 'a' are expected
    a = run(reader_keys({j: {1: 1.0} for j in (3, 4, 5)}))
    assert a.causes[0] == ("the model stops early: at tokens 3-5 it predicts EOS where a character is expected; at "
                           "3 of these 3 tokens head L1H0 attends to the start of the sequence (position 0 or before)")
    assert C.stops_early(C.rows_of(a)) == a.causes[:1]
    assert C.drift(C.rows_of(a)) == [] and C.eos_not_stopped(C.rows_of(a)) == []


def test_stopping_early_elsewhere_leaves_out_the_start():
    # EOS predicted through the distractor (weight 5 on BOS's key 0), the reader still on ref+1 at token 4
    a = run(reader_keys(), distractor=5.0, distractor_rows={11: {0: 1.0}})
    assert C.stops_early(C.rows_of(a)) == ["the model stops early: at token 4 it predicts EOS where a character is "
                                           "expected"]


def test_a_drift_from_one_token_on_and_the_copied_answer():
    a = run(reader_keys({j: {8 - j: 1.0} for j in (3, 4, 5)}))
    assert C.drift(C.rows_of(a)) == [
        "from token 3 on, head L1H0's top position drifts 1 right of its reference (ref+2 instead of ref+1) at 3 of "
        "the 3 wrong tokens, and the answer copies that position at 3 of them"]
    assert C.leaves(C.rows_of(a)) == [
        "from token 3 on, the attention of head L1H0 leaves the references: mean mass on ref+1 1.00 on tokens 0-2 "
        "(right), 0.00 on the 3 wrong tokens"]
    assert a.causes == C.drift(C.rows_of(a)) + C.leaves(C.rows_of(a))


def test_a_drift_to_the_left_that_the_answer_does_not_copy():
    # tokens 2-4 read two keys left of ref+1 (key 5 - j); the distractor (weight 5) copies 'a' (key 1) over them, so
    # the answers are 'a', not the tokens the reader points at
    wrong = {j: {5 - j: 1.0} for j in (2, 3, 4)}
    a = run(reader_keys(wrong), distractor=5.0, distractor_rows={7 + j: {1: 1.0} for j in (2, 3, 4)})
    assert list(a.tokens.predicted[2:5]) == ["a", "a", "a"]
    assert C.drift(C.rows_of(a)) == [
        "from token 2 on, head L1H0's top position drifts 2 left of its reference (ref-1 instead of ref+1) at 3 of "
        "the 3 wrong tokens"]


def test_scattered_tops_that_the_answer_copies():
    # token 2 reads one key right of ref+1, token 4 one key left; each answer copies what it reads
    a = run(reader_keys({2: {6: 1.0}, 4: {2: 1.0}}))
    rows = C.rows_of(a)
    assert [j for j in a.tokens.index if not a.tokens.correct[j]] == [2, 4]
    assert list(a.tokens.predicted[[2, 4]]) == ["e", "a"]
    assert C.drift(rows) == ["at tokens 2, 4, head L1H0's top position is off its reference (+1, -1 from ref+1) and "
                             "the answer copies that position"]


def test_attention_on_the_references_and_still_wrong():
    # token 2: the reader on ref+1, the distractor (weight 5) copies 'a' from key 1 over it
    a = run(reader_keys(), distractor=5.0, distractor_rows={9: {1: 1.0}})
    assert a.tokens.predicted[2] == "a" and a.tokens.margin[2] == 3 - 5
    assert a.causes == ["at token 2 head L1H0 reads the references (top position at ref+1, mass >= 0.5) and the "
                        "answer is still wrong: the error there does not come from where this head reads"]


def test_a_wrong_answer_no_rule_explains_is_met_with_silence():
    # before the error the reader has 0.6 on ref+1 (0.4 on key 1, which votes EOS with 1.2 < 1.8); at token 3 it
    # has 0.45 on ref+1 and 0.55 on key 2 (carrying 'a'), and the distractor copies 'e' from key 5 over both: the
    # head is off its reference once, the answer is not what it points at, its mass drops by less than half
    keys = {7 + j: {7 - j: 0.6, 1: 0.4} for j in range(6)}
    keys[7 + 3] = {4: 0.45, 2: 0.55}
    keys[13] = {1: 1.0}
    a = run(keys, distractor=5.0, distractor_rows={10: {5: 1.0}})
    assert list(a.tokens.correct) == [True] * 3 + [False] + [True] * 3 and a.tokens.predicted[3] == "e"
    rows = C.rows_of(a)
    assert [rule(rows) for rule in C.RULES] == [[]] * len(C.RULES)
    assert a.causes == []


def test_what_an_edit_fixes_and_breaks():
    keys = reader_keys({j: {8 - j: 1.0} for j in (3, 4, 5)})
    a = run(keys, fwd_hooks=lambda b: hooks.patch_pattern([READER], b.ref_mask, delta=1))
    assert a.causes_after == ["the edit fixes 3 of the 3 wrong tokens (3-5); at 3 of them the top position of head "
                              "L1H0 is on ref+1"]
    # an edit that moves token 1's reader one key right breaks it, and fixes nothing
    def shove(b):
        def hook(pattern, hook):
            pattern[:, 0, 8] = 0
            pattern[:, 0, 8, 7] = 1.0
            return pattern
        return [("blocks.1.attn.hook_pattern", hook)]

    b = run(keys, fwd_hooks=shove)
    assert b.causes_after[:2] == ["the edit fixes none of the 3 wrong tokens",
                                  "the edit breaks token 1, right before it"]
    assert any(s.startswith("after the edit, ") for s in b.causes_after[2:])


def test_words():
    assert C.span([7, 3, 5, 6]) == "3, 5-7" and C.tokens_word([4]) == "token 4"
    assert C.heads_word(["L1H7", "L1H0", "L0H3"]) == "heads L1H7, L1H0 and L0H3" and C.ref(-1) == "ref-1"
