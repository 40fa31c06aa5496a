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


# Where the site's widest content lives: the tutorials (DataFrames, plotly figures, long code lines), the CLI
# reference (help text), an API page (long signatures) and the Slurm how-to (long command lines).
WIDE_PAGES = ["tutorials/01_tasks_and_references.html", "tutorials/02_attention_and_rollout.html",
              "tutorials/03_reinforcement.html", "tutorials/04_your_own_model.html", "cli.html",
              "api/generated/aspan.experiments.sweep.html", "howto/slurm.html"]
SPILLS = """() => {
  const article = document.querySelector('article[role=main]');
  const right = article.getBoundingClientRect().right + 1;
  const scrolls = (el) => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const out = [];
  for (const el of article.querySelectorAll('pre, table, div.cell_output .output, .plotly-graph-div, img')) {
    let box = el;  // the element itself, or the nearest box around it that scrolls sideways
    while (box !== article && !scrolls(box)) box = box.parentElement;
    const shown = (box === article ? el : box).getBoundingClientRect();
    const what = el.tagName + '.' + el.className + ' ' + (el.textContent || '').trim().slice(0, 40);
    if (shown.width > 0 && shown.right > right) out.push('spills: ' + what);
    const clips = ['hidden', 'clip'].includes(getComputedStyle(el).overflowX);
    if (clips && el.scrollWidth > el.clientWidth + 1 && !el.closest('.plotly-graph-div'))
      out.push('cut off: ' + what);
  }
  return out;
}"""


@pytest.mark.parametrize("width", [1400, 1000])
def test_wide_tables_figures_and_code_scroll_inside_the_column(page, site, width):
    """Nothing in a page's column reaches past its right edge at two window widths: what is wider (a DataFrame, a
    plotly figure, a 120-character code line) sits in a box that scrolls sideways, and no box cuts it off."""
    page.set_viewport_size({"width": width, "height": 900})
    found = {}
    for name in WIDE_PAGES:
        page.goto(site + name, wait_until="load")
        if bad := page.evaluate(SPILLS):
            found[name] = bad[:5]
    assert not found, found
    page.goto(site + "tutorials/03_reinforcement.html", wait_until="load")  # the check sees the wide table
    wide = page.evaluate("""() => Array.from(document.querySelectorAll('table.dataframe')).map(t =>
        t.closest('div.output').scrollWidth > t.closest('div.output').clientWidth)""")
    assert True in wide, "no DataFrame wider than the column: the check above tested nothing"


def test_tutorial_introductions_are_prose(page, site):
    """A tutorial opens with its title, then paragraphs (no introduction shown as a code block)."""
    tutorials = sorted(p.relative_to(SITE).as_posix() for p in (SITE / "tutorials").glob("*.html"))
    assert len(tutorials) >= 4, tutorials
    for name in tutorials:
        page.goto(site + name, wait_until="load")
        first = page.evaluate("() => document.querySelector('article[role=main] h1').nextElementSibling.tagName")
        assert first == "P", (name, first)


def test_search_from_disk_lists_titles_and_names_docs_serve(page):
    """Opened from a file: URL, the search page finds pages, asks for no excerpt (a browser refuses those fetches,
    which the page fixture would report as errors) and says how to get them."""
    page.goto((SITE / "search.html").as_uri() + "?q=reinforce", wait_until="load")
    page.wait_for_function("document.querySelectorAll('#search-results li').length > 0", timeout=60_000)
    links = page.evaluate("() => Array.from(document.querySelectorAll('#search-results li a')).map(a => a.href)")
    assert any("hooks.reinforce" in link for link in links), links[:20]
    assert "make docs-serve" in page.locator("#search-offline-note").inner_text()
    page.wait_for_timeout(1000)  # any fetch would have failed by now


def test_search_served_shows_excerpts(page, site):
    page.goto(site + "search.html?q=reinforcement", wait_until="load")
    page.wait_for_function("document.querySelectorAll('#search-results li p.context').length > 0", timeout=60_000)
    assert page.locator("#search-offline-note").count() == 0


def test_every_page_lists_the_top_level_pages_and_api_pages_list_the_modules(page, site):
    """The navigation (furo's sidebar, drawn from the current page's branch): every page links every page of the
    home page's toctrees; the API pages also link every API module page."""
    def sidebar(name: str) -> set[str]:
        page.goto(site + name, wait_until="load")
        hrefs = page.evaluate("""() => Array.from(document.querySelectorAll('.sidebar-tree a.reference'))
            .map(a => new URL(a.href).pathname)""")
        return {h.split("/", 1)[1] if h.startswith("/") else h for h in hrefs}

    home = sidebar("index.html")
    modules = {f"api/generated/{p.name}" for p in (SITE / "api" / "generated").glob("*.html")}
    assert {"getting-started.html", "api.html", "howto/slurm.html", "cli.html"} <= home
    for name in ("howto/slurm.html", "tutorials/03_reinforcement.html", "api.html",
                 "api/generated/hooks.reinforce.html"):
        assert home <= sidebar(name), name
    assert modules and modules <= sidebar("api.html") and modules <= sidebar("api/generated/hooks.reinforce.html")
