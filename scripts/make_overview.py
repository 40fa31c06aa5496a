"""Draw the README's picture, docs/_static/overview.png: per-token accuracy by input length of the shipped reversal
model (trained on 1-10 characters), before and after reinforcing its two lookup heads' attention on `ref+2`, the
edit of the README's Python example. aspan's own figure (`aspan.viz.figures.accuracy_vs_length`) exported with
kaleido (`aspan.viz.export.export_images`; needs the `browser` extra and a Chromium).

    .venv/bin/python scripts/make_overview.py            # about a minute on a CPU
    .venv/bin/python scripts/make_overview.py --out x.png
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "_static" / "overview.png", help="the PNG to write")
    p.add_argument("-n", type=int, default=600, help="samples of lengths 1-30 (default 600: ~20 per length)")
    args = p.parse_args(argv)

    import hooks
    from aspan import models, tasks
    from aspan.evaluation import evaluate, summarize
    from aspan.experiments.ranking import rank_heads, select_heads
    from aspan.viz.export import export_images
    from aspan.viz.figures import accuracy_vs_length

    model, tokenizer, _ = models.load("reversal")
    samples = tasks.preset("reversal", "ood", length=(1, 30)).generate(args.n, seed=0)
    ranking = rank_heads(model, tokenizer, tasks.preset("reversal", "id").generate(64, seed=1), deltas=[2])
    heads = select_heads(ranking, top=2, by="score_row_d2")

    def edit(batch):
        return hooks.reinforce(heads, mask=batch.ref_mask, strength=4.0, delta=2)

    before = summarize(evaluate(model, tokenizer, samples, attn=False))
    after = summarize(evaluate(model, tokenizer, samples, fwd_hooks=edit, attn=False))
    label = ", ".join(f"L{layer}H{head}" for layer, head in heads)
    fig = accuracy_vs_length({"baseline": before, f"reinforced {label} at ref+2, C=4": after}, y="partial",
                             title="Shipped reversal model (trained on 1-10): per-token accuracy by length",
                             id_max=10)
    fig.update_layout(width=900, height=420, xaxis_title="input length (characters)",
                      yaxis_title="per-token accuracy", legend={"x": 0.55, "y": 0.98})
    with tempfile.TemporaryDirectory() as tmp:
        [png] = export_images({"overview": fig}, Path(tmp) / "images")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, args.out)
    print(f"{args.out}: baseline per-token {before.partial.mean():.2f}, reinforced {after.partial.mean():.2f} "
          f"(mean over lengths 1-30)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
