"""The report opens on its key charts, groups its warnings and shows nothing of the author's file system (issue
18, item 7). The browser check that a chart is on the first screen is tests/unit/test_compare_browser.py.

* Order: title, one line of context, the findings section (trackbridge doctor's, per run, linked to the charts), the
  key charts, then the warnings, the runs, the metrics of one run, the contents and the other metrics.
* Warnings: one ``<details>`` per kind with its count; every warning the command printed is in the HTML in full.
* Chart footnotes (the PNG) are short and whole: no text is cut with an ellipsis; the full reasons are in the HTML.
* No absolute path: not the report folder, not the checkout, not the home folder, not any ``/...`` path outside
  the embedded images; every link is relative and points at a file in the report folder (or an anchor).
"""
from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pytest

from trackbridge.compare import WARNING_GROUPS, compare_runs
from trackbridge.compare.cells import _ABS_PATH, _Paths, footnote, key_metrics
from trackbridge.compare.report import write_report

from _support import ROOT

GRPO = f"grpo=trainer-state:{ROOT / 'examples' / 'trl_grpo_trainer_state.json'}"
VERL = f"verl=console:{ROOT / 'examples' / 'verl_console.log'}"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("layout") / "report"
    return compare_runs([GRPO, VERL], out=out)


def _text(report) -> str:
    return report.html.read_text(encoding="utf-8")


def _no_images(text: str) -> str:
    return re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:", text)


def test_the_report_opens_on_its_key_charts(report):
    text = _text(report)
    key = key_metrics(report)
    assert len(key) == 4 and all(len(m.runs) == 2 for m in key), [m.name for m in key]
    first_img = text.index("<img")
    for marker in ('id="warnings"', 'id="runs"', 'id="only-one"', 'id="contents"'):
        assert first_img < text.index(marker), marker
    # the key charts are the first sections, and each metric has one section only
    sections = re.findall(r'<section class="metric" id="([^"]+)"', text)
    assert len(sections) == len(report.metrics) == len(set(sections))
    from trackbridge.compare import slug
    assert sections[:4] == [f"m-{slug(m.name)}" for m in key]
    assert text.index("<!-- findings") < text.index('<section id="findings">') < text.index('id="key"')


def test_the_findings_section_sits_above_the_charts(report, tmp_path):
    # the examples' real symptoms (tests/unit/test_doctor_quiet.py): grpo's groups mostly give no learning signal,
    # so its reward does not improve; verl's MFU is under 30%; each finding links to its chart, which the report has
    assert [(f.run, f.id) for f in report.findings] == [("grpo", "no-learning-signal"),
                                                        ("grpo", "reward-not-improving"), ("grpo", "kl-near-zero"),
                                                        ("verl", "mfu-low")]
    text = report.html.read_text()
    assert text.index('<section id="findings">') < text.index('id="key"') < text.index("<img")
    section = text[text.index('<section id="findings">'):text.index('id="key"')]
    links = re.findall(r'href="#(m-[^"]+)"', section)
    assert links == ["m-reward_group_zero_std_frac", "m-reward_score_mean", "m-reward_score_mean", "m-kl_ref_k3",
                     "m-reward_score_mean", "m-perf_mfu_policy_update"]
    for anchor in links:
        assert f'<section class="metric" id="{anchor}">' in text
    # no findings at all: no section, the comment stays
    res = compare_runs([GRPO, VERL], metrics="stability", out=None, doctor=False)
    res.out = tmp_path / "without-findings"
    from trackbridge.compare.align import run_axis
    write_report(res, {r.label: run_axis(r, res.x) for r in res.runs})
    text = res.html.read_text()
    assert "<!-- findings" in text and 'id="findings"' not in text


def test_warnings_are_grouped_counted_and_whole(report):
    text = _text(report)
    groups = {g: items for g, items in report.warning_groups.items() if items}
    assert sum(len(v) for v in groups.values()) == len(report.warnings)
    assert set(groups) <= set(WARNING_GROUPS)
    summaries = re.findall(r'<details class="warngroup"><summary><b>([^<]+)</b>: (\d+)</summary>', text)
    assert [(html.unescape(label), int(n)) for label, n in summaries] == [
        (WARNING_GROUPS[g], len(groups[g])) for g in WARNING_GROUPS if g in groups]
    assert len(summaries) >= 2, summaries
    plain = html.unescape(re.sub(r"<[^>]+>", "", _no_images(text)))
    paths = _Paths(report.out)
    for w in report.warnings:                  # in full, with its paths as the report shows them (relative)
        assert paths.text(w) in plain, w


def test_chart_footnotes_are_short_and_whole(report):
    flagged = [m for m in report.metrics if m.warning]
    assert flagged
    for mr in flagged:
        note = footnote(mr)
        assert note and note.endswith("Reasons: report.html, summary.md.") and "..." not in note, note
        assert len(note) <= 480, (mr.name, len(note))       # four lines of the chart at most
        for label in mr.approximate:
            assert label in note
    exact = [m for m in report.metrics if not m.warning]
    assert exact and all(footnote(m) is None for m in exact)


def test_no_absolute_path_anywhere(report):
    text = _no_images(_text(report))
    md = report.summary_md.read_text()
    home = str(Path.home())
    shown = html.unescape(re.sub(r"<[^>]+>", " ", text))             # what a reader sees
    attrs = " ".join(html.unescape(v) for v in re.findall(r'(?:href|src|title|alt|content)="([^"]*)"', text))
    for doc in (text, shown, attrs, md):
        assert str(ROOT) not in doc and str(report.out.resolve()) not in doc and str(report.out) not in doc
        if len(Path(home).parts) > 1:
            assert home not in doc
    for doc in (shown, attrs, md):
        assert not _ABS_PATH.findall(doc), _ABS_PATH.findall(doc)[:5]
    # the locators are shown relative to where the command ran, or by their last parts
    assert "trainer-state:" in text and "trl_grpo_trainer_state.json" in text


def test_links_are_relative_and_point_into_the_report_folder(report):
    text = _no_images(_text(report))
    hrefs = re.findall(r'href="([^"]*)"', text)
    files = [h for h in hrefs if not h.startswith("#")]
    assert files, "no link to the report's files"
    for h in files:
        assert not h.startswith(("/", "file:", "http:", "https:")) and ".." not in h, h
        assert (report.out / h).is_file(), h
    charts = [h for h in files if h.startswith("charts/")]
    assert len(charts) == len(report.metrics)
    anchors = set(re.findall(r'id="([^"]+)"', text))
    for h in hrefs:
        if h.startswith("#"):
            assert h[1:] in anchors, h


def test_paths_outside_the_report_and_the_working_folder_show_their_last_parts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = _Paths(tmp_path / "out")
    assert paths.text("see /srv/data/runs/exp1/trainer_state.json:3") == \
        "see \u2026/exp1/trainer_state.json:3"
    assert paths.text(f"mlflow:sqlite:///{tmp_path}/stores/m.db?experiment=x") == "mlflow:sqlite:///stores/m.db?experiment=x"
    assert paths.text(f"{tmp_path}/out/charts/001_a.png") == "charts/001_a.png"
    assert paths.text("kl/ref/k3 and tokens/s, 1/2, a / b") == "kl/ref/k3 and tokens/s, 1/2, a / b"
    assert paths.text("console:/srv/x/y/verl.log and http://127.0.0.1:5000/api, sqlite:///rel.db") == \
        "console:\u2026/y/verl.log and http://127.0.0.1:5000/api, sqlite:///rel.db"
    assert os.sep == "/"
