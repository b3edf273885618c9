"""Runs without wall times of their own stay without them on every path (issue 18, item 4).

The demo's runs come from a ``trainer_state.json`` and a console log: no wall times. Every tracker needs *some*
timestamp (TensorBoard events, MLflow metrics, wandb rows, Trackio logs), so the sinks stamp write times; the run
info they store carries ``extra["time_axis"] = "missing"`` (trackbridge.read.inputs), and every reader drops those
stamps. Checked on the demo's own output: every tracker copy read back, migrations between trackers, the output of
``translate`` (JSON lines without wall times), ``compare --x time`` (the runs are left out, with a warning) and the
per-second rates (``rate()`` derives nothing, with a note). A copy written before the mark existed (records
microseconds apart) is warned about on the time axis and gives no rate across such close times.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trackbridge.cli.demo import run_demo
from trackbridge.migrate import migrate
from trackbridge.read.inputs import open_runs
from trackbridge.record import Record, RunInfo
from trackbridge.tracking.source import TIME_AXIS

from _support import ROOT
from test_migrate_support import location

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")
pytest.importorskip("trackio")

NAMES = {"trl_grpo_trainer_state": 100, "verl_console": 200}     # the demo's runs and their records


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    assert run_demo(out) == 0
    return out


def _copies(out: Path) -> dict[str, str]:
    t = out / "trackers"
    return {"jsonl": f"jsonl:{out / 'canonical'}",
            "tensorboard": f"tensorboard:{t / 'tensorboard'}",
            "mlflow": f"mlflow:sqlite:///{t / 'mlflow.db'}?experiment=trackbridge-demo",
            "wandb": f"wandb:{t / 'wandb'}",
            "trackio": f"trackio:{t / 'trackio'}?project=trackbridge-demo"}


def _assert_timeless(loc: str, expect: dict[str, int]) -> None:
    runs = open_runs(loc)
    got = {}
    for run in runs:
        assert run.reader.has_wall_time is False, (loc, run.info.name, run.reader.info.extra)
        assert run.has_wall_time is False and run.info.extra.get(TIME_AXIS) == "missing", (loc, run.info.name)
        recs = list(run.records())
        assert recs and all(r.wall_time is None for r in recs), (loc, run.info.name)
        got[run.info.name] = len(recs)
    assert got == expect, (loc, got)


@pytest.mark.parametrize("kind", ["jsonl", "tensorboard", "mlflow", "wandb", "trackio"])
def test_every_tracker_copy_of_the_demo_reads_back_without_wall_times(demo, kind, env):
    _assert_timeless(_copies(demo)[kind], NAMES)


def test_the_trackers_did_store_made_up_times_which_the_mark_disowns(demo):
    """The premise: TensorBoard's own loader sees a wall time on every event (the sink had to write one)."""
    from tensorboard.backend.event_processing import event_accumulator as ea
    folder = demo / "trackers" / "tensorboard" / "verl_console"
    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    walls = [e.wall_time for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)]
    assert walls and all(w > 1e9 for w in walls)
    info = json.loads((folder / "trackbridge-run.json").read_text())
    assert info["extra"][TIME_AXIS] == "missing"


def test_migrations_between_trackers_keep_the_mark(demo, env):
    src = _copies(demo)["tensorboard"]
    hops = [location(k, env / f"hop-{k}") for k in ("mlflow", "wandb", "trackio", "jsonl", "tensorboard")]
    for dst in hops:
        res = migrate(src, dst, names="keep", progress=False, out=io.StringIO())
        assert res.ok and len(res.runs) == 2 and not any(r.has_wall_time for r in res.runs), dst
        _assert_timeless(dst, NAMES)
        src = dst


def test_translate_output_without_wall_times_is_marked_when_written(demo, env):
    """``translate`` writes plain JSON lines without wall times; a run read from them has no time axis, and a
    tracker written from them says so."""
    r = subprocess.run([sys.executable, "-m", "trackbridge", "translate", str(ROOT / "examples" / "verl_console.log")],
                       capture_output=True, text=True, timeout=300, cwd=env)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 200 and not any("wall_time" in x for x in lines)
    plain = env / "translated.jsonl"
    plain.write_text(r.stdout)
    (run,) = open_runs(str(plain))
    assert run.reader.has_wall_time is True and run.has_wall_time is False      # the first record says so
    dst = location("tensorboard", env / "tb")
    res = migrate(f"jsonl:{plain}", dst, names="keep", progress=False, out=io.StringIO())
    assert res.ok and not res.runs[0].has_wall_time
    _assert_timeless(dst, {"translated": 200})


def test_compare_time_axis_leaves_the_demo_copies_out_and_says_why(demo, env):
    out = env / "report"
    r = subprocess.run([sys.executable, "-m", "trackbridge", "compare", _copies(demo)["tensorboard"], "--x", "time",
                        "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=env)
    assert r.returncode == 0, r.stderr
    warned = [ln for ln in r.stderr.splitlines() if "the source holds no wall times" in ln]
    assert len(warned) == 2, r.stderr
    assert "no run has a time axis" in r.stderr
    # no per-second rate from the stamps: the demo's GRPO run has the token counter, so the rule tried and said why
    metrics = {ln.split(",", 1)[0] for ln in (out / "summary.csv").read_text().splitlines()}
    assert "perf/tokens_per_s" not in metrics and "reward/score/mean" in metrics
    assert "rate() needs wall times" in (out / "report.html").read_text()


def test_a_copy_made_before_the_mark_is_warned_about(env):
    """A TensorBoard run written by an older trackbridge: write times microseconds apart, no mark. The time axis is
    drawn with a warning, and no rate is derived across times that close."""
    from trackbridge.compare import compare_runs
    from trackbridge.trackers import make_sink
    dst = location("tensorboard", env / "old")
    sink = make_sink(dst)
    sink.open(RunInfo(name="old", run_id="old", names="canonical", source="trl/grpo@v1.16.0"))
    t0 = 1_763_700_000.0
    sink.write([Record(s, t0 + 1e-5 * s, {"progress/tokens": 1000.0 * s, "reward/score/mean": 0.1 * s})
                for s in range(1, 51)])
    sink.close()
    (run,) = open_runs(dst)
    assert run.has_wall_time             # nothing says otherwise ...
    res = compare_runs([dst], x="time", out=None)
    assert any("times that close are when a copy wrote them" in w for w in res.warnings), res.warnings
    assert res.metric("perf/tokens_per_s") is None                          # ... but no rate of 1e8 tokens/s
    assert any("times that close" in n for r in res.runs for n in r.notes), res.runs[0].notes
