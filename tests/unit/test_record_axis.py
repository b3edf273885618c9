"""Record.axis (a run with several x axes): its JSON form, how a store's merged points are split back per axis
(split_by_axis, mark_derived with the run's recorded axes), and the sinks' bookkeeping of which name is on which
axis (Sink.note_axes). The trackers themselves: tests/trackers/test_multi_axis.py."""
from __future__ import annotations

import pytest

from trackbridge.record import Record, RunInfo, dumps, split_by_axis
from trackbridge.sinks.base import Sink
from trackbridge.sources.base import mark_derived


def test_axis_json_round_trip_and_absent_by_default():
    rec = Record(3, 1.5, {"train/pg_loss": 0.25}, ["train/pg_loss"], axis="train/step")
    obj = rec.to_json()
    assert obj["axis"] == "train/step"
    assert Record.from_json(obj) == rec
    plain = Record(3, 1.5, {"x": 1})
    assert "axis" not in plain.to_json() and Record.from_json(plain.to_json()).axis is None
    assert "axis" not in dumps(plain.to_json())
    with pytest.raises(ValueError, match="not a string"):
        Record.from_json({"step": 1, "metrics": {}, "axis": 7})


def test_split_by_axis_separates_points_gathered_at_one_step():
    axes = {"train/pg_loss": "train/step", "rollout/raw_reward": "rollout/step"}
    merged = Record(2, 10.0, {"train/pg_loss": 0.5, "rollout/raw_reward": 0.75, "other": 1.0}, ["rollout/raw_reward"])
    parts = split_by_axis(merged, axes.get)
    assert [(p.axis, p.step, p.wall_time, p.metrics, p.derived) for p in parts] == [
        ("train/step", 2, 10.0, {"train/pg_loss": 0.5}, []),
        ("rollout/step", 2, 10.0, {"rollout/raw_reward": 0.75}, ["rollout/raw_reward"]),
        (None, 2, 10.0, {"other": 1.0}, [])]
    one = Record(4, None, {"train/pg_loss": 0.1})
    assert split_by_axis(one, axes.get) == [Record(4, None, {"train/pg_loss": 0.1}, axis="train/step")]


def test_mark_derived_restores_recorded_axes():
    info = RunInfo(run_id="r", extra={"axes": {"a/x": "a/step", "b/y": "b/step"}})
    recs = [Record(1, None, {"a/x": 1.0, "b/y": 2.0}), Record(2, None, {"a/x": 3.0})]
    out = [(r.axis, r.step, r.metrics) for r in mark_derived(info, iter(recs))]
    assert out == [("a/step", 1, {"a/x": 1.0}), ("b/step", 1, {"b/y": 2.0}), ("a/step", 2, {"a/x": 3.0})]
    plain = [Record(1, None, {"a/x": 1.0})]
    assert [r.axis for r in mark_derived(RunInfo(run_id="r"), iter(plain))] == [None]


class _Collect(Sink):
    kind = "collect"

    def open(self, run, *, resume=False):
        self.run = run

    def write(self, records):
        pass

    def close(self):
        pass


def test_note_axes_keeps_the_map_in_the_run_info():
    s = _Collect("x")
    s.open(RunInfo(run_id="r", extra={"derived": ["d"]}))
    assert s.note_axes([Record(1, None, {"a": 1.0}), Record(1, None, {"t/x": 1.0}, axis="t/step")]) is True
    assert s.note_axes([Record(2, None, {"t/x": 2.0}, axis="t/step")]) is False
    assert s.note_axes([Record(2, None, {"r/y": 2.0}, axis="r/step")]) is True
    assert s.run.extra == {"derived": ["d"], "axes": {"t/x": "t/step", "r/y": "r/step"}}
