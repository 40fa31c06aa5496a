"""Why did this answer fail: the anatomy of one sample, from one forward with every head read.

    anatomy = explain(model, tokenizer, sample)                 # heads chosen by the ranking
    anatomy.table                                               # one row per output token
    anatomy.causes                                              # the likely cause, in words (may be empty)
    explain(model, tokenizer, sample, fwd_hooks=edit).table     # the same after an edit, side by side

Everything is teacher-forced (the paper's accuracy, Spiegel et al. 2025, Eq. 1): the model sees the right answer
before each output token, so a later error is not a consequence of an earlier one. Positions are text positions
(`sample.text[p]`; -1 and below are the tokens before the text, e.g. BOS), the convention of `Sample.references`.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Unpack

import numpy as np
import pandas as pd
import torch

from ..batching import make_batch, scores_eos
from ..checks import check_samples
from ..evaluation import EOS_CHAR
from ..tasks.base import Sample
from ..tokenization import Tokenizer, require_tokenizer
from ..viz.story import token_strings
from . import causes as rules
from .heads import ExplainOptions, ExplainSettings, Head, Read, choose, edit_hooks, merge_options, read

TOKEN_COLUMNS = ["row", "expected", "refs", "eos", "predicted", "correct", "margin", "first_error"]
HEAD_COLUMNS = ["j", "name", "layer", "head", "selected", "mass", "top", "top_token", "offset"]
STAGED = {"tokens": ["predicted", "correct", "margin", "first_error"], "heads": ["mass", "top", "top_token", "offset"]}


def head_name(head: Head) -> str:
    """(1, 7) -> 'L1H7'."""
    return f"L{head[0]}H{head[1]}"


@dataclass
class Anatomy:
    """What `explain` found on one sample (see the module docstring).

    `tokens`: one row per output token j (index; the EOS row last where it is scored): the query `row` (token
    position), `expected`, its `refs` (text positions), `eos`, `predicted`, `correct`, `margin` (logit of the expected
    token minus the best other: negative when wrong), `first_error` (True on the first wrong token).
    `heads`: one row per output token and head (every head of the model): `mass` (attention on the token's references
    shifted by `delta`, in `convention`; NaN where the token has no references), `top` (the text position it attends
    to most), `top_token` (the token there), `offset` (`top` minus the nearest reference; NaN without references),
    `selected`. With an edit, every per-stage column has a partner `*_after`."""

    sample: Sample
    tokens: pd.DataFrame
    heads: pd.DataFrame
    selected: list[Head]
    delta: int
    how: str  # how the heads were chosen, in words
    convention: str = "raw"
    edit: str | None = None  # the edit's label; None without one
    causes: list[str] = field(default_factory=list)  # the likely cause before the edit (empty: no rule fires)
    causes_after: list[str] = field(default_factory=list)  # the edit's effect and what the rules find after it
    view_data: dict[str, Any] = field(default_factory=dict, repr=False)  # patterns, reference mask, token labels

    @property
    def names(self) -> list[str]:
        """The selected heads' names, `L1H7`."""
        return [head_name(h) for h in self.selected]

    def first_error(self, after: bool = False) -> int | None:
        """The first wrong output token (j), before the edit or `after` it; None when every token is right."""
        wrong = self.tokens.index[~self.tokens["correct_after" if after else "correct"]]
        return int(wrong[0]) if len(wrong) else None

    def exact(self, after: bool = False) -> bool:
        """Whether every output token is right (before the edit, or `after` it)."""
        return bool(self.tokens["correct_after" if after else "correct"].all())

    @property
    def table(self) -> pd.DataFrame:
        """One row per output token: expected, predicted, correct, margin, first error, references; then, per
        selected head, its mass, top position and offset; with an edit each value beside its value after it."""
        staged = ["predicted", "correct", "margin", "first_error"]
        after = self.edit is not None
        cols = ["expected"] + [c for s in staged for c in ([s, f"{s}_after"] if after else [s])] + ["refs"]
        out = self.tokens[cols].copy()
        sel = self.heads[self.heads.selected]
        for name in self.names:
            mine = sel[sel.name == name].set_index("j")
            for c in ("mass", "top", "offset"):
                out[f"{name} {c}"] = mine[c]
                if after:
                    out[f"{name} {c}_after"] = mine[f"{c}_after"]
        out.index.name = "token"
        return out

    def figure(self, max_heads: int = 48):
        """The plotly figure: output tokens x heads, mass on the references, errors marked (`viz.anatomy_figure`)."""
        from ..viz.anatomy import anatomy_figure

        what = f"{self.sample.text!r}" if len(self.sample.text) <= 60 else f"{len(self.sample.text)} characters"
        return anatomy_figure(self.tokens, self.heads, self.delta, title=f"Anatomy of {what}: attention on the "
                              f"references per output token and head (★ selected)", max_heads=max_heads,
                              selected=self.names)

    def view(self):
        """A circuitsvis view of the selected heads' attention on the sample (and after the edit), with the
        references highlighted (`viz.reference_view`); offline, in JupyterLab and in a report."""
        from ..viz.anatomy import reference_view

        d = self.view_data
        patterns = {head_name(h): d["patterns"][h] for h in self.selected}
        patterns.update({f"{head_name(h)} after": d["patterns_after"][h] for h in self.selected
                         if h in d.get("patterns_after", {})})
        return reference_view(patterns, d["mask"], d["labels"], self.delta)

    def header(self) -> list[str]:
        """The lines above the table: the sample, the answer, the heads."""
        s = self.sample
        lines = [f"sample: {s.prompt} -> {s.target}  ({s.task or 'no task'}, {len(s.target)} target characters)"]
        for after in (False, True) if self.edit else (False,):
            j = self.first_error(after)
            where = "every output token right" if j is None else (
                f"first error at token {j} ({self.tokens.expected[j]!r} expected, "
                f"{self.tokens['predicted_after' if after else 'predicted'][j]!r} predicted)")
            label = f"after {self.edit}" if after else "answer"
            lines.append(f"{label}: {'exact' if self.exact(after) else 'wrong'}, {where}")
        lines.append(f"heads: {', '.join(self.names)} ({self.how}); mass: attention on the references shifted by "
                     f"{self.delta} ({self.convention} convention)")
        return lines

    def text(self) -> str:
        """The anatomy as plain text: header, table, likely cause (what `aspan explain` prints)."""
        with pd.option_context("display.width", 250, "display.max_columns", 60, "display.max_rows", 500):
            table = self.table.to_string(float_format=lambda x: f"{x:.2f}")
        parts = [*self.header(), "", table]
        for title, found in (("likely cause", self.causes), (f"after {self.edit}", self.causes_after)):
            if found:
                parts += ["", f"{title}:", *(f"- {s}" for s in found)]
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        lines = "".join(f"<p>{html.escape(x)}</p>" for x in self.header())
        found = ""
        for title, items in (("Likely cause", self.causes), (f"After {self.edit}", self.causes_after)):
            if items:
                found += f"<p><b>{html.escape(title)}</b></p><ul>" + "".join(
                    f"<li>{html.escape(x)}</li>" for x in items) + "</ul>"
        return lines + found + self.table.to_html(float_format=lambda x: f"{x:.2f}")

    def to_dict(self) -> dict[str, Any]:
        """The anatomy as JSON values (what a run directory keeps for its report): sample, heads, the answers, the
        sentences and the table."""
        table = self.table.reset_index()
        table["refs"] = [list(r) for r in table.refs]
        return {"sample": self.sample.to_dict(), "heads": self.names, "how": self.how, "delta": self.delta,
                "convention": self.convention, "edit": self.edit, "header": self.header(), "causes": self.causes,
                "causes_after": self.causes_after, "exact": self.exact(), "first_error": self.first_error(),
                **({"exact_after": self.exact(True), "first_error_after": self.first_error(True)} if self.edit else {}),
                "table": table.to_dict("records")}


