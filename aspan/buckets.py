"""Length buckets: evaluation sets of held-out samples per range of lengths (training lengths, fine-tuned, beyond).

    buckets = parse_buckets("1-10,11-20,21-30")          # [(1, 10), (11, 20), (21, 30)]
    sets = bucket_sets(tasks.preset("reversal", "ood"), buckets, n=200, seed=0)
    # {"length 1-10": [...], "length 11-20": [...], "length 21-30": [...]}

Each bucket is its own task (the task's length parameter, `Task.length_param`, set to the bucket's range), so every
bucket gets `n` samples of its own instead of whatever share of one mixed set happens to fall in it. Training draws
its batches from seeds with bit 62 set (`training.batch_seed`), so these sets never repeat a training batch.
"""
from __future__ import annotations

from itertools import islice
from typing import Collection, Sequence

from .tasks.base import Sample, Task
from .tasks.split import unseen

Bucket = tuple[int, int]  # inclusive (lo, hi) range of lengths


def parse_buckets(text: str | Sequence[Bucket] | None) -> list[Bucket]:
    """`"1-10,11-20,31-50"` (or `"7"` for one length) -> [(1, 10), (11, 20), (31, 50)]; ValueError on a bad or
    overlapping item. A list of pairs is checked the same way."""
    if text is None:
        return []
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[Bucket] = []
    for item in items:
        if isinstance(item, str):
            lo, dash, hi = item.strip().partition("-")
            try:
                pair = (int(lo), int(hi) if dash else int(lo))
            except ValueError:
                raise ValueError(f"--buckets: expected ranges like 1-10,11-20, got {item.strip()!r}") from None
        else:
            pair = (int(item[0]), int(item[1]))
        if not 1 <= pair[0] <= pair[1]:
            raise ValueError(f"--buckets: a range needs 1 <= lo <= hi, got {pair[0]}-{pair[1]}")
        for other in out:
            if pair[0] <= other[1] and other[0] <= pair[1]:
                raise ValueError(f"--buckets: {pair[0]}-{pair[1]} overlaps {other[0]}-{other[1]}")
        out.append(pair)
    if not out:
        raise ValueError("--buckets: no ranges given")
    return out


def bucket_name(bucket: Bucket) -> str:
    """The evaluation-set name of a bucket: `length 11-20`."""
    return f"length {bucket[0]}-{bucket[1]}"


def bucket_of(length: int, buckets: Sequence[Bucket]) -> Bucket | None:
    """The bucket holding `length`, or None."""
    return next((b for b in buckets if b[0] <= length <= b[1]), None)


def bucket_task(task: Task, bucket: Bucket) -> Task:
    """`task` with its length parameter set to `bucket` (every other parameter kept)."""
    if not task.length_is_target:
        raise ValueError(f"length buckets need a task whose length parameter is its target's length; {task.name} "
                         f"has {', '.join(task.params()) or 'none'}")
    return type(task)(**{**task.params(), task.length_param: bucket})


def bucket_sets(task: Task, buckets: Sequence[Bucket], n: int, seed: int, exclude: Collection[str] = (),
                names: tuple[str, str] = ("set", "the sets drawn before")) -> dict[str, list[Sample]]:
    """{bucket name: n samples of `task` with lengths in that bucket}, generated from `seed` (per bucket). With
    `exclude` (texts of other sets), each bucket's draw skips the samples whose text is in it (`tasks.split.unseen`),
    so the sets share none with those by construction; a bucket whose seed-only draw held none of them is that draw,
    sample for sample. `names`: (what these sets are, what `exclude` holds) for the error of a bucket with too few
    distinct samples for both."""
    if not exclude:
        return {bucket_name(b): bucket_task(task, b).generate(n, seed=seed) for b in buckets}
    return {bucket_name(b): list(islice(unseen(bucket_task(task, b).stream(seed), exclude,
                                               f"the {names[0]} of {bucket_name(b)}", names[1]), n))
            for b in buckets}


def bucket_table(result, names: Sequence[str]):
    """Per bucket (in first-seen order): n, exact, partial and mean AttnScores of an `EvalResult` whose sample i
    belongs to bucket `names[i]` (a pandas DataFrame)."""
    from .evaluation import SCORE_COLUMNS

    s = result.samples.copy()
    s["bucket"] = [names[i] for i in s.sample_id]
    order = list(dict.fromkeys(names))
    agg = s.groupby("bucket", sort=False).agg(
        n=("exact", "size"), exact=("exact", "mean"), partial=("partial", "mean"),
        **{c: (c, "mean") for c in SCORE_COLUMNS if c in s},  # AttnScores by source and convention
    )
    return agg.reindex([b for b in order if b in agg.index]).reset_index()
