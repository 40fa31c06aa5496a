"""`aspan report`: one offline page with plotly.js and circuitsvis inlined once, every figure, view and table."""
import html
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from plotly.offline import get_plotlyjs

from aspan import viz
from aspan.cli import main
from aspan.report import build_report, write_report


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    (d / "run.json").write_text(json.dumps({"command": "aspan demo --quick", "seed": 3, "task": {"name": "reversal"}}))
    (d / "summary.json").write_text(
        json.dumps({"id_exact": 0.97, "tables": {"headline": [{"split": "ood", "partial": 0.26}]}})
    )
    pd.DataFrame({"layer": [1, 0], "head": [3, 5], "score_sum": [12.5, 3.25]}).to_csv(d / "ranking.csv", index=False)
    pd.DataFrame({"sample_id": [0, 1], "correct": [True, False]}).to_json(
        d / "records.jsonl", orient="records", lines=True
    )
    viz.save_figure(
        viz.layer_head_heatmap(torch.rand(2, 4), title="Heads by reference mass"), d / "figures" / "heads.json"
    )
    viz.save_figure(viz.accuracy_vs_length({"b": pd.DataFrame({"length": [11, 12], "partial": [0.7, 0.3]})},
                                           title="OOD accuracy by length"), d / "figures" / "length.json")
    for name in ("id_sample", "ood_sample"):
        viz.save_view(
            viz.head_view(torch.rand(2, 5, 5).tril(), list("<ab=b"), names=["L1H0", "L1H1"]),
            d / "views" / f"{name}.html",
        )
    (d / "views" / "note.html").write_text("<p>hand-written view</p>")
    return d


@pytest.fixture(scope="module")
def page(run_dir):
    return build_report(run_dir)


def test_report_is_self_contained(page):
    assert not re.search(r"""src\s*=\s*["']?(https?:)?//""", page)  # no external scripts, images or frames
    assert not re.search(r"<script[^>]*\bsrc\s*=", page)
    assert "unpkg.com" not in page and "cdn.jsdelivr.net/npm/circuitsvis" not in page
    assert page.count(get_plotlyjs()[:300]) == 1  # plotly.js inlined once
    assert page.count("var CircuitsVis=") == 1  # circuitsvis bundle inlined once for two views


def test_report_contains_every_figure_view_and_table(page):
    for stem, title in (("heads", "Heads by reference mass"), ("length", "OOD accuracy by length")):
        assert title in page and f'id="figure-{stem}"' in page
    assert page.count("Plotly.newPlot(") == 2
    for stem in ("id_sample", "ood_sample", "note"):
        assert f'id="view-{stem}"' in page
    div_ids = re.findall(r'<div id="(circuits-vis-[^"]+)"', page)
    assert len(div_ids) == 2 and all(f'CircuitsVis.render(\n      "{i}"' in page for i in div_ids)
    assert "srcdoc=\"&lt;p&gt;hand-written view&lt;/p&gt;\"" in page
    assert "12.5" in page and "ranking.csv" in page and "records.jsonl" in page
    assert "0.97" in page and "headline" in page and "aspan demo --quick" in page