# ----------------------------------------------------------------------------------------------- explain
def explain(
    model,
    tokenizer: Tokenizer,
    sample: Sample,
    *,
    heads: Any = None,
    fwd_hooks: Any = None,
    options: ExplainOptions | None = None,
    **settings: Unpack[ExplainSettings],
) -> Anatomy:
    """Why did the model get `sample` wrong: one row per output token, every head read, the likely cause in words.

    `heads`: (layer, head) pairs to follow, a ranking table (`rank_heads`) to select from, or None: the ranking on
    ID samples of the sample's task selects them (`ExplainOptions.top`, at the offset it serves best).
    `fwd_hooks`: an edit (an `Edit`, which without heads is put on the heads followed; a `NamedEdit`; a hook list
    or a function of the batch, as `evaluate` takes them): the same rows after it, side by side, and what changed.
    `options` / keywords: `ExplainOptions`' fields (`delta`, `top`, `convention`, ...). Costs one forward with every
    head read (two with an edit), plus the ranking without `heads`.
    """
    options = merge_options(ExplainOptions, options, settings, "explain")
    require_tokenizer(tokenizer, "explain: tokenizer")
    sample = check_samples([sample], "explain")[0]
    selected, delta, how = choose(model, tokenizer, (sample.task, sample.params), heads, options)
    if getattr(fwd_hooks, "heads", None) == () and hasattr(fwd_hooks, "on"):  # an `Edit` not yet put on heads
        fwd_hooks = fwd_hooks.on(selected)
    batch = make_batch([sample], tokenizer, n_ctx=model.cfg.n_ctx).to(model.cfg.device)
    rows = output_rows(batch, sample, tokenizer)
    labels = token_strings(tokenizer, batch.tokens[0].cpu())
    before = read(model, batch, [], None, delta, (options.convention, selected))
    tokens, head_rows = _stage(before, batch, rows, tokenizer, labels)
    tokens.insert(1, "expected", [_label(tokenizer, i) for i in batch.labels[0, rows].tolist()])
    tokens.insert(2, "refs", [tuple(sample.references[j]) if j < len(sample.target) else () for j in tokens.index])
    tokens.insert(3, "eos", tokens.index >= len(sample.target))
    head_rows["selected"] = [(l, h) in set(selected) for l, h in zip(head_rows.layer, head_rows["head"])]
    head_rows = head_rows[HEAD_COLUMNS]
    label, view = None, {"patterns": {h: p[0].cpu() for h, p in before.patterns.items()},
                         "mask": batch.ref_mask[0].cpu(), "labels": labels}
    if fwd_hooks is not None:
        user, label = edit_hooks(fwd_hooks, batch, model)
        after = read(model, batch, user, None, delta, (options.convention, selected))
        t2, h2 = _stage(after, batch, rows, tokenizer, labels)
        tokens = tokens.join(t2[STAGED["tokens"]].add_suffix("_after"))
        head_rows = head_rows.join(h2[STAGED["heads"]].add_suffix("_after"))
        view["patterns_after"] = {h: p[0].cpu() for h, p in after.patterns.items()}
    anatomy = Anatomy(sample, tokens[TOKEN_COLUMNS + [c + "_after" for c in STAGED["tokens"] if label]],
                      head_rows, selected, delta, how, options.convention, label, view_data=view)
    anatomy.causes = rules.causes(rules.rows_of(anatomy))
    if label is not None:
        anatomy.causes_after = rules.edit_causes(anatomy)
    return anatomy


