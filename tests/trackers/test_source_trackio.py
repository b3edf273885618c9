"""TrackioSource on projects written by trackio itself (trackio.init/log in a child process) and by TrackioSink."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from trackbridge.record import Histogram, Record, RunInfo
from trackbridge.trackers import make_sink, open_source
from trackbridge.tracking.source import SourceError

T0 = 1763700000.125


def trackio_child(directory, code: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACKIO_", "SPACE_"))}
    env.update(TRACKIO_DIR=str(directory), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """A project logged with trackio's public API."""
    d = tmp_path_factory.mktemp("trackio_native")
    trackio_child(d, """
import trackio
trackio.init(project="native", name="run-a", config={"lr": 0.001, "algo": "grpo"})
for i in range(4):
    trackio.log({"train/reward": 0.5 * i, "loss": float("nan") if i == 2 else 1.0 / (i + 1), "step": i,
                 "hist": trackio.Histogram([1, 2, 2, 3])}, step=10 * i)
trackio.finish()
trackio.init(project="native", name="run-b", config={"lr": 0.01})
trackio.log({"train/reward": 1.0})
trackio.finish()
""")
    return d


def test_reads_trackio_written_runs(native):
    runs = list(open_source(f"trackio:{native}").runs())
    assert [r.info.name for r in runs] == ["run-a", "run-b"]
    a = runs[0]
    assert a.info.project == "native" and a.info.config == {"lr": 0.001, "algo": "grpo"}
    assert set(a.info.extra["trackio"]) == {"_Username", "_Created", "_Group"}
    got = list(a.records())
    assert a.problems == []
    assert [r.step for r in got] == [0, 10, 20, 30]
    assert [r.metrics["train/reward"] for r in got] == [0.0, 0.5, 1.0, 1.5]
    assert math.isnan(got[2].metrics["loss"]) and got[1].metrics["loss"] == 0.5
    assert [r.metrics["step"] for r in got] == [0, 1, 2, 3]          # trackio stored it as __step
    h = got[0].metrics["hist"]
    assert isinstance(h, Histogram) and sum(h.counts) == 4
    assert all(isinstance(r.wall_time, float) and r.wall_time > 1.7e9 for r in got)


def test_filters(native):
    assert [r.info.name for r in open_source(f"trackio:{native}?project=native&name=run-b").runs()] == ["run-b"]
    a = next(iter(open_source(f"trackio:{native}?name=run-a").runs()))
    by_id = list(open_source(f"trackio:{native}?run={a.info.run_id}").runs())
    assert [r.info.name for r in by_id] == ["run-a"]
    with pytest.raises(SourceError, match="no project 'other'.*native"):
        list(open_source(f"trackio:{native}?project=other").runs())
    with pytest.raises(SourceError, match="no run with name 'ghost'"):
        list(open_source(f"trackio:{native}?name=ghost").runs())
    with pytest.raises(SourceError, match="no such directory"):
        list(open_source(f"trackio:{native / 'missing'}").runs())


def test_round_trip_through_sink(tmp_path):
    recs = [Record(step=i, wall_time=T0 + i, metrics={
        "val-core/openai/gsm8k/acc/mean@1": 0.1 * i, "time": float(i), "__x": i, "inf": math.inf,
        "h": Histogram(limits=[1.0, 2.0, 3.0], counts=[1.0, 0.0, 2.0], min=0.5, max=3.0, num=3.0, sum=6.0,
                       sum_squares=13.0),
        "text": f"t{i}", "none": None}) for i in range(3)]
    info = RunInfo(name="rt", project="grpo", config={"a": {"b": [1, 2]}, "c": "x@y"}, tags={"t": "1"},
                   source="trl@1.16")
    sink = make_sink(f"trackio:{tmp_path}")
    sink.open(info)
    sink.write(recs)
    sink.close()
    reader = next(iter(open_source(f"trackio:{tmp_path}?project=grpo").runs()))
    assert reader.info.name == "rt" and reader.info.config == info.config and reader.info.tags == info.tags
    assert reader.info.source == "trl@1.16" and reader.info.run_id == sink.run_id
    got = list(reader.records())
    assert reader.problems == []
    assert [(r.step, r.wall_time) for r in got] == [(i, T0 + i) for i in range(3)]
    for r, want in zip(got, recs):
        h = r.metrics.pop("h")
        assert h.limits == [1.0, 2.0, 3.0] and h.counts == [1.0, 0.0, 2.0]
        assert h.summary() == want.metrics["h"].summary()
        assert r.metrics == {k: v for k, v in want.metrics.items() if k != "h"}


def test_skips_unreadable_rows_and_reports(tmp_path):
    sink = make_sink(f"trackio:{tmp_path}?project=p")
    sink.open(RunInfo(name="r"))
    sink.write([Record(step=0, wall_time=T0, metrics={"a": 1.0}), Record(step=1, wall_time=T0 + 1, metrics={"a": 2.0})])
    sink.close()
    import sqlite3
    with sqlite3.connect(tmp_path / "p.db") as conn:
        conn.execute("UPDATE metrics SET metrics = '{broken' WHERE step = 0")
        conn.execute("UPDATE metrics SET metrics = ? WHERE step = 1",
                     (json.dumps({"a": 2.0, "img": {"_type": "trackio.image", "file_path": "x.png"}}),))
    reader = next(iter(open_source(f"trackio:{tmp_path}").runs()))
    got = list(reader.records())
    assert [(r.step, r.metrics) for r in got] == [(1, {"a": 2.0})]
    assert len(reader.problems) == 2
    assert "metrics id" in reader.problems[0].where and "not JSON" in reader.problems[0].what
    assert "trackio.image" in reader.problems[1].what
