"""The likely cause of a failure in words, each sentence from one rule over the anatomy's rows (and nothing when no
rule fires: a sentence is a reading of the rows, never a guess).

The rules, in the order their sentences come (`RULES`); "wrong tokens" are the output tokens predicted wrong,
"the heads" the selected heads, `δ` the offset they read at (their references shifted by δ), a head's *drift* its
offset from the nearest reference minus δ, and a token's answer *copies* a head's top position `p` when the
predicted token is the text's token at `p - δ` (the one a head that reads at `ref+δ` fetches from `p`) and is
wrong:

- `eos_not_stopped`: every target character right, the EOS row wrong: the model does not stop.
- `stops_early`: characters predicted as EOS; and where at least half of them have every head's top position at
  the start of the sequence (text position ≤ max(δ-1, 0), or a token before the text), it says so.
- `drift`: per head, over the wrong tokens not predicted as EOS. When one non-zero drift holds at the first of
  them and at ≥ 2/3 of them (at least 2): "from token j on, the head's top position drifts d right/left of its
  reference", and "the answer copies that position" where it does at ≥ half of those tokens. Otherwise, the wrong
  tokens where the head is off its reference and the answer copies its top position, when there are any.
- `leaves`: the heads' mean mass on the references is ≥ `MASS_ON` on the (right) tokens before the first error
  and at most half of that on the wrong tokens.
- `attention_ok`: wrong tokens (not predicted as EOS) at which every head is on its reference (drift 0, mass
  ≥ `MASS_ON`): the error there does not come from where these heads read.
- With an edit (`edit_causes`): which wrong tokens it fixes (and at how many of them the heads' top positions are on
  their references after it), which right ones it breaks; then the rules above on the rows after the edit.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..evaluation import EOS_CHAR

MASS_ON = 0.5  # a head whose mass on its (shifted) references is at least this reads them


@dataclass(frozen=True)
class Rows:
    """What the rules read: one stage (before or after an edit) of an anatomy, as plain records (the rules look up
    single values, which pandas makes slow).

    `tokens`: {j: {"expected", "predicted", "correct", "eos", "refs"}} in output order; `heads`: {name: {j: {"mass",
    "top", "offset"}}} for the selected heads."""

    tokens: dict[int, dict[str, Any]]
    heads: dict[str, dict[int, dict[str, float]]]
    text: str
    delta: int
    names: tuple[str, ...]


def rows_of(anatomy: Any, after: bool = False) -> Rows:
    """The rules' view of an `Anatomy`, before its edit or `after` it."""
    s = "_after" if after else ""
    t = anatomy.tokens
    cols = {"expected": t.expected, "predicted": t[f"predicted{s}"], "correct": t[f"correct{s}"], "eos": t.eos,
            "refs": t.refs}
    values = {k: v.tolist() for k, v in cols.items()}
    tokens = {j: {k: values[k][i] for k in cols} for i, j in enumerate(t.index.tolist())}
    h = anatomy.heads[anatomy.heads.selected]
    heads: dict[str, dict[int, dict[str, float]]] = {}
    for j, name, mass, top, offset in zip(h.j.tolist(), h.name.tolist(), h[f"mass{s}"].tolist(),
                                          h[f"top{s}"].tolist(), h[f"offset{s}"].tolist()):
        heads.setdefault(name, {})[j] = {"mass": mass, "top": top, "offset": offset}
    return Rows(tokens, heads, anatomy.sample.text, anatomy.delta, tuple(anatomy.names))


# ----------------------------------------------------------------------------------------------- words
def span(js: Sequence[int]) -> str:
    """Token indices in words: [3, 5, 6, 7] -> '3, 5-7'."""
    js = sorted(int(j) for j in js)
    runs: list[list[int]] = []
    for j in js:
        if runs and j == runs[-1][-1] + 1:
            runs[-1].append(j)
        else:
            runs.append([j])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def tokens_word(js: Sequence[int]) -> str:
    """'token 3' or 'tokens 3, 5-7'."""
    return f"token{'s' if len(js) > 1 else ''} {span(js)}"


