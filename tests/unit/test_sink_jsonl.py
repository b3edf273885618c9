"""JSONL sink: the canonical stream written, appended on resume, and read back (by JsonlSource and by plain json)."""
from __future__ import annotations

import json
import math

import pytest

from trackbridge.record import Histogram, Record, RunInfo
from trackbridge.stream import read_stream, scan_stream
from trackbridge.trackers import make_sink
from trackbridge.trackers.jsonl.sink import JsonlSink
from trackbridge.trackers.jsonl.source import JsonlSource
from trackbridge.tracking.sink import SinkError


def _records():
    return [
        Record(0, 1700000000.25, {"loss": 1.5, "text": "hello \u00e9", "n": float("nan"), "pinf": float("inf"),
                                  "ninf": float("-inf"), "none": None, "int": 2**40}),
        Record(2, 1700000001.5, {"loss": 0.1 + 0.2, "h": Histogram.from_values([1.0, 2.0, 3.5])},
               derived=["h"]),
        Record(1, 1700000002.75, {"eval/acc": 0.5}),            # non-monotonic: kept as is
        Record(None, None, {"x": 1}),
    ]


def _same(a, b):
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b and type(a) is type(b)


def test_round_trip_exact(tmp_path):
    run = RunInfo(name="grpo-1", project="p", run_id="abc", config={"lr": 1e-5, "nested": {"k": [1, 2]}},
                  tags={"team": "rl"}, source="trl@1.16", sanitized={})
    sink = make_sink(f"jsonl:{tmp_path}")
    assert isinstance(sink, JsonlSink)
    sink.open(run)
    recs = _records()
    sink.write(recs[:2])
    sink.write(recs[2:])
    sink.close()
    sink.close()  # safe twice
    path = tmp_path / "abc.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0])["type"] == "run" and len(lines) == 5
    for line in lines:                      # strict JSON (no bare NaN)
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict constant {c}"))
    # the stream's own reader
    assert scan_stream(path).info == run
    assert [r.step for _seq, r in read_stream(path)] == [0, 2, 1, None]
    # the source
    (reader,) = list(JsonlSource(str(tmp_path)).runs())
    assert reader.info == run
    got = list(reader.records())
    assert reader.problems == []
    assert [r.step for r in got] == [0, 2, 1, None]
    assert [r.wall_time for r in got] == [1700000000.25, 1700000001.5, 1700000002.75, None]
    for want, have in zip(recs, got):
        assert want.metrics.keys() == have.metrics.keys()
        for k in want.metrics:
            assert _same(want.metrics[k], have.metrics[k]), k
        assert want.derived == have.derived
    assert got[1].metrics["h"].sum == 6.5 and got[1].metrics["h"].values == [1.0, 2.0, 3.5]


def test_resume_appends_and_last_step(tmp_path):
    run = RunInfo(name="r", run_id="r1")
    s = JsonlSink(str(tmp_path))
    s.open(run)
    s.write([Record(i, 1.0 + i, {"a": i}) for i in range(5)])
    assert s.last_step() == 4
    s.close()
    with pytest.raises(SinkError, match="resume=True"):
        JsonlSink(str(tmp_path)).open(RunInfo(name="r", run_id="r1"))
    s2 = JsonlSink(str(tmp_path))
    s2.open(RunInfo(name="r", run_id="r1"), resume=True)
    assert s2.last_step() == 4
    s2.write([Record(5, 6.0, {"a": 5})])
    s2.close()
    text = (tmp_path / "r1.jsonl").read_text()
    assert text.count('"type":"run"') == 1
    (reader,) = JsonlSource(str(tmp_path / "r1.jsonl")).runs()
    assert [r.step for r in reader.records()] == [0, 1, 2, 3, 4, 5]


def test_partial_last_line_is_reported_and_resume_starts_a_new_line(tmp_path):
    s = JsonlSink(str(tmp_path), fsync="1")
    assert s.fsync
    s.open(RunInfo(run_id="crash"))
    s.write([Record(1, 1.0, {"a": 1.0}), Record(2, 2.0, {"a": 2.0})])
    s.close()
    path = tmp_path / "crash.jsonl"
    good = path.stat().st_size
    with open(path, "ab") as fh:                  # what a crash mid-write leaves
        fh.write(b'{"step":3,"wall_time":3.0,"metr')
    s2 = JsonlSink(str(tmp_path))
    s2.open(RunInfo(run_id="crash"), resume=True)
    assert s2.last_step() == 2                     # the partial line does not count
    s2.write([Record(3, 3.5, {"a": 3.0})])
    s2.close()
    (reader,) = JsonlSource(str(tmp_path)).runs()
    got = list(reader.records())
    assert [(r.step, r.metrics["a"]) for r in got] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert len(reader.problems) == 1
    assert f"offset {good}" in reader.problems[0].where and "crash.jsonl" in reader.problems[0].where


def test_run_id_is_made_when_missing(tmp_path):
    run = RunInfo(name="x")
    s = JsonlSink(str(tmp_path))
    s.open(run)
    s.close()
    assert run.run_id and (tmp_path / f"{run.run_id}.jsonl").exists()


def test_no_folder_is_an_error():
    with pytest.raises(SinkError):
        JsonlSink("")
