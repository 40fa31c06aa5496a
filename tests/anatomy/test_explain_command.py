"""`aspan explain`: the table and the likely cause printed, the run directory and its page written, the edit file read
(with or without heads), clear one-line errors before the model loads."""
from __future__ import annotations

import json

import pytest

from aspan import cli
from aspan.applications.explain import ExplainRun, read_edit

from ..cli import one_line

EDIT = 'method = "reinforce"\nstrength = 4.0\ndelta = 2\n'


def test_the_table_the_causes_and_the_page(tmp_path, capsys):
    edit = tmp_path / "edit.toml"
    edit.write_text(EDIT)  # no heads: the edit goes on the heads the anatomy follows
    out = tmp_path / "run"
    argv = ["explain", "reversal", "--task", "reversal", "--seed", "2", "--param", "length=11-14", "--heads",
            "1.7,1.0", "--delta", "2", "--edit", str(edit), "--out", str(out), "--device", "cpu"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    for text in ("L1H7 mass", "L1H0 offset_after", "predicted_after", "heads: L1H7, L1H0 (given)",
                 "after reinforce C=4 at ref+2", f"page: {out / 'report.html'}"):
        assert text in printed, text
    run = json.loads((out / "run.json").read_text())
    assert run["command"] == "explain" and run["heads"] == [[1, 7], [1, 0]] and run["delta"] == 2
    assert run["edit"]["heads"] == [] and run["edit"]["label"] == "reinforce C=4 at ref+2"
    anatomy = json.loads((out / "anatomy.json").read_text())
    assert anatomy["edit"] == "reinforce C=4 at ref+2" and anatomy["heads"] == ["L1H7", "L1H0"]
    assert len(anatomy["table"]) == len(anatomy["sample"]["text"]) - anatomy["sample"]["prompt_len"] + 1
    assert {"L1H7 mass", "L1H7 mass_after", "margin", "margin_after"} <= set(anatomy["table"][0])
    page = (out / "report.html").read_text()
    assert '<h2 id="anatomy-of-a-failure">Anatomy of a failure</h2>' in page and 'id="figure-anatomy"' in page
    assert 'id="view-anatomy"' in page and "unpkg.com" not in page and 'src="http' not in page
    assert page.count("var CircuitsVis=") == 1 and "More figures" not in page and "Attention views" not in page


def test_failing_picks_the_first_wrong_sample_and_the_ranking_picks_heads(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["explain", "reversal", "--task", "reversal", "--failing", "--param", "length=11-14",
                     "--out", str(out), "-o", str(tmp_path / "page.html")]) == 0
    printed = capsys.readouterr().out
    assert "answer: wrong" in printed and "by the ranking on 64 ID samples" in printed and "likely cause:" in printed
    assert (tmp_path / "page.html").exists() and not (out / "report.html").exists()
    run = json.loads((out / "run.json").read_text())
    assert run["failing"] and run["heads"] == [[1, 7], [1, 0]] and run["delta"] == 2


def test_id_samples_the_model_solves_have_no_failure(tmp_path, capsys):
    assert cli.main(["explain", "reversal", "--task", "reversal", "--split", "id", "--failing", "--heads", "1.7",
                     "--out", str(tmp_path / "run")]) == 2
    one_line(capsys.readouterr().err, "--failing", "no failure to explain")


@pytest.mark.parametrize("text, words", [
    ('method = "reinforce"\nstrength = -1.0\n', ["bad.toml", "strength must be >= 0"]),
    ('method = "reinforce"\nstrenght = 1.0\n', ["bad.toml", "unknown key 'strenght'"]),
    ('method = "nope"\n', ["bad.toml", "nope"]),
    ("method = [", ["bad.toml"]),
])
def test_a_bad_edit_file_is_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch, text, words):
    import aspan.applications.explain as app

    monkeypatch.setattr(app, "model_and_task", lambda cfg: pytest.fail("the model loaded"))
    (tmp_path / "bad.toml").write_text(text)
    assert cli.main(["explain", "reversal", "--task", "reversal", "--edit", str(tmp_path / "bad.toml"),
                     "--out", str(tmp_path / "run")]) == 2
    one_line(capsys.readouterr().err, *words)


def test_the_shipped_edit_file_is_the_readme_edit():
    from aspan.experiments.edit import Edit

    from ..cli import ROOT

    edit = read_edit(str(ROOT / "configs" / "edit_reversal_ref2.toml"))
    assert edit == Edit("reinforce", delta=2, strength=4.0, heads=((1, 7), (1, 0)))


def test_print_config_and_errors(tmp_path, capsys):
    assert cli.main(["explain", "reversal", "--seed", "3", "--heads", "1.7", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert 'checkpoint = "reversal"' in printed and "seed = 3" in printed and 'heads = "1.7"' in printed
    (tmp_path / "c.toml").write_text(printed)
    assert cli.main(["explain", "--config", str(tmp_path / "c.toml"), "--print-config"]) == 0
    assert capsys.readouterr().out == printed
    assert cli.main(["explain"]) == 2
    one_line(capsys.readouterr().err, "MODEL is required")
    assert cli.main(["explain", "reversal", "--task", "reversal", "--heads", "5.0", "--out", str(tmp_path / "r")]) == 2
    one_line(capsys.readouterr().err, "layer 5 out of range")
    assert ExplainRun("x").split == "ood"