def output_rows(batch, sample: Sample, tokenizer: Tokenizer) -> list[int]:
    """The query rows of the output tokens, in order (target characters not `given`, then the EOS row where it is
    scored)."""
    tidx = batch.target_index[0].tolist()
    keep_eos = tokenizer.eos_id is not None and scores_eos(sample)
    return [r for r, j in enumerate(tidx) if j >= 0 and (j < len(sample.target) or keep_eos)]


def _label(tokenizer: Tokenizer, i: int) -> str:
    """A token id as the tables show it: the character, or `<eos>` / `<pad>` / `<bos>`."""
    if i == tokenizer.eos_id:
        return EOS_CHAR
    if i == tokenizer.pad_id:
        return "<pad>"
    return tokenizer.decode([i]) or f"#{i}"


def _stage(r: Read, batch, rows: list[int], tokenizer: Tokenizer, labels: list[str]
           ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(tokens, heads) of one forward: the per-token columns and the long per-head table (`labels`: the token
    label of every position)."""
    logits = r.logits[0, rows].double().cpu()
    expected = batch.labels[0, rows].cpu()
    predicted = logits.argmax(-1)
    other = logits.scatter(-1, expected[:, None], float("-inf")).amax(-1)
    margin = logits.gather(-1, expected[:, None])[:, 0] - other
    correct = (predicted == expected).numpy()
    first = np.zeros(len(rows), dtype=bool)
    if (~correct).any():
        first[int(np.argmax(~correct))] = True
    js = batch.target_index[0, rows].tolist()
    tokens = pd.DataFrame({"row": rows, "predicted": [_label(tokenizer, i) for i in predicted.tolist()],
                           "correct": correct, "margin": margin.numpy(), "first_error": first},
                          index=pd.Index(js, name="j"))
    return tokens, _head_table(r, batch.offset, rows, js, labels)


def _head_table(r: Read, offset: int, rows: list[int], js: list[int], labels: list[str]) -> pd.DataFrame:
    """One row per output token and head, in (token, layer, head) order."""
    heads = list(r.rows)
    at = torch.tensor(rows)
    pick = lambda name: torch.stack([r.rows[h][name][0] for h in heads]).cpu()[:, at].T.flatten().numpy()  # noqa: E731
    top = pick("top")
    n, m = len(heads), len(rows)
    return pd.DataFrame({
        "j": np.repeat(js, n), "name": [head_name(h) for h in heads] * m, "layer": [h[0] for h in heads] * m,
        "head": [h[1] for h in heads] * m, "mass": pick("mass"), "top": top - offset,
        "top_token": np.array(labels, dtype=object)[top], "offset": pick("offset"),
    }, index=pd.RangeIndex(m * n))

