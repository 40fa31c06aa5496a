"""Real-browser check of the HTML report: the run directory of `aspan demo --quick`, turned into a page by
`aspan report`, opened in headless Chromium (driven by playwright) with all network blocked. The headline table
must be in the first 1400x900 screen, no visible `<pre>` longer than 20 lines (raw data stays folded), every
plotly figure must draw, every circuitsvis view must paint its canvases, with no console errors and no external
request.

The same run's key figures are exported as static images (`aspan report RUN --images png|svg`, plotly's exporter
kaleido driving the same Chromium).

Each test is skipped, with a reason naming it, when the system package Chromium is missing (`.ci/run` installs
Debian's chromium); playwright and kaleido come with the `browser` extra that `make venv` installs. A screenshot of
the page is left in the test's tmp dir.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LOCAL = ("file:", "data:", "about:", "blob:")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HEAD_NAMES = re.compile(r'"attentionHeadNames":\s*(\[[^\]]*\])')


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


# The one reason a test here may skip: Chromium is a system package, which `make venv` cannot install (playwright
# and kaleido, which drive it, come with the `browser` extra that `make venv` installs: without them a test fails).
needs_chromium = pytest.mark.skipif(_chromium() is None, reason="the system package Chromium is not installed "
                                    "(apt-get install chromium, or set ASPAN_CHROMIUM to a Chromium binary)")


def _aspan(*args: str) -> subprocess.CompletedProcess:
    """Run the venv's `aspan` console script (or `python -m aspan.cli` where it is not installed as a script)."""
    script = Path(sys.executable).with_name("aspan")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "aspan.cli"]
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=600, env=env)


def _title(path: Path) -> str:
    """The title of a saved plotly figure (what the page's `.gtitle` shows)."""
    title = json.loads(path.read_text(encoding="utf-8")).get("layout", {}).get("title", {})
    return title.get("text", "") if isinstance(title, dict) else str(title)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, Path]:
    """(run dir of `aspan demo --quick`, the page `aspan report RUN_DIR -o report.html` wrote for it)."""
    root = tmp_path_factory.mktemp("browser")
    run, out = root / "demo", root / "report.html"
    for args in (["demo", "--quick", "--out", str(run)], ["report", str(run), "-o", str(out)]):
        proc = _aspan(*args)
        assert proc.returncode == 0, f"aspan {' '.join(args)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}"
    assert (run / "report.html").exists(), "aspan demo did not write its own report.html"
    return run, out


