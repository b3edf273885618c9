"""wandb sink (offline): runs read back by our .wandb reader AND by wandb's own ``wandb leet inspect --json``."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

# wandb offline, hubs offline, scratch cache dirs: tests/conftest.py (pytest_configure), set before any
# test module imports a tracker
pytest.importorskip("wandb")

from trackbridge.record import Histogram, Record, RunInfo  # noqa: E402
from trackbridge.trackers import make_sink  # noqa: E402
from trackbridge.trackers.wandb.records import run_files  # noqa: E402
from trackbridge.trackers.wandb.sink import WandbSink  # noqa: E402
from trackbridge.trackers.wandb.source import WandbSource  # noqa: E402
from trackbridge.tracking.sink import SinkError  # noqa: E402

RUN = RunInfo(name="grpo seed 1", project="proj", run_id="tbrun1",
              config={"lr": 1e-5, "opt": {"name": "adam", "betas": [0.9, 0.99]}},
              tags={"team": "rl", "v": "1"}, source="trl@1.16")

RECORDS = [
    Record(10, 1700000000.123456, {"loss": 0.1, "count": 3, "nan": float("nan"), "inf": float("inf"),
                                   "text": "hello \u00e9", "none": None, "_private": 2.5, "val/mean@1": 0.75,
                                   "h": Histogram(limits=[0.5, 1.0, 2.0], counts=[1, 4, 2], min=0.0, max=2.0)}),
    Record(12, 1700000001.5, {"loss": 0.05}),
    Record(11, 1700000002.75, {"eval/acc": 0.625}),      # lower than the last step: wandb would drop it
    Record(11, 1700000003.0, {"eval/acc": 0.7}),         # same step again
    Record(13, 1700000004.0, {"loss": 0.01, "hv": Histogram.from_values([1.0, 2.0, 2.0, 3.0])}),
]


@pytest.fixture(scope="module")
def written(tmp_path_factory, wandb_env):
    folder = tmp_path_factory.mktemp("wb")
    sink = make_sink(f"wandb:{folder}")
    assert isinstance(sink, WandbSink) and sink.mode == "offline"
    run = RunInfo(**{k: (dict(v) if isinstance(v, dict) else v) for k, v in RUN.__dict__.items()})
    sink.open(run)
    sink.write(RECORDS[:2])
    sink.write(RECORDS[2:])
    assert sink.last_step() == 13
    sink.close()
    sink.close()
    return folder


def _read(folder):
    (reader,) = list(WandbSource(str(folder)).runs())
    return reader, list(reader.records())


def test_offline_folder_layout(written):
    files = run_files(written / "wandb", "tbrun1")
    assert len(files) == 1 and files[0].parent.name.startswith("offline-run-")


def test_round_trip_via_our_reader(written):
    reader, got = _read(written)
    assert reader.problems == []
    info = reader.info
    assert (info.name, info.project, info.run_id, info.config, info.tags, info.source) == (
        RUN.name, RUN.project, RUN.run_id, RUN.config, RUN.tags, RUN.source)
    assert info.sanitized == {"trackbridge/_private": "_private"}
    # every record kept, with its true step (non-monotonic and repeated steps included) and wall time
    assert [r.step for r in got] == [10, 12, 11, 11, 13]
    assert [r.wall_time for r in got] == [r.wall_time for r in RECORDS]
    m = got[0].metrics
    assert m["loss"] == 0.1 and m["count"] == 3 and m["text"] == "hello \u00e9" and m["none"] is None
    assert math.isnan(m["nan"]) and m["inf"] == math.inf
    assert m["_private"] == 2.5 and m["val/mean@1"] == 0.75            # reserved name restored
    h = m["h"]
    assert (h.limits, h.counts, h.min, h.max, h.num) == ([0.5, 1.0, 2.0], [1.0, 4.0, 2.0], 0.0, 2.0, 7.0)
    assert [r.metrics for r in got[2:4]] == [{"eval/acc": 0.625}, {"eval/acc": 0.7}]
    hv = got[4].metrics["hv"]
    assert sum(hv.counts) == 4 and hv.min == 1.0 and hv.max == 3.0


def test_round_trip_via_wandb_leet(written):
    (path,) = run_files(written / "wandb", "tbrun1")
    exe = Path(sys.executable).with_name("wandb")
    if not exe.exists():
        pytest.skip("wandb CLI not installed next to the interpreter")
    out = subprocess.run([str(exe), "leet", "inspect", "--json", str(path)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "WANDB_MODE": "offline"})
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line)["history"]["item"] for line in out.stdout.splitlines()
            if '"type":"history"' in line]
    assert [r["trackbridge/step"] for r in rows] == [10, 12, 11, 11, 13]
    assert [r["_step"] for r in rows] == [10, 12, 13, 14, 15]          # wandb's own step only grows
    assert [r["_timestamp"] for r in rows] == [r.wall_time for r in RECORDS]
    assert rows[0]["text"] == "hello \u00e9" and rows[0]["trackbridge/_private"] == 2.5
    assert rows[0]["h._type"] == "histogram" and rows[0]["h.bins"] == [0, 0.5, 1, 2]
    summary = subprocess.run([str(exe), "leet", "inspect", "--json", "--summary", str(path)], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "WANDB_MODE": "offline"})
    s = json.loads(summary.stdout)
    assert s["name"] == RUN.name and s["project"] == "proj" and s["run_id"] == "tbrun1"
    assert s["config"]["lr"] == 1e-5 and s["config"]["opt"]["name"] == "adam"


def test_resume_continues_in_a_new_folder(tmp_path, wandb_env):
    s = WandbSink(str(tmp_path))
    s.open(RunInfo(name="r", run_id="resume1"))
    s.write([Record(i, 100.0 + i, {"a": float(i)}) for i in range(3)])
    s.close()
    with pytest.raises(SinkError, match="resume=True"):
        WandbSink(str(tmp_path)).open(RunInfo(name="r", run_id="resume1"))
    s2 = WandbSink(str(tmp_path))
    s2.open(RunInfo(name="r", run_id="resume1"), resume=True)
    assert s2.last_step() == 2
    s2.write([Record(1, 200.0, {"a": 1.5}), Record(3, 201.0, {"a": 3.0})])   # a replayed lower step is kept
    s2.close()
    assert len(run_files(tmp_path / "wandb", "resume1")) == 2
    (reader,) = WandbSource(str(tmp_path)).runs()
    got = [(r.step, r.metrics["a"]) for r in reader.records()]
    assert got == [(0, 0.0), (1, 1.0), (2, 2.0), (1, 1.5), (3, 3.0)]


def test_two_runs_in_one_process(tmp_path, wandb_env):
    a, b = WandbSink(str(tmp_path)), WandbSink(str(tmp_path))
    a.open(RunInfo(name="a", run_id="para"))
    b.open(RunInfo(name="b", run_id="parb"))
    a.write([Record(1, 1.0, {"x": 1.0})])
    b.write([Record(1, 1.0, {"x": 2.0})])
    a.close()
    b.close()
    got = {r.info.run_id: [rec.metrics["x"] for rec in r.records()] for r in WandbSource(str(tmp_path)).runs()}
    assert got == {"para": [1.0], "parb": [2.0]}


def test_a_project_or_run_id_wandb_refuses_is_written_and_read_back_whole(tmp_path, wandb_env):
    # wandb refuses '/', '\\', '#', '?', '%' and ':' in a project name and a run id ("Invalid project name"): the
    # run went to no wandb at all; now wandb gets them with '-' and the reader gives the run's own back
    run = RunInfo(name="r", project="team/grpo", run_id="seed/1:a")
    s = WandbSink(str(tmp_path))
    s.open(run)
    s.write([Record(1, 1.0, {"x": 1.0})])
    s.close()
    s2 = WandbSink(str(tmp_path))
    s2.open(RunInfo(name="r", project="team/grpo", run_id="seed/1:a"), resume=True)    # resumes the same run
    s2.write([Record(2, 2.0, {"x": 2.0})])
    s2.close()
    assert len(run_files(tmp_path / "wandb", "seed-1-a")) == 2
    (reader,) = WandbSource(str(tmp_path)).runs()
    assert (reader.info.project, reader.info.run_id) == ("team/grpo", "seed/1:a")
    assert [(r.step, r.metrics["x"]) for r in reader.records()] == [(1, 1.0), (2, 2.0)]
    (picked,) = WandbSource(str(tmp_path), run="seed/1:a").runs()                 # ?run= the run's own id
    assert picked.info.run_id == "seed/1:a"
    # what wandb itself holds: the project and id it accepts
    exe = Path(sys.executable).parent / "wandb"
    path = run_files(tmp_path / "wandb", "seed-1-a")[0]
    summary = subprocess.run([str(exe), "leet", "inspect", "--json", "--summary", str(path)], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "WANDB_MODE": "offline"})
    got = json.loads(summary.stdout)
    assert (got["project"], got["run_id"]) == ("team-grpo", "seed-1-a")


def test_bad_options():
    with pytest.raises(SinkError, match="mode"):
        WandbSink("x", mode="cloud")
    with pytest.raises(SinkError, match="before open"):
        WandbSink("x").write([Record(1, 1.0, {})])


def test_histogram_edges_and_bucket_merging():
    from trackbridge.trackers.wandb.sink import MAX_BINS, histogram_edges

    edges, counts = histogram_edges(Histogram(limits=[1.0, 2.0], counts=[3, 4], min=0.0))
    assert edges == [0.0, 1.0, 2.0] and counts == [3.0, 4.0]
    edges, counts = histogram_edges(Histogram(limits=[float(i + 1) for i in range(1000)], counts=[1] * 1000, min=0.0))
    assert len(counts) <= MAX_BINS and len(edges) == len(counts) + 1
    assert sum(counts) == 1000 and edges[0] == 0.0 and edges[-1] == 1000.0
    assert histogram_edges(Histogram.from_values([1.0])) is None     # raw values: wandb buckets them itself
