"""Learning curves and stop rules: whether a training run converged, read from held-out sets scored as it went.

    rows = read_rows("runs/rev/curves.jsonl")                 # one row per (evaluation step, curve set)
    stop_point(rows, Stop("plateau", bucket="id"))           # (step, "plateau"): where that rule would have stopped
    steps_to_target(rows, "id", 0.99)                         # first step with ID exact >= 0.99, or None

Training (`aspan.training.train` with `curve_data`, `aspan train` by default) scores every curve set at step 0,
every `curve_every` steps and at the last step, teacher-forced with `aspan.evaluation.evaluate` (exact, per-token
accuracy) plus the training loss on the set, and appends one row per set to `curves.jsonl`: step, bucket, n, exact,
partial, loss, eval_s (seconds this set's evaluation took), train_s (training seconds since the previous evaluation)
and wall_s (seconds since the run began, resumes included). The curve sets are held out: drawn from seed
`seed + CURVE_SEED`, apart from the evaluation sets (seed `seed`) and the training batches (seeds with bit 62 set).

Every function here is pure: a notebook calls them on any list of rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .buckets import Bucket, bucket_name, bucket_task, parse_buckets
from .options import CURVE_METRICS, STOP_RULES, CurveMetric, StopRule, check_option
from .tasks.base import Sample, Task

CURVES_FILE = "curves.jsonl"
CURVE_SEED = 1 << 30  # added to the run's seed (< 2**30) for the curve sets
CURVE_BUDGET = 0.10  # the share of training time the default interval allows the curves
PLATEAU_GAIN = 0.01  # a gain below this (1 percentage point) is no gain
PLATEAU_WINDOW = 3  # evaluations without a gain that make a plateau
# Seconds to evaluate one held-out token (`evaluate` and the loss forward) per second a training step spends on one
# token: 1.4 measured with `aspan train`'s default model and curve sets (reversal id + ood, 200 samples each, batch 64)
# on a 2-core CPU, rounded up (see `auto_every`).
EVAL_COST = 1.5
NAMED_SETS = ("train", "id", "ood")  # curve sets named after the evaluation sets of `aspan train`


@dataclass(frozen=True)
class Stop:
    """A stop rule: "none", "target" (stop at the first evaluation where `bucket`'s `metric` >= `target`) or
    "plateau" (stop at the first evaluation closing `window` evaluations in which `bucket`'s `metric` never beat the
    best before them by `gain` or more). `target` with another rule only records steps-to-target."""

    rule: StopRule = "none"
    bucket: str = "id"
    target: float | None = None
    metric: CurveMetric = "exact"
    gain: float = PLATEAU_GAIN
    window: int = PLATEAU_WINDOW

    def check(self) -> "Stop":
        """ValueError naming the first impossible setting."""
        check_option("stop rule", self.rule, STOP_RULES)
        check_option("stop metric", self.metric, CURVE_METRICS)
        if self.target is not None and (isinstance(self.target, bool) or not (
                isinstance(self.target, (int, float)) and 0 <= self.target <= 1)):
            raise ValueError(f"target must be an accuracy in [0, 1], got {self.target!r}")
        if self.rule == "target" and self.target is None:
            raise ValueError("the target stop rule needs a target (e.g. 0.99)")
        if isinstance(self.gain, bool) or not (isinstance(self.gain, (int, float)) and 0 < self.gain <= 1):
            raise ValueError(f"plateau gain must be in (0, 1], got {self.gain!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"plateau window must be an int >= 1, got {self.window!r}")
        return self


def series(rows: Sequence[Mapping[str, Any]], bucket: str, metric: CurveMetric = "exact") -> list[tuple[int, float]]:
    """(step, metric) of `bucket`'s rows in step order (one per step: the last row of a step wins)."""
    by_step = {int(r["step"]): float(r[metric]) for r in rows if r.get("bucket") == bucket}
    return sorted(by_step.items())


def first_reaching(values: Sequence[float], target: float) -> int | None:
    """Index of the first value >= `target`, or None."""
    return next((i for i, v in enumerate(values) if v >= target), None)


def plateau_index(values: Sequence[float], gain: float = PLATEAU_GAIN, window: int = PLATEAU_WINDOW) -> int | None:
    """Index of the first evaluation i (i >= window) such that none of the last `window` values (i-window+1..i)
    beats the best value before them by `gain` or more; None while every window holds such a gain."""
    for i in range(window, len(values)):
        best_before = max(values[: i - window + 1])
        if max(values[i - window + 1 : i + 1]) < best_before + gain:
            return i
    return None


def steps_to_target(rows: Sequence[Mapping[str, Any]], bucket: str, target: float,
                    metric: CurveMetric = "exact") -> int | None:
    """The first step at which `bucket`'s `metric` reached `target`, or None."""
    points = series(rows, bucket, metric)
    i = first_reaching([v for _, v in points], target)
    return None if i is None else points[i][0]


def stop_point(rows: Sequence[Mapping[str, Any]], stop: Stop) -> tuple[int, StopRule] | None:
    """(step, rule) of the first evaluation after step 0 at which `stop` fires on `rows`, or None (also for rule
    "none"): a run trains at least until its first evaluation, so a model that meets the target before training
    still trains (its steps-to-target is 0). Only the rows up to that step decide it, so training that checks after
    every evaluation stops exactly there."""
    points = series(rows, stop.bucket, stop.metric)
    values = [v for _, v in points]
    if stop.rule == "target":
        start = 1 if points and points[0][0] == 0 else 0
        i = first_reaching(values[start:], stop.target)
        i = None if i is None else i + start
    elif stop.rule == "plateau":
        i = plateau_index(values, stop.gain, stop.window)
    else:
        i = None
    return None if i is None else (points[i][0], stop.rule)


def curve_cost(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """Seconds spent on the curves per second of training (their `eval_s` over the `train_s` of each evaluation
    step, counted once per step); None before any training time."""
    evals = sum(float(r["eval_s"]) for r in rows)
    trained = sum({int(r["step"]): float(r["train_s"]) for r in rows}.values())
    return evals / trained if trained > 0 else None


def auto_every(eval_tokens: int, step_tokens: int, total: int, budget: float = CURVE_BUDGET,
               eval_cost: float = EVAL_COST) -> int:
    """The default curve interval for a run of `total` steps: the smallest K for which the evaluations at step 0, every
    K steps and at the end cost at most `budget` of the training time. One evaluation of `eval_tokens` held-out tokens
    costs about c = `eval_cost * eval_tokens / step_tokens` training steps of `step_tokens` tokens, so m =
    floor(budget * total / c) evaluations fit, K = ceil(total / (m - 1)). When fewer than two fit, K = total: the
    curves still hold the start and the end (and cost more than `budget`, which their rows show)."""
    if eval_tokens <= 0 or step_tokens <= 0 or total <= 0:
        raise ValueError(f"token counts and steps must be > 0, got {eval_tokens} held-out tokens, {step_tokens} "
                         f"per step, {total} steps")
    fits = math.floor(budget * total * step_tokens / (eval_cost * eval_tokens))
    return total if fits < 2 else math.ceil(total / (fits - 1))


def parse_curve_sets(text: str | None) -> list[str | Bucket]:
    """`"id,ood,21-30"` -> ["id", "ood", (21, 30)]: named evaluation sets (train, id, ood) and length ranges;
    ValueError on anything else, a repeated name, or overlapping ranges."""
    if text is None or not text.strip():
        raise ValueError(f"--curve-buckets: expected a comma-separated list of {', '.join(NAMED_SETS)} or length "
                         f"ranges like 11-20, got {text!r}")
    items = [x.strip() for x in text.split(",") if x.strip()]
    names = [x for x in items if x in NAMED_SETS]
    if len(set(names)) != len(names):
        raise ValueError(f"--curve-buckets: {text!r} names a set twice")
    ranges = [x for x in items if x not in NAMED_SETS]
    try:
        parsed = iter(parse_buckets(",".join(ranges)) if ranges else [])
    except ValueError as e:
        raise ValueError(str(e).replace("--buckets", "--curve-buckets")) from None
    return [x if x in NAMED_SETS else next(parsed) for x in items]


def set_name(item: str | Bucket) -> str:
    """The curve-set name of a parsed item: `id`, or `length 11-20` for a range."""
    return item if isinstance(item, str) else bucket_name(item)


def stop_set(text: str | None) -> str:
    """The curve-set name of a `--stop-bucket` value (`id`, or `11-20` -> `length 11-20`); `id` when None."""
    items = parse_curve_sets("id" if text is None else text)
    if len(items) != 1:
        raise ValueError(f"--stop-bucket names one curve set, got {text!r}")
    return set_name(items[0])


def curve_sets(tasks: Mapping[str, Task], items: Sequence[str | Bucket], n: int, seed: int) -> dict[str, list[Sample]]:
    """{name: n held-out samples} for each item: a named task of `tasks` (train, id, ood) or a length range of
    `tasks["train"]`, drawn from seed `seed + CURVE_SEED`. ValueError for a name `tasks` does not hold."""
    out = {}
    for item in items:
        if isinstance(item, str) and item not in tasks:
            raise ValueError(f"--curve-buckets: no {item!r} set here (sets: {', '.join(tasks)})")
        task = tasks[item] if isinstance(item, str) else bucket_task(tasks["train"], item)
        out[set_name(item)] = task.generate(n, seed=seed + CURVE_SEED)
    return out