def ref(delta: int) -> str:
    """0 -> 'ref', 2 -> 'ref+2'."""
    return f"ref{delta:+d}" if delta else "ref"


def heads_word(names: Sequence[str]) -> str:
    """'head L1H7' or 'heads L1H7 and L1H0'."""
    names = list(names)
    if len(names) == 1:
        return f"head {names[0]}"
    return f"heads {', '.join(names[:-1])} and {names[-1]}"


# ----------------------------------------------------------------------------------------------- helpers
def _wrong(rows: Rows, eos_predicted: bool | None = None) -> list[int]:
    """The wrong output tokens (with `eos_predicted` True/False: only those predicted / not predicted as EOS)."""
    return [j for j, t in rows.tokens.items() if not t["correct"]
            and (eos_predicted is None or (t["predicted"] == EOS_CHAR) == eos_predicted)]


def _with_refs(rows: Rows, js: Sequence[int]) -> list[int]:
    return [j for j in js if len(rows.tokens[j]["refs"])]


def _drift(rows: Rows, name: str, j: int) -> float:
    """The head's offset at token j minus δ (NaN where the token has no references)."""
    return rows.heads[name][j]["offset"] - rows.delta


def _char(text: str, p: float) -> str | None:
    return text[int(p)] if p == p and 0 <= int(p) < len(text) else None


def _copies(rows: Rows, name: str, j: int) -> bool:
    """Whether token j's (wrong) answer is the text's token at the head's top position minus δ."""
    t = rows.tokens[j]
    return _char(rows.text, rows.heads[name][j]["top"] - rows.delta) == t["predicted"] != t["expected"]


# ----------------------------------------------------------------------------------------------- rules
def eos_not_stopped(rows: Rows) -> list[str]:
    """Every target character right and the EOS row wrong."""
    eos = [j for j, t in rows.tokens.items() if t["eos"]]
    if len(eos) != 1 or rows.tokens[eos[0]]["correct"] or _wrong(rows) != eos:
        return []
    return [f"the answer is right up to the EOS row (token {eos[0]}), where the model does not stop: it "
            f"predicts {rows.tokens[eos[0]]['predicted']!r}"]


def stops_early(rows: Rows) -> list[str]:
    """Target characters predicted as EOS; where the heads point at the start of the sequence, that too."""
    js = [j for j in _wrong(rows, eos_predicted=True) if not rows.tokens[j]["eos"]]
    if not js:
        return []
    text = f"the model stops early: at {tokens_word(js)} it predicts EOS where a character is expected"
    start = max(rows.delta - 1, 0)
    if rows.names:
        at_start = [j for j in js if all(rows.heads[n][j]["top"] <= start for n in rows.names)]
        if len(at_start) >= len(js) / 2:
            where = "there" if len(js) == 1 else f"at {len(at_start)} of these {len(js)} tokens"
            text += (f"; {where} {heads_word(rows.names)} attend{'s' * (len(rows.names) == 1)} to the start of the "
                     f"sequence (position {start} or before)")
    return [text]


def _mode(values: Sequence[float]) -> float:
    """The most common value (the one nearest 0, then the positive one, on a tie)."""
    counts = Counter(values)
    return min(counts, key=lambda v: (-counts[v], abs(v), -v))


def drift(rows: Rows) -> list[str]:
    """Per head: a drift that holds from the first wrong token on (and whether the answer copies it), or the wrong
    tokens where the answer copies the head's off-reference top position."""
    out = []
    wrong = _with_refs(rows, _wrong(rows, eos_predicted=False))
    for name in rows.names if wrong else ():
        d = {j: _drift(rows, name, j) for j in wrong}
        off = [j for j in wrong if d[j] == d[j] and d[j] != 0]
        if not off:
            continue
        common = _mode([d[j] for j in off])
        same = [j for j in wrong if d[j] == common]
        copied = [j for j in same if _copies(rows, name, j)]
        side = "right" if common > 0 else "left"
        if same[0] == wrong[0] and len(same) >= max(2, math.ceil(2 * len(wrong) / 3)):
            text = (f"from token {wrong[0]} on, head {name}'s top position drifts {abs(common):g} {side} of its "
                    f"reference ({ref(rows.delta + int(common))} instead of {ref(rows.delta)}) at {len(same)} of the "
                    f"{len(wrong)} wrong tokens")
            if len(copied) >= len(same) / 2:
                text += f", and the answer copies that position at {len(copied)} of them"
            out.append(text)
            continue
        copies = [j for j in off if _copies(rows, name, j)]
        if copies:
            shifts = ", ".join(f"{d[j]:+g}" for j in copies)
            out.append(f"at {tokens_word(copies)}, head {name}'s top position is off its reference ({shifts} from "
                       f"{ref(rows.delta)}) and the answer copies that position")
    return out


