"""Option sets shared across aspan, each a `Literal` alias defined once and its tuple of values.

Signatures use the alias (`mode: Mode = "teacher"`); argparse `choices=` and run-time checks use the tuple.
"""
from __future__ import annotations

import math
import numbers
from typing import Literal, get_args

# The selection rule's default budget on the drop of in-distribution exact accuracy (a fraction: 0.01 is 1 percentage
# point), for the sweep, the demo and the pretrained run alike.
ID_BUDGET = 0.01

# How an evaluation produces predictions: teacher forcing (the paper's) or greedy KV-cached generation.
Mode = Literal["teacher", "generate"]
MODES: tuple[Mode, ...] = get_args(Mode)

# AttnScore convention (Spiegel et al. 2025, Appendix B): "sample" divides the mass on the references by the mass
# on the sample's own columns (BOS, instruction and few-shot columns left out, as the public code does; the paper's
# and Table 3's default), "raw" by the whole row.
Convention = Literal["sample", "raw"]
CONVENTIONS: tuple[Convention, ...] = get_args(Convention)

# Head-ranking column: attention on the references summed over target rows (the paper's score, Spiegel et al.
# 2025, §5.2) or its mean per target row (a fraction, not biased towards long samples).
RankKey = Literal["score_sum", "score_row"]
RANK_KEYS: tuple[RankKey, ...] = get_args(RankKey)

# Line directions of attention bias calibration (Duan & Shi 2023): q - k constant, q + k constant, k constant,
# and "aligned": the key's index inside its segment minus the target index (the decoder-only analogue of the
# paper's cross-attention diagonal: digit i of each operand for sum digit i, at any length).
Direction = Literal["diagonal", "anti", "vertical", "aligned"]
DIRECTIONS: tuple[Direction, ...] = get_args(Direction)

# Rows a bias covers: target rows only (prompt rows free) or prompt rows too (with their own lines).
Rows = Literal["target", "all"]
ROWS: tuple[Rows, ...] = get_args(Rows)

# The end-of-sequence row of an attention edit. Its reference set is empty (nothing in the input fixes it position by
# position), so an edit on the references leaves it alone ("none"). "extrapolate" gives it, as an edit target only,
# the reference map continued one row: the last target row's references moved by the step between the last target
# rows' references, where that step is regular (`hooks.masks.extrapolate_mask`); scores never use it.
EosRefs = Literal["none", "extrapolate"]
EOS_REFS: tuple[EosRefs, ...] = get_args(EosRefs)

# What causal head profiling measures on the selection set: mean target log-probability, per-token accuracy
# (the paper's Eq. 1, teacher-forced) or exact accuracy.
ProfileMetric = Literal["logprob", "partial", "exact"]
PROFILE_METRICS: tuple[ProfileMetric, ...] = get_args(ProfileMetric)

# Head ranking of `aspan rank --by`: the paper's attention share, or the causal effect of an edit / its estimate.
RankBy = Literal["score_sum", "score_row", "effect", "estimate"]
RANK_BY: tuple[RankBy, ...] = get_args(RankBy)


# Which TransformerLens model class runs the network: HookedTransformer (TransformerLens 3) or TransformerBridge
# (TransformerLens 3.9 and 4, wrapping the Hugging Face model; hook names in compatibility mode are the same).
Backend = Literal["hooked", "bridge"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)

# The precision a model is loaded in (`aspan.models.load(dtype=...)`, `--dtype`): float32 (the default), or half the
# memory in bfloat16 (how the papers' 1B models are usually run) or float16.
ModelDtype = Literal["float32", "bfloat16", "float16"]
MODEL_DTYPES: tuple[ModelDtype, ...] = get_args(ModelDtype)


def dtype_name(dtype: object) -> ModelDtype:
    """The name of a load precision given as a name or a `torch.dtype` (None: float32); ValueError otherwise."""
    name = "float32" if dtype is None else str(dtype).removeprefix("torch.")
    return check_option("dtype", name, MODEL_DTYPES)


# When training stops before its step cap (`aspan.curves`): never, when a named curve set reaches a target, or when
# it has stopped improving (no new best by at least the plateau gain over the last few evaluations).
StopRule = Literal["none", "target", "plateau"]
STOP_RULES: tuple[StopRule, ...] = get_args(StopRule)

# The accuracy a stop rule watches on its curve set: exact (every token and EOS right) or per-token accuracy.
CurveMetric = Literal["exact", "partial"]
CURVE_METRICS: tuple[CurveMetric, ...] = get_args(CurveMetric)


def check_option(name: str, value: object, choices: tuple[str, ...]) -> str:
    """`value` if it is one of `choices`, else a one-line ValueError naming the option and the choices."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value  # type: ignore[return-value]


def check_real(name: str, value: object, low: float, high: float | None = None, *, open_low: bool = False,
               open_high: bool = False) -> float:
    """`value` if it is a finite real number (not a bool) in the interval from `low` to `high` (None: no upper
    bound; `open_low`/`open_high` exclude the ends), else a one-line ValueError naming the setting and the range."""
    if high is None:
        where = f"{'>' if open_low else '>='} {low:g}"
    else:
        where = f"in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    try:
        ok = ok and math.isfinite(value)
    except OverflowError:  # an integer beyond any float
        ok = False
    if ok:
        ok = (value > low if open_low else value >= low) and (
            high is None or (value < high if open_high else value <= high))
    if not ok:
        raise ValueError(f"{name} must be a finite number {where}, got {value!r}")
    return value  # type: ignore[return-value]


def check_count(name: str, value: object, low: int, high: int | None = None) -> int:
    """`value` if it is an integer (not a bool) >= `low` (and < `high` where given), else a one-line ValueError
    naming the setting."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low or (
            high is not None and value >= high):
        where = f">= {low}" + (f" and < {high}" if high is not None else "")
        raise ValueError(f"{name} must be an integer {where}, got {value!r}")
    return value  # type: ignore[return-value]


def comma_list(text: str, kind: type) -> tuple:
    """A comma-separated flag value as a tuple of `kind` (items stripped, empty ones skipped); ValueError naming the
    text."""
    try:
        return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        words = {int: "integers", float: "numbers"}.get(kind, kind.__name__)
        raise ValueError(f"expected a comma-separated list of {words}, got {text!r}") from None

# Where a command's work runs: this process, or a Slurm job array through submitit (`aspan.applications.launch`).
Launcher = Literal["local", "slurm"]
LAUNCHERS: tuple[Launcher, ...] = get_args(Launcher)
