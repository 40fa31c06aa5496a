"""One self-contained HTML page for a run directory that states its finding, offline.

The page opens with what the run found (`aspan.findings`): the question, the answer from the run's numbers, the
headline table with the selection rule under it, then one section per claim with the figures that show it. A run
that kept the anatomy of a failing sample (`anatomy.json`, `aspan.anatomy`) gets its section next: the sample, the
likely cause in words, before and after the run's edit, the table, its figure and its attention view. Figures no
claim names, the circuitsvis views and (for runs no finding knows) the summary's tables follow; tables,
configuration, command and the raw summary are folded in `<details>`.

plotly.js and the circuitsvis bundle are inlined once each (no CDN, no external script); each figure is
`fig.to_html(full_html=False, include_plotlyjs=False)`, each circuitsvis view its div plus a render call.
"""
from __future__ import annotations

import functools
import html
import json
import re
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import plotly.io as pio
from plotly.offline import get_plotlyjs

from .checks import check_output_dir, check_output_file
from .curves import CURVES_FILE
from .findings import Claim, Finding, finding
from .io import read_rows, write_text
from .viz.views import _LOCAL

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { border-bottom: 2px solid #ccc; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
table.data { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0 1em; }
table.data th, table.data td { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
table.data th { background: #f2f2f2; } pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; }
.note { color: #666; font-size: 0.85em; } iframe { width: 100%; height: 640px; border: 1px solid #ddd; }
.anatomy-table { overflow-x: auto; } .anatomy-table td:nth-child(-n+2) { text-align: left; }
.question { font-size: 1.15em; font-weight: 600; margin: 0.4em 0; } .answer { font-size: 1.05em; margin: 0.4em 0; }
#headline td:nth-child(-n+2) { text-align: left; } #headline td, #headline th { white-space: nowrap; }
details { margin: 0.6em 0; } summary { cursor: pointer; font-weight: 600; }
"""


def escape(value: Any) -> str:
    """The one rule for text a report embeds (titles, file and view names, table cells, JSON dumps): HTML-escaped,
    quotes included, so that it is text in an element or inside a quoted attribute, never markup."""
    return html.escape(str(value), quote=True)


def html_id(name: str) -> str:
    """The one rule for a name a report uses as an element id (figure stems, view names, plotly's `div_id`, which
    plotly also writes into a JavaScript string): letters, digits and `_` are kept, every other character becomes
    `-XX-` (its code point in hex), so the id holds no quote, `<`, `>` or backslash, and two names never share an
    id. Names made of word characters keep their own name as id."""
    return re.sub(r"[^A-Za-z0-9_]", lambda m: f"-{ord(m[0]):x}-", str(name))


def _table(df: pd.DataFrame, max_rows: int) -> str:
    note = f'<p class="note">first {max_rows} of {len(df)} rows</p>' if len(df) > max_rows else ""
    return (
        df.head(max_rows).to_html(index=False, classes="data", border=0, float_format=lambda x: f"{x:.4g}", na_rep="")
        + note
    )


def _named(path: Path, what: str, read: Callable[[], Any]) -> Any:
    """`read()`, with any failure to parse `path` turned into one ValueError line naming the file and what it
    should have been (pandas and plotly errors can be long, or an AttributeError deep inside)."""
    try:
        return read()
    except (ValueError, TypeError, AttributeError, KeyError, IndexError, UnicodeDecodeError, RecursionError,
            pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path}: not a valid {what} ({first[:200]})") from None


def _read_json(path: Path) -> Any:
    return _named(path, "JSON file", lambda: json.loads(path.read_text(encoding="utf-8")))


def _summary(summary: Any, max_rows: int) -> str:
    if not isinstance(summary, dict):
        return _folded("summary.json", f"<pre>{escape(json.dumps(summary, indent=2))}</pre>")
    tables = summary.get("tables") or {}
    scalars = {k: v for k, v in summary.items() if k != "tables" and not isinstance(v, (dict, list))}
    nested = {k: v for k, v in summary.items() if k != "tables" and isinstance(v, (dict, list))}
    out = []
    if scalars:
        values = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in scalars.values()]
        out.append(_table(pd.DataFrame({"name": list(scalars), "value": values}), max_rows))
    for name, rows in tables.items():
        out.append(f"<h3>{escape(str(name))}</h3>" + _table(pd.DataFrame(rows), max_rows))
    if nested:
        out.append(_folded("Nested values", f"<pre>{escape(json.dumps(nested, indent=2, default=str))}</pre>"))
    return "\n".join(out)


def _folded(label: str, body: str) -> str:
    """`body` inside a closed `<details>` labelled `label`."""
    return f"<details><summary>{escape(label)}</summary>\n{body}\n</details>"


def _finding_section(found: Finding, divs: dict[str, str]) -> list[str]:
    """The question, the answer, the headline table and the rule; then one section per claim with its figures.

    `divs` maps a figure's stem to its plotly div; the figures shown here are removed from it.
    """
    headline = found.headline.to_html(index=False, classes="data", border=0, escape=True, table_id="headline")
    body = [f'<p class="question">{escape(found.question)}</p>',
            f'<p class="answer">{escape(found.answer)}</p>', headline,
            f'<p class="note">{escape(found.rule)}</p>']
    for claim in found.claims:
        body.append(_claim_section(claim, divs))
    return body


def _claim_section(claim: Claim, divs: dict[str, str]) -> str:
    """One claim: its heading, paragraph, optional table and the figures it names that the run has."""
    parts = [f"<h2>{escape(claim.title)}</h2>", f"<p>{escape(claim.text)}</p>"]
    if claim.table is not None:
        parts.append(claim.table.to_html(index=False, classes="data", border=0, escape=True))
    for stem in claim.figures:
        if stem in divs:
            parts.append(_figure_block(stem, divs.pop(stem)))
    return "\n".join(parts)


def _load_figure(path: Path):
    """The plotly figure saved at `path`; ValueError naming the file for anything else."""
    return _named(path, "plotly figure (JSON written by fig.to_json())",
                  lambda: pio.from_json(path.read_text(encoding="utf-8")))


def _figure(path: Path) -> str:
    """The plotly div of a saved figure (its title drawn by plotly)."""
    return _load_figure(path).to_html(full_html=False, include_plotlyjs=False, div_id=f"figure-{html_id(path.stem)}")


def _inside(run: Path, path: Path) -> bool:
    """Whether `path` is a regular file of the run directory itself: no symbolic link on the way (the file or its
    folder), not a FIFO or device, and really inside `run`. A report is meant to be shared: a link in a run directory
    (to `/etc/passwd`, to another run) must not put its target in it."""
    rel = path.relative_to(run)
    if any((run / p).is_symlink() for p in (rel, *rel.parents) if p != Path(".")) or not path.is_file():
        return False
    return path.resolve().is_relative_to(run.resolve())


def _inputs(run: Path) -> dict[str, Any]:
    """The files a report shows (run.json, summary.json, figures, views, CSV and JSONL tables), regular files inside
    `run` only (`left_out`: the other entries with those names); ValueError if there are none."""
    if not run.exists():
        raise FileNotFoundError(f"run directory {run} does not exist")
    if not run.is_dir():
        raise ValueError(f"{run} is not a directory")
    candidates = {
        "run_json": [run / "run.json"], "summary_json": [run / "summary.json"],
        "figures": sorted((run / "figures").glob("*.json")), "views": sorted((run / "views").glob("*.html")),
        "csvs": sorted(run.glob("*.csv")), "jsonls": sorted(run.glob("*.jsonl")),
        "curves": [run / CURVES_FILE, *sorted(run.glob(f"*/{CURVES_FILE}"))],
        "anatomy": [run / ANATOMY_FILE],
    }
    present = {k: [p for p in v if p.exists() or p.is_symlink()] for k, v in candidates.items()}
    found: dict[str, Any] = {k: [p for p in v if _inside(run, p)] for k, v in present.items()}
    left_out = [p for v in present.values() for p in v if not _inside(run, p)]
    if not any(found.values()):
        raise ValueError(
            f"{run} has nothing to report: no run.json, summary.json, anatomy.json, *.csv, *.jsonl, figures/*.json "
            "or views/*.html"
            + (f" (left out, not regular files inside it: {', '.join(p.name for p in left_out)})" if left_out else "")
        )
    one = {k: found[k][0] if found[k] else None for k in ("run_json", "summary_json", "anatomy")}  # or None
    return {**found, **one, "left_out": left_out}


CURVE_FIGURE = "learning_curves"  # the stem of the figure a run's curves.jsonl makes
ANATOMY_FILE = "anatomy.json"  # the anatomy of a failing sample a run keeps (`aspan.anatomy.record`)
ANATOMY_STEM = "anatomy"  # ... its figure (figures/anatomy.json) and attention view (views/anatomy.html)


def curve_figures(run: Path, files: list[Path]) -> dict[str, Any]:
    """{"learning_curves": figure} from the run's `curves.jsonl` files (`files`: the run's own, then those of its
    sub-directories, each a condition named after its directory); {} when there are none. ValueError naming the
    file and line of a row that is not a curve row."""
    from .viz.curves import learning_curves

    runs = {("" if path.parent == run else path.parent.name): pd.DataFrame(
        read_rows(path, ("step", "bucket", "exact"), "learning-curve")) for path in files}
    runs = {name: rows for name, rows in runs.items() if not rows.empty}
    if not runs:
        return {}
    return {CURVE_FIGURE: learning_curves(runs[""] if list(runs) == [""] else runs)}


def _figures_section(divs: dict[str, str], heading: str) -> list[str]:
    """A section with one plotly div per figure in `divs` (stem -> div), under `heading`."""
    return [f"<h2>{escape(heading)}</h2>"] + [_figure_block(stem, div) for stem, div in divs.items()]


def _figure_block(stem: str, div: str) -> str:
    """A figure's plotly div (its title is drawn by plotly) in a block that links can target."""
    return f'<div class="figure" id="{html_id(stem)}">\n{div}\n</div>'


# The render call of a circuitsvis view: nothing but the call, with a JSON object of properties.
_CALL = re.compile(r'CircuitsVis\.render\(\s*"(?P<id>circuits-vis-[A-Za-z0-9-]+)",\s*CircuitsVis\.(?P<name>[A-Za-z]+),'
                   r"\s*(?P<props>\{.*\})\s*\)\s*;?", re.S)


@functools.lru_cache(maxsize=1)
def circuitsvis_bundle() -> str:
    """The JavaScript bundle the installed circuitsvis inlines in its `local_src` pages (taken from a tiny view)."""
    from circuitsvis.attention import attention_heads

    return _LOCAL.search(attention_heads(attention=[[[1.0]]], tokens=["a"]).local_src)["bundle"].strip()


def _trusted_view(text: str) -> str | None:
    """A circuitsvis view rebuilt from its parts, to run in the report page itself: only when its bundle is the
    installed circuitsvis's own and its script is one render call of a circuitsvis component with JSON properties
    (re-serialised, so it cannot close the script); None for anything else."""
    m = _LOCAL.fullmatch(text.strip())
    call = _CALL.fullmatch(m["call"].strip()) if m and m["bundle"].strip() == circuitsvis_bundle() else None
    if call is None or call["id"] != m["id"]:
        return None
    try:
        props = json.dumps(json.loads(call["props"])).replace("<", "\\u003c")
    except ValueError:
        return None
    ident, name = call["id"], call["name"]
    return (f'<div id="{ident}" style="margin: 15px 0;"></div>\n<script>\nCircuitsVis.render(\n      "{ident}",\n'
            f"      CircuitsVis.{name},\n      {props}\n    )\n</script>")


def _views_section(views: list[Path]) -> tuple[list[str], str | None]:
    """The Attention views section and the circuitsvis bundle its views need (None when none runs in the page).

    A circuitsvis view runs in the page (`_trusted_view`); any other page, or a view file with anything beyond a
    circuitsvis view, runs in a sandboxed frame: its scripts get an opaque origin, with no access to the report page,
    its storage or other files."""
    body, bundle = ["<h2>Attention views</h2>"], None
    for path in views:
        text = path.read_text(encoding="utf-8")
        view = _trusted_view(text)
        if view is None:
            view = f'<iframe sandbox="allow-scripts" srcdoc="{escape(text)}"></iframe>'
        else:
            bundle = circuitsvis_bundle()
        body.append(f'<h3 id="view-{html_id(path.stem)}">{escape(path.stem)}</h3>\n{view}')
    return body, bundle


def _anatomy_section(path: Path, divs: dict[str, str], views: list[Path]) -> tuple[list[str], bool]:
    """The "Anatomy of a failure" section from the run's `anatomy.json`: what the sample is, the header lines, the
    likely cause before and after the edit, the table, then the anatomy figure and view (taken out of `divs` and
    `views`, which the later sections show). Returns (body, whether a circuitsvis view runs in it)."""
    data = _read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("table"), list):
        raise ValueError(f"{path}: not an anatomy (a JSON object with a table, as aspan.anatomy writes it)")
    body = ['<h2 id="anatomy-of-a-failure">Anatomy of a failure</h2>']
    if data.get("context"):
        body.append(f"<p>{escape(data['context'])}</p>")
    body.append("<ul>" + "".join(f"<li>{escape(line)}</li>" for line in data.get("header") or []) + "</ul>")
    edit = data.get("edit")
    for title, key in (("Likely cause", "causes"), (f"After {edit}" if edit else "", "causes_after")):
        items = [str(x) for x in data.get(key) or []]
        if items:
            body.append(f'<p class="question">{escape(title)}</p><ul class="causes">'
                        + "".join(f"<li>{escape(x)}</li>" for x in items) + "</ul>")
    if not data.get("causes"):
        body.append('<p class="note">No rule of aspan.anatomy.causes reads a cause in these rows.</p>')
    table = pd.DataFrame(data["table"])
    body.append('<div class="anatomy-table">' + table.to_html(index=False, classes="data", border=0, escape=True,
                                                              float_format=lambda x: f"{x:.2f}", na_rep="")
                + "</div>")
    if ANATOMY_STEM in divs:
        body.append(_figure_block(ANATOMY_STEM, divs.pop(ANATOMY_STEM)))
    mine = [v for v in views if v.stem == ANATOMY_STEM]
    live = False
    for v in mine:
        views.remove(v)
        view = _trusted_view(v.read_text(encoding="utf-8"))
        live = view is not None
        body.append(f'<h3 id="view-{html_id(v.stem)}">Attention of the heads, references highlighted</h3>\n'
                    + (view or f'<iframe sandbox="allow-scripts" srcdoc="{escape(v.read_text(encoding="utf-8"))}">'
                               "</iframe>"))
    return body, live


def _tables_section(csvs: list[Path], jsonls: list[Path], max_rows: int) -> list[str]:
    """The Tables section: every CSV, and every JSONL file (its rows shown when there are at most `max_rows`)."""
    body = []
    for path in csvs:
        df = _named(path, "CSV table", lambda path=path: pd.read_csv(path))
        body.append(f"<h3>{escape(path.name)}</h3>" + _table(df, max_rows))
    for path in jsonls:
        df = _named(path, "JSONL file (one JSON object per line)",
                    lambda path=path: pd.read_json(path, lines=True) if path.stat().st_size else pd.DataFrame())
        cols = ", ".join(map(str, df.columns))
        body.append(
            f'<h3>{escape(path.name)}</h3><p class="note">{len(df)} rows; columns: {escape(cols)}</p>'
        )
        if len(df) <= max_rows:
            body.append(_table(df, max_rows))
    return body


def _read_run(f: dict[str, Any]) -> tuple[Any, Any, Finding | None]:
    """(run.json, summary.json, the finding written from them) of `_inputs`' files; None for each one missing."""
    settings = _read_json(f["run_json"]) if f["run_json"] is not None else None
    summary = _read_json(f["summary_json"]) if f["summary_json"] is not None else None
    found = _named(f["summary_json"], "summary of the run that wrote it (a key or value is missing)",
                   lambda: finding(summary, settings)) if summary is not None else None
    return settings, summary, found


def build_report(run_dir: str | Path, title: str | None = None, max_rows: int = 200) -> str:
    """The report page for `run_dir` as an HTML string; FileNotFoundError/ValueError if there is nothing to show."""
    run = Path(run_dir)
    f = _inputs(run)
    settings, summary, found = _read_run(f)
    summary_json = f["summary_json"]
    head = title or f"aspan report: {run.resolve().name}"
    body = [f"<h1>{escape(head)}</h1>"]
    if f["left_out"]:
        names = ", ".join(str(p.relative_to(run)) for p in f["left_out"])
        body.append(f'<p class="note">Left out (symbolic links or not regular files): {escape(names)}</p>')
    divs = {path.stem: _figure(path) for path in f["figures"]}
    for stem, fig in curve_figures(run, f["curves"]).items():
        divs[stem] = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"figure-{html_id(stem)}")
    plotly = bool(divs)
    if found is not None:
        body += _finding_section(found, divs)
    elif summary is not None:
        body += ["<h2>Summary</h2>", _named(summary_json, "summary (tables: {name: list of rows})",
                                            lambda: _summary(summary, max_rows))]
    bundle, views = None, list(f["views"])
    if f["anatomy"] is not None:
        section, live = _anatomy_section(f["anatomy"], divs, views)
        body += section
        bundle = circuitsvis_bundle() if live else None
    if divs:
        body += _figures_section(divs, "More figures" if found is not None else "Figures")
    if views:
        more, more_bundle = _views_section(views)
        body += more
        bundle = bundle or more_bundle
    body += _folded_sections(f, settings, summary if found is not None else None, max_rows)
    scripts = []
    if plotly:
        scripts.append(f'<script type="text/javascript">{get_plotlyjs()}</script>')
    if bundle:
        scripts.append(f'<script type="text/javascript">{bundle}</script>')
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(head)}</title>\n<style>{STYLE}</style>\n" + "\n".join(scripts)
        + "\n</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n"
    )