def test_cli_writes_report(run_dir, page, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_text() == page
    assert write_report(run_dir) == run_dir / "report.html"


def test_missing_or_empty_run_dir_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_report(tmp_path / "nope")
    with pytest.raises(ValueError, match="nothing to report"):
        build_report(tmp_path)
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        build_report(tmp_path)



DEMO_SUMMARY = Path(__file__).resolve().parents[1] / "results" / "causal_demo" / "summary.json"


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    """A run directory with the committed demo summary (results/causal_demo), a run.json and two of its figures."""
    d = tmp_path_factory.mktemp("demo")
    shutil.copy(DEMO_SUMMARY, d / "summary.json")
    (d / "run.json").write_text(json.dumps({"command": "aspan demo --samples 200", "id_params": {"length": [1, 10]},
                                            "ood_params": {"length": [11, 20]}}))
    curve = pd.DataFrame({"length": [9, 10, 11, 12], "partial": [1.0, 1.0, 0.7, 0.3]})
    viz.save_figure(viz.accuracy_vs_length({"baseline": curve}, title="Per-token accuracy by length"),
                    d / "figures" / "08_accuracy_vs_length.json")
    viz.save_figure(viz.layer_head_heatmap(torch.rand(2, 4), title="An extra figure"), d / "figures" / "zz_extra.json")
    return d


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", fragment))


def test_demo_report_opens_with_question_answer_and_headline(demo_dir):
    page = build_report(demo_dir)
    body = page[page.index("<body>"):]
    first_figure, details = body.index('id="figure-'), body.index("<details>")
    top = _text(body[:first_figure])
    assert "Does editing attention on the references fix OOD reversal (trained on lengths 1–10; tested on lengths " \
           "11–20)?" in top
    # the answer is written from the summary's numbers, to 3 significant figures
    assert ("Partly. The edit the selection rule picks raises held-out OOD exact accuracy from 0.00 to 0.435 and "
            "per-token accuracy from 0.271 to 0.954, at an ID cost of 0 pp.") in top
    assert "The paper's recipe reaches 0.0950 exact / 0.895 per-token at an ID cost of 78.0 pp." in top
    table = body[body.index('<table'):body.index("</table>")]
    assert 'id="headline"' in table
    rows = [[_text(c).strip() for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, re.S)]
            for r in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)]
    assert rows[0] == ["condition", "mode", "ID exact", "ID per-token", "OOD exact", "OOD per-token", "ID cost (pp)"]
    assert rows[2] == ["paper's recipe", "teacher-forced", "0.220", "0.968", "0.0950", "0.895", "78.0"]
    assert rows[6] == ["selected (within budget)", "generated (32 samples)", "–", "–", "0.438", "0.913", "–"]
    assert "Selection rule: largest OOD exact gain" in top
    # the claims in order, each before the folded data; the figure a claim names sits in its section
    claims = ["The failure", "Attention on correct vs wrong tokens", "Which heads read the references",
              "The edits and their ID cost", "The causal ranking vs the attention ranking"]
    where = [body.index(f"<h2>{html.escape(c)}</h2>") for c in claims]
    assert where == sorted(where) and where[-1] < details and where[0] < first_figure < where[1]
    assert "Welch t = 34.7, p = 5.06e-173" in _text(body)
    assert body.index('id="figure-zz_extra"') > body.index("<h2>More figures</h2>") > where[-1]
    # no raw JSON outside <details>: every <pre> is inside one
    unfolded = re.sub(r"<details>.*?</details>", "", body, flags=re.S)
    assert "<pre>" not in unfolded and "&quot;spearman_paper_vs_estimate&quot;" in body


