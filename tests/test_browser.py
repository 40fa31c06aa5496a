"""Real-browser check of the HTML report: headless Chromium (driven by playwright), all network blocked, must render
every plotly figure and every circuitsvis view without console errors or external requests.

Skipped with the reason when playwright or a Chromium binary is missing (`.ci/run` installs both: Debian's
chromium and the `browser` extra). A screenshot of the page is left in the test's tmp dir.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

LOCAL = ("file:", "data:", "about:", "blob:")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium() -> str | None:
    """A Chromium executable: $ASPAN_CHROMIUM, else the first of the usual names on PATH."""
    env = os.environ.get("ASPAN_CHROMIUM")
    if env:
        return env if Path(env).exists() else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _requirements() -> str | None:
    """Why the browser test cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[browser]')"
    if _chromium() is None:
        return "no Chromium binary found (apt-get install chromium, or set ASPAN_CHROMIUM)"
    return None


pytestmark = pytest.mark.skipif(_requirements() is not None, reason=str(_requirements()))


def _run_dir(root: Path) -> Path:
    """A run directory as aspan's commands write it, from a real tiny model: 2 figures, 1 head view, tables."""
    import torch

    warnings.filterwarnings("ignore", message=r"HookedTransformer(\.from_pretrained)? is deprecated", category=DeprecationWarning)
    import hooks
    from aspan import models, tasks, viz
    from aspan.batching import make_batch
    from aspan.tokenization import CharTokenizer

    run = root / "run"
    tokenizer = CharTokenizer()
    model = models.tiny(tokenizer, n_layers=2, n_heads=4, d_model=32, n_ctx=64, seed=0)
    samples = tasks.preset("reversal", "id", length=(8, 10)).generate(2, seed=0)
    batch = make_batch(samples, tokenizer)
    n = int(batch.lengths[0])
    labels = ["<bos>", *samples[0].text, "<eos>"]
    rollout = hooks.rollout(model, batch.tokens, attention_mask=batch.attention_mask)
    viz.save_figure(viz.rollout_heatmap(rollout[0, :n, :n], batch.ref_mask[0, :n, :n], labels, title="Rollout of sample 0"),
                    run / "figures" / "rollout.json")
    scores = hooks.head_scores(model, batch.tokens, batch.ref_mask, reduce="row", attention_mask=batch.attention_mask)
    viz.save_figure(viz.layer_head_heatmap(scores, title="Attention on references per head"), run / "figures" / "heads.json")
    patterns = hooks.capture(model, batch.tokens[:1], [(1, 0), (1, 1)])
    stacked = torch.stack([patterns[h][0, :n, :n] for h in [(1, 0), (1, 1)]])
    viz.save_view(viz.head_view(stacked, labels, ["L1H0", "L1H1"]), run / "views" / "top_heads.html")
    (run / "summary.json").write_text(json.dumps({"exact": 0.0, "tables": {"heads": [{"layer": 1, "head": 0, "score": 0.5}]}}))
    (run / "run.json").write_text(json.dumps({"command": "test_browser", "task": "reversal"}))
    return run


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, Path]:
    """(run dir, report.html written by the real `aspan report` command)."""
    root = tmp_path_factory.mktemp("browser")
    run = _run_dir(root)
    out = root / "report.html"
    aspan = Path(sys.executable).with_name("aspan")
    cmd = [str(aspan)] if aspan.exists() else [sys.executable, "-m", "aspan.cli"]
    subprocess.run([*cmd, "report", str(run), "-o", str(out)], check=True, capture_output=True, text=True, timeout=120)
    return run, out


def test_report_renders_offline_in_chromium(report, tmp_path):
    from playwright.sync_api import sync_playwright

    run, page_path = report
    n_figures = len(list((run / "figures").glob("*.json")))
    view_names = [["L1H0", "L1H1"]]
    attempted, problems = [], []

    def route(r):
        url = r.request.url
        if url.startswith(LOCAL):
            r.continue_()
        else:
            attempted.append(url)
            r.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: None if r.url in attempted else problems.append(f"failed: {r.url}"))
            page.route("**/*", route)
            page.goto(page_path.as_uri(), wait_until="load")
            page.wait_for_function(
                f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n_figures}"
                " && document.querySelectorAll('[id^=circuits-vis] canvas').length > 0",
                timeout=30_000,
            )
            page.wait_for_timeout(500)  # let Chart.js finish painting the canvases
            figures = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => ({
                svgs: d.querySelectorAll('.main-svg').length,
                title: (d.querySelector('.gtitle') || {}).textContent || '',
                traces: d.querySelectorAll('.heatmaplayer image, .heatmaplayer .hm, .scatterlayer .trace').length}))""")
            views = page.evaluate("""() => Array.from(document.querySelectorAll('[id^=circuits-vis]')).map(d => ({
                text: d.innerText,
                inked: Array.from(d.querySelectorAll('canvas')).map(c => {
                    const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                    let n = 0;
                    for (let i = 0; i < px.length; i += 4) if (px[i + 3] > 0 && (px[i] < 250 || px[i + 1] < 250 || px[i + 2] < 250)) n++;
                    return n; })}))""")
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()

    assert not attempted, f"the report tried to reach the network: {attempted}"
    assert not problems, "\n".join(problems)
    assert len(figures) == n_figures
    assert all(f["svgs"] >= 1 and f["traces"] >= 1 for f in figures), figures
    assert sorted(f["title"] for f in figures) == ["Attention on references per head", "Rollout of sample 0"]
    assert len(views) == len(view_names)
    for view, names in zip(views, view_names):
        assert all(name in view["text"] for name in names), view["text"][:200]
        assert len(view["inked"]) == len(names) + 1  # one thumbnail per head plus the zoomed pattern
        assert all(n > 0 for n in view["inked"]), f"a circuitsvis canvas is blank: {view['inked']}"
    assert shot.stat().st_size > 10_000


def test_missing_run_dir_is_a_clear_error(tmp_path):
    aspan = Path(sys.executable).with_name("aspan")
    proc = subprocess.run([str(aspan), "report", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
