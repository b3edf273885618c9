"""`trackbridge compare` on REAL runs: a TRL GRPO run against a veRL run (both from the public logs in tests/data).

* examples/trl_grpo_trainer_state.json is public-log 05_trl_grpo.json (TRL GRPOTrainer, trainer_state.json);
* examples/verl_console.log holds the first 200 step lines of public-log 01_verl.json (veRL console logger).

The expected numbers are computed here by hand from the source files (the JSON's log_history, the console lines
parsed with a regular expression), never through trackbridge's readers or pipeline.

Canonical names this test relies on (a missing one fails with a message naming it):
reward/score/mean, policy/entropy, response/length/mean, optim/lr, optim/grad_norm, time/step, kl/ref/k3,
kl/old_policy/k1.
"""
from __future__ import annotations

import csv
import html
import json
import math
import re
from pathlib import Path

import pytest

from trackbridge.compare import compare_runs
from trackbridge.compare.align import run_axis, smooth
from trackbridge.compare.plot import COLORS, PNG_SIZE
from trackbridge.compare.presets import PRESETS, select
from trackbridge.pipeline import Pipeline
from trackbridge.trackers import open_source

from _support import ROOT
from _support.unproven import only_unproven

GRPO_FILE = ROOT / "examples" / "trl_grpo_trainer_state.json"
VERL_FILE = ROOT / "examples" / "verl_console.log"
GRPO = f"grpo=trainer-state:{GRPO_FILE}"
VERL = f"verl=console:{VERL_FILE}"
# a recent veRL run (the console lines pasted in verl issue 7412, tests/data/real/verl/SOURCES.yaml): its
# perf/mfu/actor_infer states the canonical reduction but no proof can run it (a device throughput reading)
V7 = f"v7=console:{ROOT / 'tests' / 'data' / 'real' / 'verl' / '07_issue7412_new.log'}"

# canonical name -> (GRPO key, veRL key): the quantities both frameworks log, as each framework names them
SHARED = {
    "reward/score/mean": ("reward", "critic/score/mean"),
    "policy/entropy": ("entropy", "actor/entropy_loss"),
    "response/length/mean": ("completions/mean_length", "response_length/mean"),
    "optim/lr": ("learning_rate", "actor/lr"),
    "optim/grad_norm": ("grad_norm", "actor/grad_norm"),
    "time/step": ("step_time", "timing_s/step"),
}
GRPO_KL = ("kl", "kl/ref/k3")                     # KL to the reference model
VERL_KL = ("actor/ppo_kl", "kl/old_policy/k1")    # KL between old (rollout) and current policy

WARN_RGB = (0x8A, 0x1C, 0x00)                  # colour of the on-chart warning text (plot.py)


# ------------------------------------------------------------------------------------------------ raw sources
def grpo_rows() -> list[dict]:
    return json.loads(GRPO_FILE.read_text())["log_history"]


_STEP_LINE = re.compile(r"step:(\d+) - (.*)$")


def verl_rows() -> list[dict]:
    """The console log parsed by hand: `step:N - key:value - key:value ...` (ANSI prefix ignored)."""
    rows = []
    for line in VERL_FILE.read_text(encoding="utf-8").splitlines():
        m = _STEP_LINE.search(line)
        if not m:
            continue
        row = {"step": int(m.group(1))}
        for part in m.group(2).split(" - "):
            k, _, v = part.rpartition(":")
            row[k.strip()] = float(v)
        rows.append(row)
    return rows


def by_hand(rows: list[dict], key: str) -> dict:
    vals = [float(r[key]) for r in rows if key in r]
    assert vals, f"{key} is not in the source file"
    fin = [v for v in vals if math.isfinite(v)]
    return {"first": vals[0], "last": vals[-1], "min": min(fin), "max": max(fin), "mean": math.fsum(fin) / len(fin),
            "points": len(vals)}


