"""The qk study's held-out sets (`qk.held_out_sets`): selection, report and curve sets pairwise apart by
construction, and the seed-only draws of before wherever those shared no text (so committed rows keep their sets).
Built only: nothing trains here."""
from functools import lru_cache
from itertools import islice
from unittest import mock

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from aspan import tasks
from aspan.applications.studies.qk import QKStudyConfig, curve_buckets, held_out_sets, study_tasks
from aspan.buckets import bucket_name, bucket_task


@lru_cache(maxsize=None)
def _every_text(charset: str, length: tuple[int, int]) -> frozenset[str]:
    """Every text of a small reversal task (20,000 draws: each of its at most 39 texts has p >= 1/81)."""
    task = tasks.preset("reversal", "id", length=length, charset=charset)
    return frozenset(x.text for x in islice(task.stream(99), 20_000))


def _expected(cfg: QKStudyConfig, charset: str) -> tuple[dict[str, list], str | None]:
    """The sets as the study should draw them, computed here: the selection set is its seed's first n samples;
    then each report set, then each curve set, is the first n samples of its seed's stream whose text no set
    drawn before holds. With the name of the first set whose lengths hold no text outside those (None if none)."""
    ft, idt = (tasks.preset("reversal", "id", length=length, charset=charset) for length in (cfg.finetune, (1, 3)))
    select = ft.generate(cfg.n_select, seed=cfg.select_seed)
    sets, taken = {"select": select}, {x.text for x in select}
    plan = [("report", b, cfg.n_report, cfg.report_seed) for b in cfg.buckets]
    if cfg.protocol == "curves":
        plan += [("curve", b, cfg.n_curve, cfg.curve_seed) for b in curve_buckets(cfg)]
    for kind, b, n, seed in plan:
        if _every_text(charset, b) <= taken:
            return sets, f"{kind} set of {bucket_name(b)}"
        drawn = list(islice((x for x in bucket_task(idt, b).stream(seed) if x.text not in taken), n))
        sets[f"{kind} {bucket_name(b)}"] = drawn
        taken |= {x.text for x in drawn}
    return sets, None


BUCKETS = st.sampled_from([((1, 1), (2, 3)), ((1, 2), (3, 3)), ((1, 1), (2, 2), (3, 3)), ((2, 3),)])
FINETUNE = st.sampled_from([(1, 1), (1, 2), (2, 2), (2, 3), (3, 3)])  # a bucket, inside one, or across two


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["ab", "abc"]), BUCKETS, FINETUNE, st.sampled_from(["budget", "curves"]),
       st.lists(st.integers(1, 20), min_size=3, max_size=3), st.lists(st.integers(0, 10**6), min_size=3, max_size=3))
def test_small_presets_give_pairwise_disjoint_sets_or_a_one_line_error(charset, buckets, finetune, protocol, ns,
                                                                      seeds):
    """Short strings of two or three symbols, where seed-only draws collide: every set has its n samples, no two
    sets share a text, each is its seed-only draw where that shared no text with the sets drawn before it, and
    all are the sets `_expected` draws; or a one-line error naming the set that cannot be drawn, exactly when its
    lengths hold no text outside the sets drawn before it."""
    cfg = QKStudyConfig(task="reversal", finetune=finetune, buckets=buckets, protocol=protocol, n_select=ns[0],
                        n_report=ns[1], n_curve=ns[2], select_seed=seeds[0], report_seed=seeds[1],
                        curve_seed=seeds[2])
    ft, idt = (tasks.preset("reversal", "id", length=length, charset=charset) for length in (finetune, (1, 3)))
    want, refused = _expected(cfg, charset)
    with mock.patch("aspan.tasks.split.MAX_REDRAWS", 2_000):  # a text left has p >= 1/81: never 2,000 misses
        if refused:
            with pytest.raises(ValueError) as err:
                held_out_sets(cfg, ft, idt)
            message = str(err.value)
            assert "\n" not in message and message.startswith(f"too few distinct samples for the {refused} apart "
                                                              f"from the "), message
            assert "the selection set" in message
            event("refused")
            return
        select, report, curves = held_out_sets(cfg, ft, idt)
    got = {"select": select, **{f"report {k}": v for k, v in report.items()},
           **{f"curve {k}": v for k, v in curves.items()}}
    assert list(got) == list(want) and got == want
    sizes = {"select": cfg.n_select, "report": cfg.n_report, "curve": cfg.n_curve}
    texts, before = {}, set()
    for name, samples in got.items():
        assert len(samples) == sizes[name.split()[0]], name
        texts[name] = {x.text for x in samples}
        assert texts[name].isdisjoint(before), name
        kind, _, bucket = name.partition(" length ")
        if kind != "select":  # the seed-only draw, computed here, wherever it shared no text with the sets before
            lo, hi = map(int, bucket.split("-"))
            seed = cfg.report_seed if kind == "report" else cfg.curve_seed
            old = bucket_task(idt, (lo, hi)).generate(len(samples), seed=seed)
            if before.isdisjoint(x.text for x in old):
                assert samples == old, name
            event("seed-only draw" if samples == old else "overlapping draws skipped")
        before |= texts[name]


PAPER_SHAPE = dict(finetune=(21, 40), buckets=((1, 20), (21, 40), (41, 60)), n_report=100, id_length=(1, 20))


@pytest.mark.parametrize("cfg", [QKStudyConfig(), QKStudyConfig.curves(), QKStudyConfig.curves(**PAPER_SHAPE)],
                         ids=["budget", "curves", "paper-shape curves"])
def test_the_sets_of_the_committed_designs_are_their_seed_only_draws(cfg):
    """The sets of the default budget and curves designs and of the paper-shaped one (their held-out sets, seeds
    and sizes: results/qk_study) are the seed-only draws of before, computed here, sample for sample: the filters
    change no committed row."""
    ft, idt = study_tasks(cfg)
    select, report, curves = held_out_sets(cfg, ft, idt)
    assert select == ft.generate(cfg.n_select, seed=cfg.select_seed)
    assert report == {bucket_name(b): bucket_task(idt, b).generate(cfg.n_report, seed=cfg.report_seed)
                      for b in cfg.buckets}
    assert curves == ({bucket_name(b): bucket_task(idt, b).generate(cfg.n_curve, seed=cfg.curve_seed)
                       for b in curve_buckets(cfg)} if cfg.protocol == "curves" else {})
