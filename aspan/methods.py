"""Attention edit methods: one `Rule` each in `RULES`, the only place that knows a method by name.

A method is a kernel (a hook factory `(heads, refs, *, delta, model, rows, gate_below, **params) -> [(hook_name,
fn)]` on `hook_pattern` or `hook_attn_scores`, e.g. in `hooks/<name>.py`) plus its rule here: which `Edit` fields it
takes and under which keyword its kernel takes each, its default strength and the check of one, its label. Kernels
and checks are named "module:function" and imported on first use, so this module loads no torch: the command line's
`--method` choices, the sweep config's check, the engine's points, the grid's axes and the search's atoms all read
`RULES` (`aspan.experiments.edit.Edit` validates, stores, describes and applies an edit from its rule).

- "reinforce": additive reinforcement (Spiegel et al. 2025, Appendix F), A' = A + C*M where A > tau, rows optionally
  renormalised. Strength C >= 0 (default 1), threshold tau and renormalisation.
- "patch": each edited row replaced by the uniform distribution over its references (the causal upper bound of an
  attention edit). No strength, threshold or renormalisation.
- "steer": PASTA (Zhang et al. 2023), log alpha added to the scores outside the references. Strength alpha in
  (0, 1] (PASTA's default 0.01).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, Callable, Mapping

PARAMS = ("strength", "threshold", "renormalize")  # the `Edit` fields a method may take besides delta and the gates
OPTIONS = PARAMS[1:]  # ... of which those other than the strength
OPTION_UNSET: dict[str, Any] = {"threshold": None, "renormalize": False}  # an option's value where a method lacks it


def resolve(name: str) -> Callable:
    """The function a rule names, "module:function" (e.g. "hooks.steer:steer"), imported now."""
    module, _, attr = name.partition(":")
    return getattr(import_module(module), attr)


@dataclass(frozen=True)
class Rule:
    """What one method takes and which kernel applies it (see the module docstring)."""

    kernel: str  # "module:function" of the hook factory
    describe: Callable[[Any], str]  # the edit in words, without offset and gates
    params: Mapping[str, str] = field(default_factory=dict)  # each `Edit` field it takes (PARAMS) -> kernel keyword
    strength: float | None = None  # the default strength, where it takes one
    check_strength: str | None = None  # "module:function": the kernel's own check of a strength (ValueError)

    def __post_init__(self) -> None:
        if not all(self.kernel.partition(":")) or (self.check_strength and not all(self.check_strength.partition(":"))):
            raise ValueError(f"a rule names its kernel and strength check as 'module:function', got {self.kernel!r}")
        if not set(self.params) <= set(PARAMS):
            raise ValueError(f"a rule's params are among {', '.join(PARAMS)}, got {sorted(self.params)}")
        if self.takes_strength != (self.strength is not None):
            raise ValueError("a rule that takes a strength gives its default strength, and only such a rule")

    @property
    def takes_strength(self) -> bool:
        """Whether the method has a strength parameter."""
        return "strength" in self.params

    @property
    def options(self) -> tuple[str, ...]:
        """Which of OPTIONS (threshold, renormalize) it takes."""
        return tuple(name for name in OPTIONS if name in self.params)

    def check(self, strength: float) -> None:
        """The kernel's own check of a strength (a finite number already), if the rule names one."""
        if self.check_strength is not None:
            resolve(self.check_strength)(strength)

    def hooks(self, edit: Any, refs: Any, model: Any = None, **gates: Any) -> list:
        """The kernel's hooks for `edit` on its heads with references `refs` (before the shift by `edit.delta`) and
        the gates (`rows`, `gate_below`)."""
        params = {keyword: getattr(edit, name) for name, keyword in self.params.items()}
        return resolve(self.kernel)(list(edit.heads), refs, delta=edit.delta, model=model, **gates, **params)


def _reinforce(e: Any) -> str:
    tau = "" if e.threshold is None else f" tau={e.threshold:g}"
    return f"reinforce C={e.strength:g}{tau}{' renormalised' if e.renormalize else ''}"


RULES: dict[str, Rule] = {
    "reinforce": Rule("hooks.reinforce:reinforce", _reinforce,
                      {"strength": "strength", "threshold": "threshold", "renormalize": "renormalize"},
                      1.0, "hooks:check_strength"),
    "patch": Rule("hooks.patch:patch_pattern", lambda e: "patch"),
    "steer": Rule("hooks.steer:steer", lambda e: f"steer alpha={e.strength:g}", {"strength": "alpha"},
                  0.01, "hooks.steer:check_alpha"),
}


def check_method(name: object, extra: tuple[str, ...] = (), kind: str = "edit method") -> str:
    """`name` if it is a method of `RULES` (or one of `extra`), else a one-line ValueError naming the `kind` of
    value and listing the choices."""
    if not isinstance(name, str) or (name not in RULES and name not in extra):
        raise ValueError(f"unknown {kind} {name!r}; choose one of {', '.join((*RULES, *extra))}")
    return name  # type: ignore[return-value]