def read_csv(path: Path) -> dict[tuple[str, str], dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return {(r["metric"], r["run"]): r for r in rows}


def pipeline_approximate(locator: str, source: str = "auto") -> dict[str, str]:
    """What the mappings say is approximate for this run (the pipeline's own bookkeeping, read independently)."""
    out: dict[str, str] = {}
    for reader in open_source(locator).runs():
        pipe = Pipeline(source, "canonical", config=reader.info.config, derive=True)
        for _ in pipe.process(reader.records()):
            pass
        out.update(pipe.stats.approximate)
    return out


def png(path: Path):
    import matplotlib.image as mpimg
    img = mpimg.imread(str(path))
    return img[..., :3] if img.ndim == 3 else img


def color_pixels(img, rgb, tol=0.08) -> int:
    import numpy as np
    target = np.array(rgb, dtype=float) / 255.0
    return int((np.abs(img - target).max(axis=-1) < tol).sum())


def hex_rgb(h: str) -> tuple[int, int, int]:
    return tuple(int(h[i:i + 2], 16) for i in (1, 3, 5))


def section(html_text: str, metric: str) -> str:
    from trackbridge.compare import slug
    m = re.search(r'<section class="metric" id="m-%s">(.*?)</section>' % re.escape(slug(metric)), html_text, re.S)
    assert m, f"no section for {metric} in report.html"
    return m.group(1)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "report"
    return compare_runs([GRPO, VERL], out=out)


# ------------------------------------------------------------------------------------------------ tests
def test_sources_are_the_public_logs(shared_reference):
    """The example files hold exactly the public logs' rows (05_trl_grpo, first 200 rows of 01_verl)."""
    pub = Path(shared_reference) / "public-logs"
    g = json.loads((pub / "05_trl_grpo.json").read_text())["rows"]
    assert grpo_rows() == g
    v = json.loads((pub / "01_verl.json").read_text())["rows"][:200]
    mine = verl_rows()
    assert len(mine) == 200
    for a, b in zip(mine, v):
        assert a == {k: (int(x) if k == "step" else float(x)) for k, x in b.items()}


def test_outputs_exist(report):
    assert report.html.is_file() and report.html.name == "report.html"
    assert report.summary_csv.is_file() and report.summary_md.is_file()
    assert report.pngs and all(p.is_file() and p.suffix == ".png" for p in report.pngs)
    assert len(report.pngs) == len(report.metrics)
    labels = [r.label for r in report.runs]
    assert labels == ["grpo", "verl"]
    assert report.runs[0].source.startswith("trl"), report.runs[0].source
    assert report.runs[1].source.startswith("verl"), report.runs[1].source


@pytest.mark.parametrize("metric", list(SHARED))
def test_shared_metrics_in_both_runs(report, metric):
    mr = report.metric(metric)
    assert mr is not None, (f"canonical metric {metric} is in neither run: is the name still in mappings/ "
                            f"(GRPO key {SHARED[metric][0]!r}, veRL key {SHARED[metric][1]!r})?")
    assert mr.runs == ["grpo", "verl"], f"{metric} should be in both runs, is in {mr.runs}"
    assert metric not in report.only_one_run


@pytest.mark.parametrize("metric", list(SHARED))
def test_summary_numbers_equal_hand_computed(report, metric):
    table = read_csv(report.summary_csv)
    for label, rows, key in (("grpo", grpo_rows(), SHARED[metric][0]), ("verl", verl_rows(), SHARED[metric][1])):
        row = table.get((metric, label))
        assert row is not None, f"summary.csv has no row for {metric} / {label}"
        want = by_hand(rows, key)
        for col in ("first", "last", "min", "max"):
            assert float(row[col]) == want[col], (metric, label, col, row[col], want[col])
        assert float(row["mean"]) == pytest.approx(want["mean"], rel=1e-12, abs=0), (metric, label)
        assert int(row["points"]) == want["points"]


def test_summary_md_has_the_same_rows(report):
    table = read_csv(report.summary_csv)
    md = report.summary_md.read_text()
    header = "| metric | run | first | last | min | max | mean | points | note |"
    assert header in md
    md_rows = [ln for ln in md.splitlines() if ln.startswith("| `")]
    assert len(md_rows) == len(table)
    for (metric, label), row in table.items():
        assert any(ln.startswith(f"| `{metric}` | {label} | ") and f"| {row['points']} |" in ln for ln in md_rows), \
            (metric, label)


def test_kl_to_reference_and_ppo_kl_are_not_one_chart(report):
    ref, old = report.metric(GRPO_KL[1]), report.metric(VERL_KL[1])
    assert ref is not None, f"GRPO's {GRPO_KL[0]!r} did not become {GRPO_KL[1]}"
    assert old is not None, f"veRL's {VERL_KL[0]!r} did not become {VERL_KL[1]}"
    assert ref.runs == ["grpo"] and old.runs == ["verl"]
    assert ref.chart != old.chart
    # no chart holds both: no metric is in both runs with one KL name each
    for mr in report.metrics:
        if mr.name.startswith("kl/"):
            assert len(mr.runs) == 1, mr
    # the numbers are the sources' own, each under its own name
    table = read_csv(report.summary_csv)
    assert float(table[("kl/ref/k3", "grpo")]["mean"]) == pytest.approx(by_hand(grpo_rows(), "kl")["mean"], rel=1e-12)
    assert float(table[("kl/old_policy/k1", "verl")]["mean"]) == pytest.approx(
        by_hand(verl_rows(), "actor/ppo_kl")["mean"], rel=1e-12)
    # and the report says plainly that they only look alike
    text = html.unescape(report.html.read_text())
    for name in ("kl/ref/k3", "kl/old_policy/k1"):
        assert "a different quantity" in section(text, name)
    assert "kl/ref/k3" in report.only_one_run and "kl/old_policy/k1" in report.only_one_run
    # each chart shows only its own run's colour
    assert color_pixels(png(ref.chart), hex_rgb(COLORS[1])) == 0
    assert color_pixels(png(old.chart), hex_rgb(COLORS[0])) == 0


def test_approximate_warning_where_it_should(report):
    expected = {"grpo": pipeline_approximate(GRPO.split("=", 1)[1]),
                "verl": pipeline_approximate(VERL.split("=", 1)[1])}
    table = read_csv(report.summary_csv)
    text = html.unescape(report.html.read_text())
    md = report.summary_md.read_text()
    warned_shared = []
    for mr in report.metrics:
        want = {lbl: why for lbl, approx in expected.items() if lbl in mr.runs for n, why in approx.items()
                if n == mr.name}
        assert mr.approximate == want, mr.name
        sec = section(text, mr.name)
        img = png(mr.chart)
        bottom = img[int(img.shape[0] * 0.85):]
        if want:
            assert mr.warning, mr.name
            assert 'class="warn"' in sec, f"{mr.name}: no warning next to the metric in report.html"
            for label, why in want.items():
                reason = why.split(": ", 1)[-1].split(" [")[0]
                assert reason in table[(mr.name, label)]["note"], (mr.name, label)     # the CSV row: in full
                if only_unproven(why):
                    continue                    # said by the section's "not yet proven" sentence (below)
                # said once at the chart and in summary.md's warnings, never again in the tables' notes
                assert sec.count(reason) == 1, (mr.name, label, sec.count(reason))
                assert reason in md and not [row for row in md.splitlines() if row.startswith("| `") and reason in row]
            assert color_pixels(bottom, WARN_RGB, tol=0.15) > 50, f"{mr.name}: no warning on the chart"
            if len(mr.runs) > 1 and not all(only_unproven(w) for w in want.values()):
                assert "Not the same quantity in every run" in sec
                warned_shared.append(mr.name)
            if any(only_unproven(w) for w in want.values()):    # equal as stated, no proof ran that key yet
                assert "not yet proven by running the framework" in sec, mr.name
        elif not mr.look_alikes:
            assert mr.warning is None and 'class="warn"' not in sec, mr.name
            assert color_pixels(bottom, WARN_RGB, tol=0.15) == 0, f"{mr.name}: warning drawn on an exact metric"
            for label in mr.runs:
                assert "approximate" not in table[(mr.name, label)]["note"]
    assert warned_shared, "no metric of both runs is flagged approximate (veRL's response_length/clip_ratio is)"
    # exact in both frameworks: no warning
    # veRL's grad norm is the mean of its optimizer steps' norms (4 under veRL's default config): flagged, with why
    assert "4 mini-batches" in (report.metric("optim/grad_norm").warning or "")
    # GRPO leaves tool-result tokens out of its completion lengths, veRL counts them (issue 20): warned
    assert "tool-output tokens" in (report.metric("response/length/mean").warning or ""), \
        report.metric("response/length/mean").warning


def test_pngs_are_real_plots(report):
    import numpy as np
    w, h = PNG_SIZE
    for mr in report.metrics:
        img = png(mr.chart)
        assert img.shape[:2] == (h, w), (mr.name, img.shape)
        assert float(np.std(img)) > 0.02, f"{mr.name}: blank image"
        non_white = float((img.min(axis=-1) < 0.9).mean())
        assert non_white > 0.01, f"{mr.name}: almost blank ({non_white:.4f})"
    # shared metrics: both runs drawn, each in its own colour (all runs overlaid)
    for name in SHARED:
        img = png(report.metric(name).chart)
        for i in (0, 1):
            assert color_pixels(img, hex_rgb(COLORS[i])) > 30, (name, i)


def test_html_is_self_contained(report):
    text = report.html.read_text()
    assert "<script" not in text.lower() and "<link" not in text.lower() and "@import" not in text
    assert not re.search(r'(src|href)\s*=\s*"(https?:|//)', text)
    assert "url(" not in text
    imgs = re.findall(r'<img [^>]*src="([^"]+)"', text)
    assert len(imgs) == len(report.metrics)
    assert all(s.startswith("data:image/png;base64,") for s in imgs)
    assert "Content-Security-Policy" in text
    # runs' sources and detected frameworks, metrics in only one run
    for r in report.runs:           # the locator as the report shows it: no absolute path (test_report_layout.py)
        kind, _, where = r.locator.partition(":")
        assert html.escape(r.source) in text and f"<code>{kind}:" in text and Path(where).name in text
        assert where not in text
    assert "Metrics in only one run" in text
    from trackbridge.compare import slug
    for name in report.only_one_run:
        assert f'href="#m-{slug(name)}"' in text and html.escape(name) in text


def test_time_axis_leaves_out_runs_without_wall_times(tmp_path):
    res = compare_runs([GRPO, VERL], metrics=["optim/grad_norm"], x="time", out=tmp_path / "r")
    assert not any(r.has_wall_time for r in res.runs)
    notes = [w for w in res.warnings if "no wall times" in w]
    assert len(notes) == 2
    mr = res.metric("optim/grad_norm")
    assert len(mr.axis_notes) == 2
    text = html.unescape(res.html.read_text())
    assert "no time was made up" in text
    # the table still holds the statistics (they do not depend on the x axis)
    assert {st.run for st in mr.stats} == {"grpo", "verl"}


def test_tokens_axis(tmp_path):
    res = compare_runs([GRPO, VERL], metrics="policy/entropy", x="tokens", out=tmp_path / "r")
    g, v = res.runs
    gx = run_axis(g, "tokens")
    # GRPO logs the cumulative counter num_tokens (progress/tokens): the x values are those
    assert gx.available and gx.values == [float(r["num_tokens"]) for r in grpo_rows()]
    # veRL logs the tokens of each step; the running sum is used and the report says from where
    vx = run_axis(v, "tokens")
    assert vx.available and "running sum" in vx.note and "101" in vx.note
    totals = [r["perf/total_num_tokens"] for r in verl_rows()]
    assert vx.values[0] == totals[0] and vx.values[-1] == pytest.approx(sum(totals))
    assert any("running sum" in w for w in res.warnings)


def test_samples_axis_missing_is_said(tmp_path):
    res = compare_runs([GRPO], metrics="policy/entropy", x="samples", out=tmp_path / "r")
    assert any("progress/samples" in w for w in res.warnings)


def test_smoothing():
    assert smooth([1, 2, 3], 0) == [1, 2, 3]
    assert smooth([0, 3, 6, 9], 3, "mean") == [0, 1.5, 3, 6]
    ema = smooth([0.0, 10.0, 10.0], 3)                 # alpha = 0.5
    assert ema == [0.0, 5.0, 7.5]
    out = smooth([1.0, float("nan"), 3.0], 3)
    assert math.isnan(out[1]) and out[2] == 2.0


def test_smoothed_report_keeps_raw_statistics(tmp_path, report):
    res = compare_runs([GRPO, VERL], metrics="effectiveness", smooth=10, out=tmp_path / "r")
    a, b = read_csv(res.summary_csv), read_csv(report.summary_csv)
    for key, row in a.items():
        assert row == b[key]


def test_presets(report):
    avail = [m.name for m in report.metrics]
    eff, _ = select("effectiveness", avail)
    assert eff[0].startswith("val/"), eff              # validation accuracy first
    assert "reward/score/mean" in eff
    stab, _ = select("stability", avail)
    for n in ("kl/ref/k3", "kl/old_policy/k1", "policy/entropy", "optim/grad_norm"):
        assert n in stab
    effi, _ = select("efficiency", avail)
    assert "time/step" in effi
    data, _ = select("data", avail)
    assert "response/length/mean" in data
    both, missing = select("kl/*,no/such/metric", avail)
    assert set(both) == {"kl/ref/k3", "kl/old_policy/k1"} and missing == ["no/such/metric"]
    assert set(PRESETS) == {"effectiveness", "stability", "efficiency", "data"}


def test_an_older_canonical_name_still_selects_its_metric(tmp_path):
    """A dashboard or script written for canonical@1.0.0 asks for ``kl/ref``: the metric is now ``kl/ref/k3``
    (canonical.yaml versions:), compared under its current name, and the report says so."""
    res = compare_runs([GRPO, VERL], metrics="kl/ref,eval/kl/old_policy,kl/old_policy_k2", out=tmp_path / "old")
    assert "kl/ref/k3" in [m.name for m in res.metrics]
    assert any("kl/ref is an older canonical name of kl/ref/k3" in w for w in res.warnings)
    assert "kl/ref is an older canonical name" in (tmp_path / "old" / "summary.md").read_text()
    assert res.missing == ["eval/kl/old_policy (now eval/kl/old_policy/k1)", "kl/old_policy_k2 (now kl/old_policy/k2)"]
    renamed: dict[str, str] = {}
    assert select("kl/ref", ["kl/ref/k3"], upgrade=lambda n: n + "/k3" if n == "kl/ref" else n,
                  renamed=renamed) == (["kl/ref/k3"], [])
    assert renamed == {"kl/ref": "kl/ref/k3"}
    assert select("kl/ref", ["kl/ref/k3"]) == ([], ["kl/ref"])          # no upgrade asked for: as written


def test_single_run_report(tmp_path):
    res = compare_runs([VERL], out=tmp_path / "one")
    assert res.html.is_file() and len(res.pngs) == len(res.metrics) > 10
    assert res.only_one_run == {}
    table = read_csv(res.summary_csv)
    want = by_hand(verl_rows(), "critic/score/mean")
    assert float(table[("reward/score/mean", "verl")]["last"]) == want["last"]
    assert "Metrics in only one run" not in res.html.read_text()


def test_cli(tmp_path, capsys):
    from trackbridge.cli import main
    out = tmp_path / "cli"
    rc = main(["compare", GRPO, VERL, "--metrics", "stability", "--x", "step", "--smooth", "3", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(out / "report.html")
    table = read_csv(out / "summary.csv")
    assert ("kl/ref/k3", "grpo") in table and ("policy/entropy", "verl") in table
    # not in the stability preset: charted only because a finding of the checks read it (the report adds the charts
    # a finding concerns), so the same comparison without the checks leaves it out
    again = compare_runs([GRPO, VERL], metrics="stability", out=None, doctor=False)
    assert "reward/score/mean" not in {m.name for m in again.metrics}
    assert ("reward/score/mean", "grpo") not in table or any(
        "reward/score/mean" in f.metrics() for f in compare_runs([GRPO, VERL], metrics="stability", out=None).findings)


def test_cli_bad_axis_and_locator(tmp_path, capsys):
    from trackbridge.cli import main
    with pytest.raises(SystemExit):
        main(["compare", GRPO, "--x", "furlongs"])
    assert main(["compare", "nosuchkind:foo", "--out", str(tmp_path / "x")]) == 2


def test_into_jsonl_one_run_per_input(tmp_path):
    from trackbridge.record import RunInfo
    from trackbridge.stream import read_stream, scan_stream
    dest = tmp_path / "tracker"
    res = compare_runs([GRPO, VERL], out=None, into=f"jsonl:{dest}")
    assert res.html is None
    files = sorted(dest.glob("*.jsonl"))
    assert len(files) == 2
    seen = {}
    for f in files:
        info = scan_stream(f).info
        assert isinstance(info, RunInfo) and info.names == "canonical"
        seen[info.name] = [rec for _seq, rec in read_stream(f)]
    assert set(seen) == {"grpo", "verl"}
    assert len(seen["grpo"]) == len(grpo_rows()) and len(seen["verl"]) == len(verl_rows())
    assert seen["grpo"][0].metrics["reward/score/mean"] == grpo_rows()[0]["reward"]
    assert seen["verl"][0].metrics["kl/old_policy/k1"] == verl_rows()[0]["actor/ppo_kl"]
    # again: nothing written twice
    res2 = compare_runs([GRPO, VERL], out=None, into=f"jsonl:{dest}")
    assert all(r.records == 0 for r in res2.into)


def test_into_tensorboard_one_folder(tmp_path):
    pytest.importorskip("tensorboard")
    dest = tmp_path / "tb"
    compare_runs([GRPO, VERL], out=None, into=f"tensorboard:{dest}")
    assert sorted(p.name for p in dest.iterdir() if p.is_dir()) == ["grpo", "verl"]
    back = {r.info.name: list(r.records()) for r in open_source(f"tensorboard:{dest}").runs()}
    assert set(back) == {"grpo", "verl"}
    vals = [rec.metrics["optim/grad_norm"] for rec in back["grpo"] if "optim/grad_norm" in rec.metrics]
    assert vals == pytest.approx([r["grad_norm"] for r in grpo_rows()], rel=1e-6)


def test_from_option_names_the_framework(tmp_path):
    """`?from=` skips detection: the veRL log (~v0.3) read with the v0.3.0.post1 mapping entries."""
    res = compare_runs([f"verl=console:{VERL_FILE}?from=verl@v0.3.0.post1"], metrics="policy/entropy",
                       out=tmp_path / "r")
    # trainer detected within the release given
    assert res.runs[0].source.startswith("verl/ppo@v0.3"), res.runs[0].source
    mr = res.metric("policy/entropy")
    assert mr is not None and mr.runs == ["verl"]
    want = pipeline_approximate(f"console:{VERL_FILE}", "verl@v0.3.0.post1").get("policy/entropy")
    assert mr.approximate == ({"verl": want} if want else {})
    assert read_csv(res.summary_csv)[("policy/entropy", "verl")]["last"] == repr(verl_rows()[-1]["actor/entropy_loss"])


def test_time_axis_with_wall_times(tmp_path):
    """A run that has wall times is charted against seconds since its first record; one without is left out."""
    from trackbridge.record import Record, RunInfo, dumps
    folder = tmp_path / "timed"
    folder.mkdir()
    t0 = 1_763_700_000.0
    rows = grpo_rows()
    with open(folder / "timed.jsonl", "w", encoding="utf-8") as fh:
        fh.write(dumps(RunInfo(name="timed", run_id="timed", names="canonical").to_json()) + "\n")
        for i, r in enumerate(rows):
            rec = Record(r["step"], t0 + 20.0 * i, {"optim/grad_norm": r["grad_norm"]})
            fh.write(dumps(rec.to_json()) + "\n")
    res = compare_runs([f"timed=jsonl:{folder}", VERL], metrics="optim/grad_norm", x="time", out=tmp_path / "r")
    timed = res.runs[0]
    ax = run_axis(timed, "time")
    assert ax.available and ax.values[0] == 0.0 and ax.values[-1] == 20.0 * (len(rows) - 1)
    mr = res.metric("optim/grad_norm")
    assert mr.runs == ["timed", "verl"]
    assert [n.split(" ", 1)[0] for n in mr.axis_notes] == ["verl"]
    img = png(mr.chart)
    assert color_pixels(img, hex_rgb(COLORS[0])) > 30          # the timed run is drawn
    assert color_pixels(img, hex_rgb(COLORS[1])) == 0          # veRL (no wall times) is not


def test_caveats_said_once_and_counted(tmp_path, capsys):
    """The CLI and the report count the series by fidelity (the same quantity everywhere, differing in meaning,
    equal as stated but unproven) and say each metric's caveat once: the CLI one line per kind with the metrics'
    names (not one line per metric), report.html each reason at its chart only (the warnings list names the runs and
    the fields). GRPO against veRL alone has no unproven series left (every caveat there is a difference in
    meaning), so a third real veRL run, whose perf/mfu/actor_infer no proof can run, brings the third kind."""
    from trackbridge.cli import main
    out = tmp_path / "cli"
    assert main(["compare", GRPO, VERL, V7, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    res = compare_runs([GRPO, VERL, V7], out=tmp_path / "api")
    differs = [m.name for m in res.metrics if any(not only_unproven(w) for w in m.approximate.values())]
    unproven = [m.name for m in res.metrics if m.approximate and m.name not in differs]
    exact = len(res.metrics) - len(differs) - len(unproven)
    assert differs and unproven and exact > 0
    # the unproven series is v7's inference-pass MFU, and it names the entry that lacks its proof
    assert unproven == ["perf/mfu/policy_logprob"], unproven
    assert set(res.metric(unproven[0]).approximate) == {"v7"}
    assert "verl 'perf/mfu/actor_infer'" in res.metric(unproven[0]).approximate["v7"]
    assert res.fidelity_counts() == {"exact": exact, "differs": len(differs), "unproven": len(unproven)}
    line = [ln for ln in err.splitlines() if ln.startswith("fidelity: ")]
    assert len(line) == 1 and f"{len(res.metrics)} series: {exact} the same quantity in every run" in line[0]
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning: ")]
    assert len(warnings) <= 3 + sum(1 for _m, _t in res.warning_groups.get("axis", [])) + 2, warnings
    assert not [w for w in warnings if w.startswith(f"warning: {differs[0]}: ")]
    text = html.unescape((out / "report.html").read_text())
    assert res.fidelity_line() in text
    name = differs[0]
    why = next(w for w in res.metric(name).approximate.values() if not only_unproven(w))
    reason = why.split(": ", 1)[-1].split(" [")[0]
    listed = text[text.index('id="warnings"'):text.index('id="runs"')]
    assert section(text, name).count(reason) == 1 and reason not in listed and name in listed
