"""One attention edit: the heads it edits, the method, its strength, key offset, failure gates and end-of-sequence
treatment, validated with the method's own rule, as forward hooks through the method's kernel, and as the settings
of a grid point.

The methods and what each takes are the rules of `aspan.methods.RULES` (a new method is a kernel and a rule there);
nothing here edits a pattern of its own or names a method.

Every method takes `delta` (the references of row q are the columns k + delta), the failure gates `beyond` (edit
only query rows > beyond; see `beyond_row` for the one definition of "past the longest training sample") and
`below` (edit a head's row only where its attention on the references is below the value), and `eos`
("extrapolate": the end-of-sequence row is edited too, on the reference map continued one row).

`heads` is a tuple of (layer, head), and `offsets`, when given, one key offset per head (each head's references
are the columns k + its offset; equal offsets are `delta` itself): the engine resolves a point's symbolic selection
(top-k of a ranking) to it (`Engine.heads`), profiling puts a template edit (no heads) on one head at a time
(`Edit.on`), and a combined intervention (the causal search's) is a list of edits of one head each, its "atoms".

A grid point of the experiment engine stores an edit as flat settings (`to_dict` / `from_dict`): method, strength,
threshold, renormalize, delta, and, only when set, gate ("beyond" or "below:TAU") and eos; the point names its heads
itself (its `heads` selection), so the edit's heads stay out of these settings and every key stays. The keys of every
committed results row are read as they are; patch rows of old grids carried the grid's strength, threshold and
renormalisation, which patch never used: `from_dict` reads them and drops them.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

import hooks

from ..methods import OPTION_UNSET, OPTIONS, RULES, check_method
from ..options import EOS_REFS, EosRefs

Head = tuple[int, int]
HookList = list[tuple[str, Callable]]


def beyond_row(offset: int, longest: int, has_eos: bool = True) -> int:
    """The last query row an ID sample trains: an edit gated "beyond" touches only rows after it.

    A training sequence of the longest ID text occupies positions 0 ... offset + longest - 1 + has_eos (prefix,
    text, EOS). Its last position predicts nothing (no loss is taken there), and it is the row that predicts the
    first token past the longest training sample, i.e. the first out-of-distribution position. So the first row
    gated "beyond" is that last position, offset + longest - 1 + has_eos, and the value returned (edits touch rows
    > it) is one less. Every ID prediction is read from an earlier row, so ID samples are untouched by
    construction, and the row predicting the first OOD token is edited."""
    return offset + longest - 2 + bool(has_eos)


def parse_gate(spec: str | None) -> tuple[str | None, float | None]:
    """A failure gate: None / "none" (every row with references), "beyond" (only query rows past the longest ID
    sample: `beyond_row`) or "below:TAU" (a head's row only where that head's own attention on the shifted
    references is below TAU). Returns (kind, tau)."""
    if spec is None or spec == "none":
        return None, None
    if spec == "beyond":
        return "beyond", None
    kind, _, tau = str(spec).partition(":")
    try:
        value = float(tau)
    except ValueError:
        value = float("nan")
    if kind != "below" or not 0 < value <= 1:
        raise ValueError(f"gate must be 'none', 'beyond' or 'below:TAU' with 0 < TAU <= 1, got {spec!r}")
    return "below", value


def _number(value: Any, name: str) -> None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok:
        raise ValueError(f"{name} must be a finite number, got {value!r}")


@dataclass(frozen=True)
class Edit:
    """One attention edit, validated at construction by its method's rules (see the module docstring)."""

    method: str = "reinforce"  # a method of `aspan.methods.RULES`
    delta: int = 0  # key offset: the references of row q are the columns k + delta (clipped to the causal part)
    strength: float | None = None  # reinforce: C >= 0 (default 1); steer: alpha in (0, 1] (default 0.01); patch: none
    renormalize: bool = False  # reinforce only: edited rows renormalised to sum 1
    beyond: int | None = None  # gate: edit only query positions > beyond (None: every row)
    below: float | None = None  # gate: edit a head's row only where its attention on the references < below
    eos: EosRefs = "none"  # "extrapolate": the EOS row is edited too, on the reference map continued one row
    threshold: float | None = None  # reinforce only: add C only where A > threshold
    heads: tuple[Head, ...] = ()  # the (layer, head) pairs it edits; () for a template not yet put on heads
    offsets: tuple[int, ...] = ()  # per-head key offsets, one per head of `heads` (empty: every head at `delta`)

    def __post_init__(self) -> None:
        object.__setattr__(self, "heads", _heads(self.heads))
        self._check_offsets()
        check_method(self.method)
        if self.strength is None:
            object.__setattr__(self, "strength", RULES[self.method].strength)
        self._check_method()
        if isinstance(self.delta, bool) or not isinstance(self.delta, numbers.Integral):
            raise ValueError(f"delta must be an integer key offset, got {self.delta!r}")
        if type(self.renormalize).__name__ == "bool_":  # numpy's (a table's column): a bool
            object.__setattr__(self, "renormalize", bool(self.renormalize))
        if not isinstance(self.renormalize, bool):  # a truthy "no" would renormalise
            raise ValueError(f"renormalize must be true or false, got {self.renormalize!r}")
        if self.beyond is not None and (isinstance(self.beyond, bool) or not isinstance(self.beyond, numbers.Integral)
                                        or self.beyond < 0):
            raise ValueError(f"beyond must be a position >= 0, got {self.beyond!r}")
        if self.below is not None:
            _number(self.below, "below")
            if not 0 < self.below <= 1:
                raise ValueError(f"below must be an attention mass in (0, 1], got {self.below}")
        if self.eos not in EOS_REFS:
            raise ValueError(f"eos must be one of {', '.join(map(repr, EOS_REFS))}, got {self.eos!r}")

    def _check_offsets(self) -> None:
        """`offsets`: integers, one per head; equal ones become `delta` (one edit, one spelling)."""
        offsets = tuple(self.offsets)
        if not offsets:
            return
        if len(offsets) != len(self.heads) or any(isinstance(o, bool) or not isinstance(o, numbers.Integral)
                                                  for o in offsets):
            raise ValueError(f"offsets must be one integer per head ({len(self.heads)} heads), got {offsets!r}")
        if len(set(offsets)) == 1:
            object.__setattr__(self, "delta", int(offsets[0]))
            offsets = ()
        object.__setattr__(self, "offsets", tuple(int(o) for o in offsets))

    def head_offsets(self) -> tuple[int, ...]:
        """The key offset of each head of `heads`."""
        return self.offsets or (self.delta,) * len(self.heads)

    def _check_method(self) -> None:
        """The method's own rule (`RULES`): a strength only where it takes one, checked by its kernel's check
        (reinforce C >= 0, steer alpha in (0, 1]); threshold and renormalisation only where it takes them."""
        rule = RULES[self.method]
        for name in OPTIONS:
            if name not in rule.options and getattr(self, name) not in (None, False):
                raise ValueError(f"{self.method} takes no {name}, got {getattr(self, name)!r}")
        if not rule.takes_strength:
            if self.strength is not None:
                raise ValueError(f"{self.method} takes no strength, got {self.strength!r}")
            return
        _number(self.strength, "strength")
        rule.check(self.strength)
        if "threshold" in rule.options:
            hooks.check_threshold(self.threshold)

    # ------------------------------------------------------------------------------------------- as settings
    @property
    def gate(self) -> str | None:
        """The engine's gate spec of this edit: None, "beyond" or "below:TAU"."""
        if self.beyond is not None and self.below is not None:
            raise ValueError("a grid point holds one gate: this edit has both beyond and below")
        return "beyond" if self.beyond is not None else None if self.below is None else f"below:{self.below:g}"

    def to_dict(self) -> dict[str, Any]:
        """The edit's settings in a grid point: method, strength, threshold, renormalize, delta; gate and eos only
        when set (so points without them keep the keys they had before the options existed)."""
        if self.offsets:
            raise ValueError("a grid point's edit has one delta for every head: this edit has per-head offsets "
                             f"{list(self.offsets)}")
        out = {"method": self.method, "strength": self.strength, "threshold": self.threshold,
               "renormalize": self.renormalize, "delta": self.delta}
        if self.gate is not None:
            out["gate"] = self.gate
        if self.eos != "none":
            out["eos"] = self.eos
        return out

    @classmethod
    def from_dict(cls, settings: dict[str, Any], beyond: int | None = None) -> "Edit":
        """The edit of a grid point or results row (`to_dict`'s keys; other keys ignored). A "beyond" gate resolves
        to `beyond` (`beyond_row` of the point's task and tokenizer), which must then be given. Patch rows written
        by old grids carry a strength, threshold and renormalisation patch never used: they are dropped."""
        method = settings.get("method", "reinforce")
        kind, tau = parse_gate(settings.get("gate"))
        if kind == "beyond" and beyond is None:
            raise ValueError("gate 'beyond' needs the last ID row (beyond_row of the point's task and tokenizer)")
        fields = {"method": method, "delta": settings.get("delta", 0), "eos": settings.get("eos", "none"),
                  "beyond": beyond if kind == "beyond" else None, "below": tau}
        rule = RULES.get(method)
        if rule is not None and rule.takes_strength:
            fields["strength"] = settings.get("strength")
        for name in () if rule is None else rule.options:
            fields[name] = settings.get(name, OPTION_UNSET[name])
        return cls(**fields)

    def to_atom(self) -> dict[str, Any]:
        """This edit of one head as an atom of a combined edit (the search's encoding): layer, head, method, delta,
        strength, renormalize, beyond, below, and eos only where set. A patch atom writes strength 1.0, the
        placeholder its encoding always held, so the keys of committed search rows stay the same; threshold is
        written only where set, for that reason."""
        if len(self.heads) != 1:
            raise ValueError(f"an atom edits one head, this edit has {len(self.heads)}: {list(self.heads)}")
        (layer, head), = self.heads  # one head: its offset is `delta` (one offset per head, all equal)
        out = {"layer": layer, "head": head, "method": self.method, "delta": self.delta,
               "strength": 1.0 if self.strength is None else self.strength, "renormalize": self.renormalize,
               "beyond": self.beyond, "below": self.below}
        if self.eos != "none":
            out["eos"] = self.eos
        if self.threshold is not None:
            out["threshold"] = self.threshold
        return out

    @classmethod
    def from_atom(cls, atom: dict[str, Any]) -> "Edit":
        """The inverse of `to_atom`: the edit of the atom's one head."""
        method = atom["method"]
        fields: dict[str, Any] = {"method": method, "delta": int(atom["delta"]), "beyond": atom["beyond"],
                                  "below": atom["below"], "eos": atom.get("eos", "none"),
                                  "heads": ((int(atom["layer"]), int(atom["head"])),)}
        rule = RULES.get(method)
        if rule is not None and rule.takes_strength:
            fields["strength"] = float(atom["strength"])
        for name in () if rule is None else rule.options:
            fields[name] = atom.get(name, OPTION_UNSET[name])
        return cls(**fields)

    def replace(self, **changes: Any) -> "Edit":
        """A copy with `changes`; switching method drops what the new method does not take (and takes its default
        strength unless one is given)."""
        if "method" in changes and changes["method"] != self.method:
            rule = RULES.get(changes["method"])
            dropped = {n: OPTION_UNSET[n] for n in OPTIONS if rule is None or n not in rule.options}
            changes = {"strength": None, **dropped, **changes}
        return dataclasses.replace(self, **changes)

    def on(self, heads: Sequence[Head]) -> "Edit":
        """This edit on `heads` (a list of (layer, head)) instead of its own (per-head offsets do not carry over)."""
        return dataclasses.replace(self, heads=tuple(heads), offsets=())

    # ------------------------------------------------------------------------------------------- as hooks
    def apply(self, pattern: Tensor, mask: Tensor) -> Tensor:
        """The edited pattern [batch, head, q, k] (a new tensor): this method's own kernel in `hooks` run on
        `pattern` as the hook of a layer whose every head is edited (for the attribution estimate's pattern
        difference). `mask` [batch, q, k] holds the references of the rows of `pattern` already shifted by delta (the
        last q of k positions, as under a KV cache). A kernel on the attention scores (steer) runs on log(pattern),
        and the rows it leaves alone are kept exactly."""
        b, n, q, k = pattern.shape
        full = torch.zeros(b, k, k, dtype=torch.bool, device=pattern.device)
        full[:, k - q:] = mask.to(pattern.device)
        rows = None if self.beyond is None else hooks.rows_beyond(full[..., 0], self.beyond + 1)
        # every head of one layer, on `mask`, which holds the edited references already
        if self.offsets:
            raise ValueError("apply edits every head of a layer on one mask: put per-head offsets in edits of one head")
        shifted = dataclasses.replace(self, delta=0, eos="none", heads=tuple((0, h) for h in range(n)))
        (name, hook), = RULES[self.method].hooks(shifted, full, None, rows=rows, gate_below=self.below)
        if name == hooks.pattern_name(0):
            return hook(pattern.clone(), None)
        scores = pattern.log()
        new = hook(scores.clone(), None)
        edited = (new != scores).any(-1, keepdim=True)
        return torch.where(edited, new.softmax(-1), pattern)

    @property
    def label(self) -> str:
        """The edit in words, e.g. 'patch at ref+2 (rows > 21)'."""
        ref = (f"ref+({', '.join(f'{o:+d}' for o in self.offsets)})" if self.offsets
               else f"ref{self.delta:+d}" if self.delta else "ref")
        gates = ([f"rows > {self.beyond}"] if self.beyond is not None else []) + (
            [f"head mass < {self.below:g}"] if self.below is not None else []) + (
            ["EOS row extrapolated"] if self.eos == "extrapolate" else [])
        return f"{RULES[self.method].describe(self)} at {ref}" + (f" ({', '.join(gates)})" if gates else "")

    def refs(self, ref_mask: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """The references this edit acts on (before the shift by delta): `ref_mask` itself, or with `eos`
        "extrapolate" a copy whose end-of-sequence rows carry the reference map continued one row (real tokens
        only, when `attention_mask` is given)."""
        if self.eos == "extrapolate":
            return hooks.extrapolate_mask(ref_mask, attention_mask=attention_mask)
        return ref_mask

    def hooks(self, ref_mask: Tensor, model=None, attention_mask: Tensor | None = None) -> HookList:
        """Forward hooks applying this edit to its heads (teacher forcing or KV-cached generation): the method's
        kernel on `refs(ref_mask)` shifted by delta, with the gates."""
        if not self.heads:
            raise ValueError(f"the edit {self.label!r} has no heads to edit: put it on heads with `on`")
        rows = None if self.beyond is None else hooks.rows_beyond(ref_mask[..., 0], self.beyond + 1)
        gates = {"rows": rows, "gate_below": self.below}
        refs, rule = self.refs(ref_mask, attention_mask), RULES[self.method]
        if not self.offsets:
            return rule.hooks(self, refs, model, **gates)
        by_offset: dict[int, list[Head]] = {}
        for head, offset in zip(self.heads, self.offsets):
            by_offset.setdefault(offset, []).append(head)
        return [hook for offset, heads in by_offset.items()
                for hook in rule.hooks(dataclasses.replace(self, heads=tuple(heads), offsets=(), delta=offset), refs,
                                       model, **gates)]

    def batch_hooks(self, batch, model=None) -> HookList:
        """`hooks` for a `Batch` (its reference mask and attention mask)."""
        return self.hooks(batch.ref_mask, model, getattr(batch, "attention_mask", None))


def _heads(heads: Any) -> tuple[Head, ...]:
    """`heads` as a tuple of (layer, head) pairs of integers >= 0; ValueError naming the first bad one."""
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Sequence):
        raise ValueError(f"heads must be a sequence of (layer, head) pairs, got {heads!r}")
    out = []
    for pair in heads:
        ok = isinstance(pair, Sequence) and len(pair) == 2 and all(
            isinstance(i, numbers.Integral) and not isinstance(i, bool) and i >= 0 for i in pair)
        if not ok:
            raise ValueError(f"heads must be (layer, head) pairs of integers >= 0, got {pair!r}")
        out.append((int(pair[0]), int(pair[1])))
    return tuple(out)


