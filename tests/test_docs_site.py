"""Real-browser check of the built documentation site (`make docs` -> docs/_build/html), served from disk by a local
HTTP server on 127.0.0.1 (as a user's `python -m http.server` would; Sphinx's search fetches pages, which a browser
refuses for file: URLs) and opened in headless Chromium (driven by playwright, launched as tests/test_browser.py
does) with every other request refused: a page that tries one fails. The home page shows its picture, an API page
renders a signature, a tutorial draws its plotly figures and its circuitsvis view, and search finds `reinforce`. No
page may log an error.

Skipped, with the reason, when the site is not built; `.ci/run` builds it before it runs this file, so CI always
runs it.
"""
from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest

from tests.test_browser import CHROMIUM_ARGS, LOCAL, _chromium, needs_chromium

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "docs" / "_build" / "html"

pytestmark = [
    pytest.mark.skipif(not (SITE / "index.html").is_file(),
                       reason="the docs site is not built (docs/_build/html): run `make docs` first"),
    needs_chromium,
]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no line per request on stderr
        pass


@pytest.fixture(scope="module")
def site():
    """The base URL of the built site, served on 127.0.0.1 at a free port for this module."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(SITE)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser, site):
    """A page that refuses (and records) every request that is not to the site's server or local, and records every
    error it logs."""
    attempted, problems = [], []

    def route(r):
        if r.request.url.startswith((site, *LOCAL)):
            r.continue_()
        else:
            attempted.append(r.request.url)
            r.abort()

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.route("**/*", route)
    yield page
    context.close()
    assert not attempted, f"the site tried to load from outside: {attempted}"
    assert not problems, problems


def test_home_page_shows_its_picture(page, site):
    page.goto(site + "index.html", wait_until="load")
    images = page.evaluate("""() => Array.from(document.querySelectorAll('article img')).map(i => ({
        src: i.getAttribute('src'), width: i.naturalWidth, height: i.naturalHeight, shown: i.checkVisibility()}))""")
    assert images, "the home page has no picture"
    assert all(i["width"] > 100 and i["height"] > 100 and i["shown"] for i in images), images


def test_api_page_renders_a_signature_with_its_docstring(page, site):
    page.goto(site + "api/generated/hooks.reinforce.html", wait_until="load")
    entry = page.locator('dt[id="hooks.reinforce.reinforce"]')
    assert entry.is_visible()
    params = entry.locator(".sig-param").all_inner_texts()
    assert any(p.startswith("model") for p in params) and any(p.startswith("strength") for p in params), params
    doc = page.locator('dt[id="hooks.reinforce.reinforce"] + dd').text_content()
    assert "Shapes" in doc and ">>>" in doc, doc[:500]


def test_tutorial_draws_its_plotly_figures_and_circuitsvis_view(page, site):
    path = SITE / "tutorials" / "02_attention_and_rollout.html"
    page.goto(site + "tutorials/02_attention_and_rollout.html", wait_until="load")
    expected = path.read_text(encoding="utf-8").count('class="plotly-graph-div"')
    assert expected >= 1, "the tutorial page holds no plotly figure"
    page.wait_for_function(
        f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {2 * expected}"
        " && document.querySelectorAll('[id^=circuits-vis] canvas').length >= 1",
        timeout=60_000,
    )
    page.wait_for_timeout(500)  # let Chart.js finish painting the canvases
    drawn = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(d =>
        d.querySelectorAll('.cartesianlayer .trace, .cartesianlayer image, .heatmaplayer image').length)""")
    assert len(drawn) == expected and all(n > 0 for n in drawn), drawn
    inked = page.evaluate("""() => Array.from(document.querySelectorAll('[id^=circuits-vis] canvas')).map(c => {
        const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < px.length; i += 4) if (px[i] > 0) n++; return n; })""")
    assert inked and max(inked) > 100, f"the circuitsvis view paints nothing: {inked}"


def test_the_anatomy_tutorial_draws_its_figures_and_views(page, site):
    """The anatomy of a failure as the notebook shows it (its outputs as JupyterLab and the site render them): the
    plotly figures draw, and each of its two circuitsvis views (before the edit, and before and after it) paints."""
    page.goto(site + "tutorials/06_anatomy_of_a_failure.html", wait_until="load")
    path = SITE / "tutorials" / "06_anatomy_of_a_failure.html"
    expected = path.read_text(encoding="utf-8").count('class="plotly-graph-div"')
    assert expected >= 4, "the tutorial page holds fewer plotly figures than it draws"
    page.wait_for_function(
        f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {2 * expected}"
        " && document.querySelectorAll('[id^=circuits-vis]').length >= 2", timeout=60_000)
    page.wait_for_timeout(1000)  # let Chart.js finish painting the canvases
    views = page.evaluate("""() => Array.from(document.querySelectorAll('[id^=circuits-vis]')).map(v => ({
        text: v.innerText, inked: Array.from(v.querySelectorAll('canvas')).map(c => {
            const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0; for (let i = 3; i < px.length; i += 4) if (px[i] > 0) n++; return n; })}))""")
    assert len(views) == 2 and all(v["inked"] and min(v["inked"]) > 0 for v in views), views
    assert "references ref+2" in views[0]["text"] and "L1H7 after" in views[1]["text"]


def test_search_finds_reinforce(page, site):
    page.goto(site + "search.html?q=reinforce", wait_until="load")
    page.wait_for_function("document.querySelectorAll('#search-results li').length > 0", timeout=60_000)
    links = page.evaluate("() => Array.from(document.querySelectorAll('#search-results li a')).map(a => a.href)")
    assert any("hooks.reinforce" in link for link in links), links[:20]
