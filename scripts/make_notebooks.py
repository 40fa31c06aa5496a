"""Write the tutorial notebooks in notebooks/ from the cell sources below (outputs stripped).

    .venv/bin/python scripts/make_notebooks.py          # rewrite notebooks/*.ipynb
    .venv/bin/python scripts/make_notebooks.py --check  # exit 1 if a committed notebook differs from this script

The notebooks are generated so that they stay small, reviewable and free of outputs; tests/test_notebooks.py
executes every one of them and checks that the committed files match this script.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"

# Shared first code cell: quiet TransformerLens' deprecation warning, one thread (CI machines are small).
SETUP = '''
import warnings

import torch

warnings.filterwarnings("ignore", message=r"HookedTransformer(\\.from_pretrained)? is deprecated", category=DeprecationWarning)
torch.set_num_threads(1)
'''

# Notebooks 02/03 use the shipped checkpoint; without it they train a small stand-in quickly and say so.
LOAD_DEFAULT = '''
from aspan import models
from aspan.demo import CHECKPOINTS

path = CHECKPOINTS / "reversal"
if (path / "config.json").exists():
    model, tokenizer, meta = models.load(path)
    print(f"loaded the shipped checkpoint {path.name}: {model.cfg.n_layers} layers x {model.cfg.n_heads} heads")
else:
    print(f"NOTE: no shipped checkpoint at {path}; training a small stand-in for a few hundred steps instead.\\n"
          "Its numbers are weaker than the shipped model's; run `python scripts/train_default.py` to build the real one.")
    from aspan.demo import train_model
    model, tokenizer, meta = train_model("reversal", steps=300, quick=True, progress=False)
print(meta.get("eval", ""))
'''


def md(text: str):
    return new_markdown_cell(textwrap.dedent(text).strip())


def code(text: str):
    return new_code_cell(textwrap.dedent(text).strip())


def nb01():
    return [
        md("""
        # 01 · Tasks and reference sets

        aspan studies *why* transformers fail to extrapolate on algorithmic tasks by comparing where the model
        attends with where it *should* attend. Every task therefore generates samples that carry, for every
        target character, its **reference set**: the prompt (or earlier target) positions one must read to
        produce it (SPEC section 1). This notebook shows every task, one sample each, with the references drawn
        over the text, and how the references become the query x key masks the attention tools use.
        """),
        code(SETUP),
        code('''
        import pandas as pd
        import plotly.graph_objects as go

        from aspan import tasks
        from aspan.commands.show import render

        def fmt(params):
            """Parameters as `key=value`, long symbol sets shortened."""
            short = lambda v: f"{v[:3]}..{v[-2:]} ({len(v)})" if isinstance(v, str) and len(v) > 8 else v  # noqa: E731
            return ", ".join(f"{k}={short(v)}" for k, v in params.items())


        pd.set_option("display.max_colwidth", None)
        pd.DataFrame([
            {"task": name, "ID preset": fmt(tasks.preset(name, "id").params()), "OOD preset": fmt(tasks.preset(name, "ood").params())}
            for name in tasks.NAMES
        ]).set_index("task")
        '''),
        md("""
        ## One sample of every task

        `render` is what `aspan show TASK` prints: the text, then one line per target character with `^` under
        the referenced positions and `*` under the character itself. The figure draws the same reference sets:
        one row per target character, one column per text position, a filled cell for every reference, an `x`
        where the character itself sits; the dotted line separates prompt and target.
        """),
        code('''
        def reference_figure(sample, title=None):
            """Target characters (rows) x text positions (columns); a filled cell is a reference."""
            n, text = sample.prompt_len, sample.text
            x = [f"{p}:{c}" for p, c in enumerate(text)]
            y = [f"t{j} {c!r}" for j, c in enumerate(sample.target)]
            z = [[int(p in refs) for p in range(len(text))] for refs in sample.references]
            fig = go.Figure(go.Heatmap(z=z, x=x, y=y, zmin=0, zmax=1, showscale=False, xgap=1, ygap=1,
                                       colorscale=[[0, "#f4f4f4"], [1, "#1f77b4"]]))
            fig.add_scatter(x=[x[n + j] for j in range(len(y))], y=y, mode="markers", name="the character",
                            marker=dict(symbol="x", color="#e76f51", size=9))
            fig.add_vline(x=n - 0.5, line_dash="dot")
            fig.update_layout(title=title or f"{sample.task}: {sample.prompt!r} -> {sample.target!r}",
                              yaxis_autorange="reversed", height=180 + 22 * len(y), width=max(500, 26 * len(text) + 200),
                              xaxis_tickangle=-90 if len(text) > 20 else 0, showlegend=False, margin=dict(t=50, b=50))
            return fig


        for name in tasks.NAMES:
            sample = tasks.preset(name, "id").generate(1, seed=1)[0]
            print(f"== {name} ==")
            print(render(sample, width=120), end="\\n\\n")
            reference_figure(sample).show()
        '''),
        md("""
        ## ID vs OOD

        Each task has an in-distribution preset (what models are trained on) and a longer out-of-distribution
        preset (paper, Appendix E). The OOD samples use the same rules, only more of everything:
        """),
        code("""
        for name in ("addition", "successor"):
            for split in ("id", "ood"):
                s = tasks.preset(name, split).generate(1, seed=3)[0]
                print(f"{name:>10} {split:<3} {s.prompt!r:>28} -> {s.target!r}")
        """),
        md("""
        ## Sufficiency: the references are enough

        Changing a prompt character that is *not* referenced by target character `j` never changes character
        `j` (the property every task is tested for). Here on addition: change digits one at a time and solve again.
        """),
        code("""
        task = tasks.preset("addition", "id")
        sample = task.generate(1, seed=5)[0]
        prompt, target = sample.prompt, sample.target
        for pos, ch in enumerate(prompt):
            if not ch.isdigit() or ch == "0":
                continue
            new = prompt[:pos] + str((int(ch) % 9) + 1) + prompt[pos + 1 :]  # stays canonical: no leading zero created
            new_target = task.solve(new)
            if len(new_target) != len(target):  # the claim holds when the target keeps its layout
                continue
            unchanged = [j for j, refs in enumerate(sample.references) if pos not in refs]
            assert all(new_target[j] == target[j] for j in unchanged)
            print(f"{prompt} -> {target}   |   {new} -> {new_target}   (chars {unchanged} not referencing {pos}: unchanged)")
        """),
        md("""
        ## From references to masks

        A model sees a BOS token (or an instruction / few-shot examples) before the text, so positions move
        by `offset`. Target character `j` is *predicted* at query row `offset + prompt_len + j - 1` (the row
        before it). `Sample.mask(offset)` is the dense `[query, key]` mask; `make_batch` stacks them with padding
        into `Batch.ref_mask`, which every score and intervention takes.
        """),
        code("""
        from aspan.batching import make_batch
        from aspan.tokenization import CharTokenizer

        tokenizer = CharTokenizer()
        samples = tasks.preset("reversal", "id").generate(3, seed=0)
        batch = make_batch(samples, tokenizer)
        print("tokens", tuple(batch.tokens.shape), "ref_mask", tuple(batch.ref_mask.shape), "offset", batch.offset)

        s = samples[0]
        for j, refs in enumerate(s.references):
            row = s.query_row(j, offset=batch.offset)
            cols = batch.ref_mask[0, row].nonzero().flatten().tolist()
            assert cols == [batch.offset + p for p in refs]
            print(f"target {j} {s.target[j]!r}: query row {row} (token {tokenizer.decode([batch.tokens[0, row].item()])!r}) "
                  f"-> key columns {cols} (text positions {list(refs)})")
        """),
        code("""
        tokens = ["<bos>", *s.text, "<eos>"]  # what sample 0's rows hold (the rest of the batch row is padding)
        n = len(tokens)
        labels = [f"{i}:{t}" for i, t in enumerate(tokens)]
        fig = go.Figure(go.Heatmap(z=batch.ref_mask[0, :n, :n].float(), x=labels, y=labels, colorscale="Blues",
                                   showscale=False, xgap=1, ygap=1))
        fig.update_layout(title="Batch.ref_mask[0]: query rows x key columns", yaxis_autorange="reversed",
                          xaxis_title="key", yaxis_title="query", height=480, width=560)
        fig.show()
        """),
    ]


BUILDERS = {
    "01_tasks_and_references.ipynb": nb01,
}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook `name` with stripped outputs, as nbformat writes it."""
    nb = new_notebook(cells=BUILDERS[name]())
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{Path(name).stem[:2]}-{i:02d}"  # stable ids: regenerating gives the same file
    return nb


def render(name: str) -> str:
    return nbformat.writes(build(name)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a committed notebook differs from this script")
    args = parser.parse_args(argv)
    stale = []
    for name in BUILDERS:
        path, text = NOTEBOOKS / name, render(name)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"out of date (run scripts/make_notebooks.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