def _folded_sections(f: dict[str, Any], settings: Any, summary: Any, max_rows: int) -> list[str]:
    """Tables, configuration and command, and the raw summary (when a finding shows it), each in `<details>`."""
    body = ["<h2>Data and configuration</h2>"]
    if f["csvs"] or f["jsonls"]:
        body.append(_folded("Tables (CSV and JSONL files)", "\n".join(_tables_section(f["csvs"], f["jsonls"],
                                                                                        max_rows))))
    if isinstance(settings, dict) and settings.get("command"):
        body.append(_folded("Command", f"<pre>{escape(str(settings['command']))}</pre>"))
    if settings is not None:
        body.append(_folded("Configuration (run.json)",
                            f"<pre>{escape(json.dumps(settings, indent=2, default=str))}</pre>"))
    if summary is not None:
        body.append(_folded("Raw summary (summary.json)",
                            f"<pre>{escape(json.dumps(summary, indent=2, default=str))}</pre>"))
    return body if len(body) > 1 else []


def write_report(run_dir: str | Path, out: str | Path | None = None, **kw: Any) -> Path:
    """Write `build_report(run_dir)` to `out` (default RUN_DIR/report.html) atomically; returns the path."""
    out = check_output_file(out if out is not None else Path(run_dir) / "report.html", "report file")
    return write_text(out, build_report(run_dir, **kw))


def key_figures(run_dir: str | Path) -> list[Path]:
    """The figures that carry a run's finding: the first figure of each claim the run has (every figure for a run
    no finding knows). ValueError/FileNotFoundError as `build_report`."""
    run = Path(run_dir)
    f = _inputs(run)
    have = {path.stem: path for path in f["figures"]}
    found = _read_run(f)[2]
    if found is None:
        return list(have.values())
    firsts = [next((have[stem] for stem in claim.figures if stem in have), None) for claim in found.claims]
    return list(dict.fromkeys(path for path in firsts if path is not None))


def write_images(run_dir: str | Path, fmt: str = "png") -> list[Path]:
    """The key figures of `run_dir` and its learning curves (`curves.jsonl`) as static images in RUN_DIR/images/,
    named after the figures."""
    from .viz.export import export_images

    figures = {path.stem: _load_figure(path) for path in key_figures(run_dir)}
    figures.update(curve_figures(Path(run_dir), _inputs(Path(run_dir))["curves"]))
    if not figures:
        raise ValueError(f"{run_dir} has no figures/*.json or curves.jsonl to export")
    out = check_output_dir(Path(run_dir) / "images", "images directory")
    return export_images(figures, out, fmt)