def atom_hooks(atoms: Sequence[Edit], ref_mask: Tensor, model=None, attention_mask: Tensor | None = None) -> HookList:
    """The hooks of every edit of a combined intervention (each edits its own heads; hooks on one layer run in
    order)."""
    return [hook for edit in atoms for hook in edit.hooks(ref_mask, model, attention_mask)]


def _unset(value: Any) -> bool:
    """An option a row leaves unset: None, NaN (a pandas gap) or the tables' "none"."""
    return value is None or value == "none" or (isinstance(value, float) and math.isnan(value))


def setting_of(row: dict[str, Any]) -> dict[str, Any]:
    """The setting a grid point or results row evaluates, the same for every seed and set: mode, head selection and
    the edit (method, strength, threshold, renormalize, delta, gate, eos as `Edit.to_dict` writes them; the atoms of
    a combined edit). Unset options read alike however a row spells them (absent, None, NaN, "none"), and what a
    method does not take is dropped (old patch rows carried the grid's strength). Every figure, table and selection
    that groups or matches rows by setting uses this one definition."""
    fields = {k: (None if _unset(row.get(k)) else row.get(k)) for k in ("method", "strength", "threshold", "gate")}
    fields.update(renormalize=bool(row.get("renormalize", False)), delta=int(row.get("delta", 0)),
                  eos="none" if _unset(row.get("eos")) else row["eos"])
    out = {"mode": row["mode"], "heads": row["heads"]}
    if fields["method"] == "atoms":
        atoms = row["atoms"]
        return {**out, "method": "atoms", "atoms": [Edit.from_atom(atom).to_atom() for atom in atoms]}
    kind = parse_gate(fields["gate"])[0]
    edit = Edit.from_dict(fields, beyond=0 if kind == "beyond" else None)  # the gate's name is the setting
    return {**out, **edit.to_dict(), "gate": fields["gate"] or "none", "eos": edit.eos}


def setting_label(row: dict[str, Any]) -> str:
    """A setting (`setting_of`) in words, e.g. 'reinforce C=1 at ref+2 on top:2', 'patch at ref on list:1.0 (gate
    beyond)', or the atoms of a combined edit."""
    s = setting_of(row)
    if s["method"] == "atoms":
        return "; ".join(f"L{layer}H{head} {edit.label}" for edit in map(Edit.from_atom, s["atoms"])
                         for layer, head in edit.heads)
    gate = s.get("gate", "none")
    label = f"{Edit.from_dict({**s, 'gate': None}).label} on {s['heads']}"
    return label + ("" if gate == "none" else f" (gate {gate})")