def leaves(rows: Rows) -> list[str]:
    """The heads' mass on the references: high before the first error, at most half of it on the wrong tokens."""
    wrong = _with_refs(rows, _wrong(rows))
    if not wrong or not rows.names:
        return []
    before = _with_refs(rows, [j for j in rows.tokens if j < wrong[0]])
    m_before, m_wrong = _mean_mass(rows, before), _mean_mass(rows, wrong)
    if not (m_before >= MASS_ON and m_wrong <= m_before / 2):
        return []
    return [f"from token {wrong[0]} on, the attention of {heads_word(rows.names)} leaves the references: mean mass "
            f"on {ref(rows.delta)} {m_before:.2f} on {tokens_word(before)} (right), {m_wrong:.2f} on the "
            f"{len(wrong)} wrong tokens"]


def _mean_mass(rows: Rows, js: Sequence[int]) -> float:
    """The heads' mean mass over tokens `js` (tokens whose shifted references leave the causal part left out)."""
    values = [rows.heads[n][j]["mass"] for n in rows.names for j in js]
    values = [v for v in values if v == v]
    return sum(values) / len(values) if values else float("nan")


def attention_ok(rows: Rows) -> list[str]:
    """Wrong tokens at which every head reads its references: the error is not in where they read."""
    if not rows.names:
        return []
    js = []
    for j in _with_refs(rows, _wrong(rows, eos_predicted=False)):
        if all(_drift(rows, n, j) == 0 and rows.heads[n][j]["mass"] >= MASS_ON for n in rows.names):
            js.append(j)
    if not js:
        return []
    return [f"at {tokens_word(js)} {heads_word(rows.names)} read{'s' * (len(rows.names) == 1)} the references "
            f"(top position at {ref(rows.delta)}, mass >= {MASS_ON:g}) and the answer is still wrong: the error "
            f"there does not come from where {'this head reads' if len(rows.names) == 1 else 'these heads read'}"]


RULES: tuple[Callable[[Rows], list[str]], ...] = (eos_not_stopped, stops_early, drift, leaves, attention_ok)


def causes(rows: Rows) -> list[str]:
    """Every rule's sentences on `rows`, in the order of `RULES` (empty when none fires)."""
    return [sentence for rule in RULES for sentence in rule(rows)]


def edit_causes(anatomy: Any) -> list[str]:
    """What an anatomy's edit fixed and broke, then the rules on the rows after it (each prefixed "after the
    edit, ")."""
    before, after = rows_of(anatomy), rows_of(anatomy, after=True)
    was, now = set(_wrong(before)), set(_wrong(after))
    fixed, broken = sorted(was - now), sorted(now - was)
    out = []
    if fixed:
        text = f"the edit fixes {len(fixed)} of the {len(was)} wrong tokens ({span(fixed)})"
        on = [j for j in _with_refs(after, fixed)
              if after.names and all(_drift(after, n, j) == 0 for n in after.names)]
        if on:
            text += f"; at {len(on)} of them the top position of {heads_word(after.names)} is on {ref(after.delta)}"
        out.append(text)
    elif was:
        out.append(f"the edit fixes none of the {len(was)} wrong tokens")
    if broken:
        out.append(f"the edit breaks {tokens_word(broken)}, right before it")
    return out + [f"after the edit, {s}" for s in causes(after)]