@needs_chromium
def test_report_renders_offline_in_chromium(report, tmp_path):
    from playwright.sync_api import sync_playwright

    run, page_path = report
    titles = sorted(_title(p) for p in (run / "figures").glob("*.json"))
    views = [
        json.loads(HEAD_NAMES.search(p.read_text(encoding="utf-8"))[1]) for p in sorted((run / "views").glob("*.html"))
    ]
    assert len(titles) >= 5 and len(views) >= 1, f"the demo wrote {len(titles)} figures and {len(views)} views"
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
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: None if r.url in attempted else problems.append(f"failed: {r.url}"))
            page.route("**/*", route)
            page.goto(page_path.as_uri(), wait_until="load")
            page.wait_for_function(
                f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {len(titles)}"
                " && document.querySelectorAll('[id^=circuits-vis] canvas').length"
                f" >= {sum(len(v) + 1 for v in views)}",
                timeout=60_000,
            )
            page.wait_for_timeout(500)  # let Chart.js finish painting the canvases
            first_screen = page.evaluate("""() => {
                const box = document.getElementById('headline').getBoundingClientRect();
                const shown = Array.from(document.querySelectorAll('pre')).filter(p => p.checkVisibility());
                return {top: box.top, bottom: box.bottom, right: box.right, scrollY: window.scrollY,
                        rows: document.querySelectorAll('#headline tbody tr').length,
                        pre_lines: shown.map(p => p.textContent.replace(/\\n$/, '').split('\\n').length)}; }""")
            figures = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => ({
                svgs: d.querySelectorAll('.main-svg').length,
                title: (d.querySelector('.gtitle') || {}).textContent || '',
                marks: d.querySelectorAll('.cartesianlayer .trace, .cartesianlayer image').length}))""")
            rendered = page.evaluate("""() => Array.from(document.querySelectorAll('[id^=circuits-vis]')).map(d => ({
                text: d.innerText,
                inked: Array.from(d.querySelectorAll('canvas')).map(c => {
                    const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                    let n = 0;
                    for (let i = 0; i < px.length; i += 4)
                        if (px[i + 3] > 0 && (px[i] < 250 || px[i + 1] < 250 || px[i + 2] < 250)) n++;
                    return n; })}))""")
            anatomy = page.evaluate(ANATOMY)
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()

    assert not attempted, f"the report tried to reach the network: {attempted}"
    assert first_screen["scrollY"] == 0 and first_screen["rows"] >= 4, first_screen
    assert 0 <= first_screen["top"] and first_screen["bottom"] <= 900 and first_screen["right"] <= 1400, first_screen
    assert all(n <= 20 for n in first_screen["pre_lines"]), f"a long <pre> is visible: {first_screen['pre_lines']}"
    assert not problems, "\n".join(problems)
    assert sorted(f["title"] for f in figures) == titles
    assert all(f["svgs"] >= 1 and f["marks"] >= 1 for f in figures), figures
    assert len(rendered) == len(views)
    for view, names in zip(rendered, views):
        assert all(name in view["text"] for name in names), view["text"][:200]
        assert len(view["inked"]) == len(names) + 1  # one thumbnail per head plus the zoomed pattern
        assert all(n > 0 for n in view["inked"]), f"a circuitsvis canvas is blank: {view['inked']}"
    assert shot.stat().st_size > 10_000
    # the anatomy of the first failing held-out sample (the quick demo's OOD set always has one): its own section
    assert (run / "anatomy.json").exists()
    assert anatomy["heading"] and anatomy["causes"] >= 1 and anatomy["rows"] >= 10, anatomy
    assert anatomy["figure"] and anatomy["view"], anatomy


# What the "Anatomy of a failure" section of a page shows: its heading, its sentences, its table's rows, whether its
# plotly figure drew (marks inside) and whether its circuitsvis view painted every canvas.
ANATOMY = """() => {
    const h = document.getElementById('anatomy-of-a-failure');
    const fig = document.querySelector('.figure#anatomy .js-plotly-plot');
    const view = document.querySelector('#view-anatomy + div[id^=circuits-vis]');
    const inked = view ? Array.from(view.querySelectorAll('canvas')).map(c => {
        const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < px.length; i += 4) if (px[i] > 0) n++; return n; }) : [];
    return {heading: !!h && h.checkVisibility(), causes: document.querySelectorAll('ul.causes li').length,
            rows: document.querySelectorAll('.anatomy-table tbody tr').length,
            figure: !!fig && fig.querySelectorAll('.heatmaplayer image, .cartesianlayer .trace').length >= 2,
            view: inked.length >= 3 && inked.every(n => n > 0), canvases: inked.length,
            text: view ? view.innerText : ''}; }"""


@needs_chromium
def test_explain_page_renders_offline_in_chromium(tmp_path):
    """`aspan explain --failing --edit FILE`'s page: the anatomy section with its sentences before and after the edit,
    its table, its figure (before and after, side by side) drawn, and its circuitsvis view (the two heads before and
    after, and the reference maps) painted; no console error, no request leaves the machine."""
    from playwright.sync_api import sync_playwright

    edit = tmp_path / "edit.toml"
    edit.write_text('method = "reinforce"\nstrength = 4.0\ndelta = 2\n')
    run = tmp_path / "run"
    proc = _aspan("explain", "reversal", "--task", "reversal", "--failing", "--param", "length=11-14", "--edit",
                  str(edit), "--out", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    attempted, problems = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(LOCAL)
                       else (attempted.append(r.request.url), r.abort()))
            page.goto((run / "report.html").as_uri(), wait_until="load")
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 1"
                                   " && document.querySelectorAll('[id^=circuits-vis] canvas').length >= 7",
                                   timeout=60_000)
            page.wait_for_timeout(500)  # let Chart.js finish painting the canvases
            anatomy = page.evaluate(ANATOMY)
            page.screenshot(path=str(tmp_path / "explain.png"), full_page=True)
        finally:
            browser.close()
    table = json.loads((run / "anatomy.json").read_text(encoding="utf-8"))["table"]
    assert not attempted and not problems, (attempted, problems)
    assert anatomy["heading"] and anatomy["rows"] == len(table) and anatomy["figure"], anatomy
    assert anatomy["causes"] >= 2  # before the edit, and what the edit did
    assert anatomy["view"] and anatomy["canvases"] == 7, anatomy  # 6 patterns and the zoomed one
    for name in ("L1H7", "L1H0", "L1H7 after", "references", "references ref+2"):
        assert name in anatomy["text"], anatomy["text"][:300]


def test_missing_run_dir_is_a_clear_error(tmp_path):
    proc = _aspan("report", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@needs_chromium
def test_key_figures_export_as_static_images(report):
    """`--images png|svg` writes the first figure of each claim of the demo's finding into RUN/images/, at the
    figure's own size (900 x 500 where it sets none); no HTML page is written; with -o it is a usage error."""
    run, _ = report
    key = ["08_accuracy_vs_length", "04_correct_vs_error", "05_offset_scan", "10_pareto"]
    before = (run / "report.html").stat().st_mtime_ns
    proc = _aspan("report", str(run), "--images", "png")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(run / "images" / f"{k}.png") for k in key]
    for name in key:
        layout = json.loads((run / "figures" / f"{name}.json").read_text(encoding="utf-8"))["layout"]
        assert _png_size(run / "images" / f"{name}.png") == (layout.get("width", 900), layout.get("height", 500))
    proc = _aspan("report", str(run), "--images", "svg")
    assert proc.returncode == 0, proc.stderr
    svg = (run / "images" / "10_pareto.svg").read_text(encoding="utf-8")
    assert svg.startswith("<svg") and _title(run / "figures" / "10_pareto.json") in svg
    assert (run / "report.html").stat().st_mtime_ns == before
    proc = _aspan("report", str(run), "--images", "png", "-o", str(run / "x.html"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--images" in proc.stderr
    assert not (run / "x.html").exists()


@needs_chromium
def test_learning_curves_export_as_a_static_image(tmp_path):
    """A run directory whose only figure is its learning curves (curves.jsonl) exports them as an image."""
    rows = [{"step": step, "bucket": bucket, "exact": exact} for step, exact in ((0, 0.0), (10, 0.5))
            for bucket in ("id", "ood")]
    (tmp_path / "curves.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = _aspan("report", str(tmp_path), "--images", "png")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(tmp_path / "images" / "learning_curves.png")]
    assert _png_size(tmp_path / "images" / "learning_curves.png") == (900, 500)


@needs_chromium
def test_a_hostile_figure_or_view_name_runs_no_script_in_chromium(tmp_path):
    """A figure file named `"><img src=x onerror=alert(1)>.json` (and a view and a learning-curve bucket named so, and
    a figure whose own title, trace name and a `javascript:` link carry such text) in a run directory: the page
    `aspan report` writes draws the figures in Chromium and runs no script any of them carries (no dialog, no change of
    the page's state)."""
    from playwright.sync_api import sync_playwright

    from aspan import viz

    payloads = ['"><img src=x onerror=alert(1)>', "'><img src=x onerror=window.pwned=1>",
                '"><svg onload=window.pwned=2>']
    run = tmp_path / "run"
    for i, name in enumerate(payloads):
        viz.save_figure(viz.accuracy_vs_length({"b": __import__("pandas").DataFrame(
            {"length": [1, 2], "partial": [0.5, 0.25]})}, title=f"figure {i}"), run / "figures" / f"{name}.json")
        (run / "views").mkdir(exist_ok=True)
        (run / "views" / f"{name}.html").write_text("<p>a hand-written view</p>")
    hostile = viz.accuracy_vs_length({payloads[0]: __import__("pandas").DataFrame(
        {"length": [1, 2], "partial": [0.5, 0.25]})}, title=f"figure values {payloads[1]}")
    hostile.add_annotation(text='<a href="javascript:window.pwned=3">link</a>', x=1, y=0.5)
    viz.save_figure(hostile, run / "figures" / "values.json")  # names and text inside a figure's own JSON
    rows = [{"step": step, "bucket": bucket, "exact": 0.5} for step in (0, 10) for bucket in payloads]
    (run / "curves.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # bucket names from a file
    page_path = run / "report.html"
    proc = _aspan("report", str(run), "-o", str(page_path))
    assert proc.returncode == 0, proc.stderr
    dialogs, errors = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(LOCAL) else r.abort())
            page.goto(page_path.as_uri(), wait_until="load")
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= "
                                   f"{len(payloads) + 2}", timeout=60_000)
            page.wait_for_timeout(500)  # an injected image's onerror fires after its (blocked) load fails
            links = page.evaluate("() => Array.from(document.querySelectorAll('.annotation-text a'), a => "
                                  "[a.getAttribute('href'), a.getAttribute('xlink:href')])")
            page.evaluate("() => document.querySelectorAll('.annotation-text a').forEach(a => a.dispatchEvent("
                          "new MouseEvent('click', {bubbles: true})))")  # a javascript: link must not run either
            state = page.evaluate("() => ({pwned: window.pwned === undefined ? null : window.pwned, "
                                  "images: document.querySelectorAll('img').length, "
                                  "titles: Array.from(document.querySelectorAll('.gtitle')).map(t => t.textContent),"
                                  "legend: Array.from(document.querySelectorAll('.legendtext'), t => t.textContent),"
                                  "views: Array.from(document.querySelectorAll('h3')).map(h => h.textContent)})")
        finally:
            browser.close()
    assert dialogs == [] and state["pwned"] is None and state["images"] == 0, (dialogs, state, links)
    assert not any("javascript" in str(link) for link in links), links
    figures = sorted(t for t in state["titles"] if t.startswith("figure "))
    assert figures == [f"figure {i}" for i in range(len(payloads))] + [f"figure values {payloads[1]}"]
    assert set(payloads) <= set(state["legend"])  # the learning curves' bucket names, shown as text
    assert sorted(payloads) == sorted(v for v in state["views"] if v in payloads)  # the names shown as text
    assert errors == [], errors