def test_report_of_a_broken_demo_summary_is_a_one_line_error(demo_dir, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(demo_dir, broken)
    summary = json.loads((broken / "summary.json").read_text())
    del summary["tables"]["correct_vs_error"]
    (broken / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(broken)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "summary.json" in err and "Traceback" not in err
    assert not (broken / "report.html").exists()


def test_pretrained_report_states_its_finding(tmp_path):
    """The committed SmolLM2 run (results/smollm2_cpu): its question, answer and headline from its own numbers."""
    source = DEMO_SUMMARY.parents[1] / "smollm2_cpu"
    for name in ("summary.json", "run.json"):
        shutil.copy(source / name, tmp_path / name)
    body = _text(build_report(tmp_path))
    summary = json.loads((source / "summary.json").read_text())
    cost = 100 * summary["selected_held_out"]["id_cost"]
    assert ("Does smollm2 fail OOD reversal (trained on lengths 1–10; tested on lengths 11–20), and does reinforcing "
            "attention on the references help?") in body
    assert ("Fine-tuned, smollm2 is exact on 0.156 of ID and 0.00 of OOD samples (per-token 0.179). Partly: "
            "reinforcing the top heads' attention on the references gives OOD exact 0.375, per-token 0.943 on "
            f"held-out samples (ID cost {cost:.1f} pp).") in body
    assert re.search(r"pretrained, 3-shot\s+teacher-forced\s+0\.00\s+0\.209\s+0\.00\s+0\.0663\s+–", body)
    assert f"(Welch t = {summary['welch_t_sample']:.3g}, p = {summary['welch_p_sample']:.3g})" in body


@pytest.mark.parametrize("study, question, answer, row", [
    ("qk_study/steps150", "Does fine-tuning one column (or one RoPE pair) of W_Q and W_K on lengths 11-20 make the "
     "model work at those lengths",
     "No. Fine-tuning the whole model on lengths 11-20 reaches exact accuracy 0.967 there; the best single group "
     "(qk-pair:1, 1.97 % of the parameters) reaches 0.00667 (per-token 0.636), 96.0 pp below.",
     r"all\s+0\.5\s+100\s+0\.987 \[0\.953, 1\.00\]\s+0\.998\s+0\.660 \[0\.00, 1\.00\]\s+0\.957"
     r"\s+0\.00 \[0\.00, 0\.0250\]\s+0\.573\s+1\.33"),
    ("qk_study/steps50", "W_Q and W_K on lengths 11-20",
     "Full fine-tuning gains only 2.00 pp of exact accuracy, too little to tell the groups apart.",
     r"qk-pair:1\s+0\s+1\.97\s+0\.0933 \[0\.00, 0\.218\]"),
    ("abc_study", "Do models trained on up to 6 digits extrapolate to 60 digits once their attention is biased",
     "Partly. Exact accuracy at 60 digits: successor: vanilla at most 0.00, ABS 0.897, ABC 0.820; addition: vanilla "
     "at most 0.00, ABS 0.577, ABC 0.00; parity: vanilla at most 0.00, ABS 1.00, ABC 0.333.",
     r"parity\s+abc\s+3\s+0\.853 \[0\.524, 1\.000\]\s+0\.630 \[0\.000, 1\.000\]\s+0\.487 \[0\.000, 1\.000\]"
     r"\s+0\.333 \[0\.000, 1\.000\]"),
    ("parity_study", "Does the scratchpad's format decide length generalization on parity",
     "No. Exact accuracy at 5x the training length: plain 0.500, scratchpad 0.00, interleaved 0.00, interleaved-ab "
     "0.00, mnemonic 0.00",
     r"mnemonic\s+0\.00 \[0\.00, 0\.299\](\s+0\.00 \[0\.00, 0\.00636\]){3}\s+0\.722\s+0\.241\s+0\.221\s+0\.210"),
])
def test_study_report_states_its_finding(study, question, answer, row, tmp_path):
    """Each committed study's summary and run.json give the question, the answer and the headline rows."""
    source = DEMO_SUMMARY.parents[1] / study
    for name in ("summary.json", "run.json"):
        shutil.copy(source / name, tmp_path / name)
    page = build_report(tmp_path)
    top = _text(page[page.index("<body>"):page.index("<details>")])
    assert question in top and answer in top
    start = page.index('id="headline"')
    assert re.search(row, _text(page[start:page.index("</table>", start)]))


RESULTS = DEMO_SUMMARY.parents[1]
IMAGE_LINK = re.compile(r"!\[[^\]]+\]\(([^)\s]+\.(?:png|svg))\)")


def test_results_readmes_show_the_key_figures_of_their_runs():
    """Each committed results README shows, as images beside its tables, the key figures (`key_figures`) of the run
    directories it links images of, exported from their figures/*.json; a few hundred KB per study at most; and
    names the command that regenerates them."""
    from aspan.report import key_figures

    readmes = sorted(RESULTS.glob("**/README.md"))
    assert RESULTS / "qk_study" / "spectrum" / "README.md" in readmes  # a run's own README counts too
    for readme in readmes:
        text = readme.read_text(encoding="utf-8")
        links = [readme.parent / link for link in IMAGE_LINK.findall(text)]
        if not any(readme.parent.glob("**/figures/*.json")):
            assert not links, readme
            continue
        assert links, f"{readme} shows no figure"
        assert all(p.is_file() for p in links), [str(p) for p in links if not p.is_file()]
        runs = {p.parent.parent for p in links}
        for run in runs:
            expect = {p.stem for p in key_figures(run)}
            shown = {p.stem for p in links if p.parent.parent == run}
            assert shown == expect, (run, shown, expect)
            assert {p.stem for p in (run / "images").iterdir()} == expect, f"stale images in {run / 'images'}"
            assert f"aspan report {run.relative_to(RESULTS.parent)} --images png" in text, run
        assert sum(p.stat().st_size for p in links) <= 400_000, readme


# ------------------------------------------------------------------------------ names taken from files
HOSTILE = ['"><img src=x onerror=alert(1)>', "'><script>alert(1)</script>", "a\"b'c<d>e&f\\g", "</script><b>",
           "javascript:alert(1)", "x onmouseover=alert(1)"]


class _Elements(__import__("html.parser").parser.HTMLParser):
    """Every start tag of a page with its attributes, as a browser's parser sees them."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _elements(page: str) -> list[tuple[str, dict]]:
    parser = _Elements()
    parser.feed(page)
    return parser.tags


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40))
def test_html_id_keeps_only_safe_characters_and_never_merges_two_names(a, b):
    from aspan.report import escape, html_id

    assert re.fullmatch(r"[A-Za-z0-9_-]*", html_id(a))
    assert (html_id(a) == html_id(b)) == (a == b)
    assert html.unescape(escape(a)) == a and not set(escape(a)) & set("<>\"'")
    if re.fullmatch(r"\w*", a, re.ASCII):
        assert html_id(a) == a  # ordinary stems keep their ids (links to #figure-08_accuracy_vs_length hold)


def test_hostile_figure_view_and_table_names_stay_text(tmp_path):
    """A figure file, a view file and a table named with markup: in the page each name is an id of safe characters
    or escaped text; no element gets an event handler, no image or extra script appears."""
    run = tmp_path / "run"
    fig = viz.layer_head_heatmap(torch.rand(2, 2), title="t")
    for name in HOSTILE:
        viz.save_figure(fig, run / "figures" / f"{name.replace('/', '_')}.json")
        (run / "views").mkdir(exist_ok=True)
        (run / "views" / f"{name.replace('/', '_')}.html").write_text("<p>view</p>")
    pd.DataFrame({HOSTILE[0]: [HOSTILE[1]]}).to_csv(run / "t.csv", index=False)
    page = build_report(run)
    tags = _elements(page)
    assert not [(t, a) for t, a in tags if any(k.startswith("on") for k in a)]
    assert [t for t, _ in tags].count("img") == 0
    assert [t for t, _ in tags].count("script") == 1 + len(HOSTILE)  # plotly.js, then one call per figure
    from aspan.report import html_id

    ids = {a.get("id") for _, a in tags}
    for name in HOSTILE:
        stem = name.replace("/", "_")
        assert {html_id(stem), f"figure-{html_id(stem)}", f"view-{html_id(stem)}"} <= ids
        assert f"document.getElementById(\"figure-{html_id(stem)}\")" in page


def test_the_anatomy_of_a_failure_has_its_own_section(tmp_path):
    """A run that kept an anatomy (`aspan.anatomy.record`): its section holds the sample, the causes before and after
    the edit, the table, its figure and its view (shown there only), all text escaped; a broken file is one error
    naming it."""
    import hooks
    from aspan.anatomy import NamedEdit, explain
    from aspan.anatomy.record import remove_anatomy, write_anatomy
    from tests.anatomy.scripted import READER, Scripted, one_hot_rows
    from tests.anatomy.test_explain import T, reader_keys, sample

    s = Scripted(delta=1)
    s.scripts[READER] = one_hot_rows(T, reader_keys({j: {8 - j: 1.0} for j in (3, 4, 5)}))
    patch = NamedEdit(lambda b: hooks.patch_pattern([READER], b.ref_mask, delta=1), "patch <b>back</b>")
    anatomy = explain(s.model, s.tok, sample(), heads=[READER], delta=1, fwd_hooks=patch)
    run = tmp_path / "run"
    write_anatomy(run, anatomy, context='The <script>alert("x")</script> sample.')
    viz.save_figure(viz.accuracy_vs_length({"b": pd.DataFrame({"length": [1, 2], "partial": [0.5, 0.2]})},
                                           title="another figure"), run / "figures" / "other.json")
    page = build_report(run)
    section = page[page.index('<h2 id="anatomy-of-a-failure">'):page.index("<h2>Figures</h2>")]
    assert anatomy.causes[0] in html.unescape(section) and "from token 3 on" in section
    assert "the edit fixes 3 of the 3 wrong tokens" in html.unescape(section)
    assert "After patch &lt;b&gt;back&lt;/b&gt;" in section and "&lt;script&gt;" in section
    assert "<script>alert" not in page
    assert 'id="figure-anatomy"' in section and 'id="view-anatomy"' in section and "CircuitsVis.render(" in section
    assert page.count('id="figure-anatomy"') == 1 and "Attention views" not in page and 'id="figure-other"' in page
    assert section.count("</tr>") == 1 + len(anatomy.tokens)  # the header and one row per output token
    (run / "anatomy.json").write_text(json.dumps({"header": ["no table"]}))
    with pytest.raises(ValueError, match=r"anatomy.json: not an anatomy"):
        build_report(run)
    remove_anatomy(run)
    assert "Anatomy of a failure" not in build_report(run) and not (run / "views" / "anatomy.html").exists()
