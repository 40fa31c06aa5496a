"""The held-out sets of the parity study (`aspan.applications.studies.parity`): its tasks on either side of the
split of the inputs by their bits (`aspan.tasks.split`), the selection and test sets (`eval_sets`) and the curves
protocol's sets (`curve_sets`). With `set_draw` "disjoint" the sets are pairwise disjoint and free of repeats, and at
the training lengths each draws from its own third of the held-out side, so none holds a training input."""
from __future__ import annotations

from functools import lru_cache
from itertools import product

from ...tasks.parity import Parity
from ...tasks.split import SplitTask, distinct, part_of
from .parity_config import ParityStudyConfig

ID_PARTS = ("select", "curve", "test")  # the thirds of the held-out side the ID sets draw from (`part_of`)
ENUMERATED_BITS = 16  # pools of inputs up to this many bits are counted, so a set can take a whole small pool
FIT_SET = "train"  # the curve set of the training lengths, whose exact accuracy decides the fit


def make_task(config: ParityStudyConfig, fmt: str, length: int | tuple[int, int], side: str | None = None,
              part: tuple[int, int] = (0, 1)):
    """The parity task of `fmt` (mnemonic tasks share one anchor set, so train and test symbols agree); with `side`
    ("train" or "held_out") and a `held_out_share`, restricted to that side of the split of the inputs by their
    bits (`aspan.tasks.split`; `part`: a slice of the held-out side)."""
    task = Parity(length=length, format=fmt, **({"anchors": config.anchors} if fmt == "mnemonic" else {}))
    if side is None or not config.held_out_share:
        return task
    return SplitTask(task, side, config.held_out_share, key=_bits_key(task), part=part)


def _bits_key(task: Parity):
    """A sample's input bits: the key of the split and of the sets' disjointness (mnemonic anchors aside)."""
    return lambda s: task.bits(s.text[: s.prompt_len])


@lru_cache(maxsize=64)
def _pool(lo: int, hi: int, share: float, part: int | None) -> frozenset[str] | None:
    """Every input of lo..hi bits in third `part` of the held-out side (None: every input); None when there are
    too many to count (more than `ENUMERATED_BITS` bits)."""
    if hi > ENUMERATED_BITS:
        return None
    every = ("".join(b) for n in range(lo, hi + 1) for b in product("01", repeat=n))
    return frozenset(b for b in every if part is None or part_of(b, share, len(ID_PARTS)) == part)


def draw_set(config: ParityStudyConfig, fmt: str, length: int | tuple[int, int], which: str, spec: tuple[int, int],
             taken: set[str]) -> list:
    """Held-out set `which` (one of `ID_PARTS`) of `spec` = (n, seed) samples of `length` bits (`set_draw`
    "disjoint"): no repeats, no input in `taken` (the bits of the sets drawn before; this set's are added); at the
    training lengths only inputs of its third of the held-out side, so never a training input. Fewer than n where
    the pool holds fewer."""
    n, seed = spec
    lo, hi = (length, length) if isinstance(length, int) else length
    inside = hi <= config.train_length and bool(config.held_out_share)
    part = ID_PARTS.index(which) if inside else None
    task = make_task(config, fmt, length, *(("held_out", (part, len(ID_PARTS))) if part is not None else ()))
    pool = _pool(lo, hi, config.held_out_share, part)
    left = None if pool is None else sum(b not in taken for b in pool)
    if left == 0:
        raise ValueError(f"the held-out {which} set of {lo}-{hi} bits has no input to draw from (train_length "
                         f"{config.train_length}, held_out_share {config.held_out_share:g}): raise either")
    key = _bits_key(task if isinstance(task, Parity) else task.task)
    out = distinct(task, n, seed, key=key, exclude=taken, pool=left)
    taken.update(key(s) for s in out)
    return out


def eval_sets(config: ParityStudyConfig, fmt: str) -> dict[tuple[str, str], list]:
    """Selection samples (1x and the selection length) and held-out test samples (every multiple), disjoint seeds;
    with `set_draw` "disjoint" (`draw_set`) also disjoint inputs, none repeated."""
    L = config.train_length
    if config.set_draw == "with_replacement":
        return _eval_sets_with_replacement(config, fmt)
    taken: set[str] = set()
    sets = {("select", "id"): draw_set(config, fmt, L, "select", (config.n_select, 10_001), taken),
            ("select", "ood"): draw_set(config, fmt, config.select_multiple * L, "select",
                                        (config.n_select, 10_000 + config.select_multiple), taken)}
    for m in config.multiples:
        sets[("test", str(m))] = draw_set(config, fmt, m * L, "test", (config.n_test, 20_000 + m), taken)
    return sets


def _eval_sets_with_replacement(config: ParityStudyConfig, fmt: str) -> dict[tuple[str, str], list]:
    """`eval_sets` as drawn before `set_draw` (independent draws: repeats, and overlaps between the sets)."""
    L = config.train_length
    sets = {("select", "id"): make_task(config, fmt, L, "held_out").generate(config.n_select, seed=10_001),
            ("select", "ood"): make_task(config, fmt, config.select_multiple * L).generate(
                config.n_select, seed=10_000 + config.select_multiple)}
    for m in config.multiples:
        side = "held_out" if m == 1 else None  # longer inputs are never trained on
        sets[("test", str(m))] = make_task(config, fmt, m * L, side).generate(config.n_test, seed=20_000 + m)
    return sets


def curve_sets(config: ParityStudyConfig, fmt: str) -> dict[str, list]:
    """The curves protocol's held-out sets: the training lengths (`FIT_SET`, which decides the fit) and the
    selection length, from seeds apart from the selection and test sets; with `set_draw` "disjoint" also from
    inputs apart from theirs (`draw_set`)."""
    L = config.train_length
    if config.set_draw == "with_replacement":
        return {FIT_SET: make_task(config, fmt, (1, L), "held_out").generate(config.n_curve, seed=30_001),
                f"{config.select_multiple}x": make_task(config, fmt, config.select_multiple * L).generate(
                    config.n_curve, seed=30_000 + config.select_multiple)}
    taken = {_bits_key(make_task(config, fmt, 1))(s) for samples in eval_sets(config, fmt).values() for s in samples}
    return {FIT_SET: draw_set(config, fmt, (1, L), "curve", (config.n_curve, 30_001), taken),
            f"{config.select_multiple}x": draw_set(config, fmt, config.select_multiple * L, "curve",
                                                   (config.n_curve, 30_000 + config.select_multiple), taken)}
